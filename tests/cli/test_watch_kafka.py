"""``kdaemon offsets --watch`` end to end on Apache Kafka: the test commits the group's offsets
itself with confluent-kafka (no daemon runs), so each status comes from a known history."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import TopicPartition as CKTopicPartition

from tests.cli.test_cli_errors_kafka import kdaemon, write_config
from testkit.produce import Writer, create_topic, produce

pytestmark = pytest.mark.kafka


class Committer:
    """The group's commits, from one confluent consumer that never joins the group."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.topic = topic
        self.consumer = CKConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def commit(self, offsets: dict[int, int]) -> None:
        self.consumer.commit(offsets=[CKTopicPartition(self.topic, p, o) for p, o in offsets.items()],
                             asynchronous=False)

    def close(self) -> None:
        self.consumer.close()


def setup(kafka, tmp_path: Path, partitions: int = 1, records: int = 20) -> tuple[str, str, Path]:
    topic, group = f"watch-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, partitions)
    for p in range(partitions):
        produce(kafka.bootstrap, topic, [(None, b"%d" % i) for i in range(records)], partition=p)
    return topic, group, write_config(tmp_path, kafka.bootstrap, topic, group)


def group_statuses(stdout: str, group: str) -> list[str]:
    """The group's status of each round: "<time> group g: STATUS (...)"."""
    return [line.split(f" group {group}: ", 1)[1].split()[0] for line in stdout.splitlines()
            if f" group {group}: " in line]


def partition_lines(stdout: str, topic: str) -> list[str]:
    return [line for line in stdout.splitlines() if f" {topic}[" in line]


def watch_while(step, every: float, config, tmp_path, *watch_args: str) -> subprocess.CompletedProcess:
    """``kdaemon offsets --watch`` with ``watch_args``, while ``step()`` runs every ``every``
    seconds (fixed rate) in the background."""
    stop = threading.Event()

    def loop() -> None:
        due = time.monotonic()
        while not stop.is_set():
            step()
            due += every
            stop.wait(max(0.0, due - time.monotonic()))

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        return kdaemon("offsets", "-c", str(config), "--watch", *watch_args, cwd=tmp_path)
    finally:
        stop.set()
        thread.join(10)


def test_offsets_that_stay_put_while_records_come_are_stalled(kafka, tmp_path):
    topic, group, config = setup(kafka, tmp_path)
    committer = Committer(kafka.bootstrap, group, topic)
    committer.commit({0: 5})
    committer.close()
    writer = Writer(kafka.bootstrap, topic)

    def write() -> None:
        writer.send(b"more", partition=0)
        writer.flush_checked()

    proc = watch_while(write, 0.2, config, tmp_path, "--interval", "1", "--window", "3", "--count", "5")
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    # Two polls of a window of three say nothing yet; the third shows the offset unmoved.
    assert group_statuses(proc.stdout, group) == ["OK", "OK", "STALLED", "STALLED", "STALLED"], proc.stdout
    lines = partition_lines(proc.stdout, topic)
    # A line when the status changes, not every round.
    assert [line.split(": ", 1)[1].split()[0] for line in lines] == ["OK", "STALLED"], proc.stdout
    assert "(committed 5, end " in lines[1] and "unmoved over 3 polls" in lines[1], lines[1]
    assert f"group {group}: STALLED (1 partition(s) stalled, total lag " in proc.stdout.splitlines()[-1], proc.stdout


def test_a_group_committed_at_the_end_is_ok(kafka, tmp_path):
    topic, group, config = setup(kafka, tmp_path, partitions=2, records=10)
    committer = Committer(kafka.bootstrap, group, topic)
    committer.commit({0: 10, 1: 10})
    committer.close()
    proc = kdaemon("offsets", "-c", str(config), "--watch", "--interval", "1", "--window", "3", "--count", "3",
                   cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert group_statuses(proc.stdout, group) == ["OK"] * 3, proc.stdout
    lines = partition_lines(proc.stdout, topic)
    assert len(lines) == 2 and all("]: OK (committed 10, end 10, lag 0): caught up" in line for line in lines), lines
    assert proc.stdout.splitlines()[-1].endswith(f"group {group}: OK (2 partition(s) ok, total lag 0)"), proc.stdout


def test_offsets_moving_while_the_lag_grows_are_lagging(kafka, tmp_path):
    topic, group, config = setup(kafka, tmp_path, records=0)
    committer = Committer(kafka.bootstrap, group, topic)
    writer = Writer(kafka.bootstrap, topic)
    committed = [0]

    def consume_slowly() -> None:
        # 10 records written, 3 committed, once a second: the lag grows by 7 at every commit.  The
        # watch polls twice a second, so each commit is first seen before the next records come.
        for _ in range(10):
            writer.send(b"x", partition=0)
        writer.flush_checked()
        committed[0] += 3
        committer.commit({0: committed[0]})

    try:
        proc = watch_while(consume_slowly, 1.0, config, tmp_path, "--interval", "0.5", "--window", "4", "--count", "16")
    finally:
        committer.close()
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    states = group_statuses(proc.stdout, group)
    assert len(states) == 16 and states[-1] == "LAGGING", proc.stdout
    # Offsets that move every second are neither stalled nor stopped (a window spans 1.5 s).
    assert set(states) <= {"OK", "LAGGING"}, proc.stdout
    lagging = [line for line in partition_lines(proc.stdout, topic) if "]: LAGGING" in line]
    assert lagging and "lag grew at each of the last 4 commits" in lagging[0], proc.stdout


def test_ctrl_c_ends_a_watch_with_exit_0(kafka, tmp_path):
    topic, group, config = setup(kafka, tmp_path, records=3)
    proc = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "offsets", "-c", str(config), "--watch",
                             "--interval", "0.5"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    try:
        seen = []
        deadline = time.monotonic() + 30
        while len(group_statuses("\n".join(seen), group)) < 2 and time.monotonic() < deadline:
            seen.append(proc.stdout.readline())
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "Aborted" not in err, err
    # Never committed, counted from auto_offset_reset = "earliest": 3 to go, and nothing moves.
    assert group_statuses("".join(seen) + out, group)[:2] == ["OK", "OK"], seen
