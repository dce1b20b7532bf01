"""Consumer groups under faults: coordinator moves, injected group errors, poll timeouts,
cooperative rebalances, pattern subscriptions and leaving on close.

Where it can, this uses librdkafka's mock cluster (brokers 1, 2, 3) to inject errors; what a
real broker is needed for (cooperative rebalances, leave-on-close timing) runs on Tansu.

What the mock cluster (librdkafka 2.16) does not do for groups, and how that shapes the tests:
* it offers JoinGroup v6, SyncGroup v4, Heartbeat v4 and LeaveGroup v3-4 but its handlers only
  parse the non-flexible layouts (and LeaveGroup only v0-2): a flexible JoinGroup makes it drop
  the connection.  ``_group_mock`` caps those APIs to what librdkafka itself sends;
* its JoinGroup error answers carry null protocol name, leader and member id, which Kafka's
  schema does not allow before v7 (a real broker sends empty strings), so the client rightly
  rejects them as malformed: JoinGroup errors (COORDINATOR_NOT_AVAILABLE, FENCED_INSTANCE_ID)
  are served by ``FakeCoordinator``, a one-broker cluster built from kdaemon.protocol's specs;
* OffsetCommit does not check that it reached the coordinator (only Heartbeat, JoinGroup,
  SyncGroup and LeaveGroup answer NOT_COORDINATOR), so after a coordinator move it is the
  heartbeat that notices; NOT_COORDINATOR on a commit is injected instead;
* it has no static membership: FENCED_INSTANCE_ID is only ever an injected error;
* a member that rejoins with a new member id leaves its old id in the group until that id's
  session times out, so those rejoins take about two session timeouts (short ones here).

Every scenario runs in a worker thread with a hard limit, so a hang fails with the stuck stack
instead of blocking the run.
"""

from __future__ import annotations

import ctypes
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
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as RdTopicPartition

from kdaemon.client import Consumer, TopicPartition
from kdaemon.client.errors import CommitFailedError, FencedInstanceIdError, RebalanceInProgressError
from kdaemon.protocol.apis import (API_VERSIONS, FETCH, FIND_COORDINATOR, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP,
                                   LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH, SYNC_GROUP, api_by_key)
from kdaemon.protocol.errors import Errors
from kdaemon.protocol.messages import decode_request, encode_response
from tests.support.mockcluster import librdkafka

SCENARIO_LIMIT_S = 45

# Short sessions: the mock waits session_timeout_ms - 1 s before it answers a rejoin.
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
    for api, highest in ((JOIN_GROUP, 5), (SYNC_GROUP, 3), (HEARTBEAT, 3), (LEAVE_GROUP, 2)):
        cluster.set_apiversion(api.key, 0, highest)
    fn = librdkafka().rd_kafka_mock_group_initial_rebalance_delay_ms
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_int32]
    fn(cluster._handle(), 100)  # the first join answers after 0.1 s instead of 3 s


class Writer:
    """Numbered records ("p/i") through an idempotent producer, remembered by delivery."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "linger.ms": 5})
        self.topic, self.partitions = topic, partitions
        self.sent = 0
        self.delivered: dict[tuple[int, int], bytes] = {}
        self.errors: list[str] = []

    def write(self, n: int) -> None:
        for _ in range(n):
            p = self.sent % self.partitions
            self.producer.produce(self.topic, value=f"{p}/{self.sent}".encode(), partition=p,
                                  on_delivery=self._delivered)
            self.sent += 1
        self.producer.poll(0)

    def _delivered(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.delivered[(msg.partition(), msg.offset())] = msg.value()

    def flush(self) -> None:
        assert self.producer.flush(20) == 0 and not self.errors, self.errors[:3]

    def ends(self) -> dict[int, int]:
        ends: dict[int, int] = defaultdict(int)
        for p, off in self.delivered:
            ends[p] = max(ends[p], off + 1)
        return dict(ends)


class Seen:
    """Every record a consumer returned, with repeats counted."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], bytes] = {}
        self.repeats: list[tuple[int, int]] = []
        self.last_at: dict[int, float] = {}

    def add(self, polled) -> int:
        n = 0
        for tp, records in polled.items():
            for r in records:
                key = (tp.partition, r.offset)
                if key in self.records:
                    self.repeats.append(key)
                self.records[key] = r.value
                self.last_at[tp.partition] = time.monotonic()
                n += 1
        return n


class Events:
    """A rebalance listener that records (callback, partitions, time) in order."""

    def __init__(self) -> None:
        self.log: list[tuple[str, frozenset, float]] = []

    def on_partitions_revoked(self, partitions) -> None:
        self.log.append(("revoked", frozenset(partitions), time.monotonic()))

    def on_partitions_assigned(self, partitions) -> None:
        self.log.append(("assigned", frozenset(partitions), time.monotonic()))

    def on_partitions_lost(self, partitions) -> None:
        self.log.append(("lost", frozenset(partitions), time.monotonic()))

    def names(self) -> list[str]:
        return [e[0] for e in self.log]


class RequestSpy:
    """Records the API name of every request the consumer's network client sends."""

    def __init__(self, consumer: Consumer) -> None:
        self.sent: list[str] = []
        network = consumer._network
        original = network.send

        def send(node_id, api, body, **kw):
            self.sent.append(api.name)
            return original(node_id, api, body, **kw)

        network.send = send

    def count(self, api) -> int:
        return self.sent.count(api.name)


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
        coordinator = c._coordinator
        commits = []

        def poll_and_commit() -> None:
            if seen.add(c.poll(100)):
                c.commit(timeout_ms=8000)
                commits.append((coordinator._coordinator_broker, time.monotonic()))

        try:
            c.subscribe([topic])
            writer.write(60)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 60, 15, "the first 60 records", poll_and_commit)
            assert coordinator._coordinator_broker == 2
            generation = c.group_generation()

            # Move 1: broker 2 answers NOT_COORDINATOR to the next heartbeat.  No records
            # arrive, so no commit() looks the coordinator up: poll itself must.
            mock_cluster.coordinator_set("group", group, 3)
            wait_for(lambda: coordinator._coordinator_broker == 3, 5, "the move to broker 3", poll_and_commit)
            writer.write(60)
            writer.flush()
            wait_for(lambda: len(seen.records) >= 120, 15, "records after the first move", poll_and_commit)
            assert commits[-1][0] == 3

            # Move 2: back to broker 2, and broker 3 goes down under the member.
            mock_cluster.coordinator_set("group", group, 2)
            mock_cluster.broker_set_down(3)
            wait_for(lambda: coordinator._coordinator_broker == 2, 8, "the move back to broker 2",
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
        coordinator = c._coordinator
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
