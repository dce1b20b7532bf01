"""What a worker says while its sink cannot take records: little, and what an operator needs.

A sink goes down for hours in real life (a Spark cluster upgrade, a full disk).  Logging every
failed attempt buried the one line that mattered and, at a few seconds between probes, filled
the journal; saying nothing left an operator guessing why the lag grows.  So a stall is told
three ways:

* one WARNING when it starts (the first failed write or flush), with the reason;
* a summary every ``SUMMARY_EVERY_S`` while it lasts: for how long, how many attempts, the last
  reason (each attempt in between is DEBUG);
* one INFO when it ends (the first write or flush that made records durable again).

``down_for()`` feeds the worker's heartbeat (the supervisor's STATUS= line) and its metrics.
The stall's start and end are decided by ``kdaemon.worker.delivery``; this class only words
them and keeps the clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..durations import duration

log = logging.getLogger("kdaemon.worker.delivery")

SUMMARY_EVERY_S = 60.0


class StallWatch:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.since: float | None = None
        self.attempts = 0
        self.reason = ""
        self._next_summary = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def down_for(self) -> float:
        """Seconds since the stall started; 0 when the sink is fine."""
        return 0.0 if self.since is None else max(0.0, self._clock() - self.since)

    def failed(self, reason: str, doing: str, next_try_s: float) -> None:
        """One more failed attempt; the first one starts the stall.  ``doing`` says what the
        worker does about it ("the batch is held; every partition is paused")."""
        now = self._clock()
        self.attempts += 1
        self.reason = reason
        if self.since is None:
            self.since = now
            self._next_summary = now + SUMMARY_EVERY_S
            log.warning("sink unavailable (%s): %s; trying again in %.1fs, and as soon as the sink answers",
                        reason, doing, next_try_s)
            return
        log.debug("sink still unavailable (%s); next try in %.1fs", reason, next_try_s)
        self.summarize(now)

    def summarize(self, now: float | None = None) -> None:
        """The periodic summary, if one is due (also called while nothing is attempted)."""
        now = self._clock() if now is None else now
        if self.since is None or now < self._next_summary:
            return
        self._next_summary = now + SUMMARY_EVERY_S
        log.warning("sink still unavailable after %s (%d failed attempt(s); last: %s); every partition "
                    "stays paused and nothing is committed until it is back",
                    duration(now - self.since), self.attempts, self.reason)

    def ended(self) -> None:
        """Records were made durable again."""
        if self.since is None:
            return
        log.info("sink available again after %s (%d failed attempt(s)); consuming again",
                 duration(self._clock() - self.since), self.attempts)
        self.since = None
        self.attempts = 0
        self.reason = ""
