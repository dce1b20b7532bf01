"""The arbiter's signal handlers, called directly (no fork, no broker): what they tell systemd
and what they start, in the cases the end-to-end tests cannot time reliably."""

from __future__ import annotations

import pytest

from kdaemon.config import dump_toml, load
from kdaemon.supervisor import arbiter as arbiter_module
from kdaemon.supervisor import configs as configs_module
from kdaemon.supervisor.arbiter import Arbiter
from testkit.daemon import daemon_config


@pytest.fixture
def arbiter(tmp_path, monkeypatch):
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g")))
    sent: list[str] = []
    monkeypatch.setattr(arbiter_module.sdnotify, "notify", lambda message, **kw: sent.append(message) or True)
    a = Arbiter(str(path), load(path))
    a.sent = sent
    return a


def test_sighup_after_sigterm_is_ignored(arbiter, monkeypatch):
    def must_not_validate(path):
        raise AssertionError("a reload was attempted while stopping")
    monkeypatch.setattr(configs_module, "validate_in_child", must_not_validate)
    arbiter.handle_term()
    config = arbiter.config
    arbiter.handle_hup()
    assert arbiter.sent == ["STOPPING=1"]
    assert arbiter.config is config and arbiter._rolling == [] and arbiter._roll_waiting is None


def test_sighup_with_a_broken_file_changes_nothing(arbiter, caplog):
    config = arbiter.config
    with open(arbiter.config_path, "a") as fh:
        fh.write("[daemon\n")
    arbiter.handle_hup()
    assert arbiter.sent == []
    assert arbiter.config is config and arbiter._rolling == []
    assert "reload refused, keeping the running configuration" in caplog.text
    assert "not valid TOML" in caplog.text


def test_rss_recycling_waits_for_the_last_replacement(tmp_path, monkeypatch):
    """A worker above max_worker_rss_mb is recycled (stopped, its successor started, and only
    then the next one): the sampler must not start another replacement while the last one's
    successor is not ready yet.  The "worker" is this test process (real RSS, far above 1 MB)."""
    import os
    import time

    from kdaemon.supervisor.arbiter import WorkerProc
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g", max_worker_rss_mb=1)))
    monkeypatch.setattr(arbiter_module.sdnotify, "notify", lambda message, **kw: True)
    a = Arbiter(str(path), load(path))
    now = time.monotonic()
    r, w = os.pipe()
    try:
        a.workers[os.getpid()] = WorkerProc(1, os.getpid(), r, now, now)
        a._roll_waiting = 0            # worker 0 was just replaced; its successor is not ready
        a._sample_resources()
        assert a._rolling == [] and a._roll_waiting == 0
        a._roll_waiting = None         # it is: now worker 1 is recycled
        a._next_sample = 0.0
        a._sample_resources()
        assert a._rolling == [1]
    finally:
        os.close(r)
        os.close(w)


@pytest.mark.parametrize("code", sorted(arbiter_module._STOPS_THE_DAEMON))
def test_a_worker_exit_a_restart_cannot_cure_stops_every_worker_gracefully_and_the_daemon_with_it(arbiter, monkeypatch,
                                                                                              code, caplog):
    """A worker that stopped on an error policy, could not boot, was fenced, or was refused for
    good by its sink is not restarted: the others are stopped as on SIGTERM and the daemon
    exits with that worker's code, which systemd does not restart (PERMANENT)."""
    import os
    import time

    from kdaemon.exit_codes import PERMANENT
    from kdaemon.supervisor.arbiter import WorkerProc
    stopped: list[int] = []
    monkeypatch.setattr(arbiter, "_stop_worker", lambda proc, **kw: stopped.append(proc.index))
    now = time.monotonic()
    r, w = os.pipe()
    try:
        for i in range(3):   # pids nobody signals: _stop_worker is the test's
            arbiter.workers[-1 - i] = WorkerProc(i, -1 - i, r, now, now)
        failed = arbiter.workers.pop(-1)
        arbiter._on_exit(failed, code)
        assert arbiter._stopping and arbiter._exit_code == code and sorted(stopped) == [1, 2]
        assert arbiter.sent == ["STOPPING=1"] and code in PERMANENT
        assert f"worker 0 (pid -1) {arbiter_module._STOPS_THE_DAEMON[code][0]} (exit {code})" in caplog.text
        arbiter._on_exit(arbiter.workers.pop(-2), 0)   # the others stop cleanly: the code stays
        assert arbiter._exit_code == code
    finally:
        os.close(r)
        os.close(w)


