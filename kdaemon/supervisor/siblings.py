"""Telling a daemon's other workers that the group changed, so they ask the coordinator now.

Under the consumer protocol (KIP-848) a member learns its new target assignment only from a
ConsumerGroupHeartbeat answer, ``group.consumer.heartbeat.interval.ms`` (5 s by default) after
its last one, and the coordinator computes a new target at most every
``group.consumer.assignment.interval.ms`` (1 s by default, Kafka 4.4).  When a second worker
joins, the first hears that it must give partitions up only at its next heartbeat, and the
newcomer hears that they are free only at *its* next one: a daemon starting two workers ran on
one for 5-10 s, and a replaced worker waited as long (bench/spark_peer.py; the live Prometheus
test).  The supervisor sees each change first, in the workers' heartbeats (a member joined, or
took a new assignment: its generation changed), and sends ``SIBLING_SIGNAL`` to the others at
once and again ``AGAIN_AFTER_S`` later (once the coordinator's next target is out); a worker
that receives it heartbeats at once (``Worker.group_news`` → ``Consumer.heartbeat_soon``).
Under the classic protocol the same poke makes a member see a rebalance at once.

A worker ignores the signal until its handler is installed (``child.run_child``), and the
supervisor sends it only to workers that told their member id, so no signal reaches a process
that would die of it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable

SIBLING_SIGNAL = signal.SIGUSR1
# Kafka 4.4's default group.consumer.assignment.interval.ms (1 s), and some slack: the second
# poke finds the target the coordinator computed after the change.
AGAIN_AFTER_S = 1.5


class Pokes:
    """The pokes due: ``news(now)`` pokes at once and schedules one more; ``tick(now)`` sends
    it.  ``targets()`` names the workers to poke then (their pids), read when each is sent."""

    def __init__(self, targets: Callable[[], Iterable[int]]) -> None:
        self.targets = targets
        self.again_at: float | None = None

    def news(self, now: float, exclude: int) -> None:
        poke(pid for pid in self.targets() if pid != exclude)
        self.again_at = now + AGAIN_AFTER_S

    def tick(self, now: float) -> None:
        if self.again_at is not None and now >= self.again_at:
            self.again_at = None
            poke(self.targets())


def poke(pids: Iterable[int]) -> None:
    """Send ``SIBLING_SIGNAL`` to each of ``pids`` (a process already gone is skipped)."""
    for pid in pids:
        try:
            os.kill(pid, SIBLING_SIGNAL)
        except ProcessLookupError:
            pass
