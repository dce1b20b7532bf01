"""The uploader's SparkSession, started in a thread of its own.

Starting Spark takes 10-20 s here.  Meanwhile the uploader reads requests and answers resume
questions (they need only the output's files).  With direct writes (``writer.py``) the session
starts only when a job needs it (``process.Uploader._write_rows``), and that job waits for it.
"""

from __future__ import annotations

import threading

from .writer import SparkStartError, SparkWriter, first_line


class SessionStart:
    def __init__(self, writer: SparkWriter) -> None:
        self._writer = writer
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._start, name="spark-session-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self._writer.start()
        except BaseException as exc:   # handed to the serving thread (``failure``)
            self._failed.append(exc)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def failure(self) -> SparkStartError | None:
        """Why the start failed (once it ended), as a SparkStartError; None if it did not."""
        if not self._failed:
            return None
        exc = self._failed[0]
        return exc if isinstance(exc, SparkStartError) else SparkStartError(first_line(exc))

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
