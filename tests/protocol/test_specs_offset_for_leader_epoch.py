"""OffsetForLeaderEpoch (key 23) spec: round trips at every version, and hand-built bytes.

The hand-built frames are written with ``struct.pack`` from the layouts in Kafka's
``OffsetForLeaderEpochRequest.json`` / ``Response.json``, not from our spec.
"""

from __future__ import annotations

import struct

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis import api_by_key
from kdaemon.protocol.apis.offset_for_leader_epoch import CONSUMER_MIN_VERSION, OFFSET_FOR_LEADER_EPOCH
from kdaemon.protocol.errors import DecodeError
from kdaemon.protocol.primitives import Reader, encode_uvarint
from tests.protocol.spec_values import sample_value
from tests.protocol.hand_bytes import cstr as _cstr, str16 as _str16

API = OFFSET_FOR_LEADER_EPOCH
VERSIONS = range(API.min_version, API.max_version + 1)
NO_TAGS = b"\x00"


def test_declared_range_and_registry():
    # Kafka 4 brokers offer 2-4 (the request JSON's validVersions); flexible from 4.
    assert (API.key, API.min_version, API.max_version, str(API.flexible)) == (23, 2, 4, "4+")
    assert api_by_key(23) is API
    assert CONSUMER_MIN_VERSION == 3


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("version", VERSIONS)
def test_request_roundtrip(version, seed):
    body = sample_value(API.request, version, API.is_flexible(version), seed)
    frame = messages.encode_request(API, version, 77, "kdaemon-test", body)
    header, decoded = messages.decode_request(api_by_key, frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id) == (23, version, 77)
    assert decoded == body


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("version", VERSIONS)
def test_response_roundtrip(version, seed):
    body = sample_value(API.response, version, API.is_flexible(version), seed)
    frame = messages.encode_response(API, version, 5, body)
    assert messages.decode_response(API, version, memoryview(frame)[4:]) == body


@pytest.mark.parametrize("version", VERSIONS)
def test_absent_fields_are_not_written(version):
    flexible = API.is_flexible(version)
    for side in (API.request, API.response):
        clean = sample_value(side, version, flexible, 1)
        noisy = sample_value(side, version, flexible, 1, absent="noise")
        assert codec.encode(side, version, flexible, noisy) == codec.encode(side, version, flexible, clean)


def test_defaults_follow_the_json():
    # replica_id defaults to -2 (debug consumer) in Kafka's JSON: a consumer must send -1 itself.
    assert API.request.default() == {"replica_id": -2, "topics": []}
    part = API.request.fields[1].type.of.fields[1].type.of
    assert part.default() == {"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}
    result = API.response.fields[1].type.of.fields[1].type.of
    assert result.default()["leader_epoch"] == -1


def _consumer_request(replica_id: int = -1) -> dict:
    return {"replica_id": replica_id, "topics": [{"topic": "orders", "partitions": [
        {"partition": 2, "current_leader_epoch": 7, "leader_epoch": 5},
        {"partition": 0, "current_leader_epoch": 7, "leader_epoch": 3}]}]}


def test_v2_request_bytes_have_no_replica_id():
    expected = (struct.pack(">i", 1) + _str16("orders")
                + struct.pack(">i", 2) + struct.pack(">iii", 2, 7, 5) + struct.pack(">iii", 0, 7, 3))
    assert codec.encode(API.request, 2, False, _consumer_request()) == expected


def test_v3_request_frame_bytes():
    body = (struct.pack(">i", -1) + struct.pack(">i", 1) + _str16("orders")
            + struct.pack(">i", 2) + struct.pack(">iii", 2, 7, 5) + struct.pack(">iii", 0, 7, 3))
    header = struct.pack(">hhi", 23, 3, 9) + _str16("cli")
    frame = messages.encode_request(API, 3, 9, "cli", _consumer_request())
    assert frame == struct.pack(">i", len(header) + len(body)) + header + body


def test_v4_request_bytes_are_compact_with_tagged_sections():
    expected = (struct.pack(">i", -1)
                + encode_uvarint(2) + _cstr("orders")
                + encode_uvarint(3)
                + struct.pack(">iii", 2, 7, 5) + NO_TAGS
                + struct.pack(">iii", 0, 7, 3) + NO_TAGS
                + NO_TAGS       # topic
                + NO_TAGS)      # request
    assert codec.encode(API.request, 4, True, _consumer_request()) == expected


def test_v3_response_bytes():
    data = (struct.pack(">i", 12) + struct.pack(">i", 1) + _str16("orders")
            + struct.pack(">i", 2)
            + struct.pack(">hiiq", 0, 2, 5, 1234)
            + struct.pack(">hiiq", 74, 0, -1, -1))     # FENCED_LEADER_EPOCH, undefined answer
    decoded = codec.decode(API.response, 3, False, Reader(data))
    assert decoded == {"throttle_time_ms": 12, "topics": [{"topic": "orders", "partitions": [
        {"error_code": 0, "partition": 2, "leader_epoch": 5, "end_offset": 1234},
        {"error_code": 74, "partition": 0, "leader_epoch": -1, "end_offset": -1}]}]}
    assert codec.encode(API.response, 3, False, decoded) == data


def test_v4_response_frame_bytes_and_unknown_tags_skipped():
    body = (struct.pack(">i", 0) + encode_uvarint(2) + _cstr("t") + encode_uvarint(2)
            + struct.pack(">hiiq", 0, 1, 9, 77)
            + encode_uvarint(1) + encode_uvarint(5) + encode_uvarint(3) + b"new"   # a future tag
            + NO_TAGS + NO_TAGS)
    frame = struct.pack(">i", 4) + NO_TAGS + body         # response header v1: correlation + tags
    decoded = messages.decode_response(API, 4, frame)
    assert decoded["topics"] == [{"topic": "t", "partitions": [
        {"error_code": 0, "partition": 1, "leader_epoch": 9, "end_offset": 77}]}]


@pytest.mark.parametrize("version", VERSIONS)
def test_every_truncation_is_a_decode_error(version):
    flexible = API.is_flexible(version)
    for side in (API.request, API.response):
        data = codec.encode(side, version, flexible, sample_value(side, version, flexible, 2))
        for n in range(len(data)):
            with pytest.raises(DecodeError):
                codec.decode(side, version, flexible, Reader(data[:n]))
