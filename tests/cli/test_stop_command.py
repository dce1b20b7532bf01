"""``kdaemon stop`` without a daemon to stop: one line naming the control socket it tried, exit 1
(the stop itself, with and without --leave-group, is in test_stop_and_reset_kafka.py)."""

from __future__ import annotations

import subprocess
import sys

from kdaemon.supervisor.control import socket_path


def test_stop_says_which_socket_it_tried_when_no_daemon_answers(tmp_path):
    state = tmp_path / "state"
    config = tmp_path / "kdaemon.toml"
    config.write_text(f'[daemon]\ntopics = ["t"]\nstate_dir = "{state}"\n\n[kafka]\nbootstrap_servers = '
                      f'"127.0.0.1:1"\ngroup_id = "g"\n\n[sink]\ntype = "null"\n')
    proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "stop", "-c", str(config), "--leave-group"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"kdaemon stop: no kdaemon runs on [daemon] state_dir '{state}'" in proc.stderr, proc.stderr
    assert socket_path(str(state)) in proc.stderr
