"""The group-coordination specs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, ConsumerGroupHeartbeat and the embedded consumer protocol.

Five kinds of check:

* every version of every request and response round-trips a value with a non-default value in
  every field (fields a version does not carry come back as their defaults);
* a few layouts written out by hand with ``struct.pack``, so a spec that is wrong in the same way
  on both the encode and the decode side is still caught;
* frames captured between librdkafka 2.x (confluent-kafka) and a Tansu broker decode, and encode
  back to the very same bytes;
* the consumer protocol's version prefix and its forward-compatibility rule;
* field by field (names, order, versions, nullability, tags, defaults) against Kafka's own JSON
  message definitions, when a copy of them is installed (kafka-python 3 ships one).
"""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis.consumer_group_heartbeat import CONSUMER_GROUP_HEARTBEAT
from kdaemon.protocol.apis.consumer_protocol import (
    CONSUMER_PROTOCOL_ASSIGNMENT,
    CONSUMER_PROTOCOL_SUBSCRIPTION,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from kdaemon.protocol.apis.find_coordinator import FIND_COORDINATOR
from kdaemon.protocol.apis.heartbeat import HEARTBEAT
from kdaemon.protocol.apis.join_group import JOIN_GROUP
from kdaemon.protocol.apis.leave_group import LEAVE_GROUP
from kdaemon.protocol.apis.offset_commit import OFFSET_COMMIT
from kdaemon.protocol.apis.offset_fetch import OFFSET_FETCH
from kdaemon.protocol.apis.sync_group import SYNC_GROUP
from kdaemon.protocol.errors import DecodeError, EncodeError
from kdaemon.protocol.primitives import Reader
from kdaemon.protocol.schema import Array, Primitive, Struct, Versions
from tests.protocol.kafka_json import assert_matches_release, compare_struct, kafka_python_json_dir, load_kafka_json
from tests.protocol.spec_values import sample_value
from tests.protocol.hand_bytes import cstr as _cstr, str16 as _str16

GROUP_APIS = (FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT,
              OFFSET_FETCH, CONSUMER_GROUP_HEARTBEAT)

# (key, implemented versions, first flexible version) as in Kafka's JSON definitions.
EXPECTED_RANGES = {
    "FindCoordinator": (10, (0, 6), 3),
    "JoinGroup": (11, (0, 9), 6),
    "SyncGroup": (14, (0, 5), 4),
    "Heartbeat": (12, (0, 4), 4),
    "LeaveGroup": (13, (0, 5), 4),
    "OffsetCommit": (8, (0, 10), 8),
    "OffsetFetch": (9, (0, 10), 6),
    "ConsumerGroupHeartbeat": (68, (0, 1), 0),
}


# --------------------------------------------------------------------------------------------
# A private value generator, written before tests/protocol/spec_values.py existed and kept because
# it differs on purpose: it never picks a default or a null at random, so every field present at
# the version is guaranteed non-default (or, with ``nulls``, every nullable field is null).
# ``_expected`` then replaces what the version does not carry by the default.


def _present(field, version: int, flexible: bool) -> bool:
    return version in field.versions and (field.tag is None or flexible)


def _primitive_value(p: Primitive, seed: int):
    k = p.kind
    if k == "int8":
        return 1 + seed % 100
    if k == "int16":
        return 1000 + seed % 1000
    if k == "uint16":
        return 40000 + seed % 1000
    if k == "int32":
        return 100_000 + seed
    if k == "uint32":
        return 3_000_000_000 + seed
    if k == "int64":
        return (1 << 40) + seed
    if k == "float64":
        return 0.5 + seed
    if k == "bool":
        return True
    if k == "uuid":
        return uuid.UUID(int=(seed + 1) * 0x1234_5678_9ABC_DEF1)
    if k == "string":
        return f"s{seed}-\u00fc"
    if k in ("bytes", "records"):
        return bytes([seed % 256, 0, 255, 7])
    raise AssertionError(f"no sample for {k}")


def _value(t, seed: int, nulls: bool):
    if isinstance(t, Primitive):
        return _primitive_value(t, seed)
    if isinstance(t, Struct):
        return _sample(t, seed, nulls)
    if isinstance(t, Array):
        return [_value(t.of, seed * 31 + i + 1, nulls) for i in range(2)]
    raise AssertionError(t)


def _sample(struct_: Struct, seed: int = 1, nulls: bool = False) -> dict:
    """Every field non-default; with ``nulls``, every nullable field is None instead."""
    out = {}
    for i, f in enumerate(struct_.fields):
        if nulls and f.nullable.lo is not None:
            out[f.name] = None
        else:
            out[f.name] = _value(f.type, seed * 7 + i, nulls)
    return out


def _expected(struct_: Struct, version: int, flexible: bool, value: dict, nulls: bool = False) -> dict:
    out = {}
    for f in struct_.fields:
        if not _present(f, version, flexible):
            out[f.name] = f.default_value()
            continue
        v = value[f.name]
        if nulls and f.nullable.lo is not None and version not in f.nullable:
            # Null is only legal where the version allows it; elsewhere send the default.
            v = f.default_value()
        if v is not None and isinstance(f.type, Struct):
            v = _expected(f.type, version, flexible, v, nulls)
        elif v is not None and isinstance(f.type, Array) and isinstance(f.type.of, Struct):
            v = [_expected(f.type.of, version, flexible, item, nulls) for item in v]
        out[f.name] = v
    return out


def _cases():
    for api in GROUP_APIS:
        for version in range(api.min_version, api.max_version + 1):
            for side in ("request", "response"):
                yield pytest.param(api, version, side, id=f"{api.name}-v{version}-{side}")


def _round_trip(struct_: Struct, version: int, flexible: bool, value: dict) -> tuple[dict, bytes]:
    data = codec.encode(struct_, version, flexible, value)
    r = Reader(data)
    decoded = codec.decode(struct_, version, flexible, r)
    assert r.remaining == 0
    return decoded, data


# --------------------------------------------------------------------------------------------
# Spec metadata


@pytest.mark.parametrize("api", GROUP_APIS, ids=lambda a: a.name)
def test_api_key_versions_and_flexible_range(api):
    key, versions, first_flexible = EXPECTED_RANGES[api.name]
    assert api.key == key
    assert (api.min_version, api.max_version) == versions
    assert [v for v in range(versions[0], versions[1] + 1) if api.is_flexible(v)] == \
        list(range(max(first_flexible, versions[0]), versions[1] + 1))


def test_no_tagged_fields_in_group_apis():
    # None of these messages has a tagged field in Kafka's definitions; a stray tag would change
    # the wire format of every flexible version.
    def walk(s: Struct):
        for f in s.fields:
            assert f.tag is None, f.name
            t = f.type.of if isinstance(f.type, Array) else f.type
            if isinstance(t, Struct):
                walk(t)
    for api in GROUP_APIS:
        walk(api.request)
        walk(api.response)


# --------------------------------------------------------------------------------------------
# Round trips at every version


@pytest.mark.parametrize("api, version, side", list(_cases()))
def test_round_trip_every_field(api, version, side):
    struct_ = getattr(api, side)
    flexible = api.is_flexible(version)
    value = _sample(struct_, seed=version + 3)
    expected = _expected(struct_, version, flexible, value)
    for f in struct_.fields:  # the generator really did set something non-default
        if _present(f, version, flexible):
            assert expected[f.name] != f.default_value(), f.name
    decoded, _ = _round_trip(struct_, version, flexible, value)
    assert decoded == expected


@pytest.mark.parametrize("api, version, side", list(_cases()))
def test_round_trip_nulls(api, version, side):
    struct_ = getattr(api, side)
    flexible = api.is_flexible(version)
    value = _expected(struct_, version, flexible, _sample(struct_, seed=5, nulls=True), nulls=True)
    decoded, _ = _round_trip(struct_, version, flexible, value)
    assert decoded == value


@pytest.mark.parametrize("api, version, side", list(_cases()))
def test_round_trip_shared_sample_values(api, version, side):
    # The shared generator draws full-range values (negative, extreme) and random nulls, and
    # fills absent fields with noise the encoder must drop.
    struct_ = getattr(api, side)
    flexible = api.is_flexible(version)
    for seed in range(4):
        value = sample_value(struct_, version, flexible, seed)
        assert _round_trip(struct_, version, flexible, value)[0] == value
        noisy = sample_value(struct_, version, flexible, seed, absent="noise")
        assert _round_trip(struct_, version, flexible, noisy)[0] == value


@pytest.mark.parametrize("api, version, side", list(_cases()))
def test_round_trip_through_frames(api, version, side):
    value = _sample(getattr(api, side), seed=11)
    expected = _expected(getattr(api, side), version, api.is_flexible(version), value)
    if side == "request":
        frame = messages.encode_request(api, version, 1234, "kd-test", value)
        header, body = messages.decode_request(lambda key: api, frame[4:])
        assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == \
            (api.key, version, 1234, "kd-test")
    else:
        frame = messages.encode_response(api, version, 99, value)
        assert messages.read_correlation_id(frame[4:]) == 99
        body = messages.decode_response(api, version, memoryview(frame[4:]))
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    assert body == expected


@pytest.mark.parametrize("api, version, side", list(_cases()))
def test_every_truncation_is_a_decode_error(api, version, side):
    struct_ = getattr(api, side)
    flexible = api.is_flexible(version)
    data = codec.encode(struct_, version, flexible, _sample(struct_, seed=2))
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(struct_, version, flexible, Reader(data[:n]))


def test_defaults_follow_kafka_json():
    assert JOIN_GROUP.request.default()["rebalance_timeout_ms"] == -1
    assert JOIN_GROUP.response.default()["generation_id"] == -1
    assert JOIN_GROUP.response.default()["protocol_name"] == ""
    assert OFFSET_COMMIT.request.default()["generation_id_or_member_epoch"] == -1
    assert OFFSET_COMMIT.request.default()["retention_time_ms"] == -1
    partition = OFFSET_COMMIT.request.fields[-1].type.of.fields[-1].type.of
    assert partition.default()["committed_leader_epoch"] == -1
    assert partition.default()["commit_timestamp"] == -1
    assert OFFSET_FETCH.request.default()["topics"] == []
    assert OFFSET_FETCH.request.default()["require_stable"] is False
    assert CONSUMER_GROUP_HEARTBEAT.request.default()["rebalance_timeout_ms"] == -1
    assert CONSUMER_GROUP_HEARTBEAT.request.default()["subscribed_topic_names"] is None
    assert CONSUMER_PROTOCOL_SUBSCRIPTION.default()["generation_id"] == -1


def test_join_group_default_response_encodes_in_every_version():
    # protocol_name is nullable only from v7; its default must still encode in v0-6.
    for version in range(0, 10):
        codec.encode(JOIN_GROUP.response, version, JOIN_GROUP.is_flexible(version), {})
        codec.encode(OFFSET_FETCH.request, version, OFFSET_FETCH.is_flexible(version), {})


# --------------------------------------------------------------------------------------------
# Layouts written out by hand


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def test_heartbeat_v0_request_bytes():
    frame = messages.encode_request(HEARTBEAT, 0, 7, "kd", {
        "group_id": "grp", "generation_id": 5, "member_id": "m-1"})
    body = struct.pack(">hhi", 12, 0, 7) + _str16("kd") + _str16("grp") + struct.pack(">i", 5) + _str16("m-1")
    assert frame == _frame(body)


def test_heartbeat_v4_response_bytes():
    frame = struct.pack(">i", 3) + b"\x00" + struct.pack(">ih", 20, 27) + b"\x00"
    assert messages.decode_response(HEARTBEAT, 4, frame) == {"throttle_time_ms": 20, "error_code": 27}


def test_join_group_v6_request_bytes_flexible():
    frame = messages.encode_request(JOIN_GROUP, 6, 3, "kd", {
        "group_id": "g", "session_timeout_ms": 6000, "rebalance_timeout_ms": 30000, "member_id": "",
        "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\x00\x01"}]})
    body = (struct.pack(">hhi", 11, 6, 3) + _str16("kd") + b"\x00"        # header v2: tags
            + _cstr("g") + struct.pack(">ii", 6000, 30000) + _cstr("") + _cstr(None)
            + _cstr("consumer")
            + b"\x02"                                                     # 1 protocol (+1)
            + _cstr("range") + b"\x03\x00\x01" + b"\x00"                  # bytes, element tags
            + b"\x00")                                                    # body tags
    assert frame == _frame(body)


