"""IncrementalAlterConfigs (key 44, KIP-339): change some configs of a resource, leaving the
others as they are, for the share-group settings the daemon applies at start (a group's
``share.record.lock.duration.ms``, ``share.auto.offset.reset`` ...: KIP-932's GROUP configs).

Versions 0-1 as in Kafka 4.4's IncrementalAlterConfigsRequest/Response.json; flexible from v1.
Each config carries an operation (``OP_SET`` ...); ``value`` is null for ``OP_DELETE``.  The
answer has one entry per resource with its own error code (INVALID_CONFIG with the broker's
reason in ``error_message`` for a value outside its bounds); the top level has none.  Kafka
sends it to any broker for a GROUP resource (the controller applies it): no coordinator needed.
"""

from ..schema import BOOL, INT8, INT16, INT32, STRING, Api, Array, Field, Struct

# Kafka's AlterConfigOp.OpType ids.
OP_SET = 0
OP_DELETE = 1
OP_APPEND = 2
OP_SUBTRACT = 3

INCREMENTAL_ALTER_CONFIGS = Api(
    44, "IncrementalAlterConfigs", versions=(0, 1), flexible="1+",
    request=Struct(
        Field("resources", Array(Struct(
            Field("resource_type", INT8),
            Field("resource_name", STRING),
            Field("configs", Array(Struct(
                Field("name", STRING),
                Field("config_operation", INT8),
                Field("value", STRING, nullable="0+", default=None),
                name="AlterableConfig",
            ))),
            name="AlterConfigsResource",
        ))),
        Field("validate_only", BOOL),
        name="IncrementalAlterConfigsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("responses", Array(Struct(
            Field("error_code", INT16),
            Field("error_message", STRING, nullable="0+", default=None),
            Field("resource_type", INT8),
            Field("resource_name", STRING),
            name="AlterConfigsResourceResponse",
        ))),
        name="IncrementalAlterConfigsResponse",
    ),
)
