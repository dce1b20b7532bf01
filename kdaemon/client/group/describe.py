"""Describing a classic group for an operator (``kdaemon offsets``): its state and, per member,
the member id, instance id, client id, host and assigned partitions (DescribeGroups, as
kafka-consumer-groups --describe --members shows them)."""

from __future__ import annotations

from dataclasses import dataclass

from ...protocol.apis import DESCRIBE_GROUPS
from ...protocol.apis.consumer_protocol import decode_assignment
from ...protocol.errors import BrokerError
from ..config import ConsumerConfig
from ..types import TopicPartition
from .release import ask_coordinator


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str            # "Stable", "Empty", "PreparingRebalance", ..., "Dead" (no such group)
    protocol_type: str    # "consumer" for consumer groups; "" when Empty or Dead
    assignor: str         # the protocol the members agreed on ("range", "cooperative-sticky", ...)
    members: tuple[MemberDescription, ...]

    def owner_of(self, tp: TopicPartition) -> MemberDescription | None:
        return next((m for m in self.members if tp in m.partitions), None)


def describe_group(config: ConsumerConfig, *, timeout_ms: int | None = None) -> GroupDescription:
    """``config.group_id`` as its coordinator describes it.  DescribeGroups knows classic groups
    only: Kafka (4.4) answers "Dead", without an error, for a group of the consumer protocol
    (KIP-848) as for one that does not exist (``GroupDescription.state``)."""
    resp = ask_coordinator(config, DESCRIBE_GROUPS, {"groups": [config.group_id]}, timeout_ms,
                           error_of=lambda r: r["groups"][0]["error_code"] if r["groups"] else 0)
    if not resp["groups"]:
        return GroupDescription(config.group_id, "Dead", "", "", ())
    g = resp["groups"][0]
    if g["error_code"]:
        raise BrokerError(g["error_code"], f"DescribeGroups for group {config.group_id}")
    members = []
    for m in g["members"]:
        partitions: tuple[TopicPartition, ...] = ()
        if m["member_assignment"]:
            try:
                _, assignment = decode_assignment(m["member_assignment"])
                partitions = tuple(TopicPartition(t["topic"], p) for t in assignment["assigned_partitions"]
                                   for p in t["partitions"])
            except ValueError:
                partitions = ()   # not a ConsumerProtocol assignment (a connector, say)
        members.append(MemberDescription(m["member_id"], m.get("group_instance_id"), m["client_id"],
                                         m["client_host"].lstrip("/"), partitions))
    return GroupDescription(g["group_id"], g["group_state"], g["protocol_type"], g["protocol_data"],
                            tuple(sorted(members, key=lambda m: m.member_id)))
