"""The Spark uploader: one process per daemon holding the SparkSession.

A companion process of the spark sink (``kdaemon.sinks.builtin`` declares it; ``run`` is its
entry): the supervisor starts it before the workers and stops it after them, restarts it with
backoff if it dies, and restarts it when a reload changes the ``[sink]`` table.  Workers
connect over a Unix socket and send one request per staged batch (``wire.py``); the uploader
gathers what arrives within a short window into one Spark job, and answers each request once
its batch is in the output (files moved into place, manifest written) — or with the error.

The socket is bound before the SparkSession starts (which takes seconds), so a worker's first
upload waits for the session instead of failing.  With direct writes (a Delta or Iceberg table
on a local master) the uploader writes and commits jobs itself and starts Spark only when a job
needs it (``_write_rows``: rows the direct path cannot write, the dead-letter pass), so a
daemon whose jobs all go the direct path never holds a JVM (about 6-13 CPU-s and 0.5-1 GB saved
per uploader start).  If the session cannot start (a bad master URL, say), the uploader logs why
and exits, its listeners see the connection close, and the supervisor starts it again with
backoff (and at once after a reload that changed the settings).

Exactly-once holds when the uploader and Spark's executors see the same filesystem at ``path``
(local mode, or a shared mount): in Parquet mode the uploader moves Spark's output into place
itself; a Delta or Iceberg table (``format = "delta"``/``"iceberg"``, ``tables/formats.py``) gets
commits that record each partition's newest offset, which the uploader reads back from the
table's own files.

Workers stage batches in ``staged.py``'s format (no pyarrow in a worker); the uploader reads
each into Arrow and writes the Parquet file its job reads into its own hold directory
(``held-<owner>/`` beside the staging directories).  A worker that dies while its batch is in a
job has its staging directory removed by its successor; the job does not read from there, so
the other workers' batches of that job still go through.

``writer.py`` holds what talks to Spark; see ``layout.py`` for the output layout and the
exactly-once rules.  A job that fails is classified once (``failures.py``): a transient failure
is answered "transient" (the workers keep their batches and send them again); one that fails
the same way ``DETERMINISTIC_ATTEMPTS`` times in a row, or a JVM linkage error at once, is
answered "refused" with the fix, and the workers stop the daemon instead of retrying for ever.
A job a table refuses rows of for what they hold (``refused_rows``) follows the daemon's
``on_sink_error`` instead (``_rows_refused``): written again with those rows dead-lettered, or
refused at once under "stop".
A Spark the staged jars are not built for (the installed pyspark, checked first; the JVM's,
once the session is up: ``jars.mismatch``) is refused before any job: the uploader exits with
``EXIT_SINK_REFUSED`` and the supervisor stops the daemon instead of restarting it.
A failure is logged when it starts or changes; the same one again is DEBUG, and the first job
that succeeds after failures says so.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Mapping

import pyarrow.parquet as pq

from ....exit_codes import EXIT_SINK_REFUSED
from .. import staged
from ..resume import resume_points
from ..settings import SparkSettings
from ..tables import formats
from ..tables import layout
from ..tables.layout import BatchId
from ..tables.arrow_rows import Built
from ..wire import (PrepareHint, Request, ResumeQuery, UploadReply, decode_request, parse_line, socket_path,
                    staging_root)
from . import refused_rows
from .ahead import RowsAhead
from .failures import DETERMINISTIC, DETERMINISTIC_ATTEMPTS, PERMANENT, classify
from .fresh import Fresh, inspect_batch, versions_of
from .session_start import SessionStart
from .writer import (BadValues, RowsRefused, SparkMismatchError, SparkStartError, SparkWriter, first_line,
                     wait_for_master)

log = logging.getLogger("kdaemon.spark.uploader")

# How long a job waits for more workers' requests, against its fixed cost: about half a second
# through Spark, a few tens of milliseconds for a direct write (``_gather``).
COALESCE_S = 0.2
DIRECT_COALESCE_S = 0.05
MAX_REQUESTS_PER_JOB = 256
# After a job met a value that does not parse, or a row the table refuses, this many more run
# with the dead-letter pass (bad values tend to come in runs; each one found the optimistic way
# costs a failed write).
CAREFUL_JOBS_AFTER_BAD_VALUE = 10
EXIT_CANNOT_START = 1
EXIT_BAD_SETTINGS = 2


class OutputNotShared(Exception):
    """Spark wrote a job's files where the uploader does not see them: a setting to fix."""


