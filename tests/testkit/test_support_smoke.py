"""The test machinery itself works: Tansu answers, confluent-kafka round-trips through it, and the
mock cluster starts, takes writes and lets a broker go down and come back."""

from __future__ import annotations

import random
import socket
import struct
import uuid

import pytest
from confluent_kafka import KafkaError

from kdaemon.protocol.apis.api_versions import API_VERSIONS
from kdaemon.protocol.messages import encode_request
from kdaemon.protocol.versions import broker_ranges
from testkit.produce import (CODECS, ConsumedRecord, Writer, consume_all, create_topic, produce,
                                   produce_transactional)
from testkit.rawfetch import fetch_raw
from testkit.tansu import tansu_binary
from testkit.wire import api_versions

FETCH, METADATA, PRODUCE = 1, 3, 0


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- Tansu -----------------------------------------------------------------------------------

def test_tansu_binary_is_executable():
    path = tansu_binary()
    assert path.name == "tansu"
    assert path.stat().st_mode & 0o111 == 0o111


@pytest.mark.parametrize("version", range(API_VERSIONS.min_version, API_VERSIONS.max_version + 1))
def test_tansu_answers_api_versions(broker, version):
    body = api_versions(broker.host, broker.port, version)
    assert body["error_code"] == 0
    offered = broker_ranges(body)
    assert FETCH in offered and METADATA in offered and PRODUCE in offered
    lo, hi = offered[API_VERSIONS.key]
    assert lo <= version <= hi
    assert broker.bootstrap == f"127.0.0.1:{broker.port}"


def _golden_records(rng: random.Random) -> list[dict]:
    # 1 MiB that compresses (a random KiB repeated), so the big batch really is compressed:
    # librdkafka sends a batch uncompressed when compression would not make it smaller.
    big = rng.randbytes(1024) * 1024
    return [
        {"key": b"k1", "value": b"v1", "headers": [("h1", b"x"), ("h-null", None), ("h-empty", b"")],
         "timestamp": 1_700_000_000_123},
        {"key": None, "value": b"null key"},
        {"key": b"null value", "value": None},
        {"key": None, "value": None, "headers": [("only", b"headers")]},
        {"key": b"", "value": b""},
        {"key": b"utf8 \xc3\xa9", "value": bytes(range(256)) * 4, "timestamp": 1},
        {"key": b"big", "value": big},
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_produce_consume_round_trip(broker, codec):
    topic = unique(f"smoke-{codec}")
    create_topic(broker.bootstrap, topic)
    records = _golden_records(random.Random(codec))
    delivered = produce(broker.bootstrap, topic, records, compression=codec)

    assert [d.offset for d in delivered] == list(range(len(records)))
    assert {(d.topic, d.partition) for d in delivered} == {(topic, 0)}

    got = consume_all(broker.bootstrap, topic, 0, 0, delivered[-1].offset + 1)
    assert len(got) == len(records)
    for rec, d, c in zip(records, delivered, got):
        assert isinstance(c, ConsumedRecord)
        assert c.offset == d.offset
        assert c.key == rec["key"]
        assert c.value == rec["value"]
        assert c.headers == rec.get("headers", [])
        assert c.timestamp_type == "create_time"
        if "timestamp" in rec:
            assert c.timestamp == rec["timestamp"]

    # The broker holds what we asked for: batches in this codec (checked on the raw bytes).
    fetched = fetch_raw(broker.host, broker.port, topic)
    assert fetched.error_code == 0
    batches = fetched.batches()
    assert sum(b.record_count for b in batches) == len(records)
    assert {b.codec for b in batches} == {codec}


def test_produce_transactional_writes_markers(broker):
    """Tansu runs transactions: data batches flagged transactional, then an ABORT or COMMIT
    marker batch, each taking an offset.  (Its Fetch never lists aborted transactions, so
    read_committed filtering cannot be tested against it; see testkit/tansu.py.)"""
    topic = unique("smoke-txn")
    create_topic(broker.bootstrap, topic)
    reports = produce_transactional(broker.bootstrap, topic,
                                    committed=[(b"c1", b"1"), (b"c2", b"2")],
                                    aborted=[(b"a1", b"x"), (b"a2", b"y")])
    assert [d.offset for d in reports["aborted"]] == [0, 1]
    assert [d.offset for d in reports["committed"]] == [3, 4]

    batches = fetch_raw(broker.host, broker.port, topic).batches()
    assert [(b.base_offset, b.is_transactional, b.control_type) for b in batches] == [
        (0, True, None), (2, True, "abort"), (3, True, None), (5, True, "commit")]
    assert len({b.producer_id for b in batches}) == 1

    got = consume_all(broker.bootstrap, topic, 0, 0, 6, isolation_level="read_uncommitted")
    assert [(c.offset, c.key) for c in got] == [(0, b"a1"), (1, b"a2"), (3, b"c1"), (4, b"c2")]


def test_consume_all_needs_a_stop_condition(broker):
    with pytest.raises(ValueError, match="end or count"):
        consume_all(broker.bootstrap, "any", 0, 0)


def test_consume_all_times_out_instead_of_hanging(broker):
    topic = unique("smoke-short")
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [(b"only", b"one")])
    with pytest.raises(TimeoutError, match="read 1 record"):
        consume_all(broker.bootstrap, topic, 0, 0, count=2, timeout=2)


