"""The clients of the supervisor's endpoints (``/metrics`` and the control socket), served from
the arbiter's own ``select`` without ever waiting on one of them.

Why: that loop also reads the workers' heartbeats, reaps and replaces them, acts on signals
and tells systemd's watchdog the daemon lives.  A blocking read of one client there (2 s per
connection) let 40 connections that each trickled a byte every 1.5 s freeze it: scrapes timed
out, a killed worker was not replaced, SIGTERM did nothing, and under ``WatchdogSec`` systemd
would have killed the daemon.  Why not a thread per client, or prometheus_client's threaded
server: the supervisor forks its workers and must hold no thread (invariant 13).

So every client is a non-blocking socket with its state (``Connection``): what it sent so far,
the answer still to send, its deadline; what a request is and what answers it is the endpoint's
(``Requests``).  The limits (``Limits``), the same for both endpoints:

* a request must be whole within ``request_timeout_s`` of the connection's accept, however
  slowly it trickles in (``[daemon] endpoint_request_timeout_s``); else the client is closed;
* it may hold at most ``max_request_bytes``: beyond, the client gets the endpoint's "too large"
  answer (HTTP 413) and is closed;
* the answer must be taken within ``ANSWER_TIMEOUT_S`` of the request; it is written as the
  socket takes it, never waited on;
* at most ``max_connections`` clients at once per endpoint (``[daemon] endpoint_max_clients``).
  Over the cap the *oldest client still sending its request* is closed to make room for the new
  one: a scraper or ``kdaemon status`` sends its request at once and is answered in the same
  turn, so the clients that have waited longest without a whole request are the ones holding
  slots without asking for anything, and refusing newcomers instead would let anyone who holds
  the cap's worth of idle connections lock every scraper out.  A new connection is refused
  (closed at once) only when every client held is being answered.
* one turn accepts at most ``max_connections`` new connections, so a flood of connects cannot
  keep the loop accepting.

After its answer a client's sending side is shut down and what it still sends is read and thrown
away until it closes (at most ``LINGER_S``): closing a socket with unread bytes in it sends a
reset, which can destroy the answer before the client reads it (a 413 to an oversized request).

A closed client is logged: the first time for each reason at WARNING, with its peer, then a
count of the further ones at most once a minute, never a line per client.
"""

from __future__ import annotations

import errno
import logging
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger("kdaemon.supervisor")

ANSWER_TIMEOUT_S = 30.0   # from the whole request to the last byte of the answer taken by the client
LINGER_S = 2.0            # after the answer: how long the client's last bytes are read and thrown away
SUMMARY_EVERY_S = 60.0    # closed clients after the first of each reason: counted, said at most this often


@dataclass(frozen=True)
class Limits:
    """What one client may take of an endpoint (see the module's docstring)."""

    request_timeout_s: float
    max_request_bytes: int
    max_connections: int

    def __post_init__(self) -> None:
        if not self.request_timeout_s > 0 or self.max_request_bytes < 1 or self.max_connections < 1:
            raise ValueError(f"limits must be positive: {self}")


class Requests(Protocol):
    """An endpoint's protocol: where a request ends, and its answer."""

    def request_length(self, inbox: bytes) -> int | None:
        """The length of the whole request at the start of ``inbox``; None while it is incomplete."""

    def answer(self, request: bytes) -> bytes:
        """The bytes that answer ``request``; the connection is closed once they are taken."""

    def too_large(self, limit: int) -> bytes:
        """The answer to a request longer than ``limit`` bytes."""


READING, ANSWERING, LINGERING = "reading", "answering", "lingering"


@dataclass
class Connection:
    """One client: ``state`` is READING (its request, until ``deadline``), ANSWERING (the rest of
    ``outbox``, until ``deadline``) or LINGERING (answered, reading until it closes)."""

    sock: socket.socket
    peer: str
    accepted_at: float
    deadline: float
    state: str = READING
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None


