"""The network client: every broker connection of one consumer, driven by one selector.

This is the only place (with ``connection.py``) that touches sockets.  All methods take one
re-entrant lock so that, from the groups issue on, a heartbeat thread can send through the same
client while the application thread polls, as the Java ``ConsumerNetworkClient`` does.

``wakeup()`` is the one thread-safe entry point that does not take the lock: it writes a byte
to a socketpair the selector watches, so a ``poll`` blocked in ``select`` returns at once.
"""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable

from ..protocol.schema import Api
from .config import ConsumerConfig, parse_address
from .connection import DISCONNECTED, BrokerConnection
from .errors import AuthenticationError, ConnectionFailedError
from .future import Future

log = logging.getLogger(__name__)


def build_ssl_context(config: ConsumerConfig) -> ssl.SSLContext:
    """The TLS context for SSL and SASL_SSL.  The broker's certificate chain is verified against
    ``ssl_cafile``, or the system trust store when it is unset; only
    ``ssl_certificate_verification=False`` turns that off (``ssl_check_hostname=False`` skips the
    name check alone)."""
    ctx = ssl.create_default_context(cafile=config.ssl_cafile)
    ctx.check_hostname = config.ssl_check_hostname and config.ssl_certificate_verification
    if not config.ssl_certificate_verification:
        ctx.verify_mode = ssl.CERT_NONE
        log.warning("TLS server certificate verification is off (ssl_certificate_verification=False): "
                    "the broker's identity is not checked")
    if config.ssl_certfile:
        ctx.load_cert_chain(config.ssl_certfile, config.ssl_keyfile, config.ssl_password)
    return ctx


