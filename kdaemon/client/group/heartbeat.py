"""Heartbeat timing, and the thread that acts on it.

``HeartbeatTimer`` is pure (as kafka-python's ``heartbeat.py``): three deadlines and nothing
else — when the next heartbeat is due, when the session is lost without an answer, and when the
application has gone too long without ``poll()``.  Every method takes ``now`` (a
``time.monotonic()`` reading) from its caller, so it does no I/O, reads no clock and can be
tested by passing numbers.

``HeartbeatThread`` only calls a membership's ``heartbeat_tick`` a few times per heartbeat
interval until stopped; what a tick sends and what an answer means is the membership's business.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class HeartbeatTimer:
    """Deadlines of one group member, in seconds of the monotonic clock."""

    def __init__(self, *, session_timeout_ms: int, heartbeat_interval_ms: int, max_poll_interval_ms: int,
                 now: float) -> None:
        self.session_timeout = session_timeout_ms / 1000
        # A heartbeat interval above a third of the session timeout leaves no room for one late
        # heartbeat; Java documents the third, we enforce it.
        self.interval = min(heartbeat_interval_ms, session_timeout_ms // 3) / 1000
        self.max_poll_interval = max_poll_interval_ms / 1000
        self.last_sent = 0.0
        self.last_received = now   # the session clock: the last answer, or a new coordinator found
        self.last_answer = now     # the last answer that proved membership (a heartbeat's, a join's)
        self.last_poll = now
        self.in_flight = False

    # -- what happened --------------------------------------------------------------------------

    def sent(self, now: float) -> None:
        self.in_flight = True
        self.last_sent = now

    def received(self, now: float) -> None:
        """An answer that keeps the session alive (no error, or REBALANCE_IN_PROGRESS)."""
        self.in_flight = False
        self.last_received = now
        self.last_answer = now

    def answered(self) -> None:
        """An answer that says nothing of the session (an error), or no answer (a disconnect)."""
        self.in_flight = False

    def reset_session(self, now: float, *, first_beat_from: float | None = None, joined: bool = False) -> None:
        """A new session clock (a coordinator found, or ``joined``: a join completed, which also
        proves membership).  ``first_beat_from`` counts the first heartbeat interval from an
        earlier moment: some brokers (Tansu) time the session from the JoinGroup, not from the
        SyncGroup."""
        self.last_received = now
        if joined:
            self.last_answer = now
        if first_beat_from is not None:
            self.last_sent = first_beat_from

    def polled(self, now: float) -> None:
        self.last_poll = now

    # -- what is due ----------------------------------------------------------------------------

    def poll_timeout_expired(self, now: float) -> bool:
        """No ``poll()`` for longer than ``max_poll_interval_ms``: the member should leave."""
        return now - self.last_poll > self.max_poll_interval

    def session_expired(self, now: float) -> bool:
        """No heartbeat answer for longer than the session timeout: the coordinator has
        surely dropped us, or we are talking to the wrong one."""
        return now - self.last_received > self.session_timeout

    def heartbeat_now(self) -> None:
        """Make the next heartbeat due at once (when not one is in flight)."""
        self.last_sent = 0.0

    def should_heartbeat(self, now: float) -> bool:
        return not self.in_flight and now - self.last_sent >= self.interval

    def until_due(self, now: float) -> float | None:
        """Seconds until the next heartbeat is due; None while one is in flight."""
        return None if self.in_flight else max(0.0, self.last_sent + self.interval - now)


class HeartbeatThread:
    """A daemon thread calling ``tick()`` until stopped: every ``min(0.1, interval / 2)``
    seconds, or sooner when ``tick`` returns the seconds until its next heartbeat is due.  A
    fixed tick alone sent each heartbeat up to 100 ms late, and under KIP-848 a newcomer's
    partitions arrive only with its next heartbeat (bench/groups --trace showed it).

    It waits on a socket pair, not a ``threading.Event``: ``wake`` runs in signal handlers
    (kdaemon's sibling pokes), and ``Event.set`` takes a lock that a second signal, handled
    inside the first handler, would wait for for ever (a worker hung that way under load: its
    loop and this thread both stopped, and the coordinator fenced it)."""

    def __init__(self, tick: Callable[[], float | None], interval: float, name: str) -> None:
        self._tick = tick
        self._period = min(0.1, interval / 2)
        self._name = name
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None

    def start(self) -> None:
        """Start it unless it runs already (a rejoin keeps the same thread)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            if self._wake_r is None:
                self._wake_r, self._wake_w = socket.socketpair()
                self._wake_r.setblocking(False)
                self._wake_w.setblocking(False)
            self._thread = threading.Thread(target=self._run, args=(self._wake_r,), name=self._name, daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Run a tick now rather than at the end of the current wait: something is due at once
        (``GroupMembership.heartbeat_soon``).  Async-signal-safe: one non-blocking send, no
        lock; nothing before ``start`` or after ``stop`` (a closed socket refuses the send)."""
        w = self._wake_w
        if w is not None:
            try:
                w.send(b"w")
            except OSError:   # full (a wake is pending anyway), or closed by stop()
                pass

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            if self._thread.is_alive():
                return   # still in a tick: it may yet wait on the sockets
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._wake_r = self._wake_w = None

    def _run(self, wake: socket.socket) -> None:
        while not self._stop.is_set():
            due = None
            try:
                due = self._tick()
            except Exception:
                log.exception("%s: heartbeat thread error", self._name)
            try:
                ready, _, _ = select.select([wake], [], [], self._period if due is None else
                                            min(self._period, max(due, 0.001)))
                if ready:
                    while wake.recv(4096):
                        pass
            except (BlockingIOError, InterruptedError):
                pass
