"""The ``schema_registry_protobuf`` deserializer without a real registry: Confluent's message
indexes, schemas given as ``.proto`` source (compiled by protoc) and as base64 descriptors,
references and well-known imports, what a message becomes, and the failures that reach the
``on_deserialize_error`` policy.  Messages are written by protoc-generated classes (protos/);
the registry is the in-test server of helpers.py."""

from __future__ import annotations

import base64

import pytest

import kdaemon_schema_registry as sr
from kdaemon.testing import make_record, run_plugin
from kdaemon_schema_registry.errors import SchemaDecodeError, SchemaNotFound, WireFormatError
from kdaemon_schema_registry.protobuf import message_to_dict
from tests.plugins.schema_registry.helpers import (EMPTY_ORDER, FULL_ORDER, FakeRegistry, consumer_records,
                                                   deserialize_stage, full_order, proto_source, protobuf_wire,
                                                   wire)

COMMON, SHOP = "kdaemon_tests/common.proto", "kdaemon_tests/shop.proto"
COMMON_REF = [{"name": COMMON, "subject": "common", "version": 1}]


@pytest.fixture
def registry():
    r = FakeRegistry()
    yield r
    r.stop()


def settings(registry):
    return {"schema_registry": {"url": registry.url}}


def b64(module) -> str:
    return base64.b64encode(module.DESCRIPTOR.serialized_pb).decode()


def register_shop(registry, pb2, schema_id: int, *, source: bool) -> None:
    """shop.proto under ``schema_id``, common.proto as its reference: as .proto source (what
    Java's serializer registers) or as base64 descriptors (what confluent-kafka's does)."""
    if source:
        registry.add_version("common", 1, proto_source(COMMON), schema_type="PROTOBUF")
        registry.add_schema(schema_id, proto_source(SHOP), schema_type="PROTOBUF", references=COMMON_REF)
    else:
        registry.add_version("common", 1, b64(pb2["common"]), schema_type="PROTOBUF")
        registry.add_schema(schema_id, b64(pb2["shop"]), schema_type="PROTOBUF", references=COMMON_REF)


# -- the message indexes ------------------------------------------------------------------------

@pytest.mark.parametrize("payload, indexes, offset", [
    (b"\x00\x0a", (0,), 1),                  # the single-zero shorthand for the first message
    (b"\x02\x02", (1,), 2),                  # [1]
    (b"\x06\x02\x00\x00\x0a", (1, 0, 0), 4),  # [1, 0, 0]
    (b"\x02\x80\x01", (64,), 3),             # zigzag 128 = 64: a two-byte varint
    (b"\x02\x00", (0,), 2),                  # [0] written out in full, as some serializers do
])
def test_message_indexes(payload, indexes, offset):
    assert sr.message_indexes(payload) == (indexes, offset)


@pytest.mark.parametrize("payload, message", [
    (b"", r"end inside their count"),
    (b"\x04\x02\x80", r"end inside index 1"),
    (b"\x01", r"message-index count is -1"),
    (b"\x14\x02", r"message-index count is 10, with 1 byte\(s\) left"),
    (b"\x02\x03", r"message index 0 is negative \(-2\)"),
    (b"\x02\xff\xff\xff\xff\xff\x01", r"varint longer than 5 bytes in index 0"),
])
def test_message_index_errors(payload, message):
    with pytest.raises(WireFormatError, match=message):
        sr.message_indexes(payload)


# -- decoding ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("source", [True, False], ids=["proto-source", "base64-descriptor"])
def test_decodes_every_kind_of_field(registry, pb2, source):
    register_shop(registry, pb2, 1, source=source)
    deserialize = sr.protobuf_deserializer(settings(registry))
    assert deserialize("t", [], protobuf_wire(1, [1], full_order(pb2))) == FULL_ORDER
    assert deserialize("t", [], protobuf_wire(1, [1], pb2["shop"].Order())) == EMPTY_ORDER
    assert deserialize("t", [], None) is None
    # the first message with the shorthand, a nested one, a third top-level one
    assert deserialize("t", [], protobuf_wire(1, [0], pb2["shop"].Ping(**{"from": "me"}))) == {"from": "me"}
    note = pb2["shop"].Order.Line.Note(text="x")
    assert deserialize("t", [], protobuf_wire(1, [1, 0, 0], note)) == {"text": "x"}
    assert deserialize("t", [], protobuf_wire(1, [2], pb2["shop"].OrderKey(region="eu", id=-1))) == \
        {"region": "eu", "id": -1}
    paths = [p for p, _ in registry.requests]
    assert paths == ["/schemas/ids/1", "/subjects/common/versions/1"]   # built once per id


