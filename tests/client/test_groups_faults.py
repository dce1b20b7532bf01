"""Consumer groups under faults: the coordinator moving or going away, injected group
errors, a member that stops polling, cooperative rebalances, pattern subscriptions, leaving.

librdkafka's mock cluster (brokers 1, 2, 3) moves coordinators and injects errors; what needs a
real group coordinator (cooperative hand-over, poll timeout, leave-on-close timing) runs on
Tansu; what neither can show on demand runs against ``FakeCoordinator``, a one-broker cluster
on 127.0.0.1 written with kdaemon.protocol's own specs.

What the mock cluster (librdkafka 2.16) does not do for groups, and how that shapes the tests:
* it offers JoinGroup v6 and SyncGroup v4 but reads their arrays with the non-flexible int32
  count (a flexible JoinGroup makes it drop the connection), and reads LeaveGroup in the v0-2
  layout whatever the version: ``_group_mock`` caps the group APIs to non-flexible versions
  its handlers parse (JoinGroup v5, SyncGroup v3, Heartbeat v3, LeaveGroup v2), as librdkafka's
  own consumer uses;
* its JoinGroup error answers carry null protocol name, leader and member id, which the schema
  does not allow before v7 (a real broker sends empty strings), so the client rightly rejects
  them as malformed: JoinGroup COORDINATOR_NOT_AVAILABLE and FENCED_INSTANCE_ID come from the
  fake coordinator instead;
* OffsetCommit does not check that it reached the coordinator (Heartbeat, JoinGroup, SyncGroup
  and LeaveGroup do), so after a coordinator move it is the heartbeat that gets
  NOT_COORDINATOR; NOT_COORDINATOR on a commit is injected;
* no static membership of its own: FENCED_INSTANCE_ID is only ever injected;
* a member that rejoins under a new member id leaves its old id in the group until that id's
  session times out, and any rejoin waits session_timeout_ms - 1 s: sessions are 2 s here.

Tansu (6 s sessions, as in test_groups_tansu.py) takes about half the session timeout to
complete a rebalance, so "well before the session timeout" is measured against the session
timeout itself (a member that does not leave is taken over after about 9-10 s).

Every scenario runs in a worker thread with a hard limit, so a hang fails with the stuck stack
instead of blocking the run; every wait has a deadline.
"""
from __future__ import annotations

import socket
import struct
import sys
import threading
import time
import traceback
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import TopicPartition as RdTopicPartition

from kdaemon.client import Consumer, TopicPartition
from kdaemon.client.errors import CommitFailedError, FencedInstanceIdError, RebalanceInProgressError
from kdaemon.protocol.apis import (API_VERSIONS, FETCH, FIND_COORDINATOR, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP,
                                   LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, SYNC_GROUP, api_by_key)
from kdaemon.protocol.errors import Errors
from kdaemon.protocol.messages import decode_request, encode_response
from testkit import produce
from testkit.produce import create_topic

SCENARIO_LIMIT_S = 45

# Short sessions: the mock waits session_timeout_ms - 1 s before it answers a rejoin.  Also
# used with the fake coordinator.
MOCK_OPTS = dict(session_timeout_ms=2000, heartbeat_interval_ms=200, auto_offset_reset="earliest",
                 fetch_max_wait_ms=50, retry_backoff_ms=50, reconnect_backoff_ms=20,
                 reconnect_backoff_max_ms=200, request_timeout_ms=3000, metadata_max_age_ms=1000,
                 default_api_timeout_ms=10_000)
TANSU_OPTS = dict(session_timeout_ms=6000, heartbeat_interval_ms=500, auto_offset_reset="earliest",
                  fetch_max_wait_ms=100, retry_backoff_ms=50, request_timeout_ms=10_000)


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- machinery ---------------------------------------------------------------------------------

def within(limit_s: float, scenario, *args):
    """Run ``scenario`` in a worker thread; one still running after ``limit_s`` is a hang."""
    result: dict = {}

    def run() -> None:
        try:
            result["value"] = scenario(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            result["error"] = exc

    worker = threading.Thread(target=run, daemon=True, name="group-scenario")
    worker.start()
    worker.join(limit_s)
    if worker.is_alive():
        frame = sys._current_frames().get(worker.ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
        pytest.fail(f"scenario still running after {limit_s} s (hang); it is at:\n{stack}")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def wait_for(predicate, timeout: float, what: str, step=None) -> None:
    """Until ``predicate()``; ``step()`` (e.g. a poll) runs between checks."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        if step is not None:
            step()
        else:
            time.sleep(0.05)


def _group_mock(cluster) -> None:
    """Make the mock usable by a client that picks the newest version offered (see the top)."""
    cluster.serve_groups(initial_rebalance_delay_ms=100)


class Writer:
    """Numbered records ("p/i") through an idempotent producer, remembered by delivery."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, idempotent: bool = True) -> None:
        self.out = produce.Writer(bootstrap, topic, on_delivered=self._delivered,
                                  **{"enable.idempotence": idempotent, "linger.ms": 5,
                                     "message.timeout.ms": 30_000})
        self.topic, self.partitions = topic, partitions
        self.sent = 0
        self.delivered: dict[tuple[int, int], bytes] = {}
        self.errors = self.out.errors

    def write(self, n: int) -> None:
        for _ in range(n):
            p = self.sent % self.partitions
            self.out.send(f"{p}/{self.sent}".encode(), partition=p)
            self.sent += 1
        self.out.poll(0)

    def _delivered(self, msg) -> None:
        self.delivered[(msg.partition(), msg.offset())] = msg.value()

    def flush(self) -> None:
        assert self.out.flush(20) == 0 and not self.errors, self.errors[:3]

    def ends(self) -> dict[int, int]:
        return dict(self.out.ends)


class Seen:
    """Every record a consumer returned, with repeats counted."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], bytes] = {}
        self.repeats: list[tuple[int, int]] = []
        self.arrived: dict[tuple[int, int], float] = {}  # first arrival

    def add(self, polled) -> int:
        n = 0
        for tp, records in polled.items():
            for r in records:
                key = (tp.partition, r.offset)
                if key in self.records:
                    self.repeats.append(key)
                else:
                    self.arrived[key] = time.monotonic()
                self.records[key] = r.value
                n += 1
        return n


class Events:
    """A rebalance listener that records (callback, partitions, time, generation) in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, frozenset, float, int]] = []
        self.consumer: Consumer | None = None

    def _add(self, name: str, partitions) -> None:
        g = self.consumer.group_generation() if self.consumer is not None else None
        self.log.append((name, frozenset(partitions), time.monotonic(), -1 if g is None else g[0]))

    def on_partitions_revoked(self, partitions) -> None:
        self._add("revoked", partitions)

    def on_partitions_assigned(self, partitions) -> None:
        self._add("assigned", partitions)

    def on_partitions_lost(self, partitions) -> None:
        self._add("lost", partitions)

    def names(self) -> list[str]:
        return [e[0] for e in self.log]


