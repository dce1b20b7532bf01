"""The exactly-once rules of the Spark sink, without Spark: the uploader's bookkeeping (manifests,
pending records, overlap drops) with a stand-in for the Spark write, and the worker side's
refusals.  Fast and deterministic: the end-to-end and chaos tests hit these paths only by chance.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest

pa = pytest.importorskip("pyarrow", reason="the spark sink needs pyarrow (pip install -e '.[spark]')")
import pyarrow.parquet as pq  # noqa: E402

from kdaemon.client.types import OffsetAndMetadata, TopicPartition  # noqa: E402
from kdaemon.config import parse  # noqa: E402
from kdaemon.plugins.types import Record  # noqa: E402
from kdaemon.sinks.spark.tables import layout
from kdaemon.sinks.spark.uploader import process as uploader_mod  # noqa: E402
from kdaemon.sinks.spark.tables.layout import BatchId  # noqa: E402
from kdaemon.sinks.spark.staging import (SparkSink, SparkUploadError, UploaderUnavailable,  # noqa: E402
                                          validate_settings)
from kdaemon.sinks.spark.uploader.process import Request, Uploader  # noqa: E402
from kdaemon.sinks.spark.wire import PrepareHint, UploadReply, UploadRequest, decode_request, parse_line  # noqa: E402
from kdaemon.worker.build import PipelineParts  # noqa: E402
from kdaemon.worker.pipeline import Mode, Worker  # noqa: E402

TOPIC = "events"


def _records(partition: int, offsets) -> list[Record]:
    return [Record(TOPIC, partition, o, 1_700_000_000_000 + o, 0, b"k", f"v{o}".encode(), [("h", b"x")],
                   b"k", f"v{o}".encode()) for o in offsets]


class FakeWriter:
    """Writes what Spark's ``partitionBy(topic, date, _batch)`` would, with pyarrow: one file
    per (topic, _batch) under ``tmp/data/topic=<t>/date=1970-01-01/_batch=<b>/``."""

    format = "parquet"
    direct_writes = False   # every job goes through prepare (Spark's path), as path mode's do
    session_ready = True    # no Spark to wait for (a test's own start() may take its time)

    def prepare_offline(self) -> None:
        pass

    def check_spark(self) -> None:
        pass   # Parquet: no staged jars to match

    def __init__(self) -> None:
        self.jobs = 0
        self.bad_value = False   # a value does not parse: a not-careful job fails, as Spark's check does
        self.careful: list[bool] = []   # how each job was prepared

    def prepare(self, batches, tmp_dir, careful=True):
        from kdaemon.sinks.spark.uploader.writer import Job
        self.careful.append(careful)
        return Job(df=batches, tmp_dir=tmp_dir)

    @staticmethod
    def finish(job) -> None:
        pass

    def write_parquet(self, job):
        batches, tmp_dir = job.df, job.tmp_dir
        self.jobs += 1
        if self.bad_value and not self.careful[-1]:
            from kdaemon.sinks.spark.uploader.writer import BadValues
            raise BadValues("[USER_RAISED_EXCEPTION] kdaemon: a value does not parse as value_schema")
        tables = []
        self.held_offsets = []
        for path, name, drop in batches:
            t = pq.read_table(path)
            self.held_offsets.append(t.column("offset").to_pylist())
            for first, last in drop:
                offsets = t.column("offset")
                t = t.filter(pa.compute.invert(pa.compute.and_(pa.compute.greater_equal(offsets, first),
                                                               pa.compute.less_equal(offsets, last))))
            tables.append(t.append_column("_batch", pa.array([name] * t.num_rows, pa.string())))
        table = pa.concat_tables(tables)
        data = os.path.join(tmp_dir, "data")
        for name in sorted(set(table.column("_batch").to_pylist())):
            part = table.filter(pa.compute.equal(table.column("_batch"), name)).drop_columns(["_batch", "topic"])
            d = os.path.join(data, f"topic={TOPIC}", "date=1970-01-01", f"_batch={name}")
            os.makedirs(d)
            for n, chunk in enumerate((part.slice(0, part.num_rows // 2), part.slice(part.num_rows // 2))):
                pq.write_table(chunk, os.path.join(d, f"part-{n:05d}-x.parquet"))
        return data


@pytest.fixture
def up(tmp_path):
    u = Uploader({"type": "spark", "path": str(tmp_path / "out")}, str(tmp_path / "state"))
    u.writer = FakeWriter()
    return u


def _stage(tmp_path: Path, partition: int, offsets) -> Request:
    from kdaemon.sinks.spark.staging import _Buffer, stage_buffer
    b = _Buffer(TOPIC, partition, 0.0)
    for r in _records(partition, offsets):
        b.offsets.append(r.offset)
        b.timestamps.append(r.timestamp)
        b.timestamp_types.append(0)
        b.keys.append(r.raw_key)
        b.values.append(r.raw_value)
        b.headers.append([{"key": k, "value": v} for k, v in r.headers])
    batch = BatchId(partition, min(offsets), max(offsets))
    path = tmp_path / f"{len(os.listdir(tmp_path)):04d}-{batch.name}.staged"
    stage_buffer(str(path), b)
    return Request(None, 1, str(path), TOPIC, batch, len(offsets))


def _output_offsets(root: Path) -> list[tuple[int, int]]:
    out = []
    for d, _, names in os.walk(root / f"topic={TOPIC}"):
        for n in names:
            batch, _ = layout.parse_part_file(n)
            for o in pq.read_table(os.path.join(d, n)).column("offset").to_pylist():
                out.append((batch.partition, o))
    return sorted(out)


def test_overlapping_batches_add_only_new_rows(up, tmp_path):
    up.upload([_stage(tmp_path, 0, range(0, 100))])
    # A worker that lost its commit reads again from 50 with other batch boundaries.
    up.upload([_stage(tmp_path, 0, range(50, 150))])
    assert up.writer.held_offsets == [list(range(100, 150))]   # the job reads only the new rows
    # The same batch again (a lost confirmation): nothing to do, no Spark job.
    jobs = up.writer.jobs
    up.upload([_stage(tmp_path, 0, range(50, 150))])
    assert up.writer.jobs == jobs
    assert _output_offsets(Path(up.root)) == [(0, o) for o in range(150)]
    assert layout.uploaded_ranges(up.root, TOPIC, 0) == [(0, 99), (50, 149)]


def test_a_job_meeting_a_bad_value_is_written_again_carefully_and_so_are_the_next_ones(up, tmp_path):
    """The dead-letter pass is skipped until a value fails to parse; that job commits nothing
    the first time, is written again with the pass, and so are the next
    CAREFUL_JOBS_AFTER_BAD_VALUE jobs; then the pass is skipped again."""
    up.upload([_stage(tmp_path, 0, range(0, 10))])
    assert up.writer.careful == [False]
    up.writer.bad_value = True
    up.upload([_stage(tmp_path, 0, range(10, 20))])
    assert up.writer.careful == [False, False, True]
    up.writer.bad_value = False
    n = uploader_mod.CAREFUL_JOBS_AFTER_BAD_VALUE
    for i in range(n + 1):
        up.upload([_stage(tmp_path, 0, range(20 + 10 * i, 30 + 10 * i))])
    assert up.writer.careful[3:] == [True] * n + [False]
    assert _output_offsets(Path(up.root)) == [(0, o) for o in range(30 + 10 * n)]   # each row once


def test_overlapping_requests_in_one_job(up, tmp_path):
    up.upload([_stage(tmp_path, 1, range(100, 200)), _stage(tmp_path, 1, range(0, 150)),
               _stage(tmp_path, 2, range(0, 10))])
    assert _output_offsets(Path(up.root)) == [(1, o) for o in range(200)] + [(2, o) for o in range(10)]


def test_an_upload_interrupted_while_moving_files_is_undone(up, tmp_path, monkeypatch):
    real_replace = os.replace
    moved = []

    def crash_after_one_move(src, dst):
        if "/topic=" in str(dst) and moved:
            raise KeyboardInterrupt("killed")   # not an Exception: nothing of the job may be confirmed
        real_replace(src, dst)
        if "/topic=" in str(dst):
            moved.append(dst)

    monkeypatch.setattr(uploader_mod.os, "replace", crash_after_one_move)
    with pytest.raises(KeyboardInterrupt):
        up.upload([_stage(tmp_path, 0, range(0, 100))])
    monkeypatch.setattr(uploader_mod.os, "replace", real_replace)
    assert len(moved) == 1 and os.path.exists(moved[0])          # half a batch in the output,
    assert not layout.uploaded_ranges(up.root, TOPIC, 0)         # without a manifest,
    assert layout.pending_uploads(up.root, TOPIC, 0)             # announced by its pending record
    # The worker was never confirmed: it rewinds and sends the records again, in other batches.
    up.upload([_stage(tmp_path, 0, range(0, 60))])
    up.upload([_stage(tmp_path, 0, range(60, 100))])
    assert not os.path.exists(moved[0])
    assert _output_offsets(Path(up.root)) == [(0, o) for o in range(100)]
    assert not layout.pending_uploads(up.root, TOPIC, 0)


def test_a_missing_staged_file_fails_only_its_own_request(up, tmp_path):
    good = _stage(tmp_path, 0, range(0, 10))
    gone = _stage(tmp_path, 1, range(0, 10))
    os.unlink(gone.file)
    up.upload([good, gone])
    assert good.error is None
    assert "cannot read the staged batch" in gone.error
    assert _output_offsets(Path(up.root)) == [(0, o) for o in range(10)]
    assert layout.uploaded_ranges(up.root, TOPIC, 1) == []


def test_a_batch_after_an_unreadable_one_of_its_partition_is_not_uploaded(up, tmp_path):
    # A table records the newest offset it took per partition, and rows at or below it count as
    # uploaded when they are read again: uploading 10-19 while 0-9 cannot be read would lose 0-9.
    gone, after = _stage(tmp_path, 0, range(0, 10)), _stage(tmp_path, 0, range(10, 20))
    other = _stage(tmp_path, 1, range(0, 10))
    os.unlink(gone.file)
    up.upload([after, gone, other])
    assert "cannot read the staged batch" in gone.error
    assert "an earlier batch of the same partition (" + gone.batch.name + ") could not be read" in after.error
    assert other.error is None
    assert _output_offsets(Path(up.root)) == [(1, o) for o in range(10)]
    assert layout.uploaded_ranges(up.root, TOPIC, 0) == []


def test_another_workers_batch_of_that_partition_is_not_refused(up, tmp_path):
    # The next owner of the partition sends it from the last commit in the same job.
    gone, after = _stage(tmp_path, 0, range(0, 10)), _stage(tmp_path, 0, range(10, 20))
    next_owner = _stage(tmp_path, 0, range(0, 30))
    gone.conn = after.conn = object()
    next_owner.conn = object()
    os.unlink(gone.file)
    up.upload([gone, after, next_owner])
    assert gone.error and after.error and next_owner.error is None
    assert _output_offsets(Path(up.root)) == [(0, o) for o in range(30)]


def test_later_batches_of_that_partition_on_that_connection_are_refused(up, tmp_path):
    """A flush bigger than one job: its partition's later batches, queued or still to come on
    that worker's connection, are refused once an earlier one could not be read; another
    connection (the rewound worker's new sink) is not."""
    conn, worker_end = socket.socketpair()
    new_conn, _new_worker_end = socket.socketpair()
    gone = _stage(tmp_path, 0, range(0, 10))
    queued, other = _stage(tmp_path, 0, range(10, 20)), _stage(tmp_path, 1, range(0, 10))
    later, fresh = _stage(tmp_path, 0, range(20, 30)), _stage(tmp_path, 0, range(0, 30))
    for r, c, i in ((gone, conn, 1), (queued, conn, 2), (other, conn, 3), (later, conn, 4), (fresh, new_conn, 5)):
        r.conn, r.id = c, i
    os.unlink(gone.file)
    up._queue = [queued, other]
    up._run_job([gone])
    assert up._queue == [other]
    assert up._refuses(later) and not up._refuses(fresh)
    worker_end.settimeout(5)
    replies = [UploadReply.decode(line) for line in worker_end.recv(65536).splitlines()]
    assert [(r.id, r.ok) for r in replies] == [(1, False), (2, False)]
    assert "could not be read" in replies[1].error
    up._drop(conn)
    assert not up._refused


def test_a_flush_read_in_pieces_is_one_job(up, tmp_path):
    """A worker's flush arrives in two reads, the second line cut between them: the job waits
    for the rest (a flush split over two jobs is committed only after the second)."""
    import selectors
    import threading
    worker_end, conn = socket.socketpair()
    conn.setblocking(False)
    up._sel.register(conn, selectors.EVENT_READ, "conn")
    up._buffers[conn] = b""
    lines = b"".join(UploadRequest(i, f"/nowhere/{i}", TOPIC, 0, 10 * i, 10 * i + 9, 10).encode()
                     for i in range(1, 6))
    cut = lines.index(b"\n", lines.index(b"\n") + 1) + 5   # two whole requests and a piece
    worker_end.sendall(lines[:cut])
    assert up._pump(None, 1.0) and len(up._queue) == 2
    rest = threading.Timer(0.05, worker_end.sendall, args=(lines[cut:],))
    rest.start()
    batch = up._gather(None)
    rest.join()
    assert [r.id for r in batch] == [1, 2, 3, 4, 5] and not up._queue
    up._drop(conn)
    worker_end.close()


def test_a_worker_directory_removed_during_the_job_fails_nothing(up, tmp_path):
    # A dead worker's successor removes its staging directory (staging._discard_dead_staging)
    # while a job holding its batch runs: the job reads the uploader's links, so both batches
    # (the dead worker's and a live one's) go in, and no link outlives the job.
    dead, live = tmp_path / "dead-worker", tmp_path / "live-worker"
    dead.mkdir()
    live.mkdir()
    a, b = _stage(dead, 0, range(0, 10)), _stage(live, 1, range(0, 10))
    real_prepare = up.writer.prepare

    def worker_dir_removed_first(batches, tmp_dir, careful=True):
        import shutil
        shutil.rmtree(dead)
        return real_prepare(batches, tmp_dir, careful)

    up.writer.prepare = worker_dir_removed_first
    up.upload([a, b])
    assert a.error is None and b.error is None
    assert _output_offsets(Path(up.root)) == [(p, o) for p in (0, 1) for o in range(10)]
    assert os.path.isdir(up.held_dir) and os.listdir(up.held_dir) == []


def test_manifest_names_the_uploader_and_the_record_times(up, tmp_path):
    up.upload([_stage(tmp_path, 3, range(5, 8))])
    manifest = json.loads(Path(layout.manifest_path(up.root, TOPIC, BatchId(3, 5, 7))).read_text())
    assert manifest["new_rows"] == 3 and manifest["uploader"] == up.identity
    assert manifest["min_timestamp_ms"] == 1_700_000_000_005 and manifest["max_timestamp_ms"] == 1_700_000_000_007
    up.upload([_stage(tmp_path, 3, range(6, 10))])   # 6 and 7 are in the output already
    manifest = json.loads(Path(layout.manifest_path(up.root, TOPIC, BatchId(3, 6, 9))).read_text())
    assert manifest["rows"] == 4 and manifest["new_rows"] == 2


# -- the worker side ---------------------------------------------------------------------------------

def _sink(tmp_path, **settings) -> SparkSink:
    return SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "nobody.sock"),
                      **settings}, str(tmp_path / "state"))


