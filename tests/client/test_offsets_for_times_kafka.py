"""offsets_for_times on Kafka's timestamp index, answer for answer equal to the Java consumer's.

Tansu answers every timestamp look-up with offset 0 and librdkafka's mock cluster with -1, so
look-ups could only be checked for shape there; Apache Kafka keeps a real time index.  Each test
writes partitions with known timestamps (in order with duplicates, out of order within and
across batches, enough records for a many-entry index), asks kdaemon's ``Consumer`` and the Java
``KafkaConsumer.offsetsForTimes`` the same questions (before every record, exact hits, between
records, after every record), and compares offset, timestamp and leader epoch.  Kafka's answer
is defined as the earliest offset whose timestamp is >= the one asked for; that is checked too,
from the records themselves, so the two clients cannot agree on a wrong answer.
"""

from __future__ import annotations

import uuid
from collections import defaultdict

import pytest

from kdaemon.client import Consumer, TopicPartition
from testkit.parity import read_to_end
from testkit.java_peer import JavaProduceOps, java_offsets_for_times, java_produce
from testkit.produce import Record, create_topic, produce

pytestmark = pytest.mark.kafka

BASE = 1_700_000_000_000
# Years-old timestamps: without this, time-based retention deletes the partitions' segments at the
# broker's next retention check (every 5 minutes), under the test's feet.
KEEP = {"retention.ms": "-1"}


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _questions(timestamps: list[int]) -> list[int]:
    """Before all, every timestamp, one below and one above each, after all; duplicates kept once."""
    qs = {0, min(timestamps) - 1, max(timestamps) + 1, max(timestamps) + 10**9}
    for ts in timestamps:
        qs |= {ts - 1, ts, ts + 1}
    return sorted(q for q in qs if q >= 0)


def _ours(bootstrap: str, queries: list[tuple[str, int, int]]) -> list[tuple]:
    """kdaemon's answers in the order asked: one look-up per round holding at most one timestamp
    per partition (several partitions per request, as the Consumer batches them)."""
    rounds: list[dict[TopicPartition, int]] = []
    slot: dict[TopicPartition, int] = defaultdict(int)
    index: list[tuple[int, TopicPartition]] = []
    for t, p, ts in queries:
        tp = TopicPartition(t, p)
        r = slot[tp]
        slot[tp] += 1
        if r == len(rounds):
            rounds.append({})
        rounds[r][tp] = ts
        index.append((r, tp))
    with Consumer(bootstrap) as c:
        answers = [c.offsets_for_times(q) for q in rounds]
    out = []
    for r, tp in index:
        a = answers[r][tp]
        out.append((None, None, None) if a is None else (a.offset, a.timestamp, a.leader_epoch))
    return out


def _compare(bootstrap: str, records, queries: list[tuple[str, int, int]]) -> None:
    java, bounds = java_offsets_for_times(bootstrap, queries)
    theirs = [(a["offset"], a["found_timestamp"], a["leader_epoch"]) for a in java]
    ours = _ours(bootstrap, queries)
    tps = sorted({TopicPartition(t, p) for t, p, _ in queries})
    with Consumer(bootstrap) as c:
        assert [[t, p, o] for (t, p), o in sorted(c.beginning_offsets(tps).items())] == bounds["beginning"]
        assert [[t, p, o] for (t, p), o in sorted(c.end_offsets(tps).items())] == bounds["end"]
    diffs = [(q, o, t) for q, o, t in zip(queries, ours, theirs, strict=True) if o != t]
    assert not diffs, f"{len(diffs)} of {len(queries)} answers differ (query, kdaemon, java): {diffs[:10]}"
    # Kafka's definition, from the records read back.
    by_tp = defaultdict(list)
    for r in records:
        by_tp[(r.topic, r.partition)].append(r)
    for (t, p, ts), (offset, found, epoch) in zip(queries, ours):
        hit = next((r for r in by_tp[(t, p)] if r.timestamp >= ts), None)
        want = (None, None, None) if hit is None else (hit.offset, hit.timestamp, hit.leader_epoch)
        assert (offset, found, epoch) == want, f"{t}-{p} at {ts}"
    assert any(a[0] is None for a in ours) and any(a[0] is not None and a[0] > 0 for a in ours)


def test_create_time_look_ups_match_java(kafka):
    """p0 in order with runs of equal timestamps; p1 out of order inside and across batches (the
    Java producer's); p2 2,000 records over a dense time index (index.interval.bytes=512); p3 empty."""
    topic = _topic("times")
    create_topic(kafka.bootstrap, topic, 4, config={"index.interval.bytes": "512", **KEEP})
    p0 = [BASE + 10 * (i // 3) for i in range(30)]
    produce(kafka.bootstrap, topic, [Record(None, b"a%d" % i, (), ts) for i, ts in enumerate(p0[:15])], partition=0)
    produce(kafka.bootstrap, topic, [Record(None, b"b%d" % i, (), ts) for i, ts in enumerate(p0[15:])], partition=0)
    p1_batches = [[BASE + 50, BASE + 10, BASE + 40], [BASE + 20, BASE + 60, BASE + 5], [BASE + 40, BASE + 45]]
    ops = JavaProduceOps()
    for batch in p1_batches:
        for ts in batch:
            ops.record(None, b"x", partition=1, timestamp=ts)
        ops.flush()
    java_produce(kafka.bootstrap, topic, ops)
    p2 = [BASE + 1000 + i - (i % 7 == 3) * 5 for i in range(2000)]   # every 7th a little early
    produce(kafka.bootstrap, topic, [Record(b"%d" % i, b"v" * 100, (), ts) for i, ts in enumerate(p2)],
            partition=2, **{"linger.ms": 5, "batch.size": 4096})
    parts = [(topic, p) for p in range(3)]
    records = read_to_end(kafka.bootstrap, parts).records
    assert [r.timestamp for r in records if r.partition == 1] == [ts for b in p1_batches for ts in b]
    queries = [(topic, 0, ts) for ts in _questions(p0)]
    queries += [(topic, 1, ts) for ts in _questions([ts for b in p1_batches for ts in b])]
    queries += [(topic, 2, ts) for ts in _questions(p2[::97] + p2[-3:])]
    queries += [(topic, 3, ts) for ts in (0, BASE)]
    _compare(kafka.bootstrap, records, queries)


def test_log_append_time_look_ups_match_java(kafka):
    """The broker's append times (one per batch), asked for exactly, just below and above."""
    topic = _topic("times-lat")
    create_topic(kafka.bootstrap, topic, 2, config={"message.timestamp.type": "LogAppendTime"})
    for round_ in range(4):
        for p in (0, 1):
            produce(kafka.bootstrap, topic, [Record(None, b"%d-%d" % (round_, i), (), BASE) for i in range(5)],
                    partition=p)
    parts = [(topic, 0), (topic, 1)]
    records = read_to_end(kafka.bootstrap, parts).records
    assert {r.timestamp_type for r in records} == {"LogAppendTime"} and len(records) == 40
    queries = [(topic, p, ts) for p in (0, 1)
               for ts in _questions([r.timestamp for r in records if r.partition == p])]
    _compare(kafka.bootstrap, records, queries)


def test_negative_timestamp_is_refused(kafka):
    """As Java's IllegalArgumentException: a negative timestamp is a caller's error, not a query
    (-1 and -2 would silently mean latest and earliest on the wire)."""
    with Consumer(kafka.bootstrap) as c, pytest.raises(ValueError, match="-5"):
        c.offsets_for_times({TopicPartition("any", 0): -5})
