"""The worker side of the Spark sink: stage batches on disk, hand them to the uploader.

``write`` only buffers columns in memory.  ``flush_async`` (called by the worker when
``wants_flush`` says a batch is big or old enough) writes one staged file (``staged.py``: Arrow's
layout written without pyarrow, which the worker never imports) per (topic, partition) batch
under ``<state_dir>/spark-staging/<pid>/`` and asks the uploader to upload them
all; the worker goes on consuming into new buffers and commits the batch's positions once the
returned handle reports every file confirmed — so a commit covers only records that are in the
Spark output.  One upload at a time is in flight: the next ``flush_async`` waits for the
previous confirmation.  Buffers that reach ``max_bytes`` (memory) are staged at once and sent
with the next flush, which ``max_records``/``max_age_s`` decide: memory stays bounded while an
upload job still gathers many records (its cost in Spark is mostly per job).
``flush`` is ``flush_async().wait()``.  If the uploader is down or Spark fails, the handle
raises; the worker then pauses, rebuilds the sink and rewinds to its last commit, so nothing is
staged without bound and nothing is lost.

The Spark output keeps the broker's raw key and value bytes (``value_format``/``value_schema``
on the uploader decide how values become columns); deserializers affect only interceptors.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...plugins.types import Record, SinkRefused, TopicPartition
from .tables import jars
from . import staged
from .tables.layout import BatchId
from .settings import DEFAULT_MAX_BYTES, SHARE_GROUP_REFUSED, SparkSettings  # noqa: F401  (the first two: re-exported)
from .staged import as_bytes
from .uplink import SparkRefused, SparkUploadError, UploaderClient, UploaderUnavailable
from .wire import UploadReply, socket_path, staging_root


def spark_mismatch(settings: SparkSettings | Mapping, version: str | None = None,
                   whose: str = jars.PYSPARK) -> jars.SparkMismatch | None:
    """Whether Spark ``version`` (default: the installed pyspark's, which this imports) is one the
    staged jars of the settings' table format are built for (``jars.mismatch``); None if so, or
    when no staged jars are used (Parquet; a Spark Connect server has its own), or no pyspark.
    ``check-config`` (``preflight_settings``) and the uploader ask, never a worker."""
    s = SparkSettings.of(settings)
    if not s.table_format or s.master.startswith("sc://"):
        return None
    version = jars.installed_pyspark() if version is None else version
    return None if version is None else jars.mismatch(s.format, version, whose)


def preflight_settings(settings: SparkSettings | Mapping) -> None:
    """``check-config``'s look beyond the settings themselves: ``SinkRefused`` if the installed
    pyspark is not the Spark the staged jars are built for (the uploader would refuse to start,
    exit 6)."""
    s = SparkSettings.of(settings)
    found = spark_mismatch(s)
    if found is not None:
        raise SinkRefused(found.problem, target=f"the {s.format} output at {s.path}", fix=found.fix)


def validate_settings(settings: Mapping, *, group_type: str = "consumer") -> SparkSettings:
    """The ``[sink]`` settings of the spark sink, parsed and checked (``SparkSettings.parse``):
    ``kdaemon.settings.SettingsError`` naming every problem.

    Workers and the uploader both parse them, so a bad setting stops the daemon at boot instead
    of failing every upload.  ``group_type`` (``SinkContext.group_type``): a share group is
    refused, whatever the settings; check-config and a worker's build ask the same
    (``sinks/builtin.py``)."""
    return SparkSettings.parse(settings, group_type=group_type)


@dataclass
class _Buffer:
    topic: str
    partition: int
    started: float
    offsets: list = field(default_factory=list)
    timestamps: list = field(default_factory=list)
    timestamp_types: list = field(default_factory=list)
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    headers: list = field(default_factory=list)
    size: int = 0
    last_offset: int = -1
    # An offset at or below one already buffered: the partition was read again from an earlier
    # position (it was lost and came back) while this buffer still held records of it.
    reread: bool = False


class SparkSink:
    # The uploader keeps each (topic, partition, offset) once, whichever worker sends it: the
    # manifests and the table's recorded offsets drop a batch's rows already uploaded, under
    # the partition locks (uploader.py).  A revoked partition is let go without waiting for
    # the upload in flight (kdaemon/worker/delivery.py ``on_revoked``).
    deduplicates_by_offset = True

    def __init__(self, settings: SparkSettings | Mapping, state_dir: str, *, heartbeat_timeout_s: float | None = None,
                 memory_bytes: int = 0, group_type: str = "consumer") -> None:
        self.settings = settings = SparkSettings.of(settings, group_type=group_type)
        self.max_records = settings.max_records
        # Unless [sink] max_bytes says otherwise, a batch is staged before its buffers pass the
        # sink's share of the worker's memory budget (``memory_bytes``; SinkContext).
        self.max_bytes = settings.batch_bytes(memory_bytes)
        self.max_age_s = settings.max_age_s
        self.max_idle_s = settings.max_idle_s
        self._last_write = 0.0   # monotonic time of the last write that added a record
        self.output = settings.path   # named when the uploader refuses for good
        self.staging = os.path.join(staging_root(settings, state_dir), str(os.getpid()))
        _discard_dead_staging(os.path.dirname(self.staging))
        os.makedirs(self.staging, exist_ok=True)
        timeout = settings.upload_timeout_s
        if heartbeat_timeout_s:
            # A worker waiting for its upload sends no heartbeat to the supervisor, which kills
            # it after heartbeat_timeout_s.  Give up (and retry: a finished upload is then
            # found by its manifest) well before that.
            timeout = min(timeout, max(1.0, 0.8 * heartbeat_timeout_s))
        self.client = UploaderClient(socket_path(settings, state_dir), timeout)
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        # Buffers staged early because they reached max_bytes: on disk, sent with the next flush.
        self._spilled: list[dict] = []             # their upload requests
        self._spilled_since: float | None = None   # when the oldest spilled buffer started
        self._last_batch: dict[tuple[str, int], str] = {}
        self._seq = 0
        self._closed = False
        self._pending: PendingUpload | None = None
        self._questions: dict[int, tuple[str, dict[int, int]]] = {}   # ask_resume's, unanswered

    @classmethod
    def from_settings(cls, settings: SparkSettings | Mapping, state_dir: str = "./var/kdaemon") -> "SparkSink":
        return cls(settings, state_dir)

    # -- the Sink interface ---------------------------------------------------------------------

    def _refuse_if_closed(self, action: str) -> None:
        # A closed sink lost its buffers: a flush that "succeeded" on it would let the worker
        # commit positions of records that never reached the uploader.
        if self._closed:
            raise SparkUploadError(f"cannot {action} a closed spark sink (its buffered records were dropped)")

    def write(self, records) -> None:
        self._refuse_if_closed("write to")
        buffers = self._buffers
        if buffers and sum(b.size for b in buffers.values()) >= self.max_bytes:
            # Before taking these records: if staging fails, none of them was taken, so the
            # worker's sink-error policy sees a write that did not happen, not half of one.
            self._spill()
        now = time.monotonic()
        current = None
        b = None
        for r in records:   # the per-record path: kept lean (about 1 µs a record)
            key = (r.topic, r.partition)
            if key != current:   # a poll's records come in runs per partition
                current = key
                b = buffers.get(key)
                if b is None:
                    b = buffers[key] = _Buffer(r.topic, r.partition, now)
            raw = isinstance(r, Record)
            k = r.raw_key if raw and r.raw_key is not None else as_bytes(r.key)
            v = r.raw_value if raw and r.raw_value is not None else as_bytes(r.value)
            offset = r.offset
            if offset <= b.last_offset:
                b.reread = True
            b.last_offset = offset
            b.offsets.append(offset)
            b.timestamps.append(r.timestamp)
            b.timestamp_types.append(r.timestamp_type)
            b.keys.append(k)
            b.values.append(v)
            b.headers.append(r.headers or ())   # (key, value) pairs
            b.size += 64 + (len(k) if k else 0) + (len(v) if v else 0)
        if b is not None:
            self._last_write = now

    def _spill(self) -> None:
        """Stage the buffers now, to send with the next flush: memory stays under ``max_bytes``
        while a flush still gathers up to ``max_records`` (an upload job has a fixed cost of
        about a second in Spark, so fewer, bigger jobs deliver more).  The uploader is told
        of them at once, and builds their rows while this worker reads on (``uploader/ahead.py``)."""
        started = min(b.started for b in self._buffers.values())
        staged_now = self._stage_buffers()
        self._spilled += staged_now
        self._spilled_since = started if self._spilled_since is None else min(self._spilled_since, started)
        self.client.hint([r["file"] for r in staged_now])

    def wants_flush(self) -> bool:
        now = time.monotonic()
        if self._spilled_since is not None and now - self._spilled_since >= self.max_age_s:
            return True
        if (self.max_idle_s is not None and (self._buffers or self._spilled)
                and now - self._last_write >= self.max_idle_s):
            return True
        total_records = sum(r["rows"] for r in self._spilled)
        for b in self._buffers.values():
            total_records += len(b.offsets)
            if now - b.started >= self.max_age_s:
                return True
        return total_records >= self.max_records

    def flush(self) -> None:
        self.flush_async().wait()

    def flush_async(self) -> "PendingUpload":
        """Stage every buffered batch and send it to the uploader without waiting.

        The worker keeps consuming into fresh buffers while Spark writes these, and commits
        the positions it noted at this call once the returned handle reports success.  The
        buffers are emptied now.  If the uploader cannot be reached (or goes away, or its job
        fails), the handle raises ``UploaderUnavailable`` and keeps the staged files for
        ``retry``; any other failure drops them, and the worker rebuilds the sink and rewinds
        to its last commit, so those records are read again."""
        self._refuse_if_closed("flush")
        if self._pending is not None and not self._pending.finished:
            self._pending.wait()   # one upload in flight at most; raises if it failed
        if not self._buffers and not self._spilled:
            return PendingUpload.confirmed()
        requests = self._spilled + self._stage_buffers()
        self._spilled, self._spilled_since = [], None
        self._pending = PendingUpload(self, requests, [r["file"] for r in requests])
        self._pending.send()
        return self._pending

    def _stage_buffers(self) -> list[dict]:
        """One staged file per buffer, which are emptied; their upload requests."""
        requests, files = [], []
        try:
            for (topic, partition), b in sorted(self._buffers.items()):
                batch = BatchId(partition, min(b.offsets), max(b.offsets))
                self._seq += 1
                # Never the same name twice (Spark may cache a path's size), and the batch name
                # last: the uploader's Spark reads it from there.
                path = os.path.join(self.staging, f"{self._seq:08d}-{uuid.uuid4().hex[:12]}-{batch.name}{staged.SUFFIX}")
                files.append(path)
                rows = stage_buffer(path, b)
                requests.append({"file": path, "topic": topic, "partition": partition,
                                 "first": batch.first, "last": batch.last, "rows": rows})
        except BaseException:
            _unlink_all(files)
            raise
        self._buffers.clear()
        return requests

    def probe(self) -> str | None:
        """None if the uploader accepts a connection (it listens from its start, and queues
        uploads while its Spark session comes up), else why not.  Costs one connect."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(1.0)
        try:
            s.connect(self.client.path)
        except OSError as exc:
            return f"the Spark uploader is not reachable at {self.client.path}: {exc.strerror or exc}"
        finally:
            s.close()
        return None

    def _confirmed(self, requests: list[dict]) -> None:
        for req in requests:
            self._last_batch[(req["topic"], req["partition"])] = BatchId(req["partition"], req["first"], req["last"]).name

    def commit_metadata(self, topic: str, partition: int) -> str:
        """Stored with every commit: ``spark:`` and the last batch this sink uploaded for the
        partition (``spark:`` alone if it uploaded none: only filtered records since, or the
        partition was started where the output already was, worker/resume.py)."""
        return f"spark:{self._last_batch.get((topic, partition), '')}"

    def ask_resume(self, positions: dict[TopicPartition, int]) -> None:
        """Ask the uploader where partitions just given to this worker may start instead of
        ``positions`` (``resume.py``: after what the output already has); ``resume_answers``
        hands the answers over as they arrive."""
        self._refuse_if_closed("ask")
        by_topic: dict[str, dict[int, int]] = {}
        for tp, position in positions.items():
            by_topic.setdefault(tp.topic, {})[tp.partition] = position
        for topic, asked in by_topic.items():
            self._questions[self.client.ask(topic, asked)] = (topic, asked)

    def resume_answers(self) -> dict[TopicPartition, int | None]:
        """The answers arrived since the last call: partition -> where to start, or None where
        the uploader could not say (or the connection closed): start at the position."""
        out: dict[TopicPartition, int | None] = {}
        for query_id, (topic, asked) in list(self._questions.items()):
            try:
                reply = self.client.answer(query_id)
            except UploaderUnavailable:   # the client closed the connection: no answer is coming
                reply = None
            if reply is None and self.client.connected:
                continue
            del self._questions[query_id]
            where = (reply.resume or {}) if reply is not None and reply.ok else {}
            for partition in asked:
                out[TopicPartition(topic, partition)] = where.get(partition)
        return out

    def close(self) -> None:
        self._closed = True
        if self._pending is not None:
            self._pending.abandon()
        self._buffers.clear()
        self._spilled, self._spilled_since = [], None
        self.client.close()
        shutil.rmtree(self.staging, ignore_errors=True)


class PendingUpload:
    """One ``flush_async``: its staged files and the uploader's confirmations still owed.

    ``done()``/``wait()`` raise ``UploaderUnavailable`` while the uploader cannot confirm; the
    staged files are kept then, and ``retry()`` sends the same requests again.  Any other
    failure is final: the files are removed and every later call raises it again."""

    def __init__(self, sink: SparkSink | None, requests: list[dict], files: list[str]) -> None:
        self._sink = sink
        self._requests = requests
        self._files = files
        self._ids: set[int] = set()
        self._errors: list[UploadReply] = []
        self._unavailable: UploaderUnavailable | None = None   # kept files, waiting for retry()
        self._failure: BaseException | None = None
        self.finished = not requests

    @classmethod
    def confirmed(cls) -> "PendingUpload":
        return cls(None, [], [])

    def send(self) -> None:
        """Send every request (again); an unreachable uploader is remembered, not raised, so
        the worker hears of it from ``done()`` like any other unconfirmed upload."""
        self._unavailable = None
        self._errors = []
        try:
            self._ids = self._sink.client.send(self._requests)
        except UploaderUnavailable as exc:
            self._unavailable = exc

    def retry(self) -> None:
        """Send the kept batch again (after ``UploaderUnavailable``)."""
        if self._failure is not None:
            raise self._failure
        missing = [f for f in self._files if not os.path.exists(f)]
        if missing:
            self._fail(SparkUploadError(f"the staged batch {missing[0]} is gone; the records are read again"))
        self._sink._refuse_if_closed("retry an upload of")
        self.send()
        if self._unavailable is not None:
            raise self._unavailable   # still unreachable: the worker stays paused

    def done(self) -> bool:
        """True once every batch is confirmed; raises if the upload failed.  Never blocks."""
        return self._advance(0.0)

    def wait(self) -> None:
        """Block until confirmed (at most the upload timeout); raise if it failed."""
        timeout = self._sink.client.timeout if self._sink is not None else 0.0
        if not self._advance(timeout):
            self._unavailable = UploaderUnavailable(
                f"the Spark uploader did not confirm the upload within {timeout:.0f}s")
            self._sink.client.close()   # a late confirmation must not be read as the next one
            raise self._unavailable

    def _advance(self, timeout_s: float) -> bool:
        if self._failure is not None:
            raise self._failure
        if self.finished:
            return True
        if self._unavailable is not None:
            raise self._unavailable
        try:
            self._sink.client.collect(self._ids, self._errors, timeout_s)
        except UploaderUnavailable as exc:
            self._unavailable = exc
            raise
        if self._errors:
            reply = self._errors[0]
            if reply.refused:
                self._fail(SparkRefused(f"the Spark upload was refused for good: {reply.error or 'unknown error'}",
                                        target=self._sink.output, fix=reply.fix or ""))
            if reply.transient:
                # The job failed (Spark's master or executors, say), not the batch: try again.
                self._unavailable = UploaderUnavailable(f"the Spark upload failed: {reply.error}")
                self._sink.client.close()   # the other replies of this attempt are moot
                raise self._unavailable
            self._fail(SparkUploadError(f"the Spark upload failed: {reply.error or 'unknown error'}"))
        if self._ids:
            return False
        self.finished = True
        _unlink_all(self._files)
        self._sink._confirmed(self._requests)
        return True

    def _fail(self, exc: BaseException) -> None:
        self._failure = exc
        self.finished = True
        _unlink_all(self._files)
        if self._sink is not None:
            self._sink.client.close()   # late confirmations must not be read as the next ones
        raise exc

    def abandon(self) -> None:
        if not self.finished:
            self._failure = SparkUploadError("the spark sink was closed before the upload was confirmed")
            self.finished = True
            _unlink_all(self._files)


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def stage_buffer(path: str, b: _Buffer) -> int:
    """Write a buffer's records to the staged file ``path``; return how many."""
    columns = (b.offsets, b.timestamps, b.timestamp_types, b.keys, b.values, b.headers)
    if b.reread:
        # Keep one row per offset (the records are the same: same partition, same offset).
        keep = sorted({offset: i for i, offset in enumerate(b.offsets)}.values())
        columns = tuple([c[i] for i in keep] for c in columns)
    return staged.write(path, b.topic, b.partition, *columns)


def _discard_dead_staging(root: str) -> None:
    """Staged files of dead workers: never confirmed, so never committed; the records will be
    read again from the committed offsets.  (An upload already under way may still finish; its
    manifest then makes the re-read records duplicates the uploader drops.)"""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        if not name.isdigit():
            continue
        try:
            os.kill(int(name), 0)
            continue  # still alive
        except ProcessLookupError:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except PermissionError:
            continue
