"""kdaemon's Spark sink against Spark Structured Streaming's own Kafka source, into the same table.

On one Apache Kafka topic and one machine, two ways to land a topic's records in a table:

* **kdaemon**: ``kdaemon run`` (the supervisor, 2 workers, the Spark uploader on ``local[2]``)
  with the spark sink (``format`` = ``--format``, ``value_format = "json"`` with a
  ``value_schema``) and a header rule in ``[[filters]]``: the real configuration path, the rule
  evaluated by the workers.
* **Spark**: a Structured Streaming query (PySpark driver, ``local[2]``) on Spark's Kafka source
  (spark-sql-kafka-0-10_2.13 4.1.1, staged with Maven: bench/_spark_peer_spark.py) reading the
  topic from earliest, the same rule as a SQL condition on the ``headers`` column, ``from_json``
  with the same schema, kdaemon's columns, written to the same format with a checkpoint
  (Delta and Iceberg with the jars kdaemon staged, through the same ``session_conf``).

The data is the consuming benchmarks' (bench/_workload.py): ``--records`` records (1,000,000 by
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
  best of bench/spark_sink.py; the worker's default memory budget caps the bytes it buffers,
  and what passes it is staged early and sent with the next flush).  Spark: wall time from the driver's launch to the end of the
  ``availableNow`` query (Spark's defaults: no ``maxOffsetsPerTrigger``, one task per Kafka
  partition).  records/s is the topic's records (what both read from Kafka) over that wall
  time, session start-up included on both sides.  CPU: every process of the side (kdaemon:
  supervisor, workers, uploader and its JVM; Spark: the Python driver and its JVM), sampled
  with psutil every 0.2 s over the same window; an exited descendant (Spark's launcher JVM, a
  shell) counted through its parent's reaped-children time.  The broker's CPU over the window
  is reported apart.  Memory: the peak of the side's summed RSS over those samples (and the sum
  of each process's own peak, VmHWM: an upper bound).
* **latency**: a fresh topic; the consumer runs continuously (kdaemon with ``max_records``
  20,000 / ``max_age_s`` 1; Spark with a ``processingTime`` trigger of ``--trigger-s``, 1 s).
  5 s of records at ``--latency-rate`` (5,000/s) warm it up (JIT, the first job) and are waited
  for; then records are produced at ``--latency-rate`` for ``--latency-seconds`` (20).  A row's
  latency is the moment its commit became visible to a reader minus the row's Kafka timestamp
  (CreateTime, which librdkafka sets at ``produce()``): the commit is the Delta log version /
  Iceberg metadata version / Spark file-sink log entry that added the row's data file (kdaemon's
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

    .venv/bin/python bench/spark_peer.py --records 1000000 --format delta --json /tmp/spark-peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil  # noqa: E402

from bench import _report  # noqa: E402
from bench._common import KafkaBroker, child_env, free_port  # noqa: E402
from bench._spark_peer_spark import PROTOCOL  # noqa: E402
from bench._workload import PARTITIONS, RECORDS_UNIT, TARGET, TYPES, iter_records  # noqa: E402
from kdaemon.protocol.header_match import HeaderRules, resolve_default, rule_from_table  # noqa: E402
from confluent_kafka import Consumer, KafkaException, TopicPartition  # noqa: E402
from tests.support.produce import Writer, create_topic, paced  # noqa: E402

SPARK_SCRIPT = Path(__file__).resolve().with_name("_spark_peer_spark.py")
FORMATS = ("parquet", "delta", "iceberg")
MASTER = "local[2]"
WORKERS = 2
PARTITION_BY = ["topic", "date"]
# bench/_workload.py's JSON values, all seven fields.
VALUE_SCHEMA = "id BIGINT, event STRING, user STRING, amount DOUBLE, currency STRING, items ARRAY<INT>, note STRING"
WORKLOADS = {
    "filter-10%": [{"header": "type", "op": "in", "action": "drop",
                    "values": [t.decode() for t in TYPES if t != TARGET]}],
    "all": [{"header": "type", "op": "equals", "value": "debug.synthetic", "action": "drop"}],
}
THROUGHPUT_SINK = {"max_records": 100_000, "max_age_s": 5}
LATENCY_SINK = {"max_records": 20_000, "max_age_s": 1}
WARMUP_S = 5.0
UPLOADER_MODULE = "kdaemon.sinks.spark.uploader"
RUN_TIMEOUT_S = 900


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
    """``n`` records of bench/_workload.py's data set into ``topic`` (lz4), at ``rate`` records/s
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