def test_join_group_v9_response_bytes():
    meta = b"\x00\x03meta"
    frame = (struct.pack(">i", 77) + b"\x00"                              # correlation, tags
             + struct.pack(">ihi", 0, 0, 4)
             + _cstr("consumer") + _cstr(None)                            # type, null name
             + _cstr("leader") + b"\x01" + _cstr("me")                    # skip_assignment
             + b"\x02" + _cstr("me") + _cstr("static-1") + bytes([len(meta) + 1]) + meta + b"\x00"
             + b"\x00")
    assert messages.decode_response(JOIN_GROUP, 9, frame) == {
        "throttle_time_ms": 0, "error_code": 0, "generation_id": 4, "protocol_type": "consumer",
        "protocol_name": None, "leader": "leader", "skip_assignment": True, "member_id": "me",
        "members": [{"member_id": "me", "group_instance_id": "static-1", "metadata": meta}]}


def test_leave_group_v3_request_bytes_batched_members():
    frame = messages.encode_request(LEAVE_GROUP, 3, 1, None, {
        "group_id": "g", "members": [{"member_id": "a", "group_instance_id": None},
                                     {"member_id": "b", "group_instance_id": "i"}]})
    body = (struct.pack(">hhih", 13, 3, 1, -1)                             # null client id
            + _str16("g") + struct.pack(">i", 2)
            + _str16("a") + struct.pack(">h", -1) + _str16("b") + _str16("i"))
    assert frame == _frame(body)


