"""ConsumerGroupHeartbeat (key 68): the whole KIP-848 consumer group protocol in one API.

Versions 0-1 as in Kafka's ConsumerGroupHeartbeatRequest/Response.json; flexible in every
version.  The member sends its subscription and owned partitions (only when they changed: null
means "unchanged"), the coordinator answers with the member epoch and, when it changed, the target
``assignment``.  ``member_epoch`` 0 joins, -1 leaves, -2 leaves as a static member that will
return.  v1 adds ``subscribed_topic_regex`` (and the INVALID_REGULAR_EXPRESSION error); Kafka 4.0
brokers accept v0-1.

The response's ``assignment`` is a nullable struct (a one-byte presence marker on the wire).
"""

from ..schema import INT16, INT32, STRING, UUID, Api, Array, Field, Struct


def _topic_partitions(name: str) -> Struct:
    return Struct(
        Field("topic_id", UUID),
        Field("partitions", Array(INT32)),
        name=name,
    )


CONSUMER_GROUP_HEARTBEAT = Api(
    68, "ConsumerGroupHeartbeat", versions=(0, 1), flexible="0+",
    request=Struct(
        Field("group_id", STRING),
        Field("member_id", STRING),
        Field("member_epoch", INT32),
        Field("instance_id", STRING, nullable="0+", default=None),
        Field("rack_id", STRING, nullable="0+", default=None),
        Field("rebalance_timeout_ms", INT32, default=-1),
        Field("subscribed_topic_names", Array(STRING), nullable="0+", default=None),
        Field("subscribed_topic_regex", STRING, "1+", nullable="1+", default=None),
        Field("server_assignor", STRING, nullable="0+", default=None),
        Field("topic_partitions", Array(_topic_partitions("TopicPartitions")),
              nullable="0+", default=None),
        name="ConsumerGroupHeartbeatRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("error_message", STRING, nullable="0+", default=None),
        Field("member_id", STRING, nullable="0+", default=None),
        Field("member_epoch", INT32),
        Field("heartbeat_interval_ms", INT32),
        Field("assignment", Struct(
            Field("topic_partitions", Array(_topic_partitions("TopicPartitions"))),
            name="Assignment",
        ), nullable="0+", default=None),
        name="ConsumerGroupHeartbeatResponse",
    ),
)
