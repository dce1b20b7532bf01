"""ConsumerGroupDescribe (key 69): a consumer-protocol (KIP-848) group's state and members, for
``kdaemon offsets``.

Versions 0-1 as in Kafka 4.4's ConsumerGroupDescribeRequest/Response.json; flexible in every
version.  DescribeGroups (key 15) knows classic groups only and answers "Dead" for these.  The
request is the same in both versions; v1 (KIP-1099) ends each member with ``member_type``
(-1 unknown, 0 a classic member of a group being upgraded, 1 a consumer-protocol member).

Unlike DescribeGroups, the member's ``assignment`` is a struct, not opaque bytes, and names each
topic both by id and by name; ``target_assignment`` is where the coordinator is taking it.  A
classic group, like a group nobody created, is answered GROUP_ID_NOT_FOUND (per group).
"""

from ..schema import BOOL, INT8, INT16, INT32, STRING, UUID, Api, Array, Field, Struct


def _assignment(name: str) -> Struct:
    return Struct(
        Field("topic_partitions", Array(Struct(
            Field("topic_id", UUID),
            Field("topic_name", STRING),
            Field("partitions", Array(INT32)),
            name="TopicPartitions",
        ))),
        name=name,
    )


CONSUMER_GROUP_DESCRIBE = Api(
    69, "ConsumerGroupDescribe", versions=(0, 1), flexible="0+",
    request=Struct(
        Field("group_ids", Array(STRING)),
        Field("include_authorized_operations", BOOL, default=False),
        name="ConsumerGroupDescribeRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("groups", Array(Struct(
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+", default=None),
            Field("group_id", STRING),
            Field("group_state", STRING),
            Field("group_epoch", INT32),
            Field("assignment_epoch", INT32),
            Field("assignor_name", STRING),
            Field("members", Array(Struct(
                Field("member_id", STRING),
                Field("instance_id", STRING, nullable="0+", default=None),
                Field("rack_id", STRING, nullable="0+", default=None),
                Field("member_epoch", INT32),
                Field("client_id", STRING),
                Field("client_host", STRING),
                Field("subscribed_topic_names", Array(STRING)),
                Field("subscribed_topic_regex", STRING, nullable="0+", default=None),
                Field("assignment", _assignment("Assignment")),
                Field("target_assignment", _assignment("Assignment")),
                Field("member_type", INT8, "1+", default=-1),
                name="Member",
            ))),
            Field("authorized_operations", INT32, default=-2147483648),
            name="DescribedGroup",
        ))),
        name="ConsumerGroupDescribeResponse",
    ),
)