def test_find_coordinator_v4_request_and_response_bytes():
    frame = messages.encode_request(FIND_COORDINATOR, 4, 2, "kd",
                                    {"key_type": 0, "coordinator_keys": ["g1", "g2"]})
    body = (struct.pack(">hhi", 10, 4, 2) + _str16("kd") + b"\x00"        # header v2
            + b"\x00"                                                    # key_type group
            + b"\x03" + _cstr("g1") + _cstr("g2") + b"\x00")              # 2 keys, body tags
    assert frame == _frame(body)
    resp = (struct.pack(">i", 2) + b"\x00" + struct.pack(">i", 0) + b"\x02"
            + _cstr("g1") + struct.pack(">i", 1) + _cstr("h") + struct.pack(">ih", 9092, 0) + _cstr(None) + b"\x00"
            + b"\x00")
    decoded = messages.decode_response(FIND_COORDINATOR, 4, resp)
    assert decoded["coordinators"] == [{"key": "g1", "node_id": 1, "host": "h", "port": 9092,
                                        "error_code": 0, "error_message": None}]
    assert decoded["host"] == "" and decoded["error_message"] is None  # v0-3 fields: defaults


def test_offset_fetch_v2_request_null_topics_means_all():
    frame = messages.encode_request(OFFSET_FETCH, 2, 0, "kd", {"group_id": "g", "topics": None})
    assert frame == _frame(struct.pack(">hhi", 9, 2, 0) + _str16("kd") + _str16("g") + struct.pack(">i", -1))