def test_the_sink_refuses_work_after_close(tmp_path):
    sink = _sink(tmp_path)
    sink.write(_records(0, range(3)))
    sink.close()
    with pytest.raises(SparkUploadError, match="closed"):
        sink.flush()
    with pytest.raises(SparkUploadError, match="closed"):
        sink.write(_records(0, range(3, 4)))


def _restaged(tmp_path: Path, sink):
    """What the uploader reads of the sink's buffer of partition 0 once it is staged."""
    from kdaemon.sinks.spark import staged
    from kdaemon.sinks.spark.staging import stage_buffer
    path = str(tmp_path / "restaged.staged")
    stage_buffer(path, sink._buffers[(TOPIC, 0)])
    return staged.read(path)


def test_records_read_again_into_one_buffer_are_staged_once(tmp_path):
    sink = _sink(tmp_path)
    sink.write(_records(0, range(0, 10)))
    sink.write(_records(0, range(5, 12)))   # the partition was lost and came back from offset 5
    table = _restaged(tmp_path, sink)
    assert table.column("offset").to_pylist() == list(range(12))


def test_headers_from_interceptors_are_normalized(tmp_path):
    sink = _sink(tmp_path)
    r = Record(TOPIC, 0, 0, 0, 0, "key", {"v": 1}, [["a", "text"], ("b", None)], None, None)
    sink.write([r])
    row = _restaged(tmp_path, sink).to_pylist()[0]
    assert row["headers"] == [{"key": "a", "value": b"text"}, {"key": "b", "value": None}]
    assert row["key"] == b"key" and row["value"] == b'{"v":1}'


