"""The ``schema_registry_avro`` deserializer without a real registry: the wire format, the
settings, Avro decoding (fastavro-written bytes) and how failures reach the worker's
``on_deserialize_error`` policy.  The registry is the in-test server of helpers.py."""

from __future__ import annotations

import datetime
import decimal
import json

import pytest

import kdaemon_schema_registry as sr
from kdaemon.plugins.manager import PluginManager
from kdaemon.testing import make_record, run_plugin
from kdaemon.worker.pipeline import WorkerStop
from kdaemon_schema_registry.errors import (RegistryUnavailable, SchemaDecodeError, SchemaNotFound,
                                            WireFormatError)
from tests.plugins.schema_registry.helpers import (FakeRegistry, avro_bytes, consumer_records, deserialize_stage,
                                                   wire)

USER = {"type": "record", "name": "User", "namespace": "acme", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "email", "type": ["null", "string"], "default": None},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["ADMIN", "GUEST"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "scores", "type": {"type": "map", "values": "double"}},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}]}]},
]}
ALICE = {"id": 1, "name": "Alice", "email": "a@acme.test", "kind": "ADMIN", "tags": ["x", "y"],
         "scores": {"q1": 1.5}, "address": {"city": "Oslo", "zip": 150}}
BOB = {"id": 2, "name": "Bob", "email": None, "kind": "GUEST", "tags": [], "scores": {}, "address": None}


@pytest.fixture
def registry():
    r = FakeRegistry()
    yield r
    r.stop()


def settings(registry, **table):
    return {"schema_registry": {"url": registry.url, **table}}


# -- the wire format ----------------------------------------------------------------------------

def test_wire_format_split():
    schema_id, payload = sr.split(b"\x00\x00\x00\x01\x02\x0a\x0b")
    assert schema_id == 258 and bytes(payload) == b"\x0a\x0b"
    assert sr.split(b"\x00\xff\xff\xff\xff")[0] == 2**32 - 1 and bytes(sr.split(b"\x00\x00\x00\x00\x01")[1]) == b""


@pytest.mark.parametrize("data, message", [
    (b"", r"^0 byte\(s\) is too short for the Confluent wire format"),
    (b"\x00\x00\x00\x01", r"^4 byte\(s\) is too short"),
    (b"\x01\x00\x00\x00\x01\x0a", r"^magic byte is 0x01, not 0x00: not written by a Schema Registry serializer$"),
    (b'{"id": 5}', r"magic byte is 0x7b.*looks like JSON text"),
])
def test_wire_format_errors(data, message):
    with pytest.raises(WireFormatError, match=message):
        sr.split(data)


# -- settings -------------------------------------------------------------------------------------

