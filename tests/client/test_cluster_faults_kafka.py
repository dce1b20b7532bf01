"""Broker faults on a three-node Apache Kafka cluster while kdaemon's Consumer reads through them.

Each test creates a topic (6 partitions, replication 3, ``min.insync.replicas=2``), writes to it
steadily with confluent-kafka (``acks=all``, idempotent) and reads it with two kdaemon consumers
at once, each in its own thread: one subscribed as a group member, one with ``assign()`` (both
commit).  While they run, one fault happens:

(a) the broker leading partition 0 is killed (SIGKILL), then restarted;
(b) that broker is shut down in a controlled way (SIGTERM: leadership moves first), then restarted;
(c) a reassignment reorders every partition's replicas and a preferred election moves every
    leader, no broker stopping;
(d) the broker coordinating both consumers' groups is killed, then restarted.

Then the writer stops and each consumer must end with exactly the acknowledged records: the
(partition, offset) set and the values equal the delivery reports, none twice.  Both must deliver
again after the fault within the group session timeout plus a margin (deadline polling: a
functional bound, not a speed test), a commit made after the fault must land (``committed()``
equals the end of every partition), and no poll may hang.

The cluster is this module's own (nodes are killed), with ``broker.session.timeout.ms`` lowered
to 6 s so that the controller fences a killed broker sooner than the default 9 s.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import pytest

from kdaemon.client import Consumer, TopicPartition
from testkit.cluster_admin import (elect_preferred, find_coordinator, find_coordinators, leaders,
                                       reassign, wait_full_isr, wait_partitions)
from testkit.apache_kafka import KafkaCluster, start_or_fail
from testkit.produce import Writer, create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
REPLICAS = 3
SESSION_TIMEOUT_MS = 10_000
# Past the session timeout, what delivering again may take after a fault: fencing a killed broker
# (broker.session.timeout.ms below), an election, a metadata refresh, a producer retry and a fetch,
# on a machine shared with other brokers.
RESUME_MARGIN_S = 30.0
RESUME_BOUND_S = SESSION_TIMEOUT_MS / 1000 + RESUME_MARGIN_S
BROKER_SESSION_MS = 6000
OFFSETS_PARTITIONS = 8          # offsets.topic.num.partitions of testkit/apache_kafka.py
RATE = 400                      # records per second the writer aims at
# A poll(POLL_MS) that takes longer than this has hung (a sync commit inside the loop may wait for
# a coordinator, which the margin covers).
POLL_MS = 200
HANG_S = RESUME_BOUND_S
DRAIN_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    c = start_or_fail(tmp_path_factory, "faults", nodes=3,
                      extra_properties={"broker.session.timeout.ms": str(BROKER_SESSION_MS),
                                        "broker.heartbeat.interval.ms": "1000"})
    yield c
    c.stop()


@pytest.fixture
def revive(cluster: KafkaCluster):
    """Every node runs again after the test, whatever it did to them."""
    yield
    for node_id, node in cluster.nodes.items():
        if not node.alive:
            cluster.restart(node_id)


# -- the writer ----------------------------------------------------------------------------------

class SteadyWriter(threading.Thread):
    """confluent-kafka, ``acks=all`` and idempotent, writing numbered records round-robin over the
    partitions at about ``RATE`` per second until stopped; keeps every delivery report and when it
    arrived."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name=f"writer-{topic}", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.delivered: dict[tuple[int, int], bytes] = {}
        self.acked_at: dict[tuple[int, int], float] = {}
        self.errors: list[str] = []
        self.left = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()

    def run(self) -> None:
        def on_delivered(msg) -> None:
            with self._lock:
                where = (msg.partition(), msg.offset())
                self.delivered[where] = msg.value()
                self.acked_at[where] = time.monotonic()

        writer = Writer(self.bootstrap, self.topic, on_delivered=on_delivered,
                        **{"acks": "all", "enable.idempotence": True, "linger.ms": 5,
                           "message.timeout.ms": 120_000})
        self.errors = writer.errors
        i = 0
        started = time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - started) * RATE)
            while i < due:
                writer.send(f"{self.topic}#{i:07d}".encode(), str(i).encode(), partition=i % PARTITIONS)
                i += 1
            writer.poll(0.02)
            time.sleep(0.02)   # poll returns early whenever a report arrives
        self.left = writer.flush(90)

    def stop(self) -> dict[tuple[int, int], bytes]:
        self._halt.set()
        self.join(120)
        assert not self.is_alive(), "the writer did not finish flushing within 120 s"
        assert self.left == 0 and not self.errors, \
            f"writer: {self.left} record(s) never acknowledged, errors {self.errors[:5]}"
        return dict(self.delivered)

    def acked_per_partition(self) -> dict[int, int]:
        """How many delivery reports each partition has had (for failure messages)."""
        with self._lock:
            return dict(Counter(p for p, _ in self.acked_at))

    def first_acked_after(self, t0: float) -> dict[int, int]:
        """Per partition, the lowest offset acknowledged after ``t0`` (written after the fault)."""
        out: dict[int, int] = {}
        with self._lock:
            for (p, off), at in self.acked_at.items():
                if at > t0 and off < out.get(p, 1 << 62):
                    out[p] = off
        return out


