"""ShareGroupDescribe (key 77): a share group's state and members, with what each is assigned.

Version 1 as in Kafka 4.4's ShareGroupDescribeRequest/Response.json; flexible in every version
(v0, the early-access layout of Kafka 4.0, was removed in 4.1).  The shape of
ConsumerGroupDescribe (key 69) without instance ids, regexes, target assignments or member
types: a share member's assignment is all there is, since the broker, not the member, decides
which records it gets.  A group that is not a share group (or none at all) is answered per group
with GROUP_ID_NOT_FOUND.
"""

from ..schema import BOOL, INT16, INT32, STRING, UUID, Api, Array, Field, Struct

SHARE_GROUP_DESCRIBE = Api(
    77, "ShareGroupDescribe", versions=(1, 1), flexible="0+",
    request=Struct(
        Field("group_ids", Array(STRING)),
        Field("include_authorized_operations", BOOL, default=False),
        name="ShareGroupDescribeRequest",
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
                Field("rack_id", STRING, nullable="0+", default=None),
                Field("member_epoch", INT32),
                Field("client_id", STRING),
                Field("client_host", STRING),
                Field("subscribed_topic_names", Array(STRING)),
                Field("assignment", Struct(
                    Field("topic_partitions", Array(Struct(
                        Field("topic_id", UUID),
                        Field("topic_name", STRING),
                        Field("partitions", Array(INT32)),
                        name="TopicPartitions",
                    ))),
                    name="Assignment",
                )),
                name="Member",
            ))),
            Field("authorized_operations", INT32, default=-2147483648),
            name="DescribedGroup",
        ))),
        name="ShareGroupDescribeResponse",
    ),
)
