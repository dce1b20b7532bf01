"""Two daemons on one host (issue #19), on Apache Kafka.

Started with one configuration, both consumed every record: they shared the static member ids
(``<daemon_id>-<index>``), the metrics directory and the state directory.  Now the second one
refuses to start, in one line naming the first, and exits 2.  And two daemons that share only a
``daemon_id`` and a group (their own state directories): Kafka fences the first one's workers
when the second joins with the same ``group.instance.id``; the fenced worker says why, and its
daemon stops with exit code 5 instead of restarting it into fencing the other in turn."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid

import pytest

from kdaemon.exit_codes import EXIT_CONFIG, EXIT_FENCED
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.produce import create_topic

pytestmark = pytest.mark.kafka


def _topic(kafka, partitions: int = 2) -> str:
    name = f"two-daemons-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, name, partitions)
    return name


def test_a_second_daemon_on_the_same_state_dir_refuses_to_start(kafka, tmp_path):
    topic = _topic(kafka)
    config = daemon_config(tmp_path / "a", kafka.bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}")
    with Daemon(tmp_path / "a", config) as first:
        first.wait_all_ready(60)
        proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(first.config_path)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == EXIT_CONFIG, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert re.fullmatch(
            rf"kdaemon run: \[daemon\] state_dir {re.escape(config['daemon']['state_dir'])} is in use by another "
            rf"kdaemon \(pid {first.pid} on \S+, config {re.escape(str(first.config_path))}; lock \S+kdaemon.lock\): "
            r"two daemons on one state_dir share static member ids, metrics and sink state\. Stop that one, or "
            r"give this one its own state_dir and \[daemon\] daemon_id", lines[0]), lines[0]
        # The first one went on undisturbed: its metrics are still served, its workers the same.
        assert first.alive() and first.metrics()
    # Once it is gone, the directory is free again.
    with Daemon(tmp_path / "a", config) as again:
        again.wait_all_ready(60)


def test_a_fenced_worker_says_why_and_its_daemon_stops(kafka, tmp_path):
    topic = _topic(kafka, partitions=1)
    group = f"g-{uuid.uuid4().hex[:8]}"
    # The same daemon_id ("kd") and group, each its own state_dir: the same group.instance.id kd-0.
    configs = [daemon_config(tmp_path / n, kafka.bootstrap, topic, group, workers=1) for n in ("a", "b")]
    for c in configs:
        # Classic: a static member joining with a known instance id takes its place and the
        # coordinator fences the old one (under KIP-848 the newcomer is refused instead).
        c["kafka"]["group_protocol"] = "classic"
    second = Daemon(tmp_path / "b", configs[1])
    with Daemon(tmp_path / "a", configs[0]) as first:
        first.wait_all_ready(60)
        second.start()
        code = first.wait_exit(90)
        log = first.log()
        assert code == EXIT_FENCED, first.log_tail()
        assert re.search(r"worker stopping: fenced by Kafka \(FENCED_INSTANCE_ID\): group \S+: group_instance_id "
                         r"'kd-0' is in use by another member\. Another consumer joined with this worker's static "
                         r"member id: a second daemon with the same \[daemon\] daemon_id", log), first.log_tail()
        assert re.search(r"worker 0 \(pid \d+\) was fenced by Kafka: another consumer has its static member id "
                         r"\(exit 5\); see its log above\. Stopping every worker instead of restarting it to fence "
                         r"that one in turn", log), first.log_tail()
        assert log.count("started worker 0") == 1, first.log_tail()   # not restarted
        assert "Traceback" not in log, first.log_tail()
        # The second one keeps the partition.
        wait_for(lambda: second.ready_lines(), 60, "the second daemon's worker to get its assignment",
                 second.log_tail)
        assert second.alive()
    second.kill_all()
