"""The chaos run's Spark phase: what the uploader made durable, and the read-back with Spark.

While the run goes on, ``SparkOutputReader`` follows the uploads' commit points, the manifests
(``kdaemon/sinks/spark/tables/layout.py``: a batch is in the output iff its manifest exists), reading
each once: per partition, the rows each upload added (``new_rows``) and the highest offset
covered.  That is cheap enough to sample twice a second and is what the sampler's lag and the
faults' recovery times use.

The verdict does not trust the manifests: ``final()`` reads the output back with Spark itself
(``spark.read.parquet``, the way a user reads it) and counts every row's (topic, partition,
offset), so a file an interrupted upload left behind, a batch written twice or a record outside
any manifest shows up as a duplicate or an unknown record.

``uploader()`` finds the daemon's uploader process (and the JVM it started) for the
``uploader_kill`` fault.
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from pathlib import Path

import psutil

UPLOADER_MODULE = "kdaemon.sinks.spark.uploader.process"


class SparkOutputReader:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: set[str] = set()                   # manifest paths already read
        self.per_partition: Counter = Counter()       # (topic, partition) -> rows uploaded
        self.high: dict[tuple[str, int], int] = {}    # (topic, partition) -> highest offset covered
        self.rows = 0
        self.lock = threading.Lock()
        self._wanted: tuple[int, dict] | None = None

    def progress(self) -> tuple[int, dict]:
        """(rows in the output, rows per partition), from the manifests written so far."""
        with self.lock:
            self._scan()
            return self.rows, dict(self.per_partition)

    def _scan(self) -> None:
        root = self.directory / "_kdaemon" / "manifests"
        if not root.is_dir():
            return
        for topic_dir in root.iterdir():
            for part_dir in topic_dir.iterdir():
                for entry in os.scandir(part_dir):
                    if not entry.name.endswith(".json") or entry.path in self.seen:
                        continue
                    try:
                        with open(entry.path, "rb") as fh:
                            m = json.load(fh)
                    except FileNotFoundError:
                        continue
                    # Written durably (temporary file, fsync, rename): never seen half-written.
                    tp = (m["topic"], int(m["partition"]))
                    self.per_partition[tp] += int(m["new_rows"])
                    self.rows += int(m["new_rows"])
                    self.high[tp] = max(self.high.get(tp, -1), int(m["last"]))
                    self.seen.add(entry.path)

    def covers(self, expected: set) -> bool:
        """Every partition's uploads reach its last expected offset (a batch holds every kept
        record between its first and last offset: layout.py, invariant 3)."""
        if self._wanted is None or self._wanted[0] != id(expected):
            highest: dict = {}
            for t, p, o in expected:
                highest[(t, p)] = max(highest.get((t, p), -1), o)
            self._wanted = (id(expected), highest)
        with self.lock:
            self._scan()
            return all(self.high.get(tp, -1) >= o for tp, o in self._wanted[1].items())

    def final(self) -> Counter:
        """Every row of the output, read back with Spark: (topic, partition, offset) -> count."""
        from pyspark.sql import SparkSession
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        active = SparkSession.getActiveSession()
        spark = active or (SparkSession.builder.master("local[1]").appName("kdaemon-chaos-reader")
                           .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
                           .config("spark.driver.host", "127.0.0.1")
                           .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
        try:
            table = spark.read.parquet(str(self.directory)).select("topic", "partition", "offset").toArrow()
        finally:
            if active is None:
                spark.stop()
        cols = [table.column(name).to_pylist() for name in ("topic", "partition", "offset")]
        return Counter(zip(*cols))


def uploader(daemon_pid: int) -> psutil.Process | None:
    """The supervisor's uploader child (its command line names the entry
    ``kdaemon.sinks.spark.uploader.process:run``), or None while it is being restarted."""
    try:
        children = psutil.Process(daemon_pid).children()
    except psutil.NoSuchProcess:
        return None
    for p in children:
        try:
            if UPLOADER_MODULE in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                return p
        except psutil.NoSuchProcess:
            continue
    return None
