"""Class-data archives (AppCDS) for the test run's JVMs: Spark drivers at half the start-up CPU,
Kafka's brokers and tools cheaper too.

The suite is CPU-bound on two cores (docs/TESTING.md), and a Spark driver's start is the
largest piece of JVM start-up in it: every Spark sink daemon's uploader, every reader session
and every writer suite's fresh JVM loads some 10,000 classes.  Measured here (a local[1]
session, one small query, C1 only as the tests run it; the JVM's own CPU from /proc):

    without an archive   11.7, 12.2, 13.7 CPU-s
    with this archive     5.7,  6.1,  6.5, 6.7 CPU-s

The archive is JDK 17's dynamic one (``-XX:ArchiveClassesAtExit``): one JVM runs a short
Spark workload (Delta and Parquet, written and read back) and writes the classes it loaded at
its exit; every later Spark JVM maps it (``-XX:SharedArchiveFile``, through
``SPARK_SUBMIT_OPTS``, which ``spark-class`` puts on the driver's command line and which
daemons and their uploaders inherit).  It is valid only for the JVM and the class path it was
made with, so its name carries a digest of both (the ``java -version`` line, pyspark's version
and ``$SPARK_HOME/jars``): another JDK or pyspark gets an archive of its own instead of a
mismatch warning.  A JVM started while the archive is still being made finds no file and runs
as before (the JDK says nothing then); the archive is written under a temporary name and
renamed into place.  Only the tests use it: kdaemon itself starts its JVMs unchanged.

Measured for Kafka (a one-node start: its storage format, the node until it serves, its stop):

    without an archive   5.5, 5.7 CPU-s (the node 3.7, 4.0 of them at ready)
    with this archive    3.3, 3.7 CPU-s (2.1, 2.4)

Apache Kafka's JVMs (a cluster's nodes, ``kafka-storage format`` before each, Kafka's tools)
share one class path, ``apache_kafka.kafka_classpath()``: a broker started with
``-XX:ArchiveClassesAtExit`` and stopped after a topic's produce and fetch makes their archive,
and ``flags("kafka", classpath)`` names it on each of their command lines once it exists.
The Java peer (its classes in a jar: the JDK archives no class directory) gets one the same
way, made by the peer reading that broker's topic in a group:

    without an archive   1.69, 1.80 CPU-s (the peer reading 100 records in a group)
    with this archive    0.96, 1.01 CPU-s  The
suites with clusters of their own start some 55 nodes and as many formats in a run.

``python -m testkit.jvm_archive`` makes the Spark archive now (in the foreground) and prints
its path; ``python -m testkit.jvm_archive kafka`` the Kafka one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from testkit.shared import locked

ENV = "SPARK_SUBMIT_OPTS"
DISABLE_ENV = "KDAEMON_TEST_NO_CDS"   # set to 1 to measure a run without the archive
# Set by the test run (tests/conftest.py) for its processes: the benchmarks start their JVMs as
# they always did, so their figures stay comparable.
ENABLE_ENV = "KDAEMON_TEST_CDS"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kdaemon" / "cds"


def _spark_home() -> Path | None:
    try:
        import pyspark
    except ImportError:
        return None
    return Path(pyspark.__file__).parent


def archive_path() -> Path | None:
    """Where this JDK's and this pyspark's archive lives (made or not); None without either."""
    java, home = shutil.which("java"), _spark_home()
    if java is None or home is None or not (home / "jars").is_dir():
        return None
    real, version = _java_identity()
    digest = hashlib.sha256(version.encode())
    digest.update(real.encode())
    for jar in sorted((home / "jars").iterdir()):
        st = jar.stat()
        digest.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return cache_dir() / f"spark-{digest.hexdigest()[:16]}.jsa"


@functools.lru_cache(maxsize=None)
def _java_identity() -> tuple[str, str]:
    """The JDK an archive belongs to: ``java``'s real path and its ``-version`` lines."""
    java = shutil.which("java") or "java"
    version = subprocess.run([java, "-version"], capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}).stderr
    return os.path.realpath(java), version


def classpath_archive(kind: str, classpath: str) -> Path:
    """Where the archive of JVMs launched with ``-cp classpath`` lives (made or not): its name
    carries the JDK and every entry of the class path with its size and modification time: the
    JVM refuses an archive when a jar's differs (a jar copied again, same bytes and size, is
    enough), and says so on its standard output, where the Java peer's JSON is read."""
    real, version = _java_identity()
    digest = hashlib.sha256(f"{real}\n{version}".encode())
    for entry in classpath.split(os.pathsep):
        try:
            st = os.stat(entry)
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            stamp = "-1"
        digest.update(f"{entry}:{stamp}\n".encode())
    return cache_dir() / f"{kind}-{digest.hexdigest()[:16]}.jsa"


def flags(kind: str, classpath: str) -> list[str]:
    """The options that map ``kind``'s archive for a JVM launched with ``-cp classpath``: none
    while it is not made (or with ``KDAEMON_TEST_NO_CDS``)."""
    if os.environ.get(DISABLE_ENV) or not os.environ.get(ENABLE_ENV):
        return []
    path = classpath_archive(kind, classpath)
    return [f"-XX:SharedArchiveFile={path}"] if path.exists() else []


def use(path: Path) -> None:
    """Every Spark JVM this process starts from now on (and its children's) maps ``path``."""
    flag = f"-XX:SharedArchiveFile={path}"
    current = os.environ.get(ENV, "")
    if flag not in current.split():
        os.environ[ENV] = f"{current} {flag}".strip()


