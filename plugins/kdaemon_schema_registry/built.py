"""What a decoder builds from each schema id's writer's schema, built once per id.

Every format's decoder (Avro, Protobuf, JSON Schema) fetches the writer's schema by id, checks it
is of its own type, and builds something from it (a parsed Avro schema, a descriptor pool, a
validator).  The rules of that cache are one definition, here: a schema id never changes
meaning, so what was built is kept for the worker's life, and so is a schema that *cannot* be
built (``SchemaDecodeError``: its records fail at once, without a second fetch or protoc run);
a registry error is never kept here (the client's negative cache spaces the retries), so the
schema is built once the registry is back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .client import RegisteredSchema, SchemaRegistryClient
from .errors import SchemaDecodeError

T = TypeVar("T")


class BuiltPerId(Generic[T]):
    """``built(schema_id) -> T``: ``build(registered, what)`` run once per id, ``what`` naming
    the id for error messages; raises ``SchemaRegistryError`` subclasses."""

    def __init__(self, client: SchemaRegistryClient, schema_type: str, reads: str,
                 build: Callable[[RegisteredSchema, str], T]) -> None:
        self.client = client
        self.schema_type = schema_type   # the registry's schemaType this decoder reads
        self.reads = reads               # how an error names it: "Avro", "Protobuf", "JSON Schema"
        self.build = build
        self._built: dict[int, T] = {}
        self._broken: dict[int, str] = {}

    def __call__(self, schema_id: int) -> T:
        built = self._built.get(schema_id)
        if built is not None:
            return built
        if schema_id in self._broken:
            raise SchemaDecodeError(self._broken[schema_id])
        what = f"schema id {schema_id}"
        registered = self.client.schema_by_id(schema_id)   # registry errors propagate, not kept
        try:
            if registered.schema_type != self.schema_type:
                raise SchemaDecodeError(f"{what} is a {registered.schema_type} schema; this deserializer "
                                        f"reads {self.reads} only")
            built = self.build(registered, what)
        except SchemaDecodeError as exc:
            self._broken[schema_id] = str(exc)
            raise
        self._built[schema_id] = built
        return built
