"""The supervisor's control socket: ``kdaemon status`` asks the running daemon what it runs.

One Unix stream socket, ``<state_dir>/control.sock`` (``socket_path``, the one definition both
ends use), mode 0600: only the daemon's user may ask.  A request is one JSON line,
``{"request": "status"}``; the answer is one JSON line, ``{"status": {...}}`` (a
``DaemonStatus``) or ``{"error": "..."}``, and the supervisor closes the connection.

Why no thread: the supervisor forks its workers and must hold no thread (invariant 13: a thread
would be copied half-way into every child).  The listening socket and every client connection
are non-blocking and polled by the arbiter's own ``select`` (``waiting`` / ``serve``), as the
``/metrics`` endpoint is; a client that sends nothing is dropped after ``IDLE_S`` (one that
does not read its answer after ``ANSWER_S``), and an answer too big for the socket buffer is
written as the socket takes it.  A forked child closes
every one of these descriptors at once (``close_in_child``): a client connection left open in a
worker would keep the client waiting for an end of file that only the worker's exit brings.

What the answer holds comes from what the supervisor already knows: the workers' heartbeats
(``heartbeat.WorkerHeartbeat``: readiness, and each partition's position and lag) and its own
bookkeeping (pids, restarts and why, companions).  It never asks a broker.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from .heartbeat import HeldPartition

log = logging.getLogger("kdaemon.supervisor")

SOCKET_NAME = "control.sock"
MAX_REQUEST_BYTES = 4096
IDLE_S = 5.0          # a client that has not sent its request by then is dropped
ANSWER_S = 30.0       # ... and one that has not taken its whole answer by then
MAX_CLIENTS = 16      # more at once are refused (closed at accept): the loop serves workers first
# sockaddr_un's sun_path: 108 bytes on Linux, with its terminating NUL.
MAX_PATH_BYTES = 107


def socket_path(state_dir: str) -> str:
    """The control socket of the daemon whose ``[daemon] state_dir`` is ``state_dir`` (made
    absolute against the current directory, as the daemon resolves it)."""
    return os.path.join(os.path.abspath(state_dir), SOCKET_NAME)


class ControlError(Exception):
    """The daemon cannot be asked, or its answer cannot be read; the message says which socket
    was tried and what to do."""


# -- what the answer holds -----------------------------------------------------------------------

@dataclass(frozen=True)
class WorkerStatus:
    """One worker slot.  ``pid`` is None while the slot waits to start its next process (after
    a crash, during its backoff); ``state`` is one of ``WORKER_STATES``."""

    index: int
    pid: int | None
    state: str
    uptime_s: float | None
    restarts: int
    last_restart_reason: str | None
    partitions: tuple[HeldPartition, ...]
    delivered: int
    problems: tuple[str, ...]

    @property
    def lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)


WORKER_STATES = {
    "starting": "forked, has no assignment yet",
    "ready": "has its assignment and consumes",
    "stopping": "asked to stop (SIGTERM): draining, flushing and committing",
    "retiring": "stopping for good (the pool shrank): it leaves the group",
    "restarting": "its process exited; the next one starts after the restart backoff",
}


@dataclass(frozen=True)
class CompanionStatus:
    """A sink's companion process (the Spark uploader): ``pid`` None while it is not running."""

    name: str
    pid: int | None
    uptime_s: float | None


@dataclass(frozen=True)
class DaemonStatus:
    pid: int
    started_at: float          # time.time() when the supervisor opened this socket
    config_path: str
    state_dir: str
    target_workers: int
    stopping: bool
    workers: tuple[WorkerStatus, ...]
    companions: tuple[CompanionStatus, ...]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, msg: object) -> "DaemonStatus":
        """The daemon's answer; ControlError naming the field that is missing or wrong."""
        try:
            return _decode_status(msg)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlError(f"the daemon's status answer does not parse ({type(exc).__name__}: {exc}); "
                               "is kdaemon status the same version as the running daemon?") from None


def _opt(value, kind):
    return None if value is None else kind(value)


def _decode_status(msg) -> DaemonStatus:
    if not isinstance(msg, dict):
        raise TypeError(f"a status is a JSON object, not {type(msg).__name__}")
    workers = tuple(
        WorkerStatus(int(w["index"]), _opt(w["pid"], int), str(w["state"]), _opt(w["uptime_s"], float),
                     int(w["restarts"]), _opt(w["last_restart_reason"], str),
                     tuple(HeldPartition(str(p["topic"]), int(p["partition"]), _opt(p["position"], int),
                                         _opt(p["lag"], int)) for p in w["partitions"]),
                     int(w["delivered"]), tuple(str(p) for p in w["problems"]))
        for w in msg["workers"])
    companions = tuple(CompanionStatus(str(c["name"]), _opt(c["pid"], int), _opt(c["uptime_s"], float))
                       for c in msg["companions"])
    return DaemonStatus(int(msg["pid"]), float(msg["started_at"]), str(msg["config_path"]), str(msg["state_dir"]),
                        int(msg["target_workers"]), bool(msg["stopping"]), workers, companions)


