"""Errors the client raises to its caller.

``BrokerError`` (from the protocol layer) covers error codes a broker returned; the classes
here are conditions the client itself concludes.  All derive from ``KafkaClientError`` so a
caller can catch the family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..protocol.errors import BrokerError, Errors, error_code

__all__ = ["KafkaClientError", "KafkaTimeoutError", "NoBrokersAvailableError", "AuthenticationError",
           "NoOffsetForPartitionError", "OffsetOutOfRangeError", "LogTruncationError", "UnknownTopicError",
           "ConsumerClosedError", "WakeupError", "ConnectionFailedError", "BrokerError",
           "RecordTooLargeError", "CommitFailedError", "RebalanceInProgressError",
           "FencedInstanceIdError", "GroupError", "RefusedError", "RecordsRefusedError", "Refusal",
           "REFUSALS", "RECORD", "TOPIC", "RefusedRecord", "refusal", "refusal_fix", "topic_refused",
           "missing_topic"]


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


class RefusedError(KafkaClientError):
    """A broker refused for good: the same request cannot succeed until an operator changes the
    topic, an ACL or a setting (``fix`` says what).  ``topic`` is the topic refused (None: the
    cluster), ``code`` the Kafka error code (None: concluded from a Metadata answer)."""

    retriable = False

    def __init__(self, message: str, *, topic: str | None = None, code: int | None = None, fix: str = "") -> None:
        super().__init__(message)
        self.topic = topic
        self.code = code
        self.fix = fix


class UnknownTopicError(RefusedError):
    """A topic does not exist (a producer's topic, or a consumer's with ``unknown_topic='error'``)."""


@dataclass(frozen=True)
class RefusedRecord:
    """One record a broker refused, with what the producer's caller tagged it with (``send(tag=)``)."""

    tag: Any
    topic: str
    size: int


class RecordsRefusedError(RefusedError):
    """Records a broker refused for what they are (too large for the topic, invalid); every other
    record of the flush was acknowledged.  The producer goes on: the refused records are dropped
    from it, and sending them again would be refused again."""

    def __init__(self, message: str, records: Sequence[RefusedRecord], *, topic: str, code: int, fix: str) -> None:
        super().__init__(message, topic=topic, code=code, fix=fix)
        self.records = list(records)


# -- the Kafka error codes a producer cannot get past -------------------------------------------

RECORD = "record"   # the record can never be written to this topic as it is
TOPIC = "topic"     # nothing can be written to this topic (or cluster) as things are


@dataclass(frozen=True)
class Refusal:
    refuses: str    # RECORD or TOPIC
    fix: str        # what an operator changes; ``{topic}`` and ``{servers}`` are filled in


