"""A consumer stand-in for the worker's unit tests in tests/worker: one partition whose
records the test hands out ``PER_POLL`` at a time, and whose commits are checked against what
the test's sink made durable at the moment of the commit (the delivery rule)."""

from __future__ import annotations

from kdaemon.client.errors import WakeupError
from kdaemon.client.types import ConsumerRecord, OffsetAndMetadata, TopicPartition

TOPIC = "t"
TP = TopicPartition(TOPIC, 0)
PER_POLL = 10


class ScriptedConsumer:
    """One partition of ``total`` records, ``PER_POLL`` per poll; commits are checked against
    what the sinks made durable at the moment of the commit."""

    def __init__(self, total: int, durable: set[int]) -> None:
        self.total = total
        self.position = 0
        self.paused = False
        self.durable = durable
        self.commits: list[int] = []
        self.timeouts: list[int] = []   # what each poll was given

    def positions(self):
        return {TP: self.position}

    def poll(self, timeout_ms):
        self.timeouts.append(timeout_ms)
        if self.paused or self.position >= self.total:
            return {}
        start, self.position = self.position, min(self.total, self.position + PER_POLL)
        return {TP: [ConsumerRecord(TOPIC, 0, o, 0, 0, b"k", b"v%d" % o, [], None)
                     for o in range(start, self.position)]}

    def group_state(self):
        return None   # assigned by hand, not a group member

    def reachability(self):
        return True, None

    def missing_topics(self):
        return set()

    def assignment(self):
        return {TP}

    def yield_poll(self):
        self.yields = getattr(self, "yields", 0) + 1

    def pause(self, *tps):
        self.paused = True

    def resume(self, *tps):
        self.paused = False

    def seek(self, tp, offset):
        self.position = offset

    def committed(self, tps, timeout_ms=None):
        last = OffsetAndMetadata(self.commits[-1]) if self.commits else None
        return {tp: last for tp in tps}

    def wakeup(self):
        self.woken = True

    def commit(self, offsets):
        if getattr(self, "woken", False):
            self.woken = False   # as the real consumer: a pending wakeup is raised once, then cleared
            raise WakeupError("poll interrupted by wakeup()")
        offset = offsets[TP].offset
        missing = set(range(offset)) - self.durable
        assert not missing, f"committed {offset} with offsets {sorted(missing)[:5]}... not durable"
        self.commits.append(offset)

    def close(self, timeout_ms=None, group_membership=None):
        self.closed_with = group_membership
