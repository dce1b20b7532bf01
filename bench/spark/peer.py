"""kdaemon's Spark sink against Spark Structured Streaming's own Kafka source, into the same table.

On one Apache Kafka topic and one machine, two ways to land a topic's records in a table:

* **kdaemon**: ``kdaemon run`` (the supervisor, 2 workers, the Spark uploader on ``local[2]``)
  with the spark sink (``format`` = ``--format``, ``value_format = "json"`` with a
  ``value_schema``) and a header rule in ``[[filters]]``: the real configuration path, the rule
  evaluated by the workers.
* **Spark**: a Structured Streaming query (PySpark driver, ``local[2]``) on Spark's Kafka source
  (spark-sql-kafka-0-10_2.13 4.1.1, staged with Maven: bench/spark/peer_spark.py) reading the
  topic from earliest, the same rule as a SQL condition on the ``headers`` column, ``from_json``
  with the same schema, kdaemon's columns, written to the same format with a checkpoint
  (Delta and Iceberg with the jars kdaemon staged, through the same ``session_conf``).

The data is the consuming benchmarks' (testkit/workload.py): ``--records`` records (1,000,000 by
default), ~200-byte JSON values, two headers (``type``, exactly a tenth of each of ten values, and
``trace``), lz4, round-robin over 4 partitions, produced with confluent-kafka.  Two workloads,
each one rule (a drop rule: records whose ``type`` header matches are dropped):

* ``filter-10%``: drop the nine other types, keep ``order.shipped``: 10% of the records kept;
* ``all``: drop ``type = "debug.synthetic"``, which no record has: everything kept (the rule is
  still evaluated on every record).

Per workload and side, two runs:

* **throughput**: the topic is full before the consumer starts.  kdaemon: wall time from
  ``kdaemon run``'s launch to every partition's end offset committed by the group (polled every
  0.25 s by one consumer kept open), ``max_records`` 100,000 / ``max_age_s`` 5 (the sustained
  best of bench/spark/sink.py) / ``max_idle_s`` 0.5 (a drained topic's tail is sent once no
  record has come for that long: the two workers split the kept records, neither reaches
  ``max_records``, and without it each waited out ``max_age_s``; the worker's default memory budget caps the bytes it buffers,
  and what passes it is staged early and sent with the next flush).  Spark: wall time from the driver's launch to the end of the
  ``availableNow`` query (Spark's defaults: no ``maxOffsetsPerTrigger``, one task per Kafka
  partition).  records/s is the topic's records (what both read from Kafka) over that wall
  time, session start-up included on both sides.  CPU: every process of the side (kdaemon:
  supervisor, workers, uploader and its JVM; Spark: the Python driver and its JVM), sampled
  with psutil every 0.2 s over the same window; an exited descendant (Spark's launcher JVM, a
  shell) counted through its parent's reaped-children time.  The broker's CPU over the window
  is reported apart.  Memory: the peak of the side's summed RSS over those samples (and the sum
  of each process's own peak, VmHWM: an upper bound).
* **warm throughput**: the same topic, given to a side that is already running and warm.  A
  warm-up topic (a tenth of ``--records``, the same data set with another seed) is delivered
  first into the same table, so the JVMs have compiled the hot paths and the table exists; the
  clock and the CPU figures start at the moment the full topic is handed over.  kdaemon: the
  daemon delivered the warm-up topic (with direct writes its uploader starts no Spark) and its
  group settled (``kdaemon status``: both workers hold partitions, unchanged for 1.5 s, longer
  than the broker's 1 s assignment interval: a reload right after a rebalance waits that
  interval's end for its new target, which a daemon running for a while does not), then its
  configuration names the full topic instead and it gets SIGHUP (what an operator does: the supervisor rolls the workers, the uploader and its
  session keep running); wall time to every partition's end committed.  Spark: the driver ran
  an ``availableNow`` query on the warm-up topic, then starts the ``availableNow`` query on the
  full topic in the same session; wall time to its end.  This is the daemon's own setting (it
  runs all the time; its session start is paid once), beside a Spark session that is kept
  running too; the from-launch run above is the other end (a scheduled ``availableNow`` job
  against a daemon started for it).
* **latency**: a fresh topic; the consumer runs continuously (kdaemon with ``max_records``
  20,000 / ``max_age_s`` 1; Spark with a ``processingTime`` trigger of ``--trigger-s``, 1 s).
  Once kdaemon's uploader is serving, 5 s of records at ``--latency-rate`` (5,000/s) warm
  it up (JIT, the first job) and are waited for; then records are produced at
  ``--latency-rate`` for ``--latency-seconds`` (20).  A row's latency is the moment its
  commit became visible to a reader minus the row's Kafka timestamp (CreateTime, which
  librdkafka sets at ``produce()``): the commit is the Delta log version / Iceberg metadata
  version / Spark file-sink log entry that added the row's data file (kdaemon's
  Parquet mode: the data file's own move into place), and its visibility is the moment that
  file was renamed into place (its inode change time; every one of these writers writes a
  temporary file and renames it).  Percentiles over rows: every kept row of the paced phase.
  ``drain_s``, from the last record produced to everything visible, tells whether a side kept
  up: one much longer than the trigger or ``max_age_s`` means the latency is that side's backlog.

Every output is read back with Spark: rows = distinct (partition, offset) = the kept records,
each of a kept type, their ids summing to the produced ones.

What differs between the sides (read the ratios with it):

* kdaemon does more per record: its uploader rewrites each staged batch as Parquet for Spark,
  reads the table's recorded offsets before each job, checks every value against the schema
  (a value that does not parse would fail the job, which then runs again with a dead-letter
  pass), and commits the group's offsets to Kafka; one table commit per job, like Spark's one
  per micro-batch.  Spark's query keeps its offsets in its checkpoint, not in Kafka, and its
  rows that do not parse would land as nulls.
* Both are exactly-once, by different means (kdaemon: table-recorded offsets + manifests;
  Spark: checkpoint + the sink's idempotent commit).
* The broker serves both alike, but kdaemon's group (joins, heartbeats, offset commits) and this
  script's committed-offset polling land on the broker's CPU, reported apart.
* One machine for everything (2 cores here): the broker's and this script's CPU (sampling,
  polling) compete with the side measured.  Other load on the machine changes every figure.

    .venv/bin/python bench/spark/peer.py --records 1000000 --format delta --json /tmp/spark-peer.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testkit import report as _report  # noqa: E402
from testkit.common import KafkaBroker, child_env  # noqa: E402
from bench.spark.peer_procs import (SPARK_SCRIPT, VALUE_SCHEMA, WORKLOADS, Kdaemon, SparkPeer,  # noqa: E402
                                      TreeSampler, kdaemon_kind, kdaemon_sink, spark_kind, spark_spec)
from bench.spark.peer_spark import PROTOCOL  # noqa: E402
from testkit.workload import PARTITIONS, RECORDS_UNIT, TYPES, iter_records  # noqa: E402
from kdaemon.protocol.header_match import HeaderRules, resolve_default, rule_from_table  # noqa: E402
from testkit.produce import Writer, create_topic, paced  # noqa: E402

FORMATS = ("parquet", "delta", "iceberg")
THROUGHPUT_SINK = {"max_records": 100_000, "max_age_s": 5, "max_idle_s": 0.5}
# The goals: kdaemon's records/s at least this many times Spark's.
GOALS = {"filter-10%": 3.0, "all": 1.0}
LATENCY_SINK = {"max_records": 20_000, "max_age_s": 1}
WARMUP_S = 5.0
UPLOADER_MODULE = "kdaemon.sinks.spark.uploader.process"
RUN_TIMEOUT_S = 900
# A warm daemon is a steady one: its group unchanged for longer than the broker's assignment
# interval (group.consumer.assignment.interval.ms, 1 s), as a daemon that has run for a while is
# when it is reloaded.  The warm-up's own rebalance ends about when its records are committed.
SETTLED_QUIET_S = 1.5


def rules_of(workload: str) -> HeaderRules:
    """The workload's rule group as kdaemon's worker builds it (default ``auto``)."""
    rules = [rule_from_table(t) for t in WORKLOADS[workload]]
    return HeaderRules(rules, default=resolve_default("auto", rules))


# -- producing -----------------------------------------------------------------------------------

class Produced:
    """What one produce call wrote: end offsets per partition, and per workload the records its
    rule keeps (count, sum of ids: what the table must hold)."""

    def __init__(self, ends: dict[int, int], expected: dict[str, dict], seconds: float) -> None:
        self.ends, self.expected, self.seconds = ends, expected, seconds

    @property
    def records(self) -> int:
        return sum(self.ends.values())


def produce(bootstrap: str, topic: str, n: int, workloads: list[str], *, rate: float | None = None,
            seed: int = 20240601) -> Produced:
    """``n`` records of testkit/workload.py's data set into ``topic`` (lz4), at ``rate`` records/s
    if given (then with a short linger: the producer's wait is part of every row's latency)."""
    conf = ({"linger.ms": 5, "batch.num.messages": 10_000} if rate else
            {"linger.ms": 200, "batch.size": 1_000_000, "batch.num.messages": 10_000,
             "queue.buffering.max.messages": 2_000_000, "queue.buffering.max.kbytes": 2_000_000})
    writer = Writer(bootstrap, topic, "lz4", **{"enable.idempotence": False, **conf})
    checks = {w: rules_of(w) for w in workloads}
    expected = {w: {"rows": 0, "id_sum": 0} for w in workloads}
    t0 = time.monotonic()
    for i, p, key, value, headers in paced(iter_records(n, seed), rate, every=100):
        for w, keep in checks.items():
            if keep(headers):
                expected[w]["rows"] += 1
                expected[w]["id_sum"] += i
        writer.send(value, key, partition=p, headers=headers)
    writer.flush_checked(120)
    if sum(writer.counts.values()) != n:
        raise RuntimeError(f"produce failed: {sum(writer.counts.values())} of {n} delivered")
    return Produced(dict(writer.ends), expected, time.monotonic() - t0)


def add_produced(a: Produced, b: Produced) -> Produced:
    """Two produce calls into the same topic, one after the other."""
    expected = {w: {k: a.expected[w][k] + b.expected[w][k] for k in ("rows", "id_sum")} for w in a.expected}
    return Produced(dict(b.ends), expected, a.seconds + b.seconds)


def kept_types(workload: str) -> list[str]:
    keep = rules_of(workload)
    return [t.hex() for t in TYPES if keep([("type", t)])]


# -- one run each --------------------------------------------------------------------------------

class Layout:
    """Where a run's table goes: Iceberg tables share one warehouse (``lake/bench/<name>``, one
    Hadoop catalog for the read-back), the others a directory each."""

    def __init__(self, tmp: Path, fmt: str) -> None:
        self.tmp, self.fmt = tmp, fmt

    def run_dir(self, name: str) -> Path:
        d = self.tmp / "runs" / name
        d.mkdir(parents=True)
        return d

    def table(self, name: str) -> Path:
        return self.tmp / "lake" / "bench" / name.replace("-", "_") if self.fmt == "iceberg" else \
            self.tmp / "tables" / name


def throughput_kdaemon(broker: KafkaBroker, lay: Layout, topic: str, produced: Produced, workload: str,
                       warm: "Warmup | None" = None) -> dict:
    """From launch: wall time from ``kdaemon run``'s launch to every partition's end committed.
    ``warm``: the daemon running and warm (it delivered the warm-up topic into the table), then
    given ``topic`` as an operator would (the configuration names it, SIGHUP); wall time and
    CPU from the SIGHUP."""
    name = f"kdaemon_{_slug(workload)}_{'warm' if warm else 'throughput'}"
    run_dir, table = lay.run_dir(name), lay.table(name)
    kd = Kdaemon(run_dir, broker.bootstrap, warm.topic if warm else topic, WORKLOADS[workload],
                 kdaemon_sink(lay.fmt, table, THROUGHPUT_SINK))
    bcpu0 = broker.cpu_s()
    t0 = kd.start()
    sampler = TreeSampler(kd.proc.pid, kdaemon_kind)
    sampler.start()
    try:
        if warm:
            kd.wait_committed(warm.produced.ends, RUN_TIMEOUT_S)
            kd.wait_settled(SETTLED_QUIET_S, RUN_TIMEOUT_S)
            sampler.rebase()
            bcpu0, t0 = broker.cpu_s(), time.time()
            kd.switch_topic(topic)
        t_done = kd.wait_committed(produced.ends, RUN_TIMEOUT_S)
        figures = sampler.stop()
        bcpu = broker.cpu_s() - bcpu0
        kd.stop()
    finally:
        sampler._done.set()
        kd.kill()
    r = _throughput_result("kdaemon", workload, name, table, produced, t_done - t0, figures, bcpu,
                           log=str(kd.log_path))
    if warm:
        r["expected"] = add_produced(warm.produced, produced).expected[workload]
    return r


def throughput_spark(broker: KafkaBroker, lay: Layout, topic: str, produced: Produced, workload: str,
                     warm: "Warmup | None" = None) -> dict:
    """From launch: wall time from the driver's launch to the end of the ``availableNow`` query.
    ``warm``: the driver's session warm (an ``availableNow`` query delivered the warm-up topic
    into the table), then the query on ``topic`` started in it; wall time and CPU from there."""
    name = f"spark_{_slug(workload)}_{'warm' if warm else 'throughput'}"
    run_dir, table = lay.run_dir(name), lay.table(name)
    spec = spark_spec(lay.fmt, table, run_dir / "checkpoint", broker.bootstrap, topic, workload, "availableNow")
    if warm:
        spec.update(warmup_topic=warm.topic, warmup_checkpoint=str(run_dir / "checkpoint-warmup"))
    peer = SparkPeer(run_dir, spec)
    bcpu0 = broker.cpu_s()
    t0 = peer.start()
    sampler = TreeSampler(peer.proc.pid, spark_kind)
    sampler.start()
    try:
        if warm:
            peer.wait_event("warm", RUN_TIMEOUT_S)
            sampler.rebase()
            bcpu0, t0 = broker.cpu_s(), time.time()
            peer.go()
        done = peer.wait_event("done", RUN_TIMEOUT_S)
        figures = sampler.stop()
        bcpu = broker.cpu_s() - bcpu0
        peer.stop()
    finally:
        sampler._done.set()
        peer.kill()
    r = _throughput_result("spark", workload, name, table, produced, done["t_done"] - t0, figures, bcpu,
                           log=str(peer.log_path))
    r.update(query_s=done["t_done"] - done["t_started"], input_rows=done["input_rows"],
             batches_with_rows=done["batches_with_rows"])
    if warm:
        r["expected"] = add_produced(warm.produced, produced).expected[workload]
    else:
        r["session_start_s"] = done["t_session"] - t0
    if done["input_rows"] != produced.records:
        r["warning"] = f"the query read {done['input_rows']} records, the topic holds {produced.records}"
    return r


class Warmup:
    """The warm-up topic both warm runs deliver first: a tenth of the records, another seed."""

    def __init__(self, topic: str, produced: Produced) -> None:
        self.topic, self.produced = topic, produced


def _throughput_result(side, workload, name, table, produced, wall, figures, broker_cpu, **extra) -> dict:
    n = produced.records
    return {"side": side, "workload": workload, "name": name, "table": str(table), "records": n,
            "kept": produced.expected[workload]["rows"], "wall_s": wall, "records_per_s": n / wall,
            "cpu_s_per_m": figures["cpu_s"] / n * 1e6, "broker_cpu_s": broker_cpu,
            "broker_cpu_s_per_m": broker_cpu / n * 1e6, **figures, **extra}


def latency_run(side: str, broker: KafkaBroker, lay: Layout, workload: str, rate: float, seconds: float,
                trigger_s: float) -> dict:
    """The consumer running; a warm-up load waited for; then ``rate`` records/s for ``seconds``."""
    name = f"{side}_{_slug(workload)}_latency"
    run_dir, table = lay.run_dir(name), lay.table(name)
    topic = f"bench-peer-lat-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    if side == "kdaemon":
        runner = Kdaemon(run_dir, broker.bootstrap, topic, WORKLOADS[workload],
                         kdaemon_sink(lay.fmt, table, LATENCY_SINK))
    else:
        runner = SparkPeer(run_dir, spark_spec(lay.fmt, table, run_dir / "checkpoint", broker.bootstrap, topic,
                                               workload, trigger_s))
    wait = runner.wait_committed if side == "kdaemon" else runner.wait_processed
    try:
        runner.start()
        if side == "kdaemon":
            runner.wait_serving()
            time.sleep(5)   # the workers have joined the group by now (they start beside the uploader)
        else:
            runner.wait_event("ready", 300)
        warm = produce(broker.bootstrap, topic, int(rate * WARMUP_S), [workload], rate=rate, seed=1)
        wait(warm.ends, 300)
        t0 = time.time()
        paced_load = produce(broker.bootstrap, topic, int(rate * seconds), [workload], rate=rate, seed=2)
        t1 = time.time()
        total = add_produced(warm, paced_load)
        t_visible = wait(total.ends, 300)
        runner.stop()
    finally:
        runner.kill()
    return {"side": side, "workload": workload, "name": name, "table": str(table), "topic": topic,
            "rate": rate, "seconds": seconds, "produced_rate": int(rate * seconds) / (t1 - t0),
            "drain_s": t_visible - t1,
            "paced_from": {str(p): warm.ends.get(p, 0) for p in range(PARTITIONS)},
            "expected": total.expected[workload], "kept_paced": paced_load.expected[workload]["rows"],
            "log": str(runner.log_path),
            "setting": (f"max_records {LATENCY_SINK['max_records']}, max_age_s {LATENCY_SINK['max_age_s']}"
                        if side == "kdaemon" else f"processingTime {trigger_s:g} s")}


def _slug(workload: str) -> str:
    return {"filter-10%": "filter10"}.get(workload, workload)


def check_outputs(lay: Layout, items: list[dict]) -> dict[str, dict]:
    """Read every table back in one Spark session (bench/spark/peer_spark.py ``check``)."""
    spec = {"format": lay.fmt, "items": items}
    log = lay.tmp / "check.log"
    with open(log, "wb") as err:
        proc = subprocess.run([sys.executable, str(SPARK_SCRIPT), "check", json.dumps(spec)], stdout=subprocess.PIPE,
                              stderr=err, text=True, env=child_env(), timeout=1200)
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith(PROTOCOL):
            ev = json.loads(line[len(PROTOCOL):])
            out[ev["name"]] = ev["result"]
    for item in items:
        out.setdefault(item["name"], {"exact": False, "error": f"not checked (exit {proc.returncode}); see {log}"})
    return out


# -- output --------------------------------------------------------------------------------------

def _n(x, fmt="{:,.0f}"):
    return "–" if x is None else fmt.format(x)


def _ratio(a, b):
    return a / b if a is not None and b else None


def report(results: dict) -> str:
    rows = ["| run | workload | side | records/s | wall s | CPU s / M records | broker CPU s / M | peak RSS MB "
            "(sum of peaks) | latency p50 / p99 s (drain s) | exact |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    ratios = ["| workload | records/s, from launch | records/s, warm | CPU s / M, from launch | CPU s / M, warm | "
              "peak RSS | latency p50 | latency p99 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    goals = []
    for w in results["workloads"]:
        sides = {}
        for side in ("kdaemon", "spark"):
            lrun = results["latency"].get(f"{side}/{w}", {})
            lat = lrun.get("latency") or {}
            sides[side] = (results["throughput"].get(f"{side}/{w}", {}), results["warm"].get(f"{side}/{w}", {}), lat)
            for run in ("throughput", "warm"):
                t = results[run].get(f"{side}/{w}")
                label = "from launch" if run == "throughput" else "warm"
                if t is None:
                    continue
                if "error" in t:
                    rows.append(f"| {label} | {w} | {side} | FAILED: {t['error'][:150]} | | | | | | |")
                    continue
                exact = "yes" if t.get("check", {}).get("exact") else "NO"
                latency = "–"
                if run == "throughput":
                    lexact = lrun.get("check", {}).get("exact")
                    if lexact is not None and not lexact:
                        exact += " (latency run: NO)"
                    latency = (f"{_n(lat.get('p50_s'), '{:.2f}')} / {_n(lat.get('p99_s'), '{:.2f}')} "
                               f"({_n(lrun.get('drain_s'), '{:.1f}')})")
                rows.append(f"| {label} | {w} | {side} | {_n(t.get('records_per_s'))} | {_n(t.get('wall_s'), '{:.1f}')} | "
                            f"{_n(t.get('cpu_s_per_m'), '{:.1f}')} | {_n(t.get('broker_cpu_s_per_m'), '{:.1f}')} | "
                            f"{_n(t.get('rss_peak_mb'))} ({_n(t.get('hwm_sum_mb'))}) | {latency} | {exact} |")
        (kt, kw, kl), (st, sw, sl) = sides["kdaemon"], sides["spark"]
        cold = _ratio(kt.get("records_per_s"), st.get("records_per_s"))
        hot = _ratio(kw.get("records_per_s"), sw.get("records_per_s"))
        p50 = _ratio(kl.get("p50_s"), sl.get("p50_s"))
        ratios.append(f"| {w} | {_n(cold, '{:.2f}x')} | {_n(hot, '{:.2f}x')} | "
                      f"{_n(_ratio(kt.get('cpu_s_per_m'), st.get('cpu_s_per_m')), '{:.2f}x')} | "
                      f"{_n(_ratio(kw.get('cpu_s_per_m'), sw.get('cpu_s_per_m')), '{:.2f}x')} | "
                      f"{_n(_ratio(kt.get('rss_peak_mb'), st.get('rss_peak_mb')), '{:.2f}x')} | "
                      f"{_n(p50, '{:.2f}x')} | {_n(_ratio(kl.get('p99_s'), sl.get('p99_s')), '{:.2f}x')} |")
        want = GOALS.get(w)
        if want is not None:
            for label, x in (("from launch", cold), ("warm", hot)):
                if x is not None:
                    goals.append(f"{w}, {label}: kdaemon {x:.2f}x Spark's records/s (goal >= {want:g}x): "
                                 + ("met" if x >= want else "NOT met"))
        if p50 is not None:
            goals.append(f"{w}, latency p50: kdaemon {p50:.2f}x Spark's (goal <= 1x): " + ("met" if p50 <= 1 else "NOT met"))
    return ("\n".join(rows) + "\n\nkdaemon / Spark (records/s: higher is better for kdaemon; the others: lower)\n\n"
            + "\n".join(ratios) + ("\n\n" + "\n".join(goals) if goals else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000,
                        help=f"records in the throughput topic (default 1,000,000; a multiple of {RECORDS_UNIT})")
    parser.add_argument("--format", choices=FORMATS, default="delta", help="the table format (default delta)")
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--latency-rate", type=float, default=5_000,
                        help="records/s of the latency runs (default 5,000; drain_s says whether a side kept up)")
    parser.add_argument("--latency-seconds", type=float, default=20, help="length of the paced phase")
    parser.add_argument("--trigger-s", type=float, default=1.0, help="the Spark query's processingTime trigger "
                        "in the latency runs (default 1 s)")
    parser.add_argument("--sides", nargs="+", choices=("kdaemon", "spark"), default=["kdaemon", "spark"],
                        help="which side(s) to run (default both)")
    parser.add_argument("--no-latency", action="store_true", help="no latency runs")
    parser.add_argument("--no-warm", action="store_true", help="no warm throughput runs")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (tables, logs)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the results to OUT as JSON")
    args = parser.parse_args(argv)
    if args.records <= 0 or args.records % RECORDS_UNIT:
        parser.error(f"--records must be a positive multiple of {RECORDS_UNIT} (a tenth of each type)")

    head = _report.banner("bench/spark/peer.py", require_accelerated=True)
    import pyspark
    from bench.spark.peer_spark import kafka_source_jars
    jars = kafka_source_jars()   # staged before any measurement (Maven, once)
    print(f"pyspark {pyspark.__version__}; Spark's Kafka source: {', '.join(Path(j).name for j in jars)}")
    print(f"format {args.format}, {args.records:,} records, workloads {', '.join(args.workloads)}; "
          f"rules: {json.dumps({w: WORKLOADS[w] for w in args.workloads})}")
    results = {"command": _report.command_line("bench/spark/peer.py", argv), **head, "format": args.format,
               "records": args.records, "workloads": args.workloads, "rules": {w: WORKLOADS[w] for w in args.workloads},
               "value_schema": VALUE_SCHEMA, "throughput": {}, "warm": {}, "latency": {}}
    tmp = Path(tempfile.mkdtemp(prefix="kdaemon-bench-spark-peer-"))
    lay = Layout(tmp, args.format)
    items = []
    try:
        with KafkaBroker(tmp / "kafka") as broker:
            print(broker.describe(), flush=True)
            topic = f"bench-peer-{uuid.uuid4().hex[:8]}"
            create_topic(broker.bootstrap, topic, PARTITIONS)
            produced = produce(broker.bootstrap, topic, args.records, args.workloads)
            results["produce"] = {"topic": topic, "seconds": produced.seconds, "ends": produced.ends,
                                  "expected": produced.expected}
            print(f"produced {produced.records:,} records in {produced.seconds:.1f} s; kept per workload "
                  f"{ {w: e['rows'] for w, e in produced.expected.items()} }", flush=True)
            warm = None
            if not args.no_warm:
                warm_topic = f"bench-peer-warmup-{uuid.uuid4().hex[:8]}"
                create_topic(broker.bootstrap, warm_topic, PARTITIONS)
                warm = Warmup(warm_topic, produce(broker.bootstrap, warm_topic, args.records // 10, args.workloads,
                                                  seed=7))
                results["produce"]["warmup"] = {"topic": warm_topic, "records": warm.produced.records}
            for run_name, warmup in (("throughput", None), ("warm", warm)):
                for w in args.workloads if run_name == "throughput" or warm is not None else []:
                    for side, run in (("kdaemon", throughput_kdaemon), ("spark", throughput_spark)):
                        if side not in args.sides:
                            continue
                        try:
                            r = run(broker, lay, topic, produced, w, warmup)
                        except Exception as exc:   # noqa: BLE001 - one failed run is reported, the rest go on
                            r = {"side": side, "workload": w, "error": str(exc)}
                        results[run_name][f"{side}/{w}"] = r
                        if "error" in r:
                            print(f"{run_name} {w} {side}: FAILED: {r['error']}", flush=True)
                            continue
                        items.append({"name": r["name"], "side": side, "format": args.format, "path": r["table"],
                                      "expected": r.get("expected", produced.expected[w]),
                                      "kept_types_hex": kept_types(w)})
                        print(f"{run_name} {w} {side}: {r['records_per_s']:,.0f} records/s ({r['wall_s']:.1f} s), "
                              f"CPU {r['cpu_s']:.1f} s = {r['cpu_s_per_m']:.1f} s/M "
                              f"{ {k: round(v, 1) for k, v in r['cpu_s_by_process'].items() if v >= 0.05} }, "
                              f"broker CPU {r['broker_cpu_s']:.1f} s, peak RSS {r['rss_peak_mb']:,.0f} MB (sum of "
                              f"peaks {r['hwm_sum_mb']:,.0f} MB) "
                              f"{ {k: round(v) for k, v in r['rss_at_peak_mb_by_process'].items()} }"
                              + (f"; WARNING {r['warning']}" if r.get("warning") else ""), flush=True)
            if not args.no_latency:
                for w in args.workloads:
                    for side in args.sides:
                        try:
                            r = latency_run(side, broker, lay, w, args.latency_rate, args.latency_seconds,
                                            args.trigger_s)
                        except Exception as exc:   # noqa: BLE001
                            r = {"side": side, "workload": w, "error": str(exc)}
                        results["latency"][f"{side}/{w}"] = r
                        if "error" in r:
                            print(f"latency {w} {side}: FAILED: {r['error']}", flush=True)
                            continue
                        items.append({"name": r["name"], "side": side, "format": args.format, "path": r["table"],
                                      "expected": r["expected"], "kept_types_hex": kept_types(w),
                                      "latency_from": r["paced_from"]})
                        print(f"latency {w} {side}: produced {r['produced_rate']:,.0f} records/s for "
                              f"{args.latency_seconds:g} s ({r['setting']}); all visible {r['drain_s']:.1f} s "
                              "after the last was produced", flush=True)
        print(f"reading {len(items)} table(s) back with Spark ...", flush=True)
        checks = check_outputs(lay, items)
        for table in (results["throughput"], results["warm"], results["latency"]):
            for r in table.values():
                if "name" in r:
                    r["check"] = checks.get(r["name"], {"exact": False, "error": "not checked"})
                    r["latency"] = r["check"].pop("latency", None)
                    print(f"{r['name']}: {json.dumps(r['check'])}"
                          + (f"; latency {json.dumps(r['latency'])}" if r["latency"] else ""), flush=True)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    results["sources_after"] = _report.check_sources(head["source"])
    print()
    print(report(results))
    _report.write_json(str(args.json) if args.json else None, results)
    failed = [f"{run} {k}" for run in ("throughput", "warm", "latency") for k, r in results[run].items()
              if "error" in r or not r.get("check", {}).get("exact")]
    if failed:
        print(f"\nFAILED or not exact: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
