"""JoinGroup (key 11): the first step of the classic group protocol.

Versions 0-9 as in Kafka's JoinGroupRequest/Response.json; flexible from v6.  Kafka 4.x brokers
still accept every version (0-1 are deprecated, not removed).

Version notes that change behaviour rather than layout:

* v4+: a member joining with an empty ``member_id`` is answered MEMBER_ID_REQUIRED together with
  the ``member_id`` it must rejoin with (KIP-394).
* v5+: ``group_instance_id`` (static membership, KIP-345).
* v7+: the response names ``protocol_type`` and may carry a null ``protocol_name`` (KIP-559).
* v8+: ``reason`` (KIP-800).  v9+: ``skip_assignment`` tells a static leader not to reassign.

``protocol_name`` is nullable only from v7; its default is the empty string (not None) so that a
response built without it still encodes in v0-6.
"""

from ..schema import BOOL, BYTES, INT16, INT32, STRING, Api, Array, Field, Struct

JOIN_GROUP = Api(
    11, "JoinGroup", versions=(0, 9), flexible="6+",
    request=Struct(
        Field("group_id", STRING),
        Field("session_timeout_ms", INT32),
        Field("rebalance_timeout_ms", INT32, "1+", default=-1),
        Field("member_id", STRING),
        Field("group_instance_id", STRING, "5+", nullable="5+", default=None),
        Field("protocol_type", STRING),
        Field("protocols", Array(Struct(
            Field("name", STRING),
            Field("metadata", BYTES),
            name="JoinGroupRequestProtocol",
        ))),
        Field("reason", STRING, "8+", nullable="8+", default=None),
        name="JoinGroupRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "2+"),
        Field("error_code", INT16),
        Field("generation_id", INT32, default=-1),
        Field("protocol_type", STRING, "7+", nullable="7+", default=None),
        Field("protocol_name", STRING, nullable="7+", default=""),
        Field("leader", STRING),
        Field("skip_assignment", BOOL, "9+", default=False),
        Field("member_id", STRING),
        Field("members", Array(Struct(
            Field("member_id", STRING),
            Field("group_instance_id", STRING, "5+", nullable="5+", default=None),
            Field("metadata", BYTES),
            name="JoinGroupResponseMember",
        ))),
        name="JoinGroupResponse",
    ),
)