def test_commit_metadata_always_says_spark(tmp_path):
    sink = _sink(tmp_path)
    assert sink.commit_metadata(TOPIC, 0) == "spark:"
    sink._last_batch[(TOPIC, 0)] = BatchId(0, 1, 2).name
    assert sink.commit_metadata(TOPIC, 0) == f"spark:{BatchId(0, 1, 2).name}"


@pytest.mark.parametrize("settings, problem", [
    ({}, "sink.path: required: the Parquet output directory"),
    ({"path": "x", "table": "t"}, "sink.table: no longer supported"),
    ({"path": "x", "format": "csv"}, 'sink.format: expected one of parquet, delta, iceberg, found string "csv"'),
    ({"path": "x", "value_format": "json"}, 'sink.value_format: "json" needs value_schema'),
    ({"path": "x", "value_format": "xml"}, 'sink.value_format: expected one of binary, string, json, found string "xml"'),
    ({"path": "x", "value_schema": "a INT", "value_format": "string"}, 'sink.value_schema: only used with'),
    ({"path": "x", "max_records": 0}, "sink.max_records: expected a positive integer, found integer 0"),
    ({"path": "x", "partition_by": ["key"]}, 'sink.partition_by[0]: expected one of topic, partition, date, '
                                             'timestamp_type, found string "key"'),
    ({"path": "x", "bogus": 1}, "sink.bogus: unknown setting (known: conf,"),
    ({"path": "/events", "format": "iceberg"}, "sink.path: with format = \"iceberg\", path is the table's location "
                                               "<warehouse>/<namespace>/<table>"),
    ({"path": "/lake/db/ev.ents", "format": "iceberg"}, "sink.path: the Iceberg namespace and table name in path "
                                                        "may not contain '.'"),
])
def test_bad_settings_are_named(settings, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        validate_settings({"type": "spark", **settings})


class _Consumer:
    """Just enough consumer for the worker's flush/commit/revocation paths."""

    def __init__(self, tp) -> None:
        self.tp = tp
        self.commits = []

    def assignment(self):
        return {self.tp}

    def yield_poll(self):
        self.yields = getattr(self, "yields", 0) + 1

    def pause(self, *tps):
        pass

    def resume(self, *tps):
        pass

    def commit(self, offsets):
        self.commits.append(offsets)

    def committed(self, tps, timeout_ms=None):
        return {tp: None for tp in tps}

    def close(self):
        pass


def test_no_commit_between_a_failed_flush_and_the_rewind(tmp_path):
    """A flush fails (the uploader is gone): until the worker has rewound, neither a revocation
    nor the shutdown may commit the positions of the records that were in the sink."""
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "on_deserialize_error": "skip", "sink_retry_backoff_ms": 60_000},
                    "sink": {"type": "spark", "path": str(tmp_path / "out")}})
    tp = TopicPartition(TOPIC, 0)
    consumer = _Consumer(tp)
    parts = PipelineParts(None, lambda t, h, b: b, lambda t, h, b: b, [], _sink(tmp_path), None,
                          make_sink=lambda: _sink(tmp_path))
    worker = Worker(config, parts, consumer, lambda c, w: None)
    worker.deliver(_records(0, range(100)), [], {tp: 100})
    worker.flush_and_commit()              # fails: nobody listens on the socket
    assert worker.mode is Mode.REWINDING
    worker.on_partitions_revoked({tp})
    worker.shutdown()
    assert consumer.commits == []


