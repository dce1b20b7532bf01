"""A Spark job that fails the same way every time is refused after a few attempts, not retried
for ever (kdaemon/sinks/spark/uploader/failures.py): the uploader's classification of job failures, its
bounded attempts, the refusal on the wire, and the worker stopping the daemon on it.

The exceptions are real pyspark and Py4J ones: a Py4J error as the gateway makes it (its message
fetched from a stand-in gateway that answers as the JVM does, or from one that is gone), and one
``AnalysisException`` from a real local SparkSession (the suite's shared reader session).
"""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("pyspark", reason="the spark sink needs the spark extra (pip install -e '.[spark]')")
pytest.importorskip("pyarrow", reason="the spark sink needs pyarrow (pip install -e '.[spark]')")

from py4j.protocol import (SUCCESS, STRING_TYPE, Py4JError, Py4JJavaError, Py4JNetworkError,  # noqa: E402
                           escape_new_line)
from pyspark.errors import AnalysisException, PySparkValueError  # noqa: E402

from kdaemon.exit_codes import EXIT_SINK_REFUSED  # noqa: E402
from kdaemon.plugins.types import Record, SinkRefused  # noqa: E402
from kdaemon.sinks.spark.uploader.failures import (DETERMINISTIC, DETERMINISTIC_ATTEMPTS, PERMANENT,  # noqa: E402
                                           TRANSIENT, classify)
from kdaemon.sinks.spark.tables.layout import BatchId  # noqa: E402
from kdaemon.sinks.spark.staging import SparkSink  # noqa: E402
from kdaemon.sinks.spark.uplink import SparkRefused  # noqa: E402
from kdaemon.sinks.spark.uploader.process import Request, Uploader  # noqa: E402
from kdaemon.sinks.spark.wire import UploadReply, UploadRequest, parse_line  # noqa: E402
from kdaemon.sinks.spark.uploader.writer import SchemaMismatch  # noqa: E402
from kdaemon.sinks.spark.tables.delta_state import DeltaUnreadable  # noqa: E402


class Gateway:
    """Answers the command that fetches a Java exception's text as the JVM does (``None``: the
    JVM is gone, as after a crash)."""

    def __init__(self, text: str | None) -> None:
        self.text = text

    def send_command(self, command: str) -> str:
        if self.text is None:
            raise Py4JNetworkError("Answer from Java side is empty")
        return SUCCESS + STRING_TYPE + escape_new_line(self.text)


class JavaException:
    def __init__(self, text: str | None) -> None:
        self._target_id = "o1234"
        self._gateway_client = Gateway(text)


def java_error(text: str | None) -> Py4JJavaError:
    """What ``df.write...save()`` raises when the JVM threw ``text`` (its first line the Java
    exception, as ``Throwable.toString`` and the stack trace print it)."""
    return Py4JJavaError("An error occurred while calling o1234.save.\n", JavaException(text))


LINKAGE = ["java.lang.NoSuchMethodError: 'org.apache.spark.sql.types.StructType "
           "org.apache.spark.sql.delta.DeltaLog.snapshot()'",
           "java.lang.NoClassDefFoundError: org/apache/iceberg/spark/SparkCatalog",
           "java.lang.IncompatibleClassChangeError: class io.delta.X has interface Y as super class",
           "java.lang.UnsupportedClassVersionError: io/delta/X has been compiled by a more recent version",
           "org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times, "
           "most recent failure: Lost task 0.0: java.lang.LinkageError: loader constraint violation"]


@pytest.mark.parametrize("text", LINKAGE, ids=lambda t: t.split(":")[0].rsplit(".", 1)[-1])
def test_a_jvm_linkage_error_during_a_job_is_permanent(text):
    failure = classify(java_error(text + "\n\tat org.apache.spark.sql.Dataset.save(Dataset.scala:1)"))
    assert failure.kind == PERMANENT and "jars" in failure.fix


@pytest.mark.parametrize("exc", [
    java_error("org.apache.spark.sql.AnalysisException: [TABLE_OR_VIEW_NOT_FOUND] The table or view `x` cannot "
               "be found.\n\tat org.apache.spark.sql.catalyst.analysis.package$AnalysisErrorAt.failAnalysis"),
    java_error("org.apache.spark.sql.catalyst.parser.ParseException: [PARSE_SYNTAX_ERROR] Syntax error"),
    java_error("java.lang.ClassNotFoundException: io.delta.sql.DeltaSparkSessionExtension"),
    AnalysisException(message="[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column `vale` cannot be resolved"),
    PySparkValueError(message="value_schema is not a struct"),
    SchemaMismatch("the rows do not fit the delta table at /lake/t: DELTA_SCHEMA_MISMATCH"),
    Py4JError("An error occurred while calling o12.appendDelta. Trace:\npy4j.Py4JException: Method "
              "appendDelta([class java.lang.String]) does not exist\n"),
    DeltaUnreadable("delta-rs 1.6.6 cannot read the Delta table at /lake/t: unsupported reader features"),
], ids=["java-analysis", "java-parse", "class-not-found", "analysis", "pyspark-value", "schema", "py4j-call",
        "delta-unreadable"])
