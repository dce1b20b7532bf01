"""The control socket's server (``kdaemon/supervisor/control.py``) driven as the arbiter drives it:
``waiting()`` into ``select``, ``serve()`` with select's answer, in this one thread.  What must
hold: an answer round-trips into the same ``DaemonStatus``; a client that sends nothing, or reads
slowly, never holds the loop (nor do many trickling and silent clients at once); bad or
oversized requests get an error answer; a silent client goes at its deadline; the socket is 0600 and only
``close`` (not a forked child's ``close_in_child``) removes it.  The heartbeat field that feeds
it (``held``) round-trips too."""

from __future__ import annotations

import json
import os
import select
import socket
import stat

import pytest

from kdaemon.supervisor.control import (ControlError, ControlServer, DaemonStatus, WorkerStatus, CompanionStatus,
                                        request_status, socket_path)
from kdaemon.supervisor.heartbeat import HeldPartition, WorkerHeartbeat


def a_status(partitions: int = 3) -> DaemonStatus:
    held = tuple(HeldPartition("t", p, 10 * p, None if p == 1 else p) for p in range(partitions))
    return DaemonStatus(4242, 1_700_000_000.5, "/etc/kdaemon.toml", "/var/kdaemon", 2, False,
                        (WorkerStatus(0, 100, "ready", 12.5, 0, None, held, 7, ()),
                         WorkerStatus(1, None, "restarting", None, 3, "signal_SIGKILL", (), 0, ("topic_missing",))),
                        (CompanionStatus("spark-uploader", 300, 5.0),))


def turn(server: ControlServer, timeout: float = 0.0) -> None:
    """One turn of the arbiter's loop, as far as the control socket goes."""
    r, w = server.waiting()
    readable, writable, _ = select.select(r, w, [], timeout)
    assert server.serve(readable, writable) == []


def connect(server: ControlServer) -> socket.socket:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(server.path)
    return c


