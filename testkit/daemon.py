"""Run ``kdaemon run`` as a real process for the supervisor tests, and look at what it does.

``Daemon`` writes a configuration into a temporary directory (state, sink output and the log
live there too), starts the daemon in its own session, and offers bounded waits on its log,
its worker processes (psutil children of the supervisor), everything it started
(``descendants``, followed by ``wait_gone`` once the supervisor is gone), its ``/metrics`` page
and the jsonl files it writes.  Every wait takes a timeout and fails with the daemon's log tail, so a test
that goes wrong says why instead of hanging.

Log lines the tests rely on (the supervisor's and the workers' own):
* ``started worker <i> (pid <p>)`` — a fork, supervisor;
* ``worker <i> (pid <p>) has its assignment: generation <g>, [...]`` — readiness, and every
  change of a ready worker's partitions after it (KIP-848 moves them without a rejoin), supervisor;
* ``all <n> worker(s) have their assignment`` — the moment READY=1 is sent;
* ``worker-<i> kdaemon.client.group.coordinator: group <g>: joined generation <n>`` — every
  JoinGroup a worker completes (a rebalance it took part in).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from kdaemon.config import dump_toml

HOST = "127.0.0.1"
# The group session timeout of the tests' daemons.  On Tansu (0.6) a JoinGroup waits about half
# the session timeout, and a restarted static member needs that plus ~3.5 s until it has its
# assignment again.  If that takes longer than the session timeout, Tansu expires the old
# incarnation and makes the other members rejoin; and a follower that rejoined once and is then
# restarted is never synced again (its SyncGroup gets REBALANCE_IN_PROGRESS while the leader's
# heartbeats succeed), which hangs a rolling restart.  6 s races (restarts take 6-7 s); 12 s
# leaves a restart (~10 s) two seconds to spare, at the price of ~9.5 s until the first READY.
SESSION_TIMEOUT_MS = 12_000


def kdaemon_command() -> list[str]:
    """The venv's ``kdaemon`` script next to this interpreter, else ``python -m kdaemon.cli``."""
    script = Path(sys.executable).parent / "kdaemon"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "kdaemon.cli"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], object], timeout: float, what: str,
             on_timeout: Callable[[], str] | None = None, interval: float = 0.05):
    """Return the predicate's first truthy value; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{on_timeout()}" if on_timeout is not None else ""
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{extra}")
        time.sleep(interval)


def _alive(p: psutil.Process) -> bool:
    """Still running (a zombie is gone: it only waits for whoever reaps it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: list[psutil.Process], timeout: float, what: str,
              on_timeout: Callable[[], str] | None = None) -> None:
    """Wait until none of ``procs`` runs; AssertionError naming the survivors after ``timeout``."""
    def survivors() -> str:
        lines = []
        for p in procs:
            if _alive(p):
                try:
                    lines.append(f"pid {p.pid} (parent {p.ppid()}): {' '.join(p.cmdline())[:200]}")
                except psutil.NoSuchProcess:
                    continue
        return "still running:\n" + "\n".join(lines) + (f"\n{on_timeout()}" if on_timeout else "")

    wait_for(lambda: not any(_alive(p) for p in procs), timeout, what, survivors, interval=0.1)


# -- configuration -------------------------------------------------------------------------------

def daemon_config(root: Path, bootstrap: str, topic: str, group: str, *, workers: int = 2,
                  sink: str = "jsonl", filters: list | None = None, **daemon) -> dict:
    """A configuration for one test: everything under ``root``, a free metrics port."""
    sinks = {"jsonl": {"type": "jsonl", "path": str(root / "out"), "fsync": False},
             "null": {"type": "null"}}
    d = {"topics": [topic], "workers": workers, "daemon_id": "kd", "state_dir": str(root / "state"),
         "metrics_addr": f"{HOST}:{free_port()}", "flush_interval_ms": 200, "poll_timeout_ms": 200,
         "on_deserialize_error": "skip", "shutdown_timeout_s": 15.0, "heartbeat_timeout_s": 20.0}
    d.update(daemon)
    config = {
        "plugins": [],
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group, "auto_offset_reset": "earliest",
                  "session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_interval_ms": 500, "fetch_max_wait_ms": 100,
                  "retry_backoff_ms": 50, "request_timeout_ms": 10_000},
        "daemon": d,
        "deserializer": {"key": "str", "value": "str"},
        "sink": sinks[sink],
    }
    if filters:
        config["filters"] = filters
    return config


# -- the daemon ----------------------------------------------------------------------------------

_STARTED = re.compile(r"started worker (\d+) \(pid (\d+)\)")
_READY = re.compile(r"worker (\d+) \(pid (\d+)\) has its assignment: generation (-?\d+|-), \[(.*?)\]")
_JOINED = re.compile(r"worker-(\d+) kdaemon\.client\.group\.coordinator: group \S+: joined generation (-?\d+)")


