"""The clients of the supervisor's endpoints (``kdaemon/supervisor/connections.py``), driven as the
arbiter drives them: ``waiting()`` into ``select``, ``serve()`` with select's answer, in this one
thread, over real sockets, with a clock the test moves (no test waits out a deadline).

What must hold: a request trickled in over many turns is assembled and answered once; a client
past its deadline is closed, others are not; an oversized request gets 413 (which the client can
read, however much more it sent) and is closed; the cap holds, closing the oldest client still
sending its request and refusing a newcomer only when every client is being answered; and with
many trickling and idle clients held, a scrape is answered in the turn its request arrives.  The
HTTP side: the page's format follows ``Accept``, and what is not a scrape gets 400/404/405.
"""

from __future__ import annotations

import logging
import select
import socket

import pytest

from kdaemon.supervisor.connections import ANSWER_TIMEOUT_S, READING, Connections, Limits
from kdaemon.supervisor.metrics_http import HttpRequests, MetricsEndpoint

SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: text/plain\r\n\r\n"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def page(accept: str) -> tuple[bytes, str]:
    """A stand-in for ``metrics.render``: says which Accept it was given."""
    return f"accept={accept}\n".encode(), "text/plain; version=0.0.4; charset=utf-8"


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_server(clock: Clock, *, timeout_s: float = 5.0, max_bytes: int = 1024, max_clients: int = 64,
                render=page) -> Connections:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    return Connections("test endpoint", listener, HttpRequests(render), Limits(timeout_s, max_bytes, max_clients),
                       clock=clock)


@pytest.fixture
def server(clock):
    s = make_server(clock)
    yield s
    s.close()


def address(server: Connections) -> tuple[str, int]:
    return server._listener.getsockname()


def turn(server: Connections, timeout: float = 0.05) -> None:
    """One turn of the arbiter's loop, as far as this endpoint goes."""
    r, w = server.waiting()
    readable, writable, _ = select.select(r, w, [], timeout)
    assert server.serve(readable, writable) == []


def connect(server: Connections, *, accepted: bool = True) -> socket.socket:
    c = socket.create_connection(address(server), timeout=5)
    if accepted:
        held = len(server)
        for _ in range(100):
            turn(server)
            if len(server) > held:
                break
        assert len(server) == held + 1, "the server did not take the connection"
    c.setblocking(False)
    return c


def received(c: socket.socket) -> bytes | None:
    """What ``c`` can read now, b"" once the server closed it, None while it is open and silent."""
    data = b""
    while True:
        try:
            chunk = c.recv(65536)
        except BlockingIOError:
            return data or None
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk


def answer(c: socket.socket, server: Connections, turns: int = 200) -> bytes:
    """The whole answer, up to its end (the server shuts its side), turning the server's loop
    meanwhile; then the client closes, as a scraper does, and the server lets go of it."""
    data = b""
    for _ in range(turns):
        turn(server, 0.01)
        try:
            chunk = c.recv(65536)
        except BlockingIOError:
            continue
        if not chunk:
            held = len(server)
            c.close()
            for _ in range(turns):
                turn(server, 0.01)
                if len(server) < held:
                    break
            return data
        data += chunk
    raise AssertionError(f"no end of answer after {turns} turns: {data[:200]!r}")


def is_open(c: socket.socket) -> bool:
    try:
        return c.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False


# -- the connection's state ------------------------------------------------------------------------

def test_a_request_trickled_over_many_turns_is_assembled_and_answered_once(server):
    c = connect(server)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n"
    for i, byte in enumerate(request[:-1]):
        c.send(bytes([byte]))
        turn(server)
        assert received(c) is None, f"answered after {i + 1} of {len(request)} bytes"
        assert bytes(server.connections()[0].inbox) == request[:i + 1]
    c.send(request[-1:])
    got = answer(c, server)
    assert got.startswith(b"HTTP/1.1 200 OK\r\n"), got
    assert got.endswith(b"\r\n\r\naccept=application/openmetrics-text; version=1.0.0\n"), got
    assert len(server) == 0


def test_a_client_past_its_deadline_is_closed_and_the_others_are_not(server, clock):
    idle = connect(server)
    trickling = connect(server)
    trickling.send(b"GET /met")
    turn(server)
    clock.now += 3.0
    late = connect(server)            # accepted 3 s after the others: 2 s of its deadline left
    clock.now += 2.0                  # the first two are 5 s old: their whole request is late
    turn(server)
    assert received(idle) == b"" and received(trickling) == b""
    assert is_open(late) and len(server) == 1
    late.send(SCRAPE)
    assert answer(late, server).startswith(b"HTTP/1.1 200 OK")


def test_a_client_that_does_not_take_its_answer_is_closed(clock):
    big = b"x" * (16 << 20)   # more than the socket buffers take at once
    server = make_server(clock, render=lambda accept: (big, "text/plain"))
    try:
        c = connect(server)
        c.send(SCRAPE)
        turn(server)
        turn(server)
        assert server.waiting()[1], "the answer was not left to be written as the socket takes it"
        clock.now += ANSWER_TIMEOUT_S - 1
        turn(server)
        assert len(server) == 1, "closed before its answer deadline"
        clock.now += 1
        turn(server)
        assert len(server) == 0
        data = received(c) or b""
        assert len(data) < len(big), "the whole answer was taken after all"
    finally:
        server.close()


