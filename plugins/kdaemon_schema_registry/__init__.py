"""Bundled plugin ``schema_registry``: keys and values written by Schema Registry serializers.

Offers the ``schema_registry_avro`` deserializer: Confluent wire format (magic byte 0, 4-byte
big-endian schema id, Avro binary datum), the writer's schema fetched from a Confluent-compatible
registry (Confluent, Apicurio's ``/apis/ccompat/v7``, Redpanda, Karapace) and decoded with
fastavro into dicts::

    plugins = ["schema_registry"]

    [deserializer]
    key = "schema_registry_avro"       # either, or both
    value = "schema_registry_avro"

    [deserializer.settings.schema_registry]
    url = "https://registry.example:8081"     # or a list, tried in turn
    username = "kdaemon"
    password_file = "registry-password"       # or password / password_env
    ca_file = "/etc/kdaemon/registry-ca.pem"  # cert_file, key_file, verify = true
    timeout_ms = 5000
    retry_backoff_ms = 5000

    [deserializer.settings.avro]
    logical_types = true

Key and value deserializers built from the same settings share one registry client and its
caches.  A null key or value stays ``None``.  A record that cannot be decoded (wire format,
unknown id, registry down, payload not matching its schema) raises a
``kdaemon_schema_registry.errors.SchemaRegistryError`` and the daemon's ``on_deserialize_error``
policy applies; see docs/PLUGINS.md, "Schema Registry deserializers".
"""

from __future__ import annotations

from collections.abc import Mapping

from kdaemon.plugins import hookimpl

from .avro import AvroDecoder
from .client import SchemaRegistryClient
from .errors import (RegistryError, RegistryUnavailable, SchemaDecodeError, SchemaNotFound,
                     SchemaRegistryError, WireFormatError)
from .settings import RegistrySettings, registry_settings
from .wire import split

AVRO_KEYS = ("logical_types",)

# One client (and decoder) per settings in this process: the key and value deserializers, and
# a configuration reload with the same settings, share caches.
_decoders: dict[tuple[RegistrySettings, bool], AvroDecoder] = {}


def avro_settings(settings: Mapping) -> bool:
    """``logical_types`` from ``[deserializer.settings.avro]``; ``ValueError`` naming the key."""
    table = settings.get("avro", {})
    if not isinstance(table, Mapping):
        raise ValueError(f"avro must be a table (logical_types = true|false), not {table!r}")
    unknown = sorted(set(table) - set(AVRO_KEYS))
    if unknown:
        raise ValueError(f"avro: unknown key(s) {', '.join(unknown)} (known: {', '.join(AVRO_KEYS)})")
    logical = table.get("logical_types", True)
    if not isinstance(logical, bool):
        raise ValueError(f"avro.logical_types must be true or false, not {logical!r}")
    return logical


def avro_deserializer(settings: dict):
    """Factory of ``schema_registry_avro``: ``(topic, headers, data) -> object``."""
    registry = registry_settings(settings)
    logical_types = avro_settings(settings)
    decoder = _decoders.get((registry, logical_types))
    if decoder is None:
        decoder = AvroDecoder(SchemaRegistryClient(registry), logical_types=logical_types)
        _decoders[(registry, logical_types)] = decoder

    def deserialize(topic, headers, data):
        if data is None:
            return None
        schema_id, payload = split(data)
        return decoder(schema_id, payload)

    deserialize.decoder = decoder   # for tests and diagnostics
    return deserialize


@hookimpl
def kdaemon_deserializers():
    return {"schema_registry_avro": avro_deserializer}


__all__ = ["AvroDecoder", "RegistryError", "RegistrySettings", "RegistryUnavailable", "SchemaDecodeError",
           "SchemaNotFound", "SchemaRegistryClient", "SchemaRegistryError", "WireFormatError",
           "avro_deserializer", "registry_settings", "split"]
