"""Clients that hold a server's connections without ever finishing a request (a slowloris): the
``trickling`` ones send a request's first bytes one at a time, a byte each ``every_s``, and
never its end; the ``idle`` ones connect and send nothing.  The supervisor's endpoints and the
lag exporter must go on answering, and the daemon on working, while they are connected
(tests/supervisor/test_endpoints_slow_clients.py, tests/cli/test_lag_exporter.py).

``held()`` says how many of them the server still holds open (none was closed or answered),
``held_by(pid)`` how many of them that process has accepted (psutil: its sockets, so a
connection still waiting in the listen backlog does not count): a test waits for the second
before it asserts anything, so its events happen while the server really holds them all.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import psutil


def tcp(host: str, port: int) -> Callable[[], socket.socket]:
    return lambda: socket.create_connection((host, port), timeout=10)


def unix(path: str) -> Callable[[], socket.socket]:
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(path)
        return s
    return connect


class SlowClients:
    """``trickling`` + ``idle`` connections made with ``connect``; the trickling ones send
    ``prefix`` a byte at a time, then ``filler`` bytes, from one thread, until ``close``."""

    def __init__(self, connect: Callable[[], socket.socket], prefix: bytes, *, trickling: int = 40, idle: int = 10,
                 every_s: float = 1.5, filler: bytes = b"a") -> None:
        self._connect = connect
        self.prefix, self.filler = prefix, filler
        self.every_s = every_s
        self.trickling: list[socket.socket] = []
        self.idle: list[socket.socket] = []
        self._counts = (trickling, idle)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0   # bytes each trickling client has sent

    @property
    def all(self) -> list[socket.socket]:
        return self.trickling + self.idle

    def open(self) -> "SlowClients":
        trickling, idle = self._counts
        for group, n in ((self.trickling, trickling), (self.idle, idle)):
            for _ in range(n):
                s = self._connect()
                s.setblocking(False)
                group.append(s)
        self._thread = threading.Thread(target=self._trickle, name="slow-clients", daemon=True)
        self._thread.start()
        return self

    def _trickle(self) -> None:
        while not self._stop.wait(self.every_s):
            byte = self.prefix[self.sent:self.sent + 1] or self.filler
            for s in self.trickling:
                try:
                    s.send(byte)
                except OSError:   # closed by the server: held() says so
                    pass
            self.sent += 1

    def held(self) -> int:
        """How many are still open with nothing received: neither closed nor answered."""
        n = 0
        for s in self.all:
            try:
                s.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n

    def held_by(self, pid: int) -> int:
        """How many of these connections process ``pid`` holds as accepted sockets.  TCP: those
        whose far end is one of ours; Unix: every accepted socket on the path we connect to (a
        Unix client has no address to match), which is ours while the test makes no other."""
        try:
            proc = psutil.Process(pid)
            if self.all and self.all[0].family == socket.AF_UNIX:
                path = self.all[0].getpeername()
                return sum(1 for c in proc.net_connections("unix") if c.laddr == path) - 1   # the listener
            ours = {s.getsockname() for s in self.all}
            return sum(1 for c in proc.net_connections("tcp")
                       if c.status == psutil.CONN_ESTABLISHED and c.raddr and tuple(c.raddr) in ours)
        except (psutil.NoSuchProcess, OSError):
            return 0

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.every_s + 5)
        for s in self.all:
            s.close()

    def __enter__(self) -> "SlowClients":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