class RequestSpy:
    """Records the API name of every request the consumer's network client sends."""

    def __init__(self, consumer: Consumer) -> None:
        self.sent: list[str] = []
        self.requests: list[tuple[str, float, object]] = []  # (API name, when, future)
        network = consumer._network
        original = network.send

        def send(node_id, api, body, **kw):
            fut = original(node_id, api, body, **kw)
            self.sent.append(api.name)
            self.requests.append((api.name, time.monotonic(), fut))
            return fut

        network.send = send

    def count(self, api) -> int:
        return self.sent.count(api.name)

    def first(self, api, after: float = 0.0) -> tuple[float, object] | None:
        """(when, future) of the first ``api`` request sent after ``after``."""
        return next(((t, f) for name, t, f in self.requests if name == api.name and t >= after), None)


def committed_by_librdkafka(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    rd = RdConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = rd.committed([RdTopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in found}
    finally:
        rd.close()


class FakeCoordinator:
    """A one-broker cluster on 127.0.0.1 that is its own group coordinator, for the group
    errors the mock cluster cannot deliver (see the top).  Topic partitions exist but stay
    empty.  ``push_errors(api, [codes])`` answers the next requests of ``api`` with those codes,
    in order, like the mock's push_request_errors; ``requests[api_key]`` counts what came in.
    """

    OFFERED = {API_VERSIONS: (0, 4), METADATA: (1, 9), FIND_COORDINATOR: (0, 3), FETCH: (4, 11),
               LIST_OFFSETS: (1, 7), OFFSET_FETCH: (0, 7), OFFSET_COMMIT: (0, 8), JOIN_GROUP: (0, 7),
               SYNC_GROUP: (0, 5), HEARTBEAT: (0, 4), LEAVE_GROUP: (0, 4)}
    NODE_ID = 1

    def __init__(self, topic: str, partitions: int) -> None:
        self.topic, self.partitions = topic, partitions
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._errors: dict[int, list[int]] = defaultdict(list)
        self.requests: dict[int, int] = defaultdict(int)
        self.generation = 0
        self.join_delay = 0.0  # seconds each JoinGroup answer is held back
        self._members = 0
        self._conns: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept_loop, daemon=True, name="fake-coordinator").start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def push_errors(self, api, codes) -> None:
        with self._lock:
            self._errors[api.key].extend(codes)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for s in list(self._conns):
            try:
                s.close()
            except OSError:
                pass

    def __enter__(self) -> "FakeCoordinator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self._conns.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True, name="fake-coordinator-conn").start()

    def _serve(self, sock: socket.socket) -> None:
        with sock:
            while not self._closed:
                size = _recv_exact(sock, 4)
                frame = _recv_exact(sock, struct.unpack(">i", size)[0]) if size else None
                if frame is None:
                    return
                header, body = decode_request(api_by_key, frame)
                api = api_by_key(header.api_key)
                with self._lock:
                    self.requests[api.key] += 1
                    error = self._errors[api.key].pop(0) if self._errors[api.key] else 0
                answer = self._answer(api, header.api_version, body, error)
                try:
                    sock.sendall(encode_response(api, header.api_version, header.correlation_id, answer))
                except OSError:
                    return

    def _answer(self, api, version: int, body: dict, error: int) -> dict:
        parts = range(self.partitions)
        if api is API_VERSIONS:
            return {"api_keys": [{"api_key": a.key, "min_version": lo, "max_version": hi}
                                 for a, (lo, hi) in self.OFFERED.items()]}
        if api is METADATA:
            return {"brokers": [{"node_id": self.NODE_ID, "host": "127.0.0.1", "port": self.port}],
                    "controller_id": self.NODE_ID, "topics": [{"name": self.topic, "partitions": [
                        {"partition_index": p, "leader_id": self.NODE_ID, "leader_epoch": 0,
                         "replica_nodes": [self.NODE_ID], "isr_nodes": [self.NODE_ID]} for p in parts]}]}
        if api is FIND_COORDINATOR:
            return {"error_code": error, "node_id": self.NODE_ID, "host": "127.0.0.1", "port": self.port}
        if api is FETCH:
            time.sleep(min(body["max_wait_ms"], 100) / 1000)  # an empty log: long-poll a little
            return {"responses": [{"topic": t["topic"], "partitions": [
                {"partition_index": p["partition"], "high_watermark": 0, "last_stable_offset": 0,
                 "log_start_offset": 0} for p in t["partitions"]]} for t in body["topics"]]}
        if api is LIST_OFFSETS:
            return {"topics": [{"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "timestamp": -1, "offset": 0}
                for p in t["partitions"]]} for t in body["topics"]]}
        if api is OFFSET_FETCH:
            return {"topics": [{"name": t["name"], "partitions": [
                {"partition_index": p, "committed_offset": -1} for p in t["partition_indexes"]]}
                for t in body["topics"]]}
        if api is OFFSET_COMMIT:
            return {"topics": [{"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": error} for p in t["partitions"]]}
                for t in body["topics"]]}
        if api is JOIN_GROUP:
            time.sleep(self.join_delay)
            if error:
                return {"error_code": error}
            with self._lock:
                self.generation += 1
                if not body["member_id"]:
                    self._members += 1
                member_id = body["member_id"] or f"member-{self._members}"
            protocol = body["protocols"][0]
            return {"generation_id": self.generation, "protocol_type": "consumer",
                    "protocol_name": protocol["name"], "leader": member_id, "member_id": member_id,
                    "members": [{"member_id": member_id, "group_instance_id": body["group_instance_id"],
                                 "metadata": protocol["metadata"]}]}
        if api is SYNC_GROUP:
            mine = [a["assignment"] for a in body["assignments"] if a["member_id"] == body["member_id"]]
            return {"error_code": error, "protocol_type": "consumer", "protocol_name": body["protocol_name"],
                    "assignment": mine[0] if mine and not error else b""}
        if api is HEARTBEAT:
            return {"error_code": error}
        if api is LEAVE_GROUP:
            return {"error_code": error, "members": [dict(m, error_code=0) for m in body.get("members") or ()]}
        raise AssertionError(f"the fake coordinator does not serve {api.name}")


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except OSError:
            return None
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


