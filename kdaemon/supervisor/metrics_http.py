"""``/metrics`` over HTTP from the supervisor's own select loop: no thread, no framework.

The supervisor forks its workers, so it must not hold a thread (a server thread would be
copied half-way into every child); it polls this socket in the loop that reads heartbeats and
answers one request per readable event, rendering what ``kdaemon.supervisor.metrics``
aggregates from the workers' files.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable

log = logging.getLogger("kdaemon.supervisor")


class MetricsEndpoint:
    """A listening socket on ``host:port``; ``sock`` is None when it could not be bound (the
    daemon runs on without metrics rather than not at all).  ``strict``: raise the ``OSError``
    instead, for a process whose only job is serving metrics (``kdaemon lag-exporter``)."""

    def __init__(self, addr: str, *, strict: bool = False) -> None:
        self.addr = addr
        self.sock: socket.socket | None = None
        host, _, port = addr.rpartition(":")
        sock = None
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host.strip("[]"), int(port)))
            sock.listen(16)
            sock.setblocking(False)
            sock.set_inheritable(False)
            self.sock = sock
            log.info("metrics on http://%s/metrics", addr)
        except OSError as exc:
            if sock is not None:
                sock.close()
            if strict:
                raise
            log.error("cannot serve metrics on %s: %s (continuing without)", addr, exc)

    def fileno(self) -> int | None:
        return None if self.sock is None else self.sock.fileno()

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def serve_one(self, render: Callable[[], tuple[bytes, str]]) -> None:
        """Accept and answer one request: ``GET /metrics`` (or ``/``) gets ``render()``'s
        (body, content type), anything else a 404."""
        try:
            conn, _ = self.sock.accept()  # type: ignore[union-attr]
        except (BlockingIOError, OSError):
            return
        try:
            conn.settimeout(2.0)
            request = b""
            while b"\r\n\r\n" not in request and len(request) < 8192:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                request += chunk
            line = request.split(b"\r\n", 1)[0].decode("latin-1", "replace").split()
            if len(line) >= 2 and line[0] == "GET" and line[1].split("?")[0] in ("/metrics", "/"):
                try:
                    body, ctype = render()
                    status = "200 OK"
                except Exception:   # a scrape must never take the supervisor (and its workers) down
                    log.exception("rendering /metrics failed; answering 500")
                    body, ctype, status = b"rendering the metrics failed; see the daemon's log\n", \
                        "text/plain", "500 Internal Server Error"
            else:
                body, ctype, status = b"not found\n", "text/plain", "404 Not Found"
            conn.sendall(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + body)
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                log.debug("metrics request failed: %s", exc)
        finally:
            conn.close()