def test_a_successful_flush_commits_with_the_batch_as_metadata(tmp_path):
    """The same worker against a stand-in uploader that confirms everything."""
    path = tmp_path / "up.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    import threading

    def confirm():
        conn, _ = server.accept()
        buf = b""
        while b"\n" not in buf:
            buf += conn.recv(65536)
        req = UploadRequest.decode(parse_line(buf.split(b"\n")[0]))
        conn.sendall(UploadReply(req.id, True).encode())
        conn.close()

    t = threading.Thread(target=confirm, daemon=True)
    t.start()
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "on_deserialize_error": "skip"},
                    "sink": {"type": "spark", "path": str(tmp_path / "out")}})
    tp = TopicPartition(TOPIC, 0)
    consumer = _Consumer(tp)
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(path)}, str(tmp_path / "state"))
    worker = Worker(config, PipelineParts(None, None, None, [], sink, None), consumer, lambda c, w: None)
    worker.deliver(_records(0, range(7, 10)), [], {tp: 10})
    worker.flush_and_commit()
    t.join(5)
    server.close()
    assert consumer.commits == [{tp: OffsetAndMetadata(10, f"spark:{BatchId(0, 7, 9).name}")}]
    assert not os.listdir(sink.staging)   # the staged file is gone once confirmed


