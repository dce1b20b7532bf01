"""Log truncation under a consumer (KIP-320) on a real Apache Kafka, kdaemon beside the Java consumer.

One unclean leader election, watched by several consumers at once (a truncation costs two node
restarts, so the scenario runs once per module and the tests read its outcome):

1. A topic with replication 2, ``min.insync.replicas=1`` and ``unclean.leader.election.enable``.
   Ten records go to both replicas.  The follower is stopped; ten more records go to the leader
   alone (acks=1).  Every consumer reads all twenty: its position is 20, in the epoch of those
   records, past everything the stopped follower has (10).
2. The leader is killed; the old follower is started and becomes leader by unclean election (a
   new leader epoch starting at offset 10).  Five new, different records are written at 10-14.
3. Each consumer notices the leader change, asks the new leader where its epoch ends
   (OffsetForLeaderEpoch: offset 10) and acts on it: with ``earliest`` or ``latest`` it goes on
   from 10, the first divergent offset (as Java does: a reset by the policy happens only when
   the leader cannot say), and reads the new records; with ``none`` it raises
   ``LogTruncationError`` naming the partition, its offset 20 and the divergent offset 10.
   A group member that committed offset 20 (with its epoch) before the election and starts
   after it validates the committed position the same way.
4. The old leader comes back, truncates its log to match and follows; five more records are read
   by everyone: nobody stalls.

The Java KafkaConsumer (testkit/java/KafkaPeer.java) runs the same scenario with ``earliest`` and
with ``none``; its records and its exception are compared with kdaemon's.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field

import pytest

from kdaemon.client import Consumer, TopicPartition
from kdaemon.client.errors import LogTruncationError
from kdaemon.client.types import OffsetAndMetadata
from kdaemon.protocol.apis import FETCH, METADATA
from kdaemon.protocol.apis.offset_for_leader_epoch import OFFSET_FOR_LEADER_EPOCH
from kdaemon.protocol.records import RecordSetReader
from testkit.apache_kafka import HOST, KafkaCluster, start_or_fail
from testkit.kafka_tools import LEADER_ELECTION, kafka_tool
from testkit.java_peer import JavaConsumerProcess
from testkit.produce import Record, create_topic, produce
from testkit.wire import request

pytestmark = pytest.mark.kafka

WAIT = 90.0          # generous: two cores shared with other suites' brokers
OLD, LOST, NEW, AFTER = 10, 10, 5, 5


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    """This module's own three nodes (nodes are killed and restarted here).  Named like the
    session fixture so that a failing test gets these nodes' logs attached."""
    cluster = start_or_fail(tmp_path_factory, "kafka-truncation", nodes=3, racks=False,
                            extra_properties={
                                # Leadership stays where the election put it when the old leader
                                # returns; a preferred-leader move would be one more validation.
                                "auto.leader.rebalance.enable": "false",
                                "broker.session.timeout.ms": "6000",
                            })
    yield cluster
    cluster.stop()


# -- cluster helpers --------------------------------------------------------------------------------

@dataclass
class PartitionView:
    leader: int
    epoch: int
    replicas: list[int]
    isr: list[int]
    topic_id: uuid.UUID


