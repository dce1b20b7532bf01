"""Partition assignors (kdaemon/client/group/assignors.py): pure functions, no broker.

* range and roundrobin: exact assignments worked out by hand, including the examples in the Java
  client's javadoc, static-member ordering and Java's UTF-16 string order;
* cooperative-sticky: balance, stickiness, the two-round hand-over of a moving partition,
  generation conflicts, and the user data (ours and librdkafka's) across the consumer protocol;
* hypothesis properties over random groups: every partition of a subscribed topic goes to
  exactly one subscriber (after the second round for cooperative), nobody gets a topic it does not
  subscribe to, balance bounds, maximal stickiness for identical subscriptions, determinism.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kdaemon.client.group.assignors import (
    ASSIGNORS,
    Assignor,
    CooperativeStickyAssignor,
    MemberSubscription,
    RangeAssignor,
    RoundRobinAssignor,
    get_assignor,
    member_generation,
)
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.apis.consumer_protocol import decode_subscription, encode_subscription

FAST = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


def tps(spec: str) -> list[TopicPartition]:
    """'t0-0 t0-1 t1-2' -> [TopicPartition('t0', 0), ...]"""
    out = []
    for item in spec.split():
        topic, _, p = item.rpartition("-")
        out.append(TopicPartition(topic, int(p)))
    return out


def member(mid: str, topics, owned: str | list = (), generation: int = -1, instance: str | None = None,
           user_data: bytes | None = None) -> MemberSubscription:
    if isinstance(owned, str):
        owned = tps(owned)
    return MemberSubscription(member_id=mid, group_instance_id=instance, topics=list(topics),
                              owned_partitions=list(owned), generation_id=generation, user_data=user_data)


def group(*subs: MemberSubscription) -> dict[str, MemberSubscription]:
    return {s.member_id: s for s in subs}


def next_round(members: dict[str, MemberSubscription], assignment, generation: int) -> dict[str, MemberSubscription]:
    """Every member revoked what it lost and rejoins owning exactly what it was given."""
    return {mid: replace(m, owned_partitions=list(assignment[mid]), generation_id=generation)
            for mid, m in members.items()}


def assignable(cluster: dict[str, int], members) -> set[TopicPartition]:
    subscribed = {t for m in members.values() for t in m.topics}
    return {TopicPartition(t, p) for t, n in cluster.items() if t in subscribed for p in range(n)}


def check_valid(cluster, members, result, complete: bool = True) -> None:
    assert set(result) == set(members)
    seen: Counter = Counter(tp for parts in result.values() for tp in parts)
    assert all(n == 1 for n in seen.values()), f"assigned twice: {[tp for tp, n in seen.items() if n > 1]}"
    for mid, parts in result.items():
        assert parts == sorted(parts)
        for tp in parts:
            assert tp.topic in members[mid].topics, f"{mid} got {tp} without subscribing to {tp.topic}"
            assert 0 <= tp.partition < cluster[tp.topic]
    if complete:
        assert set(seen) == assignable(cluster, members)


def check_locally_balanced(members, result) -> None:
    """No partition could move to a subscriber holding at least two fewer (Java's isBalanced)."""
    count = {mid: len(parts) for mid, parts in result.items()}
    for holder, parts in result.items():
        for tp in parts:
            for other, sub in members.items():
                if tp.topic in sub.topics:
                    assert count[holder] - count[other] <= 1, (tp, holder, other, count)


# -- registry ----------------------------------------------------------------------------------

def test_registry_names_and_fresh_instances():
    assert set(ASSIGNORS) == {"range", "roundrobin", "cooperative-sticky"}
    for name in ASSIGNORS:
        a = get_assignor(name)
        assert isinstance(a, Assignor)
        assert a.name == name
        assert a.version == 3
        assert get_assignor(name) is not a   # cooperative-sticky keeps per-member state
    assert get_assignor("range").rebalance_protocol == "eager"
    assert get_assignor("roundrobin").rebalance_protocol == "eager"
    assert get_assignor("cooperative-sticky").rebalance_protocol == "cooperative"


def test_unknown_assignor_names_the_known_ones():
    with pytest.raises(ValueError) as err:
        get_assignor("sticky")
    assert "'sticky'" in str(err.value)
    for name in ASSIGNORS:
        assert name in str(err.value)


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_empty_group_and_no_topics(name):
    a = get_assignor(name)
    assert a.assign({"t": 3}, {}) == {}
    assert a.assign({}, group(member("m1", ["t"]))) == {"m1": []}
    assert a.assign({"t": 0}, group(member("m1", ["t"]))) == {"m1": []}


# -- range -------------------------------------------------------------------------------------

def test_range_java_javadoc_example():
    members = group(member("C0", ["t0", "t1"]), member("C1", ["t0", "t1"]))
    assert RangeAssignor().assign({"t0": 3, "t1": 3}, members) == {
        "C0": tps("t0-0 t0-1 t1-0 t1-1"),
        "C1": tps("t0-2 t1-2"),
    }


def test_range_members_with_different_topics():
    members = group(member("c0", ["t0"]), member("c1", ["t0", "t1"]), member("c2", ["t1"]))
    # t0 (3 partitions) over [c0, c1]: c0 gets the extra one; t1 (2) over [c1, c2]: one each.
    assert RangeAssignor().assign({"t0": 3, "t1": 2, "unsubscribed": 4}, members) == {
        "c0": tps("t0-0 t0-1"),
        "c1": tps("t0-2 t1-0"),
        "c2": tps("t1-1"),
    }


def test_range_more_members_than_partitions():
    members = group(member("m3", ["t"]), member("m1", ["t"]), member("m2", ["t"]))
    assert RangeAssignor().assign({"t": 2}, members) == {"m1": tps("t-0"), "m2": tps("t-1"), "m3": []}


def test_range_orders_member_ids_as_strings():
    # Lexicographic, not numeric: "consumer-10" sorts before "consumer-9".
    members = group(member("consumer-9", ["t"]), member("consumer-10", ["t"]))
    assert RangeAssignor().assign({"t": 3}, members) == {
        "consumer-10": tps("t-0 t-1"),
        "consumer-9": tps("t-2"),
    }


def test_range_topic_missing_from_metadata_is_skipped():
    members = group(member("a", ["t", "missing"]), member("b", ["t"]))
    assert RangeAssignor().assign({"t": 4}, members) == {"a": tps("t-0 t-1"), "b": tps("t-2 t-3")}


def test_range_static_members_first_by_instance_id():
    # Java MemberInfo: instance ids order static members, and static members precede dynamic ones,
    # whatever their member ids.
    members = group(member("a-dynamic", ["t"]),
                    member("b", ["t"], instance="zz"),
                    member("c", ["t"], instance="aa"))
    assert RangeAssignor().assign({"t": 5}, members) == {
        "c": tps("t-0 t-1"),
        "b": tps("t-2 t-3"),
        "a-dynamic": tps("t-4"),
    }


def test_range_assignment_survives_member_id_change_with_static_membership():
    before = group(member("C0", ["t0", "t1"], instance="I0"), member("C1", ["t0", "t1"], instance="I1"))
    after = group(member("C3", ["t0", "t1"], instance="I0"), member("C2", ["t0", "t1"], instance="I1"))
    r1 = RangeAssignor().assign({"t0": 3, "t1": 3}, before)
    r2 = RangeAssignor().assign({"t0": 3, "t1": 3}, after)
    assert r1["C0"] == r2["C3"] == tps("t0-0 t0-1 t1-0 t1-1")
    assert r1["C1"] == r2["C2"] == tps("t0-2 t1-2")


def test_member_order_is_java_utf16_order():
    # U+10000 is D800 DC00 in UTF-16, below U+FFFF; Python compares code points and says otherwise.
    low, high = "\U00010000", "\uffff"
    assert high < low   # Python
    members = group(member(high, ["t"]), member(low, ["t"]))
    assert RangeAssignor().assign({"t": 3}, members) == {low: tps("t-0 t-1"), high: tps("t-2")}
    # Topic order follows the same rule in roundrobin: the U+10000 topic comes first.
    rr = RoundRobinAssignor().assign({high: 1, low: 1}, group(member("m1", [high, low]), member("m2", [high, low])))
    assert rr == {"m1": [TopicPartition(low, 0)], "m2": [TopicPartition(high, 0)]}


# -- roundrobin --------------------------------------------------------------------------------

def test_roundrobin_java_javadoc_example():
    members = group(member("C0", ["t0", "t1"]), member("C1", ["t0", "t1"]))
    assert RoundRobinAssignor().assign({"t0": 3, "t1": 3}, members) == {
        "C0": tps("t0-0 t0-2 t1-1"),
        "C1": tps("t0-1 t1-0 t1-2"),
    }


def test_roundrobin_java_javadoc_example_with_different_subscriptions():
    members = group(member("C0", ["t0"]), member("C1", ["t0", "t1"]), member("C2", ["t0", "t1", "t2"]))
    assert RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, members) == {
        "C0": tps("t0-0"),
        "C1": tps("t1-0"),
        "C2": tps("t1-1 t2-0 t2-1 t2-2"),
    }


