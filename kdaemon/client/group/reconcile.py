"""Reconciliation of a KIP-848 member's assignment: pure set logic, no I/O.

Under the consumer group protocol the coordinator sends each member its *target* assignment by
topic id.  The member resolves the ids to names through its metadata, compares the result with
what it owns, gives up what goes (commit, ``on_partitions_revoked``), takes what comes
(``on_partitions_assigned``) and acknowledges by reporting what it owns in its next heartbeat
(as Java's ``AbstractMembershipManager.maybeReconcile``).  Partitions in both sets are not
touched: they keep fetching throughout, which is the point of the incremental protocol.

A topic id the metadata does not know yet stays *unresolved*: the member asks for a metadata
update and reconciles the rest now, the unresolved part once the ids resolve.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..types import TopicPartition

# The target as the coordinator sends it: topic id -> partition numbers.
Target = Mapping[uuid.UUID, Iterable[int]]


@dataclass(frozen=True)
class ResolvedTarget:
    partitions: frozenset[TopicPartition]                 # resolved to names
    topic_ids: Mapping[str, uuid.UUID]                    # name -> id of each resolved topic
    unresolved: Mapping[uuid.UUID, frozenset[int]]        # ids the metadata does not know yet


def resolve_target(target: Target, names: Mapping[uuid.UUID, str]) -> ResolvedTarget:
    """Name what ``names`` (the metadata's id -> name map) can; keep the rest unresolved."""
    partitions: set[TopicPartition] = set()
    ids: dict[str, uuid.UUID] = {}
    unresolved: dict[uuid.UUID, frozenset[int]] = {}
    for topic_id, parts in target.items():
        name = names.get(topic_id)
        if name is None:
            unresolved[topic_id] = frozenset(parts)
            continue
        ids[name] = topic_id
        partitions.update(TopicPartition(name, p) for p in parts)
    return ResolvedTarget(frozenset(partitions), ids, unresolved)


@dataclass(frozen=True)
class Reconciliation:
    revoked: frozenset[TopicPartition]    # owned, not in the target: commit, revoke, drop
    added: frozenset[TopicPartition]      # in the target, not owned: take, then on_partitions_assigned
    kept: frozenset[TopicPartition]       # in both: untouched, fetching throughout

    @property
    def owned_after(self) -> frozenset[TopicPartition]:
        return self.kept | self.added

    @property
    def changes(self) -> bool:
        return bool(self.revoked or self.added)


def plan(owned: Iterable[TopicPartition], target: Iterable[TopicPartition]) -> Reconciliation:
    owned, target = frozenset(owned), frozenset(target)
    return Reconciliation(revoked=owned - target, added=target - owned, kept=owned & target)


def owned_by_topic_id(owned: Iterable[TopicPartition], topic_ids: Mapping[str, uuid.UUID]
                      ) -> tuple[tuple[uuid.UUID, tuple[int, ...]], ...]:
    """What the heartbeat reports as owned (``topic_partitions``), in a canonical order so two
    reports of the same set compare equal.  Every owned partition came from a target, so its
    topic id is known; one that is not is a bug, and raises."""
    by_id: dict[uuid.UUID, list[int]] = {}
    for tp in owned:
        try:
            topic_id = topic_ids[tp.topic]
        except KeyError:
            raise ValueError(f"owned partition {tp} has no known topic id") from None
        by_id.setdefault(topic_id, []).append(tp.partition)
    return tuple(sorted(((tid, tuple(sorted(ps))) for tid, ps in by_id.items()), key=lambda e: str(e[0])))
