"""Where a partition's next owner starts (kdaemon/sinks/spark/resume.py): the uploader's answer
to a ``ResumeQuery``, without Spark (a stand-in writes path mode's files), and the worker's
spark sink asking a running uploader."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("pyarrow", reason="the spark sink needs pyarrow (pip install -e '.[spark]')")

from kdaemon.client.types import TopicPartition  # noqa: E402
from kdaemon.sinks.spark.tables import layout  # noqa: E402
from kdaemon.sinks.spark.tables.layout import BatchId  # noqa: E402
from kdaemon.sinks.spark.resume import resume_point, resume_points  # noqa: E402
from kdaemon.sinks.spark.staging import SparkSink  # noqa: E402
from kdaemon.sinks.spark.uploader.process import Uploader  # noqa: E402
from kdaemon.sinks.spark.wire import ResumeQuery, UploadReply, UploadRequest  # noqa: E402
from testkit.spark import uploader_serving  # noqa: E402
from tests.sinks.spark.test_spark_sink_rules import TOPIC, FakeWriter, _records, _stage  # noqa: E402


@pytest.mark.parametrize("ranges, start, expected", [
    ([], 5, 5),
    ([(0, 9)], 0, 10),
    ([(0, 9)], 4, 10),
    ([(0, 9)], 10, 10),              # touching the end is not inside
    ([(0, 9), (10, 19)], 0, 20),     # adjacent ranges chain
    ([(0, 9), (12, 19)], 0, 10),     # a gap (filtered records, never in a batch) stops the walk
    ([(12, 19), (0, 9), (5, 14)], 0, 20),   # overlapping ones chain, in any order
    ([(0, 9)], 30, 30),              # never before the position
    ([(20, 29)], 0, 0),
])
def test_resume_point_walks_what_is_covered(ranges, start, expected):
    assert resume_point(ranges, start) == expected


def _manifest(root: str, partition: int, first: int, last: int) -> None:
    layout.write_durably(layout.manifest_path(root, TOPIC, BatchId(partition, first, last)), b"{}")


def test_resume_points_in_path_mode_follow_the_manifests(tmp_path):
    root = str(tmp_path / "out")
    _manifest(root, 0, 0, 99)
    _manifest(root, 0, 100, 149)
    _manifest(root, 0, 170, 199)   # 150-169 filtered: the walk stops at 150
    _manifest(root, 1, 0, 9)
    assert resume_points(root, "parquet", TOPIC, {0: 40, 1: 0, 2: 7}) == {0: 150, 1: 10, 2: 7}
    assert resume_points(root, "parquet", "other-topic", {0: 0}) == {0: 0}


@pytest.fixture
def up(tmp_path):
    u = Uploader({"type": "spark", "path": str(tmp_path / "out")}, str(tmp_path / "state"))
    u.writer = FakeWriter()
    return u


def _connect(up: Uploader) -> tuple[socket.socket, socket.socket]:
    import selectors
    worker_end, conn = socket.socketpair()
    conn.setblocking(False)
    up._sel.register(conn, selectors.EVENT_READ, "conn")
    up._buffers[conn] = b""
    worker_end.settimeout(5)
    return worker_end, conn


def _replies(worker_end: socket.socket, n: int) -> list[UploadReply]:
    buf = b""
    while buf.count(b"\n") < n:
        buf += worker_end.recv(65536)
    return [UploadReply.decode(line) for line in buf.splitlines()]


def test_a_question_is_answered_after_the_batches_sent_before_it(up, tmp_path):
    """The previous owner's flush and the next owner's question arrive together: the job runs
    first, and the answer starts after its batch."""
    staged = _stage(tmp_path, 0, range(0, 50))
    old_owner, _ = _connect(up)
    new_owner, _ = _connect(up)
    old_owner.sendall(UploadRequest(1, staged.file, TOPIC, 0, 0, 49, 50).encode())
    new_owner.sendall(ResumeQuery(1, TOPIC, {0: 0, 1: 0}).encode())
    time.sleep(0.1)   # both have arrived
    up._turn(None, 1.0)
    assert up.writer.jobs == 1
    assert _replies(old_owner, 1) == [UploadReply(1, True)]
    assert _replies(new_owner, 1) == [UploadReply(1, True, resume={0: 50, 1: 0})]


def test_a_question_to_an_idle_uploader_is_answered_at_once(up, tmp_path):
    _manifest(str(tmp_path / "out"), 3, 0, 19)
    worker, _ = _connect(up)
    worker.sendall(ResumeQuery(9, TOPIC, {3: 5}).encode())
    up._turn(None, 1.0)
    assert up.writer.jobs == 0
    assert _replies(worker, 1) == [UploadReply(9, True, resume={3: 20})]


def test_a_question_that_cannot_be_answered_says_why(up, tmp_path, monkeypatch):
    from kdaemon.sinks.spark.uploader import process as uploader_mod

    def broken(*_args):
        raise OSError("manifests unreadable")
    monkeypatch.setattr(uploader_mod, "resume_points", broken)
    worker, _ = _connect(up)
    worker.sendall(ResumeQuery(2, TOPIC, {0: 0}).encode())
    up._turn(None, 1.0)
    [reply] = _replies(worker, 1)
    assert not reply.ok and reply.resume is None and "manifests unreadable" in reply.error


class _ServingWriter(FakeWriter):
    master = "local[1]"

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def test_the_spark_sink_asks_a_running_uploader(tmp_path, monkeypatch):
    """A worker's sink uploads a batch; another worker's sink, given that partition and one
    more, asks where they start and hears "after the batch" and "where you are"."""
    settings = {"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "up.sock")}
    up = Uploader(settings, str(tmp_path / "state"))
    up.writer = _ServingWriter()
    old, new = SparkSink(settings, str(tmp_path / "state")), SparkSink(settings, str(tmp_path / "state"))
    try:
        with uploader_serving(up, old, monkeypatch):
            deadline = time.monotonic() + 10
            old.write(_records(0, range(0, 25)))
            old.flush()
            new.ask_resume({TopicPartition(TOPIC, 0): 10, TopicPartition(TOPIC, 1): 0})
            answers: dict = {}
            while len(answers) < 2:
                assert time.monotonic() < deadline, f"no answer: {answers}"
                answers.update(new.resume_answers())
                time.sleep(0.02)
            assert answers == {TopicPartition(TOPIC, 0): 25, TopicPartition(TOPIC, 1): 0}
            assert new.resume_answers() == {}
    finally:
        old.close()
        new.close()


def test_answers_for_a_closed_connection_are_none(tmp_path):
    """The uploader went away before answering: the partitions start where they are."""
    path = tmp_path / "up.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(path)}, str(tmp_path / "state"))
    try:
        sink.ask_resume({TopicPartition(TOPIC, 0): 3})
        conn, _ = server.accept()
        conn.close()
        deadline = time.monotonic() + 5
        answers: dict = {}
        while not answers:
            assert time.monotonic() < deadline
            answers = sink.resume_answers()
            time.sleep(0.02)
        assert answers == {TopicPartition(TOPIC, 0): None}
    finally:
        sink.close()
        server.close()


class _SlowStartWriter(_ServingWriter):
    """A session start that lasts until the test lets it end."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def start(self) -> None:
        assert self.release.wait(10), "the test never let the session start"