def test_roundrobin_resumes_after_the_member_that_took_the_last_partition():
    # Java semantics: t-1 skips B and goes to C, so t-2 starts again at A.  (librdkafka would
    # resume at C, giving A [t-0] and C [t-1, t-2].)
    members = group(member("A", ["t"]), member("B", ["u"]), member("C", ["t"]))
    assert RoundRobinAssignor().assign({"t": 3, "u": 1}, members) == {
        "A": tps("t-0 t-2"),
        "B": tps("u-0"),
        "C": tps("t-1"),
    }


def test_roundrobin_more_members_than_partitions_and_sort_order():
    members = group(member("m2", ["b", "a"]), member("m1", ["a", "b"]), member("m3", ["a", "b"]),
                    member("m4", ["a", "b"]))
    assert RoundRobinAssignor().assign({"b": 1, "a": 2}, members) == {
        "m1": tps("a-0"), "m2": tps("a-1"), "m3": tps("b-0"), "m4": [],
    }


def test_roundrobin_static_members_javadoc_example():
    def members(ids):
        return group(*(member(mid, ["t0", "t1"], instance=inst) for mid, inst in ids))
    cluster = {"t0": 3, "t1": 3}
    r1 = RoundRobinAssignor().assign(cluster, members([("C0", "I0"), ("C1", "I1"), ("C2", "I2")]))
    r2 = RoundRobinAssignor().assign(cluster, members([("C5", "I0"), ("C3", "I1"), ("C4", "I2")]))
    assert r1 == {"C0": tps("t0-0 t1-0"), "C1": tps("t0-1 t1-1"), "C2": tps("t0-2 t1-2")}
    assert r2 == {"C5": tps("t0-0 t1-0"), "C3": tps("t0-1 t1-1"), "C4": tps("t0-2 t1-2")}


