"""Against a real registry (Apicurio Registry's Confluent API): bytes written by confluent-kafka's
own AvroSerializer decode into exactly the objects it was given; an unknown id, a registry that
hangs and one that is gone reach the deserialize-error policy with a clear error.

Needs Java and Maven (the registry comes from Maven Central, testkit/schema_registry.py)
and takes ~25 s to start the registry once per session."""

from __future__ import annotations

import datetime
import decimal
import json
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka.schema_registry.avro", reason="needs confluent-kafka[schemaregistry,avro]")

from confluent_kafka.schema_registry import Schema, SchemaReference, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import kdaemon_schema_registry as sr
from kdaemon.worker.pipeline import WorkerStop
from tests.plugins.schema_registry.helpers import consumer_records, deserialize_stage, wire
from testkit.ports import listen_port

pytestmark = pytest.mark.slow

USER = {"type": "record", "name": "User", "namespace": "acme", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["ADMIN", "GUEST"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "scores", "type": {"type": "map", "values": "double"}},
    {"name": "ok", "type": "boolean"},
    {"name": "raw", "type": "bytes"},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"},
        {"name": "zip", "type": ["null", "int"], "default": None},
        {"name": "lines", "type": {"type": "array", "items": {"type": "map", "values": "string"}}}]}],
     "default": None},
]}
USERS = [
    {"id": 1, "name": "Alice", "email": "a@acme.test", "kind": "ADMIN", "tags": ["x", "y"],
     "scores": {"q1": 1.5, "q2": -0.25}, "ok": True, "raw": b"\x00\xff",
     "address": {"city": "Oslo", "zip": 150, "lines": [{"l1": "Gate 1"}, {}]}},
    {"id": -2**40, "name": "Bøb ☃", "email": None, "kind": "GUEST", "tags": [], "scores": {}, "ok": False,
     "raw": b"", "address": None},
]
ORDER_EVENT = {"type": "record", "name": "OrderEvent", "namespace": "shop", "fields": [
    {"name": "order_id", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
    {"name": "status", "type": ["null", "string", "long"]},
]}


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(schema_registry):
    return SchemaRegistryClient({"url": schema_registry.ccompat_url})


def settings(schema_registry, **table):
    return {"schema_registry": {"url": schema_registry.ccompat_url, **table}}


def serialize(client, schema, value, topic, field=MessageField.VALUE) -> bytes:
    text = schema if isinstance(schema, (str, Schema)) else json.dumps(schema)
    return AvroSerializer(client, text)(value, SerializationContext(topic, field))


def test_confluent_avro_serializer_bytes_decode_to_the_same_objects(schema_registry, client):
    topic = unique("users")
    deserialize = sr.avro_deserializer(settings(schema_registry))
    confluent = AvroDeserializer(client)
    for value in USERS:
        data = serialize(client, USER, value, topic)
        assert data[0] == 0
        assert deserialize(topic, [], data) == value == confluent(data, SerializationContext(topic, MessageField.VALUE))


def test_several_schemas_keys_and_primitives(schema_registry, client):
    topic = unique("mixed")
    stage = deserialize_stage("stop", settings(schema_registry), key="schema_registry_avro")
    key_bytes = serialize(client, '"string"', "user-1", topic, MessageField.KEY)
    v1 = serialize(client, USER, USERS[0], topic)
    other = unique("other")
    v2 = serialize(client, {"type": "array", "items": "int"}, [1, 2, 3], other)
    v3 = serialize(client, '"long"', 7, unique("longs"))
    assert len({d[1:5] for d in (key_bytes, v1, v2, v3)}) == 4          # four schema ids
    records, dead = stage.deserialize(consumer_records([v1, v2, v3, None], key=key_bytes))
    assert dead == []
    assert [r.key for r in records] == ["user-1"] * 4
    assert [r.value for r in records] == [USERS[0], [1, 2, 3], 7, None]


def test_logical_types_as_confluent_deserializes_them(schema_registry, client):
    topic = unique("orders")
    value = {"order_id": str(uuid.UUID(int=42)), "at": datetime.datetime(2026, 11, 28, 10, 0, 1, 123000,
                                                                         tzinfo=datetime.timezone.utc),
             "day": datetime.date(2026, 11, 28), "amount": decimal.Decimal("1234.56"), "status": 3}
    data = serialize(client, ORDER_EVENT, value, topic)
    expected = AvroDeserializer(client)(data, SerializationContext(topic, MessageField.VALUE))
    got = sr.avro_deserializer(settings(schema_registry))(topic, [], data)
    assert got == expected
    assert got["at"] == value["at"] and got["amount"] == value["amount"] and got["day"] == value["day"]
    plain = sr.avro_deserializer({**settings(schema_registry), "avro": {"logical_types": False}})(topic, [], data)
    assert plain["at"] == int(value["at"].timestamp() * 1000) and plain["day"] == (value["day"] - datetime.date(1970, 1, 1)).days


def test_a_schema_reference(schema_registry, client):
    address_subject = unique("geo.Address")
    address = {"type": "record", "name": "Address", "namespace": "geo",
               "fields": [{"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}]}
    order = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "id", "type": "int"}, {"name": "ship_to", "type": "geo.Address"},
                        {"name": "bill_to", "type": ["null", "geo.Address"], "default": None}]}
    try:
        client.register_schema(address_subject, Schema(json.dumps(address), "AVRO"))
        version = client.get_latest_version(address_subject).version
        topic = unique("orders")
        schema = Schema(json.dumps(order), "AVRO", [SchemaReference("geo.Address", address_subject, version)])
        value = {"id": 9, "ship_to": {"city": "Oslo", "zip": None}, "bill_to": {"city": "Bergen", "zip": 5003}}
        data = serialize(client, schema, value, topic)
    except Exception as exc:   # the registry's ccompat layer refusing references is what we want to know
        pytest.fail(f"registering a schema with a reference failed: {type(exc).__name__}: {exc}")
    assert sr.avro_deserializer(settings(schema_registry))(topic, [], data) == value


def test_an_unknown_schema_id_goes_through_the_policy(schema_registry):
    stage = deserialize_stage("dlq", settings(schema_registry))
    records, dead = stage.deserialize(consumer_records([wire(987654, b"\x02")]))
    assert records == []
    error = dict(dead[0].headers)["kdaemon.error"].decode()
    assert error.startswith(f"SchemaNotFound: schema id 987654: not found in the registry: GET "
                            f"{schema_registry.ccompat_url}/schemas/ids/987654 answered HTTP 404"), error


def test_a_registry_that_hangs_costs_one_timeout_then_recovers(schema_registry, client):
    topic = unique("hang")
    known = serialize(client, USER, USERS[0], topic)
    unknown_yet = serialize(client, '"int"', 5, unique("hang-int"))
    stage = deserialize_stage("skip", settings(schema_registry, timeout_ms=500, retry_backoff_ms=1000))
    stage.deserialize(consumer_records([known]))      # its schema is cached from here on
    schema_registry.pause()
    try:
        started = time.monotonic()
        records, _ = stage.deserialize(consumer_records([unknown_yet, known, unknown_yet, known]))
        took = time.monotonic() - started
    finally:
        schema_registry.resume()
    assert [r.offset for r in records] == [1, 3] and stage.stats.skipped["deserialize"] == 2
    assert took < 2.0, f"a hung registry held the batch for {took:.1f} s"
    time.sleep(1.1)                                   # retry_backoff_ms passed: asked again
    records, _ = stage.deserialize(consumer_records([unknown_yet]))
    assert [r.value for r in records] == [5]


def test_a_registry_that_is_gone_stops_the_worker_under_stop():
    gone = f"http://127.0.0.1:{listen_port()}/apis/ccompat/v7"    # nothing listens there
    stage = deserialize_stage("stop", {"schema_registry": {"url": gone, "timeout_ms": 1000}})
    with pytest.raises(WorkerStop, match=rf"deserialization failed at t-0@0: RegistryUnavailable: schema id 1: "
                                         rf"GET {gone}/schemas/ids/1 failed: .*refused"):
        stage.deserialize(consumer_records([wire(1, b"\x02")]))
