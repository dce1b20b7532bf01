"""``kdaemon run`` under KIP-848's consumer group protocol on Apache Kafka 4.x: the daemon's side.

* ``test_auto_...``: ``group_protocol = "auto"`` (the default) asks the broker, which offers
  ConsumerGroupHeartbeat and has ``group.version`` finalized: every worker logs "consumer" and
  why, the coordinator describes a consumer group, and each record reaches the sink once.
* ``test_static_workers_...``: workers are static members (``group_instance_id`` "kd-<index>")
  under the consumer protocol.  A worker SIGKILLed and back within the session timeout gets its
  partitions back and the other worker sees no change (the successor first sends the -2 leave
  the killed worker could not: without it Kafka refuses the instance id until the old session
  expires, and moves the partitions away and back); TTIN moves one partition to the new worker
  and nothing else; TTOU gives the leaving worker's partition to one of the others; a SIGHUP
  roll replaces every worker and every instance keeps its partitions.  Every record is
  delivered; duplicates only where the killed worker had not committed.
* ``test_online_migration_...`` (Must show): a classic group of workers rolled one worker at a
  time (SIGHUP with ``group_protocol`` changed) to the consumer protocol, and back, while
  records are written: the coordinator converts the group both ways, and the sink holds every
  record exactly once — commits happen before a partition changes hands, in both protocols and
  in the mixed group in between.  On the way up each consumer-protocol successor makes its
  classic predecessor leave (LeaveGroup), which a classic static member never does itself.
* ``test_stopped_worker_...`` (Must show): a worker SIGSTOPped (holding records it delivered but
  had not committed) past the session timeout is fenced: the other worker takes its partitions
  and re-delivers those records; resumed, it loses its partitions without committing them
  (committed offsets never move back), logs the loss and rejoins.

What a worker holds is read from the coordinator (AdminClient's describe, per
``group_instance_id``), which is the truth under the consumer protocol; the supervisor's "has
its assignment" lines and the workers' own log lines say the rest.

The consumer protocol's session timeout and heartbeat interval are the group coordinator's
(``group.consumer.session.timeout.ms``, default 45 s): each daemon's group sets its own, 12 s
and 1 s, as group configs on the run's shared broker.  The test brokers name
``group.consumer.migration.policy`` = bidirectional (Kafka 4's default, named so the migration
test does not depend on a default: testkit/apache_kafka.py).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupType
from confluent_kafka.admin import AdminClient

from kdaemon.client import ConsumerConfig
from kdaemon.client.features import choose_group_protocol, probe
from kdaemon.protocol.apis import CONSUMER_GROUP_HEARTBEAT
from testkit.daemon import SESSION_TIMEOUT_MS, Daemon, daemon_config, wait_for
from testkit.group_configs import set_group_configs
from testkit.produce import committed_offsets as read_committed_offsets, create_topic, produce

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 4
SESSION_MS = 12_000
WAIT = 90.0


@pytest.fixture
def cluster(kafka):
    """The run's shared Kafka (online migration is Kafka 4's default policy, bidirectional); each
    daemon's group sets its session timeout ``SESSION_MS`` and 1-s heartbeat as group configs
    (``new_daemon``), instead of a broker of the module's own."""
    return kafka


# -- configuration and observation ----------------------------------------------------------------

def with_protocol(config: dict, protocol: str) -> dict:
    """``config`` with ``[kafka] group_protocol`` set; the classic-only options (which the
    consumer protocol leaves to the broker) only under classic."""
    kafka = dict(config["kafka"])
    kafka["group_protocol"] = protocol
    if protocol == "classic":
        kafka.update(session_timeout_ms=SESSION_TIMEOUT_MS, heartbeat_interval_ms=500)
    else:
        kafka.pop("session_timeout_ms", None)
        kafka.pop("heartbeat_interval_ms", None)
    return {**config, "kafka": kafka}


def new_daemon(root: Path, cluster, *, protocol: str | None, workers: int = 2, **daemon) -> tuple[Daemon, str, str]:
    tag = uuid.uuid4().hex[:8]
    topic, group = f"kd848-{tag}", f"kd848-{tag}"
    set_group_configs(cluster.bootstrap, group, {"consumer.session.timeout.ms": str(SESSION_MS),
                                                 "consumer.heartbeat.interval.ms": "1000"})
    create_topic(cluster.bootstrap, topic, partitions=PARTITIONS)
    config = daemon_config(root, cluster.bootstrap, topic, group, workers=workers,
                           heartbeat_timeout_s=60.0, metrics_interval_ms=200, **daemon)
    if protocol is not None:
        config = with_protocol(config, protocol)
    return Daemon(root, config), topic, group


