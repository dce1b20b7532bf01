"""The uploader's SparkSession on demand (kdaemon/sinks/spark/uploader/process.py, session_start.py):
with direct writes it serves whole jobs into a Delta or Iceberg table and never starts Spark; a
job that needs Spark starts the session and waits for it; a failed start fails that job and ends
the uploader.  The session's start is held by the test (no JVM is launched by the uploader
here); the tables are read back with the tests' own reader session."""

from __future__ import annotations

import json
import threading
import time

import pytest

from testkit.daemon import wait_for
from testkit.spark import requires_spark

requires_spark()

from kdaemon.plugins.types import Record  # noqa: E402
from kdaemon.sinks.spark.tables import formats  # noqa: E402
from kdaemon.sinks.spark.staging import SparkSink  # noqa: E402
from kdaemon.sinks.spark.uploader.process import EXIT_CANNOT_START, Uploader  # noqa: E402
from kdaemon.sinks.spark.uploader.writer import SparkStartError  # noqa: E402

pytestmark = [pytest.mark.spark]

TOPIC = "events"
SCHEMA = "n BIGINT, kind STRING"


def _records(partition: int, offsets) -> list[Record]:
    out = []
    for o in offsets:
        value = json.dumps({"n": o, "kind": f"k{o % 3}"}).encode()
        out.append(Record(TOPIC, partition, o, 1_700_000_000_000 + o, 0, b"k", value, [("type", b"t")], b"k", value))
    return out


class _HeldStart:
    """Stands in for ``SparkWriter.start``: returns (or raises ``fail``) once the test lets it."""

    def __init__(self, fail: bool = False) -> None:
        self.release = threading.Event()
        self.fail = fail
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
        assert self.release.wait(60), "the test never let the session start"
        if self.fail:
            raise SparkStartError("cannot start a SparkSession on master local[1]: held by the test")


def _serve(tmp_path, monkeypatch, fmt: str, held: _HeldStart):
    from kdaemon.sinks.spark.uploader import process as uploader_mod
    monkeypatch.setattr(uploader_mod.signal, "signal", lambda *_: None)   # serve() runs in a thread here
    path = tmp_path / "lake" / "db" / "events"
    settings = {"type": "spark", "format": fmt, "master": "local[1]", "path": str(path),
                "socket": str(tmp_path / "up.sock"), "value_format": "json", "value_schema": SCHEMA,
                "partition_by": ["topic"]}
    up = Uploader(settings, str(tmp_path / "state"))
    monkeypatch.setattr(up.writer, "start", held)
    result: list[int] = []
    serving = threading.Thread(target=lambda: result.append(up.serve()), daemon=True)
    serving.start()
    sink = SparkSink(settings, str(tmp_path / "state"))
    deadline = time.monotonic() + 30
    while sink.probe() is not None:
        assert time.monotonic() < deadline, "the uploader did not listen"
        time.sleep(0.02)
    return up, sink, serving, result, str(path)


def _stop(up, sink, serving, held) -> None:
    sink.close()
    up._request_stop()
    held.release.set()
    serving.join(30)
    assert not serving.is_alive()


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_direct_jobs_are_served_without_starting_spark(tmp_path, monkeypatch, spark, fmt):
    held = _HeldStart()
    up, sink, serving, _, path = _serve(tmp_path, monkeypatch, fmt, held)
    try:
        # the socket listens before value_schema is parsed
        wait_for(lambda: up.writer.direct_writes, 30, "the uploader to find its jobs direct")
        assert not up.writer.session_ready
        sink.write(_records(0, range(0, 30)) + _records(1, range(0, 12)))
        sink.flush()   # confirmed: committed to the table
        assert not up.writer.session_ready and not held.release.is_set()
        assert formats.FORMATS[fmt].committed_offsets(path) == {(TOPIC, 0): 29, (TOPIC, 1): 11}
        sink.write(_records(0, range(30, 40)))
        sink.flush()
        assert formats.FORMATS[fmt].committed_offsets(path) == {(TOPIC, 0): 39, (TOPIC, 1): 11}
        assert held.calls == 0, "an uploader whose jobs all went the direct path started Spark"
    finally:
        _stop(up, sink, serving, held)
    rows = spark.read.format(fmt).load(path).select("partition", "offset", "value.n", "value.kind").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(0, o) for o in range(40)] + [(1, o) for o in range(12)]
    assert all(r.n == r.offset and r.kind == f"k{r.offset % 3}" for r in rows)


def test_a_job_that_needs_spark_waits_and_fails_with_the_start(tmp_path, monkeypatch):
    """A table the direct path does not write (here: another schema) needs Spark: its job waits
    for the session; a session that cannot start fails the job (the worker keeps its batch and
    rewinds) and ends the uploader, which the supervisor starts again with backoff."""
    from kdaemon.sinks.spark.tables import delta
    from pyspark.sql import types as T
    import pyarrow as pa
    held = _HeldStart(fail=True)
    up, sink, serving, result, path = _serve(tmp_path, monkeypatch, "delta", held)
    try:
        other = T.StructType([T.StructField("x", T.LongType())])
        assert delta.append_files([pa.table({"x": pa.array([1], pa.int64())})], path, [], {("else", 0): 0},
                                  other) is not None   # a table of another shape, made first
        sink.write(_records(0, range(0, 5)))
        pending = sink.flush_async()
        wait_for(lambda: held.calls, 30, "the job that needs Spark to start it")
        assert not pending.done() and held.calls == 1, "a job that needs Spark went ahead without it"
        held.release.set()
        deadline = time.monotonic() + 30
        with pytest.raises(Exception, match="held by the test"):
            while not pending.done():
                assert time.monotonic() < deadline, "the job never ended"
                time.sleep(0.05)
        serving.join(30)
        assert result == [EXIT_CANNOT_START]
    finally:
        _stop(up, sink, serving, held)
    assert formats.delta.committed_offsets(path, [("else", 0), (TOPIC, 0)]) == {("else", 0): 0}   # nothing of the job
