"""The supervisor's control socket: ``kdaemon status`` asks the running daemon what it runs.

One Unix stream socket, ``<state_dir>/control.sock`` (``socket_path``, the one definition both
ends use), mode 0600: only the daemon's user may ask.  A request is one JSON line,
``{"request": "status"}``; the answer is one JSON line, ``{"status": {...}}`` (a
``DaemonStatus``) or ``{"error": "..."}``, and the supervisor closes the connection.

Why no thread: the supervisor forks its workers and must hold no thread (invariant 13: a thread
would be copied half-way into every child).  The listening socket and every client connection
are non-blocking and polled by the arbiter's own ``select`` (``waiting`` / ``serve``), as the
``/metrics`` endpoint is, both through ``connections.py``: a request must be whole within
``[daemon] endpoint_request_timeout_s`` and ``MAX_REQUEST_BYTES``, at most
``endpoint_max_clients`` clients at once, an answer too big for the socket buffer written as
the socket takes it.  A forked child closes every one of these descriptors at once
(``close_in_child``): a client connection left open in a worker would keep the client waiting
for an end of file that only the worker's exit brings.

What the answer holds comes from what the supervisor already knows: the workers' heartbeats
(``heartbeat.WorkerHeartbeat``: readiness, and each partition's position and lag) and its own
bookkeeping (pids, restarts and why, companions).  It never asks a broker.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from ..config import DaemonSection
from .connections import Connections, Limits
from .heartbeat import HeldPartition, ShareFigures

log = logging.getLogger("kdaemon.supervisor")

SOCKET_NAME = "control.sock"
MAX_REQUEST_BYTES = 4096   # one JSON line: {"request": "status"} is 22 bytes
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
    # A share-group member's records (acquired, settled, in flight) instead of positions and
    # lags per partition, which it has none of; None for a consumer-group worker.
    share: ShareFigures | None = None

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
                     int(w["delivered"]), tuple(str(p) for p in w["problems"]),
                     None if w.get("share") is None else ShareFigures(**{k: int(v) for k, v in w["share"].items()}))
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
                                    p.delivered, tuple(p.problems), getattr(p, "share", None)))
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
        raise ControlError(f"the kdaemon at {path} closed the connection without answering (more clients at "
                           "once than its [daemon] endpoint_max_clients, or it is stopping); try again")
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

class JsonLineRequests:
    """The control socket's protocol over ``connections.Connections``: one JSON line in, one out."""

    def __init__(self, status: Callable[[], DaemonStatus]) -> None:
        self._status = status

    def request_length(self, inbox: bytes) -> int | None:
        end = inbox.find(b"\n")
        return None if end < 0 else end + 1

    def answer(self, request: bytes) -> bytes:
        return json.dumps(self._handle(request.rstrip(b"\r\n"))).encode() + b"\n"

    def too_large(self, limit: int) -> bytes:
        return json.dumps({"error": f"a request is one JSON line of at most {limit} bytes"}).encode() + b"\n"

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


class ControlServer:
    """The listening socket and its clients (``connections.Connections``, with the limits every
    endpoint of the supervisor has), served from the arbiter's loop.

    ``open`` binds (replacing a stale socket: the caller holds the state directory's lock, so no
    other daemon can be listening there); if that fails the daemon runs on without it, said in
    an ERROR.  Each loop turn: ``waiting()`` gives the descriptors to select on, ``serve`` takes
    select's answer (and hands back the descriptors that are not its own), ``close`` removes the
    socket at exit."""

    def __init__(self, state_dir: str, status: Callable[[], DaemonStatus], *,
                 request_timeout_s: float = DaemonSection.endpoint_request_timeout_s,
                 max_clients: int = DaemonSection.endpoint_max_clients,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = socket_path(state_dir)
        self._requests = JsonLineRequests(status)
        self._limits = limits(request_timeout_s, max_clients)
        self._clock = clock
        self.clients: Connections | None = None
        self._inode: int | None = None

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
            sock.listen(128)
        except OSError as exc:
            sock.close()
            log.error("control socket %s not opened: %s; kdaemon status cannot reach this daemon", self.path,
                      exc.strerror or exc)
            return
        finally:
            os.umask(old_umask)
        self.clients = Connections("control socket", sock, self._requests, self._limits, clock=self._clock)
        self._inode = os.stat(self.path).st_ino
        log.info("control socket %s (kdaemon status)", self.path)

    def set_limits(self, request_timeout_s: float, max_clients: int) -> None:
        """A reload's limits, for the connections accepted from now on."""
        self._limits = limits(request_timeout_s, max_clients)
        if self.clients is not None:
            self.clients.limits = self._limits

    def waiting(self) -> tuple[list[int], list[int]]:
        """(descriptors to watch for reading, for writing)."""
        return ([], []) if self.clients is None else self.clients.waiting()

    def serve(self, readable: list[int], writable: list[int]) -> list[int]:
        """Do what select said can be done; return the readable descriptors that are not ours."""
        return readable if self.clients is None else self.clients.serve(readable, writable)

    def close_in_child(self) -> None:
        """In a forked worker: close every descriptor of this server, remove nothing."""
        if self.clients is not None:
            self.clients.close()
            self.clients = None

    def close(self) -> None:
        """At the supervisor's exit: close everything and remove the socket, if it is still the
        one this server bound (never another daemon's, started after this one lost its lock)."""
        was_open = self.clients is not None
        self.close_in_child()
        if not was_open:
            return
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("control socket %s not removed: %s", self.path, exc.strerror or exc)


def limits(request_timeout_s: float, max_clients: int) -> Limits:
    return Limits(request_timeout_s, MAX_REQUEST_BYTES, max_clients)
