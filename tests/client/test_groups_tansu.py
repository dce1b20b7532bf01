"""Consumer groups against a real broker (Tansu): membership, rebalances, commits, static members.

Group joins on Tansu are slow with long session timeouts, so every consumer here uses a 6 s
session timeout.  Each kdaemon consumer runs in its own thread (a consumer belongs to one
thread), polling until told to stop.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition as RdTopicPartition

from kdaemon.client import Consumer, TopicPartition
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from testkit.produce import create_topic, produce

GROUP_OPTS = dict(session_timeout_ms=6000, heartbeat_interval_ms=500, fetch_max_wait_ms=100,
                  auto_offset_reset="earliest", retry_backoff_ms=50, request_timeout_ms=10_000)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Member(threading.Thread):
    """A kdaemon group member polling in its own thread, recording what it got."""

    def __init__(self, bootstrap: str, group: str, topic: str, **opts) -> None:
        super().__init__(daemon=True)
        options = dict(GROUP_OPTS)
        options.update(opts)
        self.consumer = Consumer(bootstrap, group_id=group, **options)
        self.topic = topic
        self.records: list = []
        self.assignments: list[set] = []
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.closed = threading.Event()
        self.close_on_stop = True

    def run(self) -> None:
        c = self.consumer
        try:
            c.subscribe([self.topic])
            while not self.stop_event.is_set():
                for records in c.poll(100).values():
                    self.records.extend(records)
                a = c.assignment()
                if not self.assignments or self.assignments[-1] != a:
                    self.assignments.append(a)
        except BaseException as exc:  # surfaced by the test
            self.error = exc
        finally:
            if self.close_on_stop:
                c.close()
            self.closed.set()

    def stop(self, close: bool = True) -> None:
        self.close_on_stop = close
        self.stop_event.set()
        self.join(30)
        assert not self.is_alive(), "member thread did not stop"
        if self.error is not None:
            raise self.error


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def _current(members) -> list[set]:
    return [m.assignments[-1] if m.assignments else set() for m in members]


def _balanced_and_complete(members, n_partitions: int, topic: str) -> bool:
    current = _current(members)
    union = set().union(*current)
    disjoint = sum(len(a) for a in current) == len(union)
    return disjoint and union == {TopicPartition(topic, p) for p in range(n_partitions)} and all(current)


def test_three_members_split_twelve_partitions_and_failover(broker):
    topic, group = _name("grp"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=12)
    counter = itertools.count()

    def produce_some(n: int) -> None:
        produce(broker.bootstrap, topic, [(None, f"{next(counter)}".encode()) for _ in range(n)])

    produce_some(600)
    members = [Member(broker.bootstrap, group, topic, auto_commit_interval_ms=200) for _ in range(3)]
    for m in members:
        m.start()
    _wait(lambda: _balanced_and_complete(members, 12, topic), 60, "a complete, disjoint assignment")
    assert sorted(len(a) for a in _current(members)) == [4, 4, 4]

    produce_some(600)
    leaving = members[0]
    _wait(lambda: sum(len(m.records) for m in members) >= 1200, 60, "the first 1200 records")
    leaving.stop(close=True)  # commits its positions and leaves the group
    left_with = leaving.assignments[-1]
    survivors = members[1:]
    produce_some(600)
    _wait(lambda: _balanced_and_complete(survivors, 12, topic), 60, "the survivors to take over")
    assert left_with and left_with <= set().union(*_current(survivors))
    _wait(lambda: len({(r.partition, r.offset) for m in members for r in m.records}) >= 1800, 60,
          "all 1800 records")
    for m in survivors:
        m.stop()

    seen = Counter((r.partition, r.offset) for m in members for r in m.records)
    values = {r.value for m in members for r in m.records}
    assert values == {f"{i}".encode() for i in range(1800)}
    # The member that left committed on close, so nothing it consumed is delivered twice.
    duplicates = [k for k, n in seen.items() if n > 1]
    assert duplicates == [], f"records delivered twice: {duplicates[:10]}"


def test_static_member_restart_does_not_rebalance_others(broker):
    topic, group = _name("static"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=4)
    produce(broker.bootstrap, topic, [(None, b"x")] * 100)
    a = Member(broker.bootstrap, group, topic, group_instance_id="host-a-0")
    b = Member(broker.bootstrap, group, topic, group_instance_id="host-b-0")
    a.start()
    b.start()
    _wait(lambda: _balanced_and_complete([a, b], 4, topic), 60, "the initial assignment")
    _wait(lambda: b.consumer.group_generation() is not None, 10, "b's generation")
    generation_before = b.consumer.group_generation()[0]
    a_partitions = a.assignments[-1]
    a.stop(close=True)  # a static member does not send LeaveGroup
    # Restart within the session timeout with the same instance id.
    a2 = Member(broker.bootstrap, group, topic, group_instance_id="host-a-0")
    a2.start()
    _wait(lambda: a2.assignments and a2.assignments[-1], 30, "the restarted member's assignment")
    assert a2.assignments[-1] == a_partitions
    time.sleep(2)  # heartbeats of b would now see a rebalance if one was triggered
    assert b.consumer.group_generation()[0] == generation_before
    first = next(i for i, x in enumerate(b.assignments) if x)
    assert len(b.assignments) == first + 1, f"b was reassigned: {b.assignments}"
    a2.stop()
    b.stop()


def test_committed_offsets_read_back_by_librdkafka_including_filtered_tail(broker):
    topic, group = _name("commit"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=2)
    kinds = itertools.cycle([b"keep", b"drop"])
    records = [{"value": f"{i}".encode(), "headers": [("kind", next(kinds))]} for i in range(100)]
    records.append({"value": b"dropped tail", "headers": [("kind", b"drop")]})
    reports = produce(broker.bootstrap, topic, records, partition=0)
    produce(broker.bootstrap, topic, [(None, b"p1")] * 10, partition=1)
    ends = {0: reports[-1].offset + 1, 1: 10}
    rules = HeaderRules([HeaderRule("kind", "equals", (b"keep",))], default=False)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with Consumer(broker.bootstrap, group_id=group, enable_auto_commit=False, header_filter=rules,
                  **GROUP_OPTS) as c:
        c.assign([tp0, tp1])
        got = []
        deadline = time.monotonic() + 30
        while (c.position(tp0) < ends[0] or c.position(tp1) < ends[1]) and time.monotonic() < deadline:
            for rs in c.poll(200).values():
                got.extend(rs)
        assert len([r for r in got if r.partition == 0]) == 50
        c.commit()
        assert c.committed([tp0, tp1]) == {tp0: (ends[0], "", None), tp1: (ends[1], "", None)} or \
            {tp: om.offset for tp, om in c.committed([tp0, tp1]).items()} == {tp0: ends[0], tp1: ends[1]}
        c.commit({tp1: 7})
    rd = RdConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        committed = rd.committed([RdTopicPartition(topic, 0), RdTopicPartition(topic, 1)], timeout=10)
        assert {p.partition: p.offset for p in committed} == {0: ends[0], 1: 7}
    finally:
        rd.close()
    # A restarted kdaemon consumer in the group starts from the committed positions.
    with Consumer(broker.bootstrap, group_id=group, **GROUP_OPTS) as c2:
        c2.assign([tp0, tp1])
        assert c2.position(tp0) == ends[0]
        assert c2.position(tp1) == 7


def test_commit_async_callback_and_on_commit_interceptor(broker):
    topic, group = _name("async"), _name("g")
    create_topic(broker.bootstrap, topic)
    produce(broker.bootstrap, topic, [(None, b"v")] * 20)
    seen_by_interceptor = []
    tp = TopicPartition(topic, 0)
    with Consumer(broker.bootstrap, group_id=group, enable_auto_commit=False,
                  on_commit=seen_by_interceptor.append, **GROUP_OPTS) as c:
        c.assign([tp])
        n = 0
        deadline = time.monotonic() + 20
        while n < 20 and time.monotonic() < deadline:
            n += sum(len(v) for v in c.poll(200).values())
        results = []
        c.commit_async(callback=lambda offsets, exc: results.append((offsets, exc)))
        deadline = time.monotonic() + 10
        while not results and time.monotonic() < deadline:
            c.poll(100)
        assert results and results[0][1] is None
        assert results[0][0][tp].offset == 20
        assert seen_by_interceptor and seen_by_interceptor[-1][tp].offset == 20


def test_rebalance_listener_can_commit_revoked_positions(broker):
    topic, group = _name("listener"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, [(None, b"v")] * 40)
    events = []

    class Listener:
        def __init__(self, consumer):
            self.consumer = consumer

        def on_partitions_assigned(self, partitions):
            events.append(("assigned", frozenset(partitions)))

        def on_partitions_revoked(self, partitions):
            events.append(("revoked", frozenset(partitions)))
            self.consumer.commit({tp: self.consumer.position(tp) for tp in partitions})

    c = Consumer(broker.bootstrap, group_id=group, enable_auto_commit=False, **GROUP_OPTS)
    c.subscribe([topic], listener=Listener(c))
    n = 0
    deadline = time.monotonic() + 40
    while n < 40 and time.monotonic() < deadline:
        n += sum(len(v) for v in c.poll(200).values())
    assert n == 40
    c.close()  # revokes, and the listener commits inside the callback
    assert events[0][0] == "assigned" and events[-1][0] == "revoked"
    rd = RdConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        committed = rd.committed([RdTopicPartition(topic, 0), RdTopicPartition(topic, 1)], timeout=10)
        assert sum(p.offset for p in committed) == 40
    finally:
        rd.close()


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_mixed_group_with_librdkafka_member(broker, strategy):
    topic, group = _name(f"mixed-{strategy}"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=6)
    produce(broker.bootstrap, topic, [(None, f"{i}".encode()) for i in range(600)])
    ours = Member(broker.bootstrap, group, topic, partition_assignment_strategy=(strategy,))
    rd = RdConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                     "partition.assignment.strategy": strategy, "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
    rd_assignment: list = []
    rd.subscribe([topic], on_assign=lambda c, ps: rd_assignment.append(("assign", [p.partition for p in ps])),
                 on_revoke=lambda c, ps: rd_assignment.append(("revoke", [p.partition for p in ps])))
    ours.start()
    rd_values = []
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            msg = rd.poll(0.1)
            if msg is not None and not msg.error():
                rd_values.append((msg.partition(), msg.offset()))
            rd_parts = set(rd.assignment())
            if ours.assignments and ours.assignments[-1] and rd_parts:
                ours_parts = {tp.partition for tp in ours.assignments[-1]}
                theirs = {p.partition for p in rd_parts}
                if not ours_parts & theirs and ours_parts | theirs == set(range(6)) and \
                        len(rd_values) + len(ours.records) >= 600:
                    break
        ours_parts = {tp.partition for tp in ours.assignments[-1]}
        theirs = {p.partition for p in rd.assignment()}
        assert ours_parts and theirs, f"one member got nothing: ours={ours_parts} theirs={theirs}"
        assert not ours_parts & theirs and ours_parts | theirs == set(range(6))
        assert len(rd_values) + len(ours.records) >= 600
    finally:
        ours.stop()
        rd.close()


def test_yield_poll_from_the_listener_ends_that_poll_and_only_that_one(broker):
    """A listener that pauses what it was just given calls ``yield_poll``: the poll that ran it
    returns at once with nothing instead of waiting out its timeout (the worker's resume-at-output
    does this), and the next poll is not cut short by it."""
    topic, group = _name("yield"), _name("g-yield")
    create_topic(broker.bootstrap, topic, 2)
    produce(broker.bootstrap, topic, [(b"k", b"v%d" % i) for i in range(20)])
    consumer = Consumer(broker.bootstrap, group_id=group, **GROUP_OPTS)

    class PauseAndYield:
        assigned: list = []

        def on_partitions_assigned(self, partitions):
            self.assigned.append(set(partitions))
            consumer.pause(*partitions)
            consumer.yield_poll()

        def on_partitions_revoked(self, partitions):
            pass

    listener = PauseAndYield()
    consumer.subscribe([topic], listener=listener)
    try:
        deadline = time.monotonic() + 60
        while not listener.assigned and time.monotonic() < deadline:
            t0 = time.monotonic()
            got = consumer.poll(30_000)
            took = time.monotonic() - t0
        assert listener.assigned == [{TopicPartition(topic, 0), TopicPartition(topic, 1)}]
        assert got == {} and took < 20, took   # not the 30 s timeout
        t0 = time.monotonic()
        assert consumer.poll(400) == {}          # paused: nothing, and the whole timeout
        assert time.monotonic() - t0 >= 0.35
        consumer.resume(*listener.assigned[0])
        seen = 0
        while seen < 20 and time.monotonic() < deadline:
            seen += sum(len(r) for r in consumer.poll(1000).values())
        assert seen == 20
    finally:
        consumer.close()