def receive_all(c: socket.socket, server: ControlServer) -> bytes:
    """Read the answer to the end, turning the server's loop whenever the client has to wait."""
    c.setblocking(False)
    data = b""
    while True:
        turn(server, 0.05)
        try:
            chunk = c.recv(1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            return data
        data += chunk


@pytest.fixture
def server(tmp_path):
    answer = {"status": a_status()}
    s = ControlServer(str(tmp_path), lambda: answer["status"])
    s.open()
    s.answer = answer   # the test may change what it says
    yield s
    s.close()


def test_an_answer_reads_back_as_the_status_it_was(server, tmp_path):
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    assert server.path == socket_path(str(tmp_path))
    c = connect(server)
    c.sendall(b'{"request": "status"}\n')
    msg = json.loads(receive_all(c, server))
    assert DaemonStatus.from_dict(msg["status"]) == a_status()
    assert a_status().workers[0].lag == 2   # lags 0, unknown (None: counts as nothing) and 2


def test_a_silent_client_does_not_hold_the_loop_and_a_slow_reader_gets_everything(server):
    silent = connect(server)       # connects, sends nothing
    turn(server)
    big = a_status(partitions=40_000)   # some MB of JSON: more than a socket buffer takes at once
    server.answer["status"] = big
    reader = connect(server)
    reader.sendall(b'{"request": "status"}\n')
    turn(server)
    turn(server)
    # Nothing read yet by the client: the server returned all the same, with the rest still to send.
    assert server.waiting()[1], "the answer was not left to be written as the socket takes it"
    assert DaemonStatus.from_dict(json.loads(receive_all(reader, server))["status"]) == big
    silent.close()


def test_trickling_and_silent_clients_do_not_keep_status_from_answering(tmp_path):
    """40 clients sending their request a byte a turn and 10 sending nothing, held at once (the
    cap is above 50): ``kdaemon status``'s request is answered all the same, and they stay."""
    s = ControlServer(str(tmp_path), a_status, max_clients=64)
    s.open()
    try:
        trickling = [connect(s) for _ in range(40)]
        idle = [connect(s) for _ in range(10)]
        for c in trickling + idle:
            c.setblocking(False)
        prefix = b'{"request": "status"'
        for i in range(len(prefix)):
            for c in trickling:
                c.send(prefix[i:i + 1])
            turn(s, 0.05)
        assert len(s.clients) == 50
        asking = connect(s)
        asking.sendall(b'{"request": "status"}\n')
        assert DaemonStatus.from_dict(json.loads(receive_all(asking, s))["status"]) == a_status()
        for c in trickling + idle:
            with pytest.raises(BlockingIOError):   # still connected, nothing said to them
                c.recv(1)
    finally:
        s.close()


def test_a_request_over_the_limit_gets_an_error_answer(server):
    c = connect(server)
    c.sendall(b" " * 5000)
    msg = json.loads(receive_all(c, server))
    assert msg == {"error": "a request is one JSON line of at most 4096 bytes"}


def test_a_silent_client_is_closed_at_the_deadline(tmp_path):
    now = [100.0]
    s = ControlServer(str(tmp_path), a_status, request_timeout_s=5.0, clock=lambda: now[0])
    s.open()
    try:
        silent = connect(s)
        turn(s, 0.05)
        now[0] += 4.9
        turn(s, 0.05)
        assert len(s.clients) == 1
        now[0] += 0.1
        turn(s, 0.05)
        assert len(s.clients) == 0 and silent.recv(1) == b""
    finally:
        s.close()


@pytest.mark.parametrize("request_line, said", [
    (b"not json\n", "a request is a JSON line"),
    (b'{"request": "reboot"}\n', "unknown request 'reboot'"),
    (b"[1, 2]\n", "unknown request None"),
])
def test_a_bad_request_gets_an_error_answer(server, request_line, said):
    c = connect(server)
    c.sendall(request_line)
    msg = json.loads(receive_all(c, server))
    assert said in msg["error"], msg


def test_a_status_that_fails_to_build_is_an_error_answer_not_a_supervisor_failure(tmp_path):
    def broken() -> DaemonStatus:
        raise RuntimeError("boom")
    s = ControlServer(str(tmp_path), broken)
    s.open()
    try:
        c = connect(s)
        c.sendall(b'{"request": "status"}\n')
        assert "RuntimeError: boom" in json.loads(receive_all(c, s))["error"]
    finally:
        s.close()


def test_request_status_names_the_socket_it_tried(tmp_path):
    with pytest.raises(ControlError, match=f"no control socket {socket_path(str(tmp_path))}"):
        request_status(str(tmp_path))


def test_only_close_removes_the_socket(tmp_path):
    s = ControlServer(str(tmp_path), a_status)
    s.open()
    s.close_in_child()          # what a forked worker does
    assert os.path.exists(s.path)
    t = ControlServer(str(tmp_path), a_status)
    t.open()                    # the next daemon replaces a socket left behind
    t.close()
    assert not os.path.exists(t.path)


def test_held_partitions_ride_the_heartbeat():
    held = (HeldPartition("a", 0, 5, 0), HeldPartition("a", 1, None, None))
    beat = WorkerHeartbeat(True, 2, 0, 9, held=held)
    assert WorkerHeartbeat.decode(beat.encode().rstrip(b"\n")).held == held
    unchanged = WorkerHeartbeat(True, 2, 0, 9)
    assert "held" not in json.loads(unchanged.encode())
    assert WorkerHeartbeat.decode(unchanged.encode().rstrip(b"\n")).held is None
    with pytest.raises(ValueError):
        WorkerHeartbeat.decode(b'{"ready": true, "assigned": 1, "lag": 0, "delivered": 0, "held": [["a", 0]]}')


def test_a_share_members_figures_round_trip_and_render():
    """A share-group worker's status carries its records (``ShareFigures``) and ``kdaemon status``
    shows them in place of the partitions table."""
    from kdaemon.cli.status import render
    from kdaemon.supervisor.heartbeat import ShareFigures
    from rich.console import Console
    figures = ShareFigures(acquired=120, accepted=100, released=15, rejected=3, in_flight=2)
    status = DaemonStatus(4242, 1_700_000_000.5, "/etc/kdaemon.toml", "/var/kdaemon", 2, False,
                          (WorkerStatus(0, 100, "ready", 12.5, 0, None, (), 100, (), figures),
                           WorkerStatus(1, 101, "starting", 1.0, 0, None, (), 0, ())), ())
    assert DaemonStatus.from_dict(json.loads(json.dumps(status.to_dict()))) == status
    console = Console(width=160, record=True)
    console.print(render(status))
    text = console.export_text()
    assert "2 record(s) in flight" in text and "partitions, lag" not in text
    assert "share group members" in text
    members = text[text.index("share group members"):]
    row = next(line for line in members.splitlines() if "120" in line)
    assert [c for c in row.replace("│", " ").split()] == ["0", "120", "100", "15", "3", "2"], text