def describe_restart(reason: str, code: int) -> str:
    """A restart as ``kdaemon status`` shows it: the metrics' reason label (``metrics.restart_reason``,
    one definition) and the exit status behind it, "signal (SIGKILL)", "exit (code 1)"."""
    if code < 0:
        try:
            return f"{reason} ({signal.Signals(-code).name})"
        except ValueError:
            return f"{reason} (signal {-code})"
    return f"{reason} (code {code})"


def worker_statuses(procs: Iterable, slots: dict, target: int, now: float) -> tuple[WorkerStatus, ...]:
    """Every worker slot from the arbiter's ``WorkerProc``s (live processes) and ``Slot``s
    (restart bookkeeping per index): a slot below ``target`` without a live process is
    "restarting"."""
    out: list[WorkerStatus] = []
    live = {}
    for p in procs:
        live.setdefault(p.index, []).append(p)
    for index in sorted(set(live) | set(range(target))):
        slot = slots.get(index)
        restarts = slot.restarts if slot is not None else 0
        reason = slot.last_restart_reason if slot is not None else None
        for p in sorted(live.get(index, []), key=lambda p: p.started):
            state = ("retiring" if p.retiring else "stopping") if p.stopping else ("ready" if p.ready else "starting")
            out.append(WorkerStatus(index, p.pid, state, now - p.started, restarts, reason, tuple(p.held),
                                    p.delivered, tuple(p.problems)))
        if index not in live:
            out.append(WorkerStatus(index, None, "restarting", None, restarts, reason, (), 0, ()))
    return tuple(out)


def daemon_status(procs: Iterable, slots: dict, target: int, *, stopping: bool,
                  companions: Iterable[CompanionStatus], config_path: str, state_dir: str) -> DaemonStatus:
    """The supervisor's answer, from its state (see ``worker_statuses``)."""
    return DaemonStatus(os.getpid(), _started_at(), os.path.abspath(config_path), os.path.abspath(state_dir),
                        target, stopping, worker_statuses(procs, slots, target, time.monotonic()),
                        tuple(companions))


def _started_at() -> float:
    """When this process started (seconds since the epoch), as ``kdaemon_start_time_seconds``."""
    import psutil
    return psutil.Process().create_time()


# -- the client ----------------------------------------------------------------------------------

def request_status(state_dir: str, *, timeout_s: float = 10.0) -> DaemonStatus:
    """Ask the daemon on ``state_dir`` for its status; ControlError when no daemon answers."""
    path = socket_path(state_dir)
    where = f"[daemon] state_dir {state_dir!r}" + ("" if os.path.isabs(state_dir) else
                                                   f" (relative to {os.getcwd()})")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(path)
        except FileNotFoundError:
            raise ControlError(f"no kdaemon runs on {where}: there is no control socket {path}; start it with "
                               "kdaemon run, or run this where the daemon runs (state_dir may be relative)") from None
        except ConnectionRefusedError:
            raise ControlError(f"no kdaemon answers on {where}: {path} exists but nothing listens (a daemon "
                               "that was killed leaves it behind; kdaemon run replaces it)") from None
        except OSError as exc:
            raise ControlError(f"cannot reach the kdaemon of {where} at {path}: {exc.strerror or exc}") from None
        sock.sendall(json.dumps({"request": "status"}).encode() + b"\n")
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except socket.timeout:
        raise ControlError(f"the kdaemon at {path} did not answer within {timeout_s:.0f} s") from None
    finally:
        sock.close()
    if not data:
        raise ControlError(f"the kdaemon at {path} closed the connection without answering (more than "
                           f"{MAX_CLIENTS} clients at once, or it is stopping); try again")
    try:
        msg = json.loads(data)
    except ValueError:
        raise ControlError(f"the kdaemon at {path} sent an answer that is not JSON: {data[:200]!r}") from None
    if isinstance(msg, dict) and "error" in msg:
        raise ControlError(f"the kdaemon at {path} refused the request: {msg['error']}")
    if not isinstance(msg, dict) or "status" not in msg:
        raise ControlError(f"the kdaemon at {path} sent no status: {data[:200]!r}")
    return DaemonStatus.from_dict(msg["status"])


# -- the server ----------------------------------------------------------------------------------

@dataclass
class _Client:
    sock: socket.socket
    since: float
    inbox: bytes = b""
    outbox: bytes | None = None    # the answer, once the request was read


