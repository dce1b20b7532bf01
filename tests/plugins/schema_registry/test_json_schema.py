"""The ``schema_registry_json`` deserializer without a real registry: JSON text after the header,
validation against the writer's JSON Schema (references through the registry only), the
``validate`` setting, and the failures that reach the ``on_deserialize_error`` policy."""

from __future__ import annotations

import json

import pytest

import kdaemon_schema_registry as sr
from kdaemon_schema_registry.errors import SchemaDecodeError, SchemaNotFound
from tests.plugins.schema_registry.helpers import FakeRegistry, consumer_records, deserialize_stage, wire

ADDRESS = {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "integer"}},
           "required": ["city"]}
ORDER = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
         "properties": {"id": {"type": "integer"}, "ship_to": {"$ref": "address.json"},
                        "lines": {"type": "array", "items": {"type": "object", "properties": {
                            "qty": {"type": "integer", "minimum": 1}}}}},
         "required": ["id"]}
REFS = [{"name": "address.json", "subject": "address", "version": 1}]


@pytest.fixture
def registry():
    r = FakeRegistry()
    r.add_version("address", 1, ADDRESS, schema_type="JSON")
    r.add_schema(1, ORDER, schema_type="JSON", references=REFS)
    yield r
    r.stop()


def settings(registry, **json_schema):
    out = {"schema_registry": {"url": registry.url}}
    if json_schema:
        out["json_schema"] = json_schema
    return out


def text(schema_id: int, value) -> bytes:
    return wire(schema_id, json.dumps(value).encode())


def test_decodes_and_validates_with_references(registry):
    deserialize = sr.json_deserializer(settings(registry))
    value = {"id": 2**63 + 1, "ship_to": {"city": "Oslo", "zip": 150}, "lines": [{"qty": 2}], "note": "é"}
    assert deserialize("t", [], text(1, value)) == value
    assert deserialize("t", [], text(1, {"id": 3})) == {"id": 3}
    assert deserialize("t", [], None) is None
    assert [p for p, _ in registry.requests] == ["/schemas/ids/1", "/subjects/address/versions/1"]


@pytest.mark.parametrize("value, message", [
    ({"id": "7"}, r"^schema id 1: the value does not satisfy its schema at \$\.id: type = \"integer\"$"),
    ({"id": 1, "ship_to": {"zip": 1}}, r"at \$\.ship_to: required = \[\"city\"\]$"),
    ({"id": 1, "lines": [{"qty": 1}, {"qty": 0}]}, r"at \$\.lines\[1\]\.qty: minimum = 1$"),
    ([], r"at \$: type = \"object\"$"),
])
def test_values_the_schema_refuses(registry, value, message):
    with pytest.raises(SchemaDecodeError, match=message) as caught:
        sr.json_deserializer(settings(registry))("t", [], text(1, value))
    assert '"7"' not in str(caught.value)      # the record's data is not in the message


def test_validate_false_asks_the_registry_nothing(registry):
    deserialize = sr.json_deserializer(settings(registry, validate=False))
    assert deserialize("t", [], text(12345, {"id": "not checked"})) == {"id": "not checked"}
    assert registry.requests == []


@pytest.mark.parametrize("payload, message", [
    (b"{\"id\": ", r"^schema id 1: the payload \(7 bytes\) is not JSON: Expecting value: line 1 column 8"),
    (b"\xff\xfe", r"^schema id 1: the payload is not UTF-8 \(byte 0\)$"),
])
def test_payloads_that_are_not_json(registry, payload, message):
    with pytest.raises(SchemaDecodeError, match=message):
        sr.json_deserializer(settings(registry))("t", [], wire(1, payload))


def test_schemas_that_cannot_be_used_are_errors_and_remembered(registry):
    registry.add_schema(2, '"string"')                                             # AVRO
    registry.add_schema(3, "{not json", schema_type="JSON")
    registry.add_schema(4, {"type": "objekt"}, schema_type="JSON")
    registry.add_schema(5, ORDER, schema_type="JSON", references=[{"name": "address.json", "subject": "gone",
                                                                   "version": 1}])
    deserialize = sr.json_deserializer(settings(registry))
    for schema_id, error, message in [
            (2, SchemaDecodeError, r"^schema id 2 is a AVRO schema; this deserializer reads JSON Schema only$"),
            (3, SchemaDecodeError, r"^schema id 3: the registry's schema is not JSON"),
            (4, SchemaDecodeError, r"^schema id 4: not a valid Draft7 JSON Schema: \$\.type: 'objekt' is not valid"),
            (5, SchemaNotFound, r"^subject 'gone' version 1: not found in the registry")]:
        for _ in range(2):
            with pytest.raises(error, match=message):
                deserialize("t", [], text(schema_id, {"id": 1}))
    assert [p for p, _ in registry.requests].count("/schemas/ids/4") == 1     # a bad schema: for good


def test_a_ref_outside_the_references_is_not_fetched(registry):
    schema = {"type": "object", "properties": {"a": {"$ref": f"{registry.url}/elsewhere.json"}}}
    registry.add_schema(6, schema, schema_type="JSON")
    deserialize = sr.json_deserializer(settings(registry))
    with pytest.raises(SchemaDecodeError, match=rf"^schema id 6: cannot resolve \$ref '{registry.url}/elsewhere\.json': "
                                                r"only the schema's registry references are used"):
        deserialize("t", [], text(6, {"a": 1}))
    assert [p for p, _ in registry.requests] == ["/schemas/ids/6"]


def test_settings_errors_name_the_key(registry):
    with pytest.raises(ValueError, match=r"json_schema\.strict: unknown setting \(known: validate\)"):
        sr.json_deserializer({**settings(registry), "json_schema": {"strict": True}})
    with pytest.raises(ValueError, match=r'json_schema\.validate: expected true or false, found string "yes"'):
        sr.json_deserializer({**settings(registry), "json_schema": {"validate": "yes"}})
    with pytest.raises(ValueError, match=r"json_schema: expected a table, found boolean true"):
        sr.json_deserializer({**settings(registry), "json_schema": True})


def test_failures_go_through_the_policy(registry):
    stage = deserialize_stage("dlq", settings(registry), value="schema_registry_json")
    records, dead = stage.deserialize(consumer_records([text(1, {"id": 1}), text(77, {"id": 2}),
                                                        text(1, {"id": None}), b'{"id": 3}']))
    assert [r.value for r in records] == [{"id": 1}] and [d.offset for d in dead] == [1, 2, 3]
    errors = [dict(d.headers)["kdaemon.error"].decode() for d in dead]
    assert errors[0].startswith(f"SchemaNotFound: schema id 77: not found in the registry: GET {registry.url}")
    assert errors[1] == 'SchemaDecodeError: schema id 1: the value does not satisfy its schema at $.id: type = "integer"'
    assert errors[2].startswith("WireFormatError: magic byte is 0x7b")
