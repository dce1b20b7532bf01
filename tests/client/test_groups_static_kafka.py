"""Static membership (KIP-345) on Apache Kafka: a member that dies without leaving and comes back
with the same ``group_instance_id`` within the session timeout gets its partitions back, and the
rest of the group never notices — no revoke, no assign, no new generation.

This is what a kdaemon worker restart relies on (DESIGN.md invariant 14) and what wedged Tansu.
The killed member is SIGKILLed (no LeaveGroup, no close): a kdaemon member in a child process
(beside another kdaemon member, a static Java member and a static librdkafka member; range),
once as the group's leader (the broker answers a static leader's rejoin with ``skip_assignment``,
KIP-814) and once as a follower; and the Java consumer as the leader beside static kdaemon members
(cooperative-sticky).  The victims get a 30 s session so that a restart on a loaded machine lands
inside it; that costs nothing when the rejoin works (the old member is replaced, not waited for).
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from testkit.group_members import (JavaMember, KdMember, KdProcessMember, RdMember, all_partitions,
                                       describe_members, group_log, split_is_complete, wait_until)
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

WAIT = 90.0
VICTIM_SESSION_MS = 30_000
# After the restarted member has its partitions: heartbeats (every 500 ms) would have told the
# others of a rebalance well within this.
QUIET = 3.0
SETTLE_S = 3.0     # how long the pre-kill generation must hold before the kill


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _quiet_period(members, marks, seconds: float, also) -> None:
    """Watch for ``seconds``: no member may see a listener call (nor die)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for m in members:
            if m.error is not None:
                raise AssertionError(f"{m.name} failed") from m.error
            seen = m.log.since(marks[m.name])
            assert seen == [], f"{m.name} saw a rebalance: {seen}\n{also()}"
        time.sleep(0.1)


def _all_consume_new_records(bootstrap: str, topic: str, members) -> None:
    """The group still works (not wedged, as Tansu was): a record produced to every partition now
    reaches the member that owns it."""
    owned = {tp: m for m in members for tp in m.assignment()}
    ends = {}
    for (t, p) in sorted(owned):
        [delivered] = produce(bootstrap, t, [(None, b"after the restart")], partition=p)
        ends[(t, p)] = delivered.offset
    wait_until(lambda: all((t, p, o) in owned[(t, p)].records for (t, p), o in ends.items()), WAIT,
               "every member to read the record produced to its partitions after the restart", members)


@pytest.mark.parametrize("victim", ["leader", "follower"])
def test_killed_static_kdaemon_member_comes_back_without_a_rebalance(kafka, victim):
    bootstrap = kafka.bootstrap
    topic, group = _name("static-kd"), _name("g")
    create_topic(bootstrap, topic, 8)
    everything = all_partitions(topic, 8)
    rid = uuid.uuid4().hex[:6]
    ids = {"a": f"kd-a-{rid}", "b": f"kd-b-{rid}"}
    start = lambda key: KdProcessMember(bootstrap, group, topics=[topic], name=ids[key],  # noqa: E731
                                        group_instance_id=ids[key], session_timeout_ms=VICTIM_SESSION_MS)
    # a joins first and leads; the victim is a (leader) or b (follower).
    procs = {"a": start("a")}
    java = rd = None
    try:
        wait_until(lambda: procs["a"].assignment() == everything, WAIT, "a alone to own the topic", [procs["a"]])
        procs["b"] = start("b")
        java = JavaMember(bootstrap, group, topics=[topic], name=f"java-{rid}", instance_id=f"java-{rid}")
        rd = RdMember(bootstrap, group, topics=[topic], name=f"rd-{rid}", **{"group.instance.id": f"rd-{rid}"})
        members = [procs["a"], procs["b"], java, rd]
        wait_until(lambda: split_is_complete(members, everything) and
                   sorted(len(m.assignment()) for m in members) == [2, 2, 2, 2], WAIT, "a 2/2/2/2 split", members)
        key = "a" if victim == "leader" else "b"
        other = procs["b" if key == "a" else "a"]
        # A common generation that has held for SETTLE_S: a leader's second round (new members'
        # topics not yet in its metadata) can follow the first split, and a generation taken
        # before it would be stale (seen once in CI: 3 == 2 after a quiet restart).
        seen: list = [None, 0.0]

        def common_and_settled() -> bool:
            a, b = procs[key].generations, other.generations
            gen = a[-1][0] if a and b and a[-1][0] == b[-1][0] else None
            if gen is None or gen != seen[0]:
                seen[:] = [gen, time.monotonic()]
                return False
            return time.monotonic() - seen[1] >= SETTLE_S

        wait_until(common_and_settled, WAIT, "a common, settled generation", members)
        generation, old_member_id = procs[key].generations[-1]
        owned = procs[key].assignment()
        marks = {m.name: m.log.mark() for m in (other, java, rd)}

        procs[key].kill()
        killed_at = time.monotonic()
        procs[key] = start(key)
        back = procs[key]
        wait_until(lambda: back.assignment() == owned, WAIT, f"the restarted {ids[key]} to get {sorted(owned)} back",
                   [back, other, java, rd], also=lambda: group_log(kafka, group))
        assert time.monotonic() - killed_at < VICTIM_SESSION_MS / 1000, \
            "the restart took longer than the session timeout: this run does not test a static rejoin"
        _quiet_period([other, java, rd], marks, QUIET, lambda: group_log(kafka, group))
        # Same generation, one assignment, a new member id in the old one's place.
        assert back.generations and back.generations[-1][0] == generation
        assert other.generations[-1][0] == generation
        assert [kind for kind, _ in back.log.events] == ["assigned"]
        described = describe_members(bootstrap, group)
        assert len(described) == 4 and old_member_id not in described and back.generations[-1][1] in described
        _all_consume_new_records(bootstrap, topic, [back, other, java, rd])
    finally:
        for m in [*procs.values(), *[x for x in (java, rd) if x is not None]]:
            m.stop()