# -- 1. the coordinator moves -------------------------------------------------------------------

def test_member_follows_a_moving_coordinator_and_keeps_committing(mock_cluster):
    """Coordinator moved (the heartbeat gets NOT_COORDINATOR), then moved again with the old
    one going down (requests fail on the dropped connection): the member finds the new one each
    time, without a poll that commits, and every record is consumed and committed."""
    _group_mock(mock_cluster)
    topic, group, n_parts = "moves", _name("g"), 3
    mock_cluster.topic_create(topic, n_parts, 1)
    for p in range(n_parts):
        mock_cluster.partition_set_leader(topic, p, 1)  # broker 1 never goes down here
    mock_cluster.coordinator_set("group", group, 2)
    writer = Writer(mock_cluster.bootstrap, topic, n_parts)
    seen = Seen()

    def scenario():
        c = Consumer(mock_cluster.bootstrap, group_id=group, enable_auto_commit=False, **MOCK_OPTS)
        coordinator = c._group.coordinator   # the CoordinatorLookup: which broker it is
        commits = []

        def poll_and_commit() -> None:
            if seen.add(c.poll(100)):
                c.commit(timeout_ms=8000)
                commits.append((coordinator.broker, time.monotonic()))

        try:
            c.subscribe([topic])
            writer.write(60)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 60, 15, "the first 60 records", poll_and_commit)
            assert coordinator.broker == 2
            generation = c.group_generation()

            # Move 1: broker 2 answers NOT_COORDINATOR to the next heartbeat.  No records
            # arrive, so no commit() looks the coordinator up: poll itself must.
            mock_cluster.coordinator_set("group", group, 3)
            wait_for(lambda: coordinator.broker == 3, 5, "the move to broker 3", poll_and_commit)
            writer.write(60)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 120, 15, "records after the first move", poll_and_commit)
            assert commits[-1][0] == 3

            # Move 2: back to broker 2, and broker 3 goes down under the member.
            mock_cluster.coordinator_set("group", group, 2)
            mock_cluster.broker_set_down(3)
            wait_for(lambda: coordinator.broker == 2, 8, "the move back to broker 2",
                     poll_and_commit)
            writer.write(60)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 180, 15, "records after the second move", poll_and_commit)
            assert commits[-1][0] == 2
            # The group kept the member throughout: heartbeats went on against each new
            # coordinator, so there was no rebalance and no record was delivered twice.
            time.sleep(0.5)
            c.poll(0)
            assert c.group_generation() == generation
            assert seen.repeats == []
            assert seen.records == writer.delivered
            ends = writer.ends()
            tps = [TopicPartition(topic, p) for p in range(n_parts)]
            assert {tp.partition: om.offset for tp, om in c.committed(tps).items()} == ends
        finally:
            c.close()
        assert committed_by_librdkafka(mock_cluster.bootstrap, group, topic, n_parts) == writer.ends()

    within(SCENARIO_LIMIT_S, scenario)


