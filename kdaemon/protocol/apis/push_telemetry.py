"""PushTelemetry (key 72, KIP-714): one push of a client's metrics to a broker.

Version 0 only, flexible, as in Kafka 4.4's PushTelemetryRequest/Response.json.  ``metrics`` is an
OpenTelemetry ``MetricsData`` protobuf (v1), compressed with ``compression_type`` (a record batch
attribute id, one of the types the subscription accepts; 0 for none).  ``terminating`` marks the
client's last push, sent on close; the broker then forgets the client instance.  The answer is
one error code: UNKNOWN_SUBSCRIPTION_ID (subscription changed: ask again),
TELEMETRY_TOO_LARGE, INVALID_RECORD, THROTTLING_QUOTA_EXCEEDED, INVALID_REQUEST ... (see
``kdaemon.client.telemetry_state`` for what the client does about each).
"""

from ..schema import BOOL, BYTES, INT8, INT16, INT32, UUID, Api, Field, Struct

PUSH_TELEMETRY = Api(
    72, "PushTelemetry", versions=(0, 0), flexible="0+",
    request=Struct(
        Field("client_instance_id", UUID),
        Field("subscription_id", INT32),
        Field("terminating", BOOL),
        Field("compression_type", INT8),
        Field("metrics", BYTES),
        name="PushTelemetryRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32),
        Field("error_code", INT16),
        name="PushTelemetryResponse",
    ),
)
