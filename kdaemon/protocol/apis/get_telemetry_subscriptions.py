"""GetTelemetrySubscriptions (key 71, KIP-714): which of its metrics a client should push, how
often, and how compressed.

Version 0 only, flexible, as in Kafka 4.4's GetTelemetrySubscriptionsRequest/Response.json.  The
first request carries the zero UUID and the broker assigns ``client_instance_id``; later requests
carry that id (and the answer then has the zero UUID).  ``requested_metrics`` holds metric name
prefixes: an empty list subscribes to nothing, a list holding one empty string to everything.
``subscription_id`` changes whenever the matching subscriptions change; a push with a stale one is
refused with UNKNOWN_SUBSCRIPTION_ID.  ``accepted_compression_types`` uses the record batch
attribute ids (``protocol.compression``: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), in the
broker's order of preference.
"""

from ..schema import BOOL, INT8, INT16, INT32, STRING, UUID, Api, Array, Field, Struct

GET_TELEMETRY_SUBSCRIPTIONS = Api(
    71, "GetTelemetrySubscriptions", versions=(0, 0), flexible="0+",
    request=Struct(
        Field("client_instance_id", UUID),
        name="GetTelemetrySubscriptionsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        Field("client_instance_id", UUID),
        Field("subscription_id", INT32),
        Field("accepted_compression_types", Array(INT8)),
        Field("push_interval_ms", INT32),
        Field("telemetry_max_bytes", INT32),
        Field("delta_temporality", BOOL),
        Field("requested_metrics", Array(STRING)),
        name="GetTelemetrySubscriptionsResponse",
    ),
)
