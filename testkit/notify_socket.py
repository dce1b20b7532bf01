"""A stand-in for systemd's notification socket: a Unix datagram socket that records every
message together with the sender's pid (SCM_CREDENTIALS, as systemd checks NotifyAccess=main)."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass

_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True)
class Notification:
    at: float          # time.monotonic() on arrival
    pid: int           # the sender, from the kernel
    message: str

    @property
    def fields(self) -> dict[str, str]:
        return dict(line.split("=", 1) for line in self.message.split("\n") if "=" in line)


class NotifySocket:
    """``address`` is what goes into NOTIFY_SOCKET: a path, or ``@name`` (abstract namespace)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.messages: list[Notification] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self._sock.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="notify-socket", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self._sock.recvmsg(4096, socket.CMSG_SPACE(_UCRED.size))
            except socket.timeout:
                continue
            except OSError:
                return
            pid = -1
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = _UCRED.unpack(payload[:_UCRED.size])[0]
            self.messages.append(Notification(time.monotonic(), pid, data.decode("utf-8", "replace")))

    def wait_for(self, predicate, timeout: float, what: str, *, since: int = 0) -> Notification:
        """The first message from index ``since`` on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        while True:
            for n in self.messages[since:]:
                if predicate(n):
                    return n
            if time.monotonic() > deadline:
                got = [n.message for n in self.messages]
                raise AssertionError(f"no {what} on the notify socket within {timeout} s; got {got}")
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()
        if not self.address.startswith("@"):
            try:
                os.unlink(self.address)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "NotifySocket":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
