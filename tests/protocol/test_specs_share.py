"""The share-group specs (KIP-932): ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch,
ShareAcknowledge and Describe/Alter/DeleteShareGroupOffsets.

Four kinds of check, no broker needed (the real-broker check is in test_protocol_kafka.py):

* every version of every request and response round-trips values that differ from the defaults
  in every field, with random nulls, and fields a version does not carry are never written;
* layouts written out by hand with ``struct.pack`` from Kafka's JSON definitions, so a spec wrong
  in the same way on both the encode and the decode side is still caught; a ShareFetch answer's
  record set goes on to the record-batch decoder, as the Fetch answer's does;
* the share error codes: names, numbers and Kafka's retriable classification;
* field by field (names, order, versions, nullability, tags, defaults) against the JSON message
  definitions of the Kafka release the tests run (4.4), read from its kafka-clients jar.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis import api_by_key
from kdaemon.protocol.apis.share_acknowledge import SHARE_ACKNOWLEDGE
from kdaemon.protocol.apis.share_fetch import ACK_ACCEPT, ACK_GAP, ACK_RELEASE, ACK_RENEW, SHARE_FETCH
from kdaemon.protocol.apis.share_group_describe import SHARE_GROUP_DESCRIBE
from kdaemon.protocol.apis.share_group_heartbeat import SHARE_GROUP_HEARTBEAT
from kdaemon.protocol.apis.share_group_offsets import (ALTER_SHARE_GROUP_OFFSETS,
                                                       DELETE_SHARE_GROUP_OFFSETS,
                                                       DESCRIBE_SHARE_GROUP_OFFSETS)
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.errors import ERROR_CODES, DecodeError, Errors
from kdaemon.protocol.primitives import Reader, encode_uvarint
from kdaemon.protocol.records import decode_record_set
from kdaemon.protocol.schema import Array, Struct
from tests.protocol.hand_bytes import cstr
from tests.protocol.kafka_json import assert_matches_release
from tests.protocol.spec_values import field_present, sample_value

APIS = (SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE,
        DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS)
SEEDS = (0, 1, 2, 3)
CASES = [pytest.param(api, v, id=f"{api.name}-v{v}")
         for api in APIS for v in range(api.min_version, api.max_version + 1)]
SIDES = [pytest.param(api, v, side, id=f"{api.name}-v{v}-{side}")
         for api in APIS for v in range(api.min_version, api.max_version + 1)
         for side in ("request", "response")]

NO_TAGS = b"\x00"
TOPIC_ID = uuid.UUID("6f1c3b52-0d4e-4a8b-9c1d-2e3f4a5b6c7d")


def carr(n: int) -> bytes:
    """A compact array's length (n + 1; 0 is null)."""
    return encode_uvarint(n + 1)


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def request_header(api, version: int, correlation_id: int, client_id: str) -> bytes:
    """Request header v2 (every share API is flexible): the classic client id, then no tags."""
    cid = client_id.encode()
    return struct.pack(">hhih", api.key, version, correlation_id, len(cid)) + cid + NO_TAGS


def response_frame(correlation_id: int, body: bytes) -> bytes:
    """Response header v1 (correlation id, no tags) and body, without the size prefix."""
    return struct.pack(">i", correlation_id) + NO_TAGS + body


# --- the declared ranges -------------------------------------------------------------------------

def test_declared_version_ranges():
    """What Kafka 4.4 defines (v0 of the four KIP-932 APIs was 4.0's early access, gone in 4.1)."""
    assert {api.name: (api.key, api.min_version, api.max_version, str(api.flexible)) for api in APIS} == {
        "ShareGroupHeartbeat": (76, 1, 1, "0+"),
        "ShareGroupDescribe": (77, 1, 1, "0+"),
        "ShareFetch": (78, 1, 2, "0+"),
        "ShareAcknowledge": (79, 1, 2, "0+"),
        "DescribeShareGroupOffsets": (90, 0, 1, "0+"),
        "AlterShareGroupOffsets": (91, 0, 0, "0+"),
        "DeleteShareGroupOffsets": (92, 0, 0, "0+"),
    }
    for api in APIS:
        assert api_by_key(api.key) is api
        assert all(api.request_header_version(v) == 2 and api.response_header_version(v) == 1
                   for v in range(api.min_version, api.max_version + 1))


