"""A child of the supervisor does not outlive it (``kdaemon/supervisor/parent.py``), without a
broker: companions started by ``Companions`` in a stand-in supervisor that the test SIGKILLs,
and a forked worker whose supervisor is gone before it starts.

The daemons' own cases (two workers with the jsonl sink; the uploader, its JVM and the workers
with the Spark sink) are test_supervisor_death_kafka.py and test_supervisor_death_spark.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from kdaemon.supervisor.child import Heartbeat
from testkit.daemon import daemon_config, wait_for, wait_gone

PROBE = '''
import os, signal, sys, time


def _mark(marks, name, text=""):
    with open(os.path.join(marks, name), "w") as fh:
        fh.write(text)


def serve(marks):
    """Stops on SIGTERM, as the uploader does."""
    got = []
    signal.signal(signal.SIGTERM, lambda *_: got.append(1))
    _mark(marks, "started", str(os.getpid()))
    while not got:
        time.sleep(0.02)
    _mark(marks, "stopped", "sigterm")
    return 0


def stuck(marks):
    """Ignores SIGTERM: only the deadline ends it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _mark(marks, "started", str(os.getpid()))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":   # a plain command (CompanionSpec.argv)
    signal.signal(signal.SIGTERM, lambda *_: (_mark(sys.argv[1], "stopped", "sigterm"), sys.exit(0)))
    _mark(sys.argv[1], "started", str(os.getpid()))
    while True:
        time.sleep(0.1)
'''

# The stand-in supervisor: starts one companion with the daemon's own Companions, says its pid,
# and waits to be killed.
SUPERVISOR = '''
import json, sys, time
from kdaemon.plugins.companion import CompanionSpec
from kdaemon.supervisor.companions import Companions

kind, marks, probe = sys.argv[1], sys.argv[2], sys.argv[3]
if kind == "argv":
    spec = CompanionSpec("probe", argv=(sys.executable, probe, marks))
else:
    spec = CompanionSpec("probe", entry=f"kd_parent_probe:{kind}", kwargs={"marks": marks}, stop_timeout_s=2)