# -- the readers ---------------------------------------------------------------------------------

@dataclass
class Reader:
    """One kdaemon Consumer in its own thread: polls, commits the positions (sync, at most every
    half second), and once ``target`` (partition -> end) is set and reached, commits and reads
    back the committed offsets."""

    name: str
    consumer: Consumer
    topic: str
    subscribe: bool
    consumed: list[tuple[int, int, bytes]] = field(default_factory=list)
    high: dict[int, int] = field(default_factory=dict)          # partition -> highest offset read
    commits_ok: list[float] = field(default_factory=list)        # when each commit returned
    commit_errors: list[str] = field(default_factory=list)
    stable: list[tuple[float, bool]] = field(default_factory=list)  # group membership changes
    longest_poll_s: float = 0.0
    committed: dict[int, int | None] = field(default_factory=dict)
    error: BaseException | None = None
    target: dict[int, int] | None = None
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        c = self.consumer
        tps = [TopicPartition(self.topic, p) for p in range(PARTITIONS)]
        try:
            if self.subscribe:
                c.subscribe([self.topic])
            else:
                c.assign(tps)
            last_commit = 0.0
            while not self.stop.is_set():
                t = time.monotonic()
                batch = c.poll(POLL_MS)
                self.longest_poll_s = max(self.longest_poll_s, time.monotonic() - t)
                for tp, records in batch.items():
                    for r in records:
                        self.consumed.append((tp.partition, r.offset, r.value))
                    self.high[tp.partition] = max(self.high.get(tp.partition, -1), records[-1].offset)
                if self.subscribe:
                    stable = c.group_stable()
                    if not self.stable or self.stable[-1][1] != stable:
                        self.stable.append((time.monotonic(), stable))
                if time.monotonic() - last_commit >= 0.5:
                    last_commit = time.monotonic()
                    self._commit()
                target = self.target
                if target is not None and self._reached(target):
                    self._commit()
                    found = c.committed(tps, timeout_ms=30_000)
                    self.committed = {tp.partition: None if om is None else om.offset
                                      for tp, om in found.items()}
                    return
        except BaseException as exc:  # handed to the test thread
            self.error = exc
        finally:
            try:
                c.close()
            finally:
                self.done.set()

    def _commit(self) -> None:
        try:
            self.consumer.commit()
            self.commits_ok.append(time.monotonic())
        except Exception as exc:
            self.commit_errors.append(f"{time.monotonic():.1f}: {type(exc).__name__}: {exc}")

    def _reached(self, target: dict[int, int]) -> bool:
        positions = self.consumer.positions()
        return all(positions.get(TopicPartition(self.topic, p), -1) >= end for p, end in target.items())

    def resumed_after(self, first_after: dict[int, int]) -> bool:
        """Every partition delivered a record written after the fault."""
        return len(first_after) == PARTITIONS and \
            all(self.high.get(p, -1) >= off for p, off in first_after.items())


def java_hash(text: str) -> int:
    """Java's String.hashCode (a signed 32-bit int over UTF-16 code units; our names are ASCII)."""
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def offsets_partition(group: str) -> int:
    """The group's __consumer_offsets partition: ``Utils.abs(groupId.hashCode()) % partitions``,
    where Kafka's ``Utils.abs`` is ``Math.abs`` (0 for Integer.MIN_VALUE), not a sign mask."""
    h = java_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % OFFSETS_PARTITIONS


def same_coordinator_group(group: str) -> str:
    """Another group name that lands on ``group``'s __consumer_offsets partition (hence on the
    same coordinator), so one coordinator kill hits both readers."""
    for i in range(1000):
        other = f"{group}-assign-{i}"
        if offsets_partition(other) == offsets_partition(group):
            return other
    raise AssertionError("no group name found on the same offsets partition")


def consumer(cluster: KafkaCluster, group: str, name: str) -> Consumer:
    return Consumer(cluster.bootstrap, group_id=group, client_id=name, enable_auto_commit=False,
                    auto_offset_reset="earliest", session_timeout_ms=SESSION_TIMEOUT_MS,
                    heartbeat_interval_ms=1000, fetch_max_wait_ms=200, request_timeout_ms=10_000,
                    retry_backoff_ms=100, reconnect_backoff_max_ms=1000)