class Daemon:
    """``kdaemon run`` in its own session (so teardown can kill everything it forked), its output in
    ``root/kdaemon.log``."""

    kill_wait_s = 5.0   # after the teardown's SIGKILL

    def __init__(self, root: Path, config: dict, *, env: Mapping[str, str] | None = None,
                 prefix: list[str] | None = None) -> None:
        """``prefix``: a command the daemon runs under (testkit/stall/run.py drops capabilities with
        setpriv)."""
        self.root = root
        self.prefix = list(prefix or [])
        root.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.config_path = root / "kdaemon.toml"
        self.log_path = root / "kdaemon.log"
        self.out_dir = Path(config["sink"].get("path", root / "out"))
        self.metrics_addr = config["daemon"]["metrics_addr"]
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.write_config(config)

    def write_config(self, config: dict | str) -> None:
        if not isinstance(config, str):
            self.config = config
        text = config if isinstance(config, str) else dump_toml(config)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.config_path)  # the supervisor never reads half a file on SIGHUP

    # -- process ----------------------------------------------------------------------------------

    def start(self) -> "Daemon":
        env = {k: v for k, v in os.environ.items()
               if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "PROMETHEUS_MULTIPROC_DIR")}
        env.update(self.extra_env)
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.prefix + kdaemon_command() + ["run", "-c", str(self.config_path)],
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, cwd=self.root, start_new_session=True)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"kdaemon did not exit within {timeout} s\n{self.log_tail()}") from None

    def stop(self, timeout: float = 90) -> int:
        """SIGTERM, then the exit code."""
        self.signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill_all(self) -> None:
        """Teardown: SIGKILL the supervisor and whatever it forked (its own session)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(self.kill_wait_s)
        except subprocess.TimeoutExpired:
            pass

    def __enter__(self) -> "Daemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill_all()

    # -- log ----------------------------------------------------------------------------------------

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "--- kdaemon log (tail) ---\n" + "\n".join(self.log().splitlines()[-lines:])

    def count(self, needle: str) -> int:
        return self.log().count(needle)

    def wait_log(self, pattern: str, timeout: float, *, after: int = 0, count: int = 1) -> re.Match:
        """The ``count``-th match of ``pattern`` in the log from character ``after`` on; fails at
        once when the daemon has exited without writing it."""
        rx = re.compile(pattern)

        def found():
            exited = self.proc is not None and self.proc.poll() is not None
            matches = list(rx.finditer(self.log(), after))   # read after the exit check: complete
            if len(matches) >= count:
                return matches[count - 1]
            if exited:
                raise AssertionError(f"kdaemon exited with {self.proc.returncode} before logging "
                                     f"/{pattern}/ x{count}\n{self.log_tail()}")
            return None
        return wait_for(found, timeout, f"log line /{pattern}/", self.log_tail)

    def wait_all_ready(self, timeout: float = 45, *, after: int = 0) -> re.Match:
        return self.wait_log(r"all \d+ worker\(s\) have their assignment", timeout, after=after)

    def ready_lines(self, after: int = 0) -> list[dict]:
        return [{"index": int(m[1]), "pid": int(m[2]), "generation": None if m[3] == "-" else int(m[3]),
                 "partitions": sorted(p.strip().strip("'") for p in m[4].split(",") if p.strip())}
                for m in _READY.finditer(self.log(), after)]

    def joins(self, index: int, after: int = 0) -> list[int]:
        """Generations worker ``index`` joined (every JoinGroup it completed), in order."""
        return [int(m[2]) for m in _JOINED.finditer(self.log(), after) if int(m[1]) == index]

    # -- workers ------------------------------------------------------------------------------------

    def worker_pids(self) -> set[int]:
        try:
            return {c.pid for c in psutil.Process(self.pid).children()
                    if c.status() != psutil.STATUS_ZOMBIE}
        except psutil.NoSuchProcess:
            return set()

    def descendants(self) -> list[psutil.Process]:
        """Every live process the supervisor started and what they started in turn (workers,
        companions, a companion's JVM), to follow them after the supervisor is gone."""
        try:
            return [p for p in psutil.Process(self.pid).children(recursive=True) if _alive(p)]
        except psutil.NoSuchProcess:
            return []

    def workers(self) -> dict[int, int]:
        """index -> pid of the live workers (from the supervisor's "started worker" lines)."""
        live = self.worker_pids()
        out = {}
        for m in _STARTED.finditer(self.log()):
            if int(m[2]) in live:
                out[int(m[1])] = int(m[2])
        return out

    # -- metrics and output ---------------------------------------------------------------------------

    def metrics(self) -> dict[tuple[str, frozenset], float]:
        """{(name, frozenset(labels.items())): value} from /metrics."""
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r'([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)', line)
            if m is None:
                continue
            labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m[2] or ""))
            out[(m[1], labels)] = float(m[3])
        return out

    def output(self) -> list[dict]:
        """Every complete line in the jsonl sink's files, published or still open."""
        records = []
        if not self.out_dir.is_dir():
            return records
        for path in sorted(self.out_dir.iterdir()):
            if not (path.name.endswith(".jsonl") or path.name.endswith(".jsonl.open")):
                continue
            data = path.read_bytes()
            for line in data.split(b"\n")[:-1]:  # an unterminated last line is still being written
                if line:
                    records.append(json.loads(line))
        return records
