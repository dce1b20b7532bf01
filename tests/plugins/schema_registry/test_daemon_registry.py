"""``kdaemon run`` end to end with the schema_registry plugin, on Apache Kafka and a real registry.

confluent-kafka's own serializers write, through Apicurio Registry, records whose key is a
Protobuf ``OrderKey`` and whose value is an Avro ``User`` (two schema versions, a tombstone among
them) to a topic of two partitions, plus one record whose value names a schema id the registry
does not have.  The daemon (one worker, ``plugins = ["schema_registry"]``, key
``schema_registry_protobuf``, value ``schema_registry_avro``, the jsonl sink, the default DLQ)
reads the topic; then every record is in the output once with exactly the key and value its
producer serialized, the unknown id's record is in the dead letters with its bytes and a
``SchemaNotFound`` error, and the group's committed offsets are at the end of both partitions
(the dead letter's offset committed too).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka.schema_registry.avro", reason="needs confluent-kafka[schemaregistry,avro]")

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from kdaemon.sinks.encoding import decode_data
from testkit.daemon import Daemon, daemon_config, wait_for
from tests.plugins.schema_registry.helpers import wire
from testkit.produce import committed_offsets, create_topic, high_watermarks, produce

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 2
PER_PARTITION = 25
USER_V1 = {"type": "record", "name": "User", "namespace": "acme", "fields": [
    {"name": "id", "type": "long"},
    {"name": "name", "type": "string"},
    {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["ADMIN", "GUEST"]}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "scores", "type": {"type": "map", "values": "double"}},
    {"name": "avatar", "type": ["null", "bytes"], "default": None},
    {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
        {"name": "city", "type": "string"}, {"name": "zip", "type": ["null", "int"]}]}], "default": None},
]}
# A second version of the subject (a field added): both ids appear in the topic.
USER_V2 = {**USER_V1, "fields": USER_V1["fields"] + [{"name": "email", "type": ["null", "string"], "default": None}]}


def user(i: int) -> tuple[dict, dict]:
    value = {"id": 2**60 + i, "name": f"user-{i}", "kind": "ADMIN" if i % 3 == 0 else "GUEST",
             "tags": [f"t{j}" for j in range(i % 3)], "scores": {"q": i / 4} if i % 2 else {},
             "avatar": bytes([i, 255 - i]) if i % 4 == 0 else None,
             "address": {"city": f"city-{i}", "zip": i if i % 5 else None} if i % 2 == 0 else None}
    if i % 2:
        return USER_V2, {**value, "email": f"u{i}@acme.test" if i % 3 else None}
    return USER_V1, value


def lines(directory: Path) -> list[dict]:
    """Every complete line of the jsonl files under ``directory`` (published or open)."""
    out = []
    if directory.is_dir():
        for path in sorted(directory.iterdir()):
            if path.name.endswith((".jsonl", ".jsonl.open")):
                out.extend(json.loads(line) for line in path.read_bytes().split(b"\n")[:-1] if line)
    return out


def test_daemon_decodes_protobuf_keys_and_avro_values_and_dead_letters_an_unknown_id(
        kafka, schema_registry, pb2, tmp_path):
    topic = f"sr-{uuid.uuid4().hex[:8]}"
    group = f"sr-group-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    client = SchemaRegistryClient({"url": schema_registry.ccompat_url})
    keys = ProtobufSerializer(pb2["shop"].OrderKey, client, {"use.deprecated.format": False})
    values = {id(s): AvroSerializer(client, json.dumps(s)) for s in (USER_V1, USER_V2)}
    key_ctx = SerializationContext(topic, MessageField.KEY)
    value_ctx = SerializationContext(topic, MessageField.VALUE)

    expected: dict[tuple[int, int], tuple[dict, dict | None]] = {}
    unknown: tuple[int, int] | None = None
    for p in range(PARTITIONS):
        batch, wanted = [], []
        for n in range(PER_PARTITION):
            i = p * PER_PARTITION + n
            key = {"region": f"r{p}", "id": 2**62 + i}
            key_bytes = keys(pb2["shop"].OrderKey(**key), key_ctx)
            if p == 0 and n == 10:       # the record no registry can decode
                batch.append((key_bytes, wire(2**31 - 7, b"\x02\x04"), [("seq", str(i).encode())]))
                wanted.append(None)
                continue
            if n == 20:                  # a tombstone
                batch.append((key_bytes, None, [("seq", str(i).encode())]))
                wanted.append((key, None))
                continue
            schema, value = user(i)
            batch.append((key_bytes, values[id(schema)](value, value_ctx), [("seq", str(i).encode())]))
            wanted.append((key, value))
        for d, want in zip(produce(kafka.bootstrap, topic, batch, partition=p), wanted):
            if want is None:
                unknown = (d.partition, d.offset)
            else:
                expected[(d.partition, d.offset)] = want
    assert unknown is not None and len(expected) == PARTITIONS * PER_PARTITION - 1

    config = daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=1, on_deserialize_error="dlq")
    config["plugins"] = ["schema_registry"]
    config["deserializer"] = {"key": "schema_registry_protobuf", "value": "schema_registry_avro",
                              "settings": {"schema_registry": {"url": schema_registry.ccompat_url}}}
    ends = high_watermarks(kafka.bootstrap, topic, PARTITIONS)
    dlq_dir = tmp_path / "state" / "dlq"
    with Daemon(tmp_path, config) as daemon:
        wait_for(lambda: len(daemon.output()) >= len(expected) and lines(dlq_dir), 120,
                 "every record in the output and the dead letter", daemon.log_tail)
        wait_for(lambda: committed_offsets(kafka.bootstrap, group, topic, PARTITIONS) == ends, 60,
                 f"the group's commits at the partitions' ends {ends}", daemon.log_tail)
        assert daemon.stop() == 0, daemon.log_tail()
        output, dead = daemon.output(), lines(dlq_dir)

    got = {(r["partition"], r["offset"]): (decode_data(r["key"]), decode_data(r["value"])) for r in output}
    assert len(output) == len(got) == len(expected)          # each record once
    assert got == expected
    assert all(r["topic"] == topic for r in output)
    assert len(dead) == 1 and (dead[0]["partition"], dead[0]["offset"]) == unknown
    headers = dict((k, decode_data(v)) for k, v in dead[0]["headers"])
    assert decode_data(dead[0]["value"]) == wire(2**31 - 7, b"\x02\x04")       # the broker's bytes
    assert headers["seq"] == b"10"
    assert headers["kdaemon.error"].decode().startswith(
        f"SchemaNotFound: schema id {2**31 - 7}: not found in the registry: GET "
        f"{schema_registry.ccompat_url}/schemas/ids/{2**31 - 7} answered HTTP 404"), headers