# -- cooperative-sticky: exact cases -----------------------------------------------------------

def sticky(cluster, members):
    return CooperativeStickyAssignor().assign(cluster, members)


def test_sticky_fresh_group_is_balanced_and_complete():
    members = group(member("a", ["t"]), member("b", ["t"]), member("c", ["t"]))
    result = sticky({"t": 7}, members)
    check_valid({"t": 7}, members, result)
    assert sorted(len(p) for p in result.values()) == [2, 2, 3]
    assert result == sticky({"t": 7}, dict(reversed(list(members.items()))))


def test_sticky_keeps_owned_partitions_when_nothing_changes():
    members = group(member("a", ["t", "u"], "t-0 t-3 u-1", 4), member("b", ["t", "u"], "t-1 t-2 u-0", 4))
    assert sticky({"t": 4, "u": 2}, members) == {"a": tps("t-0 t-3 u-1"), "b": tps("t-1 t-2 u-0")}


def test_sticky_joining_member_gets_moved_partitions_only_in_the_second_round():
    cluster = {"t": 8}
    members = group(member("a", ["t"], "t-0 t-1 t-2 t-3", 3), member("b", ["t"], "t-4 t-5 t-6 t-7", 3),
                    member("c", ["t"]))
    r1 = sticky(cluster, members)
    check_valid(cluster, members, r1, complete=False)
    # Round 1: a and b keep three each (never anything new), c gets nothing yet, and the two
    # partitions on their way to c are assigned to nobody.
    assert set(r1["a"]) < set(tps("t-0 t-1 t-2 t-3")) and len(r1["a"]) == 3
    assert set(r1["b"]) < set(tps("t-4 t-5 t-6 t-7")) and len(r1["b"]) == 3
    assert r1["c"] == []
    moving = assignable(cluster, members) - {tp for p in r1.values() for tp in p}
    assert len(moving) == 2
    # Round 2: a and b revoked them; now nobody claims them and c gets both.
    r2 = sticky(cluster, next_round(members, r1, 4))
    assert r2["a"] == r1["a"] and r2["b"] == r1["b"]
    assert set(r2["c"]) == moving
    check_valid(cluster, members, r2)
    # Round 3 changes nothing: the group is stable.
    assert sticky(cluster, next_round(members, r2, 5)) == r2