class StoppedAtRefusedRows(Exception):
    """The table refused a row of the job for what it holds, and ``daemon.on_sink_error =
    "stop"``: the job is refused at once (``failures``: permanent), nothing of it committed,
    and the daemon stops with the table's line instead of dead-lettering the row."""



class Uploader:
    def __init__(self, settings: SparkSettings | Mapping, state_dir: str, on_sink_error: str = "retry") -> None:
        self.settings = settings = SparkSettings.of(settings)
        # ``[daemon] on_sink_error``, for the rows a table refuses (``_rows_refused``): the
        # workers' policy for records a sink refuses for what they are.
        self.on_sink_error = on_sink_error
        self.writer = SparkWriter(settings)
        self.root = settings.path
        self.socket_path = socket_path(settings, state_dir)
        # This uploader's Spark output goes to _kdaemon/tmp/<owner>-<job>: one uploader per
        # state dir, so at start it may remove whatever an earlier one of its own left there
        # (never another daemon's job under way).
        self.tmp_owner = hashlib.sha1(os.path.abspath(self.socket_path).encode()).hexdigest()[:12]
        self.identity = f"{socket.gethostname()}:{self.tmp_owner}"   # in manifests: who uploaded
        # The Parquet files of the job under way, made from the workers' staged files: a
        # worker that dies mid-job has its directory removed by its successor, which must not
        # pull files from under Spark (and fail the other workers' batches of the same job).
        self.held_dir = os.path.join(staging_root(settings, state_dir), f"held-{self.tmp_owner}")
        self._stop = False
        self._sel = selectors.DefaultSelector()
        self._buffers: dict[socket.socket, bytes] = {}
        self._queue: list[Request] = []
        # Per connection, the first batch of each partition that could not be read: later
        # batches of that partition on that connection are refused (``_refuses``).
        self._refused: dict[socket.socket, dict[tuple[str, int], BatchId]] = {}
        self._questions: list[tuple[socket.socket, ResumeQuery]] = []   # answered between jobs
        # Rows of batches staged ahead of their flush, built while their worker reads on.
        self._ahead = RowsAhead(lambda staged_file: self.writer.direct_rows(staged_file))
        self.built_ahead = 0   # batches of the last job written with rows built ahead
        self.jobs = 0
        self._server: socket.socket | None = None
        self._starting: SessionStart | None = None
        self._careful_jobs = 0   # jobs still to prepare with the dead-letter pass (_write_rows)
        self._failed_jobs = 0    # jobs failed in a row, and how the last one did (``_job_failed``)
        self._same_failures = 0
        self._last_failure: tuple[str, tuple] | None = None

    # -- serving --------------------------------------------------------------------------------

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        signal.signal(signal.SIGINT, lambda *_: self._request_stop())
        try:
            self.writer.check_spark()   # before anything: no restart changes the installed pyspark
        except SparkMismatchError as exc:
            return _cannot_start(exc)
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        if not self._wait_for_master():
            return 0
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.socket_path)
        except OSError as exc:
            server.close()
            log.error("the uploader cannot listen on %s: %s (a Unix socket path has at most 107 bytes; "
                      "set [sink] socket to a shorter path)", self.socket_path, exc.strerror or exc)
            return EXIT_CANNOT_START
        server.listen(64)   # workers may connect and send while the session starts
        server.setblocking(False)
        self._server = server
        try:
            self._sel.register(server, selectors.EVENT_READ, None)
            try:
                self.writer.prepare_offline()
            except SparkStartError as exc:
                return _cannot_start(exc)
            # With direct writes the uploader serves jobs itself and starts Spark only for a job
            # that needs it (``_write_rows``); otherwise every job does: serve once it is up.
            if not self.writer.direct_writes:
                self._starting = SessionStart(self.writer)
                try:
                    if not self._await_session(answer_questions=True):
                        return 0
                except SparkStartError as exc:
                    return _cannot_start(exc)
            self._remove_own_tmp()
            log.info("uploader listening on %s, writing to %s%s%s", self.socket_path, self.root,
                     f" (an {self.writer.format} table)" if self.writer.format in formats.FORMATS else "",
                     "" if self.writer.session_ready else "; Spark starts when a job needs it")
            while not self._stop:
                self._turn(server, 0.5)
                if self._starting is not None and not self._starting.running \
                        and self._starting.failure() is not None:
                    return _cannot_start(self._starting.failure())
        finally:
            server.close()
            for conn in list(self._buffers):
                conn.close()
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            if self._starting is not None:   # a stop while Spark starts: let it finish, then stop it
                self._starting.join(120)
            self._ahead.close()
            self.writer.stop()
        return 0

    def _await_session(self, answer_questions: bool) -> bool:
        """Wait for the session, reading requests meanwhile and, when no job is under way
        (``answer_questions``), answering resume questions, which need only the output's files:
        a worker given partitions meanwhile waited the whole start.  Uploads wait in the queue
        (an answer now does not count them: early, never late).  False if asked to stop first;
        raises what the start raised."""
        while self._starting.running:
            self._pump(self._server, 0.2)
            if answer_questions and self._questions:
                self._answer_questions()
        if self._starting.failure() is not None:
            raise self._starting.failure()
        return not self._stop

    def _turn(self, server: socket.socket | None, timeout: float) -> None:
        """Read what arrives within ``timeout``, run a job if anything is queued, and answer the
        resume questions once nothing is: an answer then counts every batch sent before it."""
        self._pump(server, timeout)
        if self._queue:
            self._run_job(self._gather(server))
        if self._questions and not self._queue:
            self._answer_questions()

    def _gather(self, server: socket.socket | None) -> list[Request]:
        """The next job's requests: what else arrives shortly joins the queued ones (a job's
        fixed cost is about half a second through Spark), without waiting once every worker has
        asked; then whatever has arrived meanwhile.  A direct write costs little more for being
        its own job, so it waits less: a worker holding no partitions (it asks nothing) held
        every job of the others the whole window.  A flush split over two jobs is confirmed,
        and committed, only after the second."""
        deadline = time.monotonic() + (DIRECT_COALESCE_S if self.writer.direct_writes else COALESCE_S)
        while time.monotonic() < deadline and len(self._queue) < MAX_REQUESTS_PER_JOB \
                and not self._everyone_waiting():
            self._pump(server, max(0.0, deadline - time.monotonic()))
        while len(self._queue) < MAX_REQUESTS_PER_JOB and self._pump(server, 0.0):
            pass
        batch, self._queue = self._queue[:MAX_REQUESTS_PER_JOB], self._queue[MAX_REQUESTS_PER_JOB:]
        return batch

    def _request_stop(self) -> None:
        self._stop = True

    def _wait_for_master(self) -> bool:
        """``writer.wait_for_master``, until it answers or the uploader is asked to stop."""
        return wait_for_master(self.writer.master, lambda: self._stop)

    def _everyone_waiting(self) -> bool:
        """Every worker has asked, and none is in the middle of a line (more of its flush to come)."""
        waiting = {r.conn for r in self._queue}
        return all(conn in waiting and not pending for conn, pending in self._buffers.items())

    def _remove_own_tmp(self) -> None:
        shutil.rmtree(self.held_dir, ignore_errors=True)   # an earlier uploader's job's files
        d = os.path.join(layout.kdaemon_dir(self.root), "tmp")
        try:
            names = os.listdir(d)
        except FileNotFoundError:
            return
        for name in names:
            if name.startswith(self.tmp_owner + "-"):
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)

    def _pump(self, server: socket.socket, timeout: float) -> bool:
        """Accept connections and read requests for up to ``timeout`` seconds; False if nothing
        was ready."""
        ready = self._sel.select(timeout)
        for key, _ in ready:
            if key.data is None:
                try:
                    conn, _ = server.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                self._sel.register(conn, selectors.EVENT_READ, "conn")
                self._buffers[conn] = b""
                continue
            conn = key.fileobj
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                continue
            buf = self._buffers[conn] + data
            *lines, self._buffers[conn] = buf.split(b"\n")
            for line in lines:
                msg = None
                try:
                    msg = parse_line(line)
                    wanted = decode_request(msg)
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("bad request from a worker (%s: %s): %.200r", type(exc).__name__, exc, line)
                    if isinstance(msg, dict) and isinstance(msg.get("id"), int):
                        self._send(conn, UploadReply(msg["id"], False, f"bad request: {exc}"))
                    continue
                if isinstance(wanted, ResumeQuery):
                    self._questions.append((conn, wanted))
                    continue
                if isinstance(wanted, PrepareHint):
                    if self.writer.direct_writes and not self._careful_jobs:
                        self._ahead.hint(conn, wanted.files)
                    continue
                req = Request(conn, wanted.id, wanted.file, wanted.topic, wanted.batch, wanted.rows)
                if self._refuses(req):
                    self._refuse(req)
                else:
                    self._queue.append(req)
        return bool(ready)

    def _drop(self, conn: socket.socket) -> None:
        """A worker went away: what it still had queued is nobody's to confirm."""
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        self._buffers.pop(conn, None)
        self._refused.pop(conn, None)
        self._questions = [q for q in self._questions if q[0] is not conn]
        self._ahead.forget_connection(conn)
        conn.close()
        self._queue = [r for r in self._queue if r.conn is not conn]

    def _send(self, conn: socket.socket, reply: UploadReply) -> None:
        try:
            conn.setblocking(True)
            conn.sendall(reply.encode())
            conn.setblocking(False)
        except OSError:
            self._drop(conn)

    def _reply(self, req: Request, ok: bool, error: str | None = None, transient: bool = False,
               refused_fix: str | None = None) -> None:
        if req.conn is None or req.conn.fileno() < 0:
            return
        self._send(req.conn, UploadReply(req.id, ok, error, transient, refused=refused_fix is not None,
                                         fix=refused_fix))

    def _answer_questions(self) -> None:
        """Where may a worker start the partitions it was given (``wire.ResumeQuery``)?  Asked
        after the queue ran dry, so the answer includes every batch sent before the question."""
        questions, self._questions = self._questions, []
        for conn, q in questions:
            try:
                where = resume_points(self.root, self.writer.format, q.topic, q.positions)
            except Exception as exc:   # the worker then reads from its position, as without asking
                log.warning("cannot tell where %s's partitions %s resume: %s: %s", q.topic, sorted(q.positions),
                            type(exc).__name__, first_line(exc))
                self._send(conn, UploadReply(q.id, False, f"{type(exc).__name__}: {first_line(exc)}"))
                continue
            self._send(conn, UploadReply(q.id, True, resume=where))

    # -- one job --------------------------------------------------------------------------------

    def _run_job(self, requests: list[Request]) -> None:
        started = time.monotonic()
        try:
            written, oldest_ms = self.upload(requests)
        except Exception as exc:
            self._job_failed(requests, exc)
            return
        if self._failed_jobs:
            log.info("Spark uploads succeed again after %d failed job(s)", self._failed_jobs)
        self._failed_jobs = self._same_failures = 0
        self._last_failure = None
        self.jobs += 1
        failed = [r for r in requests if r.error is not None]
        ok = len(requests) - len(failed)
        rows = sum(r.rows for r in requests if r.error is None)
        lag = f", oldest record {time.time() - oldest_ms / 1000:.1f}s old" if oldest_ms is not None else ""
        ahead = f", {self.built_ahead} built ahead" if self.built_ahead else ""
        log.info("uploaded %d batch(es), %d rows (%d new) in %.2fs%s%s", ok, rows, written,
                 time.monotonic() - started, lag, ahead)
        for req in requests:
            if req.error is not None:
                log.error("batch %s of %s not uploaded: %s", req.batch.name, req.topic, req.error)
            self._reply(req, req.error is None, req.error)
        later = [r for r in self._queue if self._refuses(r)]
        if later:
            self._queue = [r for r in self._queue if r not in later]
            for r in later:
                self._refuse(r)

    def _job_failed(self, requests: list[Request], exc: Exception) -> None:
        """Answer a failed job's requests by what the failure is (``failures.classify``):
        transient (sent again by the workers), or refused for good once a deterministic failure
        came ``DETERMINISTIC_ATTEMPTS`` times in a row, or a linkage error once.  Logged when the
        failure starts or changes, DEBUG while it repeats."""
        failure = classify(exc)
        what = f"{type(exc).__name__}: {first_line(exc)}"
        key = (failure.kind, failure.names)
        self._failed_jobs += 1
        self._same_failures = self._same_failures + 1 if key == self._last_failure else 1
        refuse = failure.kind == PERMANENT or \
            (failure.kind == DETERMINISTIC and self._same_failures >= DETERMINISTIC_ATTEMPTS)
        target = f"the {self.writer.format} output at {self.root}"
        if refuse:
            attempts = f" ({self._same_failures} attempts)" if failure.kind == DETERMINISTIC else ""
            error = f"{target} refuses the upload for good{attempts}: {what}"[:2000]
            log.error("%s; to fix: %s", error, failure.fix)
        else:
            error = what[:2000]
            if failure.kind == DETERMINISTIC:
                error += f" (attempt {self._same_failures} of {DETERMINISTIC_ATTEMPTS} before it is refused)"
            level = logging.ERROR if self._same_failures == 1 else logging.DEBUG
            log.log(level, "Spark upload of %d batch(es) to %s failed (%s): %s", len(requests), self.root,
                    failure.kind, error)
        self._last_failure = key
        for req in requests:
            self._reply(req, False, error, transient=not refuse, refused_fix=failure.fix if refuse else None)

    def _unreadable(self, req: Request, error: str) -> None:
        """``req``'s staged file cannot be read: it fails, and so do the batches of its partition
        that its worker sent after it, in this job, queued, or still to come on that connection
        (a flush bigger than one job): uploading them would record offsets past rows that are
        not in the table, and a table's recorded offset counts as uploaded for the rows read
        again.  The worker rewinds with a new sink and so a new connection, which starts clean."""
        req.error = error
        self._refused.setdefault(req.conn, {}).setdefault((req.topic, req.batch.partition), req.batch)

    def _refuses(self, r: Request) -> bool:
        failed = self._refused.get(r.conn, {}).get((r.topic, r.batch.partition))
        return failed is not None and r.batch.first > failed.first

    def _refuse(self, r: Request) -> None:
        """Fail a request ``_refuses`` and answer it at once (one not in a job)."""
        r.error = _after_failed(self._refused[r.conn][(r.topic, r.batch.partition)])
        log.error("batch %s of %s not uploaded: %s", r.batch.name, r.topic, r.error)
        self._reply(r, False, r.error)

    def upload(self, requests: list[Request]) -> tuple[int, int | None]:
        """Upload the batches; return the number of rows written (after dropping rows already
        in the output) and the oldest record timestamp (ms) among them.  A batch that cannot be
        read gets its ``error`` set; any other failure raises, and then no batch of the job is
        confirmed (a batch whose manifest was written is found again by the next upload)."""
        root = self.root
        self.built_ahead = 0
        partitions = {(r.topic, r.batch.partition) for r in requests}
        with layout.partition_locks(root, partitions):
            for topic, partition in sorted(partitions):
                self._finish_interrupted(topic, partition)
            ranges = formats.uploaded_ranges(root, self.writer.format, partitions)
            fresh: list[Fresh] = []
            try:
                return self._upload_held(requests, ranges, fresh)
            finally:
                self._ahead.forget(r.file for r in requests)
                for req in requests:
                    if req.held is not None:
                        _unlink_quietly(req.held)
                        req.held = None

    def _upload_held(self, requests: list[Request], ranges: dict, fresh: list[Fresh]) -> tuple[int, int | None]:
        """``upload`` under the partition locks; every staged file it uses is held first."""
        root = self.root
        for req in sorted(requests, key=lambda r: (r.topic, r.batch)):
            known = ranges[(req.topic, req.batch.partition)]
            if (req.batch.first, req.batch.last) in known:
                continue  # uploaded before (its confirmation was lost): nothing to do
            if self._refuses(req):
                req.error = _after_failed(self._refused[req.conn][(req.topic, req.batch.partition)])
                continue
            try:
                table = staged.read(req.file)
            except FileNotFoundError:
                self._unreadable(req, f"cannot read the staged batch {req.file}: it is gone, its worker ended "
                                      "before the upload (the records are read again from the committed offsets)")
                continue
            except (OSError, staged.StagedFileError) as exc:
                self._unreadable(req, f"cannot read the staged batch {req.file}: {exc}")
                continue
            item = inspect_batch(req, table, [(f, l) for f, l in known if req.batch.overlaps(f, l)])
            del table
            if not item.drop:
                item.built = self._ahead.take(req.file)
            # Later requests of this job overlapping this one drop what it brings.
            known.append((req.batch.first, req.batch.last))
            fresh.append(item)
        rows = sum(f.new_rows for f in fresh)
        known_ts = [f.min_ts for f in fresh if f.new_rows and f.min_ts is not None and f.min_ts >= 0]
        oldest = min(known_ts) if known_ts else None
        if rows:
            self._write_rows([f for f in fresh if f.new_rows])
        for f in fresh:
            req = f.req
            extra = {"rows": req.rows, "new_rows": f.new_rows}
            if f.min_ts is not None:
                extra.update(min_timestamp_ms=f.min_ts, max_timestamp_ms=f.max_ts)
            self._write_manifest(req.topic, req.batch, **extra)
        for f in fresh:
            if f.new_rows:
                layout.remove_durably(layout.pending_path(root, f.req.topic, f.req.batch))
        return rows, oldest

    def _hold(self, req: Request, table) -> None:
        """Write the batch as the Parquet file the job reads, in the hold directory, under a
        name that keeps the batch name at its end (``writer._BATCH_IN_FILE``).  Uncompressed:
        it lives for one job on local disk, and Spark reads it once."""
        os.makedirs(self.held_dir, exist_ok=True)
        worker = os.path.basename(os.path.dirname(req.file))
        name = os.path.basename(req.file).removesuffix(staged.SUFFIX)
        held = os.path.join(self.held_dir, f"{worker}-{name}.parquet")
        pq.write_table(table, held + ".tmp", compression="none")
        os.replace(held + ".tmp", held)
        req.held = held

    def _write_rows(self, fresh: list[Fresh]) -> None:
        """The rows of every fresh batch into the output: written by the uploader itself where
        the writer can (``SparkWriter.append_direct``), else one Spark job, without the
        dead-letter pass (``SparkWriter.prepare``) unless a recent job met values that do not
        parse or rows the table refuses: such a job fails before anything is committed, and
        runs again carefully at once (for refused rows, as ``on_sink_error`` says)."""
        careful = self._careful_jobs > 0
        if not careful and self.writer.direct_writes:
            versions = versions_of(fresh)
            self._announce(fresh, versions, {})
            if self.writer.append_direct([f.rows if f.built is None else Built(f.built) for f in fresh], versions):
                self.built_ahead = sum(f.built is not None for f in fresh)
                return
        if not self.writer.session_ready:
            if self._starting is None:
                log.info("this job needs Spark: starting the Spark session")
                self._starting = SessionStart(self.writer)
            else:
                log.info("this job needs Spark: waiting for the Spark session to start")
            self._await_session(answer_questions=False)
        for f in fresh:
            self._hold(f.req, f.rows)
            f.rows = None
        try:
            self._write_rows_once(fresh, careful)
        except BadValues:
            log.warning("a value of this job does not parse as value_schema (Spark's task error above is this "
                        "check's): nothing was committed; writing the job again with the dead-letter pass, "
                        "kept for the next %d jobs", CAREFUL_JOBS_AFTER_BAD_VALUE)
            self._careful_jobs = CAREFUL_JOBS_AFTER_BAD_VALUE + 1
            self._write_rows_once(fresh, careful=True)
        except RowsRefused as exc:
            self._rows_refused(fresh, careful, exc)
        self._careful_jobs = max(0, self._careful_jobs - 1)

    def _rows_refused(self, fresh: list[Fresh], careful: bool, exc: RowsRefused) -> None:
        """The table refused rows of the job for what they hold (``refused_rows``): the
        records are what they are, so sending the job again cannot help.  ``on_sink_error``
        decides, as the workers do for records a sink refuses for what they are: "stop" refuses
        the job at once (the daemon stops naming the constraint, nothing committed); "retry" and
        "dlq" write the job again with the dead-letter pass, which sends such rows to the
        output's own dead letters (``_kdaemon/dlq``, always there, beside the values that do not
        parse) and appends the rest, so the batch is confirmed and the partition goes on.

        Where that pass cannot keep the refused rows out (the job was careful already, or the
        table has no condition ``refused_rows`` reads), the failure stands: deterministic, as
        any job that fails the same way every time."""
        fmt = self.writer.format
        if self.on_sink_error == "stop":
            raise StoppedAtRefusedRows(f"the table refuses a row for what it holds, and daemon.on_sink_error = "
                                       f"\"stop\": {exc}") from exc
        if careful or not refused_rows.conditions(fmt, self.root):
            raise exc
        log.warning("the %s table at %s refuses rows of this job (%s): nothing was committed; writing the job "
                    "again with the dead-letter pass, which sends such rows to %s, kept for the next %d jobs",
                    fmt, self.root, exc, layout.dlq_root(self.root), CAREFUL_JOBS_AFTER_BAD_VALUE)
        self._careful_jobs = CAREFUL_JOBS_AFTER_BAD_VALUE + 1
        self._write_rows_once(fresh, careful=True)

    def _write_rows_once(self, fresh: list[Fresh], careful: bool) -> None:
        """Path mode moves the job's files into place under their batch names; table mode
        appends them to the Delta or Iceberg table (``tables/formats.py``).  Either way pending records
        announce first what is about to appear, and the values that do not parse (``careful``)
        are moved into ``_kdaemon/dlq``."""
        root = self.root
        tmp = os.path.join(layout.kdaemon_dir(root), "tmp", f"{self.tmp_owner}-{uuid.uuid4().hex}")
        job = self.writer.prepare([(f.req.held, f.req.batch.name, f.drop) for f in fresh], tmp, careful)
        try:
            moves: dict[str, list[tuple[str, str]]] = defaultdict(list)
            if self.writer.format == "parquet":
                layout.plan_moves(self.writer.write_parquet(job), root, moves)
                for f in fresh:
                    if not moves.get(f.req.batch.name):
                        raise OutputNotShared(
                            f"Spark wrote no file for batch {f.req.batch.name} under {tmp}: in path mode the "
                            "output path must be on a filesystem the uploader sees (local mode or a shared mount)")
            if job.dlq_dir is not None:
                layout.plan_moves(job.dlq_dir, layout.dlq_root(root), moves)
            versions = versions_of(fresh)
            self._announce(fresh, versions, moves)
            layout.move_durably(moves)
            if self.writer.format in formats.FORMATS:
                self.writer.append_table(job, versions)
        finally:
            self.writer.finish(job)
            shutil.rmtree(tmp, ignore_errors=True)

    def _announce(self, fresh: list[Fresh], versions: dict[tuple[str, int], int],
                  moves: dict[str, list[tuple[str, str]]]) -> None:
        """Each batch's pending record (``layout`` invariant 2): the files about to be moved into
        place, and in a table the commit about to record ``versions``."""
        for f in fresh:
            record: dict = {"files": [os.path.relpath(target, self.root) for _, target in moves.get(f.req.batch.name, ())]}
            if self.writer.format in formats.FORMATS:
                record["table"] = formats.pending_entry(self.writer.format, f.req.topic, f.req.batch.partition,
                                                       versions[(f.req.topic, f.req.batch.partition)])
            layout.write_durably(layout.pending_path(self.root, f.req.topic, f.req.batch), json.dumps(record).encode())

    def _write_manifest(self, topic: str, batch: BatchId, **extra) -> None:
        """The batch's commit point (``layout`` invariant 2): who uploaded which range, when."""
        manifest = {"topic": topic, "partition": batch.partition, "first": batch.first, "last": batch.last,
                    "uploaded_at": time.time(), "uploader": self.identity, **extra}
        layout.write_durably(layout.manifest_path(self.root, topic, batch), json.dumps(manifest).encode())

    def _finish_interrupted(self, topic: str, partition: int) -> None:
        """Settle this partition's uploads that started and never got a manifest: a Delta
        commit that happened gets its manifest now; anything else is undone (its files removed)."""
        for batch, record in layout.pending_uploads(self.root, topic, partition):
            manifest = layout.manifest_path(self.root, topic, batch)
            if os.path.exists(manifest):
                pass
            elif "table" in record and formats.committed(self.root, record["table"]):
                self._write_manifest(topic, batch, recovered=True, table=record["table"])
                log.warning("batch %s of %s: its %s commit (partition %s up to offset %s) happened before the "
                            "uploader stopped; its manifest is written now", batch.name, topic,
                            record["table"]["format"], partition, record["table"]["version"])
            else:
                removed = 0
                for rel in record["files"]:
                    try:
                        os.unlink(os.path.join(self.root, rel))
                        removed += 1
                    except FileNotFoundError:
                        pass
                log.warning("removed %d file(s) of batch %s of %s: an upload that did not finish",
                            removed, batch.name, topic)
            layout.remove_durably(layout.pending_path(self.root, topic, batch))


