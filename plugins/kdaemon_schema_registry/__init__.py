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
from dataclasses import dataclass

from kdaemon.plugins import SettingsError, hookimpl, parse_settings

from .avro import AvroDecoder
from .client import SchemaRegistryClient
from .errors import (RegistryError, RegistryUnavailable, SchemaDecodeError, SchemaNotFound,
                     SchemaRegistryError, WireFormatError)
from .json_schema import JsonSchemaDecoder
from .protobuf import ProtobufDecoder
from .settings import RegistrySettings, registry_settings
from .wire import message_indexes, split

@dataclass(frozen=True)
class AvroOptions:
    """``[deserializer.settings.avro]``."""

    logical_types: bool = True


@dataclass(frozen=True)
class JsonSchemaOptions:
    """``[deserializer.settings.json_schema]``."""

    validate: bool = True


AVRO_KEYS = tuple(AvroOptions.__dataclass_fields__)
JSON_SCHEMA_KEYS = tuple(JsonSchemaOptions.__dataclass_fields__)

# One registry client per settings in this process, and one decoder per (format, settings,
# options): the key and value deserializers, whatever their formats, and a configuration
# reload with the same settings share caches.
_clients: dict[RegistrySettings, SchemaRegistryClient] = {}
_decoders: dict[tuple, object] = {}


def _checked(settings: Mapping, options: tuple[str, type] | None = None):
    """The registry's settings and the format's options (``(table name, dataclass)``), every
    problem of both in one ``SettingsError``; the other keys of the shared
    ``[deserializer.settings]`` table are the other deserializers' (ignored)."""
    errors, registry, parsed = [], None, None
    try:
        registry = registry_settings(settings)
    except SettingsError as exc:
        errors.append(exc)
    if options is not None:
        name, cls = options
        try:
            parsed = parse_settings(cls, settings.get(name, {}), name, ignore=())
        except SettingsError as exc:
            errors.append(exc)
    if errors:
        raise SettingsError.joined(errors)
    return registry, parsed


def avro_settings(settings: Mapping) -> bool:
    """``logical_types`` from ``[deserializer.settings.avro]``; ``SettingsError`` naming the key."""
    return parse_settings(AvroOptions, settings.get("avro", {}), "avro", ignore=()).logical_types


def json_schema_settings(settings: Mapping) -> bool:
    """``validate`` from ``[deserializer.settings.json_schema]``; ``SettingsError`` naming the key."""
    return parse_settings(JsonSchemaOptions, settings.get("json_schema", {}), "json_schema", ignore=()).validate


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
    registry, options = _checked(settings, ("avro", AvroOptions))
    logical_types = options.logical_types
    return _deserializer(_decoder(("avro", registry, logical_types), registry,
                                  lambda client: AvroDecoder(client, logical_types=logical_types)))


def protobuf_deserializer(settings: dict):
    """Factory of ``schema_registry_protobuf``: ``(topic, headers, data) -> dict``."""
    registry, _ = _checked(settings)
    return _deserializer(_decoder(("protobuf", registry), registry, ProtobufDecoder))


def json_deserializer(settings: dict):
    """Factory of ``schema_registry_json``: ``(topic, headers, data) -> object``."""
    registry, options = _checked(settings, ("json_schema", JsonSchemaOptions))
    validate = options.validate
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