def _walk(s: Struct, path: str = ""):
    for f in s.fields:
        yield f"{path}{f.name}", f
        t = f.type.of if isinstance(f.type, Array) else f.type
        if isinstance(t, Struct):
            yield from _walk(t, f"{path}{f.name}.")


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_no_tagged_fields(api):
    # Kafka 4.4 defines none in these messages; a stray tag would change every version's bytes.
    for side in (api.request, api.response):
        assert [path for path, f in _walk(side) if f.tag is not None] == []


# --- round trips at every version ----------------------------------------------------------------

def _assert_non_default(s: Struct, value: dict, version: int, flexible: bool, path: str = "") -> None:
    """Guard the generator: a default value would not prove the field is encoded."""
    for f in s.fields:
        v = value[f.name]
        fpath = f"{path}{f.name}"
        if not field_present(f, version, flexible):
            assert v == f.default_value(), fpath
            continue
        if v is None:
            assert version in f.nullable, fpath
            continue
        assert v != f.default_value(), fpath
        t = f.type.of if isinstance(f.type, Array) else f.type
        if isinstance(t, Struct):
            for item in (v if isinstance(f.type, Array) else [v]):
                _assert_non_default(t, item, version, flexible, f"{fpath}.")


@pytest.mark.parametrize("api, version, side", SIDES)
def test_samples_are_non_default(api, version, side):
    s = getattr(api, side)
    for seed in SEEDS:
        _assert_non_default(s, sample_value(s, version, True, seed), version, True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("api, version", CASES)
def test_request_round_trip(api, version, seed):
    body = sample_value(api.request, version, api.is_flexible(version), seed)
    data = messages.encode_request(api, version, 1234, "kd-share", body)
    assert struct.unpack(">i", data[:4])[0] == len(data) - 4
    header, decoded = messages.decode_request(api_by_key, data[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
        (api.key, version, 1234, "kd-share")
    assert decoded == body


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("api, version", CASES)
def test_response_round_trip(api, version, seed):
    body = sample_value(api.response, version, api.is_flexible(version), seed)
    data = messages.encode_response(api, version, 99, body)
    # Records come back as a slice of the frame (a memoryview), equal to the bytes sent.
    assert messages.decode_response(api, version, memoryview(data)[4:]) == body


@pytest.mark.parametrize("api, version, side", SIDES)
def test_fields_absent_at_a_version_are_not_written(api, version, side):
    s = getattr(api, side)
    for seed in SEEDS:
        clean = sample_value(s, version, True, seed)
        noisy = sample_value(s, version, True, seed, absent="noise")
        data = codec.encode(s, version, True, noisy)
        assert data == codec.encode(s, version, True, clean)
        r = Reader(data)
        assert codec.decode(s, version, True, r) == clean and r.remaining == 0


@pytest.mark.parametrize("api, version, side", SIDES)
def test_empty_body_decodes_to_defaults(api, version, side):
    s = getattr(api, side)
    assert codec.decode(s, version, True, Reader(codec.encode(s, version, True, {}))) == s.default()


@pytest.mark.parametrize("api, version, side", SIDES)
def test_every_truncation_is_a_decode_error(api, version, side):
    s = getattr(api, side)
    data = codec.encode(s, version, True, sample_value(s, version, True, seed=1))
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(s, version, True, Reader(data[:n]))


def test_defaults_follow_kafka():
    fetch = SHARE_FETCH.request.default()
    assert (fetch["group_id"], fetch["member_id"], fetch["max_bytes"], fetch["share_acquire_mode"],
            fetch["is_renew_ack"]) == (None, "", 0x7FFFFFFF, 0, False)
    beat = SHARE_GROUP_HEARTBEAT.request.default()
    assert (beat["rack_id"], beat["subscribed_topic_names"]) == (None, None)
    assert SHARE_GROUP_HEARTBEAT.response.default()["assignment"] is None
    group = SHARE_GROUP_DESCRIBE.response.fields[1].type.of.default()
    assert group["authorized_operations"] == -2147483648
    # Describe offsets: an empty topic list asks for nothing; "everything" must be said (null).
    ask = DESCRIBE_SHARE_GROUP_OFFSETS.request.fields[0].type.of.default()
    assert ask["topics"] == []
    partition = DESCRIBE_SHARE_GROUP_OFFSETS.response.fields[1].type.of.fields[1].type.of.fields[2].type.of
    assert partition.default()["lag"] == -1


# --- layouts written out by hand -----------------------------------------------------------------

def test_share_group_heartbeat_v1_join_request_bytes():
    member = "4d3b5a1e-member"
    data = messages.encode_request(SHARE_GROUP_HEARTBEAT, 1, 7, "kd", {
        "group_id": "sg", "member_id": member, "member_epoch": 0, "subscribed_topic_names": ["t1", "t2"]})
    body = (request_header(SHARE_GROUP_HEARTBEAT, 1, 7, "kd")
            + cstr("sg") + cstr(member) + struct.pack(">i", 0)
            + cstr(None)                                   # rack_id: null
            + carr(2) + cstr("t1") + cstr("t2")            # subscribed_topic_names
            + NO_TAGS)
    assert data == frame(body)


def test_share_group_heartbeat_v1_unchanged_fields_are_null():
    data = messages.encode_request(SHARE_GROUP_HEARTBEAT, 1, 8, "kd", {
        "group_id": "sg", "member_id": "m", "member_epoch": 3})
    assert data == frame(request_header(SHARE_GROUP_HEARTBEAT, 1, 8, "kd") + cstr("sg") + cstr("m")
                         + struct.pack(">i", 3) + b"\x00" + b"\x00" + NO_TAGS)


def test_share_group_heartbeat_v1_response_bytes():
    assignment = (b"\x01"                                  # present (a nullable struct)
                  + carr(1) + TOPIC_ID.bytes + carr(3) + struct.pack(">iii", 0, 1, 2) + NO_TAGS
                  + NO_TAGS)
    data = response_frame(41, struct.pack(">ih", 0, 0) + cstr(None) + cstr("m-1")
                          + struct.pack(">ii", 2, 5000) + assignment + NO_TAGS)
    decoded = messages.decode_response(SHARE_GROUP_HEARTBEAT, 1, data)
    assert decoded == {
        "throttle_time_ms": 0, "error_code": 0, "error_message": None, "member_id": "m-1",
        "member_epoch": 2, "heartbeat_interval_ms": 5000,
        "assignment": {"topic_partitions": [{"topic_id": TOPIC_ID, "partitions": [0, 1, 2]}]}}
    assert messages.encode_response(SHARE_GROUP_HEARTBEAT, 1, 41, decoded)[4:] == data
    unchanged = response_frame(42, struct.pack(">ih", 0, 0) + cstr(None) + cstr("m-1")
                               + struct.pack(">ii", 2, 5000) + b"\xff" + NO_TAGS)
    assert messages.decode_response(SHARE_GROUP_HEARTBEAT, 1, unchanged)["assignment"] is None


def test_share_group_describe_v1_bytes():
    data = messages.encode_request(SHARE_GROUP_DESCRIBE, 1, 3, "kd", {
        "group_ids": ["sg"], "include_authorized_operations": True})
    assert data == frame(request_header(SHARE_GROUP_DESCRIBE, 1, 3, "kd")
                         + carr(1) + cstr("sg") + b"\x01" + NO_TAGS)
    member = (cstr("m-1") + cstr("rack-a") + struct.pack(">i", 4) + cstr("client") + cstr("/127.0.0.1")
              + carr(1) + cstr("t")                                   # subscribed_topic_names
              + carr(1) + TOPIC_ID.bytes + cstr("t") + carr(2) + struct.pack(">ii", 0, 1) + NO_TAGS
              + NO_TAGS                                               # assignment's tags
              + NO_TAGS)
    group = (struct.pack(">h", 0) + cstr(None) + cstr("sg") + cstr("Stable") + struct.pack(">ii", 4, 4)
             + cstr("simple") + carr(1) + member + struct.pack(">i", 0x0F00) + NO_TAGS)
    decoded = messages.decode_response(SHARE_GROUP_DESCRIBE, 1,
                                       response_frame(5, struct.pack(">i", 0) + carr(1) + group + NO_TAGS))
    (g,) = decoded["groups"]
    assert (g["group_id"], g["group_state"], g["group_epoch"], g["assignment_epoch"], g["assignor_name"],
            g["authorized_operations"]) == ("sg", "Stable", 4, 4, "simple", 0x0F00)
    (m,) = g["members"]
    assert m == {"member_id": "m-1", "rack_id": "rack-a", "member_epoch": 4, "client_id": "client",
                 "client_host": "/127.0.0.1", "subscribed_topic_names": ["t"],
                 "assignment": {"topic_partitions": [
                     {"topic_id": TOPIC_ID, "topic_name": "t", "partitions": [0, 1]}]}}


def _ack(first: int, last: int, *types: int) -> bytes:
    return struct.pack(">qq", first, last) + carr(len(types)) + bytes(types) + NO_TAGS


def test_share_fetch_v1_request_bytes():
    forgotten = uuid.UUID(int=5)
    data = messages.encode_request(SHARE_FETCH, 1, 9, "kd", {
        "group_id": "sg", "member_id": "m-1", "share_session_epoch": 1, "max_wait_ms": 500,
        "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500, "batch_size": 100,
        "share_acquire_mode": 1, "is_renew_ack": True,          # v2 only: not written at v1
        "topics": [{"topic_id": TOPIC_ID, "partitions": [
            {"partition_index": 0, "partition_max_bytes": 99,   # v0 only: never written
             "acknowledgement_batches": [
                 {"first_offset": 0, "last_offset": 4, "acknowledge_types": [ACK_ACCEPT]},
                 {"first_offset": 5, "last_offset": 7,
                  "acknowledge_types": [ACK_RELEASE, ACK_GAP, ACK_ACCEPT]}]}]}],
        "forgotten_topics_data": [{"topic_id": forgotten, "partitions": [3]}]})
    body = (request_header(SHARE_FETCH, 1, 9, "kd")
            + cstr("sg") + cstr("m-1") + struct.pack(">iiiiii", 1, 500, 1, 1 << 20, 500, 100)
            + carr(1) + TOPIC_ID.bytes
            + carr(1) + struct.pack(">i", 0)
            + carr(2) + _ack(0, 4, 1) + _ack(5, 7, 2, 0, 1)
            + NO_TAGS                                      # partition
            + NO_TAGS                                      # topic
            + carr(1) + forgotten.bytes + carr(1) + struct.pack(">i", 3) + NO_TAGS
            + NO_TAGS)
    assert data == frame(body)


def test_share_fetch_v2_request_bytes_acquire_mode_and_renew():
    data = messages.encode_request(SHARE_FETCH, 2, 10, "kd", {
        "group_id": "sg", "member_id": "m-1", "share_session_epoch": 0, "max_wait_ms": 0,
        "min_bytes": 1, "max_records": 10, "batch_size": 10, "share_acquire_mode": 1,
        "is_renew_ack": True,
        "topics": [{"topic_id": TOPIC_ID, "partitions": [
            {"partition_index": 2, "acknowledgement_batches": [
                {"first_offset": 8, "last_offset": 8, "acknowledge_types": [ACK_RENEW]}]}]}]})
    body = (request_header(SHARE_FETCH, 2, 10, "kd")
            + cstr("sg") + cstr("m-1") + struct.pack(">iiiiii", 0, 0, 1, 0x7FFFFFFF, 10, 10)
            + b"\x01" + b"\x01"                            # share_acquire_mode, is_renew_ack
            + carr(1) + TOPIC_ID.bytes + carr(1) + struct.pack(">i", 2) + carr(1) + _ack(8, 8, 4)
            + NO_TAGS + NO_TAGS
            + carr(0)                                      # forgotten_topics_data: empty
            + NO_TAGS)
    assert data == frame(body)


def test_share_fetch_v1_response_bytes_records_and_acquired_ranges():
    batch = build_batch([RecordSpec(b"k%d" % i, b"v%d" % i, [("h", b"x")]) for i in range(4)], base_offset=10)
    partition = (struct.pack(">ih", 1, 0) + cstr(None) + struct.pack(">h", 0) + cstr(None)
                 + struct.pack(">ii", 1, 0) + NO_TAGS                         # current_leader
                 + encode_uvarint(len(batch) + 1) + batch                     # records
                 + carr(2) + struct.pack(">qqh", 10, 11, 1) + NO_TAGS         # acquired_records
                 + struct.pack(">qqh", 13, 13, 3) + NO_TAGS
                 + NO_TAGS)
    body = (struct.pack(">ih", 0, 0) + cstr(None) + struct.pack(">i", 30_000)
            + carr(1) + TOPIC_ID.bytes + carr(1) + partition + NO_TAGS
            + carr(1) + struct.pack(">i", 1) + cstr("localhost") + struct.pack(">i", 9092) + cstr(None) + NO_TAGS
            + NO_TAGS)
    data = response_frame(11, body)
    decoded = messages.decode_response(SHARE_FETCH, 1, memoryview(data))
    assert (decoded["error_code"], decoded["acquisition_lock_timeout_ms"]) == (0, 30_000)
    (topic,) = decoded["responses"]
    (p,) = topic["partitions"]
    assert topic["topic_id"] == TOPIC_ID and p["partition_index"] == 1
    assert p["current_leader"] == {"leader_id": 1, "leader_epoch": 0}
    assert p["acquired_records"] == [{"first_offset": 10, "last_offset": 11, "delivery_count": 1},
                                     {"first_offset": 13, "last_offset": 13, "delivery_count": 3}]
    assert decoded["node_endpoints"] == [{"node_id": 1, "host": "localhost", "port": 9092, "rack": None}]
    # The records are whole batches, decoded as Fetch's are; the member owns the acquired offsets.
    records, reader = decode_record_set(p["records"], topic="t", partition=1, fetch_offset=10)
    assert [(r.offset, r.key, r.value) for r in records] == [(10 + i, b"k%d" % i, b"v%d" % i) for i in range(4)]
    assert reader.next_offset == 14
    assert messages.encode_response(SHARE_FETCH, 1, 11, decoded)[4:] == data


def test_share_fetch_v2_response_acknowledge_error():
    partition = (struct.pack(">ih", 0, 0) + cstr(None) + struct.pack(">h", Errors.INVALID_RECORD_STATE)
                 + cstr("lock expired") + struct.pack(">ii", 1, 0) + NO_TAGS
                 + encode_uvarint(1)                        # records: empty, not null
                 + carr(0) + NO_TAGS)
    data = response_frame(12, struct.pack(">ih", 0, 0) + cstr(None) + struct.pack(">i", 30_000)
                          + carr(1) + TOPIC_ID.bytes + carr(1) + partition + NO_TAGS + carr(0) + NO_TAGS)
    (p,) = messages.decode_response(SHARE_FETCH, 2, data)["responses"][0]["partitions"]
    assert (p["acknowledge_error_code"], p["acknowledge_error_message"]) == (121, "lock expired")
    assert bytes(p["records"]) == b"" and p["acquired_records"] == []


def test_share_acknowledge_v1_request_bytes():
    data = messages.encode_request(SHARE_ACKNOWLEDGE, 1, 13, "kd", {
        "group_id": "sg", "member_id": "m-1", "share_session_epoch": 2, "is_renew_ack": True,
        "topics": [{"topic_id": TOPIC_ID, "partitions": [{"partition_index": 0, "acknowledgement_batches": [
            {"first_offset": 0, "last_offset": 9, "acknowledge_types": [ACK_ACCEPT]}]}]}]})
    body = (request_header(SHARE_ACKNOWLEDGE, 1, 13, "kd") + cstr("sg") + cstr("m-1") + struct.pack(">i", 2)
            + carr(1) + TOPIC_ID.bytes + carr(1) + struct.pack(">i", 0) + carr(1) + _ack(0, 9, 1)
            + NO_TAGS + NO_TAGS + NO_TAGS)
    assert data == frame(body)
    v2 = messages.encode_request(SHARE_ACKNOWLEDGE, 2, 13, "kd", {
        "group_id": "sg", "member_id": "m-1", "share_session_epoch": 2, "is_renew_ack": True, "topics": []})
    assert v2 == frame(request_header(SHARE_ACKNOWLEDGE, 2, 13, "kd") + cstr("sg") + cstr("m-1")
                       + struct.pack(">i", 2) + b"\x01" + carr(0) + NO_TAGS)


def test_share_acknowledge_v2_response_bytes():
    partitions = (carr(2)
                  + struct.pack(">ih", 0, 0) + cstr(None) + struct.pack(">ii", 1, 0) + NO_TAGS + NO_TAGS
                  + struct.pack(">ih", 1, 6) + cstr("moved") + struct.pack(">ii", 2, 5) + NO_TAGS + NO_TAGS)
    body = (struct.pack(">ih", 0, 0) + cstr(None) + struct.pack(">i", 15_000)
            + carr(1) + TOPIC_ID.bytes + partitions + NO_TAGS
            + carr(1) + struct.pack(">i", 2) + cstr("b2") + struct.pack(">i", 9093) + cstr("r2") + NO_TAGS
            + NO_TAGS)
    decoded = messages.decode_response(SHARE_ACKNOWLEDGE, 2, response_frame(14, body))
    assert decoded["acquisition_lock_timeout_ms"] == 15_000
    moved = decoded["responses"][0]["partitions"][1]
    assert (moved["error_code"], moved["error_message"], moved["current_leader"]) == \
        (Errors.NOT_LEADER_OR_FOLLOWER, "moved", {"leader_id": 2, "leader_epoch": 5})
    assert decoded["node_endpoints"] == [{"node_id": 2, "host": "b2", "port": 9093, "rack": "r2"}]
    # v1 has no acquisition_lock_timeout_ms: the same body without those four bytes.
    v1 = body[:4 + 2 + 1] + body[4 + 2 + 1 + 4:]
    assert messages.decode_response(SHARE_ACKNOWLEDGE, 1, response_frame(14, v1)) == \
        dict(decoded, acquisition_lock_timeout_ms=0)


def test_describe_share_group_offsets_bytes():
    data = messages.encode_request(DESCRIBE_SHARE_GROUP_OFFSETS, 0, 15, "kd", {
        "groups": [{"group_id": "sg", "topics": None}, {"group_id": "sg2", "topics": [
            {"topic_name": "t", "partitions": [0, 2]}]}]})
    assert data == frame(request_header(DESCRIBE_SHARE_GROUP_OFFSETS, 0, 15, "kd")
                         + carr(2) + cstr("sg") + b"\x00" + NO_TAGS               # null: every topic
                         + cstr("sg2") + carr(1) + cstr("t") + carr(2) + struct.pack(">ii", 0, 2) + NO_TAGS
                         + NO_TAGS + NO_TAGS)
    partition = struct.pack(">iqi", 0, 42, 0)
    tail = struct.pack(">h", 0) + cstr(None) + NO_TAGS
    for version, lag in ((0, b""), (1, struct.pack(">q", 7))):
        body = (struct.pack(">i", 0) + carr(1) + cstr("sg")
                + carr(1) + cstr("t") + TOPIC_ID.bytes + carr(1) + partition + lag + tail + NO_TAGS
                + struct.pack(">h", 0) + cstr(None) + NO_TAGS + NO_TAGS)
        decoded = messages.decode_response(DESCRIBE_SHARE_GROUP_OFFSETS, version, response_frame(16, body))
        (p,) = decoded["groups"][0]["topics"][0]["partitions"]
        assert (p["partition_index"], p["start_offset"], p["leader_epoch"], p["lag"]) == \
            (0, 42, 0, 7 if version else -1)


def test_alter_and_delete_share_group_offsets_bytes():
    data = messages.encode_request(ALTER_SHARE_GROUP_OFFSETS, 0, 17, "kd", {
        "group_id": "sg", "topics": [{"topic_name": "t", "partitions": [{"partition_index": 1, "start_offset": 5}]}]})
    assert data == frame(request_header(ALTER_SHARE_GROUP_OFFSETS, 0, 17, "kd") + cstr("sg")
                         + carr(1) + cstr("t") + carr(1) + struct.pack(">iq", 1, 5) + NO_TAGS + NO_TAGS + NO_TAGS)
    altered = messages.decode_response(ALTER_SHARE_GROUP_OFFSETS, 0, response_frame(18, (
        struct.pack(">ih", 0, 0) + cstr(None) + carr(1) + cstr("t") + TOPIC_ID.bytes
        + carr(1) + struct.pack(">ih", 1, Errors.NON_EMPTY_GROUP) + cstr("busy") + NO_TAGS + NO_TAGS + NO_TAGS)))
    assert altered["responses"] == [{"topic_name": "t", "topic_id": TOPIC_ID, "partitions": [
        {"partition_index": 1, "error_code": 68, "error_message": "busy"}]}]
    data = messages.encode_request(DELETE_SHARE_GROUP_OFFSETS, 0, 19, "kd", {"group_id": "sg", "topics": [{"topic_name": "t"}]})
    assert data == frame(request_header(DELETE_SHARE_GROUP_OFFSETS, 0, 19, "kd") + cstr("sg")
                         + carr(1) + cstr("t") + NO_TAGS + NO_TAGS)
    deleted = messages.decode_response(DELETE_SHARE_GROUP_OFFSETS, 0, response_frame(20, (
        struct.pack(">ih", 0, 0) + cstr(None) + carr(1) + cstr("t") + TOPIC_ID.bytes
        + struct.pack(">h", 0) + cstr(None) + NO_TAGS + NO_TAGS)))
    assert deleted["responses"] == [{"topic_name": "t", "topic_id": TOPIC_ID, "error_code": 0, "error_message": None}]


# --- the error codes share groups brought --------------------------------------------------------

def test_share_error_codes():
    """Numbers and names of Errors.java; retriable where Kafka's exception is a RetriableException."""
    expected = {121: ("INVALID_RECORD_STATE", False), 122: ("SHARE_SESSION_NOT_FOUND", True),
                123: ("INVALID_SHARE_SESSION_EPOCH", True), 124: ("FENCED_STATE_EPOCH", False),
                133: ("SHARE_SESSION_LIMIT_REACHED", True)}
    for code, (name, retriable) in expected.items():
        assert (ERROR_CODES[code].name, ERROR_CODES[code].retriable) == (name, retriable)
        assert getattr(Errors, name) == code


# --- field by field against Kafka 4.4's JSON definitions -----------------------------------------

JSON_CASES = [pytest.param(api, side, id=f"{api.name}{side.capitalize()}")
              for api in APIS for side in ("request", "response")]


@pytest.mark.kafka
@pytest.mark.parametrize("api, side", JSON_CASES)
def test_specs_match_kafka_json_definitions(api, side):
    assert_matches_release(api, side)