def describe(bootstrap: str, group: str):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_consumer_groups([group])[group].result(timeout=30)


def held(bootstrap: str, group: str) -> dict[str, frozenset[int]]:
    """group_instance_id -> the partitions the coordinator says it holds."""
    return {m.group_instance_id: frozenset(tp.partition for tp in m.assignment.topic_partitions)
            for m in describe(bootstrap, group).members}


def settled(bootstrap: str, group: str, instances: set[str]) -> dict[str, frozenset[int]] | None:
    """The coordinator's assignment once exactly ``instances`` are members and hold every
    partition between them, disjointly and balanced as the uniform assignor leaves them (sizes
    within one); else None."""
    now = held(bootstrap, group)
    if set(now) != instances:
        return None
    parts = [p for ps in now.values() for p in ps]
    sizes = [len(ps) for ps in now.values()]
    return now if sorted(parts) == list(range(PARTITIONS)) and max(sizes) - min(sizes) <= 1 else None


def wait_settled(d: Daemon, bootstrap: str, group: str, instances: set[str], what: str) -> dict[str, frozenset[int]]:
    return wait_for(lambda: settled(bootstrap, group, instances), WAIT, what,
                    lambda: f"coordinator: {held(bootstrap, group)}\n{d.log_tail()}", interval=0.25)


def describe_member_id(bootstrap: str, group: str, instance: str) -> str:
    return next(m.member_id for m in describe(bootstrap, group).members if m.group_instance_id == instance)


# A worker's own account of a change in its assignment, a fence or a (re)join (ConsumerMembership's
# lines; its join is logged as the classic one is, "joined generation <member epoch>").
RECONCILED = re.compile(r"group \S+: (epoch -?\d+: revoked|fenced \(|joined generation)")


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return read_committed_offsets(bootstrap, group, topic, PARTITIONS)


def choices(d: Daemon, after: int = 0) -> list[tuple[int, str, str]]:
    """(worker index, protocol, why) for every group protocol a worker chose."""
    rx = re.compile(r"worker-(\d+) kdaemon\.worker\.main: worker \d+: group protocol (\w+) \((.*)\)")
    return [(int(m[1]), m[2], m[3]) for m in rx.finditer(d.log(), after)]


def worker_lines(d: Daemon, index: int, after: int = 0) -> list[str]:
    return [line for line in d.log()[after:].splitlines() if f" worker-{index} " in line]


class Feed(threading.Thread):
    """Writes ``chunk`` numbered records into every partition every ``pause`` seconds until
    stopped (bounded: ``max_chunks``); keeps each record's (partition, offset)."""

    def __init__(self, bootstrap: str, topic: str, *, chunk: int = 10, pause: float = 0.2,
                 max_chunks: int = 2000) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.chunk, self.pause, self.max_chunks = bootstrap, topic, chunk, pause, max_chunks
        self.positions: set[tuple[int, int]] = set()
        self.error: BaseException | None = None
        self._stop_event = threading.Event()
        self.chunks = 0

    def run(self) -> None:
        try:
            while not self._stop_event.is_set() and self.chunks < self.max_chunks:
                self.write_once()
                self._stop_event.wait(self.pause)
        except BaseException as exc:  # surfaced by finish()
            self.error = exc

    def write_once(self) -> set[tuple[int, int]]:
        new = set()
        for p in range(PARTITIONS):
            values = [{"key": str(p).encode(), "value": f"{self.chunks}-{p}-{i}".encode()}
                      for i in range(self.chunk)]
            for report in produce(self.bootstrap, self.topic, values, partition=p):
                new.add((report.partition, report.offset))
        self.positions = self.positions | new   # rebound, never changed in place: readers iterate it
        self.chunks += 1
        return new

    def finish(self) -> set[tuple[int, int]]:
        self._stop_event.set()
        self.join(60)
        assert not self.is_alive(), "the feed did not stop within 60 s"
        if self.error is not None:
            raise self.error
        return self.positions