@pytest.mark.parametrize("table, message", [
    (None, r"schema_registry: required: a \[deserializer\.settings\.schema_registry\] table with url"),
    ("http://r", r'schema_registry: expected a table, found string "http://r"'),
    ({}, r"schema_registry\.url: required"),
    ({"url": "r:8081"}, r'schema_registry\.url: expected an http:// or https:// URL, found string "r:8081"'),
    ({"url": []}, r"schema_registry\.url: expected a URL or a non-empty list of URLs, found array \[\]"),
    ({"url": "http://u:p@r:1"}, r"schema_registry\.url: put credentials in username and password"),
    ({"url": "http://r:1", "urls": "x"}, r"schema_registry\.urls: unknown setting \(did you mean 'url'\?\) "
                                         r"\(known: ca_file, cert_file,"),
    ({"url": "http://r:1", "username": "u"}, r"schema_registry\.password: basic auth needs one of"),
    ({"url": "http://r:1", "password": "p"}, r"schema_registry\.username: required when a password is given"),
    ({"url": "http://r:1", "username": "u", "password": "p", "password_env": "X"}, r"give one of password, password_env"),
    ({"url": "http://r:1", "username": "u", "password_env": "NOPE_NOT_SET"}, r"password_env: environment variable 'NOPE_NOT_SET' is not set"),
    ({"url": "http://r:1", "username": "u", "password_file": "/nonexistent/pw"}, r"password_file: cannot read /nonexistent/pw"),
    ({"url": "http://r:1", "timeout_ms": 0},
     r"schema_registry\.timeout_ms: expected an integer >= 1 \(milliseconds\), found integer 0"),
    ({"url": "http://r:1", "retry_backoff_ms": "5s"},
     r'schema_registry\.retry_backoff_ms: expected an integer >= 0 \(milliseconds\), found string "5s"'),
    ({"url": "http://r:1", "verify": "no"}, r'schema_registry\.verify: expected true or false, found string "no"'),
    ({"url": "http://r:1", "verify": False}, r"apply to https URLs only"),
    ({"url": "https://r:1", "ca_file": "/nonexistent.pem"}, r"schema_registry\.ca_file: /nonexistent\.pem does not exist"),
    ({"url": "https://r:1", "key_file": "/etc/hostname"}, r"schema_registry\.key_file: given without cert_file"),
])
def test_settings_errors_name_the_key(table, message):
    with pytest.raises(ValueError, match=message):
        sr.avro_deserializer({} if table is None else {"schema_registry": table})


def test_avro_settings_errors_name_the_key():
    base = {"schema_registry": {"url": "http://r:1"}}
    with pytest.raises(ValueError, match=r"avro\.logical: unknown setting \(known: logical_types\)"):
        sr.avro_deserializer({**base, "avro": {"logical": False}})
    with pytest.raises(ValueError, match=r"avro\.logical_types: expected true or false, found integer 1"):
        sr.avro_deserializer({**base, "avro": {"logical_types": 1}})


def test_the_registry_and_the_formats_tables_are_checked_at_once():
    with pytest.raises(ValueError) as info:
        sr.avro_deserializer({"schema_registry": {"url": "http://r:1", "timeout_ms": -1}, "avro": {"logical_types": 1}})
    assert str(info.value).splitlines() == [
        "schema_registry.timeout_ms: expected an integer >= 1 (milliseconds), found integer -1",
        "avro.logical_types: expected true or false, found integer 1"]


def test_settings_errors_as_the_daemon_reports_them():
    with pytest.raises(ValueError, match=r"<run_plugin>: deserializer\.settings\.schema_registry\.url: required"):
        run_plugin(sr, [], deserializer=("schema_registry_avro", {"schema_registry": {}}))


def test_other_keys_of_the_shared_settings_table_are_ignored(registry):
    sr.avro_deserializer({**settings(registry), "encoding": "latin-1", "errors": "replace"})


# -- decoding ---------------------------------------------------------------------------------------

def test_decodes_records_enums_arrays_maps_and_unions(registry):
    registry.add_schema(1, USER)
    deserialize = sr.avro_deserializer(settings(registry))
    assert deserialize("t", [], avro_bytes(1, USER, ALICE)) == ALICE
    assert deserialize("t", [], avro_bytes(1, USER, BOB)) == BOB
    assert deserialize("t", [], None) is None
    assert len(registry.requests) == 1          # the parsed schema is cached per id


def test_primitive_schemas(registry):
    registry.add_schema(2, "\"string\"")
    registry.add_schema(3, {"type": "long"})
    deserialize = sr.avro_deserializer(settings(registry))
    assert deserialize("t", [], avro_bytes(2, "string", "héllo")) == "héllo"
    assert deserialize("t", [], avro_bytes(3, "long", -2**40)) == -2**40


