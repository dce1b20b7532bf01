"""Small value types shared by the client and everything above it."""

from __future__ import annotations

from typing import NamedTuple

from ..protocol.records import ConsumerRecord, CREATE_TIME, LOG_APPEND_TIME, NO_TIMESTAMP_TYPE

__all__ = ["TopicPartition", "OffsetAndMetadata", "OffsetAndTimestamp", "ConsumerRecord",
           "CREATE_TIME", "LOG_APPEND_TIME", "NO_TIMESTAMP_TYPE"]


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
