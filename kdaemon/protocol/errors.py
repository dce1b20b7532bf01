"""Errors raised by the protocol layer, and the table of Kafka error codes.

Two families, kept apart on purpose:

* ``ProtocolError`` and its subclasses mean *the bytes were wrong* (a short frame, a corrupt
  record batch, a correlation-id mismatch).  Nothing retries these blindly.
* ``BrokerError`` carries an error code a broker put in a well-formed response.  Each code has a
  name and a ``retriable`` flag taken from Kafka's own classification, so callers decide on the
  flag rather than on lists of numbers scattered through the client.
"""

from __future__ import annotations

from dataclasses import dataclass


class ProtocolError(Exception):
    """Base of every error raised while encoding or decoding Kafka bytes."""


class DecodeError(ProtocolError):
    """Bytes from the network do not follow the message spec (short read, bad length, bad UTF-8)."""


class EncodeError(ProtocolError):
    """A value handed to the encoder does not fit the spec (wrong type, out of range)."""


class FrameTooLargeError(ProtocolError):
    """A size prefix announces a frame larger than the configured maximum.

    Raised before any buffer of that size is allocated: a hostile or confused peer must not be
    able to make us reserve gigabytes with four bytes.
    """


class CorrelationMismatchError(ProtocolError):
    """A response's correlation id is not the one of the oldest request in flight.

    Kafka answers requests on one connection strictly in order, so a mismatch means the stream
    is out of sync; the only safe reaction is to close the connection.
    """


class UnsupportedVersionError(ProtocolError):
    """No version of an API is supported by both this client and the broker."""


class CorruptRecordError(ProtocolError):
    """A record batch or legacy message set failed validation.

    Names where it happened so an operator can find the batch with other tools
    (``kafka-dump-log``) and decide whether to skip it.
    """

    def __init__(self, reason: str, *, topic: str | None = None, partition: int | None = None,
                 offset: int | None = None) -> None:
        self.reason = reason
        self.topic = topic
        self.partition = partition
        self.offset = offset
        where = []
        if topic is not None:
            where.append(f"topic={topic}")
        if partition is not None:
            where.append(f"partition={partition}")
        if offset is not None:
            where.append(f"offset={offset}")
        super().__init__(f"corrupt record batch ({', '.join(where) or 'location unknown'}): {reason}")

    def located(self, topic: str, partition: int) -> "CorruptRecordError":
        """Return a copy that names topic and partition, for errors raised below that knowledge."""
        return CorruptRecordError(self.reason, topic=topic, partition=partition, offset=self.offset)


class UnsupportedCodecError(CorruptRecordError):
    """A batch names a compression codec this build cannot decode."""


@dataclass(frozen=True, slots=True)
class ErrorCode:
    code: int
    name: str
    retriable: bool
    message: str


