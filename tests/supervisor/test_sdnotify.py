"""sd_notify: the twenty lines in kdaemon.supervisor.sdnotify, then what the supervisor tells
systemd over a whole life: READY, RELOADING/READY on SIGHUP, STOPPING, WATCHDOG.

The end-to-end test runs ``kdaemon run`` with NOTIFY_SOCKET pointing at a socket of ours that
records each datagram with its sender's pid (SCM_CREDENTIALS), which is how systemd enforces
NotifyAccess=main: every message must come from the supervisor, none from a worker.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from kdaemon.config import parse
from kdaemon.supervisor import sdnotify
from testkit.daemon import Daemon, daemon_config
from testkit.notify_socket import NotifySocket
from testkit.produce import create_topic


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- the function -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_notify_delivers_to_path_and_abstract_sockets(tmp_path, kind):
    address = str(tmp_path / "notify.sock") if kind == "path" else f"@kdaemon-test-{uuid.uuid4().hex}"
    with NotifySocket(address) as sock:
        assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": address}) is True
        assert sdnotify.notify("STATUS=naïve ünicode\nMAINPID=1", environ={"NOTIFY_SOCKET": address}) is True
        sock.wait_for(lambda n: n.message == "STATUS=naïve ünicode\nMAINPID=1", 5, "the second message")
        assert [n.message for n in sock.messages] == ["READY=1", "STATUS=naïve ünicode\nMAINPID=1"]
        assert {n.pid for n in sock.messages} == {os.getpid()}


def test_notify_uses_the_process_environment(tmp_path, monkeypatch):
    address = str(tmp_path / "notify.sock")
    with NotifySocket(address) as sock:
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        assert sdnotify.notify("WATCHDOG=1") is True
        sock.wait_for(lambda n: n.message == "WATCHDOG=1", 5, "WATCHDOG=1")


def test_notify_never_raises(tmp_path, monkeypatch):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.notify("READY=1", environ={}) is False
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": ""}) is False
    # A socket that is gone: unlinked, or still a file but nobody reading it.
    gone = tmp_path / "gone.sock"
    NotifySocket(str(gone)).close()
    assert not gone.exists()
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": str(gone)}) is False
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(stale))
    s.close()
    assert stale.exists()
    assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": str(stale)}) is False
    # An abstract name nobody bound, a regular file, a directory, a path too long for AF_UNIX,
    # and an address family systemd has but we do not speak.
    regular = tmp_path / "file"
    regular.write_text("")
    for address in (f"@kdaemon-nobody-{uuid.uuid4().hex}", str(regular), str(tmp_path),
                    "/" + "x" * 200, "vsock:2:1234"):
        assert sdnotify.notify("READY=1", environ={"NOTIFY_SOCKET": address}) is False, address


def test_watchdog_interval_is_half_of_watchdog_usec():
    assert sdnotify.watchdog_interval_s({}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "2000000"}) == 1.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": str(os.getpid())}) == 1.0
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None
    assert sdnotify.watchdog_interval_s({"WATCHDOG_USEC": "soon"}) is None


def test_worker_environment_has_no_systemd_variables(tmp_path, monkeypatch):
    """What a worker runs right after fork (``run_child``) drops NOTIFY_SOCKET and the watchdog
    variables from its environment, so neither the worker nor anything it starts can talk to
    systemd.  (``/proc/<pid>/environ`` cannot show this: for a process that forked without exec
    it is the exec-time environment block of the supervisor, whatever the process did since.)

    The configuration cannot boot (its sink directory is under a regular file), so run_child
    returns at once with the boot-failure code, after the environment was cleaned."""
    from kdaemon.supervisor.child import EXIT_BOOT_FAILURE, run_child
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = parse({"plugins": [], "kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": ["t"], "on_deserialize_error": "skip"},
                    "sink": {"type": "jsonl", "path": str(blocker / "out")}}, "test.toml")
    for name, value in (("NOTIFY_SOCKET", "/run/systemd/notify"), ("WATCHDOG_USEC", "2000000"),
                        ("WATCHDOG_PID", str(os.getpid()))):
        monkeypatch.setenv(name, value)
    r, w = os.pipe()
    hb_r, hb_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what the arbiter's _spawn does, then report
        code = 99
        try:
            os.close(r)
            os.close(hb_r)
            code = run_child(config, 0, 1, hb_w)
            spawned = subprocess.run([sys.executable, "-c", "import os, json; print(json.dumps(dict(os.environ)))"],
                                     capture_output=True, text=True, timeout=30).stdout
            report = {"code": code, "environ": dict(os.environ), "spawned": json.loads(spawned)}
            os.write(w, json.dumps(report).encode())
        finally:
            os._exit(0 if code != 99 else 1)
    os.close(w)
    os.close(hb_w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.close(hb_r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    report = json.loads(data)
    assert report["code"] == EXIT_BOOT_FAILURE
    for env in (report["environ"], report["spawned"]):
        assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(env)
    assert os.environ["NOTIFY_SOCKET"] == "/run/systemd/notify"  # the parent's is untouched


# -- the supervisor under a (fake) systemd -------------------------------------------------------------

def _order(messages) -> list[str]:
    """The messages whose order matters: STATUS and WATCHDOG come and go at their own pace."""
    return [n.message.split("\n")[0] for n in messages
            if not n.message.startswith(("STATUS=", "WATCHDOG="))]


def test_daemon_notifies_ready_reloading_stopping_and_watchdog(broker, tmp_path):
    topic, group = _name("notify"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=4)
    address = str(tmp_path / "notify.sock")
    config = daemon_config(tmp_path, broker.bootstrap, topic, group, sink="null")
    watchdog_usec = 2_000_000
    with NotifySocket(address) as sock, \
            Daemon(tmp_path, config, env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": str(watchdog_usec)}) as d:
        ready = sock.wait_for(lambda n: n.message == "READY=1", 45, "READY=1")
        log = d.log()
        # READY=1 only once both workers reported their assignment (logged before it is sent).
        assigned = {r["index"] for r in d.ready_lines()}
        assert assigned == {0, 1}, log
        assert log.index("all 2 worker(s) have their assignment") > max(
            log.index(f"worker {i} (pid") for i in (0, 1))
        first_status = sock.messages[0]
        assert first_status.message.startswith("STATUS="), "the supervisor says what it does first"
        assert _order(sock.messages) == ["READY=1"]
        workers_before = d.workers()
        assert len(workers_before) == 2

        sock.wait_for(lambda n: n.message == "WATCHDOG=1" and n.at > ready.at, 5, "WATCHDOG=1 after READY=1")
        mark = len(sock.messages)
        log_mark = len(d.log())
        d.signal(signal.SIGHUP)
        reloading = sock.wait_for(lambda n: n.message.startswith("RELOADING=1"), 20, "RELOADING=1", since=mark)
        fields = reloading.fields
        assert set(fields) == {"RELOADING", "MONOTONIC_USEC"}, reloading.message
        assert fields["MONOTONIC_USEC"].isdigit()
        # CLOCK_MONOTONIC is system-wide: the stamp is from just before the message arrived.
        now_usec = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)
        assert 0 <= now_usec - int(fields["MONOTONIC_USEC"]) < 5_000_000
        ready_again = sock.wait_for(lambda n: n.message == "READY=1", 60, "READY=1 after the reload",
                                    since=sock.messages.index(reloading) + 1)
        # The second READY=1 comes after the rolling restart: two new workers, both assigned.
        rolled = d.ready_lines(log_mark)
        workers_after = d.workers()
        assert set(workers_after) == {0, 1}
        assert not set(workers_after.values()) & set(workers_before.values()), (workers_before, workers_after)
        assert {r["pid"] for r in rolled} >= set(workers_after.values())
        assert ready_again.at > reloading.at

        mark = len(sock.messages)
        started = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait_exit(20) == 0
        stopping = sock.wait_for(lambda n: n.message == "STOPPING=1", 5, "STOPPING=1", since=mark)
        assert stopping.at - started < 5

        assert _order(sock.messages) == ["READY=1", "RELOADING=1", "READY=1", "STOPPING=1"]
        # Only the supervisor spoke (systemd's NotifyAccess=main would drop anything else).
        assert {n.pid for n in sock.messages} == {d.pid}, [(n.pid, n.message) for n in sock.messages]
        for pid in list(workers_before.values()) + list(workers_after.values()):
            assert pid != d.pid

        # WATCHDOG=1 every WATCHDOG_USEC/2 while running, never a gap systemd would act on.
        pings = [n.at for n in sock.messages if n.message == "WATCHDOG=1"]
        running_for = stopping.at - sock.messages[0].at
        assert len(pings) >= running_for / (watchdog_usec / 1e6) and len(pings) >= 5, (len(pings), running_for)
        gaps = [b - a for a, b in zip(pings, pings[1:])]
        assert max(gaps) < watchdog_usec / 1e6, gaps
        assert pings[0] - sock.messages[0].at < watchdog_usec / 1e6