def test_sticky_new_member_takes_only_from_overloaded_members():
    cluster = {"t": 8}
    members = group(member("a", ["t"], "t-0 t-1 t-2 t-3 t-4 t-5", 2), member("b", ["t"], "t-6 t-7", 2),
                    member("c", ["t"]))
    r1 = sticky(cluster, members)
    assert r1["b"] == tps("t-6 t-7")                  # b is not over quota: keeps everything
    assert set(r1["a"]) <= set(tps("t-0 t-1 t-2 t-3 t-4 t-5")) and len(r1["a"]) == 3
    assert r1["c"] == []
    r2 = sticky(cluster, next_round(members, r1, 3))
    check_valid(cluster, members, r2)
    assert r2["a"] == r1["a"]
    assert set(tps("t-6 t-7")) <= set(r2["b"])
    assert sorted(len(p) for p in r2.values()) == [2, 3, 3]
    moved = {tp for mid in "bc" for tp in r2[mid]} - set(tps("t-6 t-7"))
    assert moved <= set(tps("t-0 t-1 t-2 t-3 t-4 t-5"))   # taken from a only


def test_sticky_leaving_member_partitions_are_handed_out_at_once():
    cluster = {"t": 6}
    members = group(member("a", ["t"], "t-0 t-1", 7), member("b", ["t"], "t-2 t-3", 7))   # c (t-4, t-5) left
    result = sticky(cluster, members)
    check_valid(cluster, members, result)                  # nobody claims them: no second round
    assert set(tps("t-0 t-1")) < set(result["a"]) and set(tps("t-2 t-3")) < set(result["b"])
    assert len(result["a"]) == len(result["b"]) == 3


def test_sticky_higher_generation_wins_a_double_claim():
    cluster = {"t": 4}
    # b is a zombie from generation 3 that still lists t-1; a owned it in generation 5.
    members = group(member("a", ["t"], "t-0 t-1", 5), member("b", ["t"], "t-1 t-2", 3))
    result = sticky(cluster, members)
    assert result == {"a": tps("t-0 t-1"), "b": tps("t-2 t-3")}


def test_sticky_lower_generation_claimant_does_not_get_the_partition_while_it_is_contested():
    cluster = {"t": 2}
    # a (generation 6) is the rightful owner of t-1 but stopped subscribing to t: t-1 must
    # wait for a to revoke it, even though b (generation 2) also lists it.
    members = group(member("a", ["u"], "t-1", 6), member("b", ["t"], "t-0 t-1", 2))
    r1 = sticky({**cluster, "u": 1}, members)
    assert r1 == {"a": tps("u-0"), "b": tps("t-0")}
    r2 = sticky({**cluster, "u": 1}, next_round(members, r1, 7))
    assert r2 == {"a": tps("u-0"), "b": tps("t-0 t-1")}


def test_sticky_equal_generation_double_claim_is_withheld_from_everyone():
    cluster = {"t": 3}
    members = group(member("a", ["t"], "t-0 t-1", 4), member("b", ["t"], "t-0 t-2", 4))
    r1 = sticky(cluster, members)
    assert TopicPartition("t", 0) not in {tp for p in r1.values() for tp in p}
    assert TopicPartition("t", 1) in r1["a"] and TopicPartition("t", 2) in r1["b"]
    r2 = sticky(cluster, next_round(members, r1, 5))
    check_valid(cluster, members, r2)


def test_sticky_generation_from_user_data_when_the_subscription_has_none():
    cluster = {"t": 2}
    java_style = struct.pack(">i", 7)   # Java CooperativeStickyAssignor user data, subscription v0-1
    members = group(member("a", ["t"], "t-0", -1, user_data=java_style), member("b", ["t"], "t-0 t-1", 5))
    assert member_generation(members["a"]) == 7
    assert sticky(cluster, members) == {"a": tps("t-0"), "b": tps("t-1")}


