"""SaslHandshake (key 17) and SaslAuthenticate (key 36).

Written from Kafka's ``SaslHandshake*.json`` (versions 0-1, never flexible) and
``SaslAuthenticate*.json`` (versions 0-2, flexible from 2).

The handshake version decides how the SASL tokens travel afterwards: after a v0 handshake they
are sent as bare size-prefixed blobs with no Kafka header (pre-KIP-152), after v1 each token is a
SaslAuthenticate request.  A client should use v1; v0 is here for completeness and fake brokers.
SaslHandshake stays at v1 on purpose: Kafka cannot bump it because of KAFKA-9577.

``session_lifetime_ms`` (v1+) is when the broker will drop the connection unless it is
re-authenticated (KIP-368); 0 means never.
"""

from ..schema import BYTES, INT16, INT64, STRING, Api, Array, Field, Struct

SASL_HANDSHAKE = Api(
    17, "SaslHandshake", versions=(0, 1), flexible="none",
    request=Struct(
        Field("mechanism", STRING),
        name="SaslHandshakeRequest",
    ),
    response=Struct(
        Field("error_code", INT16),
        Field("mechanisms", Array(STRING)),
        name="SaslHandshakeResponse",
    ),
)

SASL_AUTHENTICATE = Api(
    36, "SaslAuthenticate", versions=(0, 2), flexible="2+",
    request=Struct(
        Field("auth_bytes", BYTES),
        name="SaslAuthenticateRequest",
    ),
    response=Struct(
        Field("error_code", INT16),
        # Nullable without a "null" default: Kafka's default is the empty string.
        Field("error_message", STRING, nullable="0+", default=""),
        Field("auth_bytes", BYTES),
        Field("session_lifetime_ms", INT64, "1+", default=0),
        name="SaslAuthenticateResponse",
    ),
)
