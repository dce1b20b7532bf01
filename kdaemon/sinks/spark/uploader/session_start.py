"""The uploader's SparkSession, started in a thread of its own.

Starting Spark takes 10-20 s here.  Meanwhile the uploader reads requests and answers resume
questions (they need only the output's files), and with direct writes (``writer.py``) it serves
whole jobs: Spark is needed only for a job the direct path does not write (Delta's checkpoints
are delta-rs's, written at the commit).  Then Spark starts at a lower CPU priority (``JVM_NICE``): on a small machine
its start competed with the workers reading the very backlog it was not needed for.  Linux keeps
the nice value per thread, and the JVM, launched by the starting thread, inherits that thread's.
"""

from __future__ import annotations

import os
import threading

from .writer import SparkStartError, SparkWriter, first_line

JVM_NICE = 10   # added to the uploader's own nice value


class SessionStart:
    def __init__(self, writer: SparkWriter, lower_priority: bool) -> None:
        self._writer = writer
        self._lower_priority = lower_priority
        self._failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._start, name="spark-session-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        if self._lower_priority:
            me = threading.get_native_id()
            try:
                os.setpriority(os.PRIO_PROCESS, me, min(19, os.getpriority(os.PRIO_PROCESS, me) + JVM_NICE))
            except OSError:
                pass
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
