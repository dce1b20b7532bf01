"""Servers shared by every process of one test run: started once, by the first that needs one.

Under pytest-xdist each worker is a process of its own, so a session fixture would start one
Apache Kafka per worker (a JVM, 10-20 CPU-seconds, on a 2-core machine).  Instead the fixture
asks ``shared(name, ...)``: under an exclusive ``flock`` on ``<root>/<name>.lock`` the first
caller starts the server and writes how to reach it to ``<root>/<name>.json``; every later
caller, in any process, builds a handle from that file.  The servers are not children of the
process that started them in any way that matters (their own sessions, killed by pid), so a
worker that finishes early does not take them down with it.

Who stops them: the process that owns the run (pytest's controller, or the only process without
xdist) calls ``stop_all(root)`` once every worker is done.  A root the developer names in
``KDAEMON_TEST_SERVERS`` is theirs: its servers are left running for the next run to attach to
(``python -m testkit.shared stop DIR`` stops them).  A record whose processes are gone is
dropped and the server started anew.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

ENV = "KDAEMON_TEST_SERVERS"          # a root the developer keeps: servers outlive the run
RUN_ENV = "KDAEMON_TEST_SERVERS_RUN"  # the root of this run, set by its controller for the workers

T = TypeVar("T")


@contextmanager
def locked(path: Path):
    """An exclusive flock on ``path`` (created if missing), between processes and threads alike:
    each call opens the file anew, and flock locks belong to the open file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:   # a zombie of ours counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def shared(root: Path, name: str, start: Callable[[Path], T], describe: Callable[[T], dict],
           attach: Callable[[dict], T]) -> T:
    """The server ``name`` of the run rooted at ``root``: started by ``start(directory)`` if no
    live one is recorded, else rebuilt by ``attach(record)``.  ``describe(server)`` must hold
    ``pids``, the processes whose death means the server is gone."""
    record_path = root / f"{name}.json"
    with locked(root / f"{name}.lock"):
        if record_path.exists():
            record = json.loads(record_path.read_text())
            if all(pid_alive(p) for p in record["pids"]):
                return attach(record)
            _kill(record["pids"])
            record_path.unlink()
        directory = root / name
        server = start(directory)
        record = describe(server)
        tmp = record_path.with_suffix(".partial")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(record_path)
        return server


def _kill(pids: list[int], timeout: float = 10.0) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    for pid in pids:
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def stop_all(root: Path) -> list[str]:
    """SIGKILL every server recorded under ``root`` (as the session fixtures always did) and
    forget it; the names of those stopped."""
    stopped = []
    for record_path in sorted(root.glob("*.json")):
        with locked(record_path.with_suffix(".lock")):
            try:
                record = json.loads(record_path.read_text())
            except (OSError, ValueError):
                continue
            _kill(record.get("pids", []))
            record_path.unlink()
            stopped.append(record_path.stem)
    return stopped


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("stop", "list"):
        print("usage: python -m testkit.shared stop|list DIR", file=sys.stderr)
        return 2
    root = Path(argv[1])
    if argv[0] == "stop":
        print("stopped:", ", ".join(stop_all(root)) or "nothing")
        return 0
    for record_path in sorted(root.glob("*.json")):
        record = json.loads(record_path.read_text())
        state = "running" if all(pid_alive(p) for p in record["pids"]) else "gone"
        print(f"{record_path.stem}: {record.get('bootstrap', '?')} ({state}, pids {record['pids']})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
