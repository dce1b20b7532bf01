"""Helpers for the Spark sink tests: produce with delivery reports, run ``kdaemon run`` with the
spark sink, wait for commits, read the output back with Spark.

Everything runs on 127.0.0.1: the session's Tansu broker, the daemons, Spark in local mode.
Every wait is bounded and fails with the daemon's log tail.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import random
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from kafka import KafkaAdminClient, TopicPartition as KpTopicPartition
from kafka.errors import KafkaError

from testkit.daemon import Daemon, free_port, wait_for
from testkit.produce import Writer, create_topic, paced

HOST = "127.0.0.1"
UPLOADER_MODULE = "kdaemon.sinks.spark.uploader.process"
TYPES = ("order.created", "order.shipped", "page.view", "heartbeat")
KEPT_TYPES = ("order.created", "order.shipped")
# The header rule of every test: keep orders, drop the rest (and records without a type).
FILTERS = [{"header": "type", "op": "in", "values": list(KEPT_TYPES), "action": "keep"}]
DAY_MS = 86_400_000


def requires_spark() -> None:
    """Call at the top of a test module: skip the module without PySpark, pyarrow or Java."""
    pytest.importorskip("pyspark", reason="the Spark sink tests need PySpark (pip install -e '.[spark]')")
    pytest.importorskip("pyarrow", reason="the Spark sink tests need pyarrow (pip install -e '.[spark]')")
    if shutil.which("java") is None:
        pytest.skip("the Spark sink tests need a Java runtime (java on PATH)", allow_module_level=True)


# -- records -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Sent:
    """One produced record as the output must show it (headers in produce order)."""

    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp: int

    @property
    def kept(self) -> bool:
        types = [v for k, v in self.headers if k == "type"]
        # The rule group looks at the first matching header; our records have at most one.
        return bool(types) and types[0] is not None and types[0].decode() in KEPT_TYPES


def make_record(i: int, rng: random.Random, now_ms: int, value: bytes | None = None) -> Sent:
    """A record with headers (sometimes none, a null header value, a repeated key), a key
    (sometimes null), a JSON value (sometimes null) and a timestamp on one of three days."""
    headers: list = []
    if i % 23 != 0:
        headers.append(("type", rng.choice(TYPES).encode()))
    headers.append(("trace", f"{rng.getrandbits(64):016x}".encode()))
    if i % 7 == 0:
        headers += [("dup", b"first"), ("dup", b"second")]
    if i % 11 == 0:
        headers.append(("nullable", None))
    key = None if i % 97 == 0 else f"k{i % 5000}".encode()
    if value is None and i % 101 != 0:
        value = json.dumps({"id": i, "type": "x", "amount": round(rng.uniform(1, 500), 2)}).encode()
    ts = now_ms - (i % 3) * DAY_MS   # three dates, so the output has three date partitions
    return Sent(key, value, tuple(headers), ts)


class Produced:
    """What was produced to a topic, by (partition, offset), from delivery reports."""

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.records: dict[tuple[int, int], Sent] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def ends(self) -> dict[int, int]:
        """Next offset per partition after the last delivered record (not the high watermark:
        Tansu's is not reliable)."""
        with self._lock:
            out = {p: 0 for p in range(self.partitions)}
            for p, o in self.records:
                out[p] = max(out[p], o + 1)
            return out

    def expected(self) -> dict[tuple[str, int, int], Sent]:
        with self._lock:
            return {(self.topic, p, o): r for (p, o), r in self.records.items() if r.kept}

    def __len__(self) -> int:
        return len(self.records)


def produce(bootstrap: str, produced: Produced, records: Iterable[Sent], *,
            rate: float | None = None, stop: threading.Event | None = None) -> None:
    """Produce ``records`` round-robin over the partitions; ``rate`` records/s if given."""
    writer = Writer(bootstrap, produced.topic, "lz4", **{"linger.ms": 20, "queue.buffering.max.messages": 200_000})

    def on_delivered(sent: Sent):
        def record(msg):
            with produced._lock:
                produced.records[(msg.partition(), msg.offset())] = sent
        return record

    for n, r in enumerate(paced(records, rate)):
        if stop is not None and stop.is_set():
            break
        writer.send(r.value, r.key, headers=r.headers, timestamp=r.timestamp, partition=n % produced.partitions,
                    on_delivered=on_delivered(r))
    left = writer.flush(60)
    produced.errors.extend(writer.errors)
    assert not left and not produced.errors, f"produce failed: {left} left, errors {produced.errors[:3]}"


def new_topic(bootstrap: str, partitions: int = 4, prefix: str = "spark") -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:10]}"
    create_topic(bootstrap, topic, partitions)
    return topic