def test_deterministic_failures(exc):
    assert classify(exc).kind == DETERMINISTIC


@pytest.mark.parametrize("exc", [
    Py4JNetworkError("Answer from Java side is empty"),
    Py4JError("An error occurred while calling o12.save"),
    Py4JError("Error while receiving"),
    java_error(None),   # the JVM went away: its message cannot even be asked for
    java_error("org.apache.spark.SparkException: Job aborted due to stage failure: ExecutorLostFailure (executor 1 "
               "exited caused by one of the running tasks)"),
    java_error("java.io.IOException: Connection reset by peer"),
    OSError(28, "No space left on device"),
    RuntimeError("anything not recognised"),
], ids=["network", "py4j-bare", "receiving", "dead-gateway", "executor-lost", "io", "disk", "unknown"])
def test_transient_failures(exc):
    failure = classify(exc)
    assert failure.kind == TRANSIENT and not failure.fix


def test_a_cause_counts():
    try:
        try:
            raise java_error("java.lang.NoSuchMethodError: 'void io.delta.Foo.bar()'")
        except Py4JJavaError as inner:
            raise RuntimeError("the append failed") from inner
    except RuntimeError as outer:
        assert classify(outer).kind == PERMANENT


def test_a_real_analysis_exception_from_spark_is_deterministic(spark):
    with pytest.raises(Exception) as info:
        spark.sql("SELECT * FROM kdaemon_no_such_table")
    assert classify(info.value).kind == DETERMINISTIC, type(info.value).__mro__


# -- the uploader: bounded attempts, the refusal on the wire --------------------------------------

class Failing:
    """``Uploader.upload``'s stand-in: raises what the test says."""

    def __init__(self) -> None:
        self.raise_: BaseException | None = None

    def __call__(self, requests):
        if self.raise_ is not None:
            raise self.raise_
        return sum(r.rows for r in requests), None


def uploader(tmp_path):
    u = Uploader({"type": "spark", "path": str(tmp_path / "out")}, str(tmp_path / "state"))
    u.upload = Failing()
    return u


def job(u: Uploader, conns: tuple[socket.socket, socket.socket]) -> UploadReply:
    """One job of one request on a worker's connection (the uploader's end, the worker's); the
    reply the worker gets."""
    req = Request(conns[0], 7, "/nowhere.staged", "events", BatchId(0, 0, 9), 10)
    u._run_job([req])
    return UploadReply.decode(conns[1].recv(65536).split(b"\n")[0])


def test_a_deterministic_failure_is_tried_a_few_times_then_refused_with_the_fix(tmp_path, caplog):
    u = uploader(tmp_path)
    conns = socket.socketpair()
    u.upload.raise_ = AnalysisException(message="[TABLE_OR_VIEW_NOT_FOUND] `lake`.`t` cannot be found")
    replies = [job(u, conns) for _ in range(DETERMINISTIC_ATTEMPTS)]
    assert [(r.ok, r.transient, r.refused) for r in replies] == \
        [(False, True, False)] * (DETERMINISTIC_ATTEMPTS - 1) + [(False, False, True)]
    assert "attempt 1 of 3" in replies[0].error
    assert replies[-1].error.startswith(f"the parquet output at {tmp_path / 'out'} refuses the upload for good "
                                        f"({DETERMINISTIC_ATTEMPTS} attempts): AnalysisException")
    assert "fix what the error names" in replies[-1].fix
    # Logged when it starts and when it is refused; the repeat in between is DEBUG.
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and "to fix:" in errors[1]
    # A transient failure in between does not count towards the refusal; a success resets it.
    u.upload.raise_ = Py4JNetworkError("Answer from Java side is empty")
    assert job(u, conns).transient
    u.upload.raise_ = None
    assert job(u, conns).ok
    u.upload.raise_ = AnalysisException(message="[TABLE_OR_VIEW_NOT_FOUND] again")
    assert job(u, conns).transient
    for c in conns:
        c.close()


def test_a_linkage_error_is_refused_at_once(tmp_path):
    u = uploader(tmp_path)
    conns = socket.socketpair()
    u.upload.raise_ = java_error("java.lang.NoSuchMethodError: 'void org.apache.spark.sql.delta.X.y()'")
    reply = job(u, conns)
    assert reply.refused and not reply.transient and "NoSuchMethodError" in reply.error and "jars" in reply.fix
    for c in conns:
        c.close()


def test_the_refusal_crosses_the_wire():
    reply = UploadReply(3, False, "refused: x", refused=True, fix="alter the table")
    assert UploadReply.decode(reply.encode()) == reply
    assert b"refused" not in UploadReply(4, False, "disk full", transient=True).encode()


# -- the worker: a refused upload stops the daemon ------------------------------------------------

