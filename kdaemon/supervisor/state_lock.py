"""One daemon per state directory: an exclusive ``flock`` on ``<state_dir>/kdaemon.lock``.

Two daemons started with one configuration on one host both consumed every record: they shared
the static member ids (``<daemon_id>-<index>``, fencing each other), the metrics directory (the
second wiped the first's files) and the sink state.  The second now refuses to start, naming
the first.  The lock is held by the open file, which forked workers inherit: it lasts while any
process of the daemon lives, and the kernel drops it when the last one dies, however it died.
"""

from __future__ import annotations

import fcntl
import os
import socket
from typing import IO

LOCK_NAME = "kdaemon.lock"


class StateDirInUse(Exception):
    """Another daemon holds the state directory; the message names it and what to do."""


def lock_state_dir(state_dir: str, config_path: str) -> IO[str]:
    """Take the state directory for this daemon; keep the returned file open for its life."""
    os.makedirs(state_dir, exist_ok=True)
    path = os.path.join(state_dir, LOCK_NAME)
    f = open(path, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "a process that did not say which"
        f.close()
        raise StateDirInUse(
            f"[daemon] state_dir {os.path.abspath(state_dir)} is in use by another kdaemon ({holder}; lock "
            f"{path}): two daemons on one state_dir share static member ids, metrics and sink state. Stop "
            f"that one, or give this one its own state_dir and [daemon] daemon_id") from None
    f.seek(0)
    f.truncate()
    f.write(f"pid {os.getpid()} on {socket.gethostname()}, config {os.path.abspath(config_path)}\n")
    f.flush()
    return f
