"""FindCoordinator (key 10): which broker coordinates a group (or a transactional id).

Versions 0-6 as in Kafka's FindCoordinatorRequest/Response.json; flexible from v3.  v4 (KIP-699)
replaced the single ``key`` with a batch of ``coordinator_keys`` and the single answer with a
``coordinators`` array, one entry (with its own error code) per key; the fields of the single
form exist only up to v3.  v5 (KIP-890) and v6 (KIP-932, key type 2 = share) change nothing on
the wire: they only promise that the client understands a new error code / key type.  Kafka 4.x
brokers still accept v0.

``key_type``: 0 = group, 1 = transaction, 2 = share (v6+).
"""

from ..schema import INT8, INT16, INT32, STRING, Api, Array, Field, Struct

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1

FIND_COORDINATOR = Api(
    10, "FindCoordinator", versions=(0, 6), flexible="3+",
    request=Struct(
        Field("key", STRING, "0-3"),
        Field("key_type", INT8, "1+", default=0),
        Field("coordinator_keys", Array(STRING), "4+"),
        name="FindCoordinatorRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "1+"),
        Field("error_code", INT16, "0-3"),
        Field("error_message", STRING, "1-3", nullable="1-3"),
        Field("node_id", INT32, "0-3"),
        Field("host", STRING, "0-3"),
        Field("port", INT32, "0-3"),
        Field("coordinators", Array(Struct(
            Field("key", STRING, "4+"),
            Field("node_id", INT32, "4+"),
            Field("host", STRING, "4+"),
            Field("port", INT32, "4+"),
            Field("error_code", INT16, "4+"),
            Field("error_message", STRING, "4+", nullable="4+"),
            name="Coordinator",
        )), "4+"),
        name="FindCoordinatorResponse",
    ),
)
