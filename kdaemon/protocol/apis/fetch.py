"""Fetch (key 1): records from partition leaders (or the preferred read replica, KIP-392).

Written from Kafka's ``FetchRequest.json`` / ``FetchResponse.json`` (Kafka 4.2: versions 4-18,
flexible from 12).  Versions 0-3 were removed in Kafka 4.0, so 4 is the floor.

Things that have bitten clients:

* v13 replaced topic names by topic ids, in the request *and* the response (and in
  ``forgotten_topics_data``).  At v13+ ``topic`` is absent (it decodes as ``""``); the caller maps
  ids back to names from Metadata.
* ``replica_id`` is a plain field only up to v14; from v15 it travels inside the tagged
  ``replica_state`` (KIP-903).  A consumer leaves both at their defaults (-1).
* ``high_watermark`` in the request (v18, KIP-1166) defaults to Long.MAX_VALUE, "not supported";
  a consumer must leave it there, so it is never written.
* The tagged ``current_leader`` of a partition and the tagged top-level ``node_endpoints`` (v16,
  KIP-951) tell a client where a moved partition went without a Metadata round trip.
* ``records`` is a RECORDS field: null or a (possibly truncated) run of record batches, decoded by
  the record-batch layer, not here.
"""

from ..schema import (INT8, INT16, INT32, INT64, RECORDS, STRING, UUID, Api, Array, Field,
                      Struct)

INT64_MAX = (1 << 63) - 1

FETCH_PARTITION = Struct(
    Field("partition", INT32),
    Field("current_leader_epoch", INT32, "9+", default=-1),
    Field("fetch_offset", INT64),
    Field("last_fetched_epoch", INT32, "12+", default=-1),
    Field("log_start_offset", INT64, "5+", default=-1),
    Field("partition_max_bytes", INT32),
    Field("replica_directory_id", UUID, "17+", tag=0),
    Field("high_watermark", INT64, "18+", tag=1, default=INT64_MAX),
    name="FetchPartition",
)

FETCH_TOPIC = Struct(
    Field("topic", STRING, "0-12"),
    Field("topic_id", UUID, "13+"),
    Field("partitions", Array(FETCH_PARTITION)),
    name="FetchTopic",
)

FORGOTTEN_TOPIC = Struct(
    Field("topic", STRING, "7-12"),
    Field("topic_id", UUID, "13+"),
    Field("partitions", Array(INT32), "7+"),
    name="ForgottenTopic",
)

REPLICA_STATE = Struct(
    Field("replica_id", INT32, "15+", default=-1),
    Field("replica_epoch", INT64, "15+", default=-1),
    name="ReplicaState",
)

FETCH_REQUEST = Struct(
    Field("cluster_id", STRING, "12+", nullable="12+", tag=0, default=None),
    Field("replica_id", INT32, "0-14", default=-1),
    Field("replica_state", REPLICA_STATE, "15+", tag=1),
    Field("max_wait_ms", INT32),
    Field("min_bytes", INT32),
    Field("max_bytes", INT32, "3+", default=0x7FFFFFFF),
    Field("isolation_level", INT8, "4+", default=0),
    Field("session_id", INT32, "7+", default=0),
    Field("session_epoch", INT32, "7+", default=-1),
    Field("topics", Array(FETCH_TOPIC)),
    Field("forgotten_topics_data", Array(FORGOTTEN_TOPIC), "7+"),
    Field("rack_id", STRING, "11+", default=""),
    name="FetchRequest",
)

EPOCH_END_OFFSET = Struct(
    Field("epoch", INT32, "12+", default=-1),
    Field("end_offset", INT64, "12+", default=-1),
    name="EpochEndOffset",
)

LEADER_ID_AND_EPOCH = Struct(
    Field("leader_id", INT32, "12+", default=-1),
    Field("leader_epoch", INT32, "12+", default=-1),
    name="LeaderIdAndEpoch",
)

SNAPSHOT_ID = Struct(
    Field("end_offset", INT64, default=-1),
    Field("epoch", INT32, default=-1),
    name="SnapshotId",
)

ABORTED_TRANSACTION = Struct(
    Field("producer_id", INT64, "4+"),
    Field("first_offset", INT64, "4+"),
    name="AbortedTransaction",
)

PARTITION_DATA = Struct(
    Field("partition_index", INT32),
    Field("error_code", INT16),
    Field("high_watermark", INT64),
    Field("last_stable_offset", INT64, "4+", default=-1),
    Field("log_start_offset", INT64, "5+", default=-1),
    Field("diverging_epoch", EPOCH_END_OFFSET, "12+", tag=0),
    Field("current_leader", LEADER_ID_AND_EPOCH, "12+", tag=1),
    Field("snapshot_id", SNAPSHOT_ID, "12+", tag=2),
    # Nullable without a "null" default: Kafka's default is the empty list.
    Field("aborted_transactions", Array(ABORTED_TRANSACTION), "4+", nullable="4+", default=[]),
    Field("preferred_read_replica", INT32, "11+", default=-1),
    Field("records", RECORDS, nullable="0+"),
    name="PartitionData",
)

FETCHABLE_TOPIC_RESPONSE = Struct(
    Field("topic", STRING, "0-12"),
    Field("topic_id", UUID, "13+"),
    Field("partitions", Array(PARTITION_DATA)),
    name="FetchableTopicResponse",
)

NODE_ENDPOINT = Struct(
    Field("node_id", INT32, "16+"),
    Field("host", STRING, "16+"),
    Field("port", INT32, "16+"),
    Field("rack", STRING, "16+", nullable="16+", default=None),
    name="NodeEndpoint",
)

FETCH_RESPONSE = Struct(
    Field("throttle_time_ms", INT32, "1+"),
    Field("error_code", INT16, "7+"),
    Field("session_id", INT32, "7+", default=0),
    Field("responses", Array(FETCHABLE_TOPIC_RESPONSE)),
    Field("node_endpoints", Array(NODE_ENDPOINT), "16+", tag=0),
    name="FetchResponse",
)

FETCH = Api(1, "Fetch", versions=(4, 18), flexible="12+",
            request=FETCH_REQUEST, response=FETCH_RESPONSE)
