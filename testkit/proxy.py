"""A TCP proxy on 127.0.0.1 that cuts every connection it carries, at a chosen byte or on demand.

One forwarder per upstream broker (``addresses[upstream]`` is where to connect instead).  All
forwarders share one byte budget: ``cut_after(n1, n2, ...)`` forwards n1 more bytes (in either
direction, so a cut lands mid-request or mid-response, wherever the count runs out), closes
every connection, then does the same with n2, and so on.  ``cuts`` counts what happened, so a
test can check that its faults really occurred.

Threads, not asyncio: the code under test runs its own selector loop in the test's thread.
"""

from __future__ import annotations

import socket
import threading
from collections import deque

_CHUNK = 64 * 1024


class ListeningProxy:
    """What every test proxy shares: one listener per upstream broker on 127.0.0.1
    (``addresses[upstream]`` is where to connect instead), the accept loop, and the sockets it
    carries, closed together by ``close()`` or the ``with`` block.  A subclass carries each
    accepted connection in ``_carry(client, server, number)``."""

    def __init__(self, upstreams, name: str) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._socks: set[socket.socket] = set()
        self._listeners: list[socket.socket] = []
        self.connections = 0
        self.addresses: dict[tuple[str, int], tuple[str, int]] = {}
        for upstream in upstreams:
            upstream = (upstream[0], int(upstream[1]))
            listener = socket.create_server(("127.0.0.1", 0))
            self._listeners.append(listener)
            self.addresses[upstream] = ("127.0.0.1", listener.getsockname()[1])
            threading.Thread(target=self._accept, args=(listener, upstream), daemon=True,
                             name=f"{name}-{upstream[1]}").start()

    def _carry(self, client: socket.socket, server: socket.socket, number: int) -> None:
        raise NotImplementedError

    def _unreachable(self, upstream: tuple[str, int], exc: OSError) -> None:
        """The upstream refused a connection (the client's is closed)."""

    def _accept(self, listener: socket.socket, upstream: tuple[str, int]) -> None:
        while not self._closed:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(upstream, timeout=5)
            except OSError as exc:
                self._unreachable(upstream, exc)
                close_socket(client)
                continue
            server.settimeout(None)
            with self._lock:
                if self._closed:
                    close_socket(client)
                    close_socket(server)
                    return
                self._socks |= {client, server}
                self.connections += 1
                number = self.connections
            self._carry(client, server, number)

    def close(self) -> None:
        self._closed = True
        for listener in self._listeners:
            close_socket(listener)
        with self._lock:
            socks, self._socks = self._socks, set()
        for s in socks:
            close_socket(s)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CuttingProxy(ListeningProxy):
    def __init__(self, upstreams) -> None:
        self._budgets: deque[int] = deque()
        self._left: int | None = None
        self.cuts = 0
        super().__init__(upstreams, "proxy")

    def bootstrap(self, upstream) -> str:
        host, port = self.addresses[(upstream[0], int(upstream[1]))]
        return f"{host}:{port}"

    def cut_after(self, *budgets: int) -> None:
        """Cut every connection after each of ``budgets`` more bytes, one cut per budget."""
        with self._lock:
            self._budgets.extend(budgets)
            if self._left is None and self._budgets:
                self._left = self._budgets.popleft()

    @property
    def pending_cuts(self) -> int:
        with self._lock:
            return len(self._budgets) + (self._left is not None)

    def cut_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, set()
            self.cuts += 1
        for s in socks:
            close_socket(s)

    def _carry(self, client: socket.socket, server: socket.socket, number: int) -> None:
        for src, dst in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(_CHUNK)
            except OSError:
                data = b""
            if not data:
                with self._lock:
                    self._socks -= {src, dst}
                close_socket(src)
                close_socket(dst)
                return
            cut = False
            with self._lock:
                if self._left is not None:
                    if len(data) >= self._left:
                        data, cut = data[:self._left], True
                        self._left = self._budgets.popleft() if self._budgets else None
                    else:
                        self._left -= len(data)
            try:
                if data:
                    dst.sendall(data)
            except OSError:
                pass
            if cut:
                self.cut_all()


def close_socket(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
