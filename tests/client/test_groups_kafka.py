"""Mixed consumer groups on Apache Kafka: kdaemon, the Java KafkaConsumer and librdkafka in one
group (classic protocol), for every assignor all three implement.

What must hold whichever client leads (the leader is the first member to join an empty group, so
join order picks it — kdaemon for range, Java for roundrobin, librdkafka for cooperative-sticky —
and the test checks who it was from the coordinator's member list; when it leaves, the
coordinator makes one of the other two the leader, and the check runs again):

* the assignment is complete and disjoint, and for range and roundrobin it is exactly what
  kdaemon's own assignor computes from the same member list — the three implementations agree;
* offsets one client commits are what the others' ``committed()`` read (kdaemon and Java: with
  the metadata, byte for byte; librdkafka: the offsets, see ``rd_committed_of``), and a member
  that takes over a partition resumes at the offset another client committed;
* under cooperative-sticky, a member joining moves only what it must: the others keep their
  unmoved partitions without a revoke, and revoke exactly what moves (kdaemon's listener calls,
  Java's events and librdkafka's callbacks all checked).

Every member uses a 6 s session timeout and 500 ms heartbeats (the broker allows 1 s minimum).
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicPartition as RdTopicPartition

from kdaemon.client import OffsetAndMetadata, TopicPartition
from kdaemon.client.group.assignors import MemberSubscription, get_assignor
from testkit.group_members import (JavaMember, KdMember, RdMember, all_partitions, describe_members,
                                       kd_committed_of, rd_committed_of, split_is_complete, wait_until)
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

WAIT = 90.0


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _start(client: str, bootstrap: str, group: str, topic: str, assignor: str, name: str):
    if client == "kdaemon":
        return KdMember(bootstrap, group, topics=[topic], assignor=assignor, name=name)
    if client == "java":
        return JavaMember(bootstrap, group, topics=[topic], assignor=assignor, name=name)
    return RdMember(bootstrap, group, topics=[topic], assignor=assignor, name=name)


def _stop_all(members) -> None:
    errors = []
    for m in members:
        try:
            m.stop()
        except Exception as exc:  # stop the others first, then report
            errors.append(exc)
    if errors:
        raise errors[0]


def _split_as_ours(described: dict[str, str], names: dict[str, str], members: dict, assignor: str,
                   topic: str, n: int) -> dict[str, frozenset]:
    """Client -> what its member owns, for the members the coordinator describes; for range and
    roundrobin also the check that whichever client led computed what kdaemon's own assignor
    computes from the same member list (cooperative-sticky results depend on history)."""
    client_of = {mid: next(c for c, name in names.items() if name == cid) for mid, cid in described.items()}
    owned = {client_of[mid]: members[client_of[mid]].assignment() for mid in described}
    if assignor != "cooperative-sticky":
        ours = get_assignor(assignor).assign({topic: n}, {mid: MemberSubscription(mid, topics=[topic])
                                                          for mid in described})
        assert {client_of[mid]: frozenset((tp.topic, tp.partition) for tp in tps) for mid, tps in ours.items()} \
            == owned, f"the leader's {assignor} split differs from kdaemon's"
    return owned


@pytest.mark.parametrize("assignor,leader", [("range", "kdaemon"), ("roundrobin", "java"),
                                             ("cooperative-sticky", "librdkafka")])
def test_mixed_group_assignment_commits_and_takeover(kafka, assignor, leader):
    bootstrap = kafka.bootstrap
    topic, group = _name(f"mixed-{assignor}"), _name("g")
    n = 7  # uneven: range gives 3/2/2
    create_topic(bootstrap, topic, n)
    everything = all_partitions(topic, n)
    clients = [leader] + [c for c in ("kdaemon", "java", "librdkafka") if c != leader]
    names = {c: f"{c}-{uuid.uuid4().hex[:6]}" for c in clients}

    first = _start(leader, bootstrap, group, topic, assignor, names[leader])
    members = {leader: first}
    try:
        # Alone in the group: the first member leads and takes everything.
        wait_until(lambda: first.assignment() == everything, WAIT, f"{leader} alone to own {topic}", [first])
        for c in clients[1:]:
            members[c] = _start(c, bootstrap, group, topic, assignor, names[c])
        group_members = list(members.values())
        wait_until(lambda: split_is_complete(group_members, everything), WAIT,
                   "a complete, disjoint split among kdaemon, Java and librdkafka", group_members)
        kd = members["kdaemon"]
        wait_until(lambda: kd.consumer.group_stable(), WAIT, "kdaemon to be stable", group_members)

        # Who led, and did the leader compute what kdaemon's assignor computes?
        described = describe_members(bootstrap, group)
        assert sorted(described.values()) == sorted(names.values())
        leader_id = kd.call(lambda c: c.group_leader())
        assert described.get(leader_id) == names[leader], \
            f"leader {leader_id} is {described.get(leader_id)}, expected the first member {names[leader]}"
        owned = _split_as_ours(described, names, members, assignor, topic, n)
        assert sorted(map(len, owned.values())) == [2, 2, 3], f"unbalanced split {owned}"

        # Records are produced now that the split is stable: each member reads exactly its own.
        counts = {p: 3 + p for p in range(n)}
        for p, k in counts.items():
            produce(bootstrap, topic, [(None, f"{p}-{i}".encode()) for i in range(k)], partition=p)
        expected = {(topic, p, o) for p, k in counts.items() for o in range(k)}
        wait_until(lambda: {r for m in group_members for r in m.records} == expected, WAIT,
                   "every record consumed", group_members)
        for c, m in members.items():
            mine = sorted(r for r in m.records)
            assert mine == sorted(r for r in expected if (r[0], r[1]) in owned[c]), f"{c} read {mine}"

        # Commits, each client its own way, with a metadata string naming the committer; then
        # every member reads the whole group's commits with its own committed().
        kd, rd, java = members["kdaemon"], members["librdkafka"], members["java"]
        kd.call(lambda c: c.commit({TopicPartition(t, p): OffsetAndMetadata(counts[p], "kdaemon")
                                    for t, p in owned["kdaemon"]}))
        rd.call(lambda c: c.commit(offsets=[RdTopicPartition(t, p, counts[p], metadata="librdkafka")
                                            for t, p in owned["librdkafka"]], asynchronous=False))
        java.commit({tp: (counts[tp[1]], "java") for tp in owned["java"]})
        who = {tp: c for c, tps in owned.items() for tp in tps}
        want = {tp: (counts[tp[1]], who[tp]) for tp in everything}
        # confluent-kafka commits its metadata string with the C string's NUL terminator on the
        # wire; Java and kdaemon read the bytes as they are.
        on_wire = {tp: (o, m + "\0" if who[tp] == "librdkafka" else m) for tp, (o, m) in want.items()}
        assert rd.call(lambda c: rd_committed_of(c, everything)) == {tp: o for tp, (o, _) in want.items()}
        assert kd.call(lambda c: kd_committed_of(c, everything)) == on_wire
        assert java.committed(everything) == on_wire

        # The leader leaves; the survivors take its partitions over at the offsets it committed,
        # and each other's partitions (if the new split moves them) at theirs.
        marks = {c: len(m.records) for c, m in members.items()}
        first.stop()
        survivors = [m for c, m in members.items() if c != leader]
        wait_until(lambda: split_is_complete(survivors, everything), WAIT, "the survivors' split", survivors)
        # One of the other two clients leads now (the coordinator picks it); its split must be
        # kdaemon's too.
        described = describe_members(bootstrap, group)
        assert sorted(described.values()) == sorted(names[c] for c in clients[1:])
        owned = _split_as_ours(described, names, members, assignor, topic, n)
        assert sorted(map(len, owned.values())) == [3, 4], f"unbalanced split {owned}"
        more = {p: 2 for p in range(n)}
        for p, k in more.items():
            produce(bootstrap, topic, [(None, f"{p}-late-{i}".encode()) for i in range(k)], partition=p)
        late = {(topic, p, counts[p] + i) for p, k in more.items() for i in range(k)}
        after = lambda: [r for c, m in members.items() if c != leader for r in m.records[marks[c]:]]  # noqa: E731
        wait_until(lambda: set(after()) >= late, WAIT, "the records produced after the handover", survivors)
        assert sorted(after()) == sorted(late), "a survivor re-read records committed before the handover"
    finally:
        _stop_all(members.values())


@pytest.mark.parametrize("leader,joiner", [("kdaemon", "java"), ("java", "kdaemon")])
def test_cooperative_join_revokes_only_what_moves(kafka, leader, joiner):
    bootstrap = kafka.bootstrap
    topic, group = _name("coop"), _name("g")
    n = 12
    create_topic(bootstrap, topic, n)
    everything = all_partitions(topic, n)
    clients = [leader] + [c for c in ("kdaemon", "java", "librdkafka") if c != leader]
    names = {c: f"{c}-{uuid.uuid4().hex[:6]}" for c in clients}
    members = {leader: _start(leader, bootstrap, group, topic, "cooperative-sticky", names[leader])}
    joined = []
    try:
        first = members[leader]
        wait_until(lambda: first.assignment() == everything, WAIT, f"{leader} alone to own {topic}", [first])
        for c in clients[1:]:
            members[c] = _start(c, bootstrap, group, topic, "cooperative-sticky", names[c])
        three = list(members.values())
        wait_until(lambda: split_is_complete(three, everything) and
                   sorted(len(m.assignment()) for m in three) == [4, 4, 4], WAIT, "a 4/4/4 split", three)
        kd = members["kdaemon"]
        leader_id = kd.call(lambda c: c.group_leader())
        assert describe_members(bootstrap, group).get(leader_id) == names[leader]

        before = {c: m.assignment() for c, m in members.items()}
        marks = {c: m.log.mark() for c, m in members.items()}
        new = _start(joiner, bootstrap, group, topic, "cooperative-sticky", f"{joiner}-new-{uuid.uuid4().hex[:6]}")
        joined.append(new)
        four = three + [new]
        wait_until(lambda: split_is_complete(four, everything) and
                   sorted(len(m.assignment()) for m in four) == [3, 3, 3, 3], WAIT, "a 3/3/3/3 split", four)
        moved = set()
        for c, m in members.items():
            after = m.assignment()
            events = m.log.since(marks[c])
            revoked = frozenset().union(*(p for kind, p in events if kind == "revoked"))
            assigned = frozenset().union(*(p for kind, p in events if kind == "assigned"))
            assert not [e for e in events if e[0] == "lost"], f"{c} lost partitions: {events}"
            # Only what moves is revoked; what stays is neither revoked nor assigned again.
            assert revoked == before[c] - after, f"{c} revoked {sorted(revoked)}, moved {sorted(before[c] - after)}"
            assert after <= before[c] and not assigned, f"{c}: {events}"
            assert len(revoked) == 1, f"{c} gave up {sorted(revoked)}: more than the one partition a 4-way split needs"
            moved |= revoked
        assert new.assignment() == moved
        assert not [e for e in new.log.events if e[0] != "assigned"], new.log.events
    finally:
        _stop_all(list(members.values()) + joined)
