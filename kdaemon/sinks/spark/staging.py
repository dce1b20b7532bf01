"""The worker side of the Spark sink: stage batches as Parquet, hand them to the uploader.

``write`` only buffers columns in memory.  ``flush`` (called by the worker when
``wants_flush`` says a batch is big or old enough, and before every commit) writes one staged
Parquet file per (topic, partition) batch under ``<state_dir>/spark-staging/<pid>/``, asks the
uploader to upload them all, and returns only when the uploader confirmed every one — so the
worker's commit right after it covers only records that are in the Spark output.  If the
uploader is down or Spark fails, ``flush`` raises; the worker then pauses, rebuilds the sink and
rewinds to its last commit, so nothing is staged without bound and nothing is lost.

The Spark output keeps the broker's raw key and value bytes (``value_format``/``value_schema``
on the uploader decide how values become columns); deserializers affect only interceptors.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from ...plugins.types import Record
from .layout import BatchId

STAGED_SCHEMA = pa.schema([
    ("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.int64()), ("timestamp_type", pa.int8()), ("key", pa.binary()),
    ("value", pa.binary()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])

SETTINGS = {"type", "master", "conf", "path", "table", "max_records", "max_bytes", "max_age_s",
            "value_format", "value_schema", "partition_by", "socket", "upload_timeout_s", "state_dir"}
VALUE_FORMATS = ("binary", "string", "json")
# Staged files live for one flush on local disk; zstd is as quick to write as lz4 here and a
# third of the size (measured with pyarrow 26 on 200-byte JSON values).
STAGING_COMPRESSION = "zstd"
PARTITION_COLUMNS = ("topic", "partition", "date", "timestamp_type")


def validate_settings(settings: dict) -> None:
    """Raise ValueError naming every problem with the ``[sink]`` settings of the spark sink.

    Workers and the uploader both call this, so a bad setting stops the daemon at boot instead
    of failing every upload."""
    problems = []
    unknown = set(settings) - SETTINGS
    if unknown:
        problems.append(f"unknown spark sink settings: {', '.join(sorted(unknown))} "
                        f"(known: {', '.join(sorted(SETTINGS - {'type'}))})")
    if not settings.get("path") and not settings.get("table"):
        problems.append("the spark sink needs `path` (Parquet output) or `table` (catalog table)")
    if settings.get("path") and settings.get("table"):
        problems.append("give the spark sink either `path` or `table`, not both")
    for name in ("max_records", "max_bytes", "max_age_s", "upload_timeout_s"):
        if name in settings:
            try:
                ok = float(settings[name]) > 0
            except (TypeError, ValueError):
                ok = False
            if not ok:
                problems.append(f"{name} must be a positive number, not {settings[name]!r}")
    value_format = settings.get("value_format", "json" if settings.get("value_schema") else "binary")
    if value_format not in VALUE_FORMATS:
        problems.append(f"value_format must be one of {', '.join(VALUE_FORMATS)}, not {value_format!r}")
    elif value_format == "json" and not settings.get("value_schema"):
        problems.append("value_format = \"json\" needs value_schema (a Spark DDL string such as "
                        "\"id BIGINT, type STRING\")")
    elif settings.get("value_schema") and value_format != "json":
        problems.append(f"value_schema is only used with value_format = \"json\", not {value_format!r}")
    if settings.get("value_schema") is not None and not isinstance(settings["value_schema"], str):
        problems.append("value_schema must be a Spark DDL string")
    partition_by = settings.get("partition_by", ["topic", "date"])
    if not isinstance(partition_by, (list, tuple)) or not all(c in PARTITION_COLUMNS for c in partition_by):
        problems.append(f"partition_by must be a list of columns among {', '.join(PARTITION_COLUMNS)}, "
                        f"not {partition_by!r}")
    if settings.get("conf") is not None and not isinstance(settings["conf"], dict):
        problems.append("conf must be a table of Spark settings")
    if problems:
        raise ValueError("; ".join(problems))


class SparkUploadError(Exception):
    """The uploader did not confirm a batch: nothing of it may be committed."""


def _as_bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    return json.dumps(v, separators=(",", ":")).encode("utf-8")


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


def socket_path(state_dir: str) -> str:
    return os.path.join(os.path.abspath(state_dir), "spark-uploader.sock")


class UploaderClient:
    """One worker's connection to the uploader: JSON lines both ways."""

    def __init__(self, path: str, timeout_s: float) -> None:
        self.path = path
        self.timeout = timeout_s
        self._sock: socket.socket | None = None
        self._buf = b""
        self._next_id = 0

    def _connect(self) -> socket.socket:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            try:
                s.connect(self.path)
            except OSError as exc:
                s.close()
                raise SparkUploadError(f"the Spark uploader is not reachable at {self.path}: {exc.strerror or exc}") from None
            self._sock = s
        return self._sock

    def upload(self, requests: list[dict]) -> None:
        """Send every request and wait for all confirmations; raise on the first failure."""
        sock = self._connect()
        ids = set()
        try:
            for req in requests:
                self._next_id += 1
                req = dict(req, op="upload", id=self._next_id)
                ids.add(self._next_id)
                sock.sendall(json.dumps(req).encode() + b"\n")
            errors = []
            deadline = time.monotonic() + self.timeout
            while ids:
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    raise SparkUploadError("the Spark uploader closed the connection before confirming")
                self._buf += chunk
                *lines, self._buf = self._buf.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    ids.discard(msg.get("id"))
                    if not msg.get("ok"):
                        errors.append(msg.get("error", "unknown error"))
            if errors:
                raise SparkUploadError(f"the Spark upload failed: {errors[0]}")
        except (OSError, ValueError) as exc:
            self.close()
            raise SparkUploadError(f"the Spark uploader did not confirm the upload: {exc}") from None
        except SparkUploadError:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""