companions = Companions()
companions.configure([spec], log_level="INFO", stop_timeout_s=30)
companions.tick()
print(json.dumps(sorted(companions.pids())), flush=True)
time.sleep(600)
'''


def _orphan_companion(tmp_path: Path, kind: str) -> tuple[psutil.Process, Path, Path, int]:
    """Start the stand-in supervisor with a companion of ``kind``, wait until the companion is
    up, SIGKILL the supervisor: (the companion, its marks directory, the log, the dead pid)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    probe = tmp_path / "kd_parent_probe.py"
    probe.write_text(PROBE)
    (tmp_path / "supervisor.py").write_text(SUPERVISOR)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    log = tmp_path / "log"
    with open(log, "wb") as err:
        supervisor = subprocess.Popen([sys.executable, str(tmp_path / "supervisor.py"), kind, str(marks), str(probe)],
                                      stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
    try:
        (pid,) = json.loads(supervisor.stdout.readline())
        companion = psutil.Process(pid)
        wait_for(lambda: (marks / "started").exists(), 60, "the companion to start", log.read_text)
    finally:
        supervisor.kill()
        supervisor.wait(10)
        supervisor.stdout.close()
    return companion, marks, log, supervisor.pid


def _teardown(companion: psutil.Process) -> None:
    try:
        companion.kill()
    except psutil.NoSuchProcess:
        pass


@pytest.mark.parametrize("kind", ["serve", "argv"])
def test_a_companion_gets_its_stop_signal_when_its_supervisor_is_killed(tmp_path, kind):
    companion, marks, log, supervisor = _orphan_companion(tmp_path, kind)
    try:
        wait_gone([companion], 30, "the companion to stop", log.read_text)
        assert (marks / "stopped").read_text() == "sigterm"
        said = log.read_text().count(f"probe kdaemon.companion: supervisor (pid {supervisor}) is gone: stopping")
        # An entry companion says why; a plain command has no Python of ours to say it.
        assert said == (1 if kind == "serve" else 0), log.read_text()
    finally:
        _teardown(companion)


def test_a_companion_that_does_not_stop_is_ended_after_its_stop_timeout(tmp_path):
    companion, marks, log, supervisor = _orphan_companion(tmp_path, "stuck")
    try:
        wait_gone([companion], 30, "the stuck companion to be ended by its own deadline", log.read_text)
        assert f"supervisor (pid {supervisor}) is gone: stopping" in log.read_text()
        assert not (marks / "stopped").exists()
    finally:
        _teardown(companion)


def test_a_worker_whose_supervisor_died_before_it_was_set_up_stops_at_once(tmp_path):
    """The parent-death signal is asked for after the fork: a supervisor that died in between
    never sends it, so the child checks who its parent is right after asking."""
    from kdaemon.config import dump_toml, load
    from kdaemon.exit_codes import EXIT_OK
    from kdaemon.supervisor.child import run_child
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g")))
    config = load(path)
    out = tmp_path / "worker.log"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the "worker": its supervisor is some other process, as after a reparenting
        code = 1
        try:
            sys.stderr = open(out, "w", buffering=1)   # where run_child's logging writes
            code = run_child(config, 0, 1, w, supervisor=os.getppid() + 1_000_000)
        finally:
            os._exit(code)
    os.close(w)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == EXIT_OK
    lines = out.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"WARNING worker-0 kdaemon.supervisor.child: supervisor "
                                                 f"(pid {os.getpid() + 1_000_000}) is gone: stopping"), lines


def test_a_worker_heartbeat_into_a_closed_pipe_says_the_supervisor_is_gone():
    r, w = os.pipe()
    os.close(r)
    heartbeat = Heartbeat(w)
    try:
        heartbeat.waiting()
        assert heartbeat.closed
    finally:
        os.close(w)


def test_a_stray_parent_death_signal_does_not_stop_a_companion(tmp_path):
    """PARENT_GONE_SIGNAL from an operator is not the kernel's: the companion's parent is still there."""
    (tmp_path / "kd_parent_probe.py").write_text(PROBE)
    marks = tmp_path / "marks"
    marks.mkdir()
    code = textwrap.dedent(f'''
        import os, signal, sys, time
        from kdaemon.supervisor.parent import CompanionWatch, PARENT_GONE_SIGNAL
        CompanionWatch(os.getppid(), signal.SIGTERM, 30)
        os.kill(os.getpid(), PARENT_GONE_SIGNAL)
        time.sleep(1)
        print("still here")
    ''')
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "still here", proc.stderr


def test_a_companion_started_by_a_supervisor_already_gone_stops_by_its_parent_pid(tmp_path):
    """No kernel signal comes for a parent that died before the companion asked for it (nor on a
    platform without one): the watcher thread's parent-pid check stops it all the same.  Here
    the launch names a "supervisor" that is not its parent, as after a reparenting."""
    from kdaemon.plugins.companion import CompanionSpec
    from kdaemon.supervisor.companion_run import launch
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "kd_parent_probe.py").write_text(PROBE)
    spec = CompanionSpec("probe", entry="kd_parent_probe:serve", kwargs={"marks": str(marks)})
    gone = os.getpid() + 1_000_000
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    argv, env = launch(spec, "INFO", env, parent=gone, stop_timeout_s=30)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    # Its stop signal comes at once: before the function set its handler (SIGTERM's default
    # action ends it), or after (it stops as it stops for the supervisor).
    assert proc.returncode in (0, -signal.SIGTERM), proc.stderr
    assert proc.returncode == -signal.SIGTERM or (marks / "stopped").read_text() == "sigterm"
    assert proc.stderr.count(f"probe kdaemon.companion: supervisor (pid {gone}) is gone: stopping") == 1, proc.stderr