# -- committed offsets ---------------------------------------------------------------------------

def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, tuple[int, str | None]]:
    """{partition: (committed offset or -1, metadata)} read with kafka-python's admin client.

    Not confluent-kafka: its binding reads commit metadata as a NUL-terminated C string, so
    metadata committed without a trailing NUL (by us, or by the Java consumer) comes back with
    whatever bytes follow it in memory, or fails to decode (seen on Apache Kafka as well as on
    librdkafka's mock cluster)."""
    wanted = [KpTopicPartition(topic, p) for p in range(partitions)]
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                found = admin.list_group_offsets({group: wanted})[group]
                break
            except KafkaError as exc:   # e.g. no coordinator yet: __consumer_offsets is new
                if not exc.retriable or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()
    out: dict[int, tuple[int, str | None]] = {p: (-1, None) for p in range(partitions)}
    for tp, om in found.items():
        if tp.topic == topic and om.offset >= 0:
            out[tp.partition] = (om.offset, om.metadata)
    return out


def caught_up(bootstrap: str, group: str, produced: Produced) -> bool:
    ends = produced.ends()
    got = committed(bootstrap, group, produced.topic, produced.partitions)
    return all(got[p][0] >= end for p, end in ends.items())


# -- the daemon ----------------------------------------------------------------------------------

def spark_config(root: Path, bootstrap: str, topic: str, group: str, out: Path, *, daemon_id: str = "kd",
                 workers: int = 2, sink: dict | None = None, **daemon) -> dict:
    d = {"topics": [topic], "workers": workers, "daemon_id": daemon_id, "state_dir": str(root / "state"),
         "metrics_addr": f"{HOST}:{free_port()}", "flush_interval_ms": 500, "poll_timeout_ms": 200,
         "shutdown_timeout_s": 60.0, "heartbeat_timeout_s": 60.0, "sink_retry_backoff_ms": 200,
         "sink_retry_backoff_max_ms": 2000, "on_deserialize_error": "skip"}
    d.update(daemon)
    return {
        "plugins": [],
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group, "auto_offset_reset": "earliest",
                  "session_timeout_ms": 6000, "heartbeat_interval_ms": 500, "fetch_max_wait_ms": 100,
                  "retry_backoff_ms": 50, "request_timeout_ms": 10_000, "max_poll_records": 5000},
        "daemon": d,
        "filters": FILTERS,
        "deserializer": {"key": "bytes", "value": "bytes"},
        "sink": {"type": "spark", "master": "local[2]", "path": str(out), "max_records": 20000,
                 "max_age_s": 2, **(sink or {})},
    }


class SparkDaemon(Daemon):
    """The supervisor test harness's ``Daemon`` with what the Spark tests add: the uploader
    process, Java-aware log tails, waiting for committed offsets."""

    kill_wait_s = 10.0   # the uploader's JVM

    def __init__(self, root: Path, config: dict) -> None:
        super().__init__(root, config)
        self.state_dir = Path(config["daemon"]["state_dir"])

    # -- processes --------------------------------------------------------------------------------

    def _children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []

    def uploader(self) -> psutil.Process | None:
        for p in self._children():
            try:
                if UPLOADER_MODULE in " ".join(p.cmdline()):
                    return p
            except psutil.NoSuchProcess:
                continue
        return None

    def worker_processes(self) -> list[psutil.Process]:
        """Forked workers: children running the same command line as the supervisor."""
        try:
            own = psutil.Process(self.pid).cmdline()
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in self._children():
            try:
                if p.cmdline() == own and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                continue
        return out

    # -- log ----------------------------------------------------------------------------------------

    def log_tail(self, lines: int = 80) -> str:
        text = [l for l in self.log().splitlines() if not l.lstrip().startswith("at ")]
        return f"--- {self.log_path} (tail, without Java stack frames) ---\n" + "\n".join(text[-lines:])

    def wait_caught_up(self, bootstrap: str, produced: Produced, timeout: float) -> None:
        group = self.config["kafka"]["group_id"]

        def done():
            assert self.alive(), f"kdaemon exited with {self.proc.returncode}\n{self.log_tail()}"
            return caught_up(bootstrap, group, produced)

        wait_for(done, timeout, f"committed offsets to reach {produced.ends()}",
                 lambda: f"committed: {committed(bootstrap, group, produced.topic, produced.partitions)}\n"
                         f"{self.log_tail()}", interval=1.0)


