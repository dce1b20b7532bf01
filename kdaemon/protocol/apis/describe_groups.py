"""DescribeGroups (key 15): a classic group's state and members, for ``kdaemon offsets``.

Versions 1-5 as in Kafka's DescribeGroupsRequest/Response.json (Kafka 4.4 offers 0-6; v0
lacks only the throttle time); flexible from v5.  v3 can ask for the authorized operations, v4 adds each member's ``group_instance_id``
(KIP-345).  ``member_assignment`` is the
ConsumerProtocol assignment (``consumer_protocol.py``) while the group is Stable.
"""

from ..schema import BOOL, BYTES, INT16, INT32, STRING, Api, Array, Field, Struct

DESCRIBE_GROUPS = Api(
    15, "DescribeGroups", versions=(1, 5), flexible="5+",
    request=Struct(
        Field("groups", Array(STRING)),
        Field("include_authorized_operations", BOOL, "3+", default=False),
        name="DescribeGroupsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "1+"),
        Field("groups", Array(Struct(
            Field("error_code", INT16),
            Field("group_id", STRING),
            Field("group_state", STRING),
            Field("protocol_type", STRING),
            Field("protocol_data", STRING),
            Field("members", Array(Struct(
                Field("member_id", STRING),
                Field("group_instance_id", STRING, "4+", nullable="4+", default=None),
                Field("client_id", STRING),
                Field("client_host", STRING),
                Field("member_metadata", BYTES),
                Field("member_assignment", BYTES),
                name="DescribedGroupMember",
            ))),
            Field("authorized_operations", INT32, "3+", default=-2147483648),
            name="DescribedGroup",
        ))),
        name="DescribeGroupsResponse",
    ),
)
