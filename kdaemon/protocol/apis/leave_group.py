"""LeaveGroup (key 13): a member leaves its group so the others rebalance without waiting.

Versions 0-5 as in Kafka's LeaveGroupRequest/Response.json; flexible from v4.  Up to v2 the
request names one ``member_id``; from v3 (KIP-345) it carries a batch of ``members`` (member id
plus group instance id) and the response answers each with its own error code.  v5 adds a
per-member ``reason`` (KIP-800).
"""

from ..schema import INT16, INT32, STRING, Api, Array, Field, Struct

LEAVE_GROUP = Api(
    13, "LeaveGroup", versions=(0, 5), flexible="4+",
    request=Struct(
        Field("group_id", STRING),
        Field("member_id", STRING, "0-2"),
        Field("members", Array(Struct(
            Field("member_id", STRING, "3+"),
            Field("group_instance_id", STRING, "3+", nullable="3+", default=None),
            Field("reason", STRING, "5+", nullable="5+", default=None),
            name="MemberIdentity",
        )), "3+"),
        name="LeaveGroupRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "1+"),
        Field("error_code", INT16),
        Field("members", Array(Struct(
            Field("member_id", STRING, "3+"),
            Field("group_instance_id", STRING, "3+", nullable="3+"),
            Field("error_code", INT16, "3+"),
            name="MemberResponse",
        )), "3+"),
        name="LeaveGroupResponse",
    ),
)
