"""A class-data archive (AppCDS) for the test run's Spark drivers: half the CPU of each start.

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

``python -m testkit.jvm_archive`` makes it now (in the foreground) and prints its path.
"""

from __future__ import annotations

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
    version = subprocess.run([java, "-version"], capture_output=True, text=True,
                             env={k: v for k, v in os.environ.items() if k != "JAVA_TOOL_OPTIONS"}).stderr
    digest = hashlib.sha256(version.encode())
    digest.update(os.path.realpath(java).encode())
    for jar in sorted((home / "jars").iterdir()):
        digest.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    return cache_dir() / f"spark-{digest.hexdigest()[:16]}.jsa"


def use(path: Path) -> None:
    """Every Spark JVM this process starts from now on (and its children's) maps ``path``."""
    flag = f"-XX:SharedArchiveFile={path}"
    current = os.environ.get(ENV, "")
    if flag not in current.split():
        os.environ[ENV] = f"{current} {flag}".strip()


def start_making(path: Path) -> subprocess.Popen | None:
    """Make the archive in a child process unless it exists (or another run is making it):
    the run's owner calls this once, before its workers start, and does not wait."""
    if path.exists():
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path.with_suffix(".log"), "w")
    return subprocess.Popen([sys.executable, "-m", "testkit.jvm_archive", str(path)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=str(Path(__file__).resolve().parent.parent))


def make(path: Path) -> None:
    """Run the workload in a JVM that writes the archive at its exit, then rename it into place.
    Under a lock: two runs at once make it once."""
    with locked(path.with_suffix(".lock")):
        if path.exists():
            return
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
        env = dict(os.environ)
        env[ENV] = f"-XX:ArchiveClassesAtExit={tmp}"
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        subprocess.run([sys.executable, "-c", _WORKLOAD], env=env, check=True,
                       cwd=str(Path(__file__).resolve().parent.parent))
        if not tmp.exists():
            raise RuntimeError(f"the JVM wrote no archive at {tmp}")
        os.replace(tmp, path)


# What the archive's JVM runs: a session with the Delta jars the sink uses, a Delta table and a
# Parquet directory written and read back, then the JVM's orderly exit (which writes the archive).
_WORKLOAD = r"""
import tempfile
from pyspark import SparkContext
from pyspark.sql import SparkSession
from kdaemon.sinks.spark import delta
from kdaemon.sinks.spark.writer import merged_conf
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


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else archive_path()
    if target is None:
        sys.exit("no java or no pyspark here: nothing to archive")
    make(target)
    print(target)
