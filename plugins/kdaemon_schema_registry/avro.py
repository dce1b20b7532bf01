"""Avro payloads: the writer's schema from the registry, decoded with fastavro into Python values.

The payload after the wire-format header is one Avro binary datum (no container-file header),
read with ``fastavro.schemaless_reader`` against the *writer's* schema (the one the id names).
There is no reader schema: records come out as the writer wrote them (dicts, lists, str, ...),
so two producers on different schema versions give differently shaped dicts.  Logical types
become what fastavro makes of them (datetime, date, Decimal, UUID) unless ``logical_types =
false``, which keeps the underlying Avro values (int, long, bytes, string).

Schema references (a record type defined under another subject) are fetched by subject and
version, depth first, and parsed into the same fastavro ``named_schemas`` before the schema
that uses them, as Confluent's own deserializer does.  A parsed schema is cached per id for
the life of the process, and so is a schema that cannot be parsed (ids never change meaning).
"""

from __future__ import annotations

import json
from io import BytesIO

try:
    import fastavro
except ImportError:     # the factory reports it; importing the plugin must not fail
    fastavro = None

from .built import BuiltPerId
from .client import RegisteredSchema, SchemaReference, SchemaRegistryClient
from .errors import SchemaDecodeError


class AvroDecoder:
    """``decoder(schema_id, payload) -> object``; raises ``SchemaRegistryError`` subclasses."""

    def __init__(self, client: SchemaRegistryClient, *, logical_types: bool = True) -> None:
        if fastavro is None:
            raise ValueError("the Avro deserializer needs fastavro: pip install 'kdaemon[schema-registry]'")
        self.client = client
        self.logical_types = logical_types
        self.writer_schema = BuiltPerId(client, "AVRO", "Avro", self._build)   # id -> parsed writer's schema

    def __call__(self, schema_id: int, payload) -> object:
        schema = self.writer_schema(schema_id)
        stream = BytesIO(payload)
        try:
            value = fastavro.schemaless_reader(stream, schema, None)
        except Exception as exc:   # EOFError, IndexError (bad union branch), UnicodeDecodeError, ...
            raise SchemaDecodeError(f"schema id {schema_id}: the payload ({len(payload)} bytes) is not valid "
                                    f"Avro for this schema: {type(exc).__name__}: {exc}") from None
        if stream.tell() != len(payload):
            raise SchemaDecodeError(f"schema id {schema_id}: {len(payload) - stream.tell()} byte(s) left after "
                                    "the Avro datum: the payload does not match the writer's schema")
        return value

    def _build(self, registered: RegisteredSchema, what: str) -> dict:
        """The parsed writer's schema, its references (named types) parsed first."""
        named: dict = {}
        self._parse_references(registered.references, named, what, set())
        return self._parse(registered, named, what)

    def _parse_references(self, refs: tuple[SchemaReference, ...], named: dict, what: str, seen: set) -> None:
        for ref in refs:
            key = (ref.subject, ref.version)
            if key in seen:
                continue
            seen.add(key)
            registered = self.client.schema_by_version(ref.subject, ref.version)
            self._parse_references(registered.references, named, what, seen)
            self._parse(registered, named, f"{what}: reference {ref.name!r} (subject {ref.subject!r} "
                                           f"version {ref.version})")

    def _parse(self, registered: RegisteredSchema, named: dict, what: str) -> dict:
        try:
            schema = json.loads(registered.schema)
        except ValueError as exc:
            raise SchemaDecodeError(f"{what}: the registry's schema is not JSON: {exc}") from None
        if not self.logical_types:
            schema = _without_logical_types(schema)
        try:
            return fastavro.parse_schema(schema, named_schemas=named)
        except Exception as exc:   # SchemaParseException, UnknownType, ...
            raise SchemaDecodeError(f"{what}: not a valid Avro schema: {type(exc).__name__}: {exc}") from None


def _without_logical_types(schema):
    if isinstance(schema, dict):
        return {k: _without_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_without_logical_types(v) for v in schema]
    return schema
