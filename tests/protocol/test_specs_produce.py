"""Produce (key 0) and InitProducerId (key 22) specs: round trips at every version, and frames
built by hand with ``struct.pack`` from the layouts in Kafka's ``ProduceRequest.json``,
``ProduceResponse.json`` and ``InitProducerId*.json`` (not from our spec).  Against Kafka 4.4
itself, every version round-trips byte for byte in tests/protocol/test_protocol_kafka.py."""

from __future__ import annotations

import struct
import uuid

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis import api_by_key
from kdaemon.protocol.apis.init_producer_id import INIT_PRODUCER_ID
from kdaemon.protocol.apis.produce import PRODUCE
from kdaemon.protocol.primitives import Reader, encode_uvarint
from tests.protocol.spec_values import sample_value
from tests.protocol.hand_bytes import cstr as _cstr, str16 as _str16

APIS = [PRODUCE, INIT_PRODUCER_ID]
CASES = [(api, v) for api in APIS for v in range(api.min_version, api.max_version + 1)]
IDS = [f"{api.name}-v{v}" for api, v in CASES]


def test_declared_ranges_and_registry():
    # Kafka 4.x: Produce 3-13 (0-2 removed by KIP-896), flexible from 9; InitProducerId 0-5, from 2.
    assert (PRODUCE.key, PRODUCE.min_version, PRODUCE.max_version, str(PRODUCE.flexible)) == (0, 3, 13, "9+")
    assert (INIT_PRODUCER_ID.key, INIT_PRODUCER_ID.min_version, INIT_PRODUCER_ID.max_version,
            str(INIT_PRODUCER_ID.flexible)) == (22, 0, 5, "2+")
    assert api_by_key(0) is PRODUCE and api_by_key(22) is INIT_PRODUCER_ID


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("api,version", CASES, ids=IDS)
def test_request_roundtrip(api, version, seed):
    body = sample_value(api.request, version, api.is_flexible(version), seed)
    frame = messages.encode_request(api, version, 9, "kdaemon-test", body)
    header, decoded = messages.decode_request(api_by_key, frame[4:])
    assert (header.api_key, header.api_version) == (api.key, version)
    if api is PRODUCE:   # RECORDS decode as zero-copy views of the frame
        for t in decoded["topic_data"]:
            for p in t["partition_data"]:
                p["records"] = None if p["records"] is None else bytes(p["records"])
    assert decoded == body


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("api,version", CASES, ids=IDS)
def test_response_roundtrip(api, version, seed):
    body = sample_value(api.response, version, api.is_flexible(version), seed)
    frame = messages.encode_response(api, version, 5, body)
    assert messages.decode_response(api, version, memoryview(frame)[4:]) == body


@pytest.mark.parametrize("api,version", CASES, ids=IDS)
def test_absent_fields_are_not_written(api, version):
    flexible = api.is_flexible(version)
    for side in (api.request, api.response):
        clean = sample_value(side, version, flexible, 1)
        noisy = sample_value(side, version, flexible, 1, absent="noise")
        assert codec.encode(side, version, flexible, noisy) == codec.encode(side, version, flexible, clean)


def _produce_body(topic_id=None) -> dict:
    t = {"name": "dlq", "topic_id": topic_id or uuid.UUID(int=0)}
    return {"transactional_id": None, "acks": -1, "timeout_ms": 30_000,
            "topic_data": [dict(t, partition_data=[{"index": 2, "records": b"BATCH"}])]}


def test_produce_v8_request_bytes():
    expected = (_str16(None) + struct.pack(">hi", -1, 30_000)
                + struct.pack(">i", 1) + _str16("dlq")
                + struct.pack(">i", 1) + struct.pack(">i", 2) + struct.pack(">i", 5) + b"BATCH")
    assert codec.encode(PRODUCE.request, 8, False, _produce_body()) == expected