def dir_size(path: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                total += os.stat(os.path.join(dirpath, n)).st_size
            except FileNotFoundError:
                pass
    return total


class SizeSampler(threading.Thread):
    """Samples a directory's size every ``interval`` seconds; ``peak`` is the largest seen."""

    def __init__(self, path: Path, interval: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.interval = interval
        self.peak = 0
        self.samples = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, dir_size(self.path))
            self.samples += 1
            self._done.wait(self.interval)

    def stop(self) -> int:
        self._done.set()
        self.join(5)
        return self.peak


# -- reading the output back ---------------------------------------------------------------------

def read_output(spark, path: Path, fmt: str = "parquet") -> list[dict]:
    """Every row of the Spark output (``fmt``: the sink's format) as dicts (through Arrow:
    quick for 100k rows)."""
    return spark.read.format(fmt).load(str(path)).toArrow().to_pylist()


def row_key(row: dict) -> tuple[str, int, int]:
    return row["topic"], row["partition"], row["offset"]


def assert_exact(rows: list[dict], expected: dict) -> None:
    """No duplicate and no missing (topic, partition, offset); nothing unexpected."""
    keys = [row_key(r) for r in rows]
    seen: set = set()
    dups = [k for k in keys if k in seen or seen.add(k)]
    assert not dups, f"{len(dups)} duplicate row(s) in the output, e.g. {sorted(dups)[:5]}"
    missing = set(expected) - seen
    extra = seen - set(expected)
    assert not missing, f"{len(missing)} record(s) missing from the output, e.g. {sorted(missing)[:5]}"
    assert not extra, f"{len(extra)} unexpected record(s) in the output, e.g. {sorted(extra)[:5]}"


def ts_of(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc)


# Classes only a JVM launched with Delta's and Iceberg's jars can load (the reader's: reader_session).
_TABLE_CLASSES = ("io.delta.sql.DeltaSparkSessionExtension",
                  "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")


def _jvm_has_table_jars() -> bool:
    from pyspark import SparkContext
    if SparkContext._gateway is None:
        return False
    jvm = SparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        for name in _TABLE_CLASSES:
            jvm.java.lang.Class.forName(name, False, loader)
    except Exception:
        return False
    return True


def reader_session():
    """A local[1] session in a JVM launched with Delta's and Iceberg's jars and both session
    extensions: it reads every format the sink writes (Iceberg's tables by path, so no catalog)."""
    import os
    from pyspark.sql import SparkSession

    from kdaemon.sinks.spark.tables import delta, iceberg
    from kdaemon.sinks.spark.uploader.writer import merged_conf
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # only loopback, whatever the host name says
    if not _jvm_has_table_jars():
        fresh_jvm()
    builder = SparkSession.builder
    iceberg_conf = iceberg.session_conf("/nowhere/ns/t")
    conf = merged_conf(delta.session_conf(), {k: iceberg_conf[k] for k in ("spark.jars", "spark.sql.extensions")})
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = (builder.master("local[1]").appName("kdaemon-tests-reader")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "1")
               # Delta's VACUUM lists the table in this many tasks (10,000 by default): on local[1]
               # a VACUUM of a small table took 95 s and 105 CPU-s, against 4.3 s and 5.4 with 4.
               .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "4")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def fresh_session() -> None:
    """Stop this process's Spark session but keep its JVM, launched with Delta's and Iceberg's
    jars (``reader_session``) if it was not: the next ``getOrCreate`` (a writer's, the reader's)
    starts a new SparkContext, with its own settings and catalogs, in a JVM that already has
    the jars and its compiled code.  A JVM launch costs 6-15 CPU-s (and its JIT warm-up more),
    and the writer suites used to launch two each.  A suite that tests how jars reach a JVM
    uses ``fresh_jvm``."""
    from pyspark.sql import SparkSession
    if not _jvm_has_table_jars():
        reader_session()
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


