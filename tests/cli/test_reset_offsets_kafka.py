"""``kdaemon offsets --reset-offsets`` against Kafka 4.4's own ``kafka-consumer-groups
--reset-offsets`` (org.apache.kafka.tools.consumer.group.ConsumerGroupCommand, run from the jars
Maven resolved) on the same group (issue #19): for every target, the new offsets the two plan
must be equal; ours, executed, must be what the group then has committed; both refuse a group
with members and a --shift-by without a commit."""

from __future__ import annotations

import subprocess
import time
import uuid
from datetime import datetime, timezone

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

from kdaemon.exit_codes import EXIT_CONFIG, EXIT_FAILURE
from tests.cli.test_cli_errors_kafka import BASE_MS, kdaemon, one_line_error, write_config
from tests.cli.test_cli_errors_kafka import commit_offsets as commit
from testkit.kafka_tools import CONSUMER_GROUPS, kafka_tool
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 20
START = {0: 5, 1: 10, 2: 15}   # the group's commits before each reset


@pytest.fixture(scope="module")
def topic(kafka) -> str:
    name = f"reset-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, PARTITIONS)
    for p in range(PARTITIONS):
        produce(kafka.bootstrap, name, [(b"k%d" % i, b"v", (), BASE_MS + i * 1000) for i in range(PER_PARTITION)],
                partition=p)
    return name


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        found = c.committed([CKTopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        c.close()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}


def kafka_consumer_groups(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    return kafka_tool(CONSUMER_GROUPS, bootstrap, *args)


def plan_of(proc: subprocess.CompletedProcess, group: str, columns: int) -> dict[tuple[str, int], int]:
    """The new offsets of a plan table: kafka-consumer-groups' GROUP TOPIC PARTITION NEW-OFFSET
    (``columns`` 4), ours group topic partition committed new (5)."""
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == columns and parts[0] == group and parts[2].isdigit():
            rows[(parts[1], int(parts[2]))] = int(parts[-1])
    assert rows, proc.stdout
    return rows


def java_plan(proc: subprocess.CompletedProcess, group: str) -> dict[tuple[str, int], int]:
    return plan_of(proc, group, 4)


def our_plan(proc: subprocess.CompletedProcess, group: str) -> dict[tuple[str, int], int]:
    return plan_of(proc, group, 5)


def iso(ms: int, zone: bool = True) -> str:
    text = datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
    return text + "Z" if zone else text


# (our options and kafka-consumer-groups' — the same names — , the offsets the group must then have)
CASES = {
    "earliest": (["--to-earliest"], {0: 0, 1: 0, 2: 0}),
    "latest": (["--to-latest"], {0: 20, 1: 20, 2: 20}),
    "datetime": (["--to-datetime", iso(BASE_MS + 7500)], {0: 8, 1: 8, 2: 8}),
    "datetime-without-zone-is-utc": (["--to-datetime", iso(BASE_MS + 3000, zone=False)], {0: 3, 1: 3, 2: 3}),
    "datetime-after-every-record": (["--to-datetime", iso(BASE_MS + 3_600_000)], {0: 20, 1: 20, 2: 20}),
    "shift-back": (["--shift-by", "-3"], {0: 2, 1: 7, 2: 12}),
    "shift-past-the-end": (["--shift-by", "8"], {0: 13, 1: 18, 2: 20}),
    "shift-before-the-start": (["--shift-by", "-12"], {0: 0, 1: 0, 2: 3}),
    "offset": (["--to-offset", "12"], {0: 12, 1: 12, 2: 12}),
    "offset-past-the-end": (["--to-offset", "1000"], {0: 20, 1: 20, 2: 20}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reset_plans_what_kafka_consumer_groups_plans_and_executes_it(kafka, topic, tmp_path, case):
    target, expected = CASES[case]
    group = f"reset-{case}-{uuid.uuid4().hex[:6]}"
    commit(kafka.bootstrap, group, topic, START)
    config = write_config(tmp_path, kafka.bootstrap, topic, group)

    java = java_plan(kafka_consumer_groups(kafka.bootstrap, "--group", group, "--reset-offsets", *target,
                                           "--topic", topic, "--dry-run"), group)
    ours = our_plan(kdaemon("offsets", "-c", str(config), "--reset-offsets", *target, "--dry-run",
                            cwd=tmp_path), group)
    assert ours == java
    assert ours == {(topic, p): o for p, o in expected.items()}
    assert committed(kafka.bootstrap, group, topic) == START, "a dry run committed"

    proc = kdaemon("offsets", "-c", str(config), "--reset-offsets", *target, "--execute", cwd=tmp_path)
    assert our_plan(proc, group) == java
    assert committed(kafka.bootstrap, group, topic) == expected


def test_reset_of_named_partitions_only(kafka, topic, tmp_path):
    group = f"reset-part-{uuid.uuid4().hex[:6]}"
    commit(kafka.bootstrap, group, topic, START)
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    java = java_plan(kafka_consumer_groups(kafka.bootstrap, "--group", group, "--reset-offsets", "--to-earliest",
                                           "--topic", f"{topic}:0,2", "--dry-run"), group)
    ours = our_plan(kdaemon("offsets", "-c", str(config), "--reset-offsets", "--to-earliest",
                            "--topic", f"{topic}:0,2", "--execute", cwd=tmp_path), group)
    assert ours == java == {(topic, 0): 0, (topic, 2): 0}
    assert committed(kafka.bootstrap, group, topic) == {0: 0, 1: 10, 2: 0}


def test_shift_by_without_a_commit_is_refused_by_both(kafka, topic, tmp_path):
    group = f"reset-bare-{uuid.uuid4().hex[:6]}"
    commit(kafka.bootstrap, group, topic, {0: 5})
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    java = kafka_consumer_groups(kafka.bootstrap, "--group", group, "--reset-offsets", "--shift-by", "1",
                                 "--topic", topic, "--dry-run")
    assert "since there is no current committed offset" in java.stdout + java.stderr, (java.stdout, java.stderr)
    proc = kdaemon("offsets", "-c", str(config), "--reset-offsets", "--shift-by", "1", cwd=tmp_path)
    one_line_error(proc, EXIT_FAILURE, f"{topic}-1, {topic}-2 have none")
    assert committed(kafka.bootstrap, group, topic) == {0: 5, 1: None, 2: None}


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_reset_is_refused_while_the_group_has_members(kafka, topic, tmp_path, protocol):
    group = f"reset-live-{protocol}-{uuid.uuid4().hex[:6]}"
    commit(kafka.bootstrap, group, topic, START)
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
            "group.protocol": protocol}
    member = CKConsumer(conf)
    member.subscribe([topic])
    try:
        deadline = time.monotonic() + 60
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        assert member.assignment(), "the member never got partitions"
        java = kafka_consumer_groups(kafka.bootstrap, "--group", group, "--reset-offsets", "--to-earliest",
                                     "--topic", topic, "--execute")
        assert "can only be reset if the group" in java.stdout and "Stable" in java.stdout, java.stdout
        proc = kdaemon("offsets", "-c", str(config), "--reset-offsets", "--to-earliest", "--execute",
                       cwd=tmp_path)
        one_line_error(proc, EXIT_FAILURE, f"group {group} is Stable with 1 member(s)", "stop every daemon")
    finally:
        member.close()
    assert committed(kafka.bootstrap, group, topic) == START


def test_reset_of_an_emptied_consumer_protocol_group(kafka, topic, tmp_path):
    """A KIP-848 group whose members left: Kafka takes the admin-style commit (epoch -1) from us."""
    group = f"reset-848-{uuid.uuid4().hex[:6]}"
    member = CKConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "group.protocol": "consumer"})
    member.subscribe([topic])
    try:
        deadline = time.monotonic() + 60
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(0.2)
        member.commit(offsets=[CKTopicPartition(topic, p, o) for p, o in START.items()], asynchronous=False)
    finally:
        member.close()
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    java = java_plan(kafka_consumer_groups(kafka.bootstrap, "--group", group, "--reset-offsets", "--to-offset", "1",
                                           "--topic", topic, "--dry-run"), group)
    ours = our_plan(kdaemon("offsets", "-c", str(config), "--reset-offsets", "--to-offset", "1", "--execute",
                            cwd=tmp_path), group)
    assert ours == java
    assert committed(kafka.bootstrap, group, topic) == {0: 1, 1: 1, 2: 1}


@pytest.mark.parametrize("args, needle", [
    (["--reset-offsets"], "needs exactly one of --to-earliest"),
    (["--reset-offsets", "--to-earliest", "--to-latest"], "(got --to-earliest, --to-latest)"),
    (["--reset-offsets", "--to-datetime", "yesterday"], "--to-datetime 'yesterday' is not an ISO 8601 time"),
    (["--reset-offsets", "--to-offset", "-1"], "an offset is >= 0"),
    (["--to-earliest"], "go with --reset-offsets"),
    (["--reset-offsets", "--to-earliest", "--dry-run", "--execute"], "exclude each other"),
    (["--reset-offsets", "--to-earliest", "--topic", "T:x"], "partitions must be numbers"),
])
def test_bad_reset_arguments_are_one_line(kafka, topic, tmp_path, args, needle):
    config = write_config(tmp_path, kafka.bootstrap, topic, f"reset-bad-{uuid.uuid4().hex[:6]}")
    one_line_error(kdaemon("offsets", "-c", str(config), *args, cwd=tmp_path), EXIT_CONFIG, needle)


def test_reset_of_a_partition_that_does_not_exist_is_one_line(kafka, topic, tmp_path):
    config = write_config(tmp_path, kafka.bootstrap, topic, f"reset-np-{uuid.uuid4().hex[:6]}")
    proc = kdaemon("offsets", "-c", str(config), "--reset-offsets", "--to-earliest", "--topic", f"{topic}:7",
                   cwd=tmp_path)
    one_line_error(proc, EXIT_CONFIG, f"topic {topic} has no partition 7")
