"""KIP-848 consumer groups on Apache Kafka 4.x: kdaemon, the Java consumer and librdkafka in one
group, all with ``group.protocol=consumer`` (the broker assigns; members heartbeat with
ConsumerGroupHeartbeat and move partitions incrementally).

* ``test_mixed_group_...``: kdaemon members (processes, so one can be SIGKILLed), a Java member
  and a librdkafka member share a topic while a numbered stream is written to it; members join,
  one leaves (close), two are killed.  At every settled point the members' assignments are
  disjoint and complete and are what the coordinator describes; at no instant do two members
  hold one partition (judged from the listener calls, each stamped with the same monotonic
  clock); each kdaemon member's member epochs only grow, and what ``group_state()`` reports at a
  stable epoch is what its listener calls add up to.  Every member commits after processing, as a
  Java application does, so exactly once means: nothing lost, nothing outside the stream, and
  the duplicates are the records a killed member processed and had not committed, each read
  twice: all of them but those of a last poll whose commit was sent and not answered (it may
  have landed), and nothing else.  One member is killed while stopped between printing a poll's
  records and committing them (so that set is exact), one while running.
* ``test_fenced_member_...``: a kdaemon member stopped (SIGSTOP) between processing records and
  committing them, past the session timeout: its partitions go to the other member, which
  re-reads the uncommitted records; resumed, its commit fails, ``on_partitions_lost`` runs (not
  revoked), it heartbeats at epoch 0 and gets partitions again.
* ``test_broker_side_regex_...``: a kdaemon member and a Java member (``SubscriptionPattern``) in
  one group subscribe with one RE2J expression, which the broker matches against whole topic
  names, including a topic created later.

Under the consumer protocol the session timeout and heartbeat interval are the group
coordinator's (``group.consumer.session.timeout.ms``, default 45 s): each group here sets its
own (the group configs ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms``)
to 6 s and 500 ms on the run's shared broker, so a killed or stopped member is fenced within
seconds.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient

from testkit.group_members import (TP, JavaMember, KdMember, KdProcessMember, RdMember, all_partitions,
                                       group_log, split_is_complete, wait_until)
from testkit.group_configs import set_group_configs
from testkit.produce import Writer, create_topic, produce

pytestmark = pytest.mark.kafka

WAIT = 90.0
SESSION_MS = 6000
FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID = 110, 25
# librdkafka speaks group.protocol=consumer (GA) from 2.12.0.
RD_CONSUMER_PROTOCOL = 0x020C0000


@pytest.fixture
def kip848(kafka):
    """The run's shared Kafka: this module's short group timings are set per group (``_group``),
    as Kafka 4 allows, instead of on a broker of the module's own (a start of 12 s, and the
    module one scheduling unit)."""
    return kafka


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _group(bootstrap: str, prefix: str) -> str:
    """A new group's name, its session timeout ``SESSION_MS`` and heartbeat interval 500 ms set
    first (group configs: IncrementalAlterConfigs on the GROUP resource)."""
    group = _name(prefix)
    set_group_configs(bootstrap, group, {"consumer.session.timeout.ms": str(SESSION_MS),
                                         "consumer.heartbeat.interval.ms": "500"})
    return group


class _Stream(threading.Thread):
    """Numbered records to every partition in turn, at a modest rate, until ``finish()``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float = 150.0) -> None:
        super().__init__(name="stream", daemon=True)
        self.writer = Writer(bootstrap, topic, **{"linger.ms": 5})
        self.partitions, self.rate = partitions, rate
        self._done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started, i = time.monotonic(), 0
            while not self._done.is_set():
                self.writer.send(str(i).encode(), partition=i % self.partitions)
                i += 1
                self.writer.poll(0)
                ahead = i / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._done.wait(ahead)
            self.writer.flush_checked()
        except BaseException as exc:  # re-raised by finish()
            self.error = exc

    def finish(self) -> set[tuple[str, int, int]]:
        """Stop writing; every record written, as (topic, partition, offset)."""
        self._done.set()
        self.join(60)
        assert not self.is_alive(), "the producer did not finish within 60 s"
        if self.error is not None:
            raise self.error
        w = self.writer
        assert w.counts == w.ends, f"a fresh topic's offsets are contiguous: counts {w.counts}, ends {w.ends}"
        return {(w.topic, p, o) for p, end in w.ends.items() for o in range(end)}