class SparkSink:
    def __init__(self, settings: dict, state_dir: str, *, heartbeat_timeout_s: float | None = None) -> None:
        validate_settings(settings)
        self.max_records = int(settings.get("max_records", 100_000))
        self.max_bytes = int(settings.get("max_bytes", 64 * 1024 * 1024))
        self.max_age_s = float(settings.get("max_age_s", 10.0))
        state_dir = settings.get("state_dir", state_dir)
        self.staging = os.path.join(os.path.abspath(state_dir), "spark-staging", str(os.getpid()))
        _discard_dead_staging(os.path.dirname(self.staging))
        os.makedirs(self.staging, exist_ok=True)
        timeout = float(settings.get("upload_timeout_s", 300))
        if heartbeat_timeout_s:
            # A worker waiting for its upload sends no heartbeat to the supervisor, which kills
            # it after heartbeat_timeout_s.  Give up (and retry: a finished upload is then
            # found by its manifest) well before that.
            timeout = min(timeout, max(1.0, 0.8 * heartbeat_timeout_s))
        self.client = UploaderClient(settings.get("socket") or socket_path(state_dir), timeout)
        self._buffers: dict[tuple[str, int], _Buffer] = {}
        self._last_batch: dict[tuple[str, int], str] = {}
        self._seq = 0
        self._closed = False

    @classmethod
    def from_settings(cls, settings: dict, state_dir: str = "./var/kdaemon") -> "SparkSink":
        return cls(settings, state_dir)

    # -- the Sink interface ---------------------------------------------------------------------

    def _refuse_if_closed(self, action: str) -> None:
        # A closed sink lost its buffers: a flush that "succeeded" on it would let the worker
        # commit positions of records that never reached the uploader.
        if self._closed:
            raise SparkUploadError(f"cannot {action} a closed spark sink (its buffered records were dropped)")

    def write(self, records) -> None:
        self._refuse_if_closed("write to")
        now = time.monotonic()
        buffers = self._buffers
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
            k = r.raw_key if raw and r.raw_key is not None else _as_bytes(r.key)
            v = r.raw_value if raw and r.raw_value is not None else _as_bytes(r.value)
            offset = r.offset
            if offset <= b.last_offset:
                b.reread = True
            b.last_offset = offset
            b.offsets.append(offset)
            b.timestamps.append(r.timestamp)
            b.timestamp_types.append(r.timestamp_type)
            b.keys.append(k)
            b.values.append(v)
            b.headers.append(r.headers or ())   # (key, value) tuples: Arrow takes them as structs
            b.size += 64 + (len(k) if k else 0) + (len(v) if v else 0)

    def wants_flush(self) -> bool:
        now = time.monotonic()
        total_records = total_bytes = 0
        for b in self._buffers.values():
            total_records += len(b.offsets)
            total_bytes += b.size
            if now - b.started >= self.max_age_s:
                return True
        return total_records >= self.max_records or total_bytes >= self.max_bytes

    def flush(self) -> None:
        self._refuse_if_closed("flush")
        if not self._buffers:
            return
        requests, files = [], []
        try:
            for (topic, partition), b in sorted(self._buffers.items()):
                batch = BatchId(partition, min(b.offsets), max(b.offsets))
                self._seq += 1
                # Never the same name twice (Spark may cache a path's size), and the batch name
                # last: the uploader's Spark reads it from there.
                path = os.path.join(self.staging, f"{self._seq:08d}-{uuid.uuid4().hex[:12]}-{batch.name}.parquet")
                table = _staged_table(topic, partition, b)
                pq.write_table(table, path + ".tmp", compression=STAGING_COMPRESSION)
                os.replace(path + ".tmp", path)
                files.append(path)
                requests.append({"file": path, "topic": topic, "partition": partition,
                                 "first": batch.first, "last": batch.last, "rows": table.num_rows})
            self.client.upload(requests)
        finally:
            for path in files:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
        for req in requests:
            self._last_batch[(req["topic"], req["partition"])] = BatchId(req["partition"], req["first"], req["last"]).name
        self._buffers.clear()

    def commit_metadata(self, topic: str, partition: int) -> str:
        """Stored with every commit: ``spark:`` and the last batch this sink uploaded for the
        partition (``spark:`` alone if it uploaded none: only filtered records since)."""
        return f"spark:{self._last_batch.get((topic, partition), '')}"

    def close(self) -> None:
        self._closed = True
        self._buffers.clear()
        self.client.close()
        shutil.rmtree(self.staging, ignore_errors=True)


