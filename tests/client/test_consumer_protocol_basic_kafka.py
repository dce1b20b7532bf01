"""The consumer group protocol (KIP-848) of kdaemon's own client on Apache Kafka, kdaemon members
only: a member joins and gets everything; a second one joins and partitions move incrementally
(the first never loses a partition that does not move); a member leaves with epoch -1; a static
member leaves with -2 and gets its assignment back; a regular expression is matched by the
broker.  Mixed groups with the Java consumer and librdkafka are in
test_groups_consumer_protocol_kafka.py; the pure logic in tests/client/test_consumer_protocol_units.py.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kdaemon.client import Consumer
from kdaemon.client.types import TopicPartition
from testkit.group_members import set_group_session
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

WAIT = 90.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Member(threading.Thread):
    """A kdaemon consumer polling in a thread, recording its listener calls, its records and
    the ConsumerGroupHeartbeat requests it wrote."""

    def __init__(self, bootstrap: str, group: str, name: str, *, topics=None, pattern=None,
                 wakeup_at_close: bool = False, **options) -> None:
        """``wakeup_at_close``: call ``wakeup()`` right before ``close()`` (a stop request left pending)."""
        super().__init__(name=name, daemon=True)
        self.wakeup_at_close = wakeup_at_close
        self.consumer = Consumer(bootstrap, group_id=group, group_protocol="consumer", client_id=name,
                                 auto_offset_reset="earliest", auto_commit_interval_ms=500, **options)
        self.topics, self.pattern = topics, pattern
        self.events: list[tuple[str, frozenset]] = []
        self.records: list[tuple[str, int, int]] = []
        self.heartbeats: list[dict] = []
        self.commits_accepted: list[TopicPartition] = []   # from OffsetCommit answers without error
        self.commits_at_event: list[int] = []   # len(commits_accepted) when each listener call came
        self.owned: frozenset = frozenset()
        self.state = None
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self.consumer._network.observers.append(self._observe)   # the public seam for tests

    def _observe(self, node, api, version, body, response) -> None:
        if api.name == "ConsumerGroupHeartbeat" and not response:
            with self._lock:
                self.heartbeats.append(dict(body))
        elif api.name == "OffsetCommit" and response:
            with self._lock:
                self.commits_accepted.extend(TopicPartition(t["name"], p["partition_index"])
                                             for t in body["topics"] for p in t["partitions"] if not p["error_code"])

    def _record(self, kind: str):
        def call(partitions) -> None:
            with self._lock:
                self.events.append((kind, frozenset(partitions)))
                self.commits_at_event.append(len(self.commits_accepted))
        return call

    def run(self) -> None:
        c = self.consumer
        try:
            listener = type("L", (), {"on_partitions_revoked": staticmethod(self._record("revoked")),
                                      "on_partitions_assigned": staticmethod(self._record("assigned")),
                                      "on_partitions_lost": staticmethod(self._record("lost"))})()
            c.subscribe(topics=self.topics, pattern=self.pattern, listener=listener)
            while not self._stop_event.is_set():
                batch = c.poll(100)
                with self._lock:
                    for tp, records in batch.items():
                        self.records.extend((tp.topic, tp.partition, r.offset) for r in records)
                    self.owned = frozenset(c.assignment())
                    self.state = c.group_state()
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            try:
                if self.wakeup_at_close:
                    c.wakeup()
                c.close()
            except Exception as exc:   # noqa: BLE001
                self.error = self.error or exc

    def stop(self) -> None:
        self._stop_event.set()
        self.join(30)
        assert not self.is_alive(), f"{self.name} did not stop"

    def mark(self) -> int:
        with self._lock:
            return len(self.events)

    def events_since(self, mark: int) -> list[tuple[str, frozenset]]:
        with self._lock:
            return list(self.events[mark:])


def wait_until(predicate, what: str, members) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        for m in members:
            if m.error is not None:
                raise AssertionError(f"{m.name} failed while waiting for {what}") from m.error
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: " + "; ".join(
                f"{m.name} owns {sorted(m.owned)}, state {m.state}, events {m.events[-4:]}" for m in members))
        time.sleep(0.1)


def partitions(topic: str, n: int) -> frozenset:
    return frozenset(TopicPartition(topic, p) for p in range(n))


def split(members, expected) -> bool:
    owned = [m.owned for m in members]
    return all(owned) and sum(len(o) for o in owned) == len(expected) and frozenset().union(*owned) == expected \
        and all(m.state is not None and m.state.stable for m in members)


def produce_numbered(bootstrap: str, topic: str, n_partitions: int, per_partition: int, start: int = 0) -> set:
    expected = set()
    for p in range(n_partitions):
        for d in produce(bootstrap, topic, [(None, f"{p}-{i}".encode()) for i in range(start, start + per_partition)],
                         partition=p):
            expected.add((topic, p, d.offset))
    return expected


def test_members_join_move_partitions_incrementally_and_leave_with_epoch_minus_one(kafka):
    bootstrap = kafka.bootstrap
    topic, group = _name("kip848"), _name("g")
    create_topic(bootstrap, topic, 6)
    everything = partitions(topic, 6)
    expected = produce_numbered(bootstrap, topic, 6, 10)
    first = Member(bootstrap, group, "first", topics=[topic])
    first.start()
    second = None
    try:
        wait_until(lambda: first.owned == everything and first.state.stable, "the first member to own everything",
                   [first])
        join = first.heartbeats[0]
        assert (join["member_epoch"], join["subscribed_topic_names"], join["topic_partitions"]) == (0, [topic], [])
        assert join["member_id"] == first.state.member_id and len(join["member_id"]) == 22
        assert join["rebalance_timeout_ms"] == first.consumer.config.max_poll_interval_ms
        assert first.state.protocol == "consumer" and first.state.generation > 0 and first.state.leader_id is None
        # Heartbeats after the acknowledgement repeat nothing that did not change.
        wait_until(lambda: any(h["member_epoch"] > 0 and h["topic_partitions"] is None
                               and h["subscribed_topic_names"] is None and h["rebalance_timeout_ms"] == -1
                               for h in first.heartbeats), "a heartbeat carrying no unchanged field", [first])

        mark = first.mark()
        second = Member(bootstrap, group, "second", topics=[topic])
        second.start()
        wait_until(lambda: split([first, second], everything), "a complete, disjoint split", [first, second])
        moved = second.owned
        kept = first.owned
        events = first.events_since(mark)
        assert not [e for e in events if e[0] == "lost"], events
        revoked = frozenset().union(*[ps for kind, ps in events if kind == "revoked"])
        # Incremental: the first member gave up exactly what moved, nothing it kept.
        assert revoked == moved and not revoked & kept, events
        assert [kind for kind, _ in second.events] and all(kind == "assigned" for kind, _ in second.events)

        expected |= produce_numbered(bootstrap, topic, 6, 10, start=10)
        seen = lambda: first.records + second.records  # noqa: E731
        wait_until(lambda: set(seen()) >= expected, "every record read", [first, second])
        # The commit before the revocation lets the new owner go on where the old one stopped.
        assert len(seen()) == len(set(seen())), "a record was delivered twice"

        mark = first.mark()
        second.stop()
        leave = second.heartbeats[-1]
        assert (leave["member_epoch"], leave["member_id"]) == (-1, second.state.member_id)
        wait_until(lambda: first.owned == everything and first.state.stable, "the first member to get all back",
                   [first])
        events = first.events_since(mark)
        assert {kind for kind, _ in events} == {"assigned"}, events
        assert frozenset().union(*[ps for _, ps in events]) == moved, events
    finally:
        for m in (first, second):
            if m is not None and m.is_alive():
                m.stop()
    assert first.error is None and (second is None or second.error is None)


def test_a_static_member_leaves_with_epoch_minus_two_and_gets_its_assignment_back(kafka):
    bootstrap = kafka.bootstrap
    topic, group = _name("kip848-static"), _name("g")
    create_topic(bootstrap, topic, 4)
    everything = partitions(topic, 4)
    instance = _name("static")
    static = Member(bootstrap, group, "static", topics=[topic], group_instance_id=instance)
    other = Member(bootstrap, group, "other", topics=[topic])
    static.start()
    other.start()
    back = None
    try:
        wait_until(lambda: split([static, other], everything), "a complete split", [static, other])
        owned = static.owned
        mark = other.mark()
        static.stop()
        leave = static.heartbeats[-1]
        assert (leave["member_epoch"], leave["instance_id"]) == (-2, instance)
        back = Member(bootstrap, group, "static-again", topics=[topic], group_instance_id=instance)
        back.start()
        wait_until(lambda: back.owned == owned and back.state.stable, "the static member's partitions back",
                   [back, other])
        # The broker kept the assignment for the static member: the other one saw nothing move.
        assert other.events_since(mark) == [] and other.owned == everything - owned
        assert back.heartbeats[0]["instance_id"] == instance and back.heartbeats[0]["member_epoch"] == 0
    finally:
        for m in (static, other, back):
            if m is not None and m.is_alive():
                m.stop()
    assert static.error is None and other.error is None and (back is None or back.error is None)


def test_a_wakeup_pending_when_a_static_member_closes_does_not_cut_its_leave_short(kafka):
    """A stop is what calls ``wakeup()``; one still pending when ``close()`` runs (a second signal,
    a stop that came outside a poll: a worker whose supervisor died got both the signal and its
    own check) raised out of the wait for the -2 leave, which never went out, and the member's
    successor was refused its instance id (UNRELEASED_INSTANCE_ID) until the session expired.
    Wakeups are off in ``close()``, as Java's coordinator disables them there."""
    bootstrap = kafka.bootstrap
    topic, group = _name("kip848-wakeup"), _name("g")
    create_topic(bootstrap, topic, 2)
    everything = partitions(topic, 2)
    instance = _name("static")
    first = Member(bootstrap, group, "first", topics=[topic], group_instance_id=instance, wakeup_at_close=True)
    first.start()
    back = None
    try:
        wait_until(lambda: first.owned == everything and first.state.stable, "the first member's assignment", [first])
        first.stop()
        assert first.error is None, first.error
        leave = first.heartbeats[-1]
        assert (leave["member_epoch"], leave["instance_id"]) == (-2, instance)
        back = Member(bootstrap, group, "back", topics=[topic], group_instance_id=instance)
        back.start()
        wait_until(lambda: back.owned == everything and back.state.stable, "the successor's assignment", [back])
    finally:
        for m in (first, back):
            if m is not None and m.is_alive():
                m.stop()
    assert back.error is None, back.error


