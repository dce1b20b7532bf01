"""Consuming end to end: kdaemon's Consumer beside the Java KafkaConsumer, confluent-kafka,
kafka-python and aiokafka, on Apache Kafka.

Run from the repository root::

    python bench/consume [--broker kafka|tansu] [--records N] [--repeats R] [--poll-records N]
                        [--profile] [--json PATH]

``--records`` must be a multiple of 20; ``--clients kdaemon java aiokafka ...`` and ``--modes raw
...`` run a subset; ``--requests-only`` prints only the Fetch request sizes (no broker needed).

Input: a broker on a free loopback port (``testkit/common.py``): Apache Kafka by default (one
combined KRaft node, the reference and the figures the goals are judged on), or kdaemon's
embedded Tansu with ``--broker tansu``.  One topic of 4 partitions, ``--records`` records
(default 1,000,000) written by confluent-kafka with lz4 and large batches: a ~200-byte JSON
value, a key and two headers, ``type`` (one of ten values, exactly a tenth each, shuffled) and
``trace`` (32 hex digits), round-robin over the partitions.  The delivery reports give the exact
record count of every partition, and every consumer stops when it has *counted* that many
records per partition, never on the high watermark or on end-of-partition: Kafka's watermark is
true, but Tansu's is the last batch's base offset + 1, and counting works on both.

Every client runs in a fresh child process (``--worker``; the Java consumer is the ``bench``
sub-command of testkit/java/KafkaPeer.java, through testkit/java_peer.py), so imports do
not interfere and the peak RSS (``VmHWM``) is the client's own.  Each assigns all four
partitions from offset 0 and does one mode's work on every record:

* raw: ``len(value)``.
* json: ``json.loads(value)`` (and adds up the ``id`` field, the check value); kdaemon: the
  bundled json plugin's deserializer, as the daemon calls it (msgspec, plugins/kdaemon_json);
  Java: Jackson's ``ObjectMapper.readTree(value).get("id")``.
* filter: keep the records whose ``type`` header equals one value (10%), ``json.loads`` those.
  kdaemon filters inside the Consumer with ``header_filter=HeaderRules(...)`` (which the C record
  loop evaluates natively) and, as variants, with a Python callable, in the poll loop, and with
  ``on_filtered`` (the dropped records handed to a callable, as a plugin asking for them gets
  them: ``[otel] trace_filtered``; the records are then built to be filtered).  The
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

# Only the standard library at module level (and bench.peers, testkit.workload and
# testkit.report, stdlib-only at module level too): a worker must import nothing but its own client, so its RSS
# and import time are that client's.
import json
import random
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from bench.peers import (  # noqa: E402
    CHILD_TIMEOUT_S, JAVA_ON_TANSU, PEER_WORKERS, Tally, attr_work, client_us_per_record, prepare_java, run_java,
    skip_java, with_broker_cpu)
from testkit.report import (  # noqa: E402
    arguments, banner, best, check_sources, command_line, number, parse, rate_ratio, table, times, write_json)
from testkit.workload import (  # noqa: E402
    FETCH_MAX_BYTES, MAX_PARTITION_FETCH_BYTES, RECORDS_UNIT, SEED, TARGET, TOPIC, produce, type_is_target)

GOAL_RAW_VS_KAFKA_PYTHON = 3.0
GOAL_RSS_MB = 80.0
AIM_FILTER_VS_JAVA_PER_CORE = 1.0   # records per CPU-second of the client, kdaemon / Java


# -- the worker (child process) ----------------------------------------------------------------

def worker_kdaemon(spec: dict, tally: Tally) -> dict:
    from kdaemon.client import Consumer, TopicPartition
    from kdaemon.protocol import records as krecords
    from kdaemon.protocol.header_match import HeaderRule, HeaderRules

    mode, variant = spec["mode"], spec.get("variant")
    options = dict(fetch_max_bytes=FETCH_MAX_BYTES, max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
                   max_poll_records=spec["poll_records"], auto_offset_reset="earliest")
    if variant == "wait10":
        options["fetch_max_wait_ms"] = 10
    prefiltered = mode == "filter" and variant in ("rules", "callable", "wait10", "told")
    if mode == "filter" and variant in ("rules", "wait10", "told"):
        options["header_filter"] = HeaderRules([HeaderRule("type", "equals", (TARGET,))], default=False)
    if mode == "filter" and variant == "told":
        told = []   # what a plugin asking to see the filtered records is given (the otel plugin's trace_filtered)
        options["on_filtered"] = lambda dropped: told.append(len(dropped))
    elif mode == "filter" and variant == "callable":
        options["header_filter"] = type_is_target
    work = json_plugin_work() if mode == "json" else attr_work(mode, prefiltered)
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
            parts = consumer.metrics().partitions
            for tp in tps:
                p = parts[tp]
                tally.add(tp.partition, p.records_consumed + p.records_filtered - tally.counts[tp.partition])
        if tally.done():
            break
    m = consumer.metrics()
    last = m.last_fetch_request or {}
    extra = {"accelerated": krecords.ACCELERATED, "fetch_requests": m.fetch_requests_total,
             "fetch_latency_avg_ms": m.fetch_latency_avg_ms, "fetch_latency_max_ms": m.fetch_latency_max_ms,
             "records_filtered": m.records_filtered_total,
             "positions": [m.partitions[tp].position for tp in tps],
             "last_fetch_session": [last.get("session_id"), last.get("session_epoch"),
                                    sum(len(t["partitions"]) for t in last.get("topics", ()))]}
    consumer.close()
    return tally.result(**extra)


def json_plugin_work():
    """work(records) for kdaemon's json mode: each value parsed by the bundled json plugin's
    deserializer with its default settings, called as the daemon's worker calls it
    (``deserialize(topic, headers, value)``), instead of ``json.loads``: what a kdaemon user's
    JSON costs.  (filter mode keeps ``json.loads`` for the 10% it parses, so its figures stay
    comparable with the earlier runs.)"""
    sys.path.insert(0, str(REPO_ROOT / "plugins"))   # the bundled plugins of this tree
    import kdaemon_json

    deserialize = kdaemon_json.json_deserializer({})

    def work(recs):
        s = 0
        for r in recs:
            s += deserialize(r.topic, r.headers, r.value)["id"]
        return s, len(recs)
    return work


WORKERS = {"kdaemon": worker_kdaemon, **PEER_WORKERS}


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


# -- the parent: broker, children ------------------------------------------------------------

def describe_partition(broker, max_bytes: int = 8 << 20) -> dict:
    """Batch layout at the head of partition 0, fetched with kdaemon's protocol layer."""
    import struct

    from testkit import common as _common
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


