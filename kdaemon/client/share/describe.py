"""Describing a share group for an operator (``kdaemon offsets``), as Kafka's
``kafka-share-groups --describe`` does: its state and members (ShareGroupDescribe, key 77), and
per partition the start offset and the lag (DescribeShareGroupOffsets, key 90; the lag from v1,
KIP-1226).

What the broker gives and what it does not (Kafka 4.4):

* a member: its id, client id, host, rack, epoch, subscription and assignment.  Any number of
  members share a partition: the assignment says which partitions a member fetches from, not
  which records it holds;
* a partition: the *start offset* (SPSO: below it every record is settled) with its leader epoch,
  and the *lag*, the records from the start offset to the end not yet settled (acquired ones
  included).  -1 for both from a partition the group has not started reading (no state yet);
  -1 lag from a v0 broker;
* no per-partition count of acquired (in-flight) records: no API of Kafka 4.4 answers it (the
  share coordinator keeps the in-flight state but only the lag is described), so none is shown.

Both requests go to the group's coordinator through ``ask_coordinator`` (one short-lived client
per call); a coordinator moving or loading is retried within the timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from ...protocol.apis import API_VERSIONS, DESCRIBE_SHARE_GROUP_OFFSETS, SHARE_GROUP_DESCRIBE
from ...protocol.errors import BrokerError, Errors
from ...protocol.versions import broker_ranges
from ..config import ConsumerConfig
from ..group.release import ask_coordinator
from ..types import TopicPartition

__all__ = ["ShareMemberDescription", "ShareGroupDescription", "SharePartitionOffsets", "describe_share_group",
           "share_group_offsets"]


@dataclass(frozen=True)
class ShareMemberDescription:
    member_id: str
    client_id: str
    host: str                               # without the broker's leading "/"
    rack_id: str | None
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    partitions: tuple[TopicPartition, ...]  # sorted


@dataclass(frozen=True)
class ShareGroupDescription:
    group_id: str
    state: str                              # "Empty", "Stable" ("Dead" is answered as no group)
    group_epoch: int
    assignment_epoch: int
    assignor: str                           # the coordinator's share assignor ("simple")
    members: tuple[ShareMemberDescription, ...]   # sorted by member id


@dataclass(frozen=True)
class SharePartitionOffsets:
    start_offset: int | None                # None: the group has no state for it (not started)
    leader_epoch: int | None
    lag: int | None                         # None: unknown (not started, or a v0 answer)


def describe_share_group(config: ConsumerConfig, *, timeout_ms: int | None = None) -> ShareGroupDescription | None:
    """Share group ``config.group_id`` as its coordinator describes it; None when there is no
    share group of that name (GROUP_ID_NOT_FOUND: none at all, or a consumer group) or the
    coordinator has no share groups (no key 77 in its ApiVersions: checked first, since
    ``ask_coordinator`` would retry a request it cannot send until its deadline)."""
    deadline = time.monotonic() + (config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000
    versions = ask_coordinator(config, API_VERSIONS, {"client_software_name": "kdaemon",
                                                      "client_software_version": "describe"}, _left(deadline))
    if SHARE_GROUP_DESCRIBE.key not in broker_ranges(versions):
        return None
    resp = ask_coordinator(config, SHARE_GROUP_DESCRIBE, {"group_ids": [config.group_id]}, _left(deadline),
                           error_of=_first_group_error)
    if not resp["groups"] or resp["groups"][0]["error_code"] == Errors.GROUP_ID_NOT_FOUND:
        return None
    g = resp["groups"][0]
    if g["error_code"]:
        raise BrokerError(g["error_code"], f"ShareGroupDescribe for group {config.group_id}", g["error_message"])
    members = tuple(sorted((ShareMemberDescription(
        m["member_id"], m["client_id"], m["client_host"].lstrip("/"), m["rack_id"], m["member_epoch"],
        tuple(m["subscribed_topic_names"]),
        tuple(sorted(TopicPartition(t["topic_name"], p) for t in m["assignment"]["topic_partitions"]
                     for p in t["partitions"])))
        for m in g["members"]), key=lambda m: m.member_id))
    return ShareGroupDescription(g["group_id"], g["group_state"], g["group_epoch"], g["assignment_epoch"],
                                 g["assignor_name"], members)


def share_group_offsets(config: ConsumerConfig, partitions: Iterable[TopicPartition] | None = None, *,
                        timeout_ms: int | None = None) -> dict[TopicPartition, SharePartitionOffsets]:
    """The start offset, its leader epoch and the lag of each of ``partitions`` (None: every
    partition the group has state for) in share group ``config.group_id``.  Every partition
    asked for is in the answer (a group nobody created answers them as not started).  A
    partition's own error (UNKNOWN_TOPIC_OR_PARTITION ...) raises ``BrokerError``."""
    topics = None
    asked: list[TopicPartition] = []
    if partitions is not None:
        asked = sorted(set(partitions))
        by_topic: dict[str, list[int]] = {}
        for tp in asked:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        topics = [{"topic_name": t, "partitions": ps} for t, ps in by_topic.items()]
    resp = ask_coordinator(config, DESCRIBE_SHARE_GROUP_OFFSETS,
                           {"groups": [{"group_id": config.group_id, "topics": topics}]}, timeout_ms,
                           error_of=_first_group_error)
    out = {tp: SharePartitionOffsets(None, None, None) for tp in asked}
    for g in resp["groups"]:
        if g["error_code"]:
            raise BrokerError(g["error_code"], f"DescribeShareGroupOffsets for group {config.group_id}",
                              g["error_message"])
        for t in g["topics"]:
            for p in t["partitions"]:
                tp = TopicPartition(t["topic_name"], p["partition_index"])
                if p["error_code"]:
                    raise BrokerError(p["error_code"], f"DescribeShareGroupOffsets for {tp} of group "
                                      f"{config.group_id}", p["error_message"])
                start = p["start_offset"]
                out[tp] = SharePartitionOffsets(start if start >= 0 else None,
                                                p["leader_epoch"] if start >= 0 and p["leader_epoch"] >= 0 else None,
                                                p["lag"] if p["lag"] >= 0 else None)
    return out


def _left(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def _first_group_error(resp: dict) -> int:
    # Coordinator trouble (NOT_COORDINATOR, loading) is answered per group: retried by
    # ask_coordinator like a top-level error.
    return resp["groups"][0]["error_code"] if resp["groups"] else 0
