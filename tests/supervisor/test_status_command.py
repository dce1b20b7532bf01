"""``kdaemon status`` against a real daemon: ``kdaemon run`` with two workers on Tansu, asked over
its control socket (``kdaemon/supervisor/control.py``) by the CLI as a user runs it.

What is checked: both workers and their pids (the supervisor's children), every partition held
by exactly one worker, each partition's position and lag adding up to the records produced into
it, a SIGKILLed worker's restart counted with its reason, the socket's mode, its removal at
exit, and the one-line error when no daemon runs (socket missing, or left behind by a killed
daemon)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kdaemon.supervisor.control import socket_path
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.produce import create_topic, produce

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS = 4
PER_PARTITION = 25


def status(config: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", "status", "-c", str(config), *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def status_json(d: Daemon) -> dict:
    proc = status(d.config_path, "--json", cwd=d.root)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr, d.log_tail())
    return json.loads(proc.stdout)


def held(answer: dict) -> dict[tuple[str, int], list[dict]]:
    """(topic, partition) -> every live worker's report of it (one each, if assigned once)."""
    out: dict[tuple[str, int], list[dict]] = {}
    for w in answer["workers"]:
        if w["pid"] is None:
            continue
        for p in w["partitions"]:
            out.setdefault((p["topic"], p["partition"]), []).append({**p, "worker": w["index"]})
    return out


def caught_up(answer: dict, topic: str) -> bool:
    parts = held(answer)
    return (sorted(parts) == [(topic, p) for p in range(PARTITIONS)]
            and all(len(r) == 1 and r[0]["lag"] == 0 and r[0]["position"] == PER_PARTITION for r in parts.values())
            and all(w["state"] == "ready" for w in answer["workers"]))


def test_status_shows_workers_partitions_lag_and_restarts(broker, tmp_path):
    topic, group = f"status-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    for p in range(PARTITIONS):
        produce(broker.bootstrap, topic, [{"value": f"v{p}-{i}".encode()} for i in range(PER_PARTITION)], partition=p)
    config = daemon_config(tmp_path, broker.bootstrap, topic, group)
    with Daemon(tmp_path, config) as d:
        d.wait_all_ready()
        sock = socket_path(config["daemon"]["state_dir"])
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600

        # Every answer while it catches up: position + lag is the partition's end, what we produced.
        def settled():
            answer = status_json(d)
            for reports in held(answer).values():
                for r in reports:
                    if r["position"] is not None and r["lag"] is not None:
                        assert r["position"] + r["lag"] == PER_PARTITION, (r, answer)
            return answer if caught_up(answer, topic) else None
        answer = wait_for(settled, 60, "every partition held once and consumed to its end", d.log_tail,
                          interval=0.5)
        assert answer["pid"] == d.pid
        assert answer["target_workers"] == 2
        workers = {w["index"]: w for w in answer["workers"]}
        assert set(workers) == {0, 1}
        assert {w["pid"] for w in workers.values()} == d.worker_pids() == set(d.workers().values())
        assert all(w["restarts"] == 0 and w["last_restart_reason"] is None for w in workers.values())
        assert sum(w["delivered"] for w in workers.values()) >= PARTITIONS * PER_PARTITION
        assert all(len(w["partitions"]) >= 1 for w in workers.values()), answer   # 4 partitions over 2 workers

        # The table a person reads: not a terminal here, so no control codes.
        table = status(d.config_path, cwd=d.root)
        assert table.returncode == 0, table.stderr
        assert "\x1b[" not in table.stdout
        assert "2/2 workers ready" in table.stdout and f"{PARTITIONS} partitions, lag 0" in table.stdout, table.stdout
        for w in workers.values():
            assert str(w["pid"]) in table.stdout
        rows = [re.findall(r"[\w.-]+", line) for line in table.stdout.splitlines() if topic in line]
        owner = {p: reports[0]["worker"] for p, reports in held(answer).items()}
        assert sorted(rows) == sorted([topic, str(p), str(owner[(topic, p)]), str(PER_PARTITION), "0"]
                                      for p in range(PARTITIONS)), table.stdout

        # A worker killed: its slot's restarts go up, with the reason, and a new pid holds its partitions.
        victim = workers[1]["pid"]
        os.kill(victim, signal.SIGKILL)

        def restarted():
            a = status_json(d)
            w1 = [w for w in a["workers"] if w["index"] == 1]
            return a if (len(w1) == 1 and w1[0]["restarts"] == 1 and w1[0]["pid"] not in (None, victim)
                         and caught_up(a, topic)) else None
        after = wait_for(restarted, 90, "worker 1 restarted and holding its partitions again", d.log_tail,
                         interval=0.5)
        w = {w["index"]: w for w in after["workers"]}
        assert "signal" in w[1]["last_restart_reason"] and "SIGKILL" in w[1]["last_restart_reason"], w[1]
        assert w[0]["restarts"] == 0 and w[0]["pid"] == workers[0]["pid"]

        assert d.stop() == 0
    assert not os.path.exists(sock), "the control socket outlived the daemon"
    gone = status(tmp_path / "kdaemon.toml", cwd=tmp_path)
    assert gone.returncode == 1
    assert gone.stderr.count("\n") == 1 and "Traceback" not in gone.stderr
    assert sock in gone.stderr and "no kdaemon runs" in gone.stderr, gone.stderr


def test_status_says_which_socket_it_tried_when_no_daemon_answers(tmp_path):
    state = tmp_path / "state"
    config = tmp_path / "kdaemon.toml"
    config.write_text(f'[daemon]\ntopics = ["t"]\nstate_dir = "{state}"\n\n[kafka]\nbootstrap_servers = '
                      f'"127.0.0.1:1"\ngroup_id = "g"\n\n[sink]\ntype = "null"\n')
    missing = status(config, cwd=tmp_path)
    assert missing.returncode == 1, missing
    assert f"kdaemon status: no kdaemon runs on [daemon] state_dir '{state}'" in missing.stderr
    assert socket_path(str(state)) in missing.stderr

    # A socket file left by a killed daemon: nothing listens on it.
    state.mkdir()
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(socket_path(str(state)))
    left.close()
    stale = status(config, "--json", cwd=tmp_path)
    assert stale.returncode == 1, stale
    assert "exists but nothing listens" in stale.stderr and socket_path(str(state)) in stale.stderr
    assert stale.stdout == ""


def test_status_names_the_sinks_companion_processes(broker, tmp_path):
    """The probe companion of tests/supervisor/test_companions.py (a plugin loaded by path): its
    name and the pid the supervisor started it with."""
    from tests.supervisor.test_companions import _setup
    topic = f"status-comp-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=1)
    config, env, _ = _setup(tmp_path, broker.bootstrap, topic)
    config["daemon"]["workers"] = 1
    with Daemon(tmp_path, config, env=env) as d:
        d.wait_all_ready()
        pid = int(re.search(r"started companion probe \(pid (\d+)\)", d.log())[1])
        answer = status_json(d)
        assert [(c["name"], c["pid"]) for c in answer["companions"]] == [("probe", pid)], answer
        table = status(d.config_path, cwd=d.root)
        assert re.search(rf"probe\W+{pid}\b", table.stdout), table.stdout