class Connections:
    """A listening socket and its clients, served a turn at a time from the arbiter's loop:
    ``waiting()`` gives the descriptors to select on, ``serve`` takes select's answer and hands
    back the readable descriptors that are not this endpoint's.  ``limits`` may be replaced
    between turns (a reload); it applies to connections accepted from then on.  ``clock`` is
    ``time.monotonic``, or a test's."""

    def __init__(self, name: str, listener: socket.socket, requests: Requests, limits: Limits,
                 *, clock: Callable[[], float] = time.monotonic) -> None:
        listener.setblocking(False)
        self.name = name
        self.limits = limits
        self._listener: socket.socket | None = listener
        self._requests = requests
        self._clock = clock
        self._clients: dict[int, Connection] = {}
        self._closed = _ClosedLog(name)

    def __len__(self) -> int:
        return len(self._clients)

    def connections(self) -> list[Connection]:
        """The clients held, oldest first."""
        return sorted(self._clients.values(), key=lambda c: c.accepted_at)

    def waiting(self) -> tuple[list[int], list[int]]:
        """(descriptors to watch for reading, for writing)."""
        reading = [] if self._listener is None else [self._listener.fileno()]
        writing = []
        for fd, c in self._clients.items():
            (writing if c.state == ANSWERING else reading).append(fd)
        return reading, writing

    def serve(self, readable: list[int], writable: list[int]) -> list[int]:
        """Do what select said can be done, close the clients past their deadline; return the
        readable descriptors that are not this endpoint's."""
        now = self._clock()
        others = []
        listening = None if self._listener is None else self._listener.fileno()
        for fd in readable:
            if fd == listening:
                self._accept(now)
            elif fd in self._clients:
                self._read(self._clients[fd], now)
            else:
                others.append(fd)
        for fd in writable:
            c = self._clients.get(fd)
            if c is not None and c.state == ANSWERING:   # (not a newer client on a reused descriptor)
                self._write(c, now)
        self.expire(now)
        return others

    def expire(self, now: float) -> None:
        """Close every client past its deadline."""
        for c in list(self._clients.values()):
            if now >= c.deadline:
                if c.state == READING:
                    self._close(c, now, "request_timeout")
                elif c.state == ANSWERING:
                    self._close(c, now, "answer_timeout")
                else:
                    self._close(c, now)
        self._closed.summarise(now, self.limits)

    def close(self) -> None:
        """Close the listening socket and every client (at exit, and in a forked worker: a
        client connection kept open by a worker would wait for that worker's exit)."""
        for c in self._clients.values():
            c.sock.close()
        self._clients.clear()
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    # -- the steps ----------------------------------------------------------------------------

    def _accept(self, now: float) -> None:
        for _ in range(self.limits.max_connections):
            try:
                sock, addr = self._listener.accept()   # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:   # out of descriptors, say: the next turn tries again
                self._closed.said(now, "accept_failed", f"accepting a connection failed: {exc.strerror or exc}")
                return
            sock.setblocking(False)
            peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else "a local client"
            if len(self._clients) >= self.limits.max_connections and not self._make_room(now):
                sock.close()
                self._closed.dropped(now, "refused", peer, self.limits)
                continue
            c = Connection(sock, peer, now, now + self.limits.request_timeout_s)
            self._clients[sock.fileno()] = c
            self._read(c, now)   # a scraper's request is usually there already: answered this turn

    def _make_room(self, now: float) -> bool:
        """Close the client that is done (lingering), else the oldest one still sending its
        request; False when every client held is being answered."""
        held = self.connections()
        victim = next((c for c in held if c.state == LINGERING), None) or \
            next((c for c in held if c.state == READING), None)
        if victim is None:
            return False
        self._close(victim, now, None if victim.state == LINGERING else "over_cap")
        return True

    def _read(self, c: Connection, now: float) -> None:
        want = 65536 if c.state == LINGERING else self.limits.max_request_bytes + 1 - len(c.inbox)
        try:
            chunk = c.sock.recv(max(1, want))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:   # the client is gone (or done): nothing to say
            self._close(c, now)
            return
        if c.state == LINGERING:
            return   # thrown away
        c.inbox += chunk
        limit = self.limits.max_request_bytes
        length = self._requests.request_length(bytes(c.inbox))
        if length is not None and length <= limit:
            self._answer(c, now, self._requests.answer(bytes(c.inbox[:length])))
        elif len(c.inbox) > limit:
            self._closed.dropped(now, "too_large", c.peer, self.limits)
            self._answer(c, now, self._requests.too_large(limit))

    def _answer(self, c: Connection, now: float, answer: bytes) -> None:
        c.state, c.inbox, c.outbox = ANSWERING, bytearray(), memoryview(answer)
        c.deadline = now + ANSWER_TIMEOUT_S
        self._write(c, now)

    def _write(self, c: Connection, now: float) -> None:
        try:
            sent = c.sock.send(c.outbox)   # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.debug("%s: answering %s failed: %s", self.name, c.peer, exc)
            self._close(c, now)
            return
        c.outbox = c.outbox[sent:]   # type: ignore[index]
        if len(c.outbox):
            return
        c.outbox = None
        try:
            c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(c, now)
            return
        c.state, c.deadline = LINGERING, min(c.deadline, now + LINGER_S)

    def _close(self, c: Connection, now: float, reason: str | None = None) -> None:
        """Close ``c``; a ``reason`` (a limit it hit) is logged as ``_ClosedLog`` words it."""
        self._clients.pop(c.sock.fileno(), None)
        c.sock.close()
        if reason is not None:
            self._closed.dropped(now, reason, c.peer, self.limits)