def test_coordinator_down_longer_than_the_session_then_back(mock_cluster):
    """The coordinator is unreachable for longer than session_timeout_ms, so the group drops
    the member.  When it is back the member must heartbeat again, learn that it was dropped
    (partitions lost), rejoin and go on committing; it must not keep treating the expired
    session as a reason to give the coordinator up without ever asking it."""
    _group_mock(mock_cluster)
    topic, group, n_parts = "outage", _name("g"), 2
    mock_cluster.topic_create(topic, n_parts, 1)
    for p in range(n_parts):
        mock_cluster.partition_set_leader(topic, p, 1)
    mock_cluster.coordinator_set("group", group, 2)
    writer = Writer(mock_cluster.bootstrap, topic, n_parts)
    seen, events = Seen(), Events()

    def scenario():
        c = Consumer(mock_cluster.bootstrap, group_id=group, enable_auto_commit=False, **MOCK_OPTS)
        failed_commits = []

        def poll_and_commit() -> None:
            if seen.add(c.poll(100)):
                try:
                    c.commit(timeout_ms=8000)
                except CommitFailedError as exc:
                    failed_commits.append(exc)

        try:
            c.subscribe([topic], listener=events)
            writer.write(40)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 40, 15, "the first 40 records", poll_and_commit)
            generation = c.group_generation()[0]
            mock_cluster.broker_set_down(2)
            deadline = time.monotonic() + MOCK_OPTS["session_timeout_ms"] / 1000 + 1.5
            while time.monotonic() < deadline:
                poll_and_commit()
            mock_cluster.broker_set_up(2)
            wait_for(lambda: (c.group_generation() or (generation,))[0] > generation, 15,
                     "a rejoin after the outage", poll_and_commit)
            assert "lost" in events.names()
            writer.write(40)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 80, 15, "records after the outage", poll_and_commit)
            assert seen.records == writer.delivered
            assert seen.repeats == []  # everything was committed before the outage
            tps = [TopicPartition(topic, p) for p in range(n_parts)]
            assert {tp.partition: om.offset for tp, om in c.committed(tps).items()} == writer.ends()
        finally:
            c.close()

    within(SCENARIO_LIMIT_S, scenario)


# -- 2. injected group errors -------------------------------------------------------------------

OFFSET_COMMIT_KEY, HEARTBEAT_KEY = OFFSET_COMMIT.key, HEARTBEAT.key


class MockMember:
    """One kdaemon member on the mock cluster, polled by the test itself."""

    def __init__(self, cluster, topic: str, n_parts: int, **opts) -> None:
        self.cluster, self.topic, self.n_parts = cluster, topic, n_parts
        self.group = _name("g")
        self.writer = Writer(cluster.bootstrap, topic, n_parts)
        self.consumer = Consumer(cluster.bootstrap, group_id=self.group, **{**MOCK_OPTS, **opts})
        self.spy = RequestSpy(self.consumer)
        self.events = Events()
        self.seen = Seen()

    @classmethod
    def started(cls, cluster, n_parts: int = 2, records: int = 40, **opts) -> "MockMember":
        _group_mock(cluster)
        topic = _name("t")
        cluster.topic_create(topic, n_parts, 1)
        m = cls(cluster, topic, n_parts, **opts)
        m.consumer.subscribe([topic], listener=m.events)
        m.write(records)
        m.consume_all("the first records")
        return m

    @property
    def tps(self) -> list[TopicPartition]:
        return [TopicPartition(self.topic, p) for p in range(self.n_parts)]

    def write(self, n: int) -> None:
        self.writer.write(n)
        self.writer.flush()

    def poll(self) -> None:
        self.seen.add(self.consumer.poll(100))

    def consume_all(self, what: str, timeout: float = 15) -> None:
        wait_for(lambda: set(self.seen.records) >= set(self.writer.delivered), timeout, what, self.poll)

    def generation(self) -> int:
        g = self.consumer.group_generation()
        return -1 if g is None else g[0]

    def committed(self) -> dict[int, int]:
        return {tp.partition: om.offset for tp, om in self.consumer.committed(self.tps).items() if om}


def test_commit_retries_coordinator_loading_not_coordinator_and_timeouts(mock_cluster):
    def scenario():
        m = MockMember.started(mock_cluster, enable_auto_commit=False)
        try:
            lookups = m.spy.count(FIND_COORDINATOR)
            commits = m.spy.count(OFFSET_COMMIT)
            mock_cluster.push_request_errors(OFFSET_COMMIT_KEY, [Errors.COORDINATOR_LOAD_IN_PROGRESS,
                                                                 Errors.NOT_COORDINATOR,
                                                                 Errors.REQUEST_TIMED_OUT])
            m.consumer.commit()
            assert m.spy.count(OFFSET_COMMIT) - commits == 4, m.spy.sent
            assert m.spy.count(FIND_COORDINATOR) > lookups  # NOT_COORDINATOR: looked it up again
            assert m.committed() == m.writer.ends()
        finally:
            m.consumer.close()
        assert committed_by_librdkafka(mock_cluster.bootstrap, m.group, m.topic, m.n_parts) == m.writer.ends()

    within(SCENARIO_LIMIT_S, scenario)


def test_commit_during_a_rebalance_raises_rebalance_in_progress_and_rejoins(mock_cluster):
    def scenario():
        m = MockMember.started(mock_cluster, enable_auto_commit=False)
        try:
            generation = m.generation()
            mock_cluster.push_request_errors(OFFSET_COMMIT_KEY, [Errors.REBALANCE_IN_PROGRESS])
            with pytest.raises(RebalanceInProgressError):
                m.consumer.commit()
            joins = m.spy.count(JOIN_GROUP)
            wait_for(lambda: m.generation() > generation, 10, "the rejoin", m.poll)
            assert m.spy.count(JOIN_GROUP) > joins
            m.write(20)
            m.consume_all("records after the rejoin")
            m.consumer.commit()
            assert m.committed() == m.writer.ends()
        finally:
            m.consumer.close()

    within(SCENARIO_LIMIT_S, scenario)