class _HeldUploader:
    """A stand-in uploader that answers each request only when the test says so."""

    def __init__(self, path) -> None:
        import threading
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.requests: list[UploadRequest] = []
        self.hints: list[str] = []   # the files of every PrepareHint, in order
        self.answers = __import__("queue").Queue()
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        # Reads on its own (hints need no answer); an upload request waits for the test's answer.
        import queue
        conn, buf = None, b""
        self.server.settimeout(0.05)
        while not self.stopped:
            if conn is None:   # the first connection, or the next after a probe or a worker's retry
                try:
                    conn, _ = self.server.accept()
                except TimeoutError:
                    continue
                conn.settimeout(0.05)
                buf = b""
            if b"\n" not in buf:
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    conn.close()
                    conn = None
                buf += data
                continue
            line, buf = buf.split(b"\n", 1)
            wanted = decode_request(parse_line(line))
            if isinstance(wanted, PrepareHint):
                self.hints += wanted.files
                continue
            self.requests.append(wanted)
            while not self.stopped:
                try:
                    ok = self.answers.get(timeout=0.05)
                    break
                except queue.Empty:
                    pass
            else:
                break
            conn.settimeout(None)
            if ok == "transient":
                conn.sendall(UploadReply(wanted.id, False, "Py4JJavaError: master lost", transient=True).encode())
            else:
                conn.sendall(UploadReply(wanted.id, ok, None if ok else "disk full").encode())
            conn.settimeout(0.05)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.stopped = True
        self.thread.join(5)
        self.server.close()