def _described(bootstrap: str, group: str) -> dict[str, frozenset[TP]]:
    """client id -> assignment, as the coordinator describes the consumer group."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return {m.client_id: frozenset((tp.topic, tp.partition) for tp in m.assignment.topic_partitions)
            for m in desc.members}


def _settle(bootstrap: str, group: str, live: list, everything: frozenset[TP], what: str, cluster) -> None:
    """Wait until the live members' assignments are disjoint and complete, every kdaemon member is
    stable, and the coordinator describes exactly these members holding exactly these sets."""
    def kd_stable() -> bool:
        return all(m.epochs and m.epochs[-1][2] and m.epochs[-1][3] == m.assignment()
                   for m in live if isinstance(m, KdProcessMember))

    def broker_agrees() -> bool:
        return _described(bootstrap, group) == {m.name: m.assignment() for m in live}

    wait_until(lambda: split_is_complete(live, everything) and kd_stable() and broker_agrees(), WAIT,
               f"a settled group: {what}", live, also=lambda: group_log(cluster, group))


def _intervals(member, end: float | None, lost_at: float | None) -> dict[TP, list[tuple[float, float]]]:
    """When the member held each partition, from its stamped listener calls; what it still held
    ends at ``end`` (a kill) or stays open.  A member that was stopped learns only when it runs
    again that it lost its partitions, long after the coordinator gave them away: with
    ``lost_at`` (when it stopped) what it lost counts as released then."""
    held: dict[TP, float] = {}
    out: dict[TP, list[tuple[float, float]]] = {}
    for t, kind, parts in sorted(member.log.stamped, key=lambda e: e[0]):
        for tp in parts:
            if kind == "assigned":
                assert tp not in held, f"{member.name} was assigned {tp} twice without giving it up"
                held[tp] = t
            else:
                assert tp in held, f"{member.name}: {kind} {tp}, which it did not hold"
                since = held.pop(tp)
                out.setdefault(tp, []).append((since, lost_at if kind == "lost" and lost_at is not None else t))
    for tp, t in held.items():
        out.setdefault(tp, []).append((t, float("inf") if end is None else end))
    return out


def _assert_never_shared(members) -> None:
    """No partition held by two members at any instant."""
    by_tp: dict[TP, list[tuple[float, float, str]]] = {}
    for m in members:
        for tp, spans in _intervals(m, getattr(m, "ended_at", None), getattr(m, "stalled_at", None)).items():
            by_tp.setdefault(tp, []).extend((a, b, m.name) for a, b in spans)
    for tp, spans in by_tp.items():
        spans.sort()
        for (a1, b1, n1), (a2, b2, n2) in zip(spans, spans[1:]):
            assert b1 <= a2, f"{tp} held by {n1} until {b1:.3f} and by {n2} from {a2:.3f}"


def _uncommitted(m: KdProcessMember) -> tuple[set, set]:
    """A member's processed records past its last confirmed commit of each partition, and the
    records of its last poll if it printed no commit outcome after them."""
    confirmed: dict[TP, int] = {}
    for offsets in m.commits:
        confirmed.update(offsets)
    uncommitted = {r for r in m.records if r[2] >= confirmed.get((r[0], r[1]), 0)}
    last = next((o for o in reversed(m.lines) if o["event"] in ("records", "committed", "commit_failed")), None)
    in_flight = {tuple(r) for r in last["records"]} if last is not None and last["event"] == "records" else set()
    return uncommitted, in_flight


def _assert_epochs(m: KdProcessMember) -> None:
    """A kdaemon member's epochs grow, and at a stable epoch its assignment is what its listener
    calls add up to (the member's printed lines are in the order they happened)."""
    owned: set[TP] = set()
    last = 0
    stable_seen = 0
    for o in m.lines:
        kind = o["event"]
        if kind in ("assigned", "revoked", "lost"):
            parts = {tuple(tp) for tp in o["partitions"]}
            owned = owned | parts if kind == "assigned" else owned - parts
        elif kind == "epoch" and o["epoch"] > 0:
            assert o["epoch"] >= last, f"{m.name}: member epoch went from {last} to {o['epoch']}"
            last = o["epoch"]
            if o["stable"]:
                stable_seen += 1
                assert {tuple(tp) for tp in o["assignment"]} == owned, \
                    f"{m.name} at epoch {o['epoch']}: group_state says {o['assignment']}, the listener {owned}"
    assert stable_seen, f"{m.name} never reported a stable epoch"


def test_librdkafka_speaks_the_consumer_protocol():
    version, number = confluent_kafka.libversion()
    assert number >= RD_CONSUMER_PROTOCOL, f"librdkafka {version} predates group.protocol=consumer (2.12)"


def test_mixed_group_disjoint_complete_and_exactly_once(kip848, tmp_path):
    bootstrap = kip848.bootstrap
    topic, group = _name("kip848-mixed"), _group(bootstrap, "g")
    n = 6
    create_topic(bootstrap, topic, n)
    everything = all_partitions(topic, n)
    common = dict(group_protocol="consumer", assignor=None, commit=True)

    def kd(tag: str, **kw) -> KdProcessMember:
        return KdProcessMember(bootstrap, group, topics=[topic], name=_name(f"kd-{tag}"), **common, **kw)

    kd_a = kd("a", stall_file=str(tmp_path / "stall-a"))
    java = JavaMember(bootstrap, group, topics=[topic], name=_name("java"), **common)
    rd = RdMember(bootstrap, group, topics=[topic], name=_name("rd"), **common)
    everyone = [kd_a, java, rd]
    live = list(everyone)
    stream = _Stream(bootstrap, topic, n)
    try:
        _settle(bootstrap, group, live, everything, "kdaemon, Java and librdkafka", kip848)
        stream.start()
        wait_until(lambda: all(m.records for m in live), WAIT, "every member to read records", live)

        kd_b = kd("b")                                   # joins
        everyone.append(kd_b)
        live.append(kd_b)
        _settle(bootstrap, group, live, everything, "kdaemon b joined", kip848)
        wait_until(lambda: kd_a.commits and kd_b.records, WAIT, "kdaemon a to commit and b to read", live)

        # Killed between processing records and committing them (it stops itself there first,
        # so the test knows exactly which records it processed and never committed).
        kd_a.stall()
        wait_until(lambda: kd_a.stalled is not None and kd_a.is_stopped(), WAIT,
                   "kdaemon a to stop before a commit", live)
        kd_a.kill()                                      # killed: no leave, no last commit
        live.remove(kd_a)
        _settle(bootstrap, group, live, everything, "kdaemon a killed", kip848)

        java.stop()                                      # leaves: revokes (committing), closes
        live.remove(java)
        _settle(bootstrap, group, live, everything, "Java left", kip848)

        kd_c = kd("c")                                   # joins a group that lost two members
        everyone.append(kd_c)
        live.append(kd_c)
        _settle(bootstrap, group, live, everything, "kdaemon c joined", kip848)
        wait_until(lambda: kd_c.commits, WAIT, "kdaemon c to read and commit records", live)

        kd_c.kill()                                      # killed while running, wherever it was
        live.remove(kd_c)
        _settle(bootstrap, group, live, everything, "kdaemon c killed", kip848)

        written = stream.finish()
        seen = lambda: Counter(r for m in everyone for r in m.records)  # noqa: E731
        wait_until(lambda: set(seen()) >= written, WAIT, "every record written to be read", live)
        _settle(bootstrap, group, live, everything, "at the end", kip848)
        counts = seen()

        assert set(counts) == written, f"records outside the stream: {sorted(set(counts) - written)[:10]}"
        # The killed members: what each processed past its last confirmed commit per partition,
        # and of that what its last poll returned when no commit answer came (the commit may or
        # may not have reached the coordinator).  a stopped before committing its last poll.
        uncommitted, in_flight = {}, {}
        for m in (kd_a, kd_c):
            assert not m.commit_failures, m.commit_failures
            uncommitted[m.name], in_flight[m.name] = _uncommitted(m)
        assert kd_a.stalled and uncommitted[kd_a.name] == in_flight[kd_a.name] == set(kd_a.stalled), \
            (sorted(uncommitted[kd_a.name])[:10], kd_a.stalled[:10])
        may = set().union(*uncommitted.values())
        must = set().union(*(uncommitted[k] - in_flight[k] for k in uncommitted)) | set(kd_a.stalled)
        duplicates = {r for r, k in counts.items() if k > 1}
        assert must <= duplicates <= may, (f"read twice beyond the killed members' uncommitted records: "
                                           f"{sorted(duplicates - may)[:10]}; uncommitted and not "
                                           f"re-read: {sorted(must - duplicates)[:10]}")
        for r in duplicates:
            readers = [m.name for m in everyone if r in set(m.records)]
            killed = [name for name in readers if r in uncommitted.get(name, ())]
            assert counts[r] == 2 and len(readers) == 2 and len(killed) == 1, (r, readers, counts[r])
        assert len(written) > 1000, f"only {len(written)} records were written"
        print(f"{len(written)} records; {len(duplicates)} read twice, of the killed members' uncommitted "
              f"{ {k: len(v) for k, v in uncommitted.items()} } (in flight {[len(v) for v in in_flight.values()]}); "
              f"listener calls: " + ", ".join(f"{m.name} {len(m.events)}" for m in everyone))

        _assert_never_shared(everyone)
        for m in (kd_a, kd_b, kd_c):
            _assert_epochs(m)
        assert not [e for e in rd.events if e[0] == "lost"], rd.events
        assert not [e for e in java.events if e[0] == "lost"], java.events
    finally:
        if stream.is_alive():
            stream.finish()
        for m in everyone:
            try:
                m.stop()
            except Exception:  # noqa: BLE001 — stopping the rest matters more; the test already reported
                pass


def test_fenced_member_loses_without_committing_and_rejoins_at_epoch_0(kip848, tmp_path):
    bootstrap = kip848.bootstrap
    topic, group = _name("kip848-fence"), _group(bootstrap, "g")
    n = 4
    create_topic(bootstrap, topic, n)
    everything = all_partitions(topic, n)
    common = dict(group_protocol="consumer", assignor=None, commit=True)
    staller = KdProcessMember(bootstrap, group, topics=[topic], name=_name("kd-stall"),
                              stall_file=str(tmp_path / "stall"), **common)
    other = KdProcessMember(bootstrap, group, topics=[topic], name=_name("kd-other"), **common)
    members = [staller, other]
    written: set[tuple[str, int, int]] = set()

    def write(per_partition: int) -> None:
        for p in range(n):
            for d in produce(bootstrap, topic, [(None, f"{p}-{i}".encode()) for i in range(per_partition)],
                             partition=p):
                written.add((d.topic, d.partition, d.offset))

    def committed_to(m, ends) -> bool:
        done: dict[TP, int] = {}
        for offsets in m.commits:
            done.update(offsets)
        return all(done.get(tp, 0) >= end for tp, end in ends.items())

    try:
        _settle(bootstrap, group, members, everything, "two kdaemon members", kip848)
        write(10)
        wait_until(lambda: all(committed_to(m, {tp: 10 for tp in m.assignment()}) for m in members), WAIT,
                   "the first records read and committed", members)
        mine = staller.assignment()

        staller.stall()
        write(10)
        wait_until(lambda: staller.stalled is not None and staller.is_stopped(), WAIT,
                   "the member to stop itself before committing", members)
        stalled = set(staller.stalled)
        assert stalled and {(t, p) for t, p, _ in stalled} <= mine
        # Past the session timeout the coordinator fences it and the other member takes over,
        # from the last commit: it re-reads what the stopped member processed.
        wait_until(lambda: other.assignment() == everything, WAIT, "the other member to take every partition",
                   [other], also=lambda: group_log(kip848, group))
        wait_until(lambda: stalled <= set(other.records), WAIT, "the stopped member's records re-read", [other])

        mark = len(staller.lines)
        staller.resume()
        wait_until(lambda: any(o["event"] == "lost" for o in staller.lines[mark:]), WAIT,
                   "on_partitions_lost after resuming", members)
        _settle(bootstrap, group, members, everything, "the fenced member back", kip848)
        after = staller.lines[mark:]
        kinds = [o["event"] for o in after]
        # Its commit of the stalled records failed, and nothing of those partitions was committed.
        assert staller.commit_failures, f"the fenced member's commit did not fail: {after[:8]}"
        kind, error, offsets = staller.commit_failures[0]
        assert offsets == {(t, p): max(o for t2, p2, o in stalled if (t2, p2) == (t, p)) + 1
                           for t, p, _ in stalled}, (offsets, sorted(stalled))
        assert any(word in f"{kind} {error}".upper() for word in
                   ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID", "FENCED", "UNKNOWN MEMBER")), (kind, error)
        assert kinds.index("commit_failed") < kinds.index("lost")
        assert "committed" not in kinds[:kinds.index("lost")], f"the fenced member committed: {after}"
        lost = next(o for o in after if o["event"] == "lost")
        assert {tuple(tp) for tp in lost["partitions"]} == mine, (lost, mine)
        assert "revoked" not in kinds[:kinds.index("lost")], after
        # On the wire: the coordinator answered a heartbeat with a fencing error, then the
        # member joined again at epoch 0.
        beats = [tuple(o["what"]) for o in after if o["event"] == "heartbeat"]
        fenced_at = next((i for i, b in enumerate(beats) if b[0] == "answer"
                          and b[1] in (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID)), None)
        assert fenced_at is not None, f"no fencing error on a heartbeat answer: {beats}"
        assert ("sent", 0) in beats[fenced_at:], f"no rejoin at epoch 0 after the fencing: {beats}"
        assert staller.epochs[-1][0] > 0 and staller.assignment(), staller.epochs[-3:]

        # Back in the group it reads again, from the other member's commits: exactly once apart
        # from the stalled records.
        mark_records = len(staller.records)
        write(5)
        wait_until(lambda: written <= set(staller.records) | set(other.records), WAIT, "the last records read",
                   members)
        assert staller.records[mark_records:], "the rejoined member read nothing"
        counts = Counter(staller.records + other.records)
        assert set(counts) == written
        # Duplicates: the stalled records, and whatever else the fenced member processed before it
        # saw it was fenced (a poll answered from records fetched earlier) whose commit failed too.
        failed, polled = set(), []
        for o in after:
            if o["event"] == "records":
                polled = [tuple(r) for r in o["records"]]
            elif o["event"] == "commit_failed":
                failed |= set(polled)
        duplicates = {r for r, k in counts.items() if k > 1}
        assert stalled <= duplicates <= stalled | failed, (sorted(duplicates - stalled)[:10], sorted(failed)[:10])
        _assert_never_shared(members)
        print(f"stalled with {len(stalled)} records of {sorted(mine)}; commit: {kind}: {error}; "
              f"heartbeats after resuming: {beats}")
    finally:
        for m in members:
            m.stop()


def test_broker_side_regex_matches_whole_topic_names_for_kdaemon_and_java(kip848):
    bootstrap = kip848.bootstrap
    base = uuid.uuid4().hex[:8]
    regex = f"{base}-(ab?|n[0-9])"
    for t in (f"{base}-a", f"{base}-ab", f"{base}-abc", f"x{base}-ab", f"{base}-c", f"{base}-n12"):
        create_topic(bootstrap, t, 2)
    # Whole names only: "-abc" and "-n12" start with a match and "x...-ab" contains one.
    matching = {f"{base}-a", f"{base}-ab"}
    group = _group(bootstrap, "g-regex")
    subscriptions = []   # what kdaemon's heartbeats said it subscribes to, when they said anything

    def observe(node, api, version, body, response) -> None:
        if api.name == "ConsumerGroupHeartbeat" and not response and (
                body.get("subscribed_topic_regex") is not None or body.get("subscribed_topic_names") is not None):
            subscriptions.append((body.get("subscribed_topic_regex"), body.get("subscribed_topic_names")))

    kd = KdMember(bootstrap, group, pattern=regex, name=_name("kd"), group_protocol="consumer", assignor=None,
                  observer=observe)
    java = JavaMember(bootstrap, group, regex=regex, name=_name("java"), group_protocol="consumer", assignor=None)
    members = [kd, java]
    try:
        def split(topics) -> bool:
            return split_is_complete(members, frozenset((t, p) for t in topics for p in range(2)))

        wait_until(lambda: split(matching), WAIT, f"kdaemon and Java to share the topics {regex} matches",
                   members, also=lambda: group_log(kip848, group))
        # A topic created later that matches joins the subscription (the broker re-resolves).
        create_topic(bootstrap, f"{base}-n1", 2)
        create_topic(bootstrap, f"x{base}-n1", 2)
        matching.add(f"{base}-n1")
        wait_until(lambda: split(matching), WAIT, "the new matching topic assigned", members,
                   also=lambda: group_log(kip848, group))
        assigned = {tp for m in members for kind, parts in m.events if kind == "assigned" for tp in parts}
        assert {t for t, _ in assigned} == matching, f"assigned outside the match: {sorted(assigned)}"
        # kdaemon left the matching to the broker: it sent the expression, never topic names.
        assert subscriptions and set(subscriptions) == {(regex, None)}, subscriptions
    finally:
        for m in members:
            m.stop()
