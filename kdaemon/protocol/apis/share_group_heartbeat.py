"""ShareGroupHeartbeat (key 76): a share group member's whole membership in one API (KIP-932).

Version 1 as in Kafka 4.4's ShareGroupHeartbeatRequest/Response.json; flexible in every version.
Version 0 was the early-access layout of Kafka 4.0 and was removed in 4.1, so 1 is the only one;
its fields still say ``0+`` in Kafka's files, and so they do here.

Like ConsumerGroupHeartbeat (key 68) without what a share group does not have: no instance id
(no static members), no regex, no server-side assignor choice, no owned partitions (the broker
hands records out; a member never has to give a partition back before another may read it), no
rebalance timeout.  ``member_epoch`` 0 joins, -1 leaves.  From 4.1 on the *client* picks its
member id (a UUID, as KIP-1082 made the consumer protocol do); the coordinator echoes it.
``subscribed_topic_names`` null means "unchanged since the last heartbeat".

The response's ``assignment`` is a nullable struct (a one-byte presence marker on the wire): null
when the assignment did not change.  Unlike ConsumerGroupHeartbeat's it has no error field.
"""

from ..schema import INT16, INT32, STRING, UUID, Api, Array, Field, Struct

SHARE_GROUP_HEARTBEAT = Api(
    76, "ShareGroupHeartbeat", versions=(1, 1), flexible="0+",
    request=Struct(
        Field("group_id", STRING),
        Field("member_id", STRING),
        Field("member_epoch", INT32),
        Field("rack_id", STRING, nullable="0+", default=None),
        Field("subscribed_topic_names", Array(STRING), nullable="0+", default=None),
        name="ShareGroupHeartbeatRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("error_message", STRING, nullable="0+", default=None),
        Field("member_id", STRING, nullable="0+", default=None),
        Field("member_epoch", INT32),
        Field("heartbeat_interval_ms", INT32),
        Field("assignment", Struct(
            Field("topic_partitions", Array(Struct(
                Field("topic_id", UUID),
                Field("partitions", Array(INT32)),
                name="TopicPartitions",
            ))),
            name="Assignment",
        ), nullable="0+", default=None),
        name="ShareGroupHeartbeatResponse",
    ),
)