class _Kills:
    """``os.kill`` as the arbiter calls it, recorded instead of sent (the pids are made up)."""

    def __init__(self, monkeypatch) -> None:
        self.sent: list[tuple[int, int]] = []
        monkeypatch.setattr(arbiter_module.os, "kill", lambda pid, sig: self.sent.append((pid, sig)))


def _with_workers(a, *pids):
    import time

    from kdaemon.supervisor.arbiter import WorkerProc
    now = time.monotonic()
    for i, pid in enumerate(pids):
        a.workers[pid] = WorkerProc(i, pid, -1, now, now)
    return a


def _arbiter(tmp_path, monkeypatch, **daemon):
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g", **daemon)))
    monkeypatch.setattr(arbiter_module.sdnotify, "notify", lambda message, **kw: True)
    return Arbiter(str(path), load(path))


def test_sigterm_keeps_the_static_memberships_by_default(tmp_path, monkeypatch):
    import signal
    kills = _Kills(monkeypatch)
    a = _with_workers(_arbiter(tmp_path, monkeypatch), 101, 102)
    a.handle_term()
    assert kills.sent == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    assert not any(w.retiring for w in a.workers.values())


def test_sigterm_leaves_the_group_when_on_stop_says_so(tmp_path, monkeypatch):
    from kdaemon.supervisor.child import RETIRE_SIGNAL
    kills = _Kills(monkeypatch)
    a = _with_workers(_arbiter(tmp_path, monkeypatch, on_stop="leave_group"), 101, 102)
    a.handle_term()
    assert kills.sent == [(101, RETIRE_SIGNAL), (102, RETIRE_SIGNAL)]
    assert all(w.retiring and w.stopping for w in a.workers.values())


def test_the_retire_signal_stops_the_daemon_leaving_the_group_also_after_a_sigterm(tmp_path, monkeypatch):
    """kdaemon stop --leave-group (RETIRE_SIGNAL to the supervisor), also while a SIGTERM's stop
    is under way: the workers still running are told to leave for good, and their kill deadline
    (shutdown_timeout_s) still runs from the first signal."""
    import signal

    from kdaemon.supervisor.child import RETIRE_SIGNAL
    kills = _Kills(monkeypatch)
    a = _with_workers(_arbiter(tmp_path, monkeypatch), 101, 102)
    a.handle_term()
    first = {pid: w.stop_sent_at for pid, w in a.workers.items()}
    a.handle_retire()
    assert kills.sent == [(101, signal.SIGTERM), (102, signal.SIGTERM), (101, RETIRE_SIGNAL), (102, RETIRE_SIGNAL)]
    assert {pid: w.stop_sent_at for pid, w in a.workers.items()} == first
    a.handle_retire()
    a.handle_term()
    assert len(kills.sent) == 4   # nothing more to say

    kills.sent.clear()
    b = _with_workers(_arbiter(tmp_path / "b", monkeypatch), 201)
    b.handle_retire()
    assert kills.sent == [(201, RETIRE_SIGNAL)] and b._stopping


def test_a_worker_ended_by_the_retire_signal_before_it_was_built_is_a_clean_stop(tmp_path, monkeypatch):
    """Before its worker exists a process keeps the default action of RETIRE_SIGNAL (it ends),
    as of SIGTERM: during a stop that is no failure."""
    from kdaemon.exit_codes import EXIT_OK
    from kdaemon.supervisor.child import RETIRE_SIGNAL
    _Kills(monkeypatch)
    a = _with_workers(_arbiter(tmp_path, monkeypatch), 101)
    a.handle_retire()
    a._on_exit(a.workers.pop(101), -RETIRE_SIGNAL)
    assert a._exit_code == EXIT_OK