def librdkafka_user_data(assignment: dict[str, list[int]], generation: int | None) -> bytes:
    """StickyAssignor UserData v1 as librdkafka writes it (v0 without the generation)."""
    out = struct.pack(">i", len(assignment))
    for topic, parts in assignment.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name + struct.pack(">i", len(parts))
        out += b"".join(struct.pack(">i", p) for p in parts)
    if generation is not None:
        out += struct.pack(">i", generation)
    return out


def test_member_generation_from_librdkafka_user_data():
    data = librdkafka_user_data({"t": [0, 1], "uu": [3]}, 12)
    assert member_generation(member("m", ["t"], user_data=data)) == 12
    assert member_generation(member("m", ["t"], user_data=librdkafka_user_data({}, 3))) == 3
    # v0 (no generation), garbage and nothing at all: unknown.
    assert member_generation(member("m", ["t"], user_data=librdkafka_user_data({"t": [0]}, None))) == -1
    assert member_generation(member("m", ["t"], user_data=b"\x00\x00\x00\x01\xff")) == -1
    assert member_generation(member("m", ["t"], user_data=b"")) == -1
    assert member_generation(member("m", ["t"])) == -1
    # The subscription's own field (v2+) wins over user data.
    assert member_generation(member("m", ["t"], generation=4, user_data=struct.pack(">i", 9))) == 4


def test_sticky_member_unsubscribing_from_an_owned_topic():
    cluster = {"t": 2, "u": 2}
    members = group(member("a", ["t"], "t-0 u-0 u-1", 3), member("b", ["t", "u"], "t-1", 3))
    r1 = sticky(cluster, members)
    check_valid(cluster, members, r1, complete=False)
    # The target is a: t-0 t-1, b: u-0 u-1.  u is still claimed by a and t-1 by b, so both wait.
    assert r1 == {"a": tps("t-0"), "b": []}
    r2 = sticky(cluster, next_round(members, r1, 4))
    assert r2 == {"a": tps("t-0 t-1"), "b": tps("u-0 u-1")}


def test_sticky_ignores_claims_on_partitions_that_do_not_exist():
    cluster = {"t": 2}
    members = group(member("a", ["t"], "t-0 t-5 gone-0", 2), member("b", ["t"], "", 2))
    assert sticky(cluster, members) == {"a": tps("t-0"), "b": tps("t-1")}


def test_sticky_different_subscriptions_balance():
    cluster = {"t1": 6, "t2": 2}
    members = group(member("a", ["t1"]), member("b", ["t1", "t2"]), member("c", ["t2"]))
    result = sticky(cluster, members)
    check_valid(cluster, members, result)
    check_locally_balanced(members, result)
    assert len(result["c"]) >= 1


def test_sticky_balances_through_chains_of_moves():
    # Single moves stop at (3, 2, 1): a holds 3, c 1, but c cannot take x.  The chain "a gives
    # x to b, b gives y to c" reaches (2, 2, 2).
    cluster = {"x": 4, "y": 2}
    members = group(member("a", ["x"], "x-0 x-1 x-2 x-3", 1), member("b", ["x", "y"], "y-0 y-1", 1),
                    member("c", ["y"]))
    r1 = sticky(cluster, members)
    assert r1 == {"a": tps("x-0 x-1"), "b": [], "c": []}    # b's y are on their way to c
    r2 = sticky(cluster, next_round(members, r1, 2))
    assert r2 == {"a": tps("x-0 x-1"), "b": tps("x-2 x-3"), "c": tps("y-0 y-1")}


def test_sticky_second_round_places_withheld_partitions_without_new_moves():
    # Found by hypothesis: greedy placement of the withheld a-2 on "0" would leave "1" two
    # ahead of "9", and fixing that by single moves would take an owned partition from "1".
    cluster = {"a": 4, "t": 8}
    members = group(member("0", ["a"], "", 0), member("1", ["t"], "a-2", 0), member("9", ["a", "b", "t"], "t-0", 0))
    r1 = sticky(cluster, members)
    r2 = sticky(cluster, next_round(members, r1, 1))
    check_valid(cluster, members, r2)
    check_locally_balanced(members, r2)
    for mid in members:
        assert set(r1[mid]) <= set(r2[mid])