# --- librdkafka mock cluster -----------------------------------------------------------------

def test_mock_cluster_accepts_produce(mock_cluster):
    assert len(mock_cluster.addresses) == 3
    assert all(host == "127.0.0.1" for host, _ in mock_cluster.addresses)
    mock_cluster.topic_create("smoke", partitions=3, replication=1)
    mock_cluster.partition_set_leader("smoke", 0, 2)

    delivered = produce(mock_cluster.bootstrap, "smoke", [(b"a", b"1"), (None, b"2")], partition=0)
    assert [d.offset for d in delivered] == [0, 1]
    got = consume_all(mock_cluster.bootstrap, "smoke", 0, 0, 2)
    assert [(c.key, c.value) for c in got] == [(b"a", b"1"), (None, b"2")]

    leader = mock_cluster.addresses[2 - 1]
    assert [b.record_count for b in fetch_raw(*leader, "smoke").batches()] == [2]
    not_leader = mock_cluster.addresses[1 - 1]
    assert fetch_raw(*not_leader, "smoke").error_code == 6  # NOT_LEADER_OR_FOLLOWER


def test_mock_cluster_api_versions(mock_cluster):
    host, port = mock_cluster.addresses[0]
    body = api_versions(host, port, version=2)
    assert body["error_code"] == 0
    offered = broker_ranges(body)
    assert FETCH in offered and METADATA in offered
    assert offered[API_VERSIONS.key] == (0, 2)

    mock_cluster.set_apiversion(FETCH, 4, 11)
    assert broker_ranges(api_versions(host, port, version=2))[FETCH] == (4, 11)
    mock_cluster.set_apiversion(FETCH, -1, -1)
    assert FETCH not in broker_ranges(api_versions(host, port, version=2))


def test_mock_cluster_api_versions_fallback_layout(mock_cluster):
    """The mock answers ApiVersions v3+ (newer than its v2) with UNSUPPORTED_VERSION in a layout of
    its own: int16 error, *int8* entry count, the ApiVersions entry only, int32 throttle time.
    Kafka uses an int32 count there (the v0 layout), so a client must not trust that body."""
    host, port = mock_cluster.addresses[0]
    request = encode_request(API_VERSIONS, 3, 7, "kdaemon-tests",
                             {"client_software_name": "t", "client_software_version": "0"})
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(request)
        sock.settimeout(5)
        frame = b""
        while len(frame) < 4 or len(frame) < 4 + struct.unpack_from(">i", frame)[0]:
            chunk = sock.recv(4096)
            assert chunk, "the mock closed the connection"
            frame += chunk
    frame = frame[4:]
    correlation_id, error, count, key, lo, hi, throttle = struct.unpack(">ihbhhhi", frame)
    assert (correlation_id, error, count) == (7, 35, 1)
    assert (key, lo, hi, throttle) == (18, 0, 2, 0)


def test_mock_cluster_broker_down_and_up(mock_cluster):
    mock_cluster.topic_create("updown", partitions=1, replication=1)
    mock_cluster.partition_set_leader("updown", 0, 1)
    host, port = mock_cluster.addresses[0]
    assert api_versions(host, port, version=2)["error_code"] == 0

    mock_cluster.broker_set_down(1)
    with pytest.raises(OSError):
        api_versions(host, port, version=2, timeout=2)
    # The partition's leader is down and leadership does not move: produce cannot complete.
    w = Writer(mock_cluster.bootstrap, "updown", **{"message.timeout.ms": 1500})
    w.send(b"lost", partition=0)
    w.flush(10)
    assert len(w.failures) == 1 and not w.counts  # one report, and it is a failure
    assert w.failures[0].code() == KafkaError._MSG_TIMED_OUT

    mock_cluster.broker_set_up(1)
    assert api_versions(host, port, version=2)["error_code"] == 0
    assert [d.offset for d in produce(mock_cluster.bootstrap, "updown", [(b"k", b"v")])] == [0]


def test_mock_cluster_injected_errors(mock_cluster):
    host, port = mock_cluster.addresses[0]
    mock_cluster.push_request_errors(API_VERSIONS.key, [35])  # UNSUPPORTED_VERSION
    assert api_versions(host, port, version=2)["error_code"] == 35
    assert api_versions(host, port, version=2)["error_code"] == 0


def test_mock_cluster_coordinator_set(mock_cluster):
    mock_cluster.coordinator_set("group", "g1", 3)
    with pytest.raises(ValueError):
        mock_cluster.coordinator_set("nonsense", "g1", 3)


def test_mock_cluster_reports_bad_calls(mock_cluster):
    from testkit.mockcluster import MockClusterError
    with pytest.raises(MockClusterError, match="broker_set_down"):
        mock_cluster.broker_set_down(99)
    mock_cluster.close()
    with pytest.raises(MockClusterError, match="closed"):
        mock_cluster.topic_create("late")