@pytest.mark.parametrize("code", [Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION])
def test_commit_by_a_stale_member_fails_and_the_next_poll_rejoins(mock_cluster, code):
    def scenario():
        m = MockMember.started(mock_cluster, enable_auto_commit=False)
        try:
            m.consumer.commit()
            m.write(20)
            m.consume_all("records not committed yet")
            mock_cluster.push_request_errors(OFFSET_COMMIT_KEY, [code])
            with pytest.raises(CommitFailedError):
                m.consumer.commit()
            assert m.consumer.group_generation() is None  # no longer a member
            joins = m.spy.count(JOIN_GROUP)
            m.poll()
            assert m.spy.count(JOIN_GROUP) == joins + 1, "the first poll after the failure did not rejoin"
            assert m.events.names()[-1] == "lost"
            wait_for(lambda: m.consumer.assignment() == set(m.tps), 15, "the assignment after the rejoin", m.poll)
            assert m.events.names()[-2:] == ["lost", "assigned"]
            m.write(20)
            m.consume_all("records after the rejoin")
            # The 20 uncommitted records came again (at-least-once), nothing was skipped.
            assert len(m.seen.repeats) == 20
            assert m.seen.records == m.writer.delivered
            m.consumer.commit()
            assert m.committed() == m.writer.ends()
        finally:
            m.consumer.close()

    within(SCENARIO_LIMIT_S, scenario)


def test_heartbeat_rebalance_in_progress_rejoins_without_losing_records(mock_cluster):
    def scenario():
        m = MockMember.started(mock_cluster, auto_commit_interval_ms=200)
        try:
            generation = m.generation()
            m.write(20)
            before = len(m.events.names())
            mock_cluster.push_request_errors(HEARTBEAT_KEY, [Errors.REBALANCE_IN_PROGRESS])
            wait_for(lambda: m.generation() > generation, 10, "the rejoin", m.poll)
            # eager: all given back, all back (the first two events since the fault: on a loaded
            # machine a later rebalance may have begun by the time the poll returned)
            assert m.events.names()[before:before + 2] == ["revoked", "assigned"], m.events.names()
            assert "lost" not in m.events.names()
            m.write(20)
            m.consume_all("records after the rejoin")
            assert m.seen.records == m.writer.delivered
            assert m.seen.repeats == []  # auto-commit committed before the partitions were revoked
        finally:
            m.consumer.close()

    within(SCENARIO_LIMIT_S, scenario)


def test_heartbeat_unknown_member_loses_the_partitions_then_rejoins(mock_cluster):
    def scenario():
        m = MockMember.started(mock_cluster, enable_auto_commit=False)
        try:
            m.consumer.commit()
            generation = m.generation()
            mock_cluster.push_request_errors(HEARTBEAT_KEY, [Errors.UNKNOWN_MEMBER_ID])
            wait_for(lambda: "lost" in m.events.names(), 5, "on_partitions_lost", m.poll)
            lost_at = len(m.events.log)
            assert m.events.log[lost_at - 1][1] == frozenset(m.tps)
            wait_for(lambda: m.generation() > generation and m.consumer.assignment() == set(m.tps), 15,
                     "the rejoin", m.poll)
            assert m.events.names()[lost_at - 1:] == ["lost", "assigned"]  # lost, never revoked
            m.write(20)
            m.consume_all("records after the rejoin")
            assert m.seen.records == m.writer.delivered
        finally:
            m.consumer.close()

    within(SCENARIO_LIMIT_S, scenario)


def test_static_member_fenced_by_heartbeat_stops_for_good(mock_cluster):
    def scenario():
        m = MockMember.started(mock_cluster, enable_auto_commit=False, group_instance_id="host-a")
        try:
            joins = m.spy.count(JOIN_GROUP)
            mock_cluster.push_request_errors(HEARTBEAT_KEY, [Errors.FENCED_INSTANCE_ID])
            _assert_fenced_for_good(m.consumer, m.spy, joins)
        finally:
            m.consumer.close()

    within(SCENARIO_LIMIT_S, scenario)


def _assert_fenced_for_good(consumer: Consumer, spy: RequestSpy, joins: int) -> None:
    """poll raises FencedInstanceIdError (within a few heartbeats) and keeps raising it, and
    no JoinGroup goes out any more."""
    deadline = time.monotonic() + 5
    while True:
        try:
            consumer.poll(100)
        except FencedInstanceIdError:
            break
        assert time.monotonic() < deadline, "poll did not raise FencedInstanceIdError"
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        with pytest.raises(FencedInstanceIdError):
            consumer.poll(100)
        time.sleep(0.05)
    assert spy.count(JOIN_GROUP) == joins, f"a fenced member tried to rejoin: {spy.sent[-10:]}"


def test_static_member_fenced_on_join_stops_for_good():
    topic = _name("t")

    def scenario():
        with FakeCoordinator(topic, 2) as fake:
            fake.push_errors(JOIN_GROUP, [Errors.FENCED_INSTANCE_ID])
            c = Consumer(fake.bootstrap, group_id=_name("g"), group_instance_id="host-a", **MOCK_OPTS)
            spy = RequestSpy(c)
            try:
                c.subscribe([topic])
                _assert_fenced_for_good(c, spy, 1)
                assert fake.requests[JOIN_GROUP.key] == 1
            finally:
                c.close()

    within(SCENARIO_LIMIT_S, scenario)


