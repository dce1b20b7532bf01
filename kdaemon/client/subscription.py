"""Which partitions this consumer owns and where it stands in each: the SubscriptionState.

Positions are local (seed 004): they advance when ``poll`` hands records out — including past
records the header filter dropped and past control markers — and they are what gets committed.
A partition without a position is either waiting for its committed offset (group mode) or for a
reset through ListOffsets (``auto_offset_reset``, ``seek_to_beginning``/``seek_to_end``).  A
partition with a position may be *awaiting validation* (KIP-320, ``validation.py``): its leader
changed since the position was taken, and it is not fetched until the new leader confirmed that
its log still holds what we read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from .types import TopicPartition

EARLIEST = "earliest"
LATEST = "latest"


@dataclass(slots=True)
class PartitionState:
    position: int | None = None
    position_epoch: int | None = None   # leader epoch of the batch the position is in or after
    # (leader id, leader epoch) the position was last checked against (Java's currentLeader);
    # None after a seek, so the next check records it (and validates if position_epoch is known).
    position_leader: tuple[int, int] | None = None
    awaiting_validation: bool = False
    validation_in_flight: bool = False
    next_validation_attempt: float = 0.0
    paused: bool = False
    reset_strategy: str | None = None    # EARLIEST / LATEST while a ListOffsets reset is wanted
    awaiting_committed: bool = False     # group mode: OffsetFetch before any reset
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    preferred_read_replica: int | None = None
    preferred_read_replica_expiry: float = 0.0
    reset_in_flight: bool = False
    next_reset_attempt: float = 0.0

    @property
    def has_valid_position(self) -> bool:
        return self.position is not None and self.reset_strategy is None and not self.awaiting_validation

    def lag(self, read_committed: bool) -> int | None:
        end = self.last_stable_offset if read_committed else self.high_watermark
        if self.position is None or end < 0:
            return None
        return max(0, end - self.position)


class SubscriptionState:
    def __init__(self, default_reset: str) -> None:
        self.default_reset = default_reset
        self._assignment: dict[TopicPartition, PartitionState] = {}
        self.subscribed_topics: set[str] = set()
        self.subscribed_pattern: re.Pattern | None = None
        self.user_assigned = False
        self.assignment_version = 0
        # Bumped by every seek and assignment change: the validator re-checks positions against
        # their leaders only when this or the metadata version moved.
        self.positions_version = 0

    # -- assignment -----------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment: keep the state of partitions that stay, drop the others."""
        if self.subscribed_topics or self.subscribed_pattern is not None:
            raise ValueError("assign() cannot be mixed with subscribe(); call unsubscribe() first")
        self.user_assigned = True
        self._set_assignment(partitions)

    def set_group_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        self._set_assignment(partitions)

    def _set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        new: dict[TopicPartition, PartitionState] = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            new[tp] = self._assignment.get(tp) or PartitionState()
        self._assignment = new
        self.assignment_version += 1
        self.positions_version += 1

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | re.Pattern | None = None) -> None:
        if self.user_assigned:
            raise ValueError("subscribe() cannot be mixed with assign(); call unsubscribe() first")
        if (topics is None) == (pattern is None):
            raise ValueError("subscribe() takes either topics or pattern")
        if pattern is not None:
            self.subscribed_pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
            self.subscribed_topics = set()
        else:
            topics = [topics] if isinstance(topics, str) else list(topics)
            self.subscribed_topics = set(topics)
            self.subscribed_pattern = None

    def unsubscribe(self) -> None:
        self.subscribed_topics = set()
        self.subscribed_pattern = None
        self.user_assigned = False
        self._assignment = {}
        self.assignment_version += 1

    @property
    def has_subscription(self) -> bool:
        return bool(self.subscribed_topics) or self.subscribed_pattern is not None

    def assigned(self) -> list[TopicPartition]:
        return list(self._assignment)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._assignment

    def state(self, tp: TopicPartition) -> PartitionState:
        try:
            return self._assignment[tp]
        except KeyError:
            raise ValueError(f"partition {tp} is not assigned to this consumer") from None

    def all_consumed(self) -> dict[TopicPartition, tuple[int, int | None]]:
        """{tp: (position, epoch)} of every partition whose position may be committed (Java's
        ``allConsumed``): one with a valid position, not one still resetting, waiting for its
        committed offset, or awaiting validation — an unvalidated position may lie past the end
        of a truncated log."""
        return {tp: (st.position, st.position_epoch) for tp, st in self.items()
                if st.has_valid_position and not st.awaiting_committed}

    def items(self):
        return self._assignment.items()

    def topics(self) -> set[str]:
        return {tp.topic for tp in self._assignment}

    # -- positions ------------------------------------------------------------------------------

    def seek(self, tp: TopicPartition, offset: int, epoch: int | None = None) -> None:
        if offset < 0:
            raise ValueError(f"seek offset must be >= 0, got {offset}")
        st = self.state(tp)
        st.position = offset
        st.position_epoch = epoch
        st.reset_strategy = None
        st.awaiting_committed = False
        st.reset_in_flight = False
        st.position_leader = None
        st.awaiting_validation = False
        st.validation_in_flight = False
        self.positions_version += 1

    def request_reset(self, tp: TopicPartition, strategy: str | None = None) -> None:
        st = self.state(tp)
        st.reset_strategy = strategy or self.default_reset
        st.reset_in_flight = False
        st.awaiting_validation = False
        st.validation_in_flight = False
        st.next_reset_attempt = 0.0

    def fetchable(self) -> list[TopicPartition]:
        return [tp for tp, st in self._assignment.items() if not st.paused and st.has_valid_position]

    def needing_position(self) -> list[TopicPartition]:
        return [tp for tp, st in self._assignment.items()
                if st.position is None and st.reset_strategy is None and not st.awaiting_committed]

    def needing_validation(self, now: float) -> list[TopicPartition]:
        return [tp for tp, st in self._assignment.items()
                if st.awaiting_validation and not st.validation_in_flight and now >= st.next_validation_attempt]

    def needing_reset(self) -> list[TopicPartition]:
        return [tp for tp, st in self._assignment.items() if st.reset_strategy is not None]

    def all_positions(self) -> dict[TopicPartition, int]:
        return {tp: st.position for tp, st in self._assignment.items() if st.position is not None}

    def pause(self, tp: TopicPartition) -> None:
        self.state(tp).paused = True

    def resume(self, tp: TopicPartition) -> None:
        self.state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self._assignment.items() if st.paused}
