"""The one definition of what workers and the Spark uploader say to each other.

A worker (``staging.UploaderClient``) connects to the uploader's Unix socket and writes one
``UploadRequest`` per staged batch, a JSON line each; the uploader (``uploader.Uploader``)
answers each with one ``UploadReply`` once the batch is in the output, or failed.  A worker
given partitions asks with a ``ResumeQuery`` where they may start; the ``UploadReply`` to it
carries ``resume``.  Several requests may be in flight on one connection; ``id`` pairs a reply
with its request.  A ``PrepareHint`` names batches staged ahead of their flush, whose rows the
uploader may build meanwhile (``uploader/ahead.py``); it has no reply.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from .tables.layout import BatchId

if TYPE_CHECKING:
    from .settings import SparkSettings


def sink_state_dir(settings: SparkSettings, state_dir: str) -> str:
    """The spark sink's state directory: ``[sink] state_dir`` if set, else the daemon's.  Workers
    and the uploader both derive the socket and the staging root from it, so they agree."""
    return os.path.abspath(settings.state_dir or state_dir)


def socket_path(settings: SparkSettings, state_dir: str) -> str:
    """Where the uploader of the daemon with this state directory listens (unless ``[sink]
    socket`` says otherwise)."""
    return settings.socket or os.path.join(sink_state_dir(settings, state_dir), "spark-uploader.sock")


def staging_root(settings: SparkSettings, state_dir: str) -> str:
    """Where workers stage batches, one directory per worker process (named by its pid); the
    uploader's hold directory (``held-<owner>``, see ``uploader.Uploader.upload``) is beside them."""
    return os.path.join(sink_state_dir(settings, state_dir), "spark-staging")


@dataclass(frozen=True)
class UploadRequest:
    """Upload the staged batch ``file`` (``staged.py``): ``rows`` records of ``topic`` /
    ``partition``, offsets ``first`` .. ``last`` (inclusive)."""

    id: int
    file: str
    topic: str
    partition: int
    first: int
    last: int
    rows: int

    @property
    def batch(self) -> BatchId:
        return BatchId(self.partition, self.first, self.last)

    def encode(self) -> bytes:
        return json.dumps(dict(asdict(self), op="upload")).encode() + b"\n"

    @classmethod
    def decode(cls, msg: dict) -> "UploadRequest":
        """From a parsed line; ValueError, KeyError or TypeError name what is missing or wrong."""
        op = msg.get("op", "upload")
        if op != "upload":
            raise ValueError(f"unknown op {op!r}")
        return cls(int(msg["id"]), str(msg["file"]), str(msg["topic"]), int(msg["partition"]),
                   int(msg["first"]), int(msg["last"]), int(msg["rows"]))


@dataclass(frozen=True)
class ResumeQuery:
    """A worker was given these partitions of ``topic`` and would start reading them at
    ``positions`` (partition -> offset, the group's commit): where may it start instead?  The
    uploader answers between jobs, once the batches queued before the question are in, with
    the first offset from each position on that is not known to be in the output
    (``resume.resume_point``): Kafka Connect's ``SinkTask.open`` and ``context.offset()``."""

    id: int
    topic: str
    positions: dict[int, int]

    def encode(self) -> bytes:
        return json.dumps({"op": "resume", "id": self.id, "topic": self.topic,
                           "positions": {str(p): o for p, o in self.positions.items()}}).encode() + b"\n"

    @classmethod
    def decode(cls, msg: dict) -> "ResumeQuery":
        positions = msg["positions"]
        if not isinstance(positions, dict):
            raise TypeError(f"positions is a JSON object, not {type(positions).__name__}")
        return cls(int(msg["id"]), str(msg["topic"]), {int(p): int(o) for p, o in positions.items()})


@dataclass(frozen=True)
class PrepareHint:
    """The worker staged ``files`` ahead of its next flush, which will ask for their upload:
    their rows may be built meanwhile.  A hint only: no reply, and nothing depends on it."""

    files: list[str]

    def encode(self) -> bytes:
        return json.dumps({"op": "prepare", "files": self.files}).encode() + b"\n"

    @classmethod
    def decode(cls, msg: dict) -> "PrepareHint":
        files = msg["files"]
        if not isinstance(files, list):
            raise TypeError(f"files is a JSON array, not {type(files).__name__}")
        return cls([str(f) for f in files])


def decode_request(msg: dict) -> "UploadRequest | ResumeQuery | PrepareHint":
    """A parsed request line, by its ``op`` (``upload`` if absent); ValueError, KeyError or
    TypeError name what is missing or wrong."""
    op = msg.get("op")
    if op == "resume":
        return ResumeQuery.decode(msg)
    if op == "prepare":
        return PrepareHint.decode(msg)
    return UploadRequest.decode(msg)


@dataclass(frozen=True)
class UploadReply:
    """The batch of request ``id`` is in the output (``ok``), or ``error`` says why not.
    ``transient``: the job failed, not this batch (Spark's master or executors): the worker
    keeps the staged file and sends it again; otherwise the batch itself cannot be uploaded
    (its file unreadable) and the worker reads its records again.  ``refused``: the output
    refuses the job for good (``failures.py``: a deterministic failure, again and again, or a
    JVM linkage error); ``fix`` says what to change, and the worker stops the daemon.
    ``resume``: the answer to a ``ResumeQuery`` (partition -> offset)."""

    id: int
    ok: bool
    error: str | None = None
    transient: bool = False
    resume: dict[int, int] | None = None
    refused: bool = False
    fix: str | None = None

    def encode(self) -> bytes:
        msg: dict = {"id": self.id, "ok": self.ok}
        if self.error:
            msg["error"] = self.error
        if self.transient:
            msg["transient"] = True
        if self.refused:
            msg["refused"] = True
            msg["fix"] = self.fix or ""
        if self.resume is not None:
            msg["resume"] = {str(p): o for p, o in self.resume.items()}
        return json.dumps(msg).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> "UploadReply":
        msg = json.loads(line)
        if not isinstance(msg, dict) or "id" not in msg or "ok" not in msg:
            raise ValueError(f"not an upload reply: {line[:200]!r}")
        resume = msg.get("resume")
        return cls(int(msg["id"]), bool(msg["ok"]), msg.get("error"), bool(msg.get("transient", False)),
                   None if resume is None else {int(p): int(o) for p, o in resume.items()},
                   bool(msg.get("refused", False)), msg.get("fix"))


def parse_line(line: bytes) -> dict:
    """A line as a JSON object (ValueError otherwise): the uploader reads the ``id`` of a
    request it cannot decode from it, to answer with the error."""
    msg = json.loads(line)
    if not isinstance(msg, dict):
        raise ValueError(f"a request is a JSON object, not {type(msg).__name__}")
    return msg


@dataclass(eq=False)
class Request:
    """An ``UploadRequest`` as the uploader holds it until its job ends: the connection to answer
    on, when it came, and the Parquet file the job reads (made from the staged ``file``)."""

    conn: socket.socket | None
    id: int
    file: str
    topic: str
    batch: BatchId
    rows: int
    error: str | None = None
    received: float = field(default_factory=time.monotonic)
    held: str | None = None      # the Parquet file the job reads, made from ``file``