class ControlServer:
    """The listening socket and its clients, served from the arbiter's loop.

    ``open`` binds (replacing a stale socket: the caller holds the state directory's lock, so no
    other daemon can be listening there); if that fails the daemon runs on without it, said in
    an ERROR.  Each loop turn: ``waiting()`` gives the descriptors to select on, ``serve`` takes
    select's answer (and hands back the descriptors that are not its own), ``close`` removes the
    socket at exit."""

    def __init__(self, state_dir: str, status: Callable[[], DaemonStatus]) -> None:
        self.path = socket_path(state_dir)
        self._status = status
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._clients: dict[int, _Client] = {}

    def open(self) -> None:
        if len(os.fsencode(self.path)) > MAX_PATH_BYTES:
            log.error("control socket %s not opened: the path is longer than the %d bytes a Unix socket "
                      "allows; kdaemon status cannot reach this daemon (use a shorter [daemon] state_dir)",
                      self.path, MAX_PATH_BYTES)
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.error("control socket %s not opened: cannot remove the old one: %s; kdaemon status cannot "
                      "reach this daemon", self.path, exc.strerror or exc)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)   # created 0600: no window in which another user could connect
        try:
            sock.bind(self.path)
            sock.listen(MAX_CLIENTS)
        except OSError as exc:
            sock.close()
            log.error("control socket %s not opened: %s; kdaemon status cannot reach this daemon", self.path,
                      exc.strerror or exc)
            return
        finally:
            os.umask(old_umask)
        sock.setblocking(False)
        self._sock = sock
        self._inode = os.stat(self.path).st_ino
        log.info("control socket %s (kdaemon status)", self.path)

    def waiting(self) -> tuple[list[int], list[int]]:
        """(descriptors to watch for reading, for writing)."""
        reading = [] if self._sock is None else [self._sock.fileno()]
        writing = []
        for fd, c in self._clients.items():
            (reading if c.outbox is None else writing).append(fd)
        return reading, writing

    def serve(self, readable: list[int], writable: list[int]) -> list[int]:
        """Do what select said can be done; return the readable descriptors that are not ours."""
        others = []
        now = time.monotonic()
        for fd in readable:
            if self._sock is not None and fd == self._sock.fileno():
                self._accept(now)
            elif fd in self._clients:
                self._read(fd)
            else:
                others.append(fd)
        for fd in writable:
            if fd in self._clients:
                self._write(fd)
        for fd, c in list(self._clients.items()):
            if now - c.since > (IDLE_S if c.outbox is None else ANSWER_S):
                self._drop(fd)
        return others

    def _accept(self, now: float) -> None:
        try:
            conn, _ = self._sock.accept()   # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("control socket %s: accept failed: %s", self.path, exc.strerror or exc)
            return
        if len(self._clients) >= MAX_CLIENTS:
            conn.close()
            return
        conn.setblocking(False)
        self._clients[conn.fileno()] = _Client(conn, now)

    def _read(self, fd: int) -> None:
        c = self._clients[fd]
        try:
            chunk = c.sock.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(fd)
            return
        c.inbox += chunk
        if b"\n" not in c.inbox:
            if len(c.inbox) > MAX_REQUEST_BYTES:
                self._answer(c, {"error": f"a request is one JSON line of at most {MAX_REQUEST_BYTES} bytes"})
                self._write(fd)
            return
        self._answer(c, self._handle(c.inbox.split(b"\n", 1)[0]))
        self._write(fd)

    def _handle(self, line: bytes) -> dict:
        try:
            request = json.loads(line)
        except ValueError:
            return {"error": f"a request is a JSON line such as {{\"request\": \"status\"}}, not {line[:100]!r}"}
        what = request.get("request") if isinstance(request, dict) else None
        if what != "status":
            return {"error": f"unknown request {what!r}; the one request is \"status\""}
        try:
            return {"status": self._status().to_dict()}
        except Exception as exc:   # a status must never take the supervisor (and its workers) down
            log.exception("control socket: building the status failed")
            return {"error": f"the daemon could not build its status ({type(exc).__name__}: {exc}); see its log"}

    @staticmethod
    def _answer(c: _Client, msg: dict) -> None:
        c.outbox = json.dumps(msg).encode() + b"\n"

    def _write(self, fd: int) -> None:
        c = self._clients[fd]
        try:
            sent = c.sock.send(c.outbox)   # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.debug("control socket: answering failed: %s", exc)
            self._drop(fd)
            return
        c.outbox = c.outbox[sent:]   # type: ignore[index]
        if not c.outbox:
            self._drop(fd)

    def _drop(self, fd: int) -> None:
        c = self._clients.pop(fd)
        c.sock.close()

    def close_in_child(self) -> None:
        """In a forked worker: close every descriptor of this server, remove nothing."""
        for c in self._clients.values():
            c.sock.close()
        self._clients.clear()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def close(self) -> None:
        """At the supervisor's exit: close everything and remove the socket, if it is still the
        one this server bound (never another daemon's, started after this one lost its lock)."""
        sock = self._sock
        self.close_in_child()
        if sock is None:
            return
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("control socket %s not removed: %s", self.path, exc.strerror or exc)
