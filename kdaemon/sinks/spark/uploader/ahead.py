"""Rows built ahead of their job: the batches a worker staged early, parsed while it reads on.

Why: a worker stages its buffers before a flush when they pass the sink's share of its memory
(``staging.SparkSink._spill``), and sends them with the flush.  Building a direct job's rows
(``arrow_rows.job_rows``: the JSON values parsed, the headers made a map) is most of the job,
and the job is on the reader's path: a worker waits for its flush before the next one, and a
partition's next owner waits for its previous owner's upload (``resume.py``).  With a hint
(``wire.PrepareHint``) sent at each spill, the uploader builds those rows on a thread of its
own while the worker is still reading: on two cores one is mostly idle then (measured in
bench/spark/peer.py's warm Iceberg run: an upload of 90,000 rows took 0.75 s with the rows
built in the job).

What is built is only a head start, never a decision: a job uses a batch's built rows when it
writes the whole batch (no rows dropped as already in the output, ``fresh.inspect_batch``) and
builds them itself otherwise, as it does for a batch that was not hinted, not yet built, or
whose build failed (the job meets the same failure and handles it as before).  A staged file
is written once under a name never used again, so rows built from it are that batch's rows.
Memory is bounded by ``MAX_BYTES``: past it, hints are let go and jobs build as before.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger("kdaemon.spark.uploader")

# The rows held ahead of their jobs, in Arrow bytes: 64 MiB is about 250,000 rows of the
# benchmarks' 200-byte JSON values, two workers' batches of 100,000 records.
MAX_BYTES = 64 << 20


class RowsAhead:
    """The batches hinted by the workers, built one at a time on one thread (``build``: a
    staged file's path to its job rows, or an exception), by connection so that a worker that
    goes away takes its hints with it."""

    def __init__(self, build: Callable[[str], object], max_bytes: int = MAX_BYTES) -> None:
        self._build = build
        self.max_bytes = max_bytes
        self._pool: ThreadPoolExecutor | None = None
        # staged file -> (connection, its size in bytes, its build)
        self._ahead: dict[str, tuple[object, int, Future]] = {}
        self.skipped = 0   # hints let go at the cap (counted, for tests)

    def hint(self, conn: object, files: list[str]) -> None:
        """Start building ``files`` (a worker's connection ``conn``), unless held already or past
        the cap."""
        for path in files:
            if path in self._ahead:
                continue
            held = self.held_bytes
            if held >= self.max_bytes:
                self.skipped += 1
                log.debug("not building %s ahead: %d bytes of rows are held ahead already", path, held)
                continue
            try:
                size = os.path.getsize(path)
            except OSError:   # gone already: its worker rewound; the job, if any, says so
                continue
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rows-ahead")
            self._ahead[path] = (conn, size, self._pool.submit(self._build, path))

    def take(self, path: str):
        """The rows built for ``path`` (waiting for a build under way), or None where there are
        none: not hinted, not started yet (then never: the job builds them), or failed."""
        entry = self._ahead.pop(path, None)
        if entry is None:
            return None
        future = entry[2]
        if future.cancel():
            return None
        future.exception()   # waits for a build under way
        return _result(future)

    def forget(self, paths) -> None:
        """Let go of what was built for ``paths`` (a job's files, used or not)."""
        for path in paths:
            self.take(path)

    def forget_connection(self, conn: object) -> None:
        """A worker went away: its hinted files are nobody's job now."""
        self.forget([p for p, (c, _, _) in self._ahead.items() if c is conn])

    @property
    def held_bytes(self) -> int:
        """The built rows' bytes, and for a build not finished its staged file's size."""
        held = 0
        for _, size, future in self._ahead.values():
            rows = _result(future) if future.done() else None
            held += rows.nbytes if rows is not None else size
        return held

    def __len__(self) -> int:
        return len(self._ahead)

    def close(self) -> None:
        self.forget(list(self._ahead))
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def _result(future: Future):
    """A finished build's rows, or None if it was cancelled or failed (the job that wants the
    batch builds it itself, and meets the failure there)."""
    if future.cancelled() or future.exception() is not None:
        return None
    return future.result()