def test_logical_types_or_their_underlying_values(registry):
    schema = {"type": "record", "name": "Payment", "fields": [
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}}]}
    registry.add_schema(4, schema)
    at = datetime.datetime(2026, 11, 28, 10, 0, tzinfo=datetime.timezone.utc)
    data = avro_bytes(4, schema, {"at": at, "amount": decimal.Decimal("12.34")})
    assert sr.avro_deserializer(settings(registry))("t", [], data) == {"at": at, "amount": decimal.Decimal("12.34")}
    plain = sr.avro_deserializer({**settings(registry), "avro": {"logical_types": False}})("t", [], data)
    assert plain == {"at": int(at.timestamp() * 1000), "amount": (1234).to_bytes(2, "big")}


def test_schema_references_are_resolved_depth_first(registry):
    country = {"type": "record", "name": "Country", "namespace": "geo", "fields": [{"name": "code", "type": "string"}]}
    address = {"type": "record", "name": "Address", "namespace": "geo",
               "fields": [{"name": "city", "type": "string"}, {"name": "country", "type": "geo.Country"}]}
    order = {"type": "record", "name": "Order", "namespace": "shop",
             "fields": [{"name": "id", "type": "int"}, {"name": "ship_to", "type": "geo.Address"},
                        {"name": "bill_to", "type": ["null", "geo.Address"]}]}
    registry.add_version("geo.Country", 1, country)
    registry.add_version("geo.Address", 2, address,
                         references=[{"name": "geo.Country", "subject": "geo.Country", "version": 1}])
    registry.add_schema(5, order, references=[{"name": "geo.Address", "subject": "geo.Address", "version": 2}])
    named: dict = {}
    import fastavro
    fastavro.parse_schema(country, named_schemas=named)
    fastavro.parse_schema(address, named_schemas=named)
    value = {"id": 9, "ship_to": {"city": "Oslo", "country": {"code": "NO"}}, "bill_to": None}
    assert sr.avro_deserializer(settings(registry))("t", [], avro_bytes(5, order, value, named)) == value


@pytest.mark.parametrize("payload, message", [
    (b"", r"schema id 1: the payload \(0 bytes\) is not valid Avro for this schema: EOFError"),
    (b"\x02\x02", r"schema id 1: the payload \(2 bytes\) is not valid Avro"),
    (b"\x02\x00\x00", r"schema id 1: 1 byte\(s\) left after the Avro datum"),
])
def test_payloads_that_do_not_match_the_schema(registry, payload, message):
    schema = {"type": "record", "name": "P", "fields": [{"name": "a", "type": "int"}, {"name": "b", "type": "string"}]}
    registry.add_schema(1, schema)
    with pytest.raises(SchemaDecodeError, match=message):
        sr.avro_deserializer(settings(registry))("t", [], wire(1, payload))


def test_unusable_schemas_are_errors_and_remembered(registry):
    registry.add_schema(6, "{not json")
    registry.add_schema(7, {"type": "record", "name": "X", "fields": [{"name": "a", "type": "nope.Missing"}]})
    registry.add_schema(8, "syntax = \"proto3\"; message M {}", schema_type="PROTOBUF")
    deserialize = sr.avro_deserializer(settings(registry))
    for schema_id, message in [(6, r"schema id 6: the registry's schema is not JSON"),
                               (7, r"schema id 7: not a valid Avro schema: .*nope\.Missing"),
                               (8, r"schema id 8 is a PROTOBUF schema; this deserializer reads Avro only")]:
        for _ in range(2):
            with pytest.raises(SchemaDecodeError, match=message):
                deserialize("t", [], wire(schema_id, b"\x00"))
    assert len(registry.requests) == 3


def test_key_and_value_share_one_client(registry):
    registry.add_schema(1, '"string"')
    registry.add_schema(2, USER)
    key, value = sr.avro_deserializer(settings(registry)), sr.avro_deserializer(settings(registry))
    assert key.decoder is value.decoder
    stage = deserialize_stage("stop", settings(registry), key="schema_registry_avro")
    raw = consumer_records([avro_bytes(2, USER, ALICE), avro_bytes(2, USER, BOB)], key=avro_bytes(1, "string", "k1"))
    records, dead = stage.deserialize(raw)
    assert [(r.key, r.value) for r in records] == [("k1", ALICE), ("k1", BOB)] and dead == []
    assert [p for p, _ in registry.requests] == ["/schemas/ids/1", "/schemas/ids/2"]