def test_questions_are_answered_while_the_session_starts(tmp_path, monkeypatch):
    """The session takes 10-20 s to start: a worker given partitions meanwhile hears at once
    (from the output's files), and its uploads wait for the session."""
    settings = {"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "up.sock")}
    _manifest(settings["path"], 0, 0, 41)
    up = Uploader(settings, str(tmp_path / "state"))
    up.writer = _SlowStartWriter()
    sink = SparkSink(settings, str(tmp_path / "state"))
    try:
        with uploader_serving(up, sink, monkeypatch, seconds=5):
            try:
                deadline = time.monotonic() + 5
                sink.ask_resume({TopicPartition(TOPIC, 0): 0})
                answers: dict = {}
                while not answers:
                    assert time.monotonic() < deadline, "no answer while the session starts"
                    answers = sink.resume_answers()
                    time.sleep(0.02)
                assert answers == {TopicPartition(TOPIC, 0): 42}
                assert not up.writer.release.is_set() and up.jobs == 0
                sink.write(_records(0, range(42, 50)))
                pending = sink.flush_async()
                time.sleep(0.3)
                assert not pending.done()   # queued until the session is up
                up.writer.release.set()
                pending.wait()
                assert up.jobs == 1
            finally:
                up.writer.release.set()   # the start ends, so that the uploader can stop
    finally:
        sink.close()
