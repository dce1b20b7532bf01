"""Produce (key 0): record batches to partition leaders.

Written from Kafka's ``ProduceRequest.json`` / ``ProduceResponse.json`` (Kafka 4.x: versions
3-13, flexible from 9).  Versions 0-2 were removed in Kafka 4.0 (KIP-896; brokers still list
them in ApiVersions because of KAFKA-18659 but reject them), so 3 is our floor.  v3 adds
``transactional_id`` and RecordBatch v2 (the only format we write); v5 adds
``log_start_offset`` (which tells a spurious OUT_OF_ORDER_SEQUENCE_NUMBER from lost producer
state); v8 adds ``record_errors``/``error_message``; v10 the tagged ``current_leader`` and
``node_endpoints`` (KIP-951: the new leader comes with NOT_LEADER_OR_FOLLOWER); v11-12 only new
error codes (KIP-890); v13 names topics by id instead of name (KIP-516, like Fetch v13).

``records`` is a RECORDS field: the bytes of one or more v2 batches (``builder.build_batch``).
"""

from ..schema import INT16, INT32, INT64, RECORDS, STRING, UUID, Api, Array, Field, Struct

PARTITION_PRODUCE_DATA = Struct(
    Field("index", INT32),
    Field("records", RECORDS, nullable="0+"),
    name="PartitionProduceData",
)

TOPIC_PRODUCE_DATA = Struct(
    Field("name", STRING, "0-12"),
    Field("topic_id", UUID, "13+"),
    Field("partition_data", Array(PARTITION_PRODUCE_DATA)),
    name="TopicProduceData",
)

PRODUCE_REQUEST = Struct(
    Field("transactional_id", STRING, "3+", nullable="3+", default=None),
    Field("acks", INT16),
    Field("timeout_ms", INT32),
    Field("topic_data", Array(TOPIC_PRODUCE_DATA)),
    name="ProduceRequest",
)

BATCH_INDEX_AND_ERROR_MESSAGE = Struct(
    Field("batch_index", INT32, "8+"),
    Field("batch_index_error_message", STRING, "8+", nullable="8+", default=None),
    name="BatchIndexAndErrorMessage",
)

LEADER_ID_AND_EPOCH = Struct(
    Field("leader_id", INT32, "10+", default=-1),
    Field("leader_epoch", INT32, "10+", default=-1),
    name="LeaderIdAndEpoch",
)

PARTITION_PRODUCE_RESPONSE = Struct(
    Field("index", INT32),
    Field("error_code", INT16),
    Field("base_offset", INT64),
    Field("log_append_time_ms", INT64, "2+", default=-1),
    Field("log_start_offset", INT64, "5+", default=-1),
    Field("record_errors", Array(BATCH_INDEX_AND_ERROR_MESSAGE), "8+"),
    Field("error_message", STRING, "8+", nullable="8+", default=None),
    Field("current_leader", LEADER_ID_AND_EPOCH, "10+", tag=0),
    name="PartitionProduceResponse",
)

TOPIC_PRODUCE_RESPONSE = Struct(
    Field("name", STRING, "0-12"),
    Field("topic_id", UUID, "13+"),
    Field("partition_responses", Array(PARTITION_PRODUCE_RESPONSE)),
    name="TopicProduceResponse",
)

NODE_ENDPOINT = Struct(
    Field("node_id", INT32, "10+"),
    Field("host", STRING, "10+"),
    Field("port", INT32, "10+"),
    Field("rack", STRING, "10+", nullable="10+", default=None),
    name="NodeEndpoint",
)

PRODUCE_RESPONSE = Struct(
    Field("responses", Array(TOPIC_PRODUCE_RESPONSE)),
    Field("throttle_time_ms", INT32, "1+"),
    Field("node_endpoints", Array(NODE_ENDPOINT), "10+", tag=0),
    name="ProduceResponse",
)

PRODUCE = Api(0, "Produce", versions=(3, 13), flexible="9+",
              request=PRODUCE_REQUEST, response=PRODUCE_RESPONSE)
