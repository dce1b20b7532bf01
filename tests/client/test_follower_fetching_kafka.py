"""Follower fetching (KIP-392) against Apache Kafka's RackAwareReplicaSelector.

A module-scoped three-node cluster of our own (racks r1, r2, r3), because one test stops and
restarts a node.  The topic's replicas are pinned to nodes 1, 2, 3 with 1 the leader, so a
consumer in rack r2 has a follower of its own rack to read from.

What proves that kdaemon reads from the follower:
* the broker's decision: a raw Fetch (kdaemon's codec, testkit/wire.py) to the leader with
  rack_id "r2" is answered with preferred_read_replica = 2 and no records (with rack_id "r1",
  the leader's own rack, it is answered with the records);
* where our fetches go: the consumer's per-node Fetch counts (``fetch_requests_per_node``)
  grow for node 2 only, once the leader has redirected it there, while records keep coming.

When the follower stops (a controlled shutdown) or is killed, records keep flowing from the
leader, none lost or repeated.  When it is back, the consumer returns to it, as the Java
consumer does: Java clears the preferred replica when a fetch from it fails
(AbstractFetch.handleFetchFailure), fetches from the leader, and the leader names the follower
again once it is back in the ISR (Kafka only names in-sync replicas that hold the fetch offset).
The kill is the harder case: the leader keeps naming the dead follower until it leaves the ISR
(fenced after broker.session.timeout.ms), and kdaemon used to avoid a node whose connection had
ever failed, so once the follower was back every fetch went to the leader, which redirected it
every time: no record after the restart, and tens of thousands of empty fetches.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from kdaemon.client import Consumer, TopicPartition
from kdaemon.protocol.apis import FETCH
from testkit.apache_kafka import HOST, KafkaCluster, start_or_fail
from testkit.produce import Writer
from testkit.wire import request

pytestmark = pytest.mark.kafka

LEADER, FOLLOWER = 1, 2          # racks r1 and r2
CLIENT_RACK = "r2"
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def racked(tmp_path_factory) -> KafkaCluster:
    """Three PLAINTEXT nodes in racks r1-r3 with the rack-aware replica selector."""
    cluster = start_or_fail(tmp_path_factory, "racked", nodes=3, racks=True)
    yield cluster
    cluster.stop()


def _create_pinned_topic(cluster: KafkaCluster) -> str:
    """One partition on nodes 1, 2, 3, node 1 leading (the first replica is the preferred leader)."""
    name = f"follower-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.create_topics([NewTopic(name, num_partitions=1, replica_assignment=[[LEADER, FOLLOWER, 3]])])[name].result(60)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        md = admin.list_topics(topic=name, timeout=30).topics.get(name)
        part = md.partitions.get(0) if md is not None and md.error is None else None
        if part is not None and part.leader == LEADER and sorted(part.isrs) == [1, 2, 3]:
            return name
        assert time.monotonic() < deadline, f"{name}: leader 1 with ISR 1,2,3 not seen: {md}"
        time.sleep(0.1)


class _Writer:
    """Numbered records to partition 0, delivery-checked."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        self.topic = topic
        self.out = Writer(cluster.bootstrap, topic, **{"linger.ms": 5})
        self.sent = 0
        self.errors = self.out.errors

    def write(self, n: int) -> None:
        for _ in range(n):
            self.out.send(str(self.sent).encode(), partition=0)
            self.sent += 1
        self.out.poll(0)

    def flush(self) -> None:
        assert self.out.flush(30) == 0 and not self.errors, self.errors[:3]


class _Reader:
    """A kdaemon consumer in rack r2 reading partition 0 from the start, checking every record
    on arrival: the next offset, the value written at it."""

    def __init__(self, cluster: KafkaCluster, topic: str) -> None:
        self.tp = TopicPartition(topic, 0)
        self.consumer = Consumer(cluster.bootstrap, client_rack=CLIENT_RACK, auto_offset_reset="earliest",
                                 fetch_max_wait_ms=100, reconnect_backoff_ms=50, reconnect_backoff_max_ms=500,
                                 retry_backoff_ms=50, request_timeout_ms=10_000,
                                 socket_connection_setup_timeout_ms=2000)
        self.consumer.assign([self.tp])
        self.next = 0

    def poll(self) -> None:
        for records in self.consumer.poll(100).values():
            for r in records:
                assert r.offset == self.next, (f"offset {r.offset} where {self.next} was next: "
                                               f"{'a duplicate' if r.offset < self.next else 'records skipped'}")
                assert r.value == str(r.offset).encode()
                self.next += 1

    def until(self, done, what: str, writer: _Writer | None = None, per_round: int = 0) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not done():
            assert time.monotonic() < deadline, (f"{what}: not within {DEADLINE_S} s; read {self.next}, "
                                                 f"fetches per node {self.fetches()}")
            if writer is not None and per_round:
                writer.write(per_round)
            self.poll()

    def fetches(self) -> dict[int, int]:
        return dict(self.consumer.metrics().fetch_requests_per_node)

    def preferred(self) -> int | None:
        return self.consumer.metrics().partitions[self.tp].preferred_read_replica

    def close(self) -> None:
        self.consumer.close()


