"""JSON Schema payloads: UTF-8 JSON text after the wire-format header, checked against the
writer's schema.

The text decodes with ``json`` alone (JSON is self-describing); the schema matters for
validation only.  ``validate = true`` is the default, as for confluent-kafka's ``JSONDeserializer`` (its
``validate`` defaults to True; Java's ``KafkaJsonSchemaDeserializer`` has
``json.fail.invalid.schema``, default false): a record that does not satisfy the schema its
producer named is as wrong as one that does not parse, and goes through
``on_deserialize_error``; and a record whose schema id the registry does not know is caught
only by fetching the schema.  ``validate = false`` skips
the registry entirely: no request, no schema, the id is read and ignored.

Validation uses the ``jsonschema`` package with the dialect the schema's ``$schema`` names
(draft 7 when it names none, as Confluent's serializers assume).  ``$ref`` s resolve through
the schema's registry references only: each reference's schema is registered under its
``name`` (the URI the ``$ref`` uses, e.g. ``address.json``), fetched by subject and version,
depth first.  Nothing is fetched from any other URL (confluent-kafka fetches unknown ``$ref``
URIs over HTTP; a worker should not reach out to addresses a schema names): such a ``$ref``
fails the record with a ``SchemaDecodeError`` naming it.  A validator is built once per schema
id and kept for the life of the process, as is a schema that cannot be used.

Error messages name the schema id, the failing location (``$.items[2].qty``) and the keyword
(``minimum = 1``), never the value that failed (it is record data).
"""

from __future__ import annotations

import json
from collections.abc import Callable

try:
    import jsonschema
    from jsonschema import validators as jsonschema_validators
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource, Unresolvable
    from referencing.jsonschema import DRAFT7
except ImportError:     # the factory reports it when validate = true
    jsonschema = None

from .built import BuiltPerId
from .client import RegisteredSchema, SchemaRegistryClient
from .errors import SchemaDecodeError

MAX_KEYWORD_VALUE = 80          # characters of a keyword's value shown in an error


class JsonSchemaDecoder:
    """``decoder(schema_id, payload) -> object``; raises ``SchemaRegistryError`` subclasses."""

    def __init__(self, client: SchemaRegistryClient, *, validate: bool = True) -> None:
        if validate and jsonschema is None:
            raise ValueError("json_schema.validate = true needs jsonschema: pip install 'kdaemon[schema-registry]' "
                             "(or set validate = false)")
        self.client = client
        self.validate = validate
        self.validator = BuiltPerId(client, "JSON", "JSON Schema", self._build)   # id -> check(value)

    def __call__(self, schema_id: int, payload) -> object:
        try:
            value = json.loads(bytes(payload).decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise SchemaDecodeError(f"schema id {schema_id}: the payload is not UTF-8 (byte {exc.start})") from None
        except ValueError as exc:   # json.JSONDecodeError: its message has positions, not the text
            raise SchemaDecodeError(f"schema id {schema_id}: the payload ({len(payload)} bytes) is not JSON: "
                                    f"{exc}") from None
        if self.validate:
            self.validator(schema_id)(value)
        return value

    def _build(self, registered: RegisteredSchema, what: str) -> Callable:
        """A function that raises ``SchemaDecodeError`` for a value the schema does not allow."""
        schema = _schema(registered, what)
        registry = self._references(registered, Registry(retrieve=_no_retrieval), what, ())
        cls = jsonschema_validators.validator_for(schema, default=jsonschema.Draft7Validator)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise SchemaDecodeError(f"{what}: not a valid {cls.__name__[:-len('Validator')]} JSON Schema: "
                                    f"{_where(exc.absolute_path)}: {exc.message}") from None
        validator = cls(schema, registry=registry)

        def check(value) -> None:
            try:
                error = jsonschema.exceptions.best_match(validator.iter_errors(value))
            except Unresolvable as exc:
                raise SchemaDecodeError(f"{what}: cannot resolve $ref {exc.ref!r}: only the schema's registry "
                                        "references are used, nothing is fetched from elsewhere") from None
            if error is not None:
                shown = json.dumps(error.validator_value, default=str)
                if len(shown) > MAX_KEYWORD_VALUE:
                    shown = shown[:MAX_KEYWORD_VALUE] + "..."
                raise SchemaDecodeError(f"{what}: the value does not satisfy its schema at "
                                        f"{_where(error.absolute_path)}: {error.validator} = {shown}")

        return check

    def _references(self, registered: RegisteredSchema, registry, what: str, chain: tuple):
        for ref in registered.references:
            if ref.name in chain:
                continue        # JSON Schemas may refer to each other in a cycle; each is loaded once
            ref_what = f"{what}: reference {ref.name!r} (subject {ref.subject!r} version {ref.version})"
            referenced = self.client.schema_by_version(ref.subject, ref.version)
            if referenced.schema_type != "JSON":
                raise SchemaDecodeError(f"{ref_what} is a {referenced.schema_type} schema, not JSON Schema")
            registry = self._references(referenced, registry, what, chain + (ref.name,))
            resource = Resource.from_contents(_schema(referenced, ref_what), default_specification=DRAFT7)
            registry = registry.with_resource(ref.name, resource)
        return registry


def _schema(registered: RegisteredSchema, what: str):
    try:
        schema = json.loads(registered.schema)
    except ValueError as exc:
        raise SchemaDecodeError(f"{what}: the registry's schema is not JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise SchemaDecodeError(f"{what}: a JSON Schema is an object or a boolean, not {type(schema).__name__}")
    return schema


def _no_retrieval(uri: str):
    raise NoSuchResource(ref=uri)


def _where(path) -> str:
    """``$.items[2].qty`` for the deque of keys and indexes jsonschema gives."""
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out
