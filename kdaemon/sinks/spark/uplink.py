"""A worker's connection to the Spark uploader (``uploader.py``): upload requests and resume
questions out, replies back, one Unix socket, the lines ``wire.py`` defines."""

from __future__ import annotations

import socket
import time

from ...plugins.types import SinkRefused, SinkUnavailable
from .wire import PrepareHint, ResumeQuery, UploadReply, UploadRequest


class SparkUploadError(Exception):
    """The uploader did not confirm a batch: nothing of it may be committed."""


class SparkRefused(SparkUploadError, SinkRefused):
    """The uploader refused a batch for good (``wire.UploadReply.refused``): the output refuses
    the job as it is, and the worker stops the daemon."""


class UploaderUnavailable(SparkUploadError, SinkUnavailable):
    """The uploader could not be reached, went away before confirming, or its Spark job failed
    (a master down, say): the staged files are kept and ``PendingUpload.retry`` sends them
    again.  Re-sending a batch the uploader did write is harmless: its manifest says so."""


class UploaderClient:
    """One worker's connection to the uploader: ``wire.UploadRequest`` lines out,
    ``wire.UploadReply`` lines back."""

    def __init__(self, path: str, timeout_s: float) -> None:
        self.path = path
        self.timeout = timeout_s
        self._sock: socket.socket | None = None
        self._buf = b""
        self._next_id = 0
        self._replies: dict[int, UploadReply] = {}   # read, not yet claimed (``collect``, ``answer``)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(self.timeout)
            try:
                s.connect(self.path)
            except OSError as exc:
                s.close()
                raise UploaderUnavailable(f"the Spark uploader is not reachable at {self.path}: {exc.strerror or exc}") from None
            self._sock = s
        return self._sock

    def send(self, requests: list[dict]) -> set[int]:
        """Send upload requests (``UploadRequest`` fields but the id); return their ids for
        ``collect``."""
        sock = self._connect()
        ids, lines = set(), []
        for req in requests:
            self._next_id += 1
            ids.add(self._next_id)
            lines.append(UploadRequest(id=self._next_id, **req).encode())
        try:
            # One write: the uploader starts a job once every worker has asked, and a flush's
            # requests arriving in pieces were split over two jobs (the flush confirmed, and
            # committed, only after the second).
            sock.sendall(b"".join(lines))
        except OSError as exc:
            self.close()
            raise UploaderUnavailable(f"the Spark uploader did not take the upload: {exc}") from None
        return ids

    def collect(self, ids: set[int], errors: list[UploadReply], timeout_s: float) -> None:
        """Read confirmations for up to ``timeout_s`` (0: only what has arrived), removing the
        confirmed ids from ``ids`` and adding the replies that say a batch failed to ``errors``."""
        if self._sock is None:
            raise UploaderUnavailable("the connection to the Spark uploader was closed before it confirmed")
        deadline = time.monotonic() + timeout_s
        while True:
            for i in [i for i in ids if i in self._replies]:
                reply = self._replies.pop(i)
                ids.discard(i)
                if not reply.ok:
                    errors.append(reply)
            if not ids or not self._read(max(0.0, deadline - time.monotonic())):
                return

    def hint(self, files: list[str]) -> None:
        """Send a ``PrepareHint`` for ``files``, staged ahead of the next flush.  A hint the
        uploader cannot take is not an error of its own: the connection is closed, and the
        flush that sends these files meets the uploader's state and handles it."""
        try:
            sock = self._connect()
            sock.sendall(PrepareHint(files).encode())
        except UploaderUnavailable:
            pass
        except OSError:
            self.close()

    def ask(self, topic: str, positions: dict[int, int]) -> int:
        """Send a ``ResumeQuery``; its id, for ``answer``."""
        sock = self._connect()
        self._next_id += 1
        try:
            sock.sendall(ResumeQuery(self._next_id, topic, positions).encode())
        except OSError as exc:
            self.close()
            raise UploaderUnavailable(f"the Spark uploader did not take the question: {exc}") from None
        return self._next_id

    def answer(self, query_id: int) -> UploadReply | None:
        """The reply to question ``query_id`` if it has arrived (never blocks)."""
        if query_id not in self._replies and self._sock is not None:
            while self._read(0.0):
                pass
        return self._replies.pop(query_id, None)

    def _read(self, timeout_s: float) -> bool:
        """Read what arrives within ``timeout_s`` (0: only what has arrived) into the replies
        not yet claimed; False if nothing came.  Confirmations and answers share the
        connection, so whichever caller reads keeps the others' replies for them."""
        sock = self._sock
        try:
            # A timeout of 0 makes the socket non-blocking: only what has arrived is read.
            sock.settimeout(timeout_s)
            try:
                chunk = sock.recv(65536)
            except (BlockingIOError, TimeoutError):
                return False
            finally:
                sock.settimeout(self.timeout)
            if not chunk:
                raise UploaderUnavailable("the Spark uploader closed the connection before confirming")
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                reply = UploadReply.decode(line)
                self._replies[reply.id] = reply
            return True
        except (OSError, ValueError) as exc:
            self.close()
            raise UploaderUnavailable(f"the Spark uploader did not confirm the upload: {exc}") from None
        except SparkUploadError:
            self.close()
            raise

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buf = b""
        self._replies.clear()