def test_a_refused_upload_stops_the_worker_with_exit_sink_refused(tmp_path, caplog):
    """The sink's flush handle raises the refusal as ``SinkRefused``; the worker commits
    nothing of the batch and exits with EXIT_SINK_REFUSED, one line naming the output and the fix."""
    import threading

    from kdaemon.config import parse
    from kdaemon.worker.build import PipelineParts
    from kdaemon.worker.pipeline import Worker
    from testkit.pipeline import TOPIC, ScriptedConsumer

    path = tmp_path / "up.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)

    def serve():
        """Answers the resume question (the output has nothing yet), refuses the upload."""
        conn, _ = server.accept()
        buf = b""
        while True:
            data = conn.recv(65536)
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = parse_line(line)
                if msg.get("op") == "resume":
                    conn.sendall(UploadReply(msg["id"], True, resume={}).encode())
                    continue
                req = UploadRequest.decode(msg)
                conn.sendall(UploadReply(req.id, False, f"the delta output at {tmp_path / 'out'} refuses the upload "
                                         "for good (3 attempts): AnalysisException: [DELTA_TABLE_NOT_FOUND]",
                                         refused=True, fix="create the table").encode())
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "on_deserialize_error": "skip"},
                    "sink": {"type": "null"}})

    class Consumer(ScriptedConsumer):
        def subscription(self):
            return set()

        def group_member_id(self):
            return None

    durable: set[int] = set()
    consumer = Consumer(10, durable)
    sink = SparkSink({"type": "spark", "path": str(tmp_path / "out"), "socket": str(path), "max_records": 5},
                     str(tmp_path / "state"))
    identity = lambda t, h, b: b  # noqa: E731
    worker = Worker(config, PipelineParts(None, identity, identity, [], sink, None), consumer, lambda c, w: None)
    try:
        assert worker.run() == EXIT_SINK_REFUSED
    finally:
        server.close()
    assert consumer.commits == []
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert lines == [f"worker stopping, refused for good: the Spark upload was refused for good: the delta output "
                     f"at {tmp_path / 'out'} refuses the upload for good (3 attempts): AnalysisException: "
                     "[DELTA_TABLE_NOT_FOUND] (to fix: create the table)"]
    assert isinstance(worker.delivery.stop_error, SparkRefused) and isinstance(worker.delivery.stop_error, SinkRefused)
    _ = Record   # the worker's records are plugins.types.Record


def test_a_jvm_linkage_error_in_a_job_stops_the_worker_with_exit_sink_refused_at_the_first_failure(tmp_path, caplog):
    """Both ends at once: the uploader's classification (a linkage error refused at once, not
    answered "transient") reaching a real worker over the real socket as its stop with
    EXIT_SINK_REFUSED, after one job and one ERROR line from the uploader, nothing committed.
    What ran for five minutes before, once a second: the same job, the same IncompatibleClassChangeError."""
    import threading

    from kdaemon.config import parse
    from kdaemon.worker.build import PipelineParts
    from kdaemon.worker.pipeline import Worker
    from testkit.pipeline import TOPIC, ScriptedConsumer

    path = tmp_path / "out"
    u = Uploader({"type": "spark", "path": str(path), "socket": str(tmp_path / "up.sock")}, str(tmp_path / "state"))
    jobs: list[int] = []

    def linkage(requests):
        jobs.append(len(requests))
        raise java_error("java.lang.IncompatibleClassChangeError: class org.apache.iceberg.spark.SparkWrite "
                         "has interface org.apache.spark.sql.connector.write.Write as super class")
    u.upload = linkage
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(u.socket_path)
    server.listen(4)
    server.setblocking(False)
    u._sel.register(server, __import__("selectors").EVENT_READ, None)
    done = threading.Event()

    def serve():
        while not done.is_set():
            u._turn(server, 0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "on_deserialize_error": "skip"},
                    "sink": {"type": "null"}})

    class Consumer(ScriptedConsumer):
        def subscription(self):
            return set()

        def group_member_id(self):
            return None

    consumer = Consumer(10, set())
    sink = SparkSink({"type": "spark", "path": str(path), "socket": u.socket_path, "max_records": 5},
                     str(tmp_path / "state"))
    identity = lambda t, h, b: b  # noqa: E731
    worker = Worker(config, PipelineParts(None, identity, identity, [], sink, None), consumer, lambda c, w: None)
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(worker.run()), daemon=True)
    running.start()
    try:
        running.join(60)
        if running.is_alive():   # retried instead: stop it, and fail
            worker.request_stop()
            running.join(30)
            pytest.fail(f"the worker was still retrying after 60 s ({len(jobs)} jobs)")
    finally:
        done.set()
        thread.join(10)
        server.close()
    assert codes == [EXIT_SINK_REFUSED] and consumer.commits == [] and jobs == [1]
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.name for r in errors] == ["kdaemon.spark.uploader", "kdaemon.worker.pipeline"], errors
    assert "IncompatibleClassChangeError" in errors[1].getMessage() and "stage the jars" in errors[1].getMessage()