def test_produce_v13_request_names_the_topic_by_id():
    tid = uuid.UUID("0123456789abcdef0123456789abcdef")
    expected = (b"\x00" + struct.pack(">hi", -1, 30_000)
                + encode_uvarint(2) + tid.bytes
                + encode_uvarint(2) + struct.pack(">i", 2) + encode_uvarint(6) + b"BATCH" + b"\x00"
                + b"\x00" + b"\x00")
    assert codec.encode(PRODUCE.request, 13, True, _produce_body(tid)) == expected


def test_produce_v10_response_with_current_leader_and_endpoints():
    # One partition answered NOT_LEADER_OR_FOLLOWER (6) with the new leader (KIP-951): tag 0
    # of the partition, and the broker's endpoint in the response's tag 0.
    leader = struct.pack(">ii", 3, 17) + b"\x00"
    partition = (struct.pack(">ihqqq", 1, 6, -1, -1, -1) + encode_uvarint(1) + _cstr(None)
                 + encode_uvarint(1) + encode_uvarint(0) + encode_uvarint(len(leader)) + leader)
    endpoint = encode_uvarint(2) + struct.pack(">i", 3) + _cstr("b3") + struct.pack(">i", 9092) + _cstr(None) + b"\x00"
    raw = (encode_uvarint(2) + _cstr("dlq") + encode_uvarint(2) + partition + b"\x00"
           + struct.pack(">i", 0) + encode_uvarint(1) + encode_uvarint(0) + encode_uvarint(len(endpoint)) + endpoint)
    body = codec.decode(PRODUCE.response, 10, True, Reader(raw))
    p = body["responses"][0]["partition_responses"][0]
    assert (p["index"], p["error_code"], p["current_leader"]) == (1, 6, {"leader_id": 3, "leader_epoch": 17})
    assert body["node_endpoints"] == [{"node_id": 3, "host": "b3", "port": 9092, "rack": None}]
    assert codec.encode(PRODUCE.response, 10, True, body) == raw


def test_init_producer_id_bytes():
    assert codec.encode(INIT_PRODUCER_ID.request, 1, False,
                        {"transactional_id": None, "transaction_timeout_ms": 60_000}) == \
        _str16(None) + struct.pack(">i", 60_000)
    assert codec.encode(INIT_PRODUCER_ID.request, 2, True,   # flexible, no id and epoch before v3
                        {"transactional_id": None, "transaction_timeout_ms": 60_000,
                         "producer_id": 7, "producer_epoch": 2}) == b"\x00" + struct.pack(">i", 60_000) + b"\x00"
    assert codec.encode(INIT_PRODUCER_ID.request, 4, True,
                        {"transactional_id": None, "transaction_timeout_ms": 60_000,
                         "producer_id": 7, "producer_epoch": 2}) == \
        b"\x00" + struct.pack(">iqh", 60_000, 7, 2) + b"\x00"
    raw = struct.pack(">ihqh", 0, 0, 4242, 3)
    assert codec.decode(INIT_PRODUCER_ID.response, 1, False, Reader(raw)) == \
        {"throttle_time_ms": 0, "error_code": 0, "producer_id": 4242, "producer_epoch": 3}


def test_produce_v5_response_bytes():
    # v2 added log_append_time_ms, v5 log_start_offset; not flexible; throttle time last.
    raw = (struct.pack(">i", 1) + _str16("dlq") + struct.pack(">i", 1)
           + struct.pack(">ihqqq", 0, 0, 42, -1, 7) + struct.pack(">i", 3))
    body = codec.decode(PRODUCE.response, 5, False, Reader(raw))
    assert body["responses"][0]["partition_responses"][0] == {
        "index": 0, "error_code": 0, "base_offset": 42, "log_append_time_ms": -1, "log_start_offset": 7,
        "record_errors": [], "error_message": None, "current_leader": {"leader_id": -1, "leader_epoch": -1}}
    assert body["throttle_time_ms"] == 3
    assert codec.encode(PRODUCE.response, 5, False, body) == raw
