"""CreateTopics (key 19): create topics, for ``kdaemon demo``'s sample topic and a Kafka DLQ's
topic when its table asks for it (``client/admin.py``).

Versions 2-7 as in Kafka 4.4's CreateTopicsRequest/Response.json (v0-1 were removed in Kafka
4.0, KIP-896); flexible from v5.  ``num_partitions`` and ``replication_factor`` may be -1 from
v4 (KIP-464): the broker's ``num.partitions`` / ``default.replication.factor`` then.  The answer
has one entry per topic with its own error code and message (TOPIC_ALREADY_EXISTS,
INVALID_REPLICATION_FACTOR, POLICY_VIOLATION ...); the top level has none.  From v5 it also
says what the topic got (partitions, replication factor, configs; KIP-525), from v7 its id.
The request must reach the active controller in Kafka's old (ZooKeeper) clusters; a KRaft
broker forwards it there itself, so any broker will do.
"""

from ..schema import BOOL, INT8, INT16, INT32, STRING, UUID, Api, Array, Field, Struct

CREATE_TOPICS = Api(
    19, "CreateTopics", versions=(2, 7), flexible="5+",
    request=Struct(
        Field("topics", Array(Struct(
            Field("name", STRING),
            Field("num_partitions", INT32),
            Field("replication_factor", INT16),
            Field("assignments", Array(Struct(
                Field("partition_index", INT32),
                Field("broker_ids", Array(INT32)),
                name="CreatableReplicaAssignment",
            ))),
            Field("configs", Array(Struct(
                Field("name", STRING),
                Field("value", STRING, nullable="0+", default=None),
                name="CreatableTopicConfig",
            ))),
            name="CreatableTopic",
        ))),
        Field("timeout_ms", INT32, default=60000),
        Field("validate_only", BOOL, "1+", default=False),
        name="CreateTopicsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "2+"),
        Field("topics", Array(Struct(
            Field("name", STRING),
            Field("topic_id", UUID, "7+"),
            Field("error_code", INT16),
            Field("error_message", STRING, "1+", nullable="0+", default=None),
            Field("topic_config_error_code", INT16, "5+", tag=0),
            Field("num_partitions", INT32, "5+", default=-1),
            Field("replication_factor", INT16, "5+", default=-1),
            Field("configs", Array(Struct(
                Field("name", STRING, "5+"),
                Field("value", STRING, "5+", nullable="5+", default=None),
                Field("read_only", BOOL, "5+"),
                Field("config_source", INT8, "5+", default=-1),
                Field("is_sensitive", BOOL, "5+"),
                name="CreatableTopicConfigs",
            )), "5+", nullable="5+", default=None),
            name="CreatableTopicResult",
        ))),
        name="CreateTopicsResponse",
    ),
)