# -- one scenario ----------------------------------------------------------------------------------

@dataclass
class Scenario:
    cluster: KafkaCluster
    name: str

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:8]
        self.topic = f"faults-{self.name}-{tag}"
        self.group = f"faults-{self.name}-{tag}"
        self.assign_group = same_coordinator_group(self.group)
        create_topic(self.cluster.bootstrap, self.topic, PARTITIONS, replication=REPLICAS,
                     config={"min.insync.replicas": "2"})
        wait_full_isr(self.cluster.bootstrap, self.topic, REPLICAS)
        self.writer = SteadyWriter(self.cluster.bootstrap, self.topic)
        self.readers = [
            Reader("group", consumer(self.cluster, self.group, "group-reader"), self.topic, subscribe=True),
            Reader("assign", consumer(self.cluster, self.assign_group, "assign-reader"), self.topic,
                   subscribe=False),
        ]
        self.marks: dict[str, float] = {}

    def start(self) -> None:
        self.writer.start()
        for r in self.readers:
            r.start()
        self.wait_all_resumed(time.monotonic(), "start", timeout=60.0)

    def wait_all_resumed(self, t0: float, label: str, timeout: float = RESUME_BOUND_S) -> float:
        """Until every reader delivered, on every partition, a record acknowledged after ``t0``;
        the seconds that took."""
        deadline = t0 + timeout
        while True:
            self.check_readers()
            first_after = self.writer.first_acked_after(t0)
            if all(r.resumed_after(first_after) for r in self.readers):
                took = time.monotonic() - t0
                self.marks[label] = took
                return took
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{label}: readers did not deliver records written after the fault within "
                    f"{timeout:.0f} s: written-after {first_after}, read "
                    f"{ {r.name: dict(r.high) for r in self.readers} }, commit errors "
                    f"{ {r.name: r.commit_errors[-3:] for r in self.readers} }; writer: acked per "
                    f"partition {self.writer.acked_per_partition()}, errors {self.writer.errors[-3:]}\n"
                    f"{self.cluster.log_tail(30)}")
            time.sleep(0.1)

    def wait_commit_after(self, t0: float, label: str, timeout: float = RESUME_BOUND_S) -> float:
        deadline = t0 + timeout
        while True:
            self.check_readers()
            if all(any(at > t0 for at in r.commits_ok) for r in self.readers):
                took = time.monotonic() - t0
                self.marks[label] = took
                return took
            if time.monotonic() > deadline:
                raise AssertionError(f"{label}: no commit landed within {timeout:.0f} s after the fault; "
                                     f"errors { {r.name: r.commit_errors[-3:] for r in self.readers} }")
            time.sleep(0.1)

    def check_readers(self) -> None:
        for r in self.readers:
            if r.error is not None:
                raise AssertionError(f"reader {r.name} failed: {r.error!r}") from r.error
            if r.done.is_set() and r.target is None:
                raise AssertionError(f"reader {r.name} stopped early")

    def finish(self) -> None:
        """Stop writing, let both readers reach the end, and check what they read and committed."""
        delivered = self.writer.stop()
        assert all(off >= 0 for _, off in delivered), "a delivery report without an offset"
        ends = {p: 0 for p in range(PARTITIONS)}
        for p, off in delivered:
            ends[p] = max(ends[p], off + 1)
        for r in self.readers:
            r.target = ends
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        for r in self.readers:
            if not r.done.wait(max(0.0, deadline - time.monotonic())):
                r.stop.set()
                raise AssertionError(f"reader {r.name} did not reach the ends {ends} within "
                                     f"{DRAIN_TIMEOUT_S} s: read up to {r.high}; hung poll? longest "
                                     f"{r.longest_poll_s:.1f} s")
        self.check_readers()
        for r in self.readers:
            got = Counter((p, off) for p, off, _ in r.consumed)
            repeated = sorted(k for k, n in got.items() if n > 1)
            missing = sorted(set(delivered) - set(got))
            extra = sorted(set(got) - set(delivered))
            assert not repeated and not missing and not extra, (
                f"{self.name}/{r.name}: {len(missing)} lost (e.g. {missing[:5]}), {len(repeated)} "
                f"repeated (e.g. {repeated[:5]}), {len(extra)} unexpected (e.g. {extra[:5]}) of "
                f"{len(delivered)}; commit errors {r.commit_errors[:5]}; membership {r.stable}")
            wrong = [(p, off) for p, off, v in r.consumed if delivered[(p, off)] != v]
            assert not wrong, f"{self.name}/{r.name}: values differ at {wrong[:5]}"
            assert r.committed == ends, f"{self.name}/{r.name}: committed {r.committed}, ends {ends}"
            assert r.longest_poll_s < HANG_S, f"{r.name}: a poll took {r.longest_poll_s:.1f} s"
            assert not r.commit_errors, f"{self.name}/{r.name}: commits failed: {r.commit_errors}"
        group = self.readers[0]
        assert group.stable and group.stable[-1][1], f"group reader not stable at the end: {group.stable}"
        self.delivered = delivered
        print(f"{self.name}: {len(delivered)} records, marks (s after the fault) "
              f"{ {k: round(v, 1) for k, v in self.marks.items()} }, longest polls "
              f"{ {r.name: round(r.longest_poll_s, 1) for r in self.readers} }, membership changes "
              f"{len(group.stable)}")

    def abort(self) -> None:
        self.writer._halt.set()
        for r in self.readers:
            r.stop.set()
        for r in self.readers:
            r.done.wait(30)
        self.writer.join(30)