def test_offset_fetch_v1_rejects_null_topics():
    with pytest.raises(EncodeError):
        messages.encode_request(OFFSET_FETCH, 1, 0, "kd", {"group_id": "g", "topics": None})


def test_offset_commit_v1_request_bytes_with_commit_timestamp():
    frame = messages.encode_request(OFFSET_COMMIT, 1, 4, "kd", {
        "group_id": "g", "generation_id_or_member_epoch": 3, "member_id": "m",
        "topics": [{"name": "t", "partitions": [
            {"partition_index": 0, "committed_offset": 42, "commit_timestamp": 1700,
             "committed_metadata": None}]}]})
    body = (struct.pack(">hhi", 8, 1, 4) + _str16("kd") + _str16("g") + struct.pack(">i", 3) + _str16("m")
            + struct.pack(">i", 1) + _str16("t") + struct.pack(">i", 1)
            + struct.pack(">iqqh", 0, 42, 1700, -1))
    assert frame == _frame(body)


def test_offset_commit_v10_uses_topic_ids():
    tid = uuid.UUID("0123456789abcdef0123456789abcdef")
    body = codec.encode(OFFSET_COMMIT.response, 10, True, {
        "throttle_time_ms": 0, "topics": [{"name": "ignored", "topic_id": tid,
                                           "partitions": [{"partition_index": 2, "error_code": 0}]}]})
    assert body == (struct.pack(">i", 0) + b"\x02" + tid.bytes
                    + b"\x02" + struct.pack(">ih", 2, 0) + b"\x00"       # partition + its tags
                    + b"\x00" + b"\x00")                                 # topic tags, body tags


