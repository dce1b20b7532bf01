"""Bundled plugin ``schema_registry``: keys and values written by Schema Registry serializers.

Three deserializers, one per schema type, all reading the Confluent wire format (magic byte 0,
4-byte big-endian schema id, payload) with the writer's schema fetched from a
Confluent-compatible registry (Confluent, Apicurio's ``/apis/ccompat/v7``, Redpanda, Karapace):

* ``schema_registry_avro``: the Avro binary datum, decoded with fastavro into dicts (avro.py);
* ``schema_registry_protobuf``: message indexes, then the protobuf message, decoded through
  descriptors built at run time into dicts (protobuf.py);
* ``schema_registry_json``: UTF-8 JSON text, validated against the JSON Schema (json_schema.py).

::

    plugins = ["schema_registry"]

    [deserializer]
    key = "schema_registry_avro"       # any of the three, for either or both
    value = "schema_registry_protobuf"

    [deserializer.settings.schema_registry]
    url = "https://registry.example:8081"     # or a list, tried in turn
    username = "kdaemon"
    password_file = "registry-password"       # or password / password_env
    ca_file = "/etc/kdaemon/registry-ca.pem"  # cert_file, key_file, verify = true
    timeout_ms = 5000
    retry_backoff_ms = 5000

    [deserializer.settings.avro]
    logical_types = true

    [deserializer.settings.json_schema]
    validate = true

Every deserializer built from the same ``schema_registry`` settings in one process shares one
registry client and its caches (key and value, whatever their formats).  A null key or value
stays ``None``.  A record that cannot be decoded (wire format, unknown id, registry down, payload
not matching its schema) raises a ``kdaemon_schema_registry.errors.SchemaRegistryError`` and the
daemon's ``on_deserialize_error`` policy applies; see docs/PLUGINS.md, "Schema Registry
deserializers".
"""

from __future__ import annotations

from collections.abc import Mapping

from kdaemon.plugins import hookimpl

from .avro import AvroDecoder
from .client import SchemaRegistryClient
from .errors import (RegistryError, RegistryUnavailable, SchemaDecodeError, SchemaNotFound,
                     SchemaRegistryError, WireFormatError)
from .json_schema import JsonSchemaDecoder
from .protobuf import ProtobufDecoder
from .settings import RegistrySettings, registry_settings
from .wire import message_indexes, split

AVRO_KEYS = ("logical_types",)
JSON_SCHEMA_KEYS = ("validate",)

# One registry client per settings in this process, and one decoder per (format, settings,
# options): the key and value deserializers, whatever their formats, and a configuration
# reload with the same settings share caches.
_clients: dict[RegistrySettings, SchemaRegistryClient] = {}
_decoders: dict[tuple, object] = {}


def _options_table(settings: Mapping, name: str, known: tuple[str, ...]) -> Mapping:
    table = settings.get(name, {})
    if not isinstance(table, Mapping):
        raise ValueError(f"{name} must be a table ({', '.join(f'{k} = ...' for k in known)}), not {table!r}")
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError(f"{name}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return table


def _bool(table: Mapping, name: str, key: str, default: bool) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{name}.{key} must be true or false, not {value!r}")
    return value


def avro_settings(settings: Mapping) -> bool:
    """``logical_types`` from ``[deserializer.settings.avro]``; ``ValueError`` naming the key."""
    return _bool(_options_table(settings, "avro", AVRO_KEYS), "avro", "logical_types", True)


def json_schema_settings(settings: Mapping) -> bool:
    """``validate`` from ``[deserializer.settings.json_schema]``; ``ValueError`` naming the key."""
    return _bool(_options_table(settings, "json_schema", JSON_SCHEMA_KEYS), "json_schema", "validate", True)


def _decoder(key: tuple, registry: RegistrySettings, make):
    """The shared decoder for ``key``, made with the shared client for ``registry``."""
    decoder = _decoders.get(key)
    if decoder is None:
        client = _clients.get(registry)
        if client is None:
            client = _clients[registry] = SchemaRegistryClient(registry)
        decoder = _decoders[key] = make(client)
    return decoder


def _deserializer(decoder):
    def deserialize(topic, headers, data):
        if data is None:
            return None
        schema_id, payload = split(data)
        return decoder(schema_id, payload)

    deserialize.decoder = decoder   # for tests and diagnostics
    return deserialize


def avro_deserializer(settings: dict):
    """Factory of ``schema_registry_avro``: ``(topic, headers, data) -> object``."""
    registry = registry_settings(settings)
    logical_types = avro_settings(settings)
    return _deserializer(_decoder(("avro", registry, logical_types), registry,
                                  lambda client: AvroDecoder(client, logical_types=logical_types)))


def protobuf_deserializer(settings: dict):
    """Factory of ``schema_registry_protobuf``: ``(topic, headers, data) -> dict``."""
    registry = registry_settings(settings)
    return _deserializer(_decoder(("protobuf", registry), registry, ProtobufDecoder))


def json_deserializer(settings: dict):
    """Factory of ``schema_registry_json``: ``(topic, headers, data) -> object``."""
    registry = registry_settings(settings)
    validate = json_schema_settings(settings)
    return _deserializer(_decoder(("json", registry, validate), registry,
                                  lambda client: JsonSchemaDecoder(client, validate=validate)))


@hookimpl
def kdaemon_deserializers():
    return {"schema_registry_avro": avro_deserializer, "schema_registry_protobuf": protobuf_deserializer,
            "schema_registry_json": json_deserializer}


__all__ = ["AvroDecoder", "JsonSchemaDecoder", "ProtobufDecoder", "RegistryError", "RegistrySettings",
           "RegistryUnavailable", "SchemaDecodeError", "SchemaNotFound", "SchemaRegistryClient",
           "SchemaRegistryError", "WireFormatError", "avro_deserializer", "json_deserializer",
           "message_indexes", "protobuf_deserializer", "registry_settings", "split"]
