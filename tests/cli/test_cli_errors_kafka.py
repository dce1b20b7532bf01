"""The commands that look at Kafka, through the CLI on Apache Kafka (issue #19): the edge cases an
operator types end in one line naming what is wrong and what to do, with an exit code, never a
traceback; ``tail -o`` takes kcat's forms; ``offsets`` counts a group without commits from where
it would start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

from kdaemon.exit_codes import EXIT_CONFIG, EXIT_FAILURE
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

PARTITIONS = 3
PER_PARTITION = 20
# Record i of each partition has timestamp BASE_MS + i s: recent, since a broker deletes
# records older than its retention (7 days) even from the active segment.
BASE_MS = (int(time.time()) - 3600) * 1000


def kdaemon(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def one_line_error(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def write_config(tmp_path: Path, bootstrap: str, topic: str, group: str, reset: str = "earliest") -> Path:
    path = tmp_path / "kdaemon.toml"
    path.write_text(f"""
[daemon]
topics = ["{topic}"]
state_dir = "{tmp_path / 'state'}"

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
auto_offset_reset = "{reset}"

[sink]
type = "jsonl"
path = "{tmp_path / 'out'}"
""")
    return path


@pytest.fixture(scope="module")
def topic(kafka) -> str:
    name = f"cli-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, PARTITIONS)
    for p in range(PARTITIONS):
        produce(kafka.bootstrap, name, [(b"k%d" % i, b'{"p":%d,"i":%d}' % (p, i), (), BASE_MS + i * 1000)
                                        for i in range(PER_PARTITION)], partition=p)
    return name


@pytest.fixture
def config(kafka, topic, tmp_path) -> Path:
    return write_config(tmp_path, kafka.bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}")


def printed(proc) -> list[tuple[int, int]]:
    assert proc.returncode == 0, proc.stderr
    return [(o["partition"], o["offset"]) for o in map(json.loads, proc.stdout.splitlines())]


def test_tail_last_n_of_each_partition(config, topic, tmp_path):
    got = printed(kdaemon("tail", topic, "-c", str(config), "-o", "-3", "--idle-ms", "1500", cwd=tmp_path))
    assert sorted(got) == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION - 3, PER_PARTITION)]
    # More than a partition holds: all of it.
    got = printed(kdaemon("tail", topic, "-c", str(config), "-p", "1", "-o", "-1000", "--idle-ms", "1500",
                          cwd=tmp_path))
    assert got == [(1, o) for o in range(PER_PARTITION)]


def test_tail_from_a_timestamp(config, topic, tmp_path):
    got = printed(kdaemon("tail", topic, "-c", str(config), "-p", "2", "-o", f"s@{BASE_MS + 15_000}",
                          "--idle-ms", "1500", cwd=tmp_path))
    assert got == [(2, o) for o in range(15, PER_PARTITION)]
    # After the last record: nothing yet, and no error (new records would be printed).
    got = printed(kdaemon("tail", topic, "-c", str(config), "-o", f"s@{BASE_MS + 7_200_000}", "--idle-ms", "1000",
                          cwd=tmp_path))
    assert got == []


def test_tail_an_absolute_offset_out_of_range_is_one_line(config, topic, tmp_path):
    proc = kdaemon("tail", topic, "-c", str(config), "-o", "1000000", cwd=tmp_path)
    one_line_error(proc, EXIT_CONFIG, "offset 1000000 is outside", f"{topic}-0 holds 0..{PER_PARTITION - 1}",
                   "use beginning, end")
    assert proc.stdout == ""
    # At the end exactly is where new records come: allowed.
    got = printed(kdaemon("tail", topic, "-c", str(config), "-p", "0", "-o", str(PER_PARTITION),
                          "--idle-ms", "1000", cwd=tmp_path))
    assert got == []


def test_tail_a_partition_that_does_not_exist_is_one_line(config, topic, tmp_path):
    proc = kdaemon("tail", topic, "-c", str(config), "-p", "7", cwd=tmp_path)
    one_line_error(proc, EXIT_CONFIG, f"topic {topic} has no partition 7", f"it has 0-{PARTITIONS - 1}")


def test_tail_bad_offset_forms_are_one_line(config, topic, tmp_path):
    for bad in ("yesterday", "s@", "-x"):
        proc = kdaemon("tail", topic, "-c", str(config), "-o", bad, cwd=tmp_path)
        one_line_error(proc, EXIT_CONFIG, f"-o {bad!r} is not an offset", "s@<timestamp ms>")


def test_tail_a_missing_topic_is_one_line(config, tmp_path):
    proc = kdaemon("tail", "no-such-topic-here", "-c", str(config), cwd=tmp_path)
    one_line_error(proc, EXIT_CONFIG, "topic no-such-topic-here does not exist")


def test_offsets_and_tail_with_an_unreachable_broker_are_one_line(topic, tmp_path):
    config = write_config(tmp_path, "127.0.0.1:1", topic, "g")
    proc = kdaemon("offsets", "-c", str(config), "--timeout-ms", "2000", cwd=tmp_path)
    one_line_error(proc, EXIT_FAILURE, "no answer from Kafka at 127.0.0.1:1", "bootstrap_servers")
    proc = kdaemon("tail", topic, "-c", str(config), "--timeout-ms", "2000", cwd=tmp_path)
    one_line_error(proc, EXIT_FAILURE, "no answer from Kafka at 127.0.0.1:1")


def _offsets_rows(proc) -> tuple[dict[int, list[str]], str]:
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 8 and parts[1].isdigit():
            rows[int(parts[1])] = parts[:5]
    return rows, proc.stdout.splitlines()[-1]


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    c = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[CKTopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        c.close()


def test_offsets_of_a_group_without_commits_counts_from_where_it_would_start(kafka, topic, tmp_path):
    group = f"g-{uuid.uuid4().hex[:8]}"
    earliest = write_config(tmp_path, kafka.bootstrap, topic, group, reset="earliest")
    rows, total = _offsets_rows(kdaemon("offsets", "-c", str(earliest), cwd=tmp_path))
    assert sorted(rows) == list(range(PARTITIONS))
    for p, (_, _, committed, end, lag) in rows.items():
        assert (committed, end, lag) == ("-", str(PER_PARTITION), f"{PER_PARTITION}*")
    assert total.startswith(f"total lag: {PARTITIONS * PER_PARTITION} (* {PARTITIONS} partition(s) without a commit"), total

    # One partition committed half-way: counted from its commit, the others still from earliest.
    commit_offsets(kafka.bootstrap, group, topic, {0: 10})
    rows, total = _offsets_rows(kdaemon("offsets", "-c", str(earliest), cwd=tmp_path))
    assert rows[0][2:] == ["10", str(PER_PARTITION), "10"]
    assert total.startswith(f"total lag: {10 + 2 * PER_PARTITION} (* 2 partition(s)"), total

    latest = tmp_path / "latest"
    latest.mkdir()
    rows, total = _offsets_rows(kdaemon("offsets", "-c", str(write_config(latest, kafka.bootstrap, topic,
                                                                          f"g-{uuid.uuid4().hex[:8]}", "latest")),
                                        cwd=tmp_path))
    assert all(r[4] == "0*" for r in rows.values()) and total.startswith("total lag: 0 ("), total

    none = tmp_path / "none"
    none.mkdir()
    rows, total = _offsets_rows(kdaemon("offsets", "-c", str(write_config(none, kafka.bootstrap, topic,
                                                                        f"g-{uuid.uuid4().hex[:8]}", "none")),
                                        cwd=tmp_path))
    assert all(r[4] == "-" for r in rows.values())
    assert f"unknown for {PARTITIONS} partition(s) without a commit" in total, total


def test_tail_formats_raw_and_headers_as_text(kafka, tmp_path):
    name = f"cli-h-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, 1)
    produce(kafka.bootstrap, name, [(b"k0", b'{"a":1}', [("trace", b"abc"), ("bin", b"\xff\x00")], BASE_MS)],
            partition=0)
    config = tmp_path / "kdaemon.toml"
    config.write_text(write_config(tmp_path, kafka.bootstrap, name, "g").read_text()
                      + '\n[deserializer]\nkey = "str"\nvalue = "json"\n')
    proc = kdaemon("tail", name, "-c", str(config), "-o", "beginning", "-n", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)
    assert obj["key"] == "k0" and obj["value"] == {"a": 1}
    # Header values as text when they are UTF-8, base64 when not.
    assert obj["headers"] == [["trace", "abc"], ["bin", {"base64": "/wA="}]]

    proc = kdaemon("tail", name, "-c", str(config), "-o", "beginning", "-n", "1", "--raw", cwd=tmp_path)
    obj = json.loads(proc.stdout)
    # --raw: the broker's bytes, not the deserializers' output.
    assert obj["key"] == {"base64": "azA="} and obj["value"] == {"base64": "eyJhIjoxfQ=="}, obj

    proc = kdaemon("tail", name, "-c", str(config), "-o", "beginning", "-n", "1", "--raw",
                   "-f", r"%t [%p] at %o: %k=%s (%K/%S) %h\n", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f'{name} [0] at 0: k0={{"a":1}} (2/7) trace=abc,bin=\\xff\x00\n', repr(proc.stdout)

    proc = kdaemon("tail", name, "-c", str(config), "-f", "%q", cwd=tmp_path)
    one_line_error(proc, EXIT_CONFIG, "--format: unknown token(s) %q")


def test_offsets_shows_the_group_its_members_and_who_holds_each_partition(kafka, topic, tmp_path):
    """As kafka-consumer-groups --describe: the group's state and, per partition, the member
    holding it (its static instance id, else its member id), its host and client id; here a
    kafka-python member holds them."""
    from kafka import KafkaConsumer
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path, kafka.bootstrap, topic, group)
    member = KafkaConsumer(topic, bootstrap_servers=kafka.bootstrap, group_id=group, client_id="cli-test-member",
                           enable_auto_commit=False, session_timeout_ms=45000)   # heartbeats starved of CPU under load
    try:
        deadline = time.monotonic() + 180   # a bound: the join, on a machine busy with other suites
        while not member.assignment() and time.monotonic() < deadline:
            member.poll(200)
        held = {tp.partition for tp in member.assignment()}
        assert held == set(range(PARTITIONS)), held
        proc = kdaemon("offsets", "-c", str(config), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert lines[0] == f"consumer group (classic protocol) {group}: Stable, 1 member(s), assignor range", \
            lines[0]
        rows = [line.split() for line in lines if line.split()[:1] == [topic]]
        assert len(rows) == PARTITIONS
        for parts in rows:
            assert parts[5].startswith("cli-test-member-") and parts[7] == "cli-test-member", parts
            assert parts[6] in ("127.0.0.1", "localhost"), parts
    finally:
        member.close(autocommit=False)
    proc = kdaemon("offsets", "-c", str(config), cwd=tmp_path)
    # Left without committing: the coordinator forgets the group.
    assert proc.stdout.splitlines()[0] in (f"consumer group (classic protocol) {group}: Empty, 0 member(s)",
                                           f"group {group}: no group of that name now"), proc.stdout