def test_consumer_group_heartbeat_v1_response_nullable_assignment():
    head = (struct.pack(">i", 5) + b"\x00" + struct.pack(">ih", 0, 0) + _cstr(None) + _cstr("m")
            + struct.pack(">ii", 2, 5000))
    none = messages.decode_response(CONSUMER_GROUP_HEARTBEAT, 1, head + b"\xff" + b"\x00")
    assert none["assignment"] is None and none["member_id"] == "m" and none["member_epoch"] == 2
    tid = uuid.UUID(int=7)
    some = head + b"\x01" + b"\x02" + tid.bytes + b"\x03" + struct.pack(">ii", 0, 1) + b"\x00" + b"\x00" + b"\x00"
    decoded = messages.decode_response(CONSUMER_GROUP_HEARTBEAT, 1, some)
    assert decoded["assignment"] == {"topic_partitions": [{"topic_id": tid, "partitions": [0, 1]}]}


def test_consumer_group_heartbeat_v1_request_bytes():
    tid = uuid.UUID(int=3)
    frame = messages.encode_request(CONSUMER_GROUP_HEARTBEAT, 1, 9, "kd", {
        "group_id": "g", "member_id": "m", "member_epoch": 0, "instance_id": None, "rack_id": "r1",
        "rebalance_timeout_ms": 45000, "subscribed_topic_names": ["a"], "subscribed_topic_regex": None,
        "server_assignor": "uniform", "topic_partitions": [{"topic_id": tid, "partitions": [4]}]})
    body = (struct.pack(">hhi", 68, 1, 9) + _str16("kd") + b"\x00"
            + _cstr("g") + _cstr("m") + struct.pack(">i", 0) + _cstr(None) + _cstr("r1")
            + struct.pack(">i", 45000) + b"\x02" + _cstr("a") + _cstr(None) + _cstr("uniform")
            + b"\x02" + tid.bytes + b"\x02" + struct.pack(">i", 4) + b"\x00"
            + b"\x00")
    assert frame == _frame(body)
    # null arrays ("unchanged since the last heartbeat") are a zero length byte
    frame = messages.encode_request(CONSUMER_GROUP_HEARTBEAT, 1, 9, "kd", {"group_id": "g", "member_epoch": -1})
    assert frame.endswith(struct.pack(">i", -1) + b"\x00" + b"\x00" + b"\x00" + b"\x00" + b"\x00")


def test_consumer_group_heartbeat_v0_has_no_regex():
    v0 = codec.encode(CONSUMER_GROUP_HEARTBEAT.request, 0, True, {"group_id": "g", "member_epoch": 0,
                                                                  "subscribed_topic_regex": "t.*"})
    v1 = codec.encode(CONSUMER_GROUP_HEARTBEAT.request, 1, True, {"group_id": "g", "member_epoch": 0,
                                                                  "subscribed_topic_regex": "t.*"})
    assert len(v1) == len(v0) + len(_cstr("t.*"))


# --------------------------------------------------------------------------------------------
# Frames captured on the wire between librdkafka 2.16 (confluent-kafka) and Tansu 0.6 (request
# frames without their size prefix; response frames start with the correlation id).

RDKAFKA_FRAMES = [
    (FIND_COORDINATOR, 2, "request",
     "000a000200000003000772646b61666b6100046361703200"),
    (FIND_COORDINATOR, 2, "response",
     "0000000300000000000000044e4f4e450000006f00093132372e302e302e310000e79d"),
    (JOIN_GROUP, 5, "request",
     "000b000500000003000772646b61666b6100046361703200001770000493e00000ffff0008636f6e73756d6572"
     "000000010012636f6f70657261746976652d737469636b790000002200030000000200056361702d6100056361"
     "702d620000000000000000ffffffff0000"),
    (JOIN_GROUP, 5, "response",
     "0000000300000000004fffffffff00000000002c72646b61666b612d66663937396132342d326137632d346665"
     "622d616661362d34613236343835333963653500000000"),
    (SYNC_GROUP, 3, "request",
     "000e000300000006000772646b61666b6100046361703200000000002c72646b61666b612d66663937396132342d"
     "326137632d346665622d616661362d346132363438353339636535ffff00000001002c72646b61666b612d666639"
     "37396132342d326137632d346665622d616661362d3461323634383533396365350000002c000000000002000563"
     "61702d6100000002000000000000000100056361702d62000000010000000000000000"),
    (SYNC_GROUP, 3, "response",
     "000000060000000000000000002c00000000000200056361702d610000000200000000000000010005636170"
     "2d62000000010000000000000000"),
    (HEARTBEAT, 3, "request",
     "000c000300000007000772646b61666b6100046361703200000000002c72646b61666b612d66663937396132342d"
     "326137632d346665622d616661362d346132363438353339636535ffff"),
    (LEAVE_GROUP, 1, "request",
     "000d00010000000c000772646b61666b61000463617032002c72646b61666b612d35323034383863332d39383939"
     "2d346238362d396133622d666534336335653238336462"),
    (OFFSET_FETCH, 9, "request",
     "0009000900000008000772646b61666b610002056361703200ffffffff03066361702d6103000000000000000100"
     "066361702d62020000000000000100"),
    (OFFSET_FETCH, 9, "response",
     "00000008000000000002056361703203066361702d610300000000ffffffffffffffffffffffff0000000000000001"
     "ffffffffffffffffffffffff0000000000066361702d620200000000ffffffffffffffffffffffff00000000000000"
     "0000"),
]


