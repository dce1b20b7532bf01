"""A static member that leaves for good (``Consumer.close(group_membership="leave")``, Java's
``CloseOptions.groupMembershipOperation(LEAVE_GROUP)``, KIP-1092) hands its partitions over at
once, under both protocols; by default it keeps them for its successor until the session times
out.  This is what a kdaemon worker removed by TTOU (or a smaller pool) does.

Each case: two static kdaemon members share a topic with a 30 s session; one closes.  With
"leave" the other holds every partition long before the session could have expired (the
classic LeaveGroup names the instance id, KIP-345; the consumer protocol's leave has epoch -1
instead of -2), and the instance id is free at once for a new member.  With the default the
partitions stay with the closed member's instance (nothing moves for several seconds); that
half keeps the first from passing by accident (say, if the session were short).
"""

from __future__ import annotations

import time
import uuid

import pytest

from kdaemon.client import ConsumerConfig
from kdaemon.client.group.describe import describe_group
from kdaemon.protocol.apis import CONSUMER_GROUP_HEARTBEAT, LEAVE_GROUP, SYNC_GROUP
from testkit.group_members import (JavaMember, KdMember, all_partitions, set_group_session, split_is_complete,
                                   wait_until)
from testkit.kafka_capture import KafkaCapture
from testkit.produce import create_topic

pytestmark = pytest.mark.kafka

SESSION_MS = 30_000
PARTITIONS = 4


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _pair(bootstrap: str, protocol: str, close_membership: str):
    topic, group = _name("leave"), _name("g")
    create_topic(bootstrap, topic, PARTITIONS)
    timing = {} if protocol == "consumer" else {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500}
    if protocol == "consumer":
        set_group_session(bootstrap, group, SESSION_MS)
    members = [KdMember(bootstrap, group, topics=[topic], name=f"kd-{i}", group_protocol=protocol,
                        group_instance_id=f"{group}-{i}", close_membership=close_membership if i == 1 else "default",
                        **timing) for i in range(2)]
    everything = all_partitions(topic, PARTITIONS)
    wait_until(lambda: split_is_complete(members, everything), 90, "a complete split")
    return topic, group, members, everything


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_static_member_leaving_for_good_hands_its_partitions_over_at_once(kafka, protocol):
    topic, group, (stays, goes), everything = _pair(kafka.bootstrap, protocol, "leave")
    try:
        goes.stop()
        stopped = time.monotonic()
        wait_until(lambda: stays.assignment() == everything, 90, "the remaining member holding everything")
        moved_after = time.monotonic() - stopped
        assert moved_after < SESSION_MS / 1000 / 2, f"the partitions moved after {moved_after:.1f} s"
        # The instance id is free: a new member under it joins as a new member, no
        # UNRELEASED_INSTANCE_ID / FENCED_INSTANCE_ID.
        again = KdMember(kafka.bootstrap, group, topics=[topic], name="kd-1-again", group_protocol=protocol,
                         group_instance_id=f"{group}-1",
                         **({} if protocol == "consumer" else {"session_timeout_ms": SESSION_MS,
                                                               "heartbeat_interval_ms": 500}))
        try:
            wait_until(lambda: split_is_complete([stays, again], everything), 90, "a complete split again")
        finally:
            again.stop()
    finally:
        stays.stop()


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_by_default_a_static_member_keeps_its_partitions_for_its_successor(kafka, protocol):
    topic, group, (stays, goes), everything = _pair(kafka.bootstrap, protocol, "default")
    try:
        kept = goes.assignment()
        goes.stop()
        deadline = time.monotonic() + 8.0   # 16 heartbeats of the remaining member
        while time.monotonic() < deadline:
            assert stays.assignment() == everything - kept, "partitions moved although the member may come back"
            time.sleep(0.25)
    finally:
        stays.stop()


# -- the leave on the wire, against Java's ---------------------------------------------------------

def _own_member_id(exchanges, protocol: str) -> str:
    """The member id the client used while a member: its heartbeats' (consumer protocol) or its
    SyncGroup's (classic)."""
    key = CONSUMER_GROUP_HEARTBEAT.key if protocol == "consumer" else SYNC_GROUP.key
    ids = [e.request["member_id"] for e in exchanges if e.api_key == key and e.request is not None
           and e.request.get("member_epoch", 0) >= 0]
    assert ids, f"no {key} request captured"
    return ids[-1]