def _raw_fetch(cluster: KafkaCluster, topic: str, rack: str) -> dict:
    """One Fetch v12 (topic names, rack_id) straight to the leader, as a consumer in ``rack``."""
    body = {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": rack,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                        "fetch_offset": 0, "last_fetched_epoch": -1,
                                                        "log_start_offset": -1,
                                                        "partition_max_bytes": 1 << 20}]}]}
    resp = request(HOST, cluster.nodes[LEADER].port, FETCH, 12, body).body
    assert resp["error_code"] == 0, resp
    return resp["responses"][0]["partitions"][0]


def test_reads_from_the_rack_local_follower_the_leader_names(racked):
    topic = _create_pinned_topic(racked)
    writer = _Writer(racked, topic)
    writer.write(100)
    writer.flush()

    # The broker's decision, seen on the wire.
    remote = _raw_fetch(racked, topic, CLIENT_RACK)
    assert remote["error_code"] == 0 and remote["preferred_read_replica"] == FOLLOWER, remote
    assert not remote["records"], "a redirect carries no records"
    local = _raw_fetch(racked, topic, "r1")
    assert local["preferred_read_replica"] == -1 and local["records"], "rack r1 is served by its leader"

    reader = _Reader(racked, topic)
    try:
        reader.until(lambda: reader.next == 100, "the first 100 records")
        assert reader.preferred() == FOLLOWER
        before = reader.fetches()
        assert before.get(FOLLOWER, 0) > 0
        # The leader answered the first fetch(es) with the redirect; from then on every fetch
        # goes to the follower while records keep coming.
        reader.until(lambda: reader.next >= 300, "200 more records", writer, per_round=5)
        writer.flush()
        reader.until(lambda: reader.next == writer.sent, "everything written")
        after = reader.fetches()
        assert after.get(LEADER, 0) == before.get(LEADER, 0), (before, after)
        assert after.get(FOLLOWER, 0) > before.get(FOLLOWER, 0), (before, after)
        assert after.get(3, 0) == 0, after
    finally:
        reader.close()


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_falls_back_to_the_leader_while_the_follower_is_down_and_returns(racked, how):
    topic = _create_pinned_topic(racked)
    writer = _Writer(racked, topic)
    reader = _Reader(racked, topic)
    follower = racked.nodes[FOLLOWER]
    try:
        reader.until(lambda: reader.next >= 100 and reader.preferred() == FOLLOWER,
                     "reading from the follower", writer, per_round=5)

        getattr(follower, how)()
        at_stop = reader.fetches()
        target = writer.sent + 200
        reader.until(lambda: reader.next >= target, "200 records written after the follower stopped",
                     writer, per_round=5)
        assert reader.fetches().get(LEADER, 0) > at_stop.get(LEADER, 0), "they came from the leader"

        racked.restart(FOLLOWER)
        at_restart = reader.fetches()
        reader.until(lambda: reader.preferred() == FOLLOWER
                     and reader.fetches().get(FOLLOWER, 0) > at_restart.get(FOLLOWER, 0) + 5,
                     "back on the follower", writer, per_round=5)
        # Still reading there, from the follower only.
        on_follower = reader.fetches()
        target = writer.sent + 100
        reader.until(lambda: reader.next >= target, "100 more records on the follower", writer, per_round=5)
        writer.flush()
        reader.until(lambda: reader.next == writer.sent, "everything written")
        last = reader.fetches()
        assert last.get(LEADER, 0) == on_follower.get(LEADER, 0), (on_follower, last)
    finally:
        reader.close()
        if not follower.alive:
            racked.restart(FOLLOWER)
