"""The supervisor's process hooks (``kdaemon_pre_fork``, ``kdaemon_post_fork``,
``kdaemon_worker_exit``) and ``[daemon] metrics_interval_ms``, with a real supervisor.

The plugin is a module written into the test's directory, put on ``PYTHONPATH`` and enabled by
Python path (``plugins = ["<module>:"]``): the way a benchmark or a site hook is enabled without
being an installed distribution.  Each hook leaves a file named after what it saw (index, pid,
config, exit code), so the test reads which process ran which hook, in which order.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from pathlib import Path

import pytest

from kdaemon.config import ConfigError, dump_toml, load
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.produce import create_topic

PLUGIN = '''
import gc, json, os, time
from kdaemon.plugins import hookimpl

MARKS = os.environ["KD_HOOK_MARKS"]


def _mark(name, **fields):
    fields.update(pid=os.getpid(), ppid=os.getppid(), t=time.monotonic_ns())
    with open(os.path.join(MARKS, name), "w") as fh:
        json.dump(fields, fh)


@hookimpl
def kdaemon_pre_fork(index, config):
    _mark(f"pre-{index}-{time.monotonic_ns()}", index=index, group=config.kafka["group_id"])


@hookimpl
def kdaemon_post_fork(index, config):
    if os.environ.get("KD_HOOK_FAIL_POST_FORK"):
        raise RuntimeError("post_fork refuses on purpose")
    _mark(f"post-{index}-{os.getpid()}", index=index, group=config.kafka["group_id"])


@hookimpl
def kdaemon_worker_exit(index, exit_code):
    gc.unfreeze()   # the worker froze what it built; the metrics publisher is among it
    intervals = [o.interval for o in gc.get_objects() if type(o).__name__ == "WorkerMetrics"]
    _mark(f"exit-{index}-{os.getpid()}", index=index, exit_code=exit_code, intervals=intervals)
'''


def _marks(d: Path, prefix: str) -> list[dict]:
    out = []
    for p in sorted(d.glob(f"{prefix}-*")):
        try:
            out.append(json.loads(p.read_text()))
        except ValueError:
            pass   # being written
    return out


def _daemon(tmp_path: Path, bootstrap: str, topic: str, **env) -> tuple[Daemon, Path]:
    marks = tmp_path / "marks"
    marks.mkdir()
    module = f"kd_hooks_{uuid.uuid4().hex[:8]}"
    (tmp_path / "pyplugins").mkdir()
    (tmp_path / "pyplugins" / f"{module}.py").write_text(PLUGIN)
    config = daemon_config(tmp_path, bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", metrics_interval_ms=250)
    config["plugins"] = [f"{module}:"]
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "pyplugins"), os.environ.get("PYTHONPATH")) if p)
    return Daemon(tmp_path, config, env={"PYTHONPATH": pythonpath, "KD_HOOK_MARKS": str(marks), **env}), marks


def test_hooks_run_around_every_worker_process(broker, tmp_path):
    """pre_fork in the supervisor before each fork, post_fork in the child before it is built,
    worker_exit in the child with its exit code (also for a replacement after SIGKILL: the
    killed one has no exit mark, its successor gets pre_fork and post_fork again)."""
    topic = f"hooks-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, partitions=2)
    d, marks = _daemon(tmp_path, broker.bootstrap, topic)
    group = d.config["kafka"]["group_id"]
    with d:
        d.wait_all_ready()
        supervisor = d.pid
        workers = d.workers()
        assert set(workers) == {0, 1}, d.log_tail()
        pre, post = _marks(marks, "pre"), _marks(marks, "post")
        assert sorted(m["index"] for m in pre) == [0, 1], pre
        assert all(m["pid"] == supervisor and m["group"] == group for m in pre), pre
        assert sorted((m["index"], m["pid"]) for m in post) == sorted(workers.items()), (post, workers)
        assert all(m["ppid"] == supervisor and m["group"] == group for m in post), post
        for m in post:   # each child's post_fork after the supervisor's pre_fork for its index
            assert m["t"] > next(p["t"] for p in pre if p["index"] == m["index"]), (pre, post)

        victim = workers[1]
        mark = len(d.log())
        os.kill(victim, signal.SIGKILL)
        # Until it has its assignment a fresh worker may not have its SIGTERM handler yet.
        successor = int(d.wait_log(r"worker 1 \(pid (\d+)\) has its assignment", 60, after=mark)[1])
        assert successor != victim
        assert any(m["pid"] == successor for m in _marks(marks, "post")), _marks(marks, "post")
        assert sorted(m["index"] for m in _marks(marks, "pre")) == [0, 1, 1]

        d.signal(signal.SIGTERM)
        assert d.wait_exit(d.config["daemon"]["shutdown_timeout_s"] + 10) == 0, d.log_tail()
    exits = _marks(marks, "exit")
    assert sorted((m["index"], m["pid"]) for m in exits) == sorted([(0, workers[0]), (1, successor)]), exits
    assert all(m["exit_code"] == 0 for m in exits), exits
    # [daemon] metrics_interval_ms = 250 reached the worker's metrics publisher.
    assert all(m["intervals"] == [0.25] for m in exits), exits


def test_failing_post_fork_is_a_boot_failure(tmp_path):
    """A plugin whose post_fork raises: the worker does not run without it; the supervisor stops
    with exit code 4 instead of restarting it in a loop, and the log names the hook."""
    d, marks = _daemon(tmp_path, "127.0.0.1:1", "t", KD_HOOK_FAIL_POST_FORK="1")
    with d:
        code = d.wait_exit(30)
        log = d.log()
    assert code == 4, log
    assert "a plugin's kdaemon_post_fork failed" in log and "post_fork refuses on purpose" in log, log
    assert "restarting in" not in log
    # worker_exit still ran in the child, with the boot-failure code (the other worker may get
    # the supervisor's SIGTERM before it reaches its own boot failure: no mark from it then).
    failed = int(re.search(r"worker (\d) \(pid \d+\) cannot boot \(exit 4\)", log)[1])
    exits = _marks(marks, "exit")
    assert failed in {m["index"] for m in exits} and all(m["exit_code"] == 4 for m in exits), (exits, log)


@pytest.mark.parametrize("value, problem", [(0, "must be positive"), (-5, "must not be negative"),
                                            ("fast", 'expected an integer, found string "fast"')])
def test_metrics_interval_is_validated(tmp_path, value, problem):
    config = daemon_config(tmp_path, "127.0.0.1:1", "t", "g", metrics_interval_ms=value)
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(config))
    with pytest.raises(ConfigError) as exc:
        load(path)
    assert any("daemon.metrics_interval_ms" in p and problem in p for p in exc.value.problems), exc.value.problems


def test_metrics_interval_default(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g")))
    assert load(path).daemon.metrics_interval_ms == 1000


def test_plugin_by_python_path_that_does_not_import_is_named():
    from kdaemon.plugins.manager import PluginError, PluginManager
    with pytest.raises(PluginError, match=r"plugin 'kd_no_such_module_here:' failed to import: ModuleNotFoundError"):
        PluginManager(["kd_no_such_module_here:"])
    with pytest.raises(PluginError, match=r"plugin 'kdaemon.plugins:nothing' failed to import: AttributeError"):
        PluginManager(["kdaemon.plugins:nothing"])