@pytest.mark.parametrize("api, version, side, hexdata", RDKAFKA_FRAMES,
                         ids=[f"{a.name}-v{v}-{s}" for a, v, s, _ in RDKAFKA_FRAMES])
def test_librdkafka_frames_decode_and_reencode_identically(api, version, side, hexdata):
    frame = bytes.fromhex(hexdata)
    if side == "request":
        header, body = messages.decode_request(lambda key: api, frame)
        assert (header.api_key, header.api_version) == (api.key, version)
        again = messages.encode_request(api, version, header.correlation_id, header.client_id, body)
    else:
        body = messages.decode_response(api, version, frame)
        again = messages.encode_response(api, version, messages.read_correlation_id(frame), body)
    assert again[4:] == frame


def test_librdkafka_join_and_sync_contents():
    _, join = messages.decode_request(lambda key: JOIN_GROUP, bytes.fromhex(RDKAFKA_FRAMES[2][3]))
    assert (join["group_id"], join["session_timeout_ms"], join["rebalance_timeout_ms"]) == ("cap2", 6000, 300000)
    assert join["protocol_type"] == "consumer"
    assert join["protocols"][0]["name"] == "cooperative-sticky"
    assert decode_subscription(join["protocols"][0]["metadata"]) == (3, {
        "topics": ["cap-a", "cap-b"], "user_data": b"", "owned_partitions": [], "generation_id": -1,
        "rack_id": ""})
    sync = messages.decode_response(SYNC_GROUP, 3, bytes.fromhex(RDKAFKA_FRAMES[5][3]))
    assert decode_assignment(sync["assignment"]) == (0, {
        "assigned_partitions": [{"topic": "cap-a", "partitions": [0, 1]},
                                {"topic": "cap-b", "partitions": [0]}],
        "user_data": b""})


# --------------------------------------------------------------------------------------------
# The embedded consumer protocol

# Captured from librdkafka 2.16: a range member with client.rack, and a cooperative-sticky member
# rejoining while it owns partitions (owned_partitions, generation_id and its sticky user data).
RDKAFKA_SUBSCRIPTION_RACK = bytes.fromhex(
    "00030000000200056361702d6100056361702d620000000000000000ffffffff00067261636b2d31")
RDKAFKA_SUBSCRIPTION_OWNED = bytes.fromhex(
    "00030000000200056361702d6100056361702d62000000260000000200056361702d61000000010000000100056361"
    "702d620000000100000000000000010000000200056361702d61000000010000000100056361702d62000000010000"
    "0000000000010000")
RDKAFKA_ASSIGNMENT_STICKY = bytes.fromhex(
    "00000000000200056361702d61000000010000000100056361702d620000000100000000000000260000000200056361"
    "702d61000000010000000100056361702d62000000010000000000000001")
STICKY_USER_DATA = (struct.pack(">i", 2) + _str16("cap-a") + struct.pack(">ii", 1, 1)
                    + _str16("cap-b") + struct.pack(">ii", 1, 0) + struct.pack(">i", 1))


def _exact(struct_: Struct, data: bytes) -> dict:
    """Decode with our layout and insist that nothing is left over."""
    r = Reader(data)
    version = r.int16()
    value = codec.decode(struct_, version, False, r)
    assert r.remaining == 0
    return value


def test_librdkafka_subscription_with_rack():
    expected = {"topics": ["cap-a", "cap-b"], "user_data": b"", "owned_partitions": [],
                "generation_id": -1, "rack_id": "rack-1"}
    assert decode_subscription(RDKAFKA_SUBSCRIPTION_RACK) == (3, expected)
    assert _exact(CONSUMER_PROTOCOL_SUBSCRIPTION, RDKAFKA_SUBSCRIPTION_RACK) == expected
    assert encode_subscription(3, expected) == RDKAFKA_SUBSCRIPTION_RACK