@pytest.fixture
def scenario(cluster: KafkaCluster, revive, request):
    started: list[Scenario] = []

    def make(name: str) -> Scenario:
        s = Scenario(cluster, name)
        started.append(s)
        s.start()
        return s

    yield make
    for s in started:
        s.abort()


# -- the faults ------------------------------------------------------------------------------------

def leader_node(cluster: KafkaCluster, topic: str, partition: int = 0) -> int:
    node_id = leaders(cluster.bootstrap, topic)[partition]
    assert node_id in cluster.nodes, f"{topic}[{partition}] has no leader: {node_id}"
    return node_id


def restart_and_resume(s: Scenario, node_id: int) -> None:
    s.cluster.restart(node_id)
    t1 = time.monotonic()
    s.wait_all_resumed(t1, "after restart")
    s.wait_commit_after(t1, "commit after restart")


def test_leader_killed_and_restarted(cluster, scenario):
    s = scenario("kill")
    victim = leader_node(cluster, s.topic)
    led = {p for p, n in leaders(cluster.bootstrap, s.topic).items() if n == victim}
    t0 = time.monotonic()
    cluster.nodes[victim].kill()
    # wait_all_resumed fails past RESUME_BOUND_S: a liveness bound (did the readers come back at
    # all), not a measure of how fast: finish() prints the times (marks).
    s.wait_all_resumed(t0, "resume")
    moved = leaders(cluster.bootstrap, s.topic)
    assert all(moved[p] != victim for p in led), f"leaders did not move off node {victim}: {moved}"
    s.wait_commit_after(t0, "commit")
    restart_and_resume(s, victim)
    s.finish()


def test_leader_controlled_shutdown_and_restart(cluster, scenario):
    s = scenario("sigterm")
    victim = leader_node(cluster, s.topic)
    t0 = time.monotonic()
    cluster.nodes[victim].stop()
    stopped = time.monotonic() - t0
    s.wait_all_resumed(t0, "resume")
    s.wait_commit_after(t0, "commit")
    assert all(n != victim for n in leaders(cluster.bootstrap, s.topic).values())
    restart_and_resume(s, victim)
    s.finish()
    print(f"controlled shutdown took {stopped:.1f} s")


def test_reassignment_moves_every_leader(cluster, scenario):
    s = scenario("reassign")
    before = wait_full_isr(cluster.bootstrap, s.topic, REPLICAS)
    # The current leader goes last: every partition gets another preferred replica.
    plan = {p: [r for r in d["replicas"] if r != d["leader"]] + [d["leader"]] for p, d in before.items()}
    t0 = time.monotonic()
    reassign(cluster, s.topic, plan)
    elect_preferred(cluster.bootstrap, s.topic, list(plan))
    after = wait_partitions(cluster.bootstrap, s.topic,
                            lambda ps: all(ps[p]["leader"] == plan[p][0] for p in plan),
                            "every partition led by its new preferred replica")
    assert all(after[p]["leader"] != before[p]["leader"] for p in plan)
    s.wait_all_resumed(t0, "resume")
    s.wait_commit_after(t0, "commit")
    s.finish()


def test_group_coordinator_killed(cluster, scenario):
    s = scenario("coordinator")
    found = find_coordinators(cluster, [s.group, s.assign_group])
    assert found[s.group] == found[s.assign_group], f"one offsets partition, two coordinators: {found}"
    victim = found[s.group]
    t0 = time.monotonic()
    cluster.nodes[victim].kill()
    s.wait_commit_after(t0, "commit")
    s.wait_all_resumed(t0, "resume")
    new = find_coordinator(cluster, s.group)
    assert new != victim
    group = s.readers[0]
    wait_stable = t0 + RESUME_BOUND_S
    while not (group.stable and group.stable[-1][1]):
        s.check_readers()
        assert time.monotonic() < wait_stable, f"group reader not stable again: {group.stable}"
        time.sleep(0.1)
    restart_and_resume(s, victim)
    s.finish()