def describe(cluster: KafkaCluster, topic: str) -> PartitionView | None:
    """Partition 0 of ``topic`` as the first live node that answers sees it."""
    for node in cluster.nodes.values():
        if not node.alive:
            continue
        try:
            body = request(HOST, node.port, METADATA, 12, {
                "topics": [{"name": topic, "topic_id": uuid.UUID(int=0)}],
                "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
                timeout=5.0).body
        except OSError:
            continue
        for t in body["topics"]:
            for p in t["partitions"]:
                if t["name"] == topic and p["partition_index"] == 0:
                    return PartitionView(p["leader_id"], p["leader_epoch"], p["replica_nodes"],
                                         p["isr_nodes"], t["topic_id"])
    return None


def wait_for(what: str, check, cluster: KafkaCluster, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s\n{cluster.log_tail(30)}")
        time.sleep(0.3)


def elect_unclean(cluster: KafkaCluster, topic: str) -> str:
    """Kafka's own LeaderElectionCommand (kafka-leader-election.sh) with --election-type unclean."""
    live = ",".join(f"{HOST}:{n.port}" for n in cluster.nodes.values() if n.alive)
    proc = kafka_tool(LEADER_ELECTION, live, "--election-type", "unclean", "--topic", topic, "--partition", "0")
    return (proc.stdout + proc.stderr).strip()


# -- consumers --------------------------------------------------------------------------------------

@dataclass
class Watched:
    """One kdaemon consumer and what it returned, in order; errors as they were raised; every
    request it sent (node, API name, body), seen through ``NetworkClient.observers``."""

    name: str
    consumer: Consumer
    records: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    sent: list = field(default_factory=list)
    election_at: int = 0          # len(sent) when the old leader was killed

    def __post_init__(self) -> None:
        self.consumer._network.observers.append(self._observe)   # the public seam

    def _observe(self, node_id, api, version, body, response) -> None:
        if not response:
            self.sent.append((node_id, api.name, body))

    def sent_since_election(self, api_name: str) -> list[tuple[int, dict]]:
        return [(node, body) for node, name, body in self.sent[self.election_at:] if name == api_name]

    def fetch_offsets_since_election(self, node: int) -> list[int]:
        return [p["fetch_offset"] for n, body in self.sent_since_election("Fetch") if n == node
                for t in body["topics"] for p in t["partitions"]]

    def poll_once(self) -> None:
        try:
            for rs in self.consumer.poll(200).values():
                self.records.extend(rs)
        except LogTruncationError as exc:
            self.errors.append(exc)

    def offsets(self) -> list[int]:
        return [r.offset for r in self.records]

    def values(self, start: int) -> list[bytes]:
        return [r.value for r in self.records[start:]]


def poll_all(watched: list[Watched], until, cluster: KafkaCluster, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        for w in watched:
            w.poll_once()
        if time.monotonic() > deadline:
            state = {w.name: (w.offsets()[-8:], [str(e) for e in w.errors]) for w in watched}
            raise AssertionError(f"{what}: not within {timeout} s: {state}\n{cluster.log_tail(30)}")


@dataclass
class Outcome:
    topic: str
    leader: int                      # before the election
    follower: int                    # the stopped one, elected uncleanly
    old_epoch: int                   # the epoch of the records only the old leader had
    new_epoch: int
    watched: dict[str, Watched]
    after_restart: dict[str, Watched]
    java: dict[str, JavaConsumerProcess]
    election: str                    # how the unclean election happened
    offset_for_epoch: dict           # raw OffsetForLeaderEpoch answer from the new leader
    fetch_answer: dict               # raw Fetch answer for offset 20 with last_fetched_epoch
    truncation_logged: bool          # the old leader's log says it truncated


def _values(prefix: str, first: int, n: int) -> list[bytes]:
    return [b"%s-%d" % (prefix.encode(), first + i) for i in range(n)]


@pytest.fixture(scope="module")
def truncation(kafka_cluster: KafkaCluster) -> Outcome:
    cluster = kafka_cluster
    topic = f"trunc-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    create_topic(cluster.bootstrap, topic, 1, replication=2,
                 config={"unclean.leader.election.enable": "true", "min.insync.replicas": "1"})
    view = wait_for("both replicas in sync", lambda: (v := describe(cluster, topic)) and len(v.isr) == 2 and v,
                    cluster)
    leader = view.leader
    follower = next(n for n in view.replicas if n != leader)

    produce(cluster.bootstrap, topic, [Record(value=v) for v in _values("old", 0, OLD)], partition=0, acks="all")
    cluster.nodes[follower].stop()
    wait_for("the stopped follower out of the ISR",
             lambda: (v := describe(cluster, topic)) and v.isr == [leader], cluster)
    produce(cluster.bootstrap, topic, [Record(value=v) for v in _values("lost", OLD, LOST)], partition=0, acks="1")

    # The group member commits offset 20 with its epoch before the election; a fresh member of
    # that group starts after it.  The Java "none" consumer starts from a committed 0.
    def consumer(name: str, reset: str, **kw) -> Watched:
        c = Consumer(cluster.bootstrap, client_id=f"kd-{name}", auto_offset_reset=reset,
                     metadata_max_age_ms=5000, **kw)
        c.assign([tp])
        return Watched(name, c)

    watched = {"earliest": consumer("earliest", "earliest"), "latest": consumer("latest", "latest"),
               "none": consumer("none", "none")}
    for name in ("latest", "none"):
        watched[name].consumer.seek(tp, 0)
    java_group = f"trunc-java-{topic}"
    setter = Consumer(cluster.bootstrap, group_id=java_group, enable_auto_commit=False)
    setter.assign([tp])
    setter.commit({tp: OffsetAndMetadata(0)})
    setter.close()
    java = {
        "earliest": JavaConsumerProcess(cluster.bootstrap, assign=[(topic, 0)], reset="earliest",
                                        idle_ms=600_000, settings={"metadata.max.age.ms": "5000"}),
        "none": JavaConsumerProcess(cluster.bootstrap, assign=[(topic, 0)], reset="none", group=java_group,
                                    idle_ms=600_000, settings={"metadata.max.age.ms": "5000"}),
    }
    total = OLD + LOST
    poll_all(list(watched.values()), lambda: all(len(w.records) >= total for w in watched.values()),
             cluster, "every kdaemon consumer read the first 20 records")
    wait_for("every Java consumer read the first 20 records",
             lambda: all(len(j.records) >= total for j in java.values()), cluster)
    old_epoch = watched["earliest"].records[-1].leader_epoch
    group = f"trunc-kd-{topic}"
    committer = Consumer(cluster.bootstrap, group_id=group, enable_auto_commit=False)
    committer.assign([tp])
    committer.commit({tp: OffsetAndMetadata(total, "", old_epoch)})
    committer.close()

    # The election: the leader dies, the follower that lacks offsets 10-19 takes over.
    for w in watched.values():
        w.election_at = len(w.sent)
    cluster.nodes[leader].kill()
    cluster.restart(follower)
    election = "automatic"
    deadline = time.monotonic() + 30
    while (v := describe(cluster, topic)) is None or v.leader != follower:
        if time.monotonic() > deadline:
            election = elect_unclean(cluster, topic)
            break
        time.sleep(0.5)
    view = wait_for("the old follower leading", lambda: (v := describe(cluster, topic)) and v.leader == follower and v,
                    cluster)
    new_epoch = view.epoch
    produce(cluster.bootstrap, topic, [Record(value=v) for v in _values("new", OLD, NEW)], partition=0, acks="all")

    # What the broker says, raw, to a consumer that read up to 20 in the old epoch.
    node = cluster.nodes[follower]
    offset_for_epoch = request(HOST, node.port, OFFSET_FOR_LEADER_EPOCH, 4, {"replica_id": -1, "topics": [
        {"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": new_epoch,
                                         "leader_epoch": old_epoch}]}]}).body
    fetch_answer = request(HOST, node.port, FETCH, 17, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "topics": [{"topic_id": view.topic_id, "partitions": [
            {"partition": 0, "current_leader_epoch": new_epoch, "fetch_offset": total,
             "last_fetched_epoch": old_epoch, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""}).body

    # Everyone notices: kdaemon's earliest/latest read the new records from 10; none raises.
    def noticed() -> bool:
        return (len(watched["earliest"].records) >= total + NEW and len(watched["latest"].records) >= total + NEW
                and bool(watched["none"].errors))
    poll_all(list(watched.values()), noticed, cluster, "the kdaemon consumers acting on the truncation")
    after_restart = {"group": consumer("group", "earliest", group_id=group, enable_auto_commit=False)}
    poll_all(list(after_restart.values()), lambda: len(after_restart["group"].records) >= NEW, cluster,
             "the restarted group member reading from the divergent offset")
    wait_for("the Java consumers acting on the truncation",
             lambda: len(java["earliest"].records) >= total + NEW and java["none"].proc.poll() is not None, cluster)
    none = watched["none"]
    none.consumer.seek(tp, none.errors[0].divergent_offsets[tp].offset)

    # The old leader returns, truncates its log and follows; everybody reads on.
    cluster.restart(leader)
    wait_for("the old leader back in the ISR", lambda: (v := describe(cluster, topic)) and len(v.isr) == 2, cluster)
    truncation_logged = bool(re.search(rf"{re.escape(topic)}-0.*[Tt]runcat|[Tt]runcat.*{re.escape(topic)}-0",
                                       cluster.nodes[leader].log_path.read_text(errors="replace")))
    produce(cluster.bootstrap, topic, [Record(value=v) for v in _values("after", OLD + NEW, AFTER)],
            partition=0, acks="all")
    everyone = list(watched.values()) + list(after_restart.values())
    end = OLD + NEW + AFTER
    poll_all(everyone, lambda: all(w.records and w.records[-1].offset == end - 1 for w in everyone), cluster,
             "every kdaemon consumer reading past the returned old leader")
    wait_for("the Java consumer reading past the returned old leader",
             lambda: java["earliest"].records and java["earliest"].records[-1].offset == end - 1, cluster)
    outcome = Outcome(topic, leader, follower, old_epoch, new_epoch, watched, after_restart, java, election,
                      offset_for_epoch, fetch_answer, truncation_logged)
    yield outcome
    for w in everyone:
        w.consumer.close()
    for j in java.values():
        j.kill()


# -- the outcome ------------------------------------------------------------------------------------

def _after(w, n: int = OLD + LOST):
    return [(r.offset, r.value) for r in w.records[n:]]


EXPECTED_AFTER = list(zip(range(OLD, OLD + NEW), _values("new", OLD, NEW))) + list(
    zip(range(OLD + NEW, OLD + NEW + AFTER), _values("after", OLD + NEW, AFTER)))


def test_the_scenario_truncated_the_log(kafka_cluster, truncation):
    o = truncation
    assert o.new_epoch > o.old_epoch
    # The new leader knows the old epoch and says it ends where the new one begins: at 10.
    (p,) = o.offset_for_epoch["topics"][0]["partitions"]
    assert (p["error_code"], p["leader_epoch"], p["end_offset"]) == (0, o.old_epoch, OLD)
    # The broker runs the same check for a consumer's Fetch that carries last_fetched_epoch (the
    # Java consumer never sends one): no records, the diverging epoch instead.
    (fp,) = o.fetch_answer["responses"][0]["partitions"]
    assert fp["error_code"] == 0
    assert fp["diverging_epoch"] == {"epoch": o.old_epoch, "end_offset": OLD}
    assert not fp["records"]
    assert o.truncation_logged, kafka_cluster.nodes[o.leader].log_tail(80)


@pytest.mark.parametrize("name", ["earliest", "latest", "none", "group"])
def test_the_new_leader_is_asked_before_it_is_fetched_from(truncation, name):
    o = truncation
    w = {**o.watched, **o.after_restart}[name]
    asked = w.sent_since_election("OffsetForLeaderEpoch")
    assert asked, f"{name} sent no OffsetForLeaderEpoch"
    node, body = asked[0]
    assert node == o.follower and body["replica_id"] == -1
    assert body["topics"] == [{"topic": o.topic, "partitions": [
        {"partition": 0, "current_leader_epoch": o.new_epoch, "leader_epoch": o.old_epoch}]}]
    # Validation first: the first fetch from the new leader is at the divergent offset 10, not
    # at 20 (which it would have answered with diverging_epoch, or a broker that does not check
    # with OFFSET_OUT_OF_RANGE), and no ListOffsets reset happens.
    fetched = w.fetch_offsets_since_election(o.follower)
    assert fetched and fetched[0] == OLD, fetched
    assert not w.sent_since_election("ListOffsets")


@pytest.mark.parametrize("name", ["earliest", "latest"])
def test_a_reset_policy_goes_on_from_the_divergent_offset(truncation, name):
    w = truncation.watched[name]
    assert w.offsets()[:OLD + LOST] == list(range(OLD + LOST))
    assert w.values(OLD)[:LOST] == _values("lost", OLD, LOST)
    # Not a reset by the policy (earliest would re-read from 0, latest would skip to 15): the
    # records from the divergent offset 10 on, the new ones, each once.
    assert _after(w) == EXPECTED_AFTER
    assert not w.errors


def test_none_raises_log_truncation_error_naming_partition_and_offsets(truncation):
    o = truncation
    w = o.watched["none"]
    tp = TopicPartition(o.topic, 0)
    exc = w.errors[0]
    assert exc.offsets == {tp: OLD + LOST}
    assert exc.divergent_offsets == {tp: OffsetAndMetadata(OLD, "", o.old_epoch)}
    assert f"{o.topic}-0 at offset {OLD + LOST}, divergent offset {OLD} (leader epoch {o.old_epoch})" in str(exc)
    # Nothing was handed out between the truncation and the application's seek to 10.
    assert _after(w) == EXPECTED_AFTER


def test_a_committed_position_is_validated_after_a_restart(truncation):
    w = truncation.after_restart["group"]
    assert _after(w, 0) == EXPECTED_AFTER


def test_java_consumer_does_the_same(truncation):
    o = truncation
    kd = o.watched["earliest"]
    java = o.java["earliest"]
    assert [(r.offset, r.value) for r in java.records] == [(r.offset, r.value) for r in kd.records]
    none = o.java["none"]
    assert none.proc.returncode != 0
    assert "LogTruncationException" in none.stderr, none.stderr[-3000:]
    assert re.search(rf"{re.escape(o.topic)}-0.*offset={OLD}\b", none.stderr), none.stderr[-3000:]
    assert [r.offset for r in none.records] == list(range(OLD + LOST))