def ends_of(positions: set[tuple[int, int]]) -> dict[int, int]:
    return {p: max(o for q, o in positions if q == p) + 1 for p in range(PARTITIONS)}


def delivered(d: Daemon) -> Counter:
    return Counter((r["partition"], r["offset"]) for r in d.output())


def wait_delivered(d: Daemon, positions: set[tuple[int, int]], what: str) -> None:
    wait_for(lambda: positions <= set(delivered(d)), WAIT, what, d.log_tail, interval=0.25)


def wait_committed(d: Daemon, bootstrap: str, group: str, topic: str, ends: dict[int, int], what: str) -> None:
    seen: dict[int, int] = {}

    def done():
        seen.update(committed(bootstrap, group, topic))
        return seen == ends
    wait_for(done, WAIT, what, lambda: f"committed {seen}, ends {ends}\n{d.log_tail()}", interval=0.5)


# -- auto ------------------------------------------------------------------------------------------

def test_auto_picks_the_consumer_protocol_on_kafka_4(cluster, tmp_path):
    features = probe(ConsumerConfig(bootstrap_servers=cluster.bootstrap), timeout_ms=15_000)
    lo, hi = cluster.offered[CONSUMER_GROUP_HEARTBEAT.key]   # from the harness's own v0 probe
    assert features.level("group.version") >= 1, features.finalized
    choice = choose_group_protocol(features)
    assert (choice.protocol, choice.reason) == (
        "consumer", f"broker offers ConsumerGroupHeartbeat v{lo}-{hi} and group.version={features.level('group.version')}")

    d, topic, group = new_daemon(tmp_path, cluster, protocol=None)
    assert "group_protocol" not in d.config["kafka"] and "session_timeout_ms" in d.config["kafka"]
    with d:
        d.wait_all_ready(timeout=60)
        got = choices(d)
        assert sorted(got) == [(i, "consumer", f'group_protocol = "auto": {choice.reason}, asked {cluster.bootstrap}')
                               for i in (0, 1)], d.log_tail()
        # The harness's classic settings are dropped, and said so, rather than refused.
        assert d.count("session_timeout_ms, heartbeat_interval_ms not used under the consumer protocol") == 2
        desc = describe(cluster.bootstrap, group)
        assert desc.type == ConsumerGroupType.CONSUMER, desc
        assert {m.group_instance_id for m in desc.members} == {"kd-0", "kd-1"}
        feed = Feed(cluster.bootstrap, topic)
        for _ in range(5):
            feed.write_once()
        wait_delivered(d, feed.positions, "every record in the sink")
        wait_committed(d, cluster.bootstrap, group, topic, ends_of(feed.positions), "the ends committed")
        assert d.stop(timeout=60) == 0, d.log_tail()
        seen = delivered(d)
    assert set(seen) == feed.positions and max(seen.values()) == 1


# -- static members: kill, TTIN/TTOU, SIGHUP roll ----------------------------------------------------