def start_making(path: Path | None, kind: str = "spark") -> subprocess.Popen | None:
    """Make the archive in a child process unless it exists (or another run is making it):
    the run's owner calls this once, before its workers start, and does not wait.  ``path``
    None: the child finds it (Kafka's needs its jars, which the child resolves if the run has
    not yet)."""
    if path is not None and path.exists():
        return None
    cache_dir().mkdir(parents=True, exist_ok=True)
    log = open(path.with_suffix(".log") if path is not None else cache_dir() / f"{kind}.log", "w")
    return subprocess.Popen([sys.executable, "-m", "testkit.jvm_archive", kind, *([str(path)] if path else [])],
                            stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=str(Path(__file__).resolve().parent.parent))


def make(path: Path, kind: str = "spark") -> None:
    """Run ``kind``'s workload in a JVM that writes the archive at its exit, then rename it into
    place.  Under a lock: two runs at once make it once."""
    with locked(path.with_suffix(".lock")):
        if path.exists():
            return
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        try:
            if kind == "kafka":
                _kafka_workload(tmp)
            else:
                env = dict(os.environ)
                env[ENV] = f"-XX:ArchiveClassesAtExit={tmp}"
                env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
                subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, check=True,
                               cwd=str(Path(__file__).resolve().parent.parent))
            if not tmp.exists():
                raise RuntimeError(f"the JVM wrote no archive at {tmp}")
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def _kafka_workload(tmp: Path) -> None:
    """A one-node Kafka started with ``-XX:ArchiveClassesAtExit``: a topic made, written and
    read, then a controlled shutdown (the JVM writes the archive on its way out).  Meanwhile the
    Java peer (testkit/java_peer.py, on a class path of its own) reads the topic in a group and
    writes its own archive at its exit."""
    from testkit.apache_kafka import start_kafka
    from testkit.java_peer import peer_command
    from testkit.produce import consume_all, create_topic, produce
    with tempfile.TemporaryDirectory(prefix="kdaemon-cds-kafka-") as d:
        cluster = start_kafka(d, java_opts=("-XX:+UseSerialGC", f"-XX:ArchiveClassesAtExit={tmp}"))
        try:
            create_topic(cluster.bootstrap, "cds", 2)
            produce(cluster.bootstrap, "cds", [(b"k%d" % i, b"v%d" % i, ()) for i in range(100)], partition=0)
            consume_all(cluster.bootstrap, "cds", 0, count=100)
            _peer_workload(peer_command(), cluster.bootstrap)
        finally:
            for node in cluster.nodes.values():
                node.stop(timeout=180)


def _peer_workload(peer: list[str], bootstrap: str) -> None:
    path = classpath_archive("peer", peer[peer.index("-cp") + 1])
    if path.exists():
        return
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    try:
        run = subprocess.run([peer[0], f"-XX:ArchiveClassesAtExit={tmp}", *peer[1:], "consume", "--bootstrap",
                              bootstrap, "--topics", "cds", "--group", "cds", "--reset", "earliest",
                              "--max-records", "100", "--commit", "sync"], capture_output=True, text=True, timeout=300)
        if run.returncode == 0 and tmp.exists():
            os.replace(tmp, path)
        else:   # the peer's archive only: the Kafka one is still made
            print(f"the Java peer's archive run failed ({run.returncode}):\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    finally:
        tmp.unlink(missing_ok=True)


# What the archive's JVM runs: a session with the Delta jars the sink uses, a Delta table and a
# Parquet directory written and read back, then the JVM's orderly exit (which writes the archive).
_WORKLOAD = r"""
import tempfile
from pyspark import SparkContext
from pyspark.sql import SparkSession
from kdaemon.sinks.spark.tables import delta
from kdaemon.sinks.spark.uploader.writer import merged_conf
builder = SparkSession.builder.master("local[1]").appName("kdaemon-tests-cds")
conf = merged_conf(delta.session_conf(), {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                                          "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                                          "spark.sql.session.timeZone": "UTC", "spark.sql.shuffle.partitions": "1"})
for k, v in conf.items():
    builder = builder.config(k, v)
spark = builder.getOrCreate()
with tempfile.TemporaryDirectory() as d:
    df = spark.range(100).selectExpr("id", "cast(id as string) as s", "current_date() as date")
    df.write.partitionBy("date").parquet(d + "/p")
    spark.read.parquet(d + "/p").groupBy("date").count().collect()
    df.write.format("delta").partitionBy("date").save(d + "/d")
    spark.read.format("delta").load(d + "/d").where("id > 5").count()
proc = SparkContext._gateway.proc
spark.stop()
SparkContext._gateway.shutdown()
proc.stdin.close()   # the JVM exits when its stdin closes, and writes the archive on the way out
proc.wait(timeout=300)
"""


def kafka_archive_path() -> Path:
    from testkit.apache_kafka import kafka_classpath
    return classpath_archive("kafka", kafka_classpath())


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "spark"
    if which not in ("spark", "kafka"):
        sys.exit(f"usage: python -m testkit.jvm_archive [spark|kafka] [PATH], not {which!r}")
    target = Path(sys.argv[2]) if len(sys.argv) > 2 else (archive_path() if which == "spark" else kafka_archive_path())
    if target is None:
        sys.exit("no java or no pyspark here: nothing to archive")
    make(target, which)
    print(target)