# -- measuring a process tree --------------------------------------------------------------------

class TreeSampler(threading.Thread):
    """CPU seconds and RSS of a process and all its descendants, sampled every ``interval``.

    CPU: each process's own user+system time as last seen; at the end, the reaped-children times
    of the processes still alive are added (what exited and was waited for: a launcher, Spark's
    ``spark-class`` launcher JVM), less the last-seen own time of exited processes whose parent
    is alive (already inside that parent's reaped-children time).  RSS: the sum over the tree at
    each sample, and its peak; ``hwm_sum_mb``: the sum of each process's own peak (VmHWM)."""

    def __init__(self, root_pid: int, classify, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root_pid, self.classify, self.interval = root_pid, classify, interval
        self.seen: dict[int, dict] = {}     # pid -> kind, ppid, own cpu, children cpu, hwm
        self.peak_rss = 0
        self.peak_by_kind: dict[str, int] = {}
        self.samples = 0
        self._done = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> set[int]:
        alive: set[int] = set()
        try:
            root = psutil.Process(self.root_pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return alive
        total = 0
        by_kind: dict[str, int] = {}
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss = p.memory_info().rss
                    entry = self.seen.get(p.pid)
                    if entry is None:
                        entry = self.seen[p.pid] = {"kind": None, "ppid": p.ppid(), "hwm": 0}
                    entry["kind"] = self.classify(p, p.pid == self.root_pid) or entry["kind"]
                    entry["own"] = t.user + t.system
                    entry["children"] = t.children_user + t.children_system
                    entry["hwm"] = max(entry["hwm"], _hwm(p.pid) or rss)
                total += rss
                by_kind[entry["kind"]] = by_kind.get(entry["kind"], 0) + rss
                alive.add(p.pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        if total > self.peak_rss:
            self.peak_rss, self.peak_by_kind = total, by_kind
        self.samples += 1
        return alive

    def run(self) -> None:
        while not self._done.is_set():
            with self._lock:
                self.sample()
            self._done.wait(self.interval)

    def stop(self) -> dict:
        self._done.set()
        with self._lock:
            alive = self.sample()
        self.join(5)
        by_kind: dict[str, float] = {}
        for pid, e in self.seen.items():
            cpu = e.get("own", 0.0)
            if pid in alive:
                cpu += e.get("children", 0.0)
            elif e["ppid"] in alive:
                cpu = 0.0   # counted in its parent's reaped-children time
            kind = e["kind"] or "other"
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu
        return {"cpu_s": sum(by_kind.values()), "cpu_s_by_process": by_kind, "rss_peak_mb": self.peak_rss / 2**20,
                "rss_at_peak_mb_by_process": {k: v / 2**20 for k, v in self.peak_by_kind.items()},
                "hwm_sum_mb": sum(e["hwm"] for e in self.seen.values()) / 2**20, "processes": len(self.seen),
                "samples": self.samples}


def _hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _is_java(p: psutil.Process) -> bool:
    return p.name() == "java" or os.path.basename((p.cmdline() or [""])[0]) == "java"


def kdaemon_kind(p: psutil.Process, root: bool) -> str:
    if root:
        return "supervisor"
    if _is_java(p):
        return "uploader JVM"
    cmd = " ".join(p.cmdline())
    if UPLOADER_MODULE in cmd:
        return "uploader (Python)"
    if "kdaemon" in cmd:
        return "workers"
    return "uploader JVM launcher"


def spark_kind(p: psutil.Process, root: bool) -> str:
    if root:
        return "driver (Python)"
    return "JVM" if _is_java(p) else "JVM launcher"


# -- kdaemon -------------------------------------------------------------------------------------

def _toml(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (str, list)):
        return json.dumps(x)   # a JSON string or list of strings is TOML
    return repr(x)


def write_config(path: Path, *, bootstrap: str, topic: str, group: str, state: Path, rules: list[dict],
                 sink: dict) -> None:
    """bench/spark_sink.py's daemon settings, the workload's rule as a ``[[filters]]`` entry."""
    lines = ["plugins = []", "", "[kafka]", f"bootstrap_servers = {_toml(bootstrap)}", f"group_id = {_toml(group)}",
             'auto_offset_reset = "earliest"', "session_timeout_ms = 6000", "fetch_max_wait_ms = 100",
             "max_poll_records = 10000", "", "[daemon]", f"topics = [{_toml(topic)}]", f"workers = {WORKERS}",
             f"state_dir = {_toml(str(state))}", f'metrics_addr = "127.0.0.1:{free_port()}"',
             'on_deserialize_error = "skip"', "max_buffered_records = 400000", "heartbeat_timeout_s = 120", ""]
    for rule in rules:
        lines += ["[[filters]]"] + [f"{k} = {_toml(v)}" for k, v in rule.items()] + [""]
    lines += ["[deserializer]", 'key = "bytes"', 'value = "bytes"', "", "[sink]"]
    lines += [f"{k} = {_toml(v)}" for k, v in sink.items()]
    path.write_text("\n".join(lines) + "\n")


class CommittedWatch:
    """A group's committed offsets, read by one confluent-kafka consumer kept open (OffsetFetch,
    never a group member); a new group's coordinator that is not ready yet reads as nothing
    committed."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def reached(self, ends: dict[int, int]) -> bool:
        try:
            got = self.consumer.committed([TopicPartition(self.topic, p) for p in ends], timeout=10)
        except KafkaException:   # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS: not yet
            return False
        return all(tp.offset >= ends[tp.partition] for tp in got)

    def close(self) -> None:
        self.consumer.close()


class Kdaemon:
    """One ``kdaemon run``, started in its own session, stopped with SIGTERM."""

    def __init__(self, run_dir: Path, bootstrap: str, topic: str, rules: list[dict], sink: dict) -> None:
        self.run_dir, self.bootstrap, self.topic = run_dir, bootstrap, topic
        self.group = f"bench-peer-{uuid.uuid4().hex[:8]}"
        self.config = run_dir / "kdaemon.toml"
        write_config(self.config, bootstrap=bootstrap, topic=topic, group=self.group, state=run_dir / "state",
                     rules=rules, sink=sink)
        self.log_path = run_dir / "kdaemon.log"
        self.proc: subprocess.Popen | None = None
        self.watch: CommittedWatch | None = None

    def start(self) -> float:
        env = child_env(drop=("NOTIFY_SOCKET", "PROMETHEUS_MULTIPROC_DIR"))
        t0 = time.time()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        return t0

    def alive_or_raise(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"kdaemon exited with {self.proc.returncode}; see {self.log_path}")

    def wait_committed(self, ends: dict[int, int], timeout: float, interval: float = 0.25) -> float:
        deadline = time.monotonic() + timeout
        if self.watch is None:
            self.watch = CommittedWatch(self.bootstrap, self.group, self.topic)
        while True:
            self.alive_or_raise()
            if self.watch.reached(ends):
                return time.time()
            if time.monotonic() > deadline:
                raise RuntimeError(f"kdaemon did not commit {ends} within {timeout:g} s; see {self.log_path}")
            time.sleep(interval)

    def wait_serving(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while "uploader listening on" not in self.log_path.read_text(errors="replace"):
            self.alive_or_raise()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the uploader did not start within {timeout:g} s; see {self.log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise RuntimeError(f"kdaemon did not stop within 120 s of SIGTERM; see {self.log_path}")
        if code != 0:
            raise RuntimeError(f"kdaemon exited with {code} after SIGTERM; see {self.log_path}")

    def kill(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def kdaemon_sink(fmt: str, path: Path, extra: dict) -> dict:
    return {"type": "spark", "format": fmt, "path": str(path), "master": MASTER, "value_format": "json",
            "value_schema": VALUE_SCHEMA, "partition_by": PARTITION_BY, **extra}


# -- the Spark peer ------------------------------------------------------------------------------

class SparkPeer:
    """bench/_spark_peer_spark.py's streaming query in a child process: its protocol lines on
    stdout, its (and Spark's) log in a file, stopped by closing its stdin."""

    def __init__(self, run_dir: Path, spec: dict) -> None:
        self.run_dir, self.spec = run_dir, spec
        self.log_path = run_dir / "spark.log"
        self.proc: subprocess.Popen | None = None
        self.events: queue.Queue = queue.Queue()

    def start(self) -> float:
        t0 = time.time()
        spec = dict(self.spec, t_launch=t0)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(SPARK_SCRIPT), "stream", json.dumps(spec)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env=child_env(), start_new_session=True, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return t0

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                self.events.put(json.loads(line[len(PROTOCOL):]))
        self.events.put({"event": "exit"})

    def wait_event(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                ev = self.events.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Spark peer sent no {name!r} within {timeout:g} s; see {self.log_path}")
                continue
            if ev["event"] == name:
                return ev
            if ev["event"] == "exit":
                self.proc.wait(10)
                raise RuntimeError(f"the Spark peer exited with {self.proc.returncode} before {name!r}; "
                                   f"see {self.log_path}:\n{self.log_tail()}")

    def log_tail(self, lines: int = 15) -> str:
        text = [x for x in self.log_path.read_text(errors="replace").splitlines() if not x.lstrip().startswith("at ")]
        return "\n".join(text[-lines:])

    def stop(self) -> dict:
        """Close stdin (the query stops, then the session); its last summary."""
        self.proc.stdin.close()
        ev = self.wait_event("stopped", 180)
        self.proc.wait(60)
        return ev

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def processed(self, ends: dict[int, int]) -> bool:
        """Whether the query's last committed micro-batch (checkpoint ``commits/N``) read up to
        ``ends`` (its ``offsets/N``): its rows are in the table by then."""
        cp = Path(self.spec["checkpoint"])
        try:
            done = [int(f.name) for f in (cp / "commits").iterdir() if f.name.isdigit()]
        except FileNotFoundError:
            return False
        if not done:
            return False
        lines = (cp / "offsets" / str(max(done))).read_text().splitlines()
        offsets = json.loads(lines[-1]).get(self.spec["topic"], {})
        return all(int(offsets.get(str(p), 0)) >= e for p, e in ends.items())

    def wait_processed(self, ends: dict[int, int], timeout: float, interval: float = 0.25) -> float:
        deadline = time.monotonic() + timeout
        while not self.processed(ends):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark peer exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark peer did not process {ends} within {timeout:g} s; see {self.log_path}")
            time.sleep(interval)
        return time.time()


def spark_spec(fmt: str, path: Path, checkpoint: Path, bootstrap: str, topic: str, workload: str,
               trigger) -> dict:
    return {"format": fmt, "path": str(path), "checkpoint": str(checkpoint), "bootstrap": bootstrap,
            "topic": topic, "rules": WORKLOADS[workload], "value_schema": VALUE_SCHEMA, "master": MASTER,
            "partition_by": PARTITION_BY, "trigger": trigger}


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


def throughput_kdaemon(broker: KafkaBroker, lay: Layout, topic: str, produced: Produced, workload: str) -> dict:
    name = f"kdaemon_{_slug(workload)}_throughput"
    run_dir, table = lay.run_dir(name), lay.table(name)
    kd = Kdaemon(run_dir, broker.bootstrap, topic, WORKLOADS[workload], kdaemon_sink(lay.fmt, table, THROUGHPUT_SINK))
    bcpu0 = broker.cpu_s()
    t0 = kd.start()
    sampler = TreeSampler(kd.proc.pid, kdaemon_kind)
    sampler.start()
    try:
        t_done = kd.wait_committed(produced.ends, RUN_TIMEOUT_S)
        figures = sampler.stop()
        bcpu = broker.cpu_s() - bcpu0
        kd.stop()
    finally:
        sampler._done.set()
        kd.kill()
    return _throughput_result("kdaemon", workload, name, table, produced, t_done - t0, figures, bcpu,
                              log=str(kd.log_path))


def throughput_spark(broker: KafkaBroker, lay: Layout, topic: str, produced: Produced, workload: str) -> dict:
    name = f"spark_{_slug(workload)}_throughput"
    run_dir, table = lay.run_dir(name), lay.table(name)
    peer = SparkPeer(run_dir, spark_spec(lay.fmt, table, run_dir / "checkpoint", broker.bootstrap, topic, workload,
                                         "availableNow"))
    bcpu0 = broker.cpu_s()
    t0 = peer.start()
    sampler = TreeSampler(peer.proc.pid, spark_kind)
    sampler.start()
    try:
        done = peer.wait_event("done", RUN_TIMEOUT_S)
        figures = sampler.stop()
        bcpu = broker.cpu_s() - bcpu0
        peer.stop()
    finally:
        sampler._done.set()
        peer.kill()
    r = _throughput_result("spark", workload, name, table, produced, done["t_done"] - t0, figures, bcpu,
                           log=str(peer.log_path))
    r.update(session_start_s=done["t_session"] - t0, query_s=done["t_done"] - done["t_started"],
             input_rows=done["input_rows"], batches_with_rows=done["batches_with_rows"])
    if done["input_rows"] != produced.records:
        r["warning"] = f"the query read {done['input_rows']} records, the topic holds {produced.records}"
    return r


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
    """Read every table back in one Spark session (bench/_spark_peer_spark.py ``check``)."""
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
    rows = ["| workload | side | records/s | wall s | CPU s / M records | broker CPU s / M | peak RSS MB "
            "(sum of peaks) | latency p50 / p99 s (drain s) | exact |",
            "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    ratios = ["| workload | records/s | CPU s / M | peak RSS | latency p50 | latency p99 |",
              "|---|---:|---:|---:|---:|---:|"]
    for w in results["workloads"]:
        sides = {}
        for side in ("kdaemon", "spark"):
            t = results["throughput"].get(f"{side}/{w}", {})
            lrun = results["latency"].get(f"{side}/{w}", {})
            lat = lrun.get("latency") or {}
            sides[side] = (t, lat)
            if "error" in t:
                rows.append(f"| {w} | {side} | FAILED: {t['error'][:150]} | | | | | | |")
                continue
            exact = "yes" if t.get("check", {}).get("exact") else "NO"
            lexact = results["latency"].get(f"{side}/{w}", {}).get("check", {}).get("exact")
            if lexact is not None and not lexact:
                exact += " (latency run: NO)"
            rows.append(f"| {w} | {side} | {_n(t.get('records_per_s'))} | {_n(t.get('wall_s'), '{:.1f}')} | "
                        f"{_n(t.get('cpu_s_per_m'), '{:.1f}')} | {_n(t.get('broker_cpu_s_per_m'), '{:.1f}')} | "
                        f"{_n(t.get('rss_peak_mb'))} ({_n(t.get('hwm_sum_mb'))}) | "
                        f"{_n(lat.get('p50_s'), '{:.2f}')} / {_n(lat.get('p99_s'), '{:.2f}')} ({_n(lrun.get('drain_s'), '{:.1f}')}) | "
                        f"{exact} |")
        (kt, kl), (st, sl) = sides["kdaemon"], sides["spark"]
        ratios.append(f"| {w} | {_n(_ratio(kt.get('records_per_s'), st.get('records_per_s')), '{:.2f}x')} | "
                      f"{_n(_ratio(kt.get('cpu_s_per_m'), st.get('cpu_s_per_m')), '{:.2f}x')} | "
                      f"{_n(_ratio(kt.get('rss_peak_mb'), st.get('rss_peak_mb')), '{:.2f}x')} | "
                      f"{_n(_ratio(kl.get('p50_s'), sl.get('p50_s')), '{:.2f}x')} | "
                      f"{_n(_ratio(kl.get('p99_s'), sl.get('p99_s')), '{:.2f}x')} |")
    return "\n".join(rows) + "\n\nkdaemon / Spark (records/s: higher is better for kdaemon; the others: lower)\n\n" \
        + "\n".join(ratios)


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
    parser.add_argument("--no-latency", action="store_true", help="throughput runs only")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (tables, logs)")
    parser.add_argument("--json", type=Path, metavar="OUT", help="also write the results to OUT as JSON")
    args = parser.parse_args(argv)
    if args.records <= 0 or args.records % RECORDS_UNIT:
        parser.error(f"--records must be a positive multiple of {RECORDS_UNIT} (a tenth of each type)")

    head = _report.banner("bench/spark_peer.py")
    import pyspark
    from bench._spark_peer_spark import kafka_source_jars
    jars = kafka_source_jars()   # staged before any measurement (Maven, once)
    print(f"pyspark {pyspark.__version__}; Spark's Kafka source: {', '.join(Path(j).name for j in jars)}")
    print(f"format {args.format}, {args.records:,} records, workloads {', '.join(args.workloads)}; "
          f"rules: {json.dumps({w: WORKLOADS[w] for w in args.workloads})}")
    results = {"command": _report.command_line("bench/spark_peer.py", argv), **head, "format": args.format,
               "records": args.records, "workloads": args.workloads, "rules": {w: WORKLOADS[w] for w in args.workloads},
               "value_schema": VALUE_SCHEMA, "throughput": {}, "latency": {}}
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
            for w in args.workloads:
                for side, run in (("kdaemon", throughput_kdaemon), ("spark", throughput_spark)):
                    if side not in args.sides:
                        continue
                    try:
                        r = run(broker, lay, topic, produced, w)
                    except Exception as exc:   # noqa: BLE001 - one failed run is reported, the rest go on
                        r = {"side": side, "workload": w, "error": str(exc)}
                    results["throughput"][f"{side}/{w}"] = r
                    if "error" in r:
                        print(f"throughput {w} {side}: FAILED: {r['error']}", flush=True)
                        continue
                    items.append({"name": r["name"], "side": side, "format": args.format, "path": r["table"],
                                  "expected": produced.expected[w], "kept_types_hex": kept_types(w)})
                    print(f"throughput {w} {side}: {r['records_per_s']:,.0f} records/s ({r['wall_s']:.1f} s), "
                          f"CPU {r['cpu_s']:.1f} s = {r['cpu_s_per_m']:.1f} s/M "
                          f"{ {k: round(v, 1) for k, v in r['cpu_s_by_process'].items() if v >= 0.05} }, broker CPU "
                          f"{r['broker_cpu_s']:.1f} s, peak RSS {r['rss_peak_mb']:,.0f} MB (sum of peaks "
                          f"{r['hwm_sum_mb']:,.0f} MB) "
                          f"{ {k: round(v) for k, v in r['rss_at_peak_mb_by_process'].items()} }" + (f"; WARNING {r['warning']}" if r.get("warning") else ""),
                          flush=True)
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
        for table in (results["throughput"], results["latency"]):
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
    failed = [k for t in (results["throughput"], results["latency"]) for k, r in t.items()
              if "error" in r or not r.get("check", {}).get("exact")]
    if failed:
        print(f"\nFAILED or not exact: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
