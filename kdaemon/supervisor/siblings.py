"""Telling a daemon's other workers that the group changed, so that they ask the coordinator now.

Under the consumer protocol (KIP-848) a member learns its new target assignment only from a
ConsumerGroupHeartbeat answer, one ``group.consumer.heartbeat.interval.ms`` (5 s by default)
after its last one, and the coordinator computes a new target at most every
``group.consumer.assignment.interval.ms`` (1 s by default, Kafka 4.4).  When workers join, the
one holding everything hears that it must give partitions up only at its next heartbeat, and the
others hear that those are free only at *their* next one: a daemon of four workers ran on one
for 10 s after ``kdaemon run``, a TTIN's worker waited 5 s (bench/groups/spread.py).

The supervisor sees every such change first, in the workers' heartbeats: a worker joined or was
moved to a new target (its generation, the member epoch, changed), took partitions or gave them
up (the assignment it reports changed), or exited.  It then sends ``SIBLING_SIGNAL`` to the
other workers at once, and to every worker again every ``FOLLOW_EVERY_S`` until ``AGAIN_AFTER_S``
after the last news: the coordinator computes the target a change calls for at once only if its
last target is an assignment interval old (KIP-1263's batching), else when the interval ends, a
moment the supervisor cannot see (it began at a computation the workers heard of later, if at
all).  A reload rolling the workers just after a rebalance (0.2 s after, in the Spark peer
bench's warm run) waited 1.2 s for its new topic's partitions with a single poke at the end of
the window; the first poke of the series after the target finds it.  A worker that receives the
signal heartbeats at once (``Worker.group_news`` → ``Consumer.heartbeat_soon``); the news of
one loop turn are one poke.  Under the classic protocol the same poke makes a member see a
rebalance at once.  A heartbeat more is one the coordinator answers like any other: five per
worker per change.

A worker ignores the signal until its handler is installed (``child.run_child``), so no signal
reaches a process that would die of it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable

SIBLING_SIGNAL = signal.SIGUSR1
# Kafka 4.4's default group.consumer.assignment.interval.ms (1 s), and some slack: the last poke
# finds the target the coordinator computed at the end of the interval that began with the news.
AGAIN_AFTER_S = 1.2
# How often every worker is poked until then: a target computed within the window is found at
# most this late.
FOLLOW_EVERY_S = 0.25


class Pokes:
    """The pokes due.  ``news(pid)`` notes a change a worker reported (``pid`` None: one the
    supervisor saw itself, an exit); ``tick(now)`` sends what is due: at once after news, to every
    worker ``targets()`` names but the only one that reported it, and then to all of them every
    ``FOLLOW_EVERY_S`` until ``AGAIN_AFTER_S`` after the last news, the last poke exactly then
    (module docstring).  ``due_in(now)``: seconds until ``tick`` has something to send (None:
    nothing scheduled), for the supervisor's sleep."""

    def __init__(self, targets: Callable[[], Iterable[int]], *, kill: Callable[[int, int], None] = os.kill) -> None:
        self.targets = targets
        self._kill = kill
        self._reporters: set[int | None] = set()
        self.again_at: float | None = None     # the next poke of every worker
        self._until: float | None = None       # the last one: AGAIN_AFTER_S after the last news
        self.sent = 0   # signals sent, for the tests

    def news(self, pid: int | None) -> None:
        self._reporters.add(pid)

    def due_in(self, now: float) -> float | None:
        if self._reporters:
            return 0.0
        return None if self.again_at is None else max(0.0, self.again_at - now)

    def tick(self, now: float) -> None:
        if self._reporters:
            reporters, self._reporters = self._reporters, set()
            only = next(iter(reporters)) if len(reporters) == 1 else None
            self._poke(pid for pid in self.targets() if pid != only)
            self._until = now + AGAIN_AFTER_S
            if self.again_at is None:
                self.again_at = now + FOLLOW_EVERY_S
        elif self.again_at is not None and now >= self.again_at:
            self._poke(self.targets())
            self.again_at = None if now >= self._until else min(now + FOLLOW_EVERY_S, self._until)

    def _poke(self, pids: Iterable[int]) -> None:
        for pid in pids:
            try:
                self._kill(pid, SIBLING_SIGNAL)
            except ProcessLookupError:   # exited meanwhile: the reaper says so
                continue
            self.sent += 1