def test_librdkafka_subscription_with_owned_partitions():
    expected = {"topics": ["cap-a", "cap-b"], "user_data": STICKY_USER_DATA,
                "owned_partitions": [{"topic": "cap-a", "partitions": [1]},
                                     {"topic": "cap-b", "partitions": [0]}],
                "generation_id": 1, "rack_id": ""}
    assert decode_subscription(RDKAFKA_SUBSCRIPTION_OWNED) == (3, expected)
    assert _exact(CONSUMER_PROTOCOL_SUBSCRIPTION, RDKAFKA_SUBSCRIPTION_OWNED) == expected
    assert encode_subscription(3, expected) == RDKAFKA_SUBSCRIPTION_OWNED


def test_librdkafka_assignment_v0_with_user_data():
    expected = {"assigned_partitions": [{"topic": "cap-a", "partitions": [1]},
                                        {"topic": "cap-b", "partitions": [0]}],
                "user_data": STICKY_USER_DATA}
    assert decode_assignment(RDKAFKA_ASSIGNMENT_STICKY) == (0, expected)
    assert _exact(CONSUMER_PROTOCOL_ASSIGNMENT, RDKAFKA_ASSIGNMENT_STICKY) == expected
    assert encode_assignment(0, expected) == RDKAFKA_ASSIGNMENT_STICKY


@pytest.mark.parametrize("version", range(0, 4))
def test_subscription_round_trip(version):
    value = _sample(CONSUMER_PROTOCOL_SUBSCRIPTION, seed=version)
    data = encode_subscription(version, value)
    assert data[:2] == struct.pack(">h", version)
    assert decode_subscription(data) == (version, _expected(CONSUMER_PROTOCOL_SUBSCRIPTION, version, False, value))
    nulls = _expected(CONSUMER_PROTOCOL_SUBSCRIPTION, version, False,
                      _sample(CONSUMER_PROTOCOL_SUBSCRIPTION, nulls=True), nulls=True)
    assert decode_subscription(encode_subscription(version, nulls)) == (version, nulls)


@pytest.mark.parametrize("version", range(0, 4))
def test_assignment_round_trip(version):
    value = _sample(CONSUMER_PROTOCOL_ASSIGNMENT, seed=version)
    data = encode_assignment(version, value)
    assert data[:2] == struct.pack(">h", version)
    assert decode_assignment(data) == (version, value)
    assert decode_assignment(encode_assignment(version, {"assigned_partitions": []})) == \
        (version, {"assigned_partitions": [], "user_data": None})


def test_subscription_v0_layout_by_hand():
    data = encode_subscription(0, {"topics": ["a", "bc"], "user_data": None,
                                   "owned_partitions": [{"topic": "x", "partitions": [1]}]})
    assert data == struct.pack(">hi", 0, 2) + _str16("a") + _str16("bc") + struct.pack(">i", -1)


def test_newer_versions_decode_known_fields_and_ignore_the_rest():
    v3 = encode_subscription(3, {"topics": ["t"], "user_data": b"u",
                                 "owned_partitions": [{"topic": "t", "partitions": [0]}],
                                 "generation_id": 9, "rack_id": "r"})
    future = struct.pack(">h", 7) + v3[2:] + b"\x00\x05future-field\xff\xff"
    version, value = decode_subscription(future)
    assert version == 7
    assert value == {"topics": ["t"], "user_data": b"u",
                     "owned_partitions": [{"topic": "t", "partitions": [0]}],
                     "generation_id": 9, "rack_id": "r"}
    a = encode_assignment(3, {"assigned_partitions": [{"topic": "t", "partitions": [2]}], "user_data": None})
    assert decode_assignment(struct.pack(">h", 12) + a[2:] + b"extra") == \
        (12, {"assigned_partitions": [{"topic": "t", "partitions": [2]}], "user_data": None})


def test_trailing_bytes_after_a_known_version_are_ignored_like_kafka():
    data = encode_subscription(1, {"topics": ["t"]}) + b"\x00\x00\x00\x07"
    assert decode_subscription(data) == (1, {"topics": ["t"], "user_data": None, "owned_partitions": [],
                                             "generation_id": -1, "rack_id": None})


@pytest.mark.parametrize("data", [b"", b"\x00", struct.pack(">h", -1) + b"\x00\x00\x00\x00",
                                  struct.pack(">hi", 0, 5), struct.pack(">hi", 3, 1) + b"\x00\x05ab"])