def test_killed_static_java_member_comes_back_without_a_rebalance(kafka):
    bootstrap = kafka.bootstrap
    topic, group = _name("static-java"), _name("g")
    create_topic(bootstrap, topic, 6)
    everything = all_partitions(topic, 6)
    rid = uuid.uuid4().hex[:6]
    java_id = f"java-{rid}"
    session = {"session.timeout.ms": str(VICTIM_SESSION_MS)}
    start_java = lambda: JavaMember(bootstrap, group, topics=[topic], name=java_id, instance_id=java_id,  # noqa: E731
                                    assignor="cooperative-sticky", settings=session)
    java = start_java()  # first: the leader
    kds = []
    try:
        wait_until(lambda: java.assignment() == everything, WAIT, "Java alone to own the topic", [java])
        kds = [KdMember(bootstrap, group, topics=[topic], assignor="cooperative-sticky", name=f"kd-{i}-{rid}",
                        group_instance_id=f"kd-{i}-{rid}") for i in range(2)]
        members = [java, *kds]
        wait_until(lambda: split_is_complete(members, everything) and
                   sorted(len(m.assignment()) for m in members) == [2, 2, 2], WAIT, "a 2/2/2 split", members)
        wait_until(lambda: all(k.consumer.group_stable() for k in kds), WAIT, "kdaemon members stable", members)
        generations = [k.consumer.group_generation()[0] for k in kds]
        leader_id = kds[0].call(lambda c: c.group_leader())
        assert describe_members(bootstrap, group).get(leader_id) == java_id
        owned = java.assignment()
        marks = {k.name: k.log.mark() for k in kds}

        java.kill()
        killed_at = time.monotonic()
        java = start_java()
        wait_until(lambda: java.assignment() == owned, WAIT, f"the restarted Java member to get {sorted(owned)} back",
                   [java, *kds], also=lambda: group_log(kafka, group))
        assert time.monotonic() - killed_at < VICTIM_SESSION_MS / 1000, \
            "the restart took longer than the session timeout: this run does not test a static rejoin"
        _quiet_period(kds, marks, QUIET, lambda: group_log(kafka, group))
        assert [k.consumer.group_generation()[0] for k in kds] == generations
        assert [e[0] for e in java.events] == ["assigned"]
        _all_consume_new_records(bootstrap, topic, [java, *kds])
    finally:
        for m in [java, *kds]:
            m.stop()


def test_returning_static_kdaemon_leader_still_watches_the_groups_topics(kafka):
    """KIP-814: a static leader that comes back is told to skip the assignment, but it is still the
    only member watching the group's topics for new partitions (followers never do, in Java
    either): here the topic only the Java follower subscribes to grows, and the returning kdaemon
    leader must rebalance the group so the new partition gets an owner."""
    bootstrap = kafka.bootstrap
    mine, theirs, group = _name("lead-own"), _name("lead-other"), _name("g")
    create_topic(bootstrap, mine, 2)
    create_topic(bootstrap, theirs, 2)
    everything = all_partitions(mine, 2) | all_partitions(theirs, 2)
    rid = uuid.uuid4().hex[:6]
    start = lambda: KdProcessMember(bootstrap, group, topics=[mine], name=f"kd-{rid}",  # noqa: E731
                                    group_instance_id=f"kd-{rid}", session_timeout_ms=VICTIM_SESSION_MS,
                                    metadata_max_age_ms=1000)
    leader = start()
    java = None
    try:
        wait_until(lambda: leader.assignment() == all_partitions(mine, 2), WAIT, "the leader alone", [leader])
        java = JavaMember(bootstrap, group, topics=[mine, theirs], name=f"java-{rid}", instance_id=f"java-{rid}")
        wait_until(lambda: split_is_complete([leader, java], everything), WAIT, "the split", [leader, java])
        owned, mark = leader.assignment(), java.log.mark()
        leader.kill()
        leader = start()
        wait_until(lambda: leader.assignment() == owned, WAIT, "the leader's partitions back", [leader, java],
                   also=lambda: group_log(kafka, group))
        assert java.log.since(mark) == [], "the returning leader rebalanced the group"
        # The returning leader knew the Java member's topic only by name; it sizes it from its
        # next metadata answer, and a partition added before that would look like the old count.
        wait_until(lambda: f"watching {theirs} (2 partitions)" in leader.stderr, WAIT,
                   f"the returning leader to size {theirs}", [leader, java], also=lambda: leader.stderr[-3000:])

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_partitions([NewPartitions(theirs, 3)])[theirs].result(timeout=30)
        wait_until(lambda: (theirs, 2) in java.assignment(), WAIT,
                   f"the new partition {theirs}[2] to reach the Java member", [leader, java],
                   also=lambda: f"{group_log(kafka, group)}\nthe leader's log:\n{leader.stderr[-3000:]}")
    finally:
        for m in [leader, *([java] if java else [])]:
            m.stop()
