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

from testkit.group_members import KdMember, all_partitions, set_group_session, split_is_complete, wait_until
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
