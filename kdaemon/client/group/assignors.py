"""Partition assignors: how the group leader shares the subscribed partitions among the members.

Only the leader runs an assignor, and the other members take whatever the leader sends; what has
to match across clients is the protocol *name*, the subscription ``user_data`` format, and — for
cooperative rebalancing — the rule that a partition never has two owners at once.  The results
follow the Java client (``RangeAssignor``, ``RoundRobinAssignor``, ``CooperativeStickyAssignor``)
so a group keeps the same shape whichever client happens to lead it.

Rules that are easy to get wrong:

* Member order is Java's ``AbstractPartitionAssignor.MemberInfo``: static members (with a
  ``group_instance_id``) first, ordered by instance id, then dynamic members by member id.
  Strings compare like Java's ``String.compareTo`` — by UTF-16 code unit, which differs from
  Python's code-point order for characters outside the BMP.  librdkafka compares bytes, and
  instance ids only when both members have one; only the leader's order counts, so mixing is
  harmless, but we pick Java's.
* Topics missing from ``cluster_partitions`` or with no partitions are skipped, and every member
  appears in the result, with an empty list if it gets nothing.
* roundrobin walks the members in a circle and skips the ones not subscribed to the topic at
  hand; the next partition starts *after the member that took the last one* (Java).  librdkafka
  advances its cursor by one per partition instead, which diverges once members are skipped.
* cooperative-sticky never hands a partition to a new owner while another member still claims
  it: such a partition is left out of this round (its owner sees it missing, revokes it, rejoins)
  and is assigned in the next round, when nobody claims it any more (KIP-429, Java's
  ``adjustAssignment``).  Claims come from ``owned_partitions``; when two members claim the same
  partition the higher generation wins, and with equal generations neither does (KIP-792).
  librdkafka also gives a claimed partition of a topic that vanished back to its claimer; Java
  and we do not.

The sticky algorithm is ours, not a port of Java's: keep every valid owned partition, hand the
free ones to the least-loaded eligible member, then even out the counts with chains of moves
until no chain can take a partition from one member and land one on a member holding at least
two fewer (see ``_StickyPlan``).  That is a global optimum, stronger than Java's single-move
``isBalanced`` check: members with identical subscriptions never differ by more than one.  With
identical subscriptions everyone keeps as many owned partitions as a balanced result allows,
and the hand-over of moved partitions completes in the second round.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from ...protocol.apis.consumer_protocol import decode_subscription
from ..types import TopicPartition

__all__ = ["Assignor", "MemberSubscription", "RangeAssignor", "RoundRobinAssignor",
           "CooperativeStickyAssignor", "ASSIGNORS", "get_assignor", "member_generation",
           "UNKNOWN_GENERATION", "RebalanceProtocol"]

RebalanceProtocol = Literal["eager", "cooperative"]

UNKNOWN_GENERATION = -1
# Every assignor sends the newest ConsumerProtocolSubscription: older readers (Java before 2.4,
# old librdkafka) decode the fields they know and ignore the rest.
_SUBSCRIPTION_VERSION = 3

_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


@dataclass(frozen=True)
class MemberSubscription:
    """What one member told the leader in its JoinGroup metadata, decoded."""

    member_id: str
    group_instance_id: str | None = None
    topics: Sequence[str] = ()
    owned_partitions: Sequence[TopicPartition] = ()   # subscription v1+
    generation_id: int = UNKNOWN_GENERATION            # subscription v2+; -1 when unknown
    rack_id: str | None = None                         # subscription v3+
    user_data: bytes | None = None

    @classmethod
    def from_metadata(cls, member_id: str, group_instance_id: str | None, metadata) -> MemberSubscription:
        """Decode a JoinGroup response member's ``metadata`` (raises ``DecodeError`` on bad bytes)."""
        _, sub = decode_subscription(metadata)
        owned = [TopicPartition(o["topic"], p) for o in sub.get("owned_partitions") or () for p in o["partitions"]]
        user_data = sub.get("user_data")
        return cls(member_id=member_id, group_instance_id=group_instance_id, topics=list(sub["topics"]),
                   owned_partitions=owned, generation_id=sub.get("generation_id", UNKNOWN_GENERATION),
                   rack_id=sub.get("rack_id"), user_data=None if user_data is None else bytes(user_data))