# What each reason to close a client says the first time (``_ClosedLog``), from the limits.
_REASONS: dict[str, Callable[[Limits], str]] = {
    "request_timeout": lambda lim: f"did not send a whole request within {lim.request_timeout_s:g} s of "
                                   "connecting (endpoint_request_timeout_s)",
    "too_large": lambda lim: f"sent a request over {lim.max_request_bytes} bytes",
    "answer_timeout": lambda lim: f"did not take its answer within {ANSWER_TIMEOUT_S:g} s",
    "over_cap": lambda lim: f"was the oldest client still sending its request when {lim.max_connections} were "
                            "connected (endpoint_max_clients)",
    "refused": lambda lim: f"was refused: {lim.max_connections} clients were connected, each being answered "
                           "(endpoint_max_clients)",
}


class _ClosedLog:
    """Says why clients are closed without a line per client: the first of each reason at
    WARNING, with its peer; after it, how many more, at most once every ``SUMMARY_EVERY_S``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._said: set[str] = set()
        self._since: Counter = Counter()
        self._next_summary = 0.0

    def dropped(self, now: float, reason: str, peer: str, limits: Limits) -> None:
        self.said(now, reason, f"closed {peer}: it {_REASONS[reason](limits)}")

    def said(self, now: float, reason: str, text: str) -> None:
        if reason in self._said:
            self._since[reason] += 1
            return
        self._said.add(reason)
        self._next_summary = max(self._next_summary, now + SUMMARY_EVERY_S)
        log.warning("%s: %s; further ones are counted here once a minute", self.name, text)

    def summarise(self, now: float, limits: Limits) -> None:
        if not self._since or now < self._next_summary:
            return
        counts = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in sorted(self._since.items()))
        log.warning("%s: %d more client(s) closed since the last report (%s); limits: whole request within "
                    "%g s, %d bytes, %d clients at once", self.name, sum(self._since.values()), counts,
                    limits.request_timeout_s, limits.max_request_bytes, limits.max_connections)
        self._since.clear()
        self._next_summary = now + SUMMARY_EVERY_S
