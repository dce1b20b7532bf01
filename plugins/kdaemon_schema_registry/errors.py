"""What this plugin raises for a record it cannot deserialize.

Every error is a ``SchemaRegistryError``, so the worker's ``on_deserialize_error`` policy
(dlq, skip, stop) handles it like any deserializer's failure; the type name and message go to
the dead-letter record's ``kdaemon.error`` header.  Messages name the schema id, the registry URL
asked and the HTTP status, never the payload or the credentials.

``RegistryUnavailable`` (no answer: connection refused, timeout, TLS failure, HTTP 5xx/429) and
``RegistryError`` (an answer refusing the request: 401, 403, an unexpected 4xx) are about the
registry, not the record: the same record may decode once the registry is back.
``SchemaNotFound`` means the registry answered 404 for that id.  ``WireFormatError`` and
``SchemaDecodeError`` are about the record's bytes (or its schema) and will not change.
"""

from __future__ import annotations


class SchemaRegistryError(Exception):
    """Base class: a record could not be deserialized through the schema registry."""


class WireFormatError(SchemaRegistryError, ValueError):
    """The bytes are not in the Confluent wire format (magic byte 0, 4-byte schema id, payload)."""


class RegistryUnavailable(SchemaRegistryError):
    """The registry gave no usable answer (network, TLS, timeout, 5xx, 429)."""


class RegistryError(SchemaRegistryError):
    """The registry answered with an error status other than 'not found'."""

    def __init__(self, message: str, status: int | None = None, error_code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = error_code


class SchemaNotFound(RegistryError):
    """The registry answered 404 for this schema id (or referenced subject version)."""


class SchemaDecodeError(SchemaRegistryError, ValueError):
    """The schema could not be parsed, or the payload is not valid for the writer's schema."""