def test_agrees_with_protobufs_json_mapping_but_for_int64_and_bytes(pb2):
    from google.protobuf import json_format
    order = full_order(pb2)
    mapped = json_format.MessageToDict(order, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True)
    ours = message_to_dict(order)
    assert mapped["id"] == str(ours["id"]) and mapped["blob"] == base64.b64encode(ours["blob"]).decode()
    for name in ("price", "ratio", "paid", "note", "tags", "level", "phone", "at", "took", "extra"):
        assert ours[name] == mapped[name], name
    assert set(ours) == set(mapped)


def test_an_unknown_enum_number_stays_a_number(registry, pb2):
    register_shop(registry, pb2, 1, source=False)
    order = pb2["shop"].Order(level=9)
    assert sr.protobuf_deserializer(settings(registry))("t", [], protobuf_wire(1, [1], order))["level"] == 9


def test_a_schema_with_only_well_known_imports(registry):
    text = ('syntax = "proto3"; package w; import "google/protobuf/timestamp.proto";\n'
            'message E { google.protobuf.Timestamp at = 1; int64 n = 2; }')
    registry.add_schema(3, text, schema_type="PROTOBUF")
    from google.protobuf import timestamp_pb2
    ts = timestamp_pb2.Timestamp(seconds=0, nanos=0)
    payload = b"\x00" + b"\x0a" + bytes([len(ts.SerializeToString())]) + ts.SerializeToString() + b"\x10\x05"
    assert sr.protobuf_deserializer(settings(registry))("t", [], wire(3, payload)) == \
        {"at": "1970-01-01T00:00:00Z", "n": 5}


# -- what cannot be decoded ------------------------------------------------------------------------

def test_schemas_that_cannot_be_used_are_errors_and_remembered(registry, pb2):
    registry.add_schema(4, {"type": "record", "name": "A", "fields": []})           # AVRO
    registry.add_schema(5, 'syntax = "proto3"; message M { int64 a = 1 }', schema_type="PROTOBUF")
    registry.add_schema(6, 'syntax = "proto3"; import "other.proto"; message M { Other o = 1; }',
                        schema_type="PROTOBUF")
    registry.add_schema(7, b64(pb2["shop"]), schema_type="PROTOBUF")              # its reference missing
    registry.add_schema(8, "AAAA", schema_type="PROTOBUF")                        # base64, not a descriptor
    deserialize = sr.protobuf_deserializer(settings(registry))
    for schema_id, message in [
            (4, r"^schema id 4 is a AVRO schema; this deserializer reads Protobuf only$"),
            (5, r"^schema id 5: not a valid \.proto file: protoc: schema-id-5\.proto:1:.*Expected \";\""),
            (6, r"^schema id 6: not a valid \.proto file: protoc: .*other\.proto"),
            (7, r"^schema id 7: kdaemon_tests/shop\.proto imports 'kdaemon_tests/common\.proto', which is neither "
                r"one of the schema's references nor a well-known type .*add it as a reference"),
            (8, r"^schema id 8: the schema is base64 but not a serialized FileDescriptorProto")]:
        for _ in range(2):
            with pytest.raises(SchemaDecodeError, match=message):
                deserialize("t", [], wire(schema_id, b"\x00"))
    assert len(registry.requests) == 5


@pytest.mark.parametrize("indexes, message", [
    ([3], r"schema id 1: message indexes \[3\]: index 3 is past the file's top-level messages \(3\)"),
    ([1, 5], r"schema id 1: message indexes \[1, 5\]: index 5 is past Order's nested messages \(3\)"),
])
def test_message_indexes_past_the_schema(registry, pb2, indexes, message):
    register_shop(registry, pb2, 1, source=False)
    with pytest.raises(SchemaDecodeError, match=message):
        sr.protobuf_deserializer(settings(registry))("t", [], protobuf_wire(1, indexes, pb2["shop"].Ping()))