def _leave_signature(exchanges, protocol: str, instance_id: str) -> tuple:
    """What a leave for good says to the coordinator: KIP-848, the heartbeat with a negative
    epoch (version, epoch, its own member id?, its instance id?; the answer's error); classic,
    the LeaveGroup (version, each member named: its own id?, "own" instance id or what was sent;
    the answer's errors)."""
    own = _own_member_id(exchanges, protocol)
    if protocol == "consumer":
        leaves = [e for e in exchanges if e.api_key == CONSUMER_GROUP_HEARTBEAT.key and e.request is not None
                  and e.request["member_epoch"] < 0]
        assert len(leaves) == 1, [e.request for e in leaves]
        (e,) = leaves
        r = e.request
        return ("ConsumerGroupHeartbeat", e.api_version, r["member_epoch"], r["member_id"] == own,
                r["instance_id"] == instance_id, e.response and e.response["error_code"])
    leaves = [e for e in exchanges if e.api_key == LEAVE_GROUP.key and e.request is not None]
    assert len(leaves) == 1, [e.request for e in leaves]
    (e,) = leaves
    members = tuple((m["member_id"] == own, "own" if m["group_instance_id"] == instance_id else m["group_instance_id"])
                    for m in e.request["members"])
    answer = e.response and (e.response["error_code"], tuple(m["error_code"] for m in e.response["members"]))
    return ("LeaveGroup", e.api_version, members, answer)


def _leave_for_good(kafka, protocol: str, who: str) -> tuple:
    """One static member of a fresh group behind the capturing proxy takes the partition and
    closes leaving for good; its leave's signature, once the coordinator has no member left."""
    topic, group = _name(f"wire-{who}"), _name("g")
    create_topic(kafka.bootstrap, topic, 1)
    instance_id = f"{group}-0"
    with KafkaCapture([(kafka.host, kafka.port)]) as capture:
        if who == "kdaemon":
            timing = {} if protocol == "consumer" else {"session_timeout_ms": SESSION_MS, "heartbeat_interval_ms": 500}
            member = KdMember(capture.bootstrap, group, topics=[topic], name="kd", group_protocol=protocol,
                              group_instance_id=instance_id, close_membership="leave", **timing)
        else:
            member = JavaMember(capture.bootstrap, group, topics=[topic], name="java", group_protocol=protocol,
                                instance_id=instance_id, close_membership="leave",
                                assignor=None if protocol == "consumer" else "range")
        try:
            wait_until(lambda: member.assignment() == all_partitions(topic, 1), 90, f"{who} holding the partition",
                       [member])
        finally:
            member.stop()
        config = ConsumerConfig.from_options(bootstrap_servers=kafka.bootstrap, group_id=group)
        wait_until(lambda: not describe_group(config).members, 30, "the group without members")
        assert capture.errors == [], capture.errors
        return _leave_signature(capture.exchanges(), protocol, instance_id)


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_leave_for_good_is_javas(kafka, protocol):
    """``close(group_membership="leave")`` against Java's
    ``close(CloseOptions.groupMembershipOperation(LEAVE_GROUP))`` (kafka-clients 4.4), for a
    static member.  Under KIP-848 both send the same heartbeat: epoch -1 (not the -2 of a
    temporary leave), their own member id and the instance id.  Under classic both send
    LeaveGroup v5 naming their own member id, but Java leaves the instance id out (null) and
    kdaemon names it (KIP-345's form, as the Admin's removeMembersFromConsumerGroup does): the
    coordinator then also checks that the two belong together, so a stale process cannot take
    its successor out.  A deliberate difference, pinned here.  Either way the coordinator has no
    member left right after the close."""
    kd, java = _leave_for_good(kafka, protocol, "kdaemon"), _leave_for_good(kafka, protocol, "java")
    print(f"\n{protocol}: kdaemon {kd}\n{protocol}: Java    {java}")
    if protocol == "consumer":
        assert kd == java == ("ConsumerGroupHeartbeat", 1, -1, True, True, 0)
    else:
        assert kd == ("LeaveGroup", 5, ((True, "own"),), (0, (0,)))
        assert java == ("LeaveGroup", 5, ((True, None),), (0, (0,)))
