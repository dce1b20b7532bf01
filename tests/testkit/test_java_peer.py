"""The Java peer itself: what the parity suites compare kdaemon with must be right first."""

from __future__ import annotations

import time
import uuid

import pytest

from testkit.java_peer import (JavaConsumerProcess, JavaProduceOps, java_consume,
                                     java_offsets_for_times, java_produce)
from testkit.produce import create_topic

# Records stamped in 2023: kept from the shared broker's time-based retention (7 days).
KEEP = {"retention.ms": "-1"}

pytestmark = pytest.mark.kafka


def test_java_producer_and_consumer_round_trip(kafka):
    topic = f"peer-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2, config=KEEP)
    ops = JavaProduceOps()
    for i in range(10):
        ops.record(b"k%d" % i if i % 3 else None, None if i == 4 else b"v%d" % i, partition=i % 2,
                   headers=[("h", b"x"), ("n", None)], timestamp=1_700_000_000_000 + i)
    acks = java_produce(kafka.bootstrap, topic, ops, compression="zstd")
    assert [(a.partition, a.offset) for a in acks] == [(i % 2, i // 2) for i in range(10)]
    run = java_consume(kafka.bootstrap, assign=[(topic, 0), (topic, 1)], until_end=True)
    got = sorted(run.records, key=lambda r: (r.partition, r.offset))
    assert len(got) == 10
    r4 = next(r for r in got if r.partition == 0 and r.offset == 2)
    assert (r4.key, r4.value, r4.headers) == (b"k4", None, (("h", b"x"), ("n", None)))
    assert r4.timestamp == 1_700_000_000_004 and r4.timestamp_type == "CreateTime"
    assert next(r for r in got if r.offset == 0 and r.partition == 0).key is None
    assert run.positions() == {(topic, 0): 5, (topic, 1): 5}


def test_java_transactions_and_read_committed(kafka):
    topic = f"peer-txn-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1, config=KEEP)
    ops = JavaProduceOps()
    for committed in (True, False, True):
        ops.begin()
        for i in range(3):
            ops.record(None, b"%s-%d" % (b"c" if committed else b"a", i), partition=0)
        ops.commit() if committed else ops.abort()
    java_produce(kafka.bootstrap, topic, ops, transactional_id=f"tx-{topic}")
    rc = java_consume(kafka.bootstrap, assign=[(topic, 0)], until_end=True, isolation="read_committed")
    assert [r.value for r in rc.records] == [b"c-0", b"c-1", b"c-2"] * 2
    ru = java_consume(kafka.bootstrap, assign=[(topic, 0)], until_end=True)
    assert len(ru.records) == 9


def test_java_offsets_for_times(kafka):
    topic = f"peer-times-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1, config=KEEP)
    ops = JavaProduceOps()
    for i in range(5):
        ops.record(None, b"v", partition=0, timestamp=1_000_000 + 10 * i)
    java_produce(kafka.bootstrap, topic, ops)
    answers, bounds = java_offsets_for_times(kafka.bootstrap, [(topic, 0, 1_000_015), (topic, 0, 9_999_999)])
    assert [(a["offset"], a["found_timestamp"]) for a in answers] == [(2, 1_000_020), (None, None)]
    assert bounds["end"] == [[topic, 0, 5]]


def test_java_group_member_events(kafka):
    topic = f"peer-group-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2, config=KEEP)
    member = JavaConsumerProcess(kafka.bootstrap, topics=[topic], group=f"g-{topic}",
                                 assignor="cooperative-sticky", commit=True,
                                 settings={"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"})
    try:
        event = member.wait_event("assigned", predicate=lambda e: e["partitions"])
        assert event["partitions"] == [[topic, 0], [topic, 1]]
    finally:
        end = member.stop()
    assert end["event"] == "end" and end["count"] == 0
    # 128 + SIGTERM: the JVM's status after a signal, once its shutdown hook (close) has run.
    assert member.proc.returncode == 143
