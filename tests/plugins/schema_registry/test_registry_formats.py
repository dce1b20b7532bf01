"""Protobuf and JSON Schema against a real registry (Apicurio Registry's Confluent API): bytes
written by confluent-kafka's own ``ProtobufSerializer`` and ``JSONSerializer`` decode into what
they were given; schemas registered as ``.proto`` source (as Java's serializer does) decode
too; an unknown id and a value its schema refuses reach the deserialize-error policy.

Apicurio 2.6 (``/apis/ccompat/v7``) stores a PROTOBUF schema as it was registered, base64
descriptor (confluent-kafka) or source alike, and keeps the references of both types; it
refuses a JSON Schema without ``"$schema"``.  Needs Java and Maven, as test_registry_server.py."""

from __future__ import annotations

import json
import uuid

import pytest

pytest.importorskip("confluent_kafka.schema_registry.protobuf", reason="needs confluent-kafka[schemaregistry]")

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import kdaemon_schema_registry as sr
from kdaemon_schema_registry.protobuf import message_to_dict
from tests.plugins.schema_registry.helpers import (FULL_ORDER, consumer_records, deserialize_stage, full_order,
                                                   proto_source, protobuf_wire, wire)

pytestmark = pytest.mark.slow

PROTOBUF_CONF = {"use.deprecated.format": False}
# Apicurio 2.6 tells a JSON Schema by its content and refuses one without "$schema" (422:
# "Failed to discover artifact type", or "Given schema is not from type: JSON").
DRAFT7 = "http://json-schema.org/draft-07/schema#"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(schema_registry):
    return SchemaRegistryClient({"url": schema_registry.ccompat_url})


def settings(schema_registry, **extra):
    return {"schema_registry": {"url": schema_registry.ccompat_url}, **extra}


def ctx(topic: str, field=MessageField.VALUE) -> SerializationContext:
    return SerializationContext(topic, field)


# -- Protobuf -----------------------------------------------------------------------------------------

def test_confluent_protobuf_serializer_bytes(schema_registry, client, pb2):
    """Key and value, the file's first message (index 0), a later one, a nested one; a
    reference (common.proto) and well-known imports; every kind of field."""
    shop = pb2["shop"]
    topic = unique("orders")
    order = full_order(pb2)
    value_bytes = ProtobufSerializer(shop.Order, client, PROTOBUF_CONF)(order, ctx(topic))
    key_bytes = ProtobufSerializer(shop.OrderKey, client, PROTOBUF_CONF)(
        shop.OrderKey(region="eu", id=2**40), ctx(topic, MessageField.KEY))
    ping_bytes = ProtobufSerializer(shop.Ping, client, PROTOBUF_CONF)(shop.Ping(**{"from": "me"}), ctx(unique("pings")))
    note = shop.Order.Line.Note(text="nested")
    note_bytes = ProtobufSerializer(shop.Order.Line.Note, client, PROTOBUF_CONF)(note, ctx(unique("notes")))
    # What confluent-kafka wrote: the indexes as the tests expect them.
    assert value_bytes[5:7] == b"\x02\x02" and ping_bytes[5:6] == b"\x00" and note_bytes[5:9] == b"\x06\x02\x00\x00"
    stage = deserialize_stage("stop", settings(schema_registry), key="schema_registry_protobuf",
                              value="schema_registry_protobuf")
    records, dead = stage.deserialize(consumer_records([value_bytes, ping_bytes, note_bytes, None], key=key_bytes))
    assert dead == []
    assert [r.key for r in records] == [{"region": "eu", "id": 2**40}] * 4
    assert [r.value for r in records] == [FULL_ORDER, {"from": "me"}, {"text": "nested"}, None]
    # confluent-kafka's own deserializer reads the same message from the same bytes
    theirs = ProtobufDeserializer(shop.Order, PROTOBUF_CONF, client)(value_bytes, ctx(topic))
    assert theirs == order and message_to_dict(theirs) == FULL_ORDER


def test_proto_source_with_a_reference(schema_registry, client, pb2):
    """Schemas registered as .proto text, as Java's KafkaProtobufSerializer registers them."""
    common_subject = unique("kdaemon_tests/common.proto")
    client.register_schema(common_subject, Schema(proto_source("kdaemon_tests/common.proto"), "PROTOBUF"))
    version = client.get_latest_version(common_subject).version
    schema_id = client.register_schema(unique("orders-src-value"), Schema(
        proto_source("kdaemon_tests/shop.proto"), "PROTOBUF",
        [SchemaReference("kdaemon_tests/common.proto", common_subject, version)]))
    stored = client.get_schema(schema_id)
    assert stored.schema_str.startswith("// The test schema") and stored.references   # source, as registered
    deserialize = sr.protobuf_deserializer(settings(schema_registry))
    assert deserialize("t", [], protobuf_wire(schema_id, [1], full_order(pb2))) == FULL_ORDER
    assert deserialize("t", [], protobuf_wire(schema_id, [1, 0], pb2["shop"].Order.Line(sku="a", qty=1))) == \
        {"sku": "a", "qty": 1}