def test_bad_consumer_protocol_bytes_raise_decode_error(data):
    with pytest.raises(DecodeError):
        decode_subscription(data)
    with pytest.raises(DecodeError):
        decode_assignment(data)


def test_every_truncation_of_consumer_protocol_bytes_is_a_decode_error():
    for data, decode in ((RDKAFKA_SUBSCRIPTION_OWNED, decode_subscription),
                         (RDKAFKA_ASSIGNMENT_STICKY, decode_assignment)):
        for n in range(len(data)):
            with pytest.raises(DecodeError):
                decode(data[:n])


def test_encode_rejects_versions_out_of_range():
    for bad in (-1, 4, 100):
        with pytest.raises(EncodeError):
            encode_subscription(bad, {"topics": []})
        with pytest.raises(EncodeError):
            encode_assignment(bad, {"assigned_partitions": []})


def test_decode_accepts_memoryview_slices():
    view = memoryview(b"xx" + RDKAFKA_SUBSCRIPTION_RACK)[2:]
    assert decode_subscription(view)[1]["rack_id"] == "rack-1"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_decode_error_only(data):
    for decode in (decode_subscription, decode_assignment):
        try:
            version, value = decode(data)
        except DecodeError:
            continue
        assert version >= 0 and isinstance(value, dict)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=48), st.sampled_from(list(_cases())))
def test_arbitrary_bytes_in_any_group_message_raise_decode_error_only(data, case):
    api, version, side = case.values
    try:
        codec.decode(getattr(api, side), version, api.is_flexible(version), Reader(data))
    except DecodeError:
        pass


# --------------------------------------------------------------------------------------------
# Field-by-field comparison with Kafka's own JSON message definitions.  kafka-python 3 (a test
# dependency of the benchmarks, not of kdaemon) ships a copy of them; only its JSON files are
# read, none of its code runs (tests/protocol/kafka_json.py).  Skipped when it is not installed.

_JSON_CASES = [(api, side) for api in GROUP_APIS for side in ("request", "response")]


@pytest.mark.parametrize("api, side", _JSON_CASES, ids=[f"{a.name}-{s}" for a, s in _JSON_CASES])
def test_specs_match_kafka_json_definitions(api, side):
    directory = kafka_python_json_dir()
    path = directory / f"{api.name}{side.capitalize()}.json" if directory else None
    if path is None or not path.exists():
        pytest.skip(f"{path.name if path else 'Kafka JSON'} is not shipped by the installed kafka-python")
    spec = load_kafka_json(path)
    assert spec["apiKey"] == api.key
    lo, hi = Versions.parse(spec["validVersions"]).lo, Versions.parse(spec["validVersions"]).hi
    # We may implement versions below Kafka's current baseline (KIP-896 removed some), never above.
    assert api.max_version == hi and api.min_version <= lo
    assert api.flexible == Versions.parse(spec["flexibleVersions"])
    common = {c["name"]: c for c in spec.get("commonStructs", [])}
    compare_struct(getattr(api, side), spec["fields"], common, f"{api.name}.{side}")


@pytest.mark.kafka
@pytest.mark.parametrize("api, side", _JSON_CASES, ids=[f"{a.name}-{s}" for a, s in _JSON_CASES])
def test_specs_match_the_release_json_definitions(api, side):
    """The same comparison against the definitions of the Kafka release the tests run (its
    kafka-clients jar): kafka-python's copy is older and lacks ConsumerGroupHeartbeat."""
    assert_matches_release(api, side, below_baseline=True)


@pytest.mark.parametrize("struct_, name, versions", [
    (CONSUMER_PROTOCOL_SUBSCRIPTION, "ConsumerProtocolSubscription", (0, 3)),
    (CONSUMER_PROTOCOL_ASSIGNMENT, "ConsumerProtocolAssignment", (0, 3)),
])
def test_consumer_protocol_matches_kafka_json_definitions(struct_, name, versions):
    directory = kafka_python_json_dir()
    path = directory / f"{name}.json" if directory else None
    if path is None or not path.exists():
        pytest.skip(f"{path.name if path else 'Kafka JSON'} is not shipped by the installed kafka-python")
    spec = load_kafka_json(path)
    parsed = Versions.parse(spec["validVersions"])
    assert (parsed.lo, parsed.hi) == versions
    assert spec["flexibleVersions"] == "none"
    compare_struct(struct_, spec["fields"], {}, name)
