"""Errors the client raises to its caller.

``BrokerError`` (from the protocol layer) covers error codes a broker returned; the classes
here are conditions the client itself concludes.  All derive from ``KafkaClientError`` so a
caller can catch the family.
"""

from __future__ import annotations

from ..protocol.errors import BrokerError

__all__ = ["KafkaClientError", "KafkaTimeoutError", "NoBrokersAvailableError", "AuthenticationError",
           "NoOffsetForPartitionError", "OffsetOutOfRangeError", "LogTruncationError", "UnknownTopicError",
           "ConsumerClosedError", "WakeupError", "ConnectionFailedError", "BrokerError",
           "RecordTooLargeError", "CommitFailedError", "RebalanceInProgressError",
           "FencedInstanceIdError", "GroupError"]


class KafkaClientError(Exception):
    """Base for errors raised by kdaemon.client."""


class KafkaTimeoutError(KafkaClientError):
    """An operation did not complete within its timeout."""


class ConnectionFailedError(KafkaClientError):
    """A connection to a broker failed or was lost; requests on it are failed with this."""

    retriable = True


class NoBrokersAvailableError(KafkaTimeoutError):
    """None of the bootstrap servers could be reached within the timeout."""


class AuthenticationError(KafkaClientError):
    """The broker rejected our credentials or TLS identity.  Permanent: never retried."""

    retriable = False


class NoOffsetForPartitionError(KafkaClientError):
    """A partition has no committed offset and ``auto_offset_reset`` is ``none``."""

    def __init__(self, partitions) -> None:
        self.partitions = set(partitions)
        names = ", ".join(sorted(str(tp) for tp in self.partitions))
        super().__init__(f"no committed offset and auto_offset_reset='none' for: {names}")


class OffsetOutOfRangeError(KafkaClientError):
    """The position is outside the log and ``auto_offset_reset`` is ``none``."""

    def __init__(self, offsets) -> None:
        self.offsets = dict(offsets)
        names = ", ".join(f"{tp}@{off}" for tp, off in sorted(self.offsets.items()))
        super().__init__(f"fetch position out of range and auto_offset_reset='none': {names}")


class LogTruncationError(OffsetOutOfRangeError):
    """The log was truncated under our position (an unclean leader election, KIP-320) and
    ``auto_offset_reset`` is ``none``.

    ``offsets`` maps each partition to our position; ``divergent_offsets`` to the first offset
    the new leader's log no longer agrees with (an ``OffsetAndMetadata`` carrying that offset's
    leader epoch), or ``None`` when the leader could not say.  Records from there up to our
    position were consumed but are gone or different now.  ``seek`` to the divergent offset to
    read what the log holds now, or anywhere else; until then the partition is not fetched.
    """

    def __init__(self, truncations) -> None:
        truncations = dict(truncations)
        self.offsets = {tp: position for tp, (position, _) in truncations.items()}
        self.divergent_offsets = {tp: divergent for tp, (_, divergent) in truncations.items()}
        parts = []
        for tp, (position, divergent) in sorted(truncations.items()):
            if divergent is None:
                parts.append(f"{tp} at offset {position} (the leader does not know the epoch of "
                             f"our last record: the divergent offset is unknown)")
            else:
                parts.append(f"{tp} at offset {position}, divergent offset {divergent.offset} "
                             f"(leader epoch {divergent.leader_epoch})")
        KafkaClientError.__init__(
            self, "log truncation detected and auto_offset_reset='none': " + "; ".join(parts)
            + "; seek() to go on")


class UnknownTopicError(KafkaClientError):
    """A topic does not exist (raised when ``unknown_topic='error'``)."""


class RecordTooLargeError(KafkaClientError):
    """A broker returned only part of a batch even though it is the first batch of the fetch."""


class ConsumerClosedError(KafkaClientError):
    """The consumer was used after ``close()``."""


class WakeupError(KafkaClientError):
    """Raised by a blocking call interrupted by ``wakeup()`` from another thread."""


class CommitFailedError(KafkaClientError):
    """The commit cannot succeed: the group rebalanced and this member's partitions may now
    belong to another member.  The records since the last commit may be delivered again."""


class RebalanceInProgressError(KafkaClientError):
    """A commit hit a rebalance in progress; poll() again to finish it, then commit."""

    retriable = True


class FencedInstanceIdError(KafkaClientError):
    """Another member joined with this ``group_instance_id``: this consumer is fenced for good."""


class GroupError(KafkaClientError):
    """The group refused this member for a reason retrying will not fix (authorization,
    inconsistent protocols, invalid session timeout, group full)."""