def _until(predicate, seconds: float = 5.0) -> bool:
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_flush_async_returns_before_the_upload_is_confirmed(tmp_path):
    up = _HeldUploader(tmp_path / "up.sock")
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "up.sock")},
                     str(tmp_path / "state"))
    try:
        sink.write(_records(0, range(0, 5)))
        handle = sink.flush_async()
        assert not handle.done() and len(os.listdir(sink.staging)) == 1   # staged, sent, unconfirmed
        sink.write(_records(0, range(5, 8)))                             # buffering goes on meanwhile
        assert sink.commit_metadata(TOPIC, 0) == "spark:"
        up.answers.put(True)
        assert _until(handle.done)
        assert sink.commit_metadata(TOPIC, 0) == f"spark:{BatchId(0, 0, 4).name}"
        assert not os.listdir(sink.staging)
        # The next one covers only what came after, and a failure reaches the caller.
        second = sink.flush_async()
        assert (up.requests[0].first, up.requests[0].last) == (0, 4)
        up.answers.put(False)
        with pytest.raises(SparkUploadError, match="disk full"):
            second.wait()
        assert up.requests[1].first == 5 and up.requests[1].last == 7
        assert not os.listdir(sink.staging)
        assert sink.commit_metadata(TOPIC, 0) == f"spark:{BatchId(0, 0, 4).name}"
    finally:
        up.stop()
        sink.close()