@pytest.mark.parametrize("extra", [1, 64 << 10], ids=["one byte over", "64 KiB over"])
def test_an_oversized_request_gets_413_and_is_closed(server, extra):
    """However much more the client sent, it can read the 413: the server reads and throws away
    the rest before it closes (a close with unread bytes would reset the connection)."""
    c = connect(server)
    c.setblocking(True)
    c.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * (1024 + extra))
    c.setblocking(False)
    got = answer(c, server)
    assert got.startswith(b"HTTP/1.1 413 "), got
    assert got.endswith(b"a request's line and headers take at most 1024 bytes\n"), got
    assert len(server) == 0


def test_a_complete_request_within_the_limit_is_answered_even_with_bytes_after_it(server):
    c = connect(server)
    c.send(SCRAPE + b"more than the request")
    assert answer(c, server).startswith(b"HTTP/1.1 200 OK")


def test_over_the_cap_the_oldest_client_still_sending_its_request_makes_room(clock):
    server = make_server(clock, max_clients=3)
    try:
        idle = [connect(server) for _ in range(3)]
        clock.now += 1
        scraper = connect(server, accepted=False)
        scraper.send(SCRAPE)
        assert answer(scraper, server).startswith(b"HTTP/1.1 200 OK")
        assert [is_open(c) for c in idle] == [False, True, True]
        assert len(server) == 2
    finally:
        server.close()


def test_over_the_cap_a_newcomer_is_refused_when_every_client_is_being_answered(clock):
    big = b"x" * (16 << 20)
    server = make_server(clock, max_clients=2, render=lambda accept: (big, "text/plain"))
    try:
        readers = [connect(server) for _ in range(2)]
        for c in readers:
            c.send(SCRAPE)
        turn(server)
        assert len(server.waiting()[1]) == 2, "both should be waiting to write"
        newcomer = connect(server, accepted=False)
        for _ in range(5):
            turn(server)
        assert received(newcomer) == b""
        assert all(is_open(c) for c in readers) and len(server) == 2
    finally:
        server.close()


def test_a_scrape_is_answered_in_its_turn_while_many_slow_and_idle_clients_are_held(server):
    """What froze the daemon: 40 clients trickling a byte each (a turn stands for their 1.5 s),
    and 10 that send nothing.  Each turn the scrape sent is answered, and all 50 stay held."""
    trickling = [connect(server) for _ in range(40)]
    idle = [connect(server) for _ in range(10)]
    prefix = b"GET /metrics HTTP/1.1\r\nX-Slow: "
    for i in range(len(prefix)):
        for c in trickling:
            c.send(prefix[i:i + 1])
        scraper = connect(server, accepted=False)
        scraper.send(SCRAPE)
        turn(server)
        turn(server)
        assert (received(scraper) or b"").startswith(b"HTTP/1.1 200 OK"), f"turn {i}: no answer"
        scraper.close()
        assert [c.state for c in server.connections()].count(READING) == 50
        assert all(is_open(c) for c in trickling + idle)


def test_limits_closes_are_logged_once_each_then_counted(server, clock, caplog):
    caplog.set_level(logging.WARNING, logger="kdaemon.supervisor")
    clients = [connect(server) for _ in range(3)]
    assert len(server) == len(clients)
    clock.now += 5
    turn(server)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "test endpoint: closed 127.0.0.1:" in said[0], said
    assert "did not send a whole request within 5 s of connecting (endpoint_request_timeout_s)" in said[0]
    clock.now += 60
    turn(server)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and "2 more client(s) closed since the last report (2 request timeout)" in said[1], said


# -- HTTP ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("request_bytes, status", [
    (b"GET / HTTP/1.1\r\n\r\n", b"200 OK"),
    (b"GET /metrics?x=1 HTTP/1.0\n\n", b"200 OK"),
    (b"GET /other HTTP/1.1\r\n\r\n", b"404 Not Found"),
    (b"POST /metrics HTTP/1.1\r\n\r\n", b"405 Method Not Allowed"),
    (b"hello\r\n\r\n", b"400 Bad Request"),
])
def test_what_is_not_a_scrape(server, request_bytes, status):
    c = connect(server)
    c.send(request_bytes)
    assert answer(c, server).startswith(b"HTTP/1.1 " + status), request_bytes


def test_head_gets_the_headers_only(server):
    c = connect(server)
    c.send(b"HEAD /metrics HTTP/1.1\r\n\r\n")
    head = answer(c, server)
    assert head.startswith(b"HTTP/1.1 200 OK") and head.endswith(b"\r\n\r\n"), head
    assert b"Content-Length: 8\r\n" in head   # the length of the page a GET gets, "accept=\n"


def test_a_render_that_raises_is_a_500(clock):
    def broken(accept):
        raise RuntimeError("boom")
    server = make_server(clock, render=broken)
    try:
        c = connect(server)
        c.send(SCRAPE)
        assert answer(c, server).startswith(b"HTTP/1.1 500 ")
    finally:
        server.close()


def test_the_metrics_endpoint_runs_on_without_an_address_it_cannot_bind(caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        endpoint = MetricsEndpoint(addr, page, request_timeout_s=5.0, max_clients=4)
    assert endpoint.clients is None and endpoint.waiting() == ([], [])
    assert endpoint.serve([7], []) == [7]
    assert f"cannot serve metrics on {addr}" in caplog.text
