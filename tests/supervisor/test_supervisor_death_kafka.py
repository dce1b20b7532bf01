"""A supervisor's death takes its children with it (issue #36), on Apache Kafka.

``kdaemon run`` was SIGKILLed (the OOM killer, an operator's ``kill -9``) with two workers and
the jsonl sink: both workers lived on, one of them still polling its broker half an hour later,
reparented to PID 1, keeping its static group membership (and the state directory's lock) from
the daemon started in its place.  Now each worker sees its supervisor go (a parent-death signal,
its parent pid, its heartbeat pipe), says so in one line, drains as on SIGTERM (flush, commit
what the sink took, keep its static membership for the successor) and exits.

The Spark sink's case (the uploader and its JVM) is test_supervisor_death_spark.py.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid

from testkit.daemon import Daemon, daemon_config, wait_for, wait_gone
from testkit.produce import Writer, committed_offsets, create_topic

PARTITIONS = 4


class Producing(threading.Thread):
    """Keeps producing small records (round robin over the partitions) until ``stop``."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.writer = Writer(bootstrap, topic)
        self._done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            n = 0
            while not self._done.is_set():
                for _ in range(40):
                    self.writer.send(f"r{n}".encode(), partition=n % PARTITIONS)
                    n += 1
                self.writer.poll(0)
                time.sleep(0.02)
            self.writer.flush_checked()
        except BaseException as exc:   # surfaced by stop()
            self.error = exc

    def stop(self) -> dict[int, int]:
        """Stop, wait for every delivery report; each partition's end offset."""
        self._done.set()
        self.join(60)
        assert not self.is_alive() and self.error is None, self.error
        return dict(self.writer.ends)


def positions(records) -> set[tuple[int, int]]:
    return {(r["partition"], r["offset"]) for r in records}


def test_a_killed_supervisors_workers_commit_only_what_the_sink_has_and_exit(kafka, tmp_path):
    topic, group = f"orphans-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    config = daemon_config(tmp_path, kafka.bootstrap, topic, group)
    producing = Producing(kafka.bootstrap, topic)
    with Daemon(tmp_path, config) as d:
        d.wait_all_ready(60)
        producing.start()
        wait_for(lambda: len(d.output()) >= 500, 30, "records in the sink", d.log_tail)
        children = d.descendants()
        assert len(children) == 2, children   # the two workers; the jsonl sink has no companion
        d.signal(signal.SIGKILL)
        d.wait_exit(10)
        wait_gone(children, 30, "the workers to exit after their supervisor was killed", d.log_tail)
        # Each says why, once.
        gone = re.findall(rf"worker-(\d) \S+: supervisor \(pid {d.pid}\) is gone: stopping", d.log())
        assert sorted(gone) == ["0", "1"], d.log_tail()
        assert "Traceback" not in d.log(), d.log_tail()
        # Records kept coming while they drained: nothing committed past what the sink has.
        ends = producing.stop()
        committed = committed_offsets(kafka.bootstrap, group, topic, PARTITIONS)
        stored = positions(d.output())
        assert any(c > 0 for c in committed.values()), committed
        for p, c in committed.items():
            missing = [o for o in range(max(c, 0)) if (p, o) not in stored]
            assert not missing, f"partition {p} committed at {c}, offsets not in the sink: {missing[:10]}"
        first_pid, mark = d.pid, len(d.log())

    # A daemon started right after gets every partition back without fighting a leftover member.
    with Daemon(tmp_path, config) as again:
        again.wait_all_ready(60, after=mark)
        produced = {(p, o) for p, end in ends.items() for o in range(end)}
        wait_for(lambda: produced <= positions(again.output()), 60, "every produced record in the sink",
                 again.log_tail)
        after = again.log()[mark:]
        assert not re.search(r"FENCED_INSTANCE_ID|UNRELEASED_INSTANCE_ID|[Ff]enced", after), again.log_tail()
        assert f"supervisor (pid {first_pid})" not in after
        assert again.stop() == 0, again.log_tail()
