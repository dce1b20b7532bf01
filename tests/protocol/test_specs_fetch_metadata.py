"""Fetch, ListOffsets, Metadata and SASL specs: round trips at every version, and hand-built bytes.

The round trips prove the specs are self-consistent and that every field survives the codec; the
hand-built frames (written with ``struct.pack`` from the layouts in Kafka's JSON, not from our
specs) prove the specs put the right bytes in the right order.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis.fetch import FETCH, INT64_MAX
from kdaemon.protocol.apis.list_offsets import LIST_OFFSETS
from kdaemon.protocol.apis.metadata import METADATA
from kdaemon.protocol.apis.sasl import SASL_AUTHENTICATE, SASL_HANDSHAKE
from kdaemon.protocol.primitives import Reader, encode_uvarint
from kdaemon.protocol.schema import Array, Struct
from tests.protocol.spec_values import field_present, sample_value
from tests.protocol.hand_bytes import cstr as _cstr, str16 as _str16

APIS = (FETCH, LIST_OFFSETS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE)
BY_KEY = {api.key: api for api in APIS}
SEEDS = (0, 1, 2, 3)

CASES = [pytest.param(api, v, id=f"{api.name}-v{v}")
         for api in APIS for v in range(api.min_version, api.max_version + 1)]


# --- the declared ranges -------------------------------------------------------------------------

def test_declared_version_ranges():
    ranges = {api.name: (api.key, api.min_version, api.max_version, str(api.flexible))
              for api in APIS}
    assert ranges == {
        "Fetch": (1, 4, 18, "12+"),
        "ListOffsets": (2, 1, 11, "6+"),
        "Metadata": (3, 1, 13, "9+"),
        "SaslHandshake": (17, 0, 1, "none"),
        "SaslAuthenticate": (36, 0, 2, "2+"),
    }


def _walk(struct: Struct, path: str = ""):
    for f in struct.fields:
        yield f"{path}{f.name}", f
        t = f.type.of if isinstance(f.type, Array) else f.type
        if isinstance(t, Struct):
            yield from _walk(t, f"{path}{f.name}.")


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_tagged_fields_only_in_flexible_versions(api):
    # A tag outside the flexible range would be silently dropped by the codec.
    for side in (api.request, api.response):
        for path, f in _walk(side):
            if f.tag is not None:
                assert f.versions.lo is not None and f.versions.lo in api.flexible, path


# --- the value generator ------------------------------------------------------------------------

@pytest.mark.parametrize("api,version", CASES)
def test_samples_are_non_default(api, version):
    """Guard the generator itself: a default value would not prove the field is encoded."""
    flexible = api.is_flexible(version)
    for side in (api.request, api.response):
        for seed in SEEDS:
            _assert_non_default(side, sample_value(side, version, flexible, seed), version,
                                flexible, "")


def _assert_non_default(struct, value, version, flexible, path):
    assert set(value) == {f.name for f in struct.fields}, path
    for f in struct.fields:
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


def test_sample_value_is_deterministic():
    a = sample_value(FETCH.response, 16, True, seed=7)
    b = sample_value(FETCH.response, 16, True, seed=7)
    c = sample_value(FETCH.response, 16, True, seed=8)
    assert a == b
    assert a != c


def test_samples_include_nulls_for_some_seed():
    nulls = set()
    for seed in range(20):
        v = sample_value(METADATA.request, 12, True, seed)
        if v["topics"] is None:
            nulls.add("topics")
        elif any(t["name"] is None for t in v["topics"]):
            nulls.add("topics.name")
    assert nulls == {"topics", "topics.name"}


# --- round trips at every version ---------------------------------------------------------------

def _roundtrip_body(struct, version, flexible, value) -> dict:
    data = codec.encode(struct, version, flexible, value)
    r = Reader(data)
    out = codec.decode(struct, version, flexible, r)
    assert r.remaining == 0
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("api,version", CASES)
def test_request_roundtrip(api, version, seed):
    body = sample_value(api.request, version, api.is_flexible(version), seed)
    frame = messages.encode_request(api, version, 1234, "kdaemon-test", body)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    header, decoded = messages.decode_request(BY_KEY.__getitem__, frame[4:])
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        api.key, version, 1234, "kdaemon-test")
    assert decoded == body


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("api,version", CASES)
def test_response_roundtrip(api, version, seed):
    body = sample_value(api.response, version, api.is_flexible(version), seed)
    frame = messages.encode_response(api, version, 99, body)
    decoded = messages.decode_response(api, version, memoryview(frame)[4:])
    # Records come back as a slice of the frame (a memoryview), equal to the bytes sent.
    assert decoded == body


@pytest.mark.parametrize("api,version", CASES)
def test_fields_absent_at_a_version_are_not_written(api, version):
    flexible = api.is_flexible(version)
    for side in (api.request, api.response):
        for seed in SEEDS:
            clean = sample_value(side, version, flexible, seed)
            noisy = sample_value(side, version, flexible, seed, absent="noise")
            assert codec.encode(side, version, flexible, noisy) == codec.encode(
                side, version, flexible, clean)
            assert _roundtrip_body(side, version, flexible, noisy) == clean


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
def test_empty_body_decodes_to_defaults(api):
    for version in range(api.min_version, api.max_version + 1):
        flexible = api.is_flexible(version)
        for side in (api.request, api.response):
            assert _roundtrip_body(side, version, flexible, {}) == side.default()


# --- hand-built bytes ---------------------------------------------------------------------------


def _tagged(*fields: tuple[int, bytes]) -> bytes:
    out = encode_uvarint(len(fields))
    for tag, data in fields:
        out += encode_uvarint(tag) + encode_uvarint(len(data)) + data
    return out


NO_TAGS = b"\x00"


def test_fetch_v4_request_bytes():
    body = {
        "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 52428800,
        "isolation_level": 1,
        "topics": [{"topic": "orders", "partitions": [
            {"partition": 3, "fetch_offset": 42, "partition_max_bytes": 1048576},
        ]}],
        # Fields of later versions must not leak into a v4 frame.
        "session_id": 7, "rack_id": "r1", "replica_state": {"replica_id": 5, "replica_epoch": 1},
    }
    expected_body = (
        struct.pack(">iiiib", -1, 500, 1, 52428800, 1)
        + struct.pack(">i", 1) + _str16("orders")
        + struct.pack(">i", 1) + struct.pack(">iqi", 3, 42, 1048576)
    )
    header = struct.pack(">hhi", 1, 4, 17) + _str16("cli")
    frame = messages.encode_request(FETCH, 4, 17, "cli", body)
    assert frame == struct.pack(">i", len(header) + len(expected_body)) + header + expected_body


def test_fetch_v11_request_bytes():
    body = {
        "replica_id": -1, "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1000,
        "isolation_level": 0, "session_id": 9, "session_epoch": 2,
        "topics": [{"topic": "t", "partitions": [
            {"partition": 0, "current_leader_epoch": 5, "fetch_offset": 10,
             "log_start_offset": -1, "partition_max_bytes": 100},
        ]}],
        "forgotten_topics_data": [{"topic": "old", "partitions": [1, 2]}],
        "rack_id": "rack-a",
    }
    expected = (
        struct.pack(">iiiibii", -1, 500, 1, 1000, 0, 9, 2)
        + struct.pack(">i", 1) + _str16("t")
        + struct.pack(">i", 1) + struct.pack(">iiqqi", 0, 5, 10, -1, 100)
        + struct.pack(">i", 1) + _str16("old") + struct.pack(">iii", 2, 1, 2)
        + _str16("rack-a")
    )
    assert codec.encode(FETCH.request, 11, False, body) == expected


def test_fetch_v18_request_bytes_with_tagged_fields():
    topic_id = uuid.UUID("9853af22-c186-4046-8a52-a3895221c6af")
    dir_id = uuid.UUID(int=0x0102030405060708090A0B0C0D0E0F10)
    body = {
        "cluster_id": "c1",
        "replica_state": {"replica_id": 3, "replica_epoch": 77},
        "max_wait_ms": 500, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 1,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic_id": topic_id, "partitions": [
            {"partition": 0, "current_leader_epoch": 4, "fetch_offset": 42,
             "last_fetched_epoch": 3, "log_start_offset": -1, "partition_max_bytes": 65536,
             "replica_directory_id": dir_id,
             "high_watermark": INT64_MAX},  # the default: not written
        ]}],
        "forgotten_topics_data": [],
        "rack_id": "",
        "replica_id": 3,  # v0-14 only: not written at v18
    }
    partition = (struct.pack(">iiqiqi", 0, 4, 42, 3, -1, 65536)
                 + _tagged((0, dir_id.bytes)))
    expected_body = (
        struct.pack(">iiibii", 500, 1, 1000, 1, 0, -1)
        + encode_uvarint(2) + topic_id.bytes + encode_uvarint(2) + partition + NO_TAGS
        + encode_uvarint(1)   # forgotten_topics_data: empty compact array
        + _cstr("")           # rack_id
        # A tagged struct carries its own (empty) tagged section, hence 13 bytes, not 12.
        + _tagged((0, _cstr("c1")), (1, struct.pack(">iq", 3, 77) + NO_TAGS))
    )
    header = struct.pack(">hhi", 1, 18, 5) + _str16("k") + NO_TAGS
    frame = messages.encode_request(FETCH, 18, 5, "k", body)
    assert frame[4:] == header + expected_body

    _, decoded = messages.decode_request(BY_KEY.__getitem__, frame[4:])
    assert decoded["replica_id"] == -1
    assert decoded["replica_state"] == {"replica_id": 3, "replica_epoch": 77}
    assert decoded["topics"][0]["partitions"][0]["high_watermark"] == INT64_MAX
    assert decoded["topics"][0]["partitions"][0]["replica_directory_id"] == dir_id


def _one_partition_fetch(**partition) -> dict:
    return {"topics": [{"topic_id": uuid.UUID(int=1), "partitions": [
        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1, **partition}]}]}


def test_fetch_partition_high_watermark_is_tag_1_from_v18():
    with_hw = _one_partition_fetch(high_watermark=1234)
    plain = _one_partition_fetch()
    assert _tagged((1, struct.pack(">q", 1234))) in codec.encode(FETCH.request, 18, True, with_hw)
    assert codec.encode(FETCH.request, 17, True, with_hw) == codec.encode(
        FETCH.request, 17, True, plain)
    # A consumer leaves it at Long.MAX_VALUE ("not supported"), so v18 costs it nothing.
    assert codec.encode(FETCH.request, 18, True, plain) == codec.encode(
        FETCH.request, 17, True, plain)


def test_fetch_v16_response_bytes():
    topic_id = uuid.UUID(int=0xABCDEF)
    records = b"\x00" * 8 + b"batch"
    partition = (
        struct.pack(">ihqqq", 2, 74, 100, 90, 0)
        + encode_uvarint(2) + struct.pack(">qq", 555, 80)   # aborted_transactions, one entry
        + NO_TAGS
        + struct.pack(">i", -1)                             # preferred_read_replica
        + encode_uvarint(len(records) + 1) + records        # records: compact bytes
        + _tagged((1, struct.pack(">ii", 7, 9) + NO_TAGS))  # current_leader, a tagged struct
    )
    body_bytes = (
        struct.pack(">ihi", 25, 0, 12345)
        + encode_uvarint(2) + topic_id.bytes + encode_uvarint(2) + partition + NO_TAGS
        + _tagged((0, encode_uvarint(2) + struct.pack(">i", 7) + _cstr("broker-7")
                   + struct.pack(">i", 9092) + _cstr(None) + NO_TAGS))
    )
    frame = struct.pack(">i", 77) + NO_TAGS + body_bytes
    decoded = messages.decode_response(FETCH, 16, frame)
    assert decoded["throttle_time_ms"] == 25
    assert decoded["session_id"] == 12345
    (topic,) = decoded["responses"]
    assert topic["topic_id"] == topic_id and topic["topic"] == ""
    (p,) = topic["partitions"]
    assert p["partition_index"] == 2 and p["error_code"] == 74
    assert (p["high_watermark"], p["last_stable_offset"], p["log_start_offset"]) == (100, 90, 0)
    assert p["aborted_transactions"] == [{"producer_id": 555, "first_offset": 80}]
    assert p["preferred_read_replica"] == -1
    assert bytes(p["records"]) == records
    assert p["current_leader"] == {"leader_id": 7, "leader_epoch": 9}
    assert p["diverging_epoch"] == {"epoch": -1, "end_offset": -1}
    assert p["snapshot_id"] == {"end_offset": -1, "epoch": -1}
    assert decoded["node_endpoints"] == [
        {"node_id": 7, "host": "broker-7", "port": 9092, "rack": None}]
    # and our encoder writes exactly those bytes back
    assert messages.encode_response(FETCH, 16, 77, decoded)[4:] == frame


def test_fetch_response_unknown_tag_is_skipped():
    partition = (struct.pack(">ihqqq", 0, 0, 1, 1, 0) + encode_uvarint(0) + struct.pack(">i", -1)
                 + _cstr(None)[:1]  # null records
                 + _tagged((1, struct.pack(">ii", 1, 2) + NO_TAGS), (9, b"future")))
    body_bytes = (struct.pack(">ihi", 0, 0, 0) + encode_uvarint(2) + uuid.UUID(int=5).bytes
                  + encode_uvarint(2) + partition + NO_TAGS + NO_TAGS)
    decoded = codec.decode(FETCH.response, 13, True, Reader(body_bytes))
    p = decoded["responses"][0]["partitions"][0]
    assert p["records"] is None
    assert p["aborted_transactions"] is None
    assert p["current_leader"] == {"leader_id": 1, "leader_epoch": 2}


def test_fetch_v4_response_null_records_and_aborted():
    body_bytes = (struct.pack(">i", 0)
                  + struct.pack(">i", 1) + _str16("t")
                  + struct.pack(">i", 1) + struct.pack(">ihqq", 0, 1, -1, -1)
                  + struct.pack(">i", -1)     # aborted_transactions: null
                  + struct.pack(">i", -1))    # records: null
    decoded = codec.decode(FETCH.response, 4, False, Reader(body_bytes))
    p = decoded["responses"][0]["partitions"][0]
    assert (p["error_code"], p["records"], p["aborted_transactions"]) == (1, None, None)
    assert p["log_start_offset"] == -1 and p["preferred_read_replica"] == -1
    assert codec.encode(FETCH.response, 4, False, decoded) == body_bytes


def test_list_offsets_v1_and_v10_request_bytes():
    body = {"replica_id": -1, "isolation_level": 1, "timeout_ms": 30000,
            "topics": [{"name": "t", "partitions": [
                {"partition_index": 1, "current_leader_epoch": 6, "timestamp": -2}]}]}
    assert codec.encode(LIST_OFFSETS.request, 1, False, body) == (
        struct.pack(">i", -1) + struct.pack(">i", 1) + _str16("t")
        + struct.pack(">i", 1) + struct.pack(">iq", 1, -2))
    assert codec.encode(LIST_OFFSETS.request, 10, True, body) == (
        struct.pack(">ib", -1, 1) + encode_uvarint(2) + _cstr("t")
        + encode_uvarint(2) + struct.pack(">iiq", 1, 6, -2) + NO_TAGS + NO_TAGS
        + struct.pack(">i", 30000) + NO_TAGS)


def test_list_offsets_v4_response_bytes():
    data = (struct.pack(">i", 3) + struct.pack(">i", 1) + _str16("t")
            + struct.pack(">i", 1) + struct.pack(">ihqqi", 0, 0, 1700000000000, 42, 5))
    decoded = codec.decode(LIST_OFFSETS.response, 4, False, Reader(data))
    assert decoded == {"throttle_time_ms": 3, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "error_code": 0, "timestamp": 1700000000000, "offset": 42,
         "leader_epoch": 5}]}]}


def test_metadata_request_null_topics_means_all():
    assert codec.encode(METADATA.request, 1, False, {"topics": None}) == struct.pack(">i", -1)
    assert codec.encode(METADATA.request, 12, True, {"topics": None}) == (
        b"\x00" + b"\x01" + b"\x00" + NO_TAGS)   # null compact array, auto-create, topic ops
    assert codec.encode(METADATA.request, 1, False, {}) == struct.pack(">i", 0)


def test_metadata_v12_request_bytes():
    tid = uuid.UUID(int=0x1234)
    body = {"topics": [{"topic_id": tid, "name": None}], "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": True,  # v8-10 only
            "include_topic_authorized_operations": True}
    assert codec.encode(METADATA.request, 12, True, body) == (
        encode_uvarint(2) + tid.bytes + b"\x00" + NO_TAGS + b"\x00" + b"\x01" + NO_TAGS)
    assert codec.encode(METADATA.request, 10, True, {**body, "topics": [
        {"topic_id": tid, "name": "t"}]}) == (
        encode_uvarint(2) + tid.bytes + _cstr("t") + NO_TAGS + b"\x00" + b"\x01" + b"\x01"
        + NO_TAGS)


def test_metadata_v8_response_bytes():
    data = (struct.pack(">i", 0)
            + struct.pack(">i", 1) + struct.pack(">i", 1) + _str16("h") + struct.pack(">i", 9092)
            + struct.pack(">h", -1)                           # rack: null
            + _str16("cluster") + struct.pack(">i", 1)
            + struct.pack(">i", 1) + struct.pack(">h", 0) + _str16("t") + b"\x00"
            + struct.pack(">i", 1)
            + struct.pack(">hiii", 0, 0, 1, 4)
            + struct.pack(">ii", 1, 1) + struct.pack(">ii", 1, 1) + struct.pack(">i", 0)
            + struct.pack(">i", -2147483648)
            + struct.pack(">i", 0x0F))
    decoded = codec.decode(METADATA.response, 8, False, Reader(data))
    assert decoded["brokers"] == [{"node_id": 1, "host": "h", "port": 9092, "rack": None}]
    assert decoded["cluster_id"] == "cluster" and decoded["controller_id"] == 1
    (t,) = decoded["topics"]
    assert t["topic_id"] == uuid.UUID(int=0) and t["is_internal"] is False
    assert t["partitions"] == [{"error_code": 0, "partition_index": 0, "leader_id": 1,
                                "leader_epoch": 4, "replica_nodes": [1], "isr_nodes": [1],
                                "offline_replicas": []}]
    assert decoded["cluster_authorized_operations"] == 0x0F
    assert decoded["error_code"] == 0


def test_sasl_handshake_v1_bytes():
    assert codec.encode(SASL_HANDSHAKE.request, 1, False, {"mechanism": "PLAIN"}) == _str16("PLAIN")
    data = struct.pack(">h", 33) + struct.pack(">i", 2) + _str16("PLAIN") + _str16("SCRAM-SHA-512")
    assert codec.decode(SASL_HANDSHAKE.response, 1, False, Reader(data)) == {
        "error_code": 33, "mechanisms": ["PLAIN", "SCRAM-SHA-512"]}


def test_sasl_authenticate_bytes():
    token = b"\x00user\x00secret"
    assert codec.encode(SASL_AUTHENTICATE.request, 1, False, {"auth_bytes": token}) == (
        struct.pack(">i", len(token)) + token)
    assert codec.encode(SASL_AUTHENTICATE.request, 2, True, {"auth_bytes": token}) == (
        encode_uvarint(len(token) + 1) + token + NO_TAGS)
    v2 = struct.pack(">h", 58) + _cstr("bad password") + encode_uvarint(1) + struct.pack(
        ">q", 0) + NO_TAGS
    assert codec.decode(SASL_AUTHENTICATE.response, 2, True, Reader(v2)) == {
        "error_code": 58, "error_message": "bad password", "auth_bytes": b"",
        "session_lifetime_ms": 0}
    v0 = struct.pack(">h", 0) + struct.pack(">h", -1) + struct.pack(">i", 0)
    assert codec.decode(SASL_AUTHENTICATE.response, 0, False, Reader(v0)) == {
        "error_code": 0, "error_message": None, "auth_bytes": b"", "session_lifetime_ms": 0}
