"""A worker's memory budget: ``[daemon] memory_budget_mb`` (80 by default) of RSS per worker.

What counts against it, and how each part is held under it:

* the fixed part: the interpreter, kdaemon, the plugins and the sink's libraries (a worker
  starts near 30 MB with either built-in sink; the Spark sink stages without pyarrow, which
  alone would add 30 MB).  Nothing bounds it but what is imported; ``MemoryWatch`` reports it
  at start.
* fetched data not yet handed to the pipeline: at most one fetch response in flight
  (``fetch_max_bytes``) plus what the fetcher holds ahead (``fetch_buffer_bytes``), both
  compressed bytes; each is capped at ``FETCH_SHARE`` of the budget unless ``[kafka]`` sets it.
* records in flight through the pipeline: one poll (``max_poll_records``, 500), decoded.
* records the sink holds in memory: the Spark sink's buffers until they are staged (its
  ``max_bytes``, capped at ``SINK_SHARE`` of the budget through ``SinkContext``); staged
  batches are on disk, not in memory.  The jsonl sink holds only its write buffer.
* while the sink is down the partitions are paused, so none of the above grows: the budget
  holds "whatever the backlog" because the backlog stays in Kafka.

Python and glibc keep freed memory for reuse rather than returning it to the system, so a
worker that once held a large batch can stay large although idle.  ``relieve()`` gives it back
(a garbage collection, glibc's ``malloc_trim``, pyarrow's pool): when a stall starts, and when
the RSS is found above the budget.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

MB = 1024 * 1024
FETCH_SHARE = 0.125     # of the budget, each: one response in flight, and the fetch-ahead buffer
SINK_SHARE = 0.125      # of the budget: a sink's buffered records before they are made durable
CHECK_EVERY_S = 1.0

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class MemoryShares:
    """The parts of a budget (bytes); all 0 without a budget."""

    budget: int
    fetch_max_bytes: int
    fetch_buffer_bytes: int
    sink_bytes: int

    @classmethod
    def of(cls, budget_mb: int) -> "MemoryShares":
        budget = max(0, int(budget_mb)) * MB
        return cls(budget, int(budget * FETCH_SHARE), int(budget * FETCH_SHARE), int(budget * SINK_SHARE))


def rss_bytes() -> int:
    """This process's resident set size now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):   # not glibc
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def relieve() -> None:
    """Give memory that is free but kept back to the system."""
    gc.collect()
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        try:
            pa.default_memory_pool().release_unused()
        except Exception:   # an old pyarrow without release_unused: nothing to give back
            pass
    _malloc_trim()


class MemoryWatch:
    """Checks the worker's RSS against the budget about once a second (a read of
    /proc/self/statm); above it, gives back what it can and says so once per excursion."""

    def __init__(self, budget_mb: int, *, clock: Callable[[], float] = time.monotonic,
                 read: Callable[[], int] = rss_bytes) -> None:
        self.budget = max(0, int(budget_mb)) * MB
        self._clock = clock
        self._read = read
        self._next = 0.0
        self._over = False
        self.peak = 0

    def started(self, what: str) -> None:
        """Report the fixed part once the worker is built (``what``: the sink type, say)."""
        rss = self._read()
        self.peak = max(self.peak, rss)
        if self.budget and rss > self.budget * 0.85:
            log.warning("the worker starts at %.0f MB RSS with %s, close to or above its memory budget of "
                        "%.0f MB ([daemon] memory_budget_mb): the budget leaves no room for records",
                        rss / MB, what, self.budget / MB)
        else:
            log.debug("worker RSS at start %.1f MB (%s); budget %.0f MB", rss / MB, what, self.budget / MB)

    def tick(self) -> None:
        if not self.budget:
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + CHECK_EVERY_S
        rss = self._read()
        self.peak = max(self.peak, rss)
        if rss <= self.budget:
            self._over = False
            return
        relieve()
        after = self._read()
        if after > self.budget and not self._over:
            self._over = True
            log.warning("worker RSS %.0f MB is above its memory budget of %.0f MB ([daemon] memory_budget_mb; "
                        "%.0f MB after giving back free memory): a [kafka] fetch size or a sink batch size "
                        "set above the budget's share?", rss / MB, self.budget / MB, after / MB)
