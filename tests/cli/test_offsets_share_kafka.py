"""``kdaemon offsets`` for a share group (KIP-932), field by field against Kafka 4.4's own
``kafka-share-groups`` (org.apache.kafka.tools.consumer.group.ShareGroupCommand, run from the
jars Maven resolved) on the same group, at rest:

* ``--describe`` (offsets): per partition the start offset and the lag (KIP-1226), "-" for a
  partition the group has not started reading;
* ``--describe --members``: each member's id, host, client id, partition count and assignment,
  which also shows that Kafka's tool sees kdaemon's members;
* ``--describe --state``: the state and member count.

Two kdaemon ``ShareConsumer`` members on a topic of three partitions, records in the first only:
one acquired them, accepted offsets 0-1 and holds the rest under a 60-s lock (so nothing moves
while the tools run); the other joined later and holds whatever it acquired.  The group id names a share group and
no consumer group, which is how ``offsets`` knows (``[kafka] group_type = "share"`` says it too).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from kdaemon.client import AcknowledgeType, ShareConsumer
from tests.cli.test_cli_errors_kafka import kdaemon
from testkit.group_configs import set_group_configs
from testkit.kafka_tools import kafka_share_groups
from testkit.produce import create_topic, produce
from testkit.share_groups import share_lag, share_members

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 10
WAIT = 60.0


def write_config(tmp_path: Path, bootstrap: str, topic: str, group: str) -> Path:
    path = tmp_path / "kdaemon.toml"
    path.write_text(f"""
[daemon]
topics = ["{topic}"]
state_dir = "{tmp_path / 'state'}"

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"

[sink]
type = "jsonl"
path = "{tmp_path / 'out'}"
""")
    return path


def test_offsets_of_a_share_group_match_kafka_share_groups(kafka, tmp_path: Path):
    topic, group = f"shoff-{uuid.uuid4().hex[:8]}", f"shoff-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    produce(kafka.bootstrap, topic, [(b"k", b"v%d" % i, []) for i in range(PER_PARTITION)], partition=0)
    set_group_configs(kafka.bootstrap, group, {"share.auto.offset.reset": "earliest",
                                               "share.record.lock.duration.ms": "60000"})
    holder = ShareConsumer(kafka.bootstrap, group_id=group, client_id="kd-holder",
                           share_acknowledgement_mode="explicit")
    idle = ShareConsumer(kafka.bootstrap, group_id=group, client_id="kd-idle", share_acknowledgement_mode="explicit")
    try:
        holder.subscribe([topic])
        got: list = []
        deadline = time.monotonic() + WAIT
        while not got:
            assert time.monotonic() < deadline, "the holder never acquired a record"
            got = [r for rs in holder.poll(200).values() for r in rs]
        for r in got:
            if r.offset < 2:
                holder.acknowledge(r, AcknowledgeType.ACCEPT)
        assert all(e is None for e in holder.commit_sync().values())
        # The second member joins; whatever it acquires (partition 0's records the holder's
        # first fetch did not take) it holds: no poll after one that returned records.
        idle.subscribe([topic])
        idle_got: list = []
        deadline = time.monotonic() + WAIT
        while True:
            members = share_members(kafka.host, kafka.port, group)
            if len(members) == 2 and all(parts for _, parts in members.values()) and \
                    set().union(*(parts for _, parts in members.values())) == {(topic, p) for p in range(PARTITIONS)}:
                break
            assert time.monotonic() < deadline, members
            if idle_got:
                time.sleep(0.2)
            else:
                idle_got = [r for rs in idle.poll(200).values() for r in rs]
        # Accepted offsets 0-1 are in the share coordinator's state once the lag is 8.  Its start
        # offset moves to 2 when the coordinator next checkpoints the partition (not at once):
        # both tools read the same state, so ours runs between two runs of Kafka's that agree.
        deadline = time.monotonic() + WAIT
        while share_lag(kafka.host, kafka.port, group).get((topic, 0), (0, 0))[1] != PER_PARTITION - 2:
            assert time.monotonic() < deadline, share_lag(kafka.host, kafka.port, group)
            time.sleep(0.2)
        config = write_config(tmp_path, kafka.bootstrap, topic, group)
        for _ in range(3):
            java_offsets = kafka_share_groups(kafka.bootstrap, "--describe", "--group", group)
            ours = kdaemon("offsets", "-c", str(config), cwd=tmp_path)
            if kafka_share_groups(kafka.bootstrap, "--describe", "--group", group) == java_offsets:
                break
        assert ours.returncode == 0 and "Traceback" not in ours.stderr, (ours.stdout, ours.stderr)
        lines = [line.split() for line in ours.stdout.splitlines() if line.strip()]
        java_members = kafka_share_groups(kafka.bootstrap, "--describe", "--group", group, "--members")
        java_state = kafka_share_groups(kafka.bootstrap, "--describe", "--group", group, "--state")
    finally:
        idle.close()
        holder.close()

    # Offsets: GROUP TOPIC PARTITION START-OFFSET LAG, against ours: topic partition start end lag.
    assert java_offsets[0] == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"], java_offsets
    java_rows = {(r[1], int(r[2])): (r[3], r[4]) for r in java_offsets[1:]}
    our_rows = {(r[0], int(r[1])): (r[2], r[4]) for r in lines if len(r) == 5 and r[0] == topic}
    ends = {(r[0], int(r[1])): r[3] for r in lines if len(r) == 5 and r[0] == topic}
    assert our_rows == java_rows, (ours.stdout, java_offsets)
    assert our_rows[(topic, 0)] in (("0", str(PER_PARTITION - 2)), ("2", str(PER_PARTITION - 2))), ours.stdout
    assert ends == {(topic, p): str(PER_PARTITION if p == 0 else 0) for p in range(PARTITIONS)}, ours.stdout

    # Members: GROUP CONSUMER-ID HOST CLIENT-ID #PARTITIONS ASSIGNMENT, against ours: member host
    # client #partitions assignment (the broker's "/" before the host dropped, as for consumer groups).
    assert java_members[0] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID", "#PARTITIONS", "ASSIGNMENT"]
    java_by_id = {r[1]: (r[2].lstrip("/"), r[3], r[4], r[5]) for r in java_members[1:]}
    header = lines.index(["member", "host", "client", "#partitions", "assignment"])
    our_by_id = {r[0]: tuple(r[1:]) for r in lines[header + 1:header + 1 + len(java_by_id)]}
    assert our_by_id == java_by_id, (ours.stdout, java_members)
    assert set(java_by_id) == {holder.member_id, idle.member_id}
    # The simple assignor spreads the partitions over the members (all of them to each only when
    # there are more members than partitions); what the broker answered is what both tools show.
    assert {v[1] for v in java_by_id.values()} == {"kd-holder", "kd-idle"}, java_members
    assert {(topic, int(p)) for v in java_by_id.values() for p in v[3].split(":")[1].split(",")} == \
        {(topic, p) for p in range(PARTITIONS)}, java_members

    # State: GROUP COORDINATOR (ID) STATE #MEMBERS, against our first line.
    assert java_state[0][-2:] == ["STATE", "#MEMBERS"], java_state
    state, members = java_state[1][-2:]
    assert lines[0][:6] == ["share", "group", f"{group}:", f"{state},", members, "member(s),"], ours.stdout