def test_static_workers_keep_their_partitions_through_kill_resize_and_roll(cluster, tmp_path):
    d, topic, group = new_daemon(tmp_path, cluster, protocol="consumer")
    feed = Feed(cluster.bootstrap, topic)
    with d:
        d.wait_all_ready(timeout=60)
        before = wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, "two workers holding everything")
        assert all(len(ps) == 2 for ps in before.values()), before
        feed.start()
        wait_for(lambda: len(feed.positions) >= 200 and feed.positions <= set(delivered(d)), WAIT,
                 "the first records in the sink", d.log_tail)

        # 1. SIGKILL worker 1: its replacement takes its place (same instance id) within the
        # session timeout; worker 0 keeps its process and sees no change at all.
        workers = d.workers()
        dead_member_id = describe_member_id(cluster.bootstrap, group, "kd-1")
        mark = len(d.log())
        committed_at_kill = committed(cluster.bootstrap, group, topic)
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.monotonic()
        new_pid = wait_for(lambda: (d.workers().get(1) not in (None, workers[1])) and d.workers()[1], 30,
                           "a new worker 1", d.log_tail)
        d.wait_log(rf"worker 1 \(pid {new_pid}\) has its assignment", WAIT, after=mark)
        back_at = time.monotonic()
        assert back_at - killed_at < SESSION_MS / 1000, f"the restart took {back_at - killed_at:.1f} s"
        # Past the killed incarnation's session: had the broker expired it, it would have by now.
        time.sleep(max(0.0, killed_at + SESSION_MS / 1000 + 3 - time.monotonic()))
        assert held(cluster.bootstrap, group) == before
        assert d.workers()[0] == workers[0]
        # Only the replacement (re)got partitions, and exactly worker 1's.
        assert {r["index"] for r in d.ready_lines(mark)} == {1}, d.ready_lines(mark)
        assert d.ready_lines(mark)[-1]["partitions"] == sorted(f"{topic}-{p}" for p in before["kd-1"])
        moved = [line for line in worker_lines(d, 0, mark) if RECONCILED.search(line)]
        assert moved == [], "worker 0 saw its assignment change:\n" + "\n".join(moved)
        # The successor released the dead worker's static membership, then took it over.
        released = re.search(r"worker-1 \S+: worker 1: consumer static membership kd-1 of its predecessor (\S+) "
                             r"released \(epoch -2\): (\w+)", d.log()[mark:])
        assert released is not None and released[2] == "released", d.log_tail()
        assert released[1] == dead_member_id

        # 2. TTIN: a third worker takes one partition from one of the two; nothing else moves.
        mark = len(d.log())
        d.signal(signal.SIGTTIN)
        grown = wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1", "kd-2"}, "three workers")
        assert len(grown["kd-2"]) == 1, grown
        for name in ("kd-0", "kd-1"):
            assert grown[name] <= before[name], (grown, before)
        d.wait_log(r"worker 2 \(pid \d+\) has its assignment", WAIT, after=mark)

        # 3. TTOU: worker 2 goes for good: it leaves with epoch -1 (not the -2 of a static
        # member coming back), so its partition returns to one of the others at once, not after
        # the session timeout; the others keep theirs.
        mark = len(d.log())
        d.signal(signal.SIGTTOU)
        ttou_at = time.monotonic()
        shrunk = wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, "two workers again")
        moved_after = time.monotonic() - ttou_at
        for name in ("kd-0", "kd-1"):
            assert grown[name] <= shrunk[name], (shrunk, grown)
        assert re.search(r"worker-2 \S+: group \S+: leaving with epoch -1 ", d.log()[mark:]), d.log_tail()
        # wait_settled includes its quiet period; a -2 leave would have kept the partition
        # unowned for the whole session timeout (12 s) before it moved.
        assert moved_after < SESSION_MS / 1000, f"TTOU took {moved_after:.1f} s to settle"

        # 4. SIGHUP roll (a changed setting): every worker replaced, one at a time; every
        # instance ends with what it held.
        pids = d.workers()
        mark = len(d.log())
        d.write_config({**d.config, "daemon": {**d.config["daemon"], "flush_interval_ms": 300}})
        d.signal(signal.SIGHUP)
        wait_for(lambda: set(d.workers()) == {0, 1} and not (set(d.workers().values()) & set(pids.values())),
                 WAIT, "both workers replaced", d.log_tail)
        d.wait_all_ready(timeout=WAIT, after=mark)
        assert wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, "after the roll") == shrunk

        produced = feed.finish()
        wait_delivered(d, produced, "every record in the sink")
        wait_committed(d, cluster.bootstrap, group, topic, ends_of(produced), "the ends committed")
        assert d.stop(timeout=60) == 0, d.log_tail()
        seen = delivered(d)

    assert set(seen) == produced
    repeated = {k for k, n in seen.items() if n > 1}
    # Only the killed worker's uncommitted records may come twice.
    assert {p for p, _ in repeated} <= before["kd-1"], sorted(repeated)[:20]
    assert not [(p, o) for p, o in repeated if o < committed_at_kill[p]], "committed records delivered again"


# -- online migration -------------------------------------------------------------------------------

