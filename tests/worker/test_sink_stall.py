"""A sink that stays down: the daemon waits quietly and delivers exactly once when it is back.

The jsonl sink's directory is made read-only while records keep arriving: a read-only bind mount
of it onto itself, which even root cannot write through (root ignores permissions, and the
virtualenv here is not readable by another user); without the right to mount, as another user
than root, a plain chmod does.  Each worker
says so once ("sink unavailable"), pauses, reads nothing again, and reports the stall through
STATUS= and /metrics; once the directory is writable again every record is in the output
exactly once.  The long version (2,000,000 records, ten minutes, RSS and CPU sampled, the Spark
sink too) is testkit/stall/run.py; its figures are in docs/RELIABILITY.md.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.notify_socket import NotifySocket
from testkit.produce import committed_offsets, create_topic, produce

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS = 4


def _produce(bootstrap: str, topic: str, start: int, n: int) -> set[tuple[int, int]]:
    placed = set()
    for p in range(PARTITIONS):
        reports = produce(bootstrap, topic, [{"value": f"v{i}".encode()} for i in range(start + p, start + n, PARTITIONS)],
                          partition=p)
        placed |= {(p, r.offset) for r in reports}
    return placed


class ReadOnly:
    """Makes ``path`` unwritable and writable again: a read-only bind mount as root, else chmod."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mounted = False

    @staticmethod
    def possible(scratch: Path) -> str | None:
        """None if this machine lets the test make a directory read-only, else why not."""
        if os.geteuid() != 0:
            return None   # chmod does it
        probe = scratch / "mount-probe"
        probe.mkdir()
        try:
            done = subprocess.run(["mount", "--bind", str(probe), str(probe)], capture_output=True, text=True)
            if done.returncode != 0:
                return f"running as root without the right to mount: {done.stderr.strip()}"
            subprocess.run(["umount", str(probe)], check=True)
            return None
        finally:
            probe.rmdir()

    def on(self) -> None:
        if os.geteuid() != 0:
            os.chmod(self.path, 0o555)
            return
        subprocess.run(["mount", "--bind", str(self.path), str(self.path)], check=True)
        self.mounted = True
        subprocess.run(["mount", "-o", "remount,bind,ro", str(self.path)], check=True)

    def off(self) -> None:
        if os.geteuid() != 0:
            os.chmod(self.path, 0o755)
        elif self.mounted:
            subprocess.run(["umount", str(self.path)], check=True)
            self.mounted = False


def test_an_unwritable_jsonl_directory_stalls_quietly_then_delivers_once(broker, tmp_path):
    why_not = ReadOnly.possible(tmp_path)
    if why_not:
        pytest.skip(why_not)
    root = tmp_path
    topic, group = f"stall-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    expected = _produce(broker.bootstrap, topic, 0, 2000)
    config = daemon_config(root, broker.bootstrap, topic, group, sink_probe_max_ms=1000, metrics_interval_ms=250)
    config["sink"]["max_age_s"] = 1   # rotate often: a new file is what an unwritable directory refuses
    out = Path(config["sink"]["path"])
    address = str(root / "notify.sock")
    read_only = ReadOnly(out)
    with NotifySocket(address) as sock, Daemon(root, config, env={"NOTIFY_SOCKET": address}) as d:
        try:
            d.wait_all_ready()
            wait_for(lambda: len(d.output()) >= len(expected), 60, "the first records delivered")
            read_only.on()                                      # the sink goes down
            expected |= _produce(broker.bootstrap, topic, 2000, 2000)
            d.wait_log(r"sink unavailable \(", timeout=60)
            sock.wait_for(lambda n: "sink down" in n.message, 30, "STATUS= saying the sink is down")
            wait_for(lambda: d.metrics().get(("kdaemon_sink_down_workers", frozenset()), 0) >= 1, 30,
                     "kdaemon_sink_down_workers")
            held = committed_offsets(broker.bootstrap, group, topic, PARTITIONS)
            time.sleep(10)                                      # the stall goes on: quietly
            assert committed_offsets(broker.bootstrap, group, topic, PARTITIONS) == held   # nothing committed
            log = d.log()
            unavailable = log.count("sink unavailable (")
            assert 1 <= unavailable <= 2, log                   # once per worker that wrote
            assert log.count("rewinding to the last commit") <= unavailable
            read_only.off()                                     # back
            d.wait_log("sink available again after", timeout=30)
            wait_for(lambda: {(r["partition"], r["offset"]) for r in d.output()} >= expected, 60,
                     "every record delivered after the sink came back")
            assert d.stop() == 0, d.log_tail()
        finally:
            read_only.off()
    positions = [(r["partition"], r["offset"]) for r in d.output()]
    assert len(positions) == len(set(positions)) and set(positions) == expected