def test_buffers_past_max_bytes_are_staged_at_once_and_sent_with_the_next_flush(tmp_path):
    """max_bytes bounds the memory a worker's buffers take, not the size of an upload job:
    buffers that reach it go to disk at once, and the flush that max_records or max_age_s
    asks for sends them all, in offset order, in one upload."""
    up = _HeldUploader(tmp_path / "up.sock")
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "up.sock"),
                      "max_bytes": 1000, "max_records": 62, "max_age_s": 3600}, str(tmp_path / "state"))
    try:
        for first in (0, 10, 20):
            # ~1.4 kB a write: the buffers of the write before are staged first; no flush yet
            sink.write(_records(0, range(first, first + 10)) + _records(1, range(first, first + 10)))
            assert len(sink._buffers) == 2 and not sink.wants_flush()
            assert len(os.listdir(sink.staging)) == 2 * first // 10
        sink.write(_records(0, range(30, 32)))   # 62 records: a flush is due, with what is still in memory
        assert len(os.listdir(sink.staging)) == 6
        # The uploader heard of each early-staged file at once (it may build their rows meanwhile).
        assert _until(lambda: len(up.hints) == 6)
        assert sorted(up.hints) == sorted(os.path.join(sink.staging, n) for n in os.listdir(sink.staging))
        assert sink.wants_flush()
        handle = sink.flush_async()
        for _ in range(7):
            up.answers.put(True)
        assert _until(handle.done)
        sent = [(r.batch.partition, r.batch.first, r.batch.last) for r in up.requests]
        assert sent == [(0, 0, 9), (1, 0, 9), (0, 10, 19), (1, 10, 19), (0, 20, 29), (1, 20, 29), (0, 30, 31)]
        assert not os.listdir(sink.staging) and not sink.wants_flush()
        assert sink.commit_metadata(TOPIC, 0) == f"spark:{BatchId(0, 30, 31).name}"
    finally:
        up.stop()
        sink.close()


def test_a_write_whose_early_staging_fails_takes_none_of_its_records(tmp_path, monkeypatch):
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "up.sock"),
                      "max_bytes": 1000}, str(tmp_path / "state"))
    try:
        sink.write(_records(0, range(0, 20)))
        monkeypatch.setattr("kdaemon.sinks.spark.staging.stage_buffer",
                            lambda path, b: (_ for _ in ()).throw(OSError(28, "No space left on device")))
        with pytest.raises(OSError, match="No space left"):
            sink.write(_records(0, range(20, 25)))
        assert sink._buffers[(TOPIC, 0)].offsets == list(range(20))   # the failed write took nothing
        assert not os.listdir(sink.staging)
    finally:
        sink.close()


def test_an_unreachable_uploader_keeps_the_staged_batch_until_it_is_back(tmp_path):
    """Nobody listens: the handle says the uploader is unavailable (not a final failure), the
    staged file stays, probe() says why; once an uploader listens, retry() sends the same
    batch and its confirmation commits it."""
    sock = tmp_path / "up.sock"
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(sock)}, str(tmp_path / "state"))
    up = None
    try:
        sink.write(_records(0, range(0, 5)))
        handle = sink.flush_async()
        with pytest.raises(UploaderUnavailable, match="not reachable"):
            handle.done()
        with pytest.raises(UploaderUnavailable):
            handle.wait()
        staged = os.listdir(sink.staging)
        assert len(staged) == 1
        assert "not reachable" in sink.probe()
        with pytest.raises(UploaderUnavailable, match="not reachable"):
            handle.retry()                 # nobody listens yet: says so at once
        assert os.listdir(sink.staging) == staged
        up = _HeldUploader(sock)
        assert sink.probe() is None
        handle.retry()
        up.answers.put("transient")        # the job failed (Spark), not the batch: kept again
        assert _until(lambda: _raises(handle.done, UploaderUnavailable))
        assert os.listdir(sink.staging) == staged
        handle.retry()
        up.answers.put(True)
        assert _until(handle.done)
        assert [(r.first, r.last) for r in up.requests] == [(0, 4), (0, 4)]   # the same batch twice
        assert not os.listdir(sink.staging)
        assert sink.commit_metadata(TOPIC, 0) == f"spark:{BatchId(0, 0, 4).name}"
    finally:
        if up is not None:
            up.stop()
        sink.close()


def _raises(call, exc_type) -> bool:
    try:
        call()
    except exc_type:
        return True
    return False