def test_a_payload_that_is_not_the_message(registry, pb2):
    register_shop(registry, pb2, 1, source=False)
    with pytest.raises(SchemaDecodeError, match=r"schema id 1: the payload \(2 bytes\) is not a valid "
                                                r"kdaemon\.tests\.shop\.Order message"):
        sr.protobuf_deserializer(settings(registry))("t", [], wire(1, b"\x02\x02" + b"\x0a\x05"))


def test_failures_go_through_the_policy(registry, pb2):
    register_shop(registry, pb2, 1, source=False)
    stage = deserialize_stage("dlq", settings(registry), value="schema_registry_protobuf")
    good = protobuf_wire(1, [2], pb2["shop"].OrderKey(region="eu", id=1))
    bad_index = wire(1, b"\x01")
    records, dead = stage.deserialize(consumer_records([good, wire(99, b"\x00"), bad_index, good]))
    assert [r.offset for r in records] == [0, 3] and [r.value for r in records] == [{"region": "eu", "id": 1}] * 2
    errors = [dict(d.headers)["kdaemon.error"].decode() for d in dead]
    assert errors[0].startswith(f"SchemaNotFound: schema id 99: not found in the registry: GET {registry.url}")
    assert errors[1].startswith("WireFormatError: the Protobuf message-index count is -1")
    assert [d.value for d in dead] == [wire(99, b"\x00"), bad_index]


def test_key_avro_and_value_protobuf_share_one_client(registry, pb2):
    register_shop(registry, pb2, 1, source=False)
    key = sr.avro_deserializer(settings(registry))
    value = sr.protobuf_deserializer(settings(registry))
    assert key.decoder.client is value.decoder.client


def test_run_plugin(registry, pb2):
    register_shop(registry, pb2, 1, source=True)
    run = run_plugin(sr, [make_record(protobuf_wire(1, [0], pb2["shop"].Ping(**{"from": "x"})), offset=0),
                          make_record(b"\x00\x00", offset=1)],
                     deserializer=("schema_registry_protobuf", settings(registry)))
    assert run.values == [{"from": "x"}]
    assert [type(e).__name__ for _, e in run.deserialize_errors] == ["WireFormatError"]


def test_protoc_runs_once_per_schema_and_reference_even_for_a_broken_one(registry, pb2, monkeypatch):
    """Compiling is a child process: a schema's pool, and a schema that does not compile, are
    kept, so neither costs a protoc run per record (a spy counts the real runs)."""
    import kdaemon_schema_registry.protobuf as protobuf
    runs = []
    real_run = protobuf.subprocess.run

    def counting_run(args, **kwargs):
        runs.append(args[-1])
        return real_run(args, **kwargs)

    monkeypatch.setattr(protobuf.subprocess, "run", counting_run)
    register_shop(registry, pb2, 1, source=True)
    registry.add_schema(2, 'syntax = "proto3"; message M { int64 a = 1 }', schema_type="PROTOBUF")
    deserialize = sr.protobuf_deserializer(settings(registry))
    for indexes, message in [([0], pb2["shop"].Ping()), ([2], pb2["shop"].OrderKey()), ([1], pb2["shop"].Order())] * 2:
        deserialize("t", [], protobuf_wire(1, indexes, message))
    for _ in range(3):
        with pytest.raises(SchemaDecodeError, match="not a valid .proto file"):
            deserialize("t", [], wire(2, b"\x00"))
    assert runs == ["kdaemon_tests/common.proto", "schema-id-1.proto", "schema-id-2.proto"]


def test_a_reference_the_registry_lacks_is_not_remembered_as_a_broken_schema(registry, pb2):
    """A registry error on a reference is about the registry: once it has the reference (here
    with retry_backoff_ms = 0), the same schema id decodes."""
    registry.add_schema(1, b64(pb2["shop"]), schema_type="PROTOBUF", references=COMMON_REF)
    deserialize = sr.protobuf_deserializer({"schema_registry": {"url": registry.url, "retry_backoff_ms": 0}})
    data = protobuf_wire(1, [2], pb2["shop"].OrderKey(region="eu", id=5))
    with pytest.raises(SchemaNotFound, match=r"^subject 'common' version 1: not found in the registry"):
        deserialize("t", [], data)
    registry.add_version("common", 1, b64(pb2["common"]), schema_type="PROTOBUF")
    assert deserialize("t", [], data) == {"region": "eu", "id": 5}
