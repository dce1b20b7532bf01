"""Everything confluent-kafka and the Java producer write comes back from kdaemon as from the Java consumer.

Against Apache Kafka (the session ``kafka`` fixture), each test writes records with both
producers, reads the partitions to the end with kdaemon's ``Consumer`` and with the Java
``KafkaConsumer`` (testkit/java_peer.py), and compares the two per partition, record for
record and field for field (topic, partition, offset, timestamp, timestamp type, leader epoch,
key, value, headers).  Both are also checked against what was produced (the acknowledged
offsets, keys, values, headers, explicit timestamps), so two clients wrong in the same way
would not pass either.
"""

from __future__ import annotations

import os
import random
import uuid

import pytest

from testkit.parity import by_partition, first_difference, read_to_end
from testkit.java_peer import JavaProduceOps, java_consume, java_produce
from testkit.produce import CODECS, Record, create_topic, produce

pytestmark = pytest.mark.kafka

BIG = 1024 * 1024                # one record's value: above max_partition_fetch_bytes
SMALL_FETCH = 64 * 1024          # max_partition_fetch_bytes for both consumers
TOPIC_MAX_MESSAGE_BYTES = str(4 * 1024 * 1024)
BASE_TS = 1_700_000_000_000
# The records carry timestamps years old: time-based retention (7 days by default) would delete
# their segments (the active one included, rolled for it) at the broker's next retention check,
# and a consumer that comes later starts at the new log start offset.
KEEP = {"retention.ms": "-1"}


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _varied(tag: str, rng: random.Random, big: bool) -> list[list[Record]]:
    """Groups of records (each group written as its own batches): null and empty keys and values,
    headers with null values, repeated, empty and non-ASCII keys, long and many headers, explicit
    timestamps out of order and
    broker-chosen ones (None: the producer's clock), and one 1 MiB record when ``big``."""
    t = tag.encode()
    groups = [[
        Record(None, b"null key " + t),
        Record(b"null value " + t, None),
        Record(None, None),
        Record(b"", b""),
        Record(b"h", b"headers " + t, (("a", b"1"), ("a", b"2"), ("\u00e9t\u00e9", None), ("empty", b""),
                                      ("a", None))),
        Record(b"ts", b"explicit", (), BASE_TS + 5_000),
        Record(b"ts-earlier", b"out of order", (("n", None),), BASE_TS + 1_000),
        Record(b"ts-one", b"near the epoch", (), 1),  # (0 is "now" to librdkafka)
        # Multi-byte varints everywhere: 70 headers, an empty header key, a 20 KiB header value,
        # a 10 KiB key.
        Record(b"K" * 10_240, b"wide", tuple((f"x{j}", b"%d" % j) for j in range(70)) + (("", b"empty key"),)),
        Record(b"hv", None, (("big", rng.randbytes(20_480)), ("after", b"big"))),
    ]]
    if big:
        groups.append([Record(b"big " + t, rng.randbytes(BIG), (("size", b"1MiB"),), BASE_TS + 7_000)])
    groups.append([Record(b"k%d" % i, b"%s-%d-" % (t, i) * (i % 9 + 1),
                          tuple((f"h{j}", b"%d" % (i * j) if (i + j) % 4 else None) for j in range(i % 4)),
                          BASE_TS + 10_000 + (i * 7919) % 500 if i % 3 else None)
                   for i in range(60)])
    return groups


def _produced_check(records, expected: dict[int, list[tuple[int, Record]]]) -> None:
    """kdaemon's records per partition are exactly the acknowledged ones, in offset order, with
    the produced key, value, headers and (when given) timestamp."""
    got = by_partition(records)
    for p, want in expected.items():
        recs = [r for (t, q), rs in got.items() if q == p for r in rs]
        assert [r.offset for r in recs] == [o for o, _ in want], f"partition {p}: offsets differ from the acks"
        for r, (o, w) in zip(recs, want):
            assert (r.key, r.value, r.headers) == (w.key, w.value, w.headers), f"partition {p} offset {o}"
            if w.timestamp is not None:
                assert (r.timestamp, r.timestamp_type) == (w.timestamp, "CreateTime"), f"partition {p} offset {o}"