def test_online_migration_classic_to_consumer_and_back_loses_and_repeats_nothing(cluster, tmp_path):
    d, topic, group = new_daemon(tmp_path, cluster, protocol="classic")
    feed = Feed(cluster.bootstrap, topic)
    types = []

    def roll_to(protocol: str, expected_type) -> None:
        pids = d.workers()
        mark = len(d.log())
        d.write_config(with_protocol(d.config, protocol))
        d.signal(signal.SIGHUP)
        d.wait_log(r"reloading .*: rolling 2 worker\(s\) one at a time", 30, after=mark)
        wait_for(lambda: set(d.workers()) == {0, 1} and not (set(d.workers().values()) & set(pids.values())),
                 WAIT, f"both workers replaced ({protocol})", d.log_tail)
        d.wait_all_ready(timeout=WAIT, after=mark)
        assert sorted((i, p) for i, p, _ in choices(d, mark)) == [(0, protocol), (1, protocol)], d.log_tail()
        if protocol == "consumer":
            # Each successor first made its classic predecessor leave (a classic static member
            # never does, and Kafka refuses its instance id to a consumer-protocol member until then).
            left = re.findall(r"worker (\d): classic static membership kd-\d of its predecessor \S+ "
                              r"left \(LeaveGroup\): (\w+)", d.log()[mark:])
            assert sorted(left) == [("0", "left"), ("1", "left")], d.log_tail()
        wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, f"the group settled on {protocol}")
        wait_for(lambda: describe(cluster.bootstrap, group).type == expected_type, WAIT,
                 f"the coordinator converting the group to {expected_type}", d.log_tail)
        types.append(describe(cluster.bootstrap, group).type)
        # Records keep flowing after the roll.
        fresh = set(feed.positions)
        wait_for(lambda: len(feed.positions) > len(fresh) + 100, 30, "the feed going on")
        wait_delivered(d, set(feed.positions), f"records written after the roll to {protocol}")

    with d:
        d.wait_all_ready(timeout=60)
        wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, "a classic group")
        types.append(describe(cluster.bootstrap, group).type)
        feed.start()
        wait_for(lambda: len(feed.positions) >= 200 and feed.positions <= set(delivered(d)), WAIT,
                 "the first records in the sink", d.log_tail)
        roll_to("consumer", ConsumerGroupType.CONSUMER)
        roll_to("classic", ConsumerGroupType.CLASSIC)
        produced = feed.finish()
        wait_delivered(d, produced, "every record in the sink")
        wait_committed(d, cluster.bootstrap, group, topic, ends_of(produced), "the ends committed")
        assert d.stop(timeout=60) == 0, d.log_tail()
        seen = delivered(d)

    assert types == [ConsumerGroupType.CLASSIC, ConsumerGroupType.CONSUMER, ConsumerGroupType.CLASSIC]
    missing = produced - set(seen)
    repeated = sorted(k for k, n in seen.items() if n > 1)
    assert not missing and not repeated and set(seen) == produced, (
        f"{len(missing)} lost (e.g. {sorted(missing)[:5]}), {len(repeated)} repeated (e.g. {repeated[:5]}) "
        f"of {len(produced)}")
    print(f"migration: {len(produced)} records, each delivered once, through classic -> consumer -> classic")


# -- fencing ----------------------------------------------------------------------------------------

def delivered_by_partition(d: Daemon, topic: str) -> dict[int, float]:
    """Records the sink accepted, per partition, all workers together (kdaemon_records_delivered_total)."""
    out = {}
    for (name, labels), value in d.metrics().items():
        tags = dict(labels)
        if name == "kdaemon_records_delivered_total" and tags.get("topic") == topic:
            out[int(tags["partition"])] = value
    return out


