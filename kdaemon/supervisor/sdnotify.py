"""sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET.

Never raises: a daemon must run the same with or without systemd.  A leading ``@`` in the
socket path means the Linux abstract namespace.
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger(__name__)


def notify(message: str, *, environ=None) -> bool:
    """Send ``message`` (e.g. ``"READY=1"``); return whether it was sent."""
    env = os.environ if environ is None else environ
    path = env.get("NOTIFY_SOCKET")
    if not path:
        return False
    if path.startswith("@"):
        path = "\0" + path[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(path)
            sock.sendall(message.encode("utf-8"))
        return True
    except OSError as exc:
        log.debug("sd_notify(%r) failed: %s", message, exc)
        return False


def monotonic_usec() -> int:
    return int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)


def watchdog_interval_s(environ=None) -> float | None:
    """Half of systemd's WatchdogSec (WATCHDOG_USEC), if the watchdog is for us."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return int(usec) / 2_000_000
    except ValueError:
        return None