def run_child(spec: dict) -> dict:
    """One Python client's run in a fresh child process (``--worker``)."""
    from testkit import common as _common
    return _common.run_child(__file__, "--worker", spec, CHILD_TIMEOUT_S)


def run_client(spec: dict, broker) -> dict:
    """One run of ``spec`` in its own process (the Java consumer or a Python worker), with the
    broker's CPU per record beside it."""
    return with_broker_cpu(broker, run_java if spec["client"] == "java" else run_child, spec)


# (run id, client, variant, label, filter label, modes).  The peers filter in the poll loop.
RUNS = (
    ("kdaemon", "kdaemon", "rules", "kdaemon", "header_filter=HeaderRules", ("raw", "json", "filter")),
    ("kdaemon-callable", "kdaemon", "callable", "kdaemon", "header_filter=Python callable", ("filter",)),
    ("kdaemon-told", "kdaemon", "told", "kdaemon", "header_filter=HeaderRules, on_filtered", ("filter",)),
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


def consume_benchmark(args, log_dir: Path) -> dict:
    from testkit import common as _common

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
            for mode, variant in (("raw", None), ("json", None), ("filter", "rules")):
                if mode not in args.modes:
                    continue
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
        import threading
        self.version = version
        self.sent: list[tuple[int, dict, object]] = []
        self.lock = threading.RLock()   # send_fetches runs under the client's lock

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

def _label(label: str, filter_label: str, mode: str) -> str:
    return f"{label} ({filter_label})" if mode == "filter" and filter_label else label


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
                    "vs_kafka_python": rate_ratio(r, kp), "vs_aiokafka": rate_ratio(r, aio),
                    "vs_java": rate_ratio(r, java), "vs_java_per_core": _per_core_ratio(r, java),
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
        x = rate_ratio(kd, kp) or 0.0
        lines.append(f"{on}raw >= {GOAL_RAW_VS_KAFKA_PYTHON:.0f}x kafka-python: "
                     f"{'met' if x >= GOAL_RAW_VS_KAFKA_PYTHON else 'NOT met'} ({x:.2f}x)")
    aio = by.get(("aiokafka", "filter"))
    for run_id in KDAEMON_FILTER_RUNS:
        kd = by.get((run_id, "filter"))
        if kd and aio:
            x = rate_ratio(kd, aio) or 0.0
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
    x, num = times, number
    head = (f"{'client':<52} {'mode':<6} {'records/s':>10} {'vs k-p':>7} {'vs aio':>7} {'vs java':>7} "
            f"{'rec/CPU-s':>10} {'core/java':>9} {'us/rec':>6} {'broker':>6} "
            f"{'incl.setup':>10} {'1st rec s':>9} {'cpu/wall':>8} {'RSS MB':>7}")
    for r in table(head, rows, 52):
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
    parser = arguments(
        __doc__, broker=True, records=True, repeats=(1, "runs per client and mode; best is shown"),
        poll_records="max records per poll/consume/getmany call, every client (default 10,000)",
        max_seconds="stop a client after this long and report it as CAPPED (default 300)", modes=MODES,
        clients="only these run ids or clients (default all): kdaemon, kdaemon-callable, kdaemon-loop, "
                "kdaemon-wait10, kdaemon-told, java, confluent, confluent-b10, kafka-python, aiokafka")
    parser.add_argument("--profile", action="store_true",
                        help="also run kdaemon raw, json and filter (those of --modes) under cProfile and print "
                             "the top 15")
    parser.add_argument("--requests-only", action="store_true", help="only the Fetch request sizes")
    args = parse(parser, argv, {"--worker": lambda spec: run_worker(json.loads(spec))}, RECORDS_UNIT)
    if args is None:
        return 0

    from kdaemon.protocol import records as krecords

    head = banner("bench/consume", accelerated=krecords.ACCELERATED, require_accelerated=True)
    source = head["source"]
    sizes = [fetch_request_sizes(v) for v in (12, 13, 18)]
    report: dict = {"date": head["started"].isoformat(timespec="seconds"), "machine": head["machine"],
                    "versions": head["versions"], "kdaemon_source": source,
                    "accelerated": krecords.ACCELERATED, "fetch_request_sizes": sizes,
                    "command": command_line("bench/consume", argv)}
    if not args.requests_only:
        import tempfile
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
    report["kdaemon_source_after"] = check_sources(source)
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