def test_sticky_on_assignment_sets_the_generation_in_user_data():
    a = CooperativeStickyAssignor()
    assert a.subscription_user_data(["t"], []) == struct.pack(">i", -1)
    a.on_assignment(tps("t-0"), 17)
    assert a.subscription_user_data(["t"], tps("t-0")) == struct.pack(">i", 17)


# -- user data across the consumer protocol ----------------------------------------------------

@pytest.mark.parametrize("name", sorted(ASSIGNORS))
@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_user_data_round_trips_through_the_consumer_protocol(name, version):
    a = get_assignor(name)
    a.on_assignment(tps("t-1"), 23)
    owned = tps("t-1")
    user_data = a.subscription_user_data(["t", "u"], owned)
    wire = encode_subscription(version, {
        "topics": ["t", "u"], "user_data": user_data,
        "owned_partitions": [{"topic": "t", "partitions": [1]}],
        "generation_id": 23, "rack_id": "r1",
    })
    _, decoded = decode_subscription(wire)
    assert (None if decoded["user_data"] is None else bytes(decoded["user_data"])) == user_data
    sub = MemberSubscription.from_metadata("m1", "inst", wire)
    assert sub.user_data == user_data
    assert sub.topics == ["t", "u"] and sub.group_instance_id == "inst"
    assert list(sub.owned_partitions) == (owned if version >= 1 else [])
    if name == "cooperative-sticky":
        # v0-1 carry no generation field: the user data still says 23.
        assert member_generation(sub) == 23
    else:
        assert user_data is None
        assert member_generation(sub) == (23 if version >= 2 else -1)


def test_from_metadata_accepts_memoryview_and_librdkafka_user_data():
    data = librdkafka_user_data({"t": [0]}, 8)
    wire = encode_subscription(1, {"topics": ["t"], "user_data": data,
                                   "owned_partitions": [{"topic": "t", "partitions": [0]}]})
    sub = MemberSubscription.from_metadata("m", None, memoryview(wire))
    assert isinstance(sub.user_data, bytes) and sub.user_data == data
    assert member_generation(sub) == 8


# -- properties --------------------------------------------------------------------------------

TOPICS = ["a", "b", "c", "t"]


@st.composite
def groups(draw, identical: bool = False, claims: bool = True):
    """(cluster, members): up to 4 topics of 0-8 partitions, 1-6 members, random subscriptions
    (some to a topic missing from metadata), static ids, owned partitions that may overlap,
    point at missing partitions, and carry random generations."""
    cluster = {t: draw(st.integers(0, 8)) for t in draw(st.lists(st.sampled_from(TOPICS), min_size=1,
                                                                   max_size=4, unique=True))}
    names = list(cluster) + ["missing"]
    ids = draw(st.lists(st.text("abxyz019-", min_size=1, max_size=4), min_size=1, max_size=6, unique=True))
    instances = draw(st.lists(st.sampled_from(["i0", "i1", "i2", "i3", "i4", "i5"]), min_size=len(ids),
                              max_size=len(ids), unique=True))
    common = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
    members = {}
    for mid, inst in zip(ids, instances):
        topics = common if identical else draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
        owned = draw(st.lists(st.builds(TopicPartition, st.sampled_from(names), st.integers(0, 9)),
                              max_size=8)) if claims else []
        members[mid] = MemberSubscription(
            member_id=mid, group_instance_id=inst if draw(st.booleans()) else None, topics=list(topics),
            owned_partitions=owned, generation_id=draw(st.integers(-1, 3)))
    return cluster, members


@settings(max_examples=300, **FAST)
@given(groups(claims=False), st.sampled_from(["range", "roundrobin"]))
def test_eager_assignors_are_complete_valid_and_deterministic(g, name):
    cluster, members = g
    result = get_assignor(name).assign(cluster, members)
    check_valid(cluster, members, result)
    assert get_assignor(name).assign(dict(cluster), dict(reversed(list(members.items())))) == result


@settings(max_examples=200, **FAST)
@given(groups(claims=False))
def test_range_balances_each_topic(g):
    cluster, members = g
    result = RangeAssignor().assign(cluster, members)
    for topic in cluster:
        counts = [sum(tp.topic == topic for tp in result[mid]) for mid, m in members.items() if topic in m.topics]
        assert not counts or max(counts) - min(counts) <= 1