def test_stopped_worker_is_fenced_loses_its_partitions_without_committing_and_rejoins(cluster, tmp_path):
    # A long flush interval: a worker holds delivered, uncommitted records for seconds, so the
    # stop can catch worker 1 with some (judged from /metrics and the committed offsets).
    d, topic, group = new_daemon(tmp_path, cluster, protocol="consumer", flush_interval_ms=4000)
    feed = Feed(cluster.bootstrap, topic)
    with d:
        d.wait_all_ready(timeout=60)
        before = wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, "two workers")
        mine = sorted(before["kd-1"])
        feed.write_once()
        wait_committed(d, cluster.bootstrap, group, topic, ends_of(feed.positions), "the first records committed")

        # Catch worker 1 between delivering and committing: the sink accepted every record of
        # its partitions (a fresh topic, nothing delivered twice yet: the count is the end
        # offset), their committed offsets are behind.
        pid = d.workers()[1]
        for attempt in range(10):
            feed.write_once()
            ends = ends_of(feed.positions)

            def read_not_committed():
                accepted = delivered_by_partition(d, topic)
                return all(accepted.get(p) == ends[p] for p in mine) and \
                    all(committed(cluster.bootstrap, group, topic)[p] < ends[p] for p in mine)
            try:
                wait_for(read_not_committed, 3.5, "worker 1 holding uncommitted records", interval=0.05)
            except AssertionError:
                wait_committed(d, cluster.bootstrap, group, topic, ends, "a flush in between, committed")
                continue
            os.kill(pid, signal.SIGSTOP)
            break
        else:
            pytest.fail("never caught worker 1 holding uncommitted records")
        stopped_at = time.monotonic()
        at_stop = committed(cluster.bootstrap, group, topic)
        held_back = {p: (at_stop[p], ends[p]) for p in mine}   # what worker 1 holds uncommitted
        assert all(lo < hi for lo, hi in held_back.values()), held_back

        # Fenced after the session timeout: worker 0 takes everything, re-delivers what worker 1
        # had not committed, commits it, and goes on past it.
        only_0 = wait_for(lambda: settled(cluster.bootstrap, group, {"kd-0"}), SESSION_MS / 1000 + WAIT,
                          "worker 0 holding every partition", d.log_tail, interval=0.25)
        assert time.monotonic() - stopped_at >= SESSION_MS / 1000 * 0.9
        assert only_0 == {"kd-0": frozenset(range(PARTITIONS))}
        feed.write_once()
        later = ends_of(feed.positions)
        wait_committed(d, cluster.bootstrap, group, topic, later, "worker 0 committing past worker 1's records")

        # Resumed: worker 1 learns it was fenced, drops its partitions uncommitted and rejoins.
        mark = len(d.log())
        watched: list[dict[int, int]] = []
        watching = threading.Event()

        def watch():
            while not watching.is_set():
                watched.append(committed(cluster.bootstrap, group, topic))
                watching.wait(0.2)
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        os.kill(pid, signal.SIGCONT)
        try:
            d.wait_log(r"worker-1 kdaemon\.client\.group\.coordinator: group \S+: joined generation", WAIT,
                       after=mark)
            wait_settled(d, cluster.bootstrap, group, {"kd-0", "kd-1"}, "worker 1 back in the group")
            feed.write_once()
            final = ends_of(feed.positions)
            wait_delivered(d, feed.positions, "every record in the sink")
            wait_committed(d, cluster.bootstrap, group, topic, final, "the ends committed")
        finally:
            watching.set()
            watcher.join(10)
        assert d.workers()[1] == pid, "worker 1 was replaced instead of resumed"
        # No commit of worker 1's stale positions ever landed: the committed offsets only grew.
        for a, b in zip(watched, watched[1:]):
            assert all(b[p] >= a[p] for p in range(PARTITIONS)), (a, b)
        assert all(w[p] >= later[p] for w in watched for p in range(PARTITIONS)), (later, watched[:3])
        resumed = worker_lines(d, 1, mark)
        assert any(re.search(r"fenced \((FENCED_MEMBER_EPOCH|UNKNOWN_MEMBER_ID).*partitions are lost", line)
                   for line in resumed), "\n".join(resumed)
        assert any("joined generation" in line for line in resumed), "\n".join(resumed)
        # It sent no commit with its stale positions at all: before committing, a member whose
        # heartbeats went unanswered for two intervals asks the coordinator first, and the answer
        # (the fence) takes its partitions away before the commit would go out.  A commit the
        # coordinator refused would log the error code it answered.
        refused = [line for line in resumed
                   if re.search(r"UNKNOWN_MEMBER_ID|FENCED_MEMBER_EPOCH|STALE_MEMBER_EPOCH|ILLEGAL_GENERATION", line)
                   and "commit" in line.lower()]
        assert refused == [], "\n".join(resumed)
        asked = any("asking the coordinator before committing" in line for line in resumed)
        print(f"worker 1 after the resume: {'asked the coordinator before a commit' if asked else 'no commit was due before the heartbeat heard of the fence'}")
        assert d.stop(timeout=60) == 0, d.log_tail()
        seen = delivered(d)

    assert set(seen) == feed.positions
    repeated = {k for k, n in seen.items() if n > 1}
    # Duplicates only in worker 1's partitions, from what it had not committed when it was
    # stopped on (what it held, and what it may have fetched before it heard it was fenced);
    # never a record it had committed.
    assert all(p in held_back and o >= held_back[p][0] for p, o in repeated), (held_back, sorted(repeated)[:20])
    assert {(p, o) for p, (lo, hi) in held_back.items() for o in range(lo, hi)} <= set(seen)
