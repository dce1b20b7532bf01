"""Companion processes (``kdaemon_sink_companions`` -> ``CompanionSpec``), with a real supervisor
and a real ``kdaemon run --in-process``.

The plugin is a module written into the test's directory and enabled by Python path; it asks
for one companion, ``probe``, for the jsonl sink, and its entry function leaves files saying
what it was started with and when it got SIGTERM.  The plugin's ``kdaemon_worker_exit`` leaves
the workers' exit times, so the test sees that the companion is stopped after the last worker.
The supervisor knows nothing about the probe but its spec.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kdaemon.plugins.companion import CompanionSpec
from testkit.daemon import Daemon, daemon_config, kdaemon_command, wait_for
from testkit.produce import create_topic

PLUGIN = '''
import json, os, signal, time
from kdaemon.plugins import hookimpl
from kdaemon.plugins.companion import CompanionSpec


def _write(marks, name, **fields):
    fields.update(pid=os.getpid(), t=time.monotonic_ns())
    with open(os.path.join(marks, name + ".tmp"), "w") as fh:
        json.dump(fields, fh)
    os.replace(os.path.join(marks, name + ".tmp"), os.path.join(marks, name))


def serve(marks, settings):
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(time.monotonic_ns()))
    _write(marks, f"start-{os.getpid()}", settings=settings, env_left="KDAEMON_COMPANION" in os.environ)
    while not stop:
        time.sleep(0.02)
    _write(marks, f"stop-{os.getpid()}", got_sigterm=stop[0])
    return 0


@hookimpl
def kdaemon_sink_companions(sink_type, settings, context):
    if sink_type != "jsonl":
        return None
    return [CompanionSpec("probe", entry=__name__ + ":serve",
                          kwargs={"marks": os.environ["KD_COMPANION_MARKS"], "settings": settings},
                          stop_timeout_s=20)]


@hookimpl
def kdaemon_worker_exit(index, exit_code):
    _write(os.environ["KD_COMPANION_MARKS"], f"worker-exit-{os.getpid()}", index=index, exit_code=exit_code)
'''


def _marks(d: Path, prefix: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(d.glob(f"{prefix}-*")) if not p.name.endswith(".tmp")]


def _setup(tmp_path: Path, bootstrap: str, topic: str) -> tuple[dict, dict, Path]:
    marks = tmp_path / "marks"
    marks.mkdir()
    module = f"kd_companion_{uuid.uuid4().hex[:8]}"
    (tmp_path / "pyplugins").mkdir()
    (tmp_path / "pyplugins" / f"{module}.py").write_text(PLUGIN)
    config = daemon_config(tmp_path, bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}")
    config["plugins"] = [f"{module}:"]
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "pyplugins"), os.environ.get("PYTHONPATH")) if p)
    return config, {"PYTHONPATH": pythonpath, "KD_COMPANION_MARKS": str(marks)}, marks


def test_companion_runs_restarts_reloads_and_stops_last(broker, tmp_path):
    topic = f"comp-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    config, env, marks = _setup(tmp_path, broker.bootstrap, topic)
    with Daemon(tmp_path, config, env=env) as d:
        d.wait_all_ready()
        log = d.log()
        first = int(re.search(r"started companion probe \(pid (\d+)\)", log)[1])
        assert log.index("started companion probe") < log.index("started worker 0"), d.log_tail()
        wait_for(lambda: _marks(marks, "start"), 30, "the probe's start mark", d.log_tail)
        [start] = _marks(marks, "start")
        assert start["pid"] == first and start["settings"] == config["sink"], start
        assert start["env_left"] is False   # the kwargs do not stay in its environment

        # Killed: restarted after the first backoff step, by the supervisor alone.
        os.kill(first, signal.SIGKILL)
        d.wait_log(r"companion probe exited with code -9; restarting it in 1\.0s", 30)
        second = int(d.wait_log(r"started companion probe \(pid (\d+)\)", 30, count=2)[1])
        assert second != first
        wait_for(lambda: any(m["pid"] == second for m in _marks(marks, "start")), 30, "the restart's mark",
                 d.log_tail)

        # A reload that does not change its spec leaves it alone ...
        mark = len(d.log())
        config["daemon"]["flush_interval_ms"] = 300
        d.write_config(config)
        d.signal(signal.SIGHUP)
        d.wait_log(r"reloading .*: rolling 2 worker\(s\)", 30, after=mark)
        d.wait_all_ready(90, after=mark)
        assert "companion probe" not in d.log()[mark:], d.log_tail()
        assert len(_marks(marks, "start")) == 2

        # ... one that changes it restarts it with the new spec.
        mark = len(d.log())
        config["sink"]["fsync"] = True
        d.write_config(config)
        d.signal(signal.SIGHUP)
        d.wait_log(r"companion probe stopped with code 0 for the reload; starting it again", 60, after=mark)
        third = int(d.wait_log(r"started companion probe \(pid (\d+)\)", 30, after=mark)[1])
        wait_for(lambda: any(m["pid"] == third for m in _marks(marks, "start")), 30, "the reload's mark",
                 d.log_tail)
        assert next(m for m in _marks(marks, "start") if m["pid"] == third)["settings"]["fsync"] is True
        d.wait_all_ready(90, after=mark)

        workers = set(d.workers().values())
        d.signal(signal.SIGTERM)
        assert d.wait_exit(config["daemon"]["shutdown_timeout_s"] + 30) == 0, d.log_tail()
        log = d.log()
    # Stopped last: its SIGTERM came after every worker had exited.
    exits = [m for m in _marks(marks, "worker-exit") if m["pid"] in workers]
    assert {m["pid"] for m in exits} == workers and all(m["exit_code"] == 0 for m in exits), exits
    stop = next(m for m in _marks(marks, "stop") if m["pid"] == third)
    assert stop["got_sigterm"] > max(m["t"] for m in exits), (stop, exits)
    assert "companion probe stopped with code 0" in log
    assert log.rindex("companion probe stopped with code 0") > max(
        m.end() for m in re.finditer(r"worker \d \(pid \d+\) stopped with code 0", log))


def test_in_process_runs_the_companion_and_stops_it_after_the_worker(broker, tmp_path):
    topic = f"comp-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=1)
    config, env, marks = _setup(tmp_path, broker.bootstrap, topic)
    d = Daemon(tmp_path, config, env=env)   # for its configuration file and log only
    full_env = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
    with open(d.log_path, "ab") as out:
        proc = subprocess.Popen(kdaemon_command() + ["run", "--in-process", "-c", str(d.config_path)],
                                stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=tmp_path)
    try:
        wait_for(lambda: _marks(marks, "start"), 60, "the probe's start mark", d.log_tail)
        d.wait_log(r"kdaemon\.client\.offsets: reset", 60)   # the worker has its partition
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, d.log_tail()
    finally:
        if proc.poll() is None:
            proc.kill()
    [start] = _marks(marks, "start")
    [stop] = _marks(marks, "stop")
    assert stop["pid"] == start["pid"] and start["settings"] == config["sink"]
    assert "companion probe stopped with code 0" in d.log(), d.log_tail()


@pytest.mark.parametrize("kwargs, problem", [
    ({}, "give exactly one of entry or argv"),
    ({"entry": "a:b", "argv": ("x",)}, "give exactly one of entry or argv"),
    ({"entry": "no-function"}, "entry must be 'module:function'"),
    ({"argv": ()}, "argv must be a non-empty sequence of strings"),
    ({"entry": "a:b", "kwargs": {"when": object()}}, "kwargs must be JSON values"),
    ({"entry": "a:b", "restart_backoff_s": (5.0, 1.0)}, "0 < initial <= maximum"),
])
def test_bad_spec_is_refused_by_name(kwargs, problem):
    with pytest.raises(ValueError, match=re.escape(problem)) as exc:
        CompanionSpec("probe", **kwargs)
    assert "companion 'probe'" in str(exc.value)


def test_runner_without_its_environment_says_what_it_is():
    env = {k: v for k, v in os.environ.items() if k != "KDAEMON_COMPANION"}
    proc = subprocess.run([sys.executable, "-m", "kdaemon.supervisor.companion_run", "x:y"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "started by the kdaemon supervisor" in proc.stderr, proc.stderr


def _sleeper(name: str, **env: str) -> CompanionSpec:
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(600)"
    return CompanionSpec(name, argv=(sys.executable, "-c", code), env=env, stop_timeout_s=10)


def test_companions_follow_the_wanted_specs():
    """``Companions`` without a supervisor (``poll`` reaps): retired, wanted again while still
    stopping, changed, unchanged — real processes each time."""
    from kdaemon.supervisor.companions import Companions
    companions = Companions()

    def settle(what):
        def done():
            companions.poll()
            companions.tick()
            return what()
        return wait_for(done, 30, "the companions to settle")

    try:
        companions.configure([_sleeper("a"), _sleeper("b")], log_level="INFO", stop_timeout_s=10)
        companions.tick()
        first = companions.pids()
        assert len(first) == 2
        # "b" is no longer wanted: stopped and forgotten; "a" is unchanged: same process.
        companions.configure([_sleeper("a")], log_level="INFO", stop_timeout_s=10)
        settle(lambda: len(companions.pids()) == 1)
        (a_pid,) = companions.pids()
        assert a_pid in first
        # Changed spec: replaced once the old process has exited.
        companions.configure([_sleeper("a", KD_TAG="2")], log_level="INFO", stop_timeout_s=10)
        settle(lambda: companions.pids() and a_pid not in companions.pids())
        (a2,) = companions.pids()
        # Retired, then wanted again before it was reaped: it comes back as one process.
        companions.configure([], log_level="INFO", stop_timeout_s=10)
        companions.configure([_sleeper("a", KD_TAG="2")], log_level="INFO", stop_timeout_s=10)
        settle(lambda: companions.pids() and a2 not in companions.pids())
        assert len(companions.pids()) == 1
    finally:
        last = companions.pids()
        companions.stop_all()
    assert companions.pids() == set()
    for pid in last:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)   # reaped: no zombie left behind


def test_a_companion_whose_exit_a_restart_cannot_cure_is_not_started_again():
    """Exit 6 (the uploader refusing a Spark its jars are not built for) or any other code of
    ``exit_codes.PERMANENT``: not restarted with backoff, but reported (``refused``), for the
    supervisor to stop the daemon with it; any other code is restarted as before."""
    from kdaemon.exit_codes import EXIT_SINK_REFUSED
    from kdaemon.supervisor.companions import Companions

    def exits(name: str, code: int) -> CompanionSpec:
        return CompanionSpec(name, argv=(sys.executable, "-c", f"import sys; sys.exit({code})"),
                             restart_backoff_s=(0.1, 0.1))
    companions = Companions()
    companions.configure([exits("refuses", EXIT_SINK_REFUSED), exits("fails", 1)], log_level="INFO",
                         stop_timeout_s=10)
    started: dict[str, set[int]] = {"refuses": set(), "fails": set()}

    def turn():
        companions.poll()
        companions.tick()
        for state in companions.states():
            if state.pid is not None:
                started[state.name].add(state.pid)
        return companions.refused() is not None and len(started["fails"]) >= 3
    try:
        wait_for(turn, 30, "the refusal, and the other companion restarted twice")
        assert companions.refused() == ("refuses", EXIT_SINK_REFUSED)
        assert len(started["refuses"]) == 1, started
    finally:
        companions.stop_all()