@settings(max_examples=200, **FAST)
@given(groups(identical=True, claims=False))
def test_roundrobin_balances_identical_subscriptions(g):
    cluster, members = g
    counts = [len(p) for p in RoundRobinAssignor().assign(cluster, members).values()]
    assert max(counts) - min(counts) <= 1


def claims_are_respected(members, result) -> None:
    """A partition another member still claims goes to nobody, unless the recipient is its
    rightful owner (it claims it too, with a strictly higher generation than everyone else)."""
    gen = {mid: member_generation(m) for mid, m in members.items()}
    for mid, parts in result.items():
        for tp in parts:
            others = [o for o, m in members.items() if o != mid and tp in m.owned_partitions]
            if others:
                assert tp in members[mid].owned_partitions, (mid, tp, others)
                assert all(gen[mid] > gen[o] for o in others), (mid, tp, others)


@settings(max_examples=300, **FAST)
@given(groups())
def test_cooperative_sticky_over_two_rounds(g):
    cluster, members = g
    r1 = sticky(cluster, members)
    check_valid(cluster, members, r1, complete=False)
    claims_are_respected(members, r1)
    # Only claimed partitions are ever held back.
    held_back = assignable(cluster, members) - {tp for p in r1.values() for tp in p}
    claimed = {tp for m in members.values() for tp in m.owned_partitions}
    assert held_back <= claimed
    assert sticky(dict(cluster), dict(reversed(list(members.items())))) == r1
    # Second round: everyone revoked what it lost.  Now the assignment is complete and balanced.
    r2 = sticky(cluster, next_round(members, r1, 10))
    check_valid(cluster, members, r2)
    check_locally_balanced(members, r2)
    # Members that kept partitions in round 1 still have them.
    for mid in members:
        assert set(r1[mid]) <= set(r2[mid])
    # And the group is stable from then on.
    assert sticky(cluster, next_round(members, r2, 11)) == r2


@settings(max_examples=300, **FAST)
@given(groups(identical=True))
def test_cooperative_sticky_identical_subscriptions_balance_and_stickiness(g):
    cluster, members = g
    r1 = sticky(cluster, members)
    r2 = sticky(cluster, next_round(members, r1, 10))
    counts = [len(p) for p in r2.values()]
    assert max(counts) - min(counts) <= 1
    # Maximal stickiness: with P partitions over M members, everyone keeps up to P // M of the
    # partitions it rightfully owns, and the P % M larger shares go to members owning more.
    topics = set(next(iter(members.values())).topics)
    total = sum(n for t, n in cluster.items() if t in topics)
    if not total:
        return
    gen = {mid: member_generation(m) for mid, m in members.items()}
    owned = Counter()
    for tp in {tp for m in members.values() for tp in m.owned_partitions}:
        if tp.topic not in cluster or tp.partition >= cluster[tp.topic] or tp.topic not in topics:
            continue
        claim = sorted(((gen[mid], mid) for mid, m in members.items() if tp in m.owned_partitions), reverse=True)
        if len(claim) == 1 or claim[0][0] > claim[1][0]:
            owned[claim[0][1]] += 1
    quota, extra = divmod(total, len(members))
    best = sum(min(n, quota) for n in owned.values()) + min(extra, sum(1 for n in owned.values() if n > quota))
    kept = sum(len(set(r1[mid]) & set(m.owned_partitions)) for mid, m in members.items())
    assert kept == best


@settings(max_examples=100, **FAST)
@given(groups(), st.lists(st.integers(0, 5), max_size=4))
def test_cooperative_sticky_keeps_converging_as_members_come_and_go(g, leavers):
    cluster, members = g
    assignment = sticky(cluster, members)
    for round_no, leave in enumerate(leavers):
        current = next_round(members, assignment, round_no)
        ids = list(current)
        if len(ids) > 1:
            del current[ids[leave % len(ids)]]
        members = current
        assignment = sticky(cluster, members)
        claims_are_respected(members, assignment)
        assignment = sticky(cluster, next_round(members, assignment, round_no + 100))
        check_valid(cluster, members, assignment)
        check_locally_balanced(members, assignment)