def fresh_jvm() -> None:
    """Stop this process's Spark session and its JVM, so the next session launches its own:
    only a JVM's launch puts ``spark.jars`` on the driver's classpath (a JVM another suite
    started earlier in this process cannot load Delta or Iceberg)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._gateway is not None:
        SparkContext._gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None


@contextlib.contextmanager
def uploader_serving(up, sink, monkeypatch, seconds: float = 10.0):
    """``up.serve()`` on a thread of this process until the block ends (asked to stop, then
    joined), entered once ``sink`` (a ``SparkSink`` of the same settings) reaches it.  The
    uploader's signal handlers are left alone: only the main thread may set them."""
    from kdaemon.sinks.spark.uploader import process
    monkeypatch.setattr(process.signal, "signal", lambda *_: None)
    serving = threading.Thread(target=up.serve, daemon=True)
    serving.start()
    try:
        deadline = time.monotonic() + seconds
        while sink.probe() is not None:
            assert time.monotonic() < deadline, f"the uploader did not listen within {seconds} s"
            time.sleep(0.02)
        yield
    finally:
        up._request_stop()
        serving.join(seconds)


def staged_request(directory: Path, topic: str, partition: int, offsets: range,
                   values: list[bytes | None] | None = None, keys: list[bytes | None] | None = None):
    """A worker's staged batch of ``offsets`` (written in the staging format) in ``directory``,
    and the uploader request for it; ``values`` and ``keys`` default to ``v<offset>`` and ``k``."""
    from kdaemon.sinks.spark import staged
    from kdaemon.sinks.spark.tables.layout import BatchId
    from kdaemon.sinks.spark.uploader.process import Request
    directory.mkdir(parents=True, exist_ok=True)
    batch = BatchId(partition, offsets[0], offsets[-1])
    path = str(directory / f"{len(os.listdir(directory)):04d}-{batch.name}.staged")
    n = len(offsets)
    staged.write(path, topic, partition, list(offsets), [1_700_000_000_000 + o for o in offsets], [0] * n,
                 keys or [b"k"] * n, values or [b"v%d" % o for o in offsets], [[("h", b"x")]] * n)
    return Request(None, 1, path, topic, batch, n)


def check_unfinished_uploads_settle(path: str, fmt: str, state_dir: Path, commit_partition_0) -> None:
    """Two uploads of topic ``t`` announced by pending records (offsets 0..9 of partitions 0 and
    1), as an uploader killed before their manifests leaves them; ``commit_partition_0()`` makes
    partition 0's table commit (with 9 as its recorded offset), partition 1's never happened.
    The next uploader rolls partition 0 forward (manifest written) and 1 back."""
    from kdaemon.sinks.spark.tables import layout, formats
    from kdaemon.sinks.spark.tables.layout import BatchId
    from kdaemon.sinks.spark.uploader.process import Uploader
    uploader = Uploader({"type": "spark", "path": path, "format": fmt, "master": "local[1]"}, str(state_dir))
    committed_batch, lost_batch = BatchId(0, 0, 9), BatchId(1, 0, 9)
    for batch in (committed_batch, lost_batch):
        record = {"files": [], "table": formats.pending_entry(fmt, "t", batch.partition, batch.last)}
        layout.write_durably(layout.pending_path(path, "t", batch), json.dumps(record).encode())
    commit_partition_0()
    for partition in (0, 1):
        uploader._finish_interrupted("t", partition)
    assert layout.uploaded_ranges(path, "t", 0) == [(0, 9)]
    with open(layout.manifest_path(path, "t", committed_batch)) as fh:
        assert json.load(fh)["recovered"] is True
    assert layout.uploaded_ranges(path, "t", 1) == []
    assert layout.pending_uploads(path, "t", 0) == layout.pending_uploads(path, "t", 1) == []
