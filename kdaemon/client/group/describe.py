"""Describing a group for an operator (``kdaemon offsets``): its state, its protocol and, per
member, the member id, instance id, client id, host and assigned partitions, as
kafka-consumer-groups --describe --members shows them.

Two APIs, one per group protocol, and each knows only its own kind of group:

* ConsumerGroupDescribe (key 69) describes consumer-protocol groups (KIP-848), including classic
  members of a group being upgraded; for a classic group it answers GROUP_ID_NOT_FOUND ("not a
  consumer group"), as for a group nobody created.
* DescribeGroups (key 15) describes classic groups; for a KIP-848 group Kafka (4.4) answers state
  "Dead" without an error, as for a group nobody created.

So, as the Java Admin's describeConsumerGroups does in Kafka 4: ConsumerGroupDescribe first, and
DescribeGroups when it answers GROUP_ID_NOT_FOUND (or UNSUPPORTED_VERSION) for the group, or when
the coordinator's ApiVersions lacks key 69 (a broker before Kafka 3.7: checked first, since
``ask_coordinator`` would retry a request it cannot send until its deadline).  A group neither
knows is "Dead", with no members.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...protocol.apis import API_VERSIONS, CONSUMER_GROUP_DESCRIBE, DESCRIBE_CONFIGS, DESCRIBE_GROUPS
from ...protocol.apis.describe_configs import RESOURCE_GROUP
from ...protocol.apis.consumer_protocol import decode_assignment
from ...protocol.errors import BrokerError, Errors
from ...protocol.versions import broker_ranges
from ..config import ConsumerConfig
from ..types import TopicPartition
from .consumer_heartbeat import LEAVE_STATIC_EPOCH
from .release import ask_coordinator


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    client_id: str
    host: str
    partitions: tuple[TopicPartition, ...]
    # False when the answer does not say what the member holds: a classic member's assignment
    # that is empty bytes (Tansu answers so for a Stable group) or not ConsumerProtocol's.
    assignment_known: bool = True
    # Consumer protocol only (None under classic): the member's epoch.  ``LEAVE_STATIC_EPOCH``
    # (-2) is a static member that left to come back (a stopped daemon's worker): the
    # coordinator keeps it, and its partitions, for its successor until its session times out.
    member_epoch: int | None = None

    @property
    def left_to_come_back(self) -> bool:
        return self.member_epoch == LEAVE_STATIC_EPOCH


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    # Classic: "Stable", "Empty", "PreparingRebalance", "CompletingRebalance"; consumer protocol:
    # "Stable", "Empty", "Assigning", "Reconciling"; "Dead" for no such group.
    state: str
    protocol_type: str    # "consumer" for consumer groups; "" when a classic group is Empty or Dead
    assignor: str         # classic: the protocol the members agreed on ("range", ...); consumer
                          # protocol: the coordinator's assignor ("uniform", "range")
    members: tuple[MemberDescription, ...]
    protocol: str = "classic"   # the group protocol: "classic", "consumer" (KIP-848), "" when Dead

    def owner_of(self, tp: TopicPartition) -> MemberDescription | None:
        return next((m for m in self.members if tp in m.partitions), None)


def describe_group(config: ConsumerConfig, *, timeout_ms: int | None = None) -> GroupDescription:
    """``config.group_id`` as its coordinator describes it, whichever its protocol (see the
    module docstring); ``timeout_ms`` (default ``default_api_timeout_ms``) bounds all the
    requests together.  A group that neither API knows is "Dead", with no members."""
    deadline = time.monotonic() + (config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000

    def remaining_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    versions = ask_coordinator(config, API_VERSIONS, {"client_software_name": "kdaemon",
                                                      "client_software_version": "describe"}, remaining_ms())
    if CONSUMER_GROUP_DESCRIBE.key in broker_ranges(versions):
        described = _describe_consumer_group(config, remaining_ms())
        # A live group without members contradicts itself: Tansu answers so for a classic
        # group, whose members DescribeGroups then shows.
        if described is not None and (described.members or described.state in ("Empty", "Dead")):
            return described
    return _describe_classic_group(config, remaining_ms())


# The per-group answers after which Java's DescribeConsumerGroupsHandler asks DescribeGroups.
_NOT_A_CONSUMER_GROUP = frozenset({Errors.GROUP_ID_NOT_FOUND, Errors.UNSUPPORTED_VERSION})


def _first_group_error(resp: dict) -> int:
    # Both APIs answer coordinator trouble (NOT_COORDINATOR, loading) per group: retried by
    # ask_coordinator like a top-level error.
    return resp["groups"][0]["error_code"] if resp["groups"] else 0


def _describe_consumer_group(config: ConsumerConfig, timeout_ms: int) -> GroupDescription | None:
    """ConsumerGroupDescribe; None when the coordinator has no consumer-protocol group of that
    name (GROUP_ID_NOT_FOUND: a classic group, or none at all) or cannot describe one
    (UNSUPPORTED_VERSION, per group: a coordinator that offers the API but not the protocol)."""
    resp = ask_coordinator(config, CONSUMER_GROUP_DESCRIBE, {"group_ids": [config.group_id]}, timeout_ms,
                           error_of=_first_group_error)
    if not resp["groups"] or resp["groups"][0]["error_code"] in _NOT_A_CONSUMER_GROUP:
        return None
    g = resp["groups"][0]
    if g["error_code"]:
        raise BrokerError(g["error_code"], f"ConsumerGroupDescribe for group {config.group_id}"
                          + (f" ({g['error_message']})" if g["error_message"] else ""))
    # The assignment is the one the member has now (``target_assignment`` is where the
    # coordinator is moving it), with topic names: no metadata lookup by topic id needed.
    members = [MemberDescription(m["member_id"], m["instance_id"], m["client_id"], m["client_host"].lstrip("/"),
                                 tuple(sorted(TopicPartition(t["topic_name"], p)
                                              for t in m["assignment"]["topic_partitions"] for p in t["partitions"])),
                                 member_epoch=m["member_epoch"])
               for m in g["members"]]
    return GroupDescription(g["group_id"], g["group_state"], "consumer", g["assignor_name"],
                            tuple(sorted(members, key=lambda m: m.member_id)), protocol="consumer")


def _describe_classic_group(config: ConsumerConfig, timeout_ms: int) -> GroupDescription:
    """DescribeGroups: "Dead" (no error) for a group it does not know, a KIP-848 one included."""
    resp = ask_coordinator(config, DESCRIBE_GROUPS, {"groups": [config.group_id]}, timeout_ms,
                           error_of=_first_group_error)
    g = resp["groups"][0] if resp["groups"] else {"error_code": 0, "group_state": "Dead"}
    if g["error_code"]:
        raise BrokerError(g["error_code"], f"DescribeGroups for group {config.group_id}")
    if g["group_state"] == "Dead":
        return GroupDescription(config.group_id, "Dead", "", "", (), protocol="")
    members = []
    for m in g["members"]:
        partitions: tuple[TopicPartition, ...] = ()
        known = bool(m["member_assignment"])
        if known:
            try:
                _, assignment = decode_assignment(m["member_assignment"])
                partitions = tuple(TopicPartition(t["topic"], p) for t in assignment["assigned_partitions"]
                                   for p in t["partitions"])
            except ValueError:
                known = False   # not a ConsumerProtocol assignment (a connector, say)
        members.append(MemberDescription(m["member_id"], m["group_instance_id"], m["client_id"],
                                         m["client_host"].lstrip("/"), partitions, known))
    return GroupDescription(g["group_id"], g["group_state"], g["protocol_type"], g["protocol_data"],
                            tuple(sorted(members, key=lambda m: m.member_id)))


SESSION_TIMEOUT_CONFIG = "consumer.session.timeout.ms"   # a group config of KIP-848 (Kafka 4.0+)


def consumer_group_session_timeout_ms(config: ConsumerConfig, *, timeout_ms: int | None = None) -> int | None:
    """The session timeout of consumer-protocol group ``config.group_id``: after it the
    coordinator drops a member that stopped heartbeating, a static member that left with epoch
    -2 included.  DescribeConfigs of the GROUP resource answers the group's own
    ``consumer.session.timeout.ms`` or, without one, the broker's
    ``group.consumer.session.timeout.ms``.  None when the broker cannot say (no GROUP configs
    before Kafka 4.0, no DescribeConfigs at all): the caller words what it knows instead."""
    deadline = time.monotonic() + (config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000

    def remaining_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    versions = ask_coordinator(config, API_VERSIONS, {"client_software_name": "kdaemon",
                                                      "client_software_version": "describe"}, remaining_ms())
    if DESCRIBE_CONFIGS.key not in broker_ranges(versions):
        return None   # asked anyway, ask_coordinator would retry what it cannot send until its deadline
    resp = ask_coordinator(config, DESCRIBE_CONFIGS,
                           {"resources": [{"resource_type": RESOURCE_GROUP, "resource_name": config.group_id,
                                           "configuration_keys": [SESSION_TIMEOUT_CONFIG]}]},
                           remaining_ms(), error_of=lambda r: r["results"][0]["error_code"] if r["results"] else 0)
    found = resp["results"][0] if resp["results"] else None
    if found is None or found["error_code"]:
        return None
    value = next((c["value"] for c in found["configs"] if c["name"] == SESSION_TIMEOUT_CONFIG), None)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
