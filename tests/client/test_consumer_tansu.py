"""kdaemon.client.Consumer against a real broker (Tansu), data written by confluent-kafka.

Every record confluent-kafka produced must come back exactly once, in order per partition, with
the same fields confluent-kafka's own consumer reports.  Tansu's high watermark is the last
batch's base offset + 1, so these tests stop on the delivery reports, never on the watermark.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid

import pytest

from kdaemon.client import Consumer, TopicPartition, WakeupError
from kdaemon.client.types import CREATE_TIME
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from testkit.produce import CODECS, consume_all, create_topic, produce

DEADLINE_S = 30


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _consumer(broker, **kw) -> Consumer:
    options = dict(auto_offset_reset="earliest", fetch_max_wait_ms=50, request_timeout_ms=10_000)
    options.update(kw)
    return Consumer(broker.bootstrap, **options)


def _drain(consumer: Consumer, expected: int, deadline_s: float = DEADLINE_S):
    """Poll until ``expected`` records arrived (or fail at the deadline); return them in order."""
    out = []
    deadline = time.monotonic() + deadline_s
    while len(out) < expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(out)} of {expected} records within {deadline_s} s")
        for records in consumer.poll(200).values():
            out.extend(records)
    return out


def _varied_records(n_small: int = 200):
    big = os.urandom(1024) * 1024  # 1 MiB, compressible so the batch fits the broker's limits
    records = [
        {"key": None, "value": b"null key"},
        {"key": b"null value", "value": None},
        {"key": None, "value": None},
        {"key": b"", "value": b""},
        {"key": b"h", "value": b"headers", "headers": [("a", b"1"), ("a", b"2"), ("\u00e9t\u00e9", None),
                                                      ("empty", b"")]},
        {"key": b"ts", "value": b"explicit timestamp", "timestamp": 1_600_000_000_123},
        {"key": b"big", "value": big},
    ]
    records += [{"key": f"k{i}".encode(), "value": f"v{i}".encode() * (i % 7 + 1),
                 "headers": [("i", str(i).encode())]} for i in range(n_small)]
    return records


@pytest.mark.parametrize("codec", CODECS)
def test_every_record_once_with_identical_fields(broker, codec):
    topic = _topic(f"golden-{codec}")
    create_topic(broker.bootstrap, topic)
    produced = _varied_records()
    reports = produce(broker.bootstrap, topic, produced, compression=codec, partition=0, **{"linger.ms": 20})
    expected = consume_all(broker.bootstrap, topic, 0, 0, reports[-1].offset + 1)
    assert [r.offset for r in expected] == [d.offset for d in reports]

    with _consumer(broker, max_partition_fetch_bytes=256 * 1024) as c:
        c.assign([TopicPartition(topic, 0)])
        got = _drain(c, len(reports))
    assert [r.offset for r in got] == [d.offset for d in reports]
    for ours, theirs in zip(got, expected):
        assert (ours.topic, ours.partition) == (topic, 0)
        assert ours.key == theirs.key
        assert ours.value == theirs.value
        assert ours.headers == theirs.headers
        assert ours.timestamp == theirs.timestamp
        assert theirs.timestamp_type == "create_time" and ours.timestamp_type == CREATE_TIME
    assert got[5].timestamp == 1_600_000_000_123
    assert len(got[6].value) == 1024 * 1024


def test_many_partitions_in_order_exactly_once(broker):
    topic = _topic("multi")
    create_topic(broker.bootstrap, topic, partitions=4)
    produced = [{"key": f"{i}".encode(), "value": f"value-{i}".encode()} for i in range(4000)]
    reports = produce(broker.bootstrap, topic, produced, compression="lz4")
    with _consumer(broker, max_poll_records=333) as c:
        c.assign([TopicPartition(topic, p) for p in range(4)])
        seen = []
        deadline = time.monotonic() + DEADLINE_S
        while len(seen) < len(reports) and time.monotonic() < deadline:
            batch = c.poll(200)
            assert sum(len(v) for v in batch.values()) <= 333
            for records in batch.values():
                seen.extend(records)
        # Nothing more arrives once everything was read.
        assert not any(c.poll(300).values())
    assert len(seen) == len(reports)
    by_partition = {}
    for r in seen:
        by_partition.setdefault(r.partition, []).append(r.offset)
    for p, offsets in by_partition.items():
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    expected = {(d.partition, d.offset): produced[i]["value"] for i, d in enumerate(reports)}
    assert {(r.partition, r.offset): r.value for r in seen} == expected


def test_seek_pause_resume_and_position(broker):
    topic = _topic("seek")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [(b"k", f"{i}".encode()) for i in range(100)], partition=0)
    produce(broker.bootstrap, topic, [(b"k", f"{i}".encode()) for i in range(100)], partition=1)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with _consumer(broker) as c:
        c.assign([tp0, tp1])
        assert c.position(tp0) == 0
        c.seek(tp0, 90)
        c.pause(tp1)
        assert c.paused() == {tp1}
        got = _drain(c, 10)
        assert [(r.partition, r.offset) for r in got] == [(0, o) for o in range(90, 100)]
        assert not any(c.poll(300).values()), "a paused partition returned records"
        assert c.position(tp0) == 100
        c.resume(tp1)
        got = _drain(c, 100)
        assert [(r.partition, r.offset) for r in got] == [(1, o) for o in range(100)]
        c.seek_to_beginning(tp0)
        assert c.position(tp0) == 0
        got = _drain(c, 100)
        assert [r.offset for r in got] == list(range(100))


def test_seek_while_data_is_buffered_discards_stale_fetch(broker):
    topic = _topic("stale")
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [(None, f"{i}".encode()) for i in range(500)], partition=0)
    tp = TopicPartition(topic, 0)
    with _consumer(broker, max_poll_records=10) as c:
        c.assign([tp])
        first = _drain(c, 10)
        assert [r.offset for r in first] == list(range(10))
        c.seek(tp, 400)  # the rest of the first fetch is now stale
        got = _drain(c, 100)
        assert [r.offset for r in got] == list(range(400, 500))


def test_header_filter_drops_records_and_still_advances_position(broker):
    topic = _topic("filter")
    create_topic(broker.bootstrap, topic)
    kinds = itertools.cycle([b"keep", b"drop", b"drop"])
    produced = [{"value": f"{i}".encode(), "headers": [("kind", next(kinds))]} for i in range(300)]
    produced.append({"value": b"last, dropped", "headers": [("kind", b"drop")]})
    reports = produce(broker.bootstrap, topic, produced, compression="zstd", partition=0)
    tp = TopicPartition(topic, 0)
    rules = HeaderRules([HeaderRule("kind", "equals", (b"keep",))], default=False)
    with _consumer(broker, header_filter=rules) as c:
        c.assign([tp])
        got = _drain(c, 100)
        assert [r.offset for r in got] == [d.offset for i, d in enumerate(reports) if i % 3 == 0 and i < 300]
        deadline = time.monotonic() + 10
        while c.position(tp) != reports[-1].offset + 1 and time.monotonic() < deadline:
            assert not any(c.poll(100).values())
        # The position passes the dropped tail: a commit now would not re-read it.
        assert c.position(tp) == reports[-1].offset + 1
        m = c.metrics()
        assert m.records_filtered_total == 201
        assert m.partitions[tp].records_filtered == 201


def test_large_record_makes_progress_with_small_fetch_limits(broker):
    topic = _topic("large")
    create_topic(broker.bootstrap, topic)
    big = os.urandom(2048) * 512  # 1 MiB
    reports = produce(broker.bootstrap, topic, [(b"a", b"small"), (b"b", big), (b"c", b"after")], partition=0)
    with _consumer(broker, max_partition_fetch_bytes=16 * 1024, fetch_max_bytes=4 * 1024 * 1024) as c:
        c.assign([TopicPartition(topic, 0)])
        got = _drain(c, 3)
    assert [r.offset for r in got] == [d.offset for d in reports]
    assert got[1].value == big


def test_wakeup_interrupts_a_blocked_poll(broker):
    topic = _topic("wakeup")
    create_topic(broker.bootstrap, topic)
    with _consumer(broker) as c:
        c.assign([TopicPartition(topic, 0)])
        timer = threading.Timer(0.5, c.wakeup)
        timer.start()
        started = time.monotonic()
        with pytest.raises(WakeupError):
            c.poll(20_000)
        assert time.monotonic() - started < 10
        timer.join()
        assert c.poll(0) == {}  # the wakeup was consumed


def test_second_thread_is_refused(broker):
    topic = _topic("threads")
    create_topic(broker.bootstrap, topic)
    with _consumer(broker) as c:
        c.assign([TopicPartition(topic, 0)])
        errors = []

        def other():
            try:
                c.poll(0)
            except RuntimeError as exc:
                errors.append(exc)

        with c._use():
            t = threading.Thread(target=other)
            t.start()
            t.join()
        assert errors and "several threads" in str(errors[0])
