"""The Kafka client: connections, metadata, offsets, the Fetcher and the public ``Consumer``;
``ShareConsumer`` for share groups (KIP-932, ``share/``).

The only layer that touches sockets; it builds on ``kdaemon.protocol`` and nothing above it.
"""

from .config import ConsumerConfig
from .consumer import Consumer
from .errors import (AuthenticationError, ConsumerClosedError, KafkaClientError, KafkaTimeoutError,
                     LogTruncationError, NoBrokersAvailableError, NoOffsetForPartitionError,
                     OffsetOutOfRangeError, RecordTooLargeError, UnknownTopicError, WakeupError)
from .metrics import ConsumerMetrics, PartitionMetrics, ShareConsumerMetrics
from .share import AcknowledgeType, ShareConsumer, ShareRecord
from .types import ConsumerRecord, GroupMembershipOperation, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition

__all__ = ["Consumer", "ConsumerConfig", "ConsumerRecord", "TopicPartition", "OffsetAndMetadata",
           "OffsetAndTimestamp", "KafkaClientError", "KafkaTimeoutError", "NoBrokersAvailableError",
           "AuthenticationError", "NoOffsetForPartitionError", "OffsetOutOfRangeError", "LogTruncationError",
           "UnknownTopicError", "WakeupError", "ConsumerClosedError", "RecordTooLargeError",
           "ConsumerMetrics", "PartitionMetrics", "GroupMembershipOperation",
           "ShareConsumer", "ShareRecord", "AcknowledgeType", "ShareConsumerMetrics"]