@runtime_checkable
class Assignor(Protocol):
    """A partition assignment strategy, named in JoinGroup as a ``consumer`` protocol.

    ``rebalance_protocol`` is the best protocol the assignor supports: "eager" members revoke
    everything before rejoining; a "cooperative" assignor also works when the group runs eager
    (owned partitions are then empty), like every cooperative assignor in the Java client.
    ``version`` is the ConsumerProtocolSubscription version to send with it.
    """

    name: str
    rebalance_protocol: RebalanceProtocol
    version: int

    def subscription_user_data(self, topics: Collection[str], owned: Collection[TopicPartition]) -> bytes | None:
        """The ``user_data`` for this member's subscription (None: send null)."""
        ...

    def assign(self, cluster_partitions: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> dict[str, list[TopicPartition]]:
        """Leader only: member id -> its partitions, for every member; must be pure and deterministic."""
        ...

    def on_assignment(self, assignment: Sequence[TopicPartition], generation: int) -> None:
        """Every member: called with the partitions this member received and the generation."""
        ...


# -- ordering shared by the assignors ----------------------------------------------------------

def _java_order(s: str) -> bytes:
    """A sort key matching Java's ``String.compareTo`` (UTF-16 code units, not code points)."""
    return s.encode("utf-16-be", "surrogatepass")


def _member_info_key(member_id: str, sub: MemberSubscription) -> tuple:
    # Java MemberInfo.compareTo; the member id settles the (impossible in a real group) tie of two
    # members with the same instance id, so the order stays total.
    if sub.group_instance_id is not None:
        return (0, _java_order(sub.group_instance_id), _java_order(member_id))
    return (1, _java_order(member_id), b"")


def _tp_key(tp: TopicPartition) -> tuple[bytes, int]:
    return (_java_order(tp.topic), tp.partition)


def _assignable_topics(cluster_partitions: Mapping[str, int],
                       members: Mapping[str, MemberSubscription]) -> dict[str, int]:
    """Subscribed topics that have partitions, in Java topic order."""
    subscribed = {t for sub in members.values() for t in sub.topics}
    found = {t: n for t, n in cluster_partitions.items() if t in subscribed and n > 0}
    return {t: found[t] for t in sorted(found, key=_java_order)}


def _finish(assignment: Mapping[str, Iterable[TopicPartition]]) -> dict[str, list[TopicPartition]]:
    return {mid: sorted(tps, key=_tp_key) for mid, tps in assignment.items()}


class _NoUserData:
    def subscription_user_data(self, topics: Collection[str], owned: Collection[TopicPartition]) -> bytes | None:
        return None

    def on_assignment(self, assignment: Sequence[TopicPartition], generation: int) -> None:
        pass


# -- range -------------------------------------------------------------------------------------

class RangeAssignor(_NoUserData):
    """Per topic: partitions in order, subscribers in member order, contiguous ranges; the first
    ``partitions % subscribers`` subscribers get one extra.  (No rack-aware variant: it needs the
    replicas' racks, which ``assign`` is not given.)"""

    name = "range"
    rebalance_protocol: RebalanceProtocol = "eager"
    version = _SUBSCRIPTION_VERSION

    def assign(self, cluster_partitions: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> dict[str, list[TopicPartition]]:
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in members}
        ordered = sorted(members, key=lambda mid: _member_info_key(mid, members[mid]))
        topic_sets = {mid: set(members[mid].topics) for mid in members}
        for topic, count in _assignable_topics(cluster_partitions, members).items():
            subscribers = [mid for mid in ordered if topic in topic_sets[mid]]
            per_member, extra = divmod(count, len(subscribers))
            start = 0
            for i, mid in enumerate(subscribers):
                length = per_member + (1 if i < extra else 0)
                result[mid].extend(TopicPartition(topic, p) for p in range(start, start + length))
                start += length
        return _finish(result)


# -- roundrobin --------------------------------------------------------------------------------

class RoundRobinAssignor(_NoUserData):
    """All partitions sorted by (topic, partition), dealt to the members in a circle in member
    order, skipping members not subscribed to the partition's topic."""

    name = "roundrobin"
    rebalance_protocol: RebalanceProtocol = "eager"
    version = _SUBSCRIPTION_VERSION

    def assign(self, cluster_partitions: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> dict[str, list[TopicPartition]]:
        result: dict[str, list[TopicPartition]] = {mid: [] for mid in members}
        ordered = sorted(members, key=lambda mid: _member_info_key(mid, members[mid]))
        topic_sets = [set(members[mid].topics) for mid in ordered]
        cursor = 0
        for topic, count in _assignable_topics(cluster_partitions, members).items():
            for p in range(count):
                # Terminates: the topic is assignable only because some member subscribes to it.
                while topic not in topic_sets[cursor]:
                    cursor = (cursor + 1) % len(ordered)
                result[ordered[cursor]].append(TopicPartition(topic, p))
                cursor = (cursor + 1) % len(ordered)
        return _finish(result)


# -- cooperative-sticky ------------------------------------------------------------------------

def _sticky_user_data_generation(data: bytes) -> int | None:
    """The generation at the end of StickyAssignor user data v1 (what librdkafka sends for its
    sticky assignors): ``[topic STRING, [partition INT32]] generation INT32``.  None if ``data``
    is not exactly that (v0 has no generation)."""
    view = memoryview(data)
    pos = 0
    try:
        (n_topics,) = _INT32.unpack_from(view, pos)
        pos += 4
        if n_topics < 0:
            return None
        for _ in range(n_topics):
            (name_len,) = _INT16.unpack_from(view, pos)
            if name_len < 0:
                return None
            pos += 2 + name_len
            (n_parts,) = _INT32.unpack_from(view, pos)
            if n_parts < 0:
                return None
            pos += 4 + 4 * n_parts
        if pos + 4 != len(view):
            return None
        return _INT32.unpack_from(view, pos)[0]
    except struct.error:
        return None


def member_generation(sub: MemberSubscription) -> int:
    """The generation a member's owned partitions belong to, -1 if unknown.

    The subscription's own field (v2+) comes first.  Otherwise the user data: the Java
    CooperativeStickyAssignor sends the generation as a bare INT32 (what Java leaders before 3.4
    read, since they decode only subscription v0-1), librdkafka sends StickyAssignor user data v1.
    """
    if sub.generation_id != UNKNOWN_GENERATION:
        return sub.generation_id
    data = sub.user_data
    if not data:
        return UNKNOWN_GENERATION
    if len(data) == 4:
        return _INT32.unpack(data)[0]
    found = _sticky_user_data_generation(data)
    return UNKNOWN_GENERATION if found is None else found


class CooperativeStickyAssignor:
    """Balanced, sticky, and safe under the cooperative protocol (KIP-429); see the module doc."""

    name = "cooperative-sticky"
    rebalance_protocol: RebalanceProtocol = "cooperative"
    version = _SUBSCRIPTION_VERSION

    def __init__(self) -> None:
        self.generation = UNKNOWN_GENERATION

    def subscription_user_data(self, topics: Collection[str], owned: Collection[TopicPartition]) -> bytes | None:
        # Java sends the generation here too, even with subscription v2+, for leaders that only
        # read v0-1 subscriptions.  -1 before the first assignment, as in Java.
        return _INT32.pack(self.generation)

    def on_assignment(self, assignment: Sequence[TopicPartition], generation: int) -> None:
        self.generation = generation

    def assign(self, cluster_partitions: Mapping[str, int],
               members: Mapping[str, MemberSubscription]) -> dict[str, list[TopicPartition]]:
        return _StickyPlan(cluster_partitions, members).run()


class _StickyPlan:
    """One leader computation of cooperative-sticky.  Plain data, thrown away afterwards.

    Balance is reached by *moving chains*: member X hands a partition of topic t1 to m1, m1 hands
    one of t2 to m2, ... and the last one lands on Y; only X and Y change counts.  An assignment
    with no such chain from X to Y where X holds at least two more than Y is optimal for every
    convex measure of imbalance at once (Harvey, Ladner, Lovász, Tamir: "Semi-matchings for
    bipartite graphs and load balancing"), so it is balanced globally, not only against single
    moves.  Chains of partitions that changed hands this round ("fresh") are tried before chains
    that take owned partitions from their owners, and each chain takes as few of those as it can.

    That order is also what makes the cooperative hand-over finish in two rounds: in round two
    the members own round one's (optimal) result minus the withheld partitions, so placing the
    withheld partitions alone can reach the optimum again, fresh chains find it, and no owned
    partition moves.
    """

    def __init__(self, cluster_partitions: Mapping[str, int], members: Mapping[str, MemberSubscription]) -> None:
        self.topics = _assignable_topics(cluster_partitions, members)
        # Java's sticky assignors order members by member id alone.
        self.order = sorted(members, key=_java_order)
        self.rank = {mid: i for i, mid in enumerate(self.order)}
        self.topic_list = list(self.topics)   # already in Java topic order
        self.eligible: dict[str, list[str]] = {t: [] for t in self.topics}
        self.subscribed: dict[str, set[str]] = {}
        for mid in self.order:
            wanted = {t for t in members[mid].topics if t in self.topics}
            self.subscribed[mid] = wanted
            for t in wanted:
                self.eligible[t].append(mid)

        # Every member's claims on existing partitions, and who legitimately owns each one.
        self.claimants: dict[TopicPartition, set[str]] = {}
        best: dict[TopicPartition, tuple[int, list[str]]] = {}
        for mid in self.order:
            generation = member_generation(members[mid])
            for tp in set(members[mid].owned_partitions):
                count = self.topics.get(tp.topic)
                if count is None or not 0 <= tp.partition < count:
                    continue
                self.claimants.setdefault(tp, set()).add(mid)
                top = best.get(tp)
                if top is None or generation > top[0]:
                    best[tp] = (generation, [mid])
                elif generation == top[0]:
                    top[1].append(mid)
        # Equal top generations: neither claim is trusted (Java invalidates both).
        self.winner = {tp: mids[0] for tp, (_, mids) in best.items() if len(mids) == 1}

        # member -> topic -> partitions it holds; "fresh": got them this round rather than kept.
        self.held: dict[str, dict[str, set[int]]] = {mid: {} for mid in self.order}
        self.fresh: dict[str, dict[str, set[int]]] = {mid: {} for mid in self.order}
        self.count: dict[str, int] = {mid: 0 for mid in self.order}

    def run(self) -> dict[str, list[TopicPartition]]:
        self._keep_owned()
        self._fill()
        while self._move_chain(fresh_only=True) or self._move_chain(fresh_only=False):
            pass
        return _finish(self._withhold_transfers())

    def _give(self, mid: str, topic: str, partition: int, fresh: bool) -> None:
        self.held[mid].setdefault(topic, set()).add(partition)
        if fresh:
            self.fresh[mid].setdefault(topic, set()).add(partition)
        self.count[mid] += 1

    def _take(self, mid: str, topic: str) -> int:
        """Remove one partition of ``topic`` from ``mid``: a fresh one if it has any."""
        fresh = self.fresh[mid].get(topic)
        partition = max(fresh) if fresh else max(self.held[mid][topic])
        for table in (self.held, self.fresh):
            parts = table[mid].get(topic)
            if parts is not None:
                parts.discard(partition)
                if not parts:
                    del table[mid][topic]
        self.count[mid] -= 1
        return partition

    def _keep_owned(self) -> None:
        for tp, mid in sorted(self.winner.items(), key=lambda item: _tp_key(item[0])):
            # An owner no longer subscribed to the topic loses it (and must revoke it).
            if tp.topic in self.subscribed[mid]:
                self._give(mid, tp.topic, tp.partition, fresh=False)

    def _fill(self) -> None:
        # Topics with the fewest candidates first, as Java does: they have the least choice.
        for topic in sorted(self.topic_list, key=lambda t: len(self.eligible[t])):
            taken = set()
            for mid in self.eligible[topic]:
                taken |= self.held[mid].get(topic, set())
            for partition in range(self.topics[topic]):
                if partition not in taken:
                    # Least loaded; eligible lists are in member order, so ties keep the first.
                    mid = min(self.eligible[topic], key=lambda m: self.count[m])
                    self._give(mid, topic, partition, fresh=True)

    def _move_chain(self, fresh_only: bool) -> bool:
        """Find and apply one chain that evens out a pair of members; False if there is none."""
        active = [m for m in self.order if self.subscribed[m]]
        if not active:
            return False
        lowest = min(self.count[m] for m in active)
        for src in sorted(active, key=lambda m: (-self.count[m], self.rank[m])):
            if self.count[src] - lowest < 2:
                return False   # sources come in decreasing count: nobody further can gain
            path = self._cheapest_chain(src, fresh_only)
            if path is not None:
                for giver, topic, taker in path:
                    self._give(taker, topic, self._take(giver, topic), fresh=True)
                return True
        return False

    def _cheapest_chain(self, src: str, fresh_only: bool) -> list[tuple[str, str, str]] | None:
        """0-1 BFS from ``src`` over members and topics.  A member reaches a topic it holds
        partitions of (cost 0 with a fresh one, 1 with only owned ones, which ``fresh_only``
        forbids); a topic reaches every member subscribed to it.  Returns the hops
        (giver, topic, taker) to the best member holding at least two fewer than ``src``."""
        limit = self.count[src] - 2
        cost: dict[tuple[int, str], int] = {(0, src): 0}
        parent: dict[tuple[int, str], tuple[int, str]] = {}
        queue = deque([(0, (0, src))])
        best = None   # (cost, count, rank, member)
        while queue:
            dist, node = queue.popleft()
            if dist > cost[node]:
                continue
            if best is not None and dist > best[0]:
                break
            kind, name = node
            if kind == 0:   # a member
                if name != src and self.count[name] <= limit:
                    key = (dist, self.count[name], self.rank[name], name)
                    if best is None or key < best:
                        best = key
                for topic in self.topic_list:
                    if topic not in self.held[name]:
                        continue
                    has_fresh = topic in self.fresh[name]
                    if fresh_only and not has_fresh:
                        continue
                    step = 0 if has_fresh else 1
                    nxt = (1, topic)
                    if dist + step < cost.get(nxt, dist + step + 1):
                        cost[nxt] = dist + step
                        parent[nxt] = node
                        (queue.appendleft if step == 0 else queue.append)((dist + step, nxt))
            else:           # a topic
                for mid in self.eligible[name]:
                    nxt = (0, mid)
                    if dist < cost.get(nxt, dist + 1):
                        cost[nxt] = dist
                        parent[nxt] = node
                        queue.appendleft((dist, nxt))
        if best is None:
            return None
        hops = []
        node = (0, best[3])
        while node != (0, src):
            topic_node = parent[node]
            giver = parent[topic_node]
            hops.append((giver[1], topic_node[1], node[1]))
            node = giver
        hops.reverse()
        return hops

    def _withhold_transfers(self) -> dict[str, list[TopicPartition]]:
        """Leave out partitions that another member still claims (KIP-429)."""
        result: dict[str, list[TopicPartition]] = {}
        for mid in self.order:
            keep = []
            for topic, parts in self.held[mid].items():
                for partition in parts:
                    tp = TopicPartition(topic, partition)
                    others = self.claimants.get(tp, set()) - {mid}
                    if not others or self.winner.get(tp) == mid:
                        keep.append(tp)
            result[mid] = keep
        return result


ASSIGNORS: dict[str, type] = {
    RangeAssignor.name: RangeAssignor,
    RoundRobinAssignor.name: RoundRobinAssignor,
    CooperativeStickyAssignor.name: CooperativeStickyAssignor,
}


def get_assignor(name: str) -> Assignor:
    """A new assignor instance for a ``partition.assignment.strategy`` name."""
    try:
        factory = ASSIGNORS[name]
    except KeyError:
        raise ValueError(f"unknown partition assignor {name!r}; known assignors: "
                         f"{', '.join(sorted(ASSIGNORS))}") from None
    return factory()
