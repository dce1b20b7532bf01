"""SyncGroup (key 14): the leader hands out assignments; every member receives its own.

Versions 0-5 as in Kafka's SyncGroupRequest/Response.json; flexible from v4.  v3 adds
``group_instance_id``; v5 (KIP-559) sends ``protocol_type``/``protocol_name`` both ways, and the
broker rejects a request whose type or name is inconsistent with the group's.  The ``assignment``
bytes are, for consumer groups, a ``ConsumerProtocolAssignment`` (see ``consumer_protocol.py``).
"""

from ..schema import BYTES, INT16, INT32, STRING, Api, Array, Field, Struct

SYNC_GROUP = Api(
    14, "SyncGroup", versions=(0, 5), flexible="4+",
    request=Struct(
        Field("group_id", STRING),
        Field("generation_id", INT32),
        Field("member_id", STRING),
        Field("group_instance_id", STRING, "3+", nullable="3+", default=None),
        Field("protocol_type", STRING, "5+", nullable="5+", default=None),
        Field("protocol_name", STRING, "5+", nullable="5+", default=None),
        Field("assignments", Array(Struct(
            Field("member_id", STRING),
            Field("assignment", BYTES),
            name="SyncGroupRequestAssignment",
        ))),
        name="SyncGroupRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "1+"),
        Field("error_code", INT16),
        Field("protocol_type", STRING, "5+", nullable="5+", default=None),
        Field("protocol_name", STRING, "5+", nullable="5+", default=None),
        Field("assignment", BYTES),
        name="SyncGroupResponse",
    ),
)