class NetworkClient:
    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._woken = False
        self._ssl_context = build_ssl_context(config) if config.security_protocol in ("SSL", "SASL_SSL") else None
        self._conns: dict[int, BrokerConnection] = {}
        self._registered: dict[int, tuple[socket.socket, int]] = {}
        self._nodes: dict[int, tuple[str, int]] = {}
        self._pinned: set[int] = set()  # nodes not from metadata (the coordinator's own connection)
        self.bootstrap_ids: list[int] = []
        for i, server in enumerate(config.bootstrap_servers):
            node_id = -(i + 1)
            self._nodes[node_id] = parse_address(server)
            self.bootstrap_ids.append(node_id)
        self._closed = False
        # Bumped whenever something happened that may let a waiting caller make progress: a
        # response arrived or a connection became ready.  Callers wait on it instead of sleeping.
        self.progress = 0
        # Observers of the wire, for tests and tools: each is called as
        # ``observer(node_id, api, version, body, response)`` for every request written to a
        # broker (``response`` False) and every response read (True), connection set-up
        # (ApiVersions, SASL) included, under the client's lock.  It shows what the client really
        # speaks, e.g. that no version Kafka 4 removed (KIP-896) ever goes out.  An observer must
        # not raise and must not change ``body``.
        self.observers: list[Callable[[int, Api, int, dict, bool], None]] = []

    # -- nodes ----------------------------------------------------------------------------------

    @property
    def lock(self) -> threading.RLock:
        return self._lock

    def set_brokers(self, brokers: dict[int, tuple[str, int]]) -> None:
        """Adopt the broker list from metadata; connections to moved or vanished brokers close."""
        with self._lock:
            for node_id, addr in brokers.items():
                old = self._nodes.get(node_id)
                if old is not None and old != addr and node_id in self._conns:
                    self._drop(node_id)
                self._nodes[node_id] = addr
            for node_id in list(self._nodes):
                if node_id >= 0 and node_id not in brokers and node_id not in self._pinned:
                    self._nodes.pop(node_id)
                    if node_id in self._conns:
                        self._drop(node_id)

    def known_nodes(self) -> list[int]:
        return list(self._nodes)

    def pin_node(self, node_id: int, host: str, port: int) -> None:
        """Add a node that metadata updates leave alone.

        The group coordinator gets its own connection under such an id (as in the Java client):
        a broker handles one request per connection at a time, so a heartbeat queued behind a
        long-polling Fetch would arrive late.
        """
        with self._lock:
            old = self._nodes.get(node_id)
            if old is not None and old != (host, port) and node_id in self._conns:
                self._drop(node_id)
            self._nodes[node_id] = (host, port)
            self._pinned.add(node_id)

    def unpin_node(self, node_id: int) -> None:
        with self._lock:
            self._pinned.discard(node_id)
            self._nodes.pop(node_id, None)
            if node_id in self._conns:
                self._drop(node_id)

    def _connection(self, node_id: int) -> BrokerConnection:
        conn = self._conns.get(node_id)
        if conn is None:
            host, port = self._nodes[node_id]
            conn = BrokerConnection(node_id, host, port, self.config, self._ssl_context,
                                    observers=self.observers)
            self._conns[node_id] = conn
        return conn

    def _drop(self, node_id: int) -> None:
        conn = self._conns.pop(node_id, None)
        if conn is not None:
            self._unregister(node_id)
            conn.close(ConnectionFailedError(f"node {node_id} left the cluster metadata"))

    # -- readiness ------------------------------------------------------------------------------

    def ready(self, node_id: int) -> bool:
        """True if the node can take requests now; starts connecting if it is not connected."""
        with self._lock:
            if node_id not in self._nodes:
                return False
            conn = self._connection(node_id)
            if conn.auth_error is not None:
                raise conn.auth_error
            if conn.ready:
                return True
            now = time.monotonic()
            if conn.can_attempt(now):
                conn.connect(now)
                self._sync(conn)
            return False

    def is_ready(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and conn.ready

    def connection_failed(self, node_id: int) -> bool:
        conn = self._conns.get(node_id)
        return conn is not None and conn.state == DISCONNECTED and conn.connect_failures > 0

    def connection_failed_at(self, node_id: int) -> float:
        """When (monotonic) an attempt to connect to the node last failed or its connection last
        dropped; 0.0 if never."""
        conn = self._conns.get(node_id)
        return 0.0 if conn is None else conn.last_error_at

    def in_flight(self, node_id: int) -> int:
        conn = self._conns.get(node_id)
        return 0 if conn is None else conn.in_flight + conn.pending

    def api_version(self, node_id: int, api: Api, max_version: int | None = None) -> int:
        return self._conns[node_id].version_for(api, max_version=max_version)

    def least_loaded_node(self) -> int | None:
        """A node to send cluster-wide requests to: ready and least busy, else one we can try."""
        with self._lock:
            now = time.monotonic()
            best, best_load = None, None
            candidates = [n for n in self._nodes if n >= 0 and n not in self._pinned] or \
                [n for n in self._nodes if n not in self._pinned]
            for node_id in candidates:
                conn = self._conns.get(node_id)
                if conn is not None and conn.ready:
                    load = conn.in_flight + conn.pending
                elif conn is None or conn.can_attempt(now):
                    load = 1000
                elif conn.state != DISCONNECTED:
                    load = 500
                else:
                    continue
                if best_load is None or load < best_load:
                    best, best_load = node_id, load
            if best is None and any(n >= 0 and n not in self._pinned for n in self._nodes):
                # Every known broker is backing off: fall back to the bootstrap list.
                for node_id in self.bootstrap_ids:
                    conn = self._conns.get(node_id)
                    if conn is None or conn.can_attempt(now) or conn.ready:
                        return node_id
            return best

    def any_ready(self) -> bool:
        """True while a connection to some broker is up (coordinator connections included)."""
        with self._lock:
            return any(c.ready for c in self._conns.values())

    def last_connection_error(self) -> str | None:
        """The latest failure to connect to any broker: what an error that would otherwise only
        say "nothing answered" should name."""
        with self._lock:
            failed = [c for c in self._conns.values() if c.last_error]
            return max(failed, key=lambda c: c.last_error_at).last_error if failed else None

    def last_connection_failure_at(self) -> float:
        """When (monotonic) a connection to a broker last failed or was dropped; 0.0 if never.

        Metadata refreshes after each one, as Java's ``handleServerDisconnect`` does: the broker
        may be gone and its partitions led elsewhere.  Nothing else would ask, since no request
        reaches a leader whose connection keeps failing, and no answer says it moved."""
        with self._lock:
            return max((c.last_error_at for c in self._conns.values()), default=0.0)

    def auth_error(self) -> AuthenticationError | None:
        for conn in self._conns.values():
            if conn.auth_error is not None:
                return conn.auth_error
        return None

    # -- requests -------------------------------------------------------------------------------

    def send(self, node_id: int, api: Api, body: dict, *, timeout_ms: int | None = None,
             min_version: int | None = None, max_version: int | None = None) -> Future:
        with self._lock:
            if node_id not in self._nodes:
                return Future().failure(ConnectionFailedError(f"node {node_id} is not known"))
            conn = self._connection(node_id)
            now = time.monotonic()
            fut = conn.submit(api, body, now, timeout_ms=timeout_ms, min_version=min_version,
                              max_version=max_version)
            if conn.can_attempt(now):
                conn.connect(now)
            self._sync(conn)
            return fut

    # -- the loop -------------------------------------------------------------------------------

    def poll(self, timeout: float, until: Callable[[], bool] | None = None) -> None:
        """Do I/O for up to ``timeout`` seconds, returning early when ``until()`` becomes true,
        after ``wakeup()``, or after one round of I/O if ``until`` is None."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            self._poll_once(max(0.0, deadline - time.monotonic()))
            if self._woken:
                return
            if until is None or until() or time.monotonic() >= deadline:
                return

    def _poll_once(self, timeout: float) -> None:
        # The lock is held for bookkeeping and event handling but not while blocked in select:
        # the heartbeat thread must be able to send while the application thread waits for a
        # long-polling fetch.  Two threads may see the same event; the second one's read or
        # write then finds nothing to do (non-blocking sockets), which is harmless.
        with self._lock:
            if self._closed:
                return
            now = time.monotonic()
            # Request deadlines and connection-setup timeouts are checked between selects, so
            # never sleep longer than that granularity.
            wait = min(timeout, 0.2)
            for conn in list(self._conns.values()):
                conn.check_timeouts(now)
                if conn.pending and conn.can_attempt(now):
                    conn.connect(now)   # the next address of a host (see BrokerConnection.connect)
                if conn.ready and not conn.in_flight and not conn.pending and \
                        now - conn.last_activity > self.config.connections_max_idle_ms / 1000:
                    conn.close(ConnectionFailedError(f"node {conn.node_id}: idle connection closed"))
                self._sync(conn)
            selector = self._selector
        try:
            events = selector.select(wait)
        except (OSError, ValueError):
            return  # closed underneath us by close() from another thread
        with self._lock:
            if self._closed:
                return
            completed = []
            for key, mask in events:
                conn = key.data
                if conn is None:
                    self._drain_wakeup()
                    continue
                if self._conns.get(conn.node_id) is not conn or conn.sock is None:
                    continue
                now = time.monotonic()
                was_ready = conn.ready
                if mask & selectors.EVENT_WRITE:
                    conn.on_writable(now)
                if mask & selectors.EVENT_READ and conn.sock is not None:
                    completed += conn.on_readable(now)
                if conn.sock is not None and conn.wants_write:
                    conn.on_writable(now)
                if conn.ready and not was_ready:
                    self.progress += 1
                self._sync(conn)
            if completed:
                self.progress += 1
            for fut, value in completed:
                fut.success(value)
            for conn in self._conns.values():
                self._sync(conn)

    def _sync(self, conn: BrokerConnection) -> None:
        """Keep the selector registration in step with the connection's socket and wishes."""
        node_id = conn.node_id
        reg = self._registered.get(node_id)
        sock = conn.sock
        if sock is None:
            if reg is not None:
                self._unregister(node_id)
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.wants_write else 0)
        if reg is None:
            self._selector.register(sock, events, conn)
        elif reg[0] is not sock:
            self._unregister(node_id)
            self._selector.register(sock, events, conn)
        elif reg[1] != events:
            self._selector.modify(sock, events, conn)
        self._registered[node_id] = (sock, events)

    def _unregister(self, node_id: int) -> None:
        reg = self._registered.pop(node_id, None)
        if reg is not None:
            try:
                self._selector.unregister(reg[0])
            except (KeyError, ValueError):
                pass

    # -- wakeup and shutdown --------------------------------------------------------------------

    def wakeup(self) -> None:
        """Thread-safe: make a blocked ``poll`` return promptly."""
        self._woken = True
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass

    def interrupt(self) -> None:
        """Thread-safe: end the current select early without a WakeupError (the caller's
        ``until`` condition decides what happens next)."""
        self.progress += 1
        try:
            self._wake_w.send(b"i")
        except (BlockingIOError, OSError):
            pass

    def clear_wakeup(self) -> bool:
        """Return whether a wakeup was pending, and clear it."""
        woken, self._woken = self._woken, False
        return woken

    def _drain_wakeup(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for node_id in list(self._conns):
                self._unregister(node_id)
                self._conns[node_id].close(ConnectionFailedError("client closed"))
            self._conns.clear()
            self._selector.close()
            self._wake_r.close()
            self._wake_w.close()
