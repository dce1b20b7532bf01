"""The CreateTopics spec (key 19), which creates the demo's topic and a Kafka DLQ's topic when
asked (``kdaemon.client.admin``).

No broker needed here (the real-broker round trip of every version is in
test_protocol_kafka.py): every version of both sides round-trips values that differ from the
defaults, with random nulls; a truncated frame is a ``DecodeError``; the v4 (classic) and v7
(flexible: topic id, tagged config error code) layouts are written out by hand from Kafka's
JSON; and the spec is compared field by field with the JSON definitions of the Kafka release the
tests run (4.4), read from its kafka-clients jar.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis import api_by_key
from kdaemon.protocol.apis.create_topics import CREATE_TOPICS
from kdaemon.protocol.errors import DecodeError, Errors
from kdaemon.protocol.primitives import Reader, encode_uvarint
from tests.protocol.hand_bytes import cstr, str16
from tests.protocol.kafka_json import assert_matches_release
from tests.protocol.spec_values import sample_value

SIDES = [pytest.param(v, side, id=f"v{v}-{side}") for v in range(CREATE_TOPICS.min_version,
                                                                  CREATE_TOPICS.max_version + 1)
         for side in ("request", "response")]
NO_TAGS = b"\x00"


def test_declared_range():
    assert (CREATE_TOPICS.key, CREATE_TOPICS.min_version, CREATE_TOPICS.max_version, str(CREATE_TOPICS.flexible)) == \
        (19, 2, 7, "5+")
    assert api_by_key(19) is CREATE_TOPICS


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
@pytest.mark.parametrize("version, side", SIDES)
def test_round_trip(version, side, seed):
    s = getattr(CREATE_TOPICS, side)
    flexible = CREATE_TOPICS.is_flexible(version)
    body = sample_value(s, version, flexible, seed)
    r = Reader(codec.encode(s, version, flexible, body))
    assert codec.decode(s, version, flexible, r) == body and r.remaining == 0


@pytest.mark.parametrize("version, side", SIDES)
def test_every_truncation_is_a_decode_error(version, side):
    s = getattr(CREATE_TOPICS, side)
    flexible = CREATE_TOPICS.is_flexible(version)
    data = codec.encode(s, version, flexible, sample_value(s, version, flexible, seed=1))
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(s, version, flexible, Reader(data[:n]))


def test_v4_bytes():
    data = messages.encode_request(CREATE_TOPICS, 4, 3, "kd", {
        "topics": [{"name": "dlq", "num_partitions": -1, "replication_factor": 3, "assignments": [],
                    "configs": [{"name": "retention.ms", "value": "-1"}, {"name": "cleanup.policy", "value": None}]}],
        "timeout_ms": 30000, "validate_only": True})
    body = (struct.pack(">hhi", 19, 4, 3) + str16("kd")               # request header v1
            + struct.pack(">i", 1) + str16("dlq") + struct.pack(">ih", -1, 3)
            + struct.pack(">i", 0)                                     # no assignments
            + struct.pack(">i", 2) + str16("retention.ms") + str16("-1") + str16("cleanup.policy") + str16(None)
            + struct.pack(">i", 30000) + b"\x01")
    assert data == struct.pack(">i", len(body)) + body
    answer = (struct.pack(">i", 3)                                     # response header v0
              + struct.pack(">i", 0) + struct.pack(">i", 1)
              + str16("dlq") + struct.pack(">h", Errors.INVALID_REPLICATION_FACTOR)
              + str16("Unable to replicate the partition 3 time(s): The target replication factor of 3 "
                      "cannot be reached because only 1 broker(s) are registered."))
    decoded = messages.decode_response(CREATE_TOPICS, 4, answer)
    (topic,) = decoded["topics"]
    assert (topic["name"], topic["error_code"]) == ("dlq", 38) and "only 1 broker" in topic["error_message"]
    assert messages.encode_response(CREATE_TOPICS, 4, 3, decoded)[4:] == answer


def test_v7_bytes():
    tid = uuid.UUID("0b7e6a2c-1f43-4d5e-9a8b-123456789abc")
    data = messages.encode_request(CREATE_TOPICS, 7, 8, "kd", {
        "topics": [{"name": "demo.events", "num_partitions": 4, "replication_factor": 1,
                    "assignments": [{"partition_index": 0, "broker_ids": [1, 2]}], "configs": []}]})
    body = (struct.pack(">hhi", 19, 7, 8) + str16("kd") + NO_TAGS    # request header v2
            + encode_uvarint(2) + cstr("demo.events") + struct.pack(">ih", 4, 1)
            + encode_uvarint(2) + struct.pack(">i", 0) + encode_uvarint(3) + struct.pack(">ii", 1, 2) + NO_TAGS
            + encode_uvarint(1) + NO_TAGS
            + struct.pack(">i", 60000) + b"\x00" + NO_TAGS)           # the defaults: 60 s, not validate-only
    assert data == struct.pack(">i", len(body)) + body
    answer = (struct.pack(">i", 8) + NO_TAGS                          # response header v1
              + struct.pack(">i", 0) + encode_uvarint(2)
              + cstr("demo.events") + tid.bytes + struct.pack(">h", 0) + cstr(None)
              + struct.pack(">ih", 4, 1)
              + encode_uvarint(2) + cstr("cleanup.policy") + cstr("delete") + b"\x00" + struct.pack(">b", 5)
              + b"\x00" + NO_TAGS
              + encode_uvarint(1) + encode_uvarint(0) + encode_uvarint(2) + struct.pack(">h", 29)   # tag 0
              + NO_TAGS)
    decoded = messages.decode_response(CREATE_TOPICS, 7, answer)
    assert decoded == {"throttle_time_ms": 0, "topics": [{
        "name": "demo.events", "topic_id": tid, "error_code": 0, "error_message": None,
        "topic_config_error_code": 29, "num_partitions": 4, "replication_factor": 1,
        "configs": [{"name": "cleanup.policy", "value": "delete", "read_only": False, "config_source": 5,
                     "is_sensitive": False}]}]}
    assert messages.encode_response(CREATE_TOPICS, 7, 8, decoded)[4:] == answer


@pytest.mark.kafka
@pytest.mark.parametrize("side", ("request", "response"))
def test_spec_matches_kafka_json_definitions(side):
    assert_matches_release(CREATE_TOPICS, side)