# (code, NAME, retriable, message) as classified by Kafka's org.apache.kafka.common.protocol.Errors.
_TABLE: tuple[tuple[int, str, bool, str], ...] = (
    (-1, "UNKNOWN_SERVER_ERROR", False, "The server experienced an unexpected error when processing the request."),
    (0, "NONE", False, "No error."),
    (1, "OFFSET_OUT_OF_RANGE", False, "The requested offset is not within the range of offsets maintained by the server."),
    (2, "CORRUPT_MESSAGE", True, "The message contents does not match the message CRC or the message is otherwise corrupt."),
    (3, "UNKNOWN_TOPIC_OR_PARTITION", True, "This server does not host this topic-partition."),
    (4, "INVALID_FETCH_SIZE", False, "The requested fetch size is invalid."),
    (5, "LEADER_NOT_AVAILABLE", True, "There is no leader for this topic-partition as we are in the middle of a leadership election."),
    (6, "NOT_LEADER_OR_FOLLOWER", True, "For requests intended only for the leader, this error indicates that the broker is not the current leader."),
    (7, "REQUEST_TIMED_OUT", True, "The request timed out."),
    (8, "BROKER_NOT_AVAILABLE", False, "The broker is not available."),
    (9, "REPLICA_NOT_AVAILABLE", True, "The replica is not available for the requested topic-partition."),
    (10, "MESSAGE_TOO_LARGE", False, "The request included a message larger than the max message size the server will accept."),
    (11, "STALE_CONTROLLER_EPOCH", False, "The controller moved to another broker."),
    (12, "OFFSET_METADATA_TOO_LARGE", False, "The metadata field of the offset request was too large."),
    (13, "NETWORK_EXCEPTION", True, "The server disconnected before a response was received."),
    (14, "COORDINATOR_LOAD_IN_PROGRESS", True, "The coordinator is loading and hence can't process requests."),
    (15, "COORDINATOR_NOT_AVAILABLE", True, "The coordinator is not available."),
    (16, "NOT_COORDINATOR", True, "This is not the correct coordinator."),
    (17, "INVALID_TOPIC_EXCEPTION", False, "The request attempted to perform an operation on an invalid topic."),
    (18, "RECORD_LIST_TOO_LARGE", False, "The request included message batch larger than the configured segment size on the server."),
    (19, "NOT_ENOUGH_REPLICAS", True, "Messages are rejected since there are fewer in-sync replicas than required."),
    (20, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True, "Messages are written to the log, but to fewer in-sync replicas than required."),
    (21, "INVALID_REQUIRED_ACKS", False, "Produce request specified an invalid value for required acks."),
    (22, "ILLEGAL_GENERATION", False, "Specified group generation id is not valid."),
    (23, "INCONSISTENT_GROUP_PROTOCOL", False, "The group member's supported protocols are incompatible with those of existing members."),
    (24, "INVALID_GROUP_ID", False, "The configured groupId is invalid."),
    (25, "UNKNOWN_MEMBER_ID", False, "The coordinator is not aware of this member."),
    (26, "INVALID_SESSION_TIMEOUT", False, "The session timeout is not within the range allowed by the broker."),
    (27, "REBALANCE_IN_PROGRESS", False, "The group is rebalancing, so a rejoin is needed."),
    (28, "INVALID_COMMIT_OFFSET_SIZE", False, "The committing offset data size is not valid."),
    (29, "TOPIC_AUTHORIZATION_FAILED", False, "Topic authorization failed."),
    (30, "GROUP_AUTHORIZATION_FAILED", False, "Group authorization failed."),
    (31, "CLUSTER_AUTHORIZATION_FAILED", False, "Cluster authorization failed."),
    (32, "INVALID_TIMESTAMP", False, "The timestamp of the message is out of acceptable range."),
    (33, "UNSUPPORTED_SASL_MECHANISM", False, "The broker does not support the requested SASL mechanism."),
    (34, "ILLEGAL_SASL_STATE", False, "Request is not valid given the current SASL state."),
    (35, "UNSUPPORTED_VERSION", False, "The version of API is not supported."),
    (36, "TOPIC_ALREADY_EXISTS", False, "Topic with this name already exists."),
    (37, "INVALID_PARTITIONS", False, "Number of partitions is below 1."),
    (38, "INVALID_REPLICATION_FACTOR", False, "Replication factor is below 1 or larger than the number of available brokers."),
    (39, "INVALID_REPLICA_ASSIGNMENT", False, "Replica assignment is invalid."),
    (40, "INVALID_CONFIG", False, "Configuration is invalid."),
    (41, "NOT_CONTROLLER", True, "This is not the correct controller for this cluster."),
    (42, "INVALID_REQUEST", False, "This most likely occurs because of a request being malformed by the client library or the message was sent to an incompatible broker."),
    (43, "UNSUPPORTED_FOR_MESSAGE_FORMAT", False, "The message format version on the broker does not support the request."),
    (44, "POLICY_VIOLATION", False, "Request parameters do not satisfy the configured policy."),
    (45, "OUT_OF_ORDER_SEQUENCE_NUMBER", False, "The broker received an out of order sequence number."),
    (46, "DUPLICATE_SEQUENCE_NUMBER", False, "The broker received a duplicate sequence number."),
    (47, "INVALID_PRODUCER_EPOCH", False, "Producer attempted to produce with an old epoch."),
    (48, "INVALID_TXN_STATE", False, "The producer attempted a transactional operation in an invalid state."),
    (49, "INVALID_PRODUCER_ID_MAPPING", False, "The producer attempted to use a producer id which is not currently assigned to its transactional id."),
    (50, "INVALID_TRANSACTION_TIMEOUT", False, "The transaction timeout is larger than the maximum value allowed by the broker."),
    (51, "CONCURRENT_TRANSACTIONS", True, "The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing."),
    (52, "TRANSACTION_COORDINATOR_FENCED", False, "Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator for a given producer."),
    (53, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", False, "Transactional Id authorization failed."),
    (54, "SECURITY_DISABLED", False, "Security features are disabled."),
    (55, "OPERATION_NOT_ATTEMPTED", False, "The broker did not attempt to execute this operation."),
    (56, "KAFKA_STORAGE_ERROR", True, "Disk error when trying to access log file on the disk."),
    (57, "LOG_DIR_NOT_FOUND", False, "The user-specified log directory is not found in the broker config."),
    (58, "SASL_AUTHENTICATION_FAILED", False, "SASL Authentication failed."),
    (59, "UNKNOWN_PRODUCER_ID", False, "This exception is raised by the broker if it could not locate the producer metadata associated with the producerId in question."),
    (60, "REASSIGNMENT_IN_PROGRESS", False, "A partition reassignment is in progress."),
    (61, "DELEGATION_TOKEN_AUTH_DISABLED", False, "Delegation Token feature is not enabled."),
    (62, "DELEGATION_TOKEN_NOT_FOUND", False, "Delegation Token is not found on server."),
    (63, "DELEGATION_TOKEN_OWNER_MISMATCH", False, "Specified Principal is not valid Owner/Renewer."),
    (64, "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED", False, "Delegation Token requests are not allowed on PLAINTEXT/1-way SSL channels and on delegation token authenticated channels."),
    (65, "DELEGATION_TOKEN_AUTHORIZATION_FAILED", False, "Delegation Token authorization failed."),
    (66, "DELEGATION_TOKEN_EXPIRED", False, "Delegation Token is expired."),
    (67, "INVALID_PRINCIPAL_TYPE", False, "Supplied principalType is not supported."),
    (68, "NON_EMPTY_GROUP", False, "The group is not empty."),
    (69, "GROUP_ID_NOT_FOUND", False, "The group id does not exist."),
    (70, "FETCH_SESSION_ID_NOT_FOUND", True, "The fetch session ID was not found."),
    (71, "INVALID_FETCH_SESSION_EPOCH", True, "The fetch session epoch is invalid."),
    (72, "LISTENER_NOT_FOUND", True, "There is no listener on the leader broker that matches the listener on which metadata request was processed."),
    (73, "TOPIC_DELETION_DISABLED", False, "Topic deletion is disabled."),
    (74, "FENCED_LEADER_EPOCH", True, "The leader epoch in the request is older than the epoch on the broker."),
    (75, "UNKNOWN_LEADER_EPOCH", True, "The leader epoch in the request is newer than the epoch on the broker."),
    (76, "UNSUPPORTED_COMPRESSION_TYPE", False, "The requesting client does not support the compression type of given partition."),
    (77, "STALE_BROKER_EPOCH", False, "Broker epoch has changed."),
    (78, "OFFSET_NOT_AVAILABLE", True, "The leader high watermark has not caught up from a recent leader election so the offsets cannot be guaranteed to be monotonically increasing."),
    (79, "MEMBER_ID_REQUIRED", False, "The group member needs to have a valid member id before actually entering a consumer group."),
    (80, "PREFERRED_LEADER_NOT_AVAILABLE", True, "The preferred leader was not available."),
    (81, "GROUP_MAX_SIZE_REACHED", False, "The consumer group has reached its max size."),
    (82, "FENCED_INSTANCE_ID", False, "The broker rejected this static consumer since another consumer with the same group.instance.id has registered with a different member.id."),
    (83, "ELIGIBLE_LEADERS_NOT_AVAILABLE", True, "Eligible topic partition leaders are not available."),
    (84, "ELECTION_NOT_NEEDED", True, "Leader election not needed for topic partition."),
    (85, "NO_REASSIGNMENT_IN_PROGRESS", False, "No partition reassignment is in progress."),
    (86, "GROUP_SUBSCRIBED_TO_TOPIC", False, "Deleting offsets of a topic is forbidden while the consumer group is actively subscribed to it."),
    (87, "INVALID_RECORD", False, "This record has failed the validation on broker and hence will be rejected."),
    (88, "UNSTABLE_OFFSET_COMMIT", True, "There are unstable offsets that need to be cleared."),
    (89, "THROTTLING_QUOTA_EXCEEDED", True, "The throttling quota has been exceeded."),
    (90, "PRODUCER_FENCED", False, "There is a newer producer with the same transactionalId which fences the current one."),
    (91, "RESOURCE_NOT_FOUND", False, "A request illegally referred to a resource that does not exist."),
    (92, "DUPLICATE_RESOURCE", False, "A request illegally referred to the same resource twice."),
    (93, "UNACCEPTABLE_CREDENTIAL", False, "Requested credential would not meet criteria for acceptability."),
    (94, "INCONSISTENT_VOTER_SET", False, "Indicates that the either the sender or recipient of a voter-only request is not one of the expected voters."),
    (95, "INVALID_UPDATE_VERSION", False, "The given update version was invalid."),
    (96, "FEATURE_UPDATE_FAILED", False, "Unable to update finalized features due to an unexpected server error."),
    (97, "PRINCIPAL_DESERIALIZATION_FAILURE", False, "Request principal deserialization failed during forwarding."),
    (98, "SNAPSHOT_NOT_FOUND", False, "Requested snapshot was not found."),
    (99, "POSITION_OUT_OF_RANGE", False, "Requested position is not greater than or equal to zero, and less than the size of the snapshot."),
    (100, "UNKNOWN_TOPIC_ID", True, "This server does not host this topic ID."),
    (101, "DUPLICATE_BROKER_REGISTRATION", False, "This broker ID is already in use."),
    (102, "BROKER_ID_NOT_REGISTERED", False, "The given broker ID was not registered."),
    (103, "INCONSISTENT_TOPIC_ID", True, "The log's topic ID did not match the topic ID in the request."),
    (104, "INCONSISTENT_CLUSTER_ID", False, "The clusterId in the request does not match that found on the server."),
    (105, "TRANSACTIONAL_ID_NOT_FOUND", False, "The transactionalId could not be found."),
    (106, "FETCH_SESSION_TOPIC_ID_ERROR", True, "The fetch session encountered inconsistent topic ID usage."),
    (107, "INELIGIBLE_REPLICA", False, "The new ISR contains at least one ineligible replica."),
    (108, "NEW_LEADER_ELECTED", False, "The AlterPartition request successfully updated the partition state but the leader has changed."),
    (109, "OFFSET_MOVED_TO_TIERED_STORAGE", False, "The requested offset is moved to tiered storage."),
    (110, "FENCED_MEMBER_EPOCH", False, "The member epoch is fenced by the group coordinator. The member must abandon all its partitions and rejoin."),
    (111, "UNRELEASED_INSTANCE_ID", False, "The instance ID is still used by another member in the consumer group. That member must leave first."),
    (112, "UNSUPPORTED_ASSIGNOR", False, "The assignor or its version range is not supported by the consumer group."),
    (113, "STALE_MEMBER_EPOCH", False, "The member epoch is stale. The member must retry after receiving its updated member epoch via the ConsumerGroupHeartbeat API."),
    (114, "MISMATCHED_ENDPOINT_TYPE", False, "The request was sent to an endpoint of the wrong type."),
    (115, "UNSUPPORTED_ENDPOINT_TYPE", False, "This endpoint type is not supported yet."),
    (116, "UNKNOWN_CONTROLLER_ID", False, "This controller ID is not known."),
    (117, "UNKNOWN_SUBSCRIPTION_ID", False, "Client sent a push telemetry request with an invalid or outdated subscription ID."),
    (118, "TELEMETRY_TOO_LARGE", False, "Client sent a push telemetry request larger than the maximum size the broker will accept."),
    (119, "INVALID_REGISTRATION", False, "The controller has considered the broker registration to be invalid."),
    (120, "TRANSACTION_ABORTABLE", False, "The server encountered an error with the transaction. The client can abort the transaction to continue using this transactional ID."),
    (121, "INVALID_RECORD_STATE", False, "The record state is invalid. The acknowledgement of delivery could not be completed."),
    (122, "SHARE_SESSION_NOT_FOUND", True, "The share session was not found."),
    (123, "INVALID_SHARE_SESSION_EPOCH", True, "The share session epoch is invalid."),
    (124, "FENCED_STATE_EPOCH", False, "The coordinator rejected the request because the state epoch did not match."),
    (125, "INVALID_VOTER_KEY", False, "The voter key doesn't match the receiving replica's key."),
    (126, "DUPLICATE_VOTER", False, "The voter is already part of the set of voters."),
    (127, "VOTER_NOT_FOUND", False, "The voter is not part of the set of voters."),
    (128, "INVALID_REGULAR_EXPRESSION", False, "The regular expression is not valid."),
    (129, "REBOOTSTRAP_REQUIRED", False, "Client metadata is stale. The client should rebootstrap to obtain new metadata."),
    (130, "STREAMS_INVALID_TOPOLOGY", False, "The supplied topology is invalid."),
    (131, "STREAMS_INVALID_TOPOLOGY_EPOCH", False, "The supplied topology epoch is invalid."),
    (132, "STREAMS_TOPOLOGY_FENCED", False, "The supplied topology epoch is outdated."),
    (133, "SHARE_SESSION_LIMIT_REACHED", True, "The limit of share sessions has been reached."),
    (134, "GROUP_DELETION_FAILED", False, "DeleteGroups could not complete; see the error message on the per-group result for details."),
    (135, "STREAMS_TOPOLOGY_DESCRIPTION_UPDATE_FAILED", False, "The broker could not process the topology description update; see the error message for details."),
)

ERROR_CODES: dict[int, ErrorCode] = {c: ErrorCode(c, n, r, m) for c, n, r, m in _TABLE}


def error_code(code: int) -> ErrorCode:
    """Look a code up; a code newer than this table still gets a usable (non-retriable) entry."""
    found = ERROR_CODES.get(code)
    if found is None:
        found = ErrorCode(code, f"UNKNOWN_ERROR_CODE_{code}", False, "An error code this client does not know.")
    return found


class BrokerError(Exception):
    """A broker answered with a non-zero error code.

    ``retriable`` says whether the same request may succeed later without the caller changing
    anything (possibly after a metadata refresh or coordinator rediscovery).
    """

    def __init__(self, code: int, context: str = "", detail: str | None = None) -> None:
        self.error = error_code(code)
        self.code = code
        self.context = context
        self.detail = detail
        text = f"{self.error.name} ({code})"
        if context:
            text = f"{context}: {text}"
        text += f": {detail or self.error.message}"
        super().__init__(text)

    @property
    def name(self) -> str:
        return self.error.name

    @property
    def retriable(self) -> bool:
        return self.error.retriable


class Errors:
    """Named constants for the codes the client branches on, so code reads ``Errors.NOT_COORDINATOR``."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    REPLICA_NOT_AVAILABLE = 9
    MESSAGE_TOO_LARGE = 10
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    INVALID_TOPIC_EXCEPTION = 17
    RECORD_LIST_TOO_LARGE = 18
    NOT_ENOUGH_REPLICAS = 19
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    INVALID_REQUIRED_ACKS = 21
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    TOPIC_AUTHORIZATION_FAILED = 29
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_TIMESTAMP = 32
    UNSUPPORTED_SASL_MECHANISM = 33
    ILLEGAL_SASL_STATE = 34
    UNSUPPORTED_VERSION = 35
    TOPIC_ALREADY_EXISTS = 36
    INVALID_PARTITIONS = 37
    INVALID_REPLICATION_FACTOR = 38
    INVALID_REPLICA_ASSIGNMENT = 39
    INVALID_CONFIG = 40
    NOT_CONTROLLER = 41
    UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
    POLICY_VIOLATION = 44
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    SASL_AUTHENTICATION_FAILED = 58
    UNKNOWN_PRODUCER_ID = 59
    GROUP_ID_NOT_FOUND = 69
    FETCH_SESSION_ID_NOT_FOUND = 70
    INVALID_FETCH_SESSION_EPOCH = 71
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75
    UNSUPPORTED_COMPRESSION_TYPE = 76
    OFFSET_NOT_AVAILABLE = 78
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82
    INVALID_RECORD = 87
    UNSTABLE_OFFSET_COMMIT = 88
    PRODUCER_FENCED = 90
    UNKNOWN_TOPIC_ID = 100
    INCONSISTENT_TOPIC_ID = 103
    FETCH_SESSION_TOPIC_ID_ERROR = 106
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    STALE_MEMBER_EPOCH = 113
    # share groups (KIP-932)
    INVALID_REQUEST = 42
    NON_EMPTY_GROUP = 68
    INVALID_RECORD_STATE = 121
    SHARE_SESSION_NOT_FOUND = 122
    INVALID_SHARE_SESSION_EPOCH = 123
    FENCED_STATE_EPOCH = 124
    SHARE_SESSION_LIMIT_REACHED = 133
    # client telemetry (KIP-714)
    THROTTLING_QUOTA_EXCEEDED = 89
    UNKNOWN_SUBSCRIPTION_ID = 117
    TELEMETRY_TOO_LARGE = 118
