"""``/metrics`` over HTTP from the supervisor's own select loop: no thread, no framework.

The supervisor forks its workers, so it must not hold a thread (a server thread would be
copied half-way into every child, invariant 13); its clients are non-blocking connections
served a turn at a time from the loop that reads heartbeats (``connections.py``, with its limits
on time, size and number), and each answer is rendered by ``kdaemon.supervisor.metrics`` from
the workers' files.  The page is OpenMetrics when the scraper asks for it in ``Accept`` (as
Prometheus does), the Prometheus text format otherwise: prometheus_client's ``choose_encoder``
decides, as in its own server.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from .connections import Connections, Limits

log = logging.getLogger("kdaemon.supervisor")

# A scrape's request line and headers: Prometheus sends about 300 bytes.
MAX_REQUEST_BYTES = 8192
PATHS = ("/metrics", "/")

# render(accept header) -> (body, content type)
Render = Callable[[str], tuple[bytes, str]]


def _response(status: str, body: bytes, ctype: str = "text/plain; charset=utf-8", *, head: bool = False,
              extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}"
            "Connection: close\r\n\r\n").encode("latin-1") + (b"" if head else body)


class HttpRequests:
    """One HTTP/1.1 request per connection, answered and closed: ``GET`` (or ``HEAD``) of
    ``/metrics`` or ``/`` gets ``render(accept)``'s page; another path a 404, another method a
    405, what does not parse a 400.  A render that raises is a 500, never the supervisor's end."""

    def __init__(self, render: Render) -> None:
        self._render = render

    def request_length(self, inbox: bytes) -> int | None:
        ends = [i + len(sep) for sep in (b"\r\n\r\n", b"\n\n") if (i := inbox.find(sep)) >= 0]
        return min(ends) if ends else None

    def answer(self, request: bytes) -> bytes:
        lines = request.decode("latin-1").splitlines()
        parts = lines[0].split() if lines else []
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return _response("400 Bad Request", b"not an HTTP request\n")
        method, target = parts[0], parts[1]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if target.split("?", 1)[0] not in PATHS:
            return _response("404 Not Found", b"not found; the metrics are on /metrics\n")
        if method not in ("GET", "HEAD"):
            return _response("405 Method Not Allowed", f"{method} is not served; use GET\n".encode("latin-1"),
                             extra="Allow: GET, HEAD\r\n")
        try:
            body, ctype = self._render(headers.get("accept", ""))
        except Exception:   # a scrape must never take the supervisor (and its workers) down
            log.exception("rendering /metrics failed; answering 500")
            return _response("500 Internal Server Error", b"rendering the metrics failed; see the daemon's log\n")
        return _response("200 OK", body, ctype, head=method == "HEAD")

    def too_large(self, limit: int) -> bytes:
        return _response("413 Content Too Large", f"a request's line and headers take at most {limit} bytes\n"
                         .encode())


class MetricsEndpoint:
    """A listening socket on ``host:port`` and its clients (``connections.Connections``);
    ``clients`` is None when the address could not be bound (the daemon runs on without
    metrics rather than not at all).  Each turn of the arbiter's loop: ``waiting()`` into
    ``select``, ``serve`` with its answer; ``close`` at exit and in every forked worker."""

    def __init__(self, addr: str, render: Render, *, request_timeout_s: float, max_clients: int) -> None:
        self.addr = addr
        self.clients: Connections | None = None
        host, _, port = addr.rpartition(":")
        sock = None
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host.strip("[]"), int(port)))
            sock.listen(128)
            sock.set_inheritable(False)
        except OSError as exc:
            if sock is not None:
                sock.close()
            log.error("cannot serve metrics on %s: %s (continuing without)", addr, exc)
            return
        self.clients = Connections("metrics endpoint", sock, HttpRequests(render),
                                   limits(request_timeout_s, max_clients))
        log.info("metrics on http://%s/metrics", addr)

    def set_limits(self, request_timeout_s: float, max_clients: int) -> None:
        """A reload's limits, for the connections accepted from now on."""
        if self.clients is not None:
            self.clients.limits = limits(request_timeout_s, max_clients)

    def waiting(self) -> tuple[list[int], list[int]]:
        return ([], []) if self.clients is None else self.clients.waiting()

    def serve(self, readable: list[int], writable: list[int]) -> list[int]:
        return readable if self.clients is None else self.clients.serve(readable, writable)

    def close(self) -> None:
        if self.clients is not None:
            self.clients.close()
            self.clients = None


def limits(request_timeout_s: float, max_clients: int) -> Limits:
    return Limits(request_timeout_s, MAX_REQUEST_BYTES, max_clients)
