"""Small value types shared by the client and everything above it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from ..protocol.records import ConsumerRecord, CREATE_TIME, LOG_APPEND_TIME, NO_TIMESTAMP_TYPE

__all__ = ["TopicPartition", "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecord",
           "CREATE_TIME", "LOG_APPEND_TIME", "NO_TIMESTAMP_TYPE", "GroupState"]


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class OffsetAndMetadata(NamedTuple):
    """A committed position: the offset of the *next* record to read, plus free-form metadata."""

    offset: int
    metadata: str = ""
    leader_epoch: int | None = None


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int | None = None


class GroupMembershipOperation(Enum):
    """What ``Consumer.close`` does with the group membership (Java's
    ``CloseOptions.GroupMembershipOperation``, KIP-1092).

    DEFAULT: a dynamic member leaves; a static member (``group_instance_id``) stays, so the
    same instance back within the session timeout gets its partitions back with nothing moved
    (classic: no LeaveGroup; consumer protocol: a leave with epoch -2).
    LEAVE_GROUP: leave for good, static members too (classic: LeaveGroup naming the instance
    id; consumer protocol: epoch -1), so the partitions move to the others at once instead of
    after the session timeout: for a member that is not coming back (a smaller pool).
    REMAIN_IN_GROUP: send no leave at all; the coordinator drops the member when its session
    times out."""

    DEFAULT = "default"
    LEAVE_GROUP = "leave"
    REMAIN_IN_GROUP = "remain"


@dataclass(frozen=True)
class GroupState:
    """What a subscribed group member knows of its group, as the layers above may read it
    (the worker's readiness, the rebalance counter in metrics) without reaching into the
    coordinator.  A snapshot: it does not change after it is taken."""

    group_id: str
    protocol: str             # the membership protocol: "classic" (JoinGroup/SyncGroup)
    member_id: str            # "" before the first join
    generation: int           # -1 before the first join
    leader_id: str | None     # the member that computed the assignment, as of the last join
    stable: bool              # joined and synced, holding its assignment, no rebalance pending
    rebalances: int           # completed rebalances since the consumer was created