# -- failures through the worker's on_deserialize_error policy -------------------------------------

def test_unknown_id_and_bad_bytes_go_to_the_dlq_with_a_clear_error(registry):
    registry.add_schema(1, USER)
    stage = deserialize_stage("dlq", settings(registry))
    good = avro_bytes(1, USER, ALICE)
    records, dead = stage.deserialize(consumer_records([good, wire(99, b"\x00"), b'{"id": 5}', good]))
    assert [r.offset for r in records] == [0, 3] and [r.offset for r in dead] == [1, 2]
    errors = [dict(d.headers)["kdaemon.error"].decode() for d in dead]
    assert errors[0].startswith(f"SchemaNotFound: schema id 99: not found in the registry: GET "
                                f"{registry.url}/schemas/ids/99 answered HTTP 404")
    assert errors[1].startswith("WireFormatError: magic byte is 0x7b, not 0x00")
    assert dead[0].value == wire(99, b"\x00")    # the broker's bytes, as they were


def test_a_registry_outage_skips_under_skip_and_stops_under_stop(registry):
    registry.add_schema(1, USER)
    good = avro_bytes(1, USER, ALICE)
    url = registry.url
    skip = deserialize_stage("skip", settings(registry, timeout_ms=500))
    skip.deserialize(consumer_records([good]))          # id 1 is cached from here on
    registry.stop()
    records, dead = skip.deserialize(consumer_records([good, wire(2, b"\x00"), wire(3, b"\x00"), good]))
    assert [r.offset for r in records] == [0, 3] and dead == [] and skip.stats.skipped["deserialize"] == 2

    # Same settings, so the same client: id 1 is still cached and decodes; id 2 is not.
    # The outage is remembered (retry_backoff_ms, 5 s): id 2 fails at once, with the last error.
    stop = deserialize_stage("stop", {"schema_registry": {"url": url, "timeout_ms": 500}})
    with pytest.raises(WorkerStop, match=rf"deserialization failed at t-0@1: RegistryUnavailable: schema id 2: "
                                         rf"not asked, the registry failed .* ago \(schema id 2: "
                                         rf"GET {url}/schemas/ids/2 failed: .*refused\); asking again in"):
        stop.deserialize(consumer_records([good, wire(2, b"\x00")]))


def test_an_outage_costs_one_timeout_per_backoff_not_one_per_record(registry):
    import time
    registry.add_schema(1, USER)
    registry.delay = 2.0
    stage = deserialize_stage("dlq", settings(registry, timeout_ms=200, retry_backoff_ms=60_000))
    started = time.monotonic()
    records, dead = stage.deserialize(consumer_records([wire(i, b"\x00") for i in range(1, 21)]))
    assert time.monotonic() - started < 1.5 and len(dead) == 20 and len(registry.requests) == 1
    headers = [dict(d.headers)["kdaemon.error"].decode() for d in dead]
    assert "no answer within 0.2 s (timeout_ms)" in headers[0]
    assert "schema id 2: not asked, the registry failed" in headers[1]


def test_run_plugin(registry):
    registry.add_schema(1, USER)
    run = run_plugin(sr, [make_record(avro_bytes(1, USER, ALICE), offset=0), make_record(b"\x00\x00", offset=1)],
                     deserializer=("schema_registry_avro", settings(registry)))
    assert run.values == [ALICE]
    assert [type(e).__name__ for _, e in run.deserialize_errors] == ["WireFormatError"]


def test_the_entry_point():
    manager = PluginManager(enabled=["schema_registry"])
    assert "schema_registry_avro" in manager.deserializers()
