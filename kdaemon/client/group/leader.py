"""The classic protocol's embedded consumer protocol: what a member says in its JoinGroup
(its subscription) and what the leader member computes from everyone's (the assignment).

Only the classic protocol has a leader member; under KIP-848 the broker assigns.  Pure
functions over decoded messages and ``ClusterMetadata``: no I/O.
"""

from __future__ import annotations

import logging

from ...protocol.apis.consumer_protocol import decode_subscription, encode_assignment, encode_subscription
from ..metadata import ClusterMetadata
from ..types import TopicPartition
from .assignors import MemberSubscription

# The name the group's log lines have always had (see classic.py).
log = logging.getLogger("kdaemon.client.group.coordinator")


def encode_member_subscription(assignor, subscribed: set[str], owned: list[TopicPartition], generation: int,
                               rack_id: str | None) -> bytes:
    """This member's JoinGroup metadata for ``assignor``: topics, the partitions it owns (for
    cooperative and sticky assignors), its generation and rack."""
    by_topic: dict[str, list[int]] = {}
    for tp in owned:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    topics = sorted(subscribed)
    version = min(getattr(assignor, "version", 3), 3)
    return encode_subscription(version, {
        "topics": topics,
        "user_data": assignor.subscription_user_data(topics, owned),
        "owned_partitions": [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(by_topic.items())],
        "generation_id": generation,
        "rack_id": rack_id,
    })


def assign_as_leader(assignor, resp: dict, metadata: ClusterMetadata, group_id: str
                     ) -> tuple[dict[str, bytes], dict[str, int | None]]:
    """The leader's part of a join: read every member's subscription from the JoinGroup answer
    ``resp`` and compute the assignment unless the broker says to skip it.

    Returns the encoded assignment per member id (empty when skipped) and the partition count
    of every member's topics as known now, which the leader watches for changes."""
    members: dict[str, MemberSubscription] = {}
    for m in resp["members"]:
        _, sub = decode_subscription(bytes(m["metadata"]))
        owned = [TopicPartition(o["topic"], p) for o in sub.get("owned_partitions") or () for p in o["partitions"]]
        members[m["member_id"]] = MemberSubscription(
            member_id=m["member_id"], group_instance_id=m.get("group_instance_id"),
            topics=list(sub["topics"]), owned_partitions=owned,
            generation_id=sub.get("generation_id", -1), rack_id=sub.get("rack_id"),
            user_data=bytes(sub["user_data"]) if sub.get("user_data") is not None else None)
    all_topics = {t for m in members.values() for t in m.topics}
    missing = all_topics - set(metadata.topics)
    if missing:
        # The leader needs partition counts for every member's topics.
        metadata.want(all_topics)
        metadata.request_update()
    partitions = {t: len(metadata.partitions_for(t) or ()) for t in all_topics
                  if metadata.partitions_for(t) is not None}
    if resp.get("skip_assignment"):
        # KIP-814: a static leader that came back keeps the group's current assignment (the
        # broker has it); it only takes over watching every member's topics for partition
        # changes, as Java's onLeaderElected does.  A topic not sized yet is noted without a
        # count (None) and sized when metadata names it: counting it as 0 would rebalance the
        # group for nothing as soon as its metadata arrives.
        watched = {t: partitions.get(t) for t in all_topics}
        log.info("group %s: returning static leader, keeping the current assignment; watching %s",
                 group_id, watched)
        return {}, watched
    # Topics we could not size yet count as 0: when metadata shows them, the snapshot check
    # in needs_rejoin triggers another round.
    watched = {t: partitions.get(t, 0) for t in all_topics}
    assignment = assignor.assign(partitions, members)
    log.info("group %s: leader assigned %s", group_id, {mid: len(tps) for mid, tps in assignment.items()})
    out = {}
    for member_id in members:
        by_topic: dict[str, list[int]] = {}
        for tp in assignment.get(member_id, []):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        out[member_id] = encode_assignment(0, {
            "assigned_partitions": [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(by_topic.items())],
            "user_data": None})
    return out, watched