def test_every_codec_and_shape_from_both_producers(kafka):
    """Partitions 0-4: confluent-kafka, one codec each; 5-9: the Java producer, one codec each.
    A 1 MiB record sits in partitions 0 and 9, read with max_partition_fetch_bytes=64 KiB: Kafka
    returns it whole anyway (at least one batch), and kdaemon must deliver it like Java."""
    topic = _topic("parity")
    n = 2 * len(CODECS)
    create_topic(kafka.bootstrap, topic, n, config={"max.message.bytes": TOPIC_MAX_MESSAGE_BYTES, **KEEP})
    rng = random.Random(2)
    expected: dict[int, list[tuple[int, Record]]] = {}
    for p, codec in enumerate(CODECS):
        for group in _varied(f"rd-{codec}", rng, big=p == 0):
            acks = produce(kafka.bootstrap, topic, group, compression=codec, partition=p)
            expected.setdefault(p, []).extend((a.offset, r) for a, r in zip(acks, group))
    ops, sent = JavaProduceOps(), []
    for i, codec in enumerate(CODECS):
        p = len(CODECS) + i
        ops.compression(codec)
        for group in _varied(f"java-{codec}", rng, big=p == n - 1):
            for r in group:
                ops.record(r.key, r.value, partition=p, headers=r.headers, timestamp=r.timestamp)
                sent.append((p, r))
            ops.flush()
    acks = java_produce(kafka.bootstrap, topic, ops, settings={"max.request.size": TOPIC_MAX_MESSAGE_BYTES})
    for a, (p, r) in zip(acks, sent, strict=True):
        assert a.error is None and a.partition == p
        expected.setdefault(p, []).append((a.offset, r))

    parts = [(topic, p) for p in range(n)]
    ours = read_to_end(kafka.bootstrap, parts, max_partition_fetch_bytes=SMALL_FETCH)
    theirs = java_consume(kafka.bootstrap, assign=parts, until_end=True,
                          settings={"max.partition.fetch.bytes": str(SMALL_FETCH)})
    assert first_difference(ours.records, theirs.records) is None, first_difference(ours.records, theirs.records)
    _produced_check(ours.records, expected)
    assert ours.positions == theirs.positions() == ours.end_offsets
    assert ours.lags() == theirs.lags() == {tp: 0 for tp in parts}
    # fetch_max_bytes below the record too: Kafka still returns the first batch whole (KIP-74),
    # and handing records out a few at a time splits batches across polls.
    tight = read_to_end(kafka.bootstrap, parts, max_partition_fetch_bytes=SMALL_FETCH, fetch_max_bytes=SMALL_FETCH,
                        max_poll_records=7)
    assert first_difference(tight.records, theirs.records) is None, first_difference(tight.records, theirs.records)
    bigs = [r for r in ours.records if r.value is not None and len(r.value) == BIG]
    assert [r.partition for r in bigs] == [0, n - 1]
    assert {r.leader_epoch for r in ours.records} != {None}, "Kafka stamps batches with the leader epoch"


def test_log_append_time_topic(kafka):
    """message.timestamp.type=LogAppendTime: the broker's clock replaces the producers' timestamps
    (v2 batches carry it as the batch's max timestamp); kdaemon reports the same timestamps and type."""
    topic = _topic("parity-lat")
    create_topic(kafka.bootstrap, topic, 2, config={"message.timestamp.type": "LogAppendTime"})
    rd = [Record(b"k%d" % i, b"v%d" % i, (("h", None),), BASE_TS + i) for i in range(50)]
    produce(kafka.bootstrap, topic, rd[:25], compression="lz4", partition=0)
    produce(kafka.bootstrap, topic, rd[25:], partition=0)
    ops = JavaProduceOps()
    ops.compression("gzip")
    for i in range(50):
        ops.record(b"j%d" % i, b"w%d" % i, partition=1, timestamp=BASE_TS + i)
        if i == 24:
            ops.flush()
    java_produce(kafka.bootstrap, topic, ops)
    parts = [(topic, 0), (topic, 1)]
    ours = read_to_end(kafka.bootstrap, parts)
    theirs = java_consume(kafka.bootstrap, assign=parts, until_end=True)
    assert first_difference(ours.records, theirs.records) is None, first_difference(ours.records, theirs.records)
    assert [r.value for r in ours.records if r.partition == 0] == [b"v%d" % i for i in range(50)]
    assert [r.value for r in ours.records if r.partition == 1] == [b"w%d" % i for i in range(50)]
    assert {r.timestamp_type for r in ours.records} == {"LogAppendTime"}
    assert all(r.timestamp > BASE_TS + 10**9 for r in ours.records), "timestamps are the broker's, not ours"


def test_100k_records_over_8_partitions(kafka):
    topic = _topic("parity-100k")
    create_topic(kafka.bootstrap, topic, 8, config=KEEP)
    n = 100_000
    records = [Record(b"key-%d" % i if i % 11 else None, b"value-%07d-" % i + os.urandom(i % 40),
                      (("seq", b"%d" % i),) if i % 5 == 0 else (), BASE_TS + i)
               for i in range(n)]
    expected: dict[int, list[tuple[int, Record]]] = {}
    for p in range(8):
        mine = records[p::8]
        acks = produce(kafka.bootstrap, topic, mine, compression="lz4", partition=p,
                       **{"linger.ms": 20, "batch.num.messages": 2000})
        expected[p] = [(a.offset, r) for a, r in zip(acks, mine)]
    parts = [(topic, p) for p in range(8)]
    ours = read_to_end(kafka.bootstrap, parts)
    theirs = java_consume(kafka.bootstrap, assign=parts, until_end=True, timeout=300)
    assert len(ours.records) == len(theirs.records) == n
    assert first_difference(ours.records, theirs.records) is None, first_difference(ours.records, theirs.records)
    _produced_check(ours.records, expected)
    assert ours.positions == theirs.positions() == {(topic, p): n // 8 for p in range(8)}