# What a final answer with one of these codes refuses, for a producer, and the fix.  This is the
# one table: the producer (kdaemon/client/producer.py) retries every code the protocol's table
# (kdaemon/protocol/errors.py, Kafka's own classification) calls retriable, and for any other
# raises ``RecordsRefusedError`` (RECORD) or ``RefusedError`` (TOPIC; a code not listed refuses
# the topic too); the Kafka DLQ turns those into the sinks' one permanent error, and the worker
# stops or applies its policy.  UNKNOWN_TOPIC_OR_PARTITION and TOPIC_AUTHORIZATION_FAILED are
# final when a Metadata answer says so (``missing_topic``, ``topic_refused``); in a Produce answer
# the first is retriable (stale metadata, a leader that moved) and the Metadata answer that
# follows decides.
_KAFKA_CONFIGS = "kafka-configs --bootstrap-server {servers} --alter --entity-type topics --entity-name {topic}"
REFUSALS: dict[int, Refusal] = {
    Errors.MESSAGE_TOO_LARGE: Refusal(RECORD, "raise the topic's max.message.bytes above the record's size ("
                                      f"{_KAFKA_CONFIGS} --add-config max.message.bytes=<bytes>), or keep such "
                                      "records out of it"),
    Errors.RECORD_LIST_TOO_LARGE: Refusal(RECORD, "raise the topic's segment.bytes above the record's size ("
                                          f"{_KAFKA_CONFIGS} --add-config segment.bytes=<bytes>)"),
    Errors.INVALID_RECORD: Refusal(RECORD, "the broker's validation refuses the record (a compacted topic "
                                   "needs a key on every record): write such records elsewhere"),
    Errors.INVALID_TIMESTAMP: Refusal(RECORD, "the topic's message.timestamp.before.max.ms / "
                                      "message.timestamp.after.max.ms refuse its timestamp"),
    Errors.UNKNOWN_TOPIC_OR_PARTITION: Refusal(
        TOPIC, "create it: kafka-topics --bootstrap-server {servers} --create --topic {topic} --partitions <n> "
               "--replication-factor <n> (kdaemon's producer never creates topics)"),
    Errors.TOPIC_AUTHORIZATION_FAILED: Refusal(TOPIC, "grant the producer's principal WRITE and DESCRIBE on "
                                               "topic {topic} (kafka-acls --add --producer --topic {topic})"),
    Errors.CLUSTER_AUTHORIZATION_FAILED: Refusal(TOPIC, "grant the producer's principal IDEMPOTENT_WRITE on the "
                                                 "cluster (kafka-acls --add --producer --idempotent)"),
    Errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Refusal(TOPIC, "grant the producer's principal WRITE on "
                                                          "transactional ids"),
    Errors.INVALID_TOPIC_EXCEPTION: Refusal(TOPIC, "{topic} cannot be written to (an invalid name, or an "
                                            "internal topic): name another topic"),
    Errors.INVALID_REQUIRED_ACKS: Refusal(TOPIC, "the cluster refuses acks=all"),
    Errors.INVALID_CONFIG: Refusal(TOPIC, "the broker refuses the request's settings: see its log"),
    Errors.POLICY_VIOLATION: Refusal(TOPIC, "the cluster's policy refuses the write: see the broker's log"),
    Errors.UNSUPPORTED_FOR_MESSAGE_FORMAT: Refusal(TOPIC, "the topic's message format is too old for an idempotent "
                                                   "producer: raise its message.format.version"),
    Errors.UNSUPPORTED_COMPRESSION_TYPE: Refusal(TOPIC, "the broker cannot take this compression: choose another "
                                                 "(none, gzip, snappy, lz4, zstd)"),
}


def refusal(code: int) -> Refusal | None:
    """What ``code`` refuses for good, or None when it may go away (retriable in Kafka's table;
    a non-retriable code not listed refuses the topic, with the broker's message as the fix)."""
    found = REFUSALS.get(code)
    if found is None and code != Errors.NONE and not error_code(code).retriable:
        found = Refusal(TOPIC, "see the broker's log")
    return found


def topic_refused(topic: str, code: int, servers: Sequence[str], detail: str = "") -> RefusedError:
    """The error a producer raises when ``code`` refuses ``topic`` (or the whole cluster)."""
    fix = refusal_fix(code, topic, servers)
    if code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
        return missing_topic(topic, servers)
    text = f"{error_code(code).name} ({code})"
    return RefusedError(f"the cluster at {','.join(servers)} refuses writes to topic {topic}: {text}"
                        f"{': ' + detail if detail else ''}", topic=topic, code=code, fix=fix)


def missing_topic(topic: str, servers: Sequence[str]) -> UnknownTopicError:
    """Topic ``topic`` does not exist on the cluster at ``servers`` (a Metadata answer said so)."""
    return UnknownTopicError(f"topic {topic} does not exist on the cluster at {','.join(servers)}",
                             topic=topic, code=Errors.UNKNOWN_TOPIC_OR_PARTITION,
                             fix=refusal_fix(Errors.UNKNOWN_TOPIC_OR_PARTITION, topic, servers))


def refusal_fix(code: int, topic: str, servers: Sequence[str]) -> str:
    """The fix ``code``'s refusal names, for ``topic`` on the cluster at ``servers`` ("" if none)."""
    found = refusal(code)
    return "" if found is None else found.fix.format(topic=topic, servers=",".join(servers))


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


class InvalidRecordStateError(KafkaClientError):
    """An acknowledgement of a share group's record could not be applied (Java's
    ``InvalidRecordStateException``): the record is no longer held by this member.  Either the
    broker said so (INVALID_RECORD_STATE: the acquisition lock had run out and the record went
    back to the group, maybe to another member), or the lock was known to have run out before
    the acknowledgement was sent, and it was not sent.  Whoever holds the record now settles
    it; this member's verdict is not applied."""


class AcknowledgementError(KafkaClientError):
    """A share consumer's acknowledgements were used against its mode or its records (Java's
    ``IllegalStateException``): ``acknowledge`` under implicit acknowledgement, of a record not
    delivered by the last ``poll``; ``poll`` in explicit mode with records of the last poll
    still unacknowledged (they can still be acknowledged)."""
