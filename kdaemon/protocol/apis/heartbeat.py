"""Heartbeat (key 12): a classic-group member proves it is alive and learns of rebalances.

Versions 0-4 as in Kafka's HeartbeatRequest/Response.json; flexible from v4.  v3 adds
``group_instance_id``.  REBALANCE_IN_PROGRESS in the response is how a member learns it must
rejoin.
"""

from ..schema import INT16, INT32, STRING, Api, Field, Struct

HEARTBEAT = Api(
    12, "Heartbeat", versions=(0, 4), flexible="4+",
    request=Struct(
        Field("group_id", STRING),
        Field("generation_id", INT32),
        Field("member_id", STRING),
        Field("group_instance_id", STRING, "3+", nullable="3+", default=None),
        name="HeartbeatRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "1+"),
        Field("error_code", INT16),
        name="HeartbeatResponse",
    ),
)