def test_join_retried_after_coordinator_not_available():
    topic = _name("t")

    def scenario():
        with FakeCoordinator(topic, 2) as fake:
            fake.push_errors(JOIN_GROUP, [Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_NOT_AVAILABLE])
            c = Consumer(fake.bootstrap, group_id=_name("g"), **MOCK_OPTS)
            try:
                c.subscribe([topic])
                wait_for(lambda: c.assignment() == {TopicPartition(topic, 0), TopicPartition(topic, 1)}, 10,
                         "the assignment", lambda: c.poll(100))
                assert fake.requests[JOIN_GROUP.key] == 3
                # Each COORDINATOR_NOT_AVAILABLE sent the member back to FindCoordinator.
                assert fake.requests[FIND_COORDINATOR.key] >= 3
            finally:
                c.close()

    within(SCENARIO_LIMIT_S, scenario)


# -- members polling in their own threads (Tansu) ------------------------------------------------

class Member(threading.Thread):
    """A kdaemon group member polling in its own thread (a consumer belongs to one thread),
    recording records, listener calls and every change of its assignment with a timestamp.
    ``stall(s)`` makes it stop calling poll for ``s`` seconds, as a slow record handler would."""

    def __init__(self, bootstrap: str, group: str, topics, poll_ms: int = 100, **opts) -> None:
        super().__init__(daemon=True, name=f"member-{group}")
        self.poll_ms = poll_ms
        self.consumer = Consumer(bootstrap, group_id=group, **{**TANSU_OPTS, **opts})
        self.topics = topics
        self.spy = RequestSpy(self.consumer)
        self.events = Events()
        self.events.consumer = self.consumer
        self.seen = Seen()
        self.current: frozenset = frozenset()
        self.assignments: list[tuple[float, frozenset]] = []
        self.generation = -1
        self._stall = 0.0
        self.stall_began: float | None = None
        self.stalled: tuple[float, float] | None = None  # (last poll before, first poll after)
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.close_on_stop = True
        self.closed_at: float | None = None

    def run(self) -> None:
        c = self.consumer
        try:
            c.subscribe(self.topics, listener=self.events)
            while not self.stop_event.is_set():
                if self._stall:
                    began = self.stall_began = time.monotonic()
                    self.stop_event.wait(self._stall)
                    self._stall = 0.0
                    self.stalled = (began, time.monotonic())
                self.seen.add(c.poll(self.poll_ms))
                g = c.group_generation()
                self.generation = -1 if g is None else g[0]
                a = frozenset(c.assignment())
                if a != self.current or not self.assignments:
                    self.current = a
                    self.assignments.append((time.monotonic(), a))
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
        finally:
            if self.close_on_stop:
                c.close()
                self.closed_at = time.monotonic()

    def stall(self, seconds: float) -> None:
        self._stall = seconds

    def stop(self, close: bool = True) -> None:
        self.close_on_stop = close
        self.stop_event.set()
        if self.ident is None:  # never started
            self.consumer.close()
            return
        self.join(30)
        assert not self.is_alive(), "member thread did not stop"
        if self.error is not None:
            raise self.error