def test_a_regular_expression_is_matched_by_the_broker_against_whole_topic_names(kafka):
    bootstrap = kafka.bootstrap
    prefix = _name("rx")
    for suffix, n in (("a", 2), ("b", 1)):
        create_topic(bootstrap, f"{prefix}-{suffix}", n)
    create_topic(bootstrap, f"x{prefix}-a", 1)     # contains a match, but is not one as a whole name
    pattern = f"{prefix}-.*"
    m = Member(bootstrap, _name("g"), "regex", pattern=pattern)
    m.start()
    try:
        matched = partitions(f"{prefix}-a", 2) | partitions(f"{prefix}-b", 1)
        wait_until(lambda: m.owned == matched and m.state.stable, "the topics the pattern matches", [m])
        join = m.heartbeats[0]
        assert (join["subscribed_topic_regex"], join["subscribed_topic_names"]) == (pattern, None)
        assert m.consumer.subscription() == {f"{prefix}-a", f"{prefix}-b"}
        create_topic(bootstrap, f"{prefix}-c", 1)   # created later: the broker picks it up
        wait_until(lambda: m.owned == matched | partitions(f"{prefix}-c", 1), "the new topic assigned", [m])
    finally:
        m.stop()
    assert m.error is None


def test_a_member_that_stops_past_the_session_is_fenced_loses_its_partitions_and_rejoins(kafka):
    bootstrap = kafka.bootstrap
    topic, group = _name("kip848-fence"), _name("g")
    create_topic(bootstrap, topic, 4)
    everything = partitions(topic, 4)
    set_group_session(bootstrap, group, 3000)
    stopped = Member(bootstrap, group, "stopped", topics=[topic])
    other = Member(bootstrap, group, "other", topics=[topic])
    stopped.start()
    other.start()
    try:
        wait_until(lambda: split([stopped, other], everything), "a complete split", [stopped, other])
        owned, member_id = stopped.owned, stopped.state.member_id
        mark = stopped.mark()
        # Holding its network lock stops the member whole, as SIGSTOP would: no poll, no heartbeat.
        with stopped.consumer._network.lock:
            wait_until(lambda: other.owned == everything, "the other member to take the stopped one's partitions",
                       [other])
            commits_before = len(stopped.commits_accepted)
        wait_until(lambda: any(kind == "lost" for kind, _ in stopped.events_since(mark)),
                   "the resumed member to learn it was fenced", [stopped, other])
        events = stopped.events_since(mark)
        assert events[0] == ("lost", owned) and not [e for e in events if e[0] == "revoked"], events
        # Fenced: nothing of what it owned was committed between resuming and being told (lost,
        # not revoked: the partitions are another member's by then).
        assert not set(stopped.commits_accepted[commits_before:stopped.commits_at_event[mark]]) & owned
        rejoin = [h for h in stopped.heartbeats if h["member_epoch"] == 0][-1]
        assert rejoin["member_id"] == member_id          # the same member id after a fence
        wait_until(lambda: split([stopped, other], everything), "the fenced member back in the split",
                   [stopped, other])
    finally:
        for m in (stopped, other):
            if m.is_alive():
                m.stop()
    assert stopped.error is None and other.error is None