def _staged_table(topic: str, partition: int, b: _Buffer) -> pa.Table:
    n = len(b.offsets)
    table = pa.table({
        "topic": pa.array([topic] * n, pa.string()),
        "partition": pa.array([partition] * n, pa.int32()),
        "offset": pa.array(b.offsets, pa.int64()),
        "timestamp": pa.array(b.timestamps, pa.int64()),
        "timestamp_type": pa.array(b.timestamp_types, pa.int8()),
        "key": pa.array(b.keys, pa.binary()),
        "value": pa.array(b.values, pa.binary()),
        "headers": _headers_array(b.headers),
    }, schema=STAGED_SCHEMA)
    if b.reread:
        # Keep one row per offset (the records are the same: same partition, same offset).
        last_index = {offset: i for i, offset in enumerate(b.offsets)}
        table = table.take(pa.array(sorted(last_index.values()), pa.int64()))
    return table


def _headers_array(headers: list) -> pa.Array:
    t = STAGED_SCHEMA.field("headers").type
    try:
        return pa.array(headers, t)
    except (pa.ArrowException, TypeError, ValueError):
        # An interceptor handed over headers that are not (str, bytes) tuples: normalize.
        return pa.array([[(str(hk), _as_bytes(hv)) for hk, hv in h] for h in headers], t)


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