class Trickle(threading.Thread):
    """Writes one numbered record to every partition every ``interval`` seconds until stopped."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval: float = 0.05) -> None:
        super().__init__(daemon=True, name=f"trickle-{topic}")
        self.writer = Writer(bootstrap, topic, partitions, idempotent=False)
        self.interval = interval
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            self.writer.write(self.writer.partitions)

    def stop(self) -> Writer:
        self.stop_event.set()
        self.join(10)
        self.writer.flush()
        return self.writer


def _partitions(topic: str, n: int) -> frozenset:
    return frozenset(TopicPartition(topic, p) for p in range(n))


def _stop_all(*members: Member) -> None:
    errors = []
    for m in members:
        try:
            m.stop()
        except BaseException as exc:  # noqa: BLE001 - every member is stopped first
            errors.append(exc)
    if errors:
        raise errors[0]


def _split(a: Member, b: Member, everything: frozenset) -> bool:
    return bool(a.current and b.current and not (a.current & b.current) and a.current | b.current == everything)


# -- 3. max_poll_interval_ms: a member that stops polling leaves, and rejoins when it polls -------

def test_member_that_stops_polling_leaves_then_rejoins(broker):
    topic, group, n_parts = _name("slow"), _name("g"), 4
    create_topic(broker.bootstrap, topic, partitions=n_parts)
    everything = _partitions(topic, n_parts)
    max_poll_s, stall_s = 3.0, 9.0

    def scenario():
        trickle = Trickle(broker.bootstrap, topic, n_parts, interval=0.1)
        opts = dict(max_poll_interval_ms=int(max_poll_s * 1000), auto_commit_interval_ms=500)
        a = Member(broker.bootstrap, group, [topic], **opts)
        b = Member(broker.bootstrap, group, [topic], **opts)
        trickle.start()
        a.start()
        b.start()
        try:
            wait_for(lambda: _split(a, b, everything), 30, "the partitions to be shared")
            b_had = b.current
            b.stall(stall_s)
            wait_for(lambda: b.stall_began is not None, 2, "the stall")
            # b's heartbeat thread keeps its session alive but leaves the group once
            # max_poll_interval_ms passes without a poll: a takes everything while b still sleeps.
            wait_for(lambda: a.current == everything, stall_s - 0.5, "a to take over b's partitions")
            took = time.monotonic() - b.stall_began
            assert b.stalled is None, "b polled again before a took over"
            assert took > max_poll_s, f"a took over after {took:.1f} s, before the poll timeout"
            leave = b.spy.first(LEAVE_GROUP, after=b.stall_began)
            assert leave is not None and leave[0] - b.stall_began < max_poll_s + 1, b.spy.sent[-10:]
            wait_for(lambda: b.stalled is not None, stall_s, "b to poll again")
            wait_for(lambda: _split(a, b, everything), 30, "the partitions to be shared again")
            # On its first poll b was told its partitions were lost, before it rejoined.
            after = [e for e in b.events.log if e[2] >= b.stall_began]
            assert after and after[0][:2] == ("lost", b_had), b.events.log
            rejoin = b.spy.first(JOIN_GROUP, after=b.stall_began)
            assert rejoin is not None and b.stalled[1] <= after[0][2] <= rejoin[0]
            writer = trickle.stop()
            wait_for(lambda: set(a.seen.records) | set(b.seen.records) >= set(writer.delivered), 15,
                     "every record written")
        finally:
            trickle.stop()
            _stop_all(a, b)

    within(90, scenario)


# -- 4. cooperative-sticky: only what moves is revoked, the rest keeps flowing -------------------

def test_cooperative_rebalance_revokes_only_moving_partitions_and_keeps_consuming(broker):
    topic, group, n_parts = _name("coop"), _name("g"), 4
    create_topic(broker.bootstrap, topic, partitions=n_parts)
    everything = _partitions(topic, n_parts)

    def scenario():
        trickle = Trickle(broker.bootstrap, topic, n_parts)
        # Frequent auto-commits, so some fall in the rebalance; a long poll timeout, which a
        # rebalance must not use up while records are waiting.
        opts = dict(partition_assignment_strategy=("cooperative-sticky",), auto_commit_interval_ms=100,
                    poll_ms=2000)
        a = Member(broker.bootstrap, group, [topic], **opts)
        b = Member(broker.bootstrap, group, [topic], **opts)
        trickle.start()
        a.start()
        try:
            wait_for(lambda: a.current == everything, 30, "the first member to own every partition")
            time.sleep(1)
            generation_before = a.generation
            b_started = time.monotonic()
            b.start()
            wait_for(lambda: _split(a, b, everything), 30, "the partitions to be shared")
            b_assigned = b.assignments[-1][0]
            time.sleep(1)
            kept, moved = a.current, b.current
            revoked = [e for e in a.events.log if e[0] == "revoked"]
            assert [e[1] for e in revoked] == [moved], f"revoked: {revoked}, moved: {moved}"
            # Two rounds: the first member gives the moving partitions up in one generation,
            # the second member gets them in a later one (never both in the same round).
            b_got = next(e for e in b.events.log if e[0] == "assigned" and e[1])
            assert b_got[1] == moved and b_got[3] > revoked[0][3] > generation_before, \
                (generation_before, revoked, b.events.log)
            assert a.generation >= generation_before + 2
            # The first member never gave up what it kept, not even for a moment ...
            after = [p for t, p in a.assignments if t >= b_started]
            assert all(p >= kept for p in after), f"assignments of the first member: {a.assignments}"
            # ... and went on reading it while the group rebalanced.
            for tp in kept:
                arrivals = sorted(t for (p, _), t in a.seen.arrived.items()
                                  if p == tp.partition and b_started - 1 <= t <= b_assigned + 1)
                gaps = [y - x for x, y in zip(arrivals, arrivals[1:])]
                assert len(arrivals) > 10 and max(gaps) < 1.0, \
                    f"{tp} stalled for {max(gaps or [0]):.2f} s while the group rebalanced"
            writer = trickle.stop()
            # Nothing was lost in the hand-over (the moved partitions' records since the last
            # auto-commit may come twice: at-least-once).
            wait_for(lambda: set(a.seen.records) | set(b.seen.records) >= set(writer.delivered), 15,
                     "every record written")
        finally:
            trickle.stop()
            _stop_all(a, b)

    within(90, scenario)


def test_cooperative_member_fetches_but_does_not_commit_while_rejoining():
    """A rejoin whose JoinGroup answer takes 1.5 s: poll keeps returning on time and fetching
    the owned partitions meanwhile, and commit() refuses with RebalanceInProgressError instead
    of committing under a generation that is about to end (Java's generationIfStable)."""
    topic = _name("t")
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    def scenario():
        with FakeCoordinator(topic, 2) as fake:
            c = Consumer(fake.bootstrap, group_id=_name("g"), enable_auto_commit=False,
                         partition_assignment_strategy=("cooperative-sticky",), **MOCK_OPTS)
            try:
                c.subscribe([topic])
                wait_for(lambda: c.assignment() == set(tps), 10, "the assignment", lambda: c.poll(100))
                generation = c.group_generation()[0]
                fake.join_delay = 1.5
                joins = fake.requests[JOIN_GROUP.key]
                fake.push_errors(HEARTBEAT, [Errors.REBALANCE_IN_PROGRESS])
                wait_for(lambda: fake.requests[JOIN_GROUP.key] > joins, 5, "the rejoin", lambda: c.poll(100))
                fetches, commits = fake.requests[FETCH.key], fake.requests[OFFSET_COMMIT.key]
                started = time.monotonic()
                while time.monotonic() - started < 1.0:
                    t = time.monotonic()
                    c.poll(100)
                    assert time.monotonic() - t < 0.5, "poll waited for the join"
                    assert c.assignment() == set(tps)
                with pytest.raises(RebalanceInProgressError):
                    c.commit({tps[0]: 0})
                assert fake.requests[FETCH.key] - fetches >= 3, "no fetches while the join was under way"
                assert fake.requests[OFFSET_COMMIT.key] == commits
                wait_for(lambda: c.group_generation() is not None and c.group_generation()[0] > generation, 5,
                         "the rejoin to complete", lambda: c.poll(100))
                c.commit({tps[0]: 0})
                assert fake.requests[OFFSET_COMMIT.key] == commits + 1
            finally:
                c.close()

    within(SCENARIO_LIMIT_S, scenario)


def test_cooperative_member_finds_the_coordinator_again_while_rejoining():
    """The rejoin of a member that owns partitions (so it does not wait in poll) is answered
    NOT_COORDINATOR: the member must look the coordinator up again and complete the rejoin."""
    topic = _name("t")
    tps = {TopicPartition(topic, 0), TopicPartition(topic, 1)}

    def scenario():
        with FakeCoordinator(topic, 2) as fake:
            c = Consumer(fake.bootstrap, group_id=_name("g"), enable_auto_commit=False,
                         partition_assignment_strategy=("cooperative-sticky",), **MOCK_OPTS)
            try:
                c.subscribe([topic])
                wait_for(lambda: c.assignment() == tps, 10, "the assignment", lambda: c.poll(100))
                generation = c.group_generation()[0]
                lookups = fake.requests[FIND_COORDINATOR.key]
                fake.push_errors(JOIN_GROUP, [Errors.NOT_COORDINATOR])
                fake.push_errors(HEARTBEAT, [Errors.REBALANCE_IN_PROGRESS])
                wait_for(lambda: c.group_generation()[0] > generation, 5, "the rejoin", lambda: c.poll(100))
                assert fake.requests[FIND_COORDINATOR.key] > lookups
                assert c.assignment() == tps
            finally:
                c.close()

    within(SCENARIO_LIMIT_S, scenario)


# -- 5. pattern subscriptions follow new topics; unsubscribe leaves -----------------------------

def test_pattern_subscription_picks_up_a_new_topic_and_unsubscribe_leaves(mock_cluster):
    _group_mock(mock_cluster)
    prefix = _name("pat")
    first, second, other = f"{prefix}-a", f"{prefix}-b", _name("other")
    mock_cluster.topic_create(first, 2, 1)

    def scenario():
        events = Events()
        got: dict[str, set] = defaultdict(set)
        c = Consumer(mock_cluster.bootstrap, group_id=_name("g"), **{**MOCK_OPTS, "metadata_max_age_ms": 300})
        events.consumer = c
        spy = RequestSpy(c)

        def poll() -> None:
            for tp, records in c.poll(100).items():
                got[tp.topic].update((tp.partition, r.offset) for r in records)

        try:
            c.subscribe(pattern=rf"^{prefix}-.*", listener=events)
            writer = Writer(mock_cluster.bootstrap, first, 2)
            writer.write(20)
            writer.flush()
            wait_for(lambda: got[first] == set(writer.delivered), 15, "the first topic's records", poll)
            assert c.assignment() == _partitions(first, 2)
            generation = c.group_generation()[0]

            mock_cluster.topic_create(second, 2, 1)
            mock_cluster.topic_create(other, 2, 1)
            writer2 = Writer(mock_cluster.bootstrap, second, 2)
            writer2.write(20)
            writer2.flush()
            wait_for(lambda: c.assignment() == _partitions(first, 2) | _partitions(second, 2), 10,
                     "the new matching topic to be assigned", poll)
            assert c.group_generation()[0] > generation  # it rejoined for the new topic
            wait_for(lambda: got[second] == set(writer2.delivered), 10, "the new topic's records", poll)
            assert other not in got

            c.unsubscribe()
            assert c.assignment() == set()
            assert c.group_generation() is None
            assert events.log[-1][:2] == ("revoked", _partitions(first, 2) | _partitions(second, 2))
            leave = spy.first(LEAVE_GROUP)
            assert leave is not None and leave[1].done and not leave[1].failed
            assert leave[1].value()[1]["error_code"] == 0
        finally:
            c.close()

    within(SCENARIO_LIMIT_S, scenario)


# -- 6. close() of a dynamic member leaves at once ----------------------------------------------

def test_close_leaves_the_group_so_the_others_take_over_before_the_session_timeout(broker):
    topic, group, n_parts = _name("leave"), _name("g"), 4
    create_topic(broker.bootstrap, topic, partitions=n_parts)
    everything = _partitions(topic, n_parts)
    session_s = TANSU_OPTS["session_timeout_ms"] / 1000

    def scenario():
        a = Member(broker.bootstrap, group, [topic])
        b = Member(broker.bootstrap, group, [topic])
        a.start()
        b.start()
        try:
            wait_for(lambda: _split(a, b, everything), 30, "the partitions to be shared")
            closing = time.monotonic()
            b.stop(close=True)
            wait_for(lambda: a.current == everything, 2 * session_s, "a to take over b's partitions")
            took = time.monotonic() - closing
            assert took < session_s, f"a took over {took:.1f} s after b closed (session {session_s} s)"
            leave = b.spy.first(LEAVE_GROUP, after=closing)
            assert leave is not None and leave[1].done and not leave[1].failed
        finally:
            _stop_all(a, b)

    within(60, scenario)