def test_protobuf_unknown_id_and_wrong_type_go_through_the_policy(schema_registry, client, pb2):
    json_id = client.register_schema(unique("j-value"), Schema(json.dumps({"$schema": DRAFT7, "type": "object"}), "JSON"))
    stage = deserialize_stage("dlq", settings(schema_registry), value="schema_registry_protobuf")
    good = ProtobufSerializer(pb2["shop"].Ping, client, PROTOBUF_CONF)(pb2["shop"].Ping(), ctx(unique("p")))
    records, dead = stage.deserialize(consumer_records([wire(987655, b"\x00"), good, wire(json_id, b"\x00{}")]))
    assert [r.value for r in records] == [{"from": ""}] and [d.offset for d in dead] == [0, 2]
    errors = [dict(d.headers)["kdaemon.error"].decode() for d in dead]
    assert errors[0].startswith(f"SchemaNotFound: schema id 987655: not found in the registry: GET "
                                f"{schema_registry.ccompat_url}/schemas/ids/987655 answered HTTP 404"), errors[0]
    assert errors[1] == (f"SchemaDecodeError: schema id {json_id} is a JSON schema; this deserializer reads "
                         "Protobuf only")


# -- JSON Schema ----------------------------------------------------------------------------------------

ADDRESS = {"$schema": DRAFT7, "type": "object",
           "properties": {"city": {"type": "string"}, "zip": {"type": ["integer", "null"]}}, "required": ["city"]}
ORDER = {"$schema": DRAFT7, "title": "Order", "type": "object",
         "properties": {"id": {"type": "integer"}, "ship_to": {"$ref": "address.json"},
                        "tags": {"type": "array", "items": {"type": "string"}},
                        "lines": {"type": "array", "items": {"type": "object", "properties": {
                            "sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}}},
                        "amount": {"type": "number"}, "paid": {"type": "boolean"}},
         "required": ["id", "ship_to"]}
ORDERS = [{"id": 2**62, "ship_to": {"city": "Oslo", "zip": 150}, "tags": ["a"], "lines": [{"sku": "s", "qty": 2}],
           "amount": 12.5, "paid": True},
          {"id": -1, "ship_to": {"city": "Bergen", "zip": None}, "tags": [], "lines": [], "amount": 0, "paid": False}]


def test_confluent_json_serializer_bytes_with_a_reference(schema_registry, client):
    address_subject = unique("address")
    client.register_schema(address_subject, Schema(json.dumps(ADDRESS), "JSON"))
    version = client.get_latest_version(address_subject).version
    schema = Schema(json.dumps(ORDER), "JSON", [SchemaReference("address.json", address_subject, version)])
    topic = unique("orders-json")
    serialize = JSONSerializer(schema, client)
    key_serialize = JSONSerializer(json.dumps({"$schema": DRAFT7, "type": "string"}), client)
    datas = [serialize(v, ctx(topic)) for v in ORDERS]
    key = key_serialize("order-1", ctx(topic, MessageField.KEY))
    stage = deserialize_stage("stop", settings(schema_registry), key="schema_registry_json",
                              value="schema_registry_json")
    records, dead = stage.deserialize(consumer_records(datas + [None], key=key))
    assert dead == [] and [r.key for r in records] == ["order-1"] * 3
    assert [r.value for r in records] == ORDERS + [None]
    confluent = JSONDeserializer(None, schema_registry_client=client)
    assert [confluent(d, ctx(topic)) for d in datas] == ORDERS

    # A value its schema refuses (a producer that did not validate), under the same id; an unknown id.
    schema_id = int.from_bytes(datas[0][1:5], "big")
    invalid = wire(schema_id, json.dumps({"id": 1, "ship_to": {"zip": 1}}).encode())
    dlq = deserialize_stage("dlq", settings(schema_registry), value="schema_registry_json")
    records, dead = dlq.deserialize(consumer_records([datas[1], invalid, wire(987656, b"{}")]))
    assert [r.value for r in records] == [ORDERS[1]]
    errors = [dict(d.headers)["kdaemon.error"].decode() for d in dead]
    assert errors[0] == (f"SchemaDecodeError: schema id {schema_id}: the value does not satisfy its schema at "
                         '$.ship_to: required = ["city"]')
    assert errors[1].startswith("SchemaNotFound: schema id 987656: not found in the registry")
    # validate = false: the same bytes decode without a look at the schema
    plain = sr.json_deserializer(settings(schema_registry, json_schema={"validate": False}))
    assert plain("t", [], invalid) == {"id": 1, "ship_to": {"zip": 1}}