class DirectWriter(FakeWriter):
    """A table writer (Delta here) whose jobs the uploader offers to ``append_direct`` first:
    it takes them when ``accept``, else they go through ``prepare``/``append_table``."""

    format = "delta"
    direct_writes = True

    def __init__(self, up: Uploader, accept: bool) -> None:
        super().__init__()
        self.up, self.accept = up, accept
        self.direct: list[tuple[list[int], dict, list]] = []   # offsets, versions, pending records seen
        self.appended: list[tuple[list[int], dict]] = []

    def append_direct(self, batches, versions) -> bool:
        offsets = sorted(o for b in batches for o in b.column("offset").to_pylist())
        pending = [r for p in {k[1] for k in versions} for _, r in layout.pending_uploads(self.up.root, TOPIC, p)]
        self.direct.append((offsets, dict(versions), pending))
        return self.accept

    def append_table(self, job, versions) -> None:
        self.jobs += 1
        offsets = sorted(o for path, _, _ in job.df for o in pq.read_table(path).column("offset").to_pylist())
        self.appended.append((offsets, dict(versions)))


@pytest.mark.parametrize("accept", [True, False])
def test_a_table_job_is_offered_to_the_direct_path_after_its_commit_is_announced(tmp_path, accept):
    up = Uploader({"type": "spark", "format": "delta", "path": str(tmp_path / "out")}, str(tmp_path / "state"))
    up.writer = w = DirectWriter(up, accept)
    up.upload([_stage(tmp_path, 0, range(0, 100))])
    up.upload([_stage(tmp_path, 0, range(50, 150)), _stage(tmp_path, 1, range(0, 10))])
    # The second job offers only the rows the first did not upload, and each batch's pending
    # record announces the commit (partition, newest offset) before the table may get it.
    assert [(offsets, versions) for offsets, versions, _ in w.direct] == [
        (list(range(100)), {(TOPIC, 0): 99}),
        (sorted(list(range(100, 150)) + list(range(10))), {(TOPIC, 0): 149, (TOPIC, 1): 9})]
    assert [sorted((r["table"]["partition"], r["table"]["version"]) for r in pending) for _, _, pending in w.direct] \
        == [[(0, 99)], [(0, 149), (1, 9)]]
    assert layout.uploaded_ranges(up.root, TOPIC, 0) == [(0, 99), (50, 149)]
    assert not layout.pending_uploads(up.root, TOPIC, 0)
    # Refused, the same job goes through Spark's path, not carefully, with the same offsets.
    assert w.careful == ([] if accept else [False, False])
    assert w.appended == ([] if accept else [(offsets, versions) for offsets, versions, _ in w.direct])


def test_max_idle_s_flushes_a_batch_no_record_has_joined_for_that_long(tmp_path, monkeypatch):
    """max_idle_s: a backlog's tail goes out once the topic is quiet, not after max_age_s; a
    batch still being written to is not flushed early, and without the setting nothing changes."""
    from types import SimpleNamespace

    from kdaemon.sinks.spark import staging as staging_mod

    now = [1000.0]
    monkeypatch.setattr(staging_mod, "time", SimpleNamespace(monotonic=lambda: now[0]))
    common = {"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "nobody.sock"),
              "max_records": 1000, "max_age_s": 60}
    idle = SparkSink({**common, "max_idle_s": 1.5}, str(tmp_path / "state"))
    plain = SparkSink(common, str(tmp_path / "state2"))
    try:
        assert not idle.wants_flush()            # nothing buffered: nothing to flush, however quiet
        now[0] += 10
        assert not idle.wants_flush()
        for offset in range(5):                  # records keep coming, 1 s apart: not idle
            idle.write(_records(0, [offset]))
            plain.write(_records(0, [offset]))
            now[0] += 1.0
            assert not idle.wants_flush() and not plain.wants_flush()
        now[0] += 0.5                            # 1.5 s since the last record
        assert idle.wants_flush()
        assert not plain.wants_flush()           # off by default: max_age_s alone decides
        idle.write([])                           # an empty poll is not a record
        assert idle.wants_flush()
    finally:
        idle.close()
        plain.close()


def test_max_idle_s_is_checked_like_every_setting(tmp_path):
    with pytest.raises(Exception, match=r"sink\.max_idle_s: expected"):
        SparkSink({"type": "spark", "path": str(tmp_path / "out"), "max_idle_s": 0}, str(tmp_path / "state"))