def _cannot_start(exc: SparkStartError) -> int:
    """The one line and the exit code of an uploader that cannot start: ``EXIT_SINK_REFUSED``
    for a Spark the staged jars are not built for (the supervisor stops the daemon: a restart
    would refuse the same), else ``EXIT_CANNOT_START`` (restarted with backoff: a master may
    come back)."""
    if isinstance(exc, SparkMismatchError):
        log.error("the uploader refuses to start: %s", exc)
        return EXIT_SINK_REFUSED
    log.error("the uploader cannot start: %s", exc)
    return EXIT_CANNOT_START


def _after_failed(batch: BatchId) -> str:
    # The rows of a partition go in in offset order: a table records the newest offset it took
    # per partition, and rows at or below it count as uploaded when they are read again.
    return (f"an earlier batch of the same partition ({batch.name}) could not be read; "
            "the worker reads both again")


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def run(settings: dict, state_dir: str, on_sink_error: str = "retry") -> int:
    """The uploader process: serve until SIGTERM.  The spark sink's ``CompanionSpec`` names
    this function (``kdaemon.sinks.builtin``); the supervisor's companion runner calls it in a
    fresh interpreter with the sink's ``SparkSettings`` as ``to_wire()`` wrote them (parsed
    here again, as a ``[sink]`` table would be), the daemon's state directory and ``[daemon]
    on_sink_error`` (for the rows a table refuses), so this layer never reads the
    configuration file."""
    try:
        uploader = Uploader(SparkSettings.parse(settings), state_dir, on_sink_error)
    except ValueError as exc:
        log.error("bad spark sink settings: %s", "; ".join(str(exc).splitlines()))
        return EXIT_BAD_SETTINGS
    try:
        return uploader.serve()
    except Exception as exc:
        log.exception("the uploader failed: %s: %s", type(exc).__name__, first_line(exc))
        return 1
