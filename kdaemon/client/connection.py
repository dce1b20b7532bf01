"""One broker connection: a non-blocking socket around the sans-IO ``KafkaConnection``.

The states and every transition between them are in ``_TRANSITIONS`` below.  Requests submitted
while the connection is not ``ready`` (connecting, or re-authenticating) wait in ``_pending`` and
go out in order once it is; at most ``max_in_flight_requests_per_connection`` are on the wire at a
time.  A SASL connection re-authenticates before the session the broker granted runs out
(KIP-368), on the same socket and never interleaved with requests.

Any I/O error, a request timeout (Kafka answers in order, so one late answer stalls everything
behind it) or a protocol error closes the connection and fails every request on it with
``ConnectionFailedError`` so callers can retry.
Authentication failures are different: they are permanent and fail requests with
``AuthenticationError``; reconnecting would only lock the account.
"""

from __future__ import annotations

import errno
import logging
import random
import socket
import ssl
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..protocol.apis import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from ..protocol.connection import KafkaConnection
from ..protocol.errors import BrokerError, Errors, ProtocolError, UnsupportedVersionError
from ..protocol.schema import Api
from ..protocol.versions import broker_ranges, choose_version
from ..backoff import Backoff
from .config import ConsumerConfig
from .errors import AuthenticationError, ConnectionFailedError, KafkaTimeoutError
from .future import Future
from .sasl import SaslError, make_mechanism

log = logging.getLogger(__name__)

# A TLS alert from the broker is a deliberate refusal, as final as a failed SASL login: never
# retried (Java raises SslAuthenticationException for any handshake failure).  A connection that
# merely drops during the handshake is retried.  TLS 1.2 sends the alert during the handshake;
# TLS 1.3 sends a client-certificate refusal after it, on the first read.  internal_error is
# the broker's own trouble, retried like a drop.
_CERTIFICATE_ALERTS = ("ALERT_CERTIFICATE_REQUIRED", "ALERT_BAD_CERTIFICATE", "ALERT_UNKNOWN_CA",
                       "ALERT_CERTIFICATE_UNKNOWN", "ALERT_CERTIFICATE_REVOKED", "ALERT_CERTIFICATE_EXPIRED",
                       "ALERT_UNSUPPORTED_CERTIFICATE", "ALERT_ACCESS_DENIED")
_RETRIED_ALERTS = ("ALERT_INTERNAL_ERROR", "ALERT_CLOSE_NOTIFY")


def _tls_refusal(exc: BaseException) -> str | None:
    """The alert's name when ``exc`` is a TLS alert by which the broker refused us."""
    reason = getattr(exc, "reason", None) if isinstance(exc, ssl.SSLError) else None
    if reason and "ALERT_" in reason and not any(r in reason for r in _RETRIED_ALERTS):
        return reason
    return None

DISCONNECTED = "disconnected"
CONNECTING = "connecting"
TLS = "tls"
API_VERSIONS_STATE = "api_versions"
SASL = "sasl"
READY = "ready"
REAUTH_WAIT = "reauth_wait"
REAUTH = "reauth"

# Every transition a connection makes; ``_enter`` refuses any other.  Any state may also drop to
# disconnected (a failure, a timeout, close()).
#
#   disconnected -> connecting        connect(): a non-blocking TCP connect is under way
#   connecting   -> tls               TCP is up and the listener speaks TLS
#   connecting   -> api_versions      TCP is up, plaintext
#   tls          -> api_versions      the TLS handshake completed
#   api_versions -> sasl              versions known, SASL_* protocol: SaslHandshake sent
#   api_versions -> ready             versions known, nothing to authenticate
#   sasl         -> ready             authenticated
#   ready        -> reauth_wait       a request is to be sent, the SASL session is nearly spent
#                                     (KIP-368), requests are in flight: nothing new is sent
#                                     until they are answered
#   ready        -> reauth            the same with nothing in flight: SaslHandshake
#   reauth_wait  -> reauth            the last answer arrived: SaslHandshake
#   reauth       -> ready             re-authenticated; the requests held meanwhile go out
_TRANSITIONS = {
    DISCONNECTED: {CONNECTING},
    CONNECTING: {TLS, API_VERSIONS_STATE},
    TLS: {API_VERSIONS_STATE},
    API_VERSIONS_STATE: {SASL, READY},
    SASL: {READY},
    READY: {REAUTH_WAIT, REAUTH},
    REAUTH_WAIT: {REAUTH},
    REAUTH: {READY},
}

# KIP-368: Kafka tells a SASL client how long its session lasts (session_lifetime_ms in
# SaslAuthenticate v1+) and closes the connection on the first request after that unless it
# was re-authenticated.  Like the Java client, re-authenticate at a random point between 85%
# and 95% of the lifetime: room for a request in flight to finish and for clock drift, and
# spread so a client's many connections do not all re-authenticate at once.
REAUTH_WINDOW = (0.85, 0.95)

_RECV_CHUNK = 256 * 1024


@dataclass(slots=True)
class _Request:
    api: Api
    body: dict
    future: Future
    deadline: float
    min_version: int | None
    max_version: int | None
    internal: bool = False


class BrokerConnection:
    def __init__(self, node_id: int, host: str, port: int, config: ConsumerConfig,
                 ssl_context: ssl.SSLContext | None = None, observers: list | None = None) -> None:
        self.node_id = node_id
        self.host = host
        self.port = port
        self.config = config
        self.state = DISCONNECTED
        self.sock: socket.socket | None = None
        self._ssl_context = ssl_context
        self._observers = observers if observers is not None else []   # see NetworkClient.observers
        # Not strict: real brokers sometimes pad responses (librdkafka's mock cluster adds a byte
        # to Metadata); what we read is complete, the rest is logged and ignored.
        self._proto = KafkaConnection(client_id=config.client_id, max_frame_size=config.max_frame_bytes,
                                      strict=False)
        self._out = bytearray()
        self._pending: deque[_Request] = deque()
        self._in_flight: deque[_Request] = deque()
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._reconnect = Backoff(config.reconnect_backoff_ms / 1000, config.reconnect_backoff_max_ms / 1000,
                                  jitter=0.2)
        self.next_attempt = 0.0
        # Every address the host resolved to, tried in turn (Java's client.dns.lookup =
        # use_all_dns_ips): "localhost" is often ::1 first, and a broker listening on 127.0.0.1
        # only must still be reached.  What remains of this attempt's list, and why the
        # addresses already dropped failed.
        self._addresses: list[tuple] = []
        self._address_errors: list[str] = []
        self.last_error: str | None = None   # why the last connection attempt failed, for error messages
        self.last_error_at = 0.0
        self._connect_deadline = 0.0
        self.last_activity = time.monotonic()
        self.auth_error: AuthenticationError | None = None
        self._sasl = None
        self._session_lifetime_ms = 0       # what the broker granted at the last authentication
        self._reauth_at: float | None = None  # when to re-authenticate (monotonic), if ever
        self.reauthentications = 0          # completed on this connection, for tests and logs
        self._api_versions_attempt = API_VERSIONS.max_version
        # What the TLS handshake waits for: asking for writability while it waits to read would
        # make the selector report the socket at once, forever, and the poll loop spin.
        self._tls_wants_write = False

    def __repr__(self) -> str:
        return f"<BrokerConnection node={self.node_id} {self.host}:{self.port} {self.state}>"

    # -- status ---------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.state == READY

    @property
    def connect_failures(self) -> int:
        """Consecutive failed connection attempts (0 once a connection is ready)."""
        return self._reconnect.failures

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def wants_write(self) -> bool:
        return bool(self._out) or self.state == CONNECTING or (self.state == TLS and self._tls_wants_write)

    def _enter(self, state: str) -> None:
        """Move to ``state`` if ``_TRANSITIONS`` allows it (anything may drop to disconnected)."""
        if state != DISCONNECTED and state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"node {self.node_id}: no transition {self.state} -> {state}")
        self.state = state

    def can_attempt(self, now: float) -> bool:
        return self.state == DISCONNECTED and self.auth_error is None and now >= self.next_attempt

    def version_for(self, api: Api, min_version: int | None = None, max_version: int | None = None) -> int:
        """The version we will use for ``api`` on this broker, within optional caller bounds."""
        hi = api.max_version if max_version is None else min(api.max_version, max_version)
        lo = api.min_version if min_version is None else max(api.min_version, min_version)
        rng = self.api_versions.get(api.key)
        if rng is None:
            raise UnsupportedVersionError(f"broker {self.node_id} does not offer {api.name}")
        v = min(hi, rng[1])
        if v < max(lo, rng[0]):
            raise UnsupportedVersionError(
                f"{api.name}: need v{lo}-v{hi}, broker {self.node_id} offers v{rng[0]}-v{rng[1]}")
        return v

    # -- connecting -----------------------------------------------------------------------------

    def connect(self, now: float) -> None:
        """Start a non-blocking connect.  The network client registers ``sock`` with its selector."""
        assert self.state == DISCONNECTED
        if not self._addresses:
            try:
                infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            except OSError as exc:
                self._connect_failed(now, f"cannot resolve {self.host}: {exc}")
                return
            self._addresses = list(dict.fromkeys(infos))
            self._address_errors = []
        family, stype, proto, _, addr = self._addresses[0]
        sock = socket.socket(family, stype, proto)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.receive_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.send_buffer_bytes)
        except OSError:
            pass
        rc = sock.connect_ex(addr)
        if rc not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            sock.close()
            self._connect_failed(now, f"connect to {_address(addr)} failed: {errno.errorcode.get(rc, rc)}")
            return
        self.sock = sock
        self._enter(CONNECTING)
        self._connect_deadline = now + self.config.socket_connection_setup_timeout_ms / 1000
        self.last_activity = now

    def _trying(self) -> str:
        """The address this attempt is connecting to, for messages."""
        return _address(self._addresses[0][4])

    def _connect_failed(self, now: float, reason: str) -> None:
        if self.state in (DISCONNECTED, CONNECTING) and len(self._addresses) > 1:
            # This address did not take the TCP connection; nothing was exchanged yet.  Try the
            # next one at once, keeping the queued requests: only a host none of whose
            # addresses answers counts as a failure (and backs off).
            self._drop_socket()
            self._addresses.pop(0)
            self._address_errors.append(reason)
            self.next_attempt = now
            log.debug("node %s: %s; trying %s next", self.node_id, reason, self._trying())
            return
        if self._address_errors:
            reason = "; ".join(self._address_errors + [reason])
        self._addresses, self._address_errors = [], []   # the next attempt resolves the host again
        self.last_error, self.last_error_at = f"node {self.node_id} ({self.host}:{self.port}): {reason}", now
        self.next_attempt = now + self._reconnect.failure()
        log.debug("node %s: %s; next attempt in %.3fs", self.node_id, reason, self.next_attempt - now)
        self.close(ConnectionFailedError(f"node {self.node_id} ({self.host}:{self.port}): {reason}"))

    def _on_connected(self, now: float) -> None:
        self._addresses, self._address_errors = [], []   # a reconnect resolves the host again
        if self._ssl_context is not None and self.state == CONNECTING:
            assert self.sock is not None
            self.sock = self._ssl_context.wrap_socket(
                self.sock, server_hostname=self.host, do_handshake_on_connect=False)
            self._enter(TLS)
            self._tls_step(now)
            return
        self._start_api_versions(now)

    def _tls_step(self, now: float) -> None:
        try:
            self.sock.do_handshake()  # type: ignore[union-attr]
        except ssl.SSLWantReadError:
            self._tls_wants_write = False
            return
        except ssl.SSLWantWriteError:
            self._tls_wants_write = True
            return
        except ssl.SSLCertVerificationError as exc:
            self._auth_failed(f"TLS certificate verification failed: {exc.verify_message}")
            return
        except (ssl.SSLError, OSError) as exc:
            if self._refused_by_alert(exc):
                return
            self._connect_failed(now, f"TLS handshake failed: {exc}")
            return
        self._start_api_versions(now)

    def _start_api_versions(self, now: float) -> None:
        self._enter(API_VERSIONS_STATE)
        body = {"client_software_name": "kdaemon", "client_software_version": _version()}
        self._write_internal(API_VERSIONS, self._api_versions_attempt, body, now)

    def _write_internal(self, api: Api, version: int, body: dict, now: float) -> None:
        req = _Request(api, body, Future(), now + self.config.request_timeout_ms / 1000, None, None, True)
        self._out += self._proto.send(api, version, body, context=req)
        self._observe(api, version, body, False)
        self._in_flight.append(req)

    def _on_api_versions(self, body: dict, version: int, now: float) -> None:
        code = body["error_code"]
        if code == Errors.UNSUPPORTED_VERSION:
            # The broker answered in the v0 layout with what it supports (KIP-511).
            offered = broker_ranges(body).get(API_VERSIONS.key)
            retry = min(offered[1], API_VERSIONS.max_version) if offered else 0
            if retry >= version:
                retry = version - 1
            if retry < 0:
                self._connect_failed(now, "broker supports no ApiVersions version we know")
                return
            self._api_versions_attempt = retry
            self._write_internal(API_VERSIONS, retry, {"client_software_name": "kdaemon",
                                                       "client_software_version": _version()}, now)
            return
        if code:
            self._connect_failed(now, str(BrokerError(code, "ApiVersions")))
            return
        self.api_versions = broker_ranges(body)
        if self.config.security_protocol.startswith("SASL"):
            self._start_sasl(now)
        else:
            self._become_ready(now)

    def _start_sasl(self, now: float, state: str = SASL) -> None:
        """SaslHandshake, to authenticate (``state`` sasl) or re-authenticate (reauth)."""
        self._enter(state)
        self._session_lifetime_ms = 0
        self._sasl = make_mechanism(self.config.sasl_mechanism, self.config.sasl_username or "",
                                    self.config.sasl_password or "")
        try:
            version = choose_version(SASL_HANDSHAKE, self.api_versions)
        except UnsupportedVersionError as exc:
            self._auth_failed(str(exc))
            return
        if version < 1:
            self._auth_failed("broker only offers SaslHandshake v0 (unframed SASL), which kdaemon does not speak")
            return
        self._write_internal(SASL_HANDSHAKE, version, {"mechanism": self._sasl.name}, now)

    def _on_sasl_handshake(self, body: dict, now: float) -> None:
        if body["error_code"]:
            enabled = ", ".join(body.get("mechanisms") or []) or "none"
            self._auth_failed(f"SASL mechanism {self._sasl.name} refused ({BrokerError(body['error_code']).name}); "
                              f"broker enables: {enabled}")
            return
        version = self.version_for(SASL_AUTHENTICATE)
        self._write_internal(SASL_AUTHENTICATE, version, {"auth_bytes": self._sasl.first_message()}, now)

    def _on_sasl_authenticate(self, body: dict, now: float) -> None:
        if body.get("session_lifetime_ms"):
            self._session_lifetime_ms = body["session_lifetime_ms"]
        if body["error_code"]:
            self._auth_failed(f"SASL {self._sasl.name} authentication failed: "
                              f"{body.get('error_message') or BrokerError(body['error_code']).name}")
            return
        try:
            reply = self._sasl.receive(bytes(body["auth_bytes"] or b""))
        except SaslError as exc:
            self._auth_failed(f"SASL {self._sasl.name} authentication failed: {exc}")
            return
        if reply is not None:
            self._write_internal(SASL_AUTHENTICATE, self.version_for(SASL_AUTHENTICATE), {"auth_bytes": reply}, now)
        elif self._sasl.done:
            self._authenticated(now)

    def _authenticated(self, now: float) -> None:
        """Note when the session the broker granted must be renewed, then serve requests."""
        lifetime = self._session_lifetime_ms
        again = self.state == REAUTH
        if again:
            self.reauthentications += 1
        if lifetime > 0:
            self._reauth_at = now + lifetime / 1000 * random.uniform(*REAUTH_WINDOW)
            log.debug("node %s: %s with %s; session lifetime %d ms, re-authenticating in %.1f s",
                      self.node_id, "re-authenticated" if again else "authenticated", self._sasl.name,
                      lifetime, self._reauth_at - now)
        else:
            self._reauth_at = None
            log.debug("node %s: %s with %s; the session does not expire", self.node_id,
                      "re-authenticated" if again else "authenticated", self._sasl.name)
        self._become_ready(now)

    def _maybe_reauthenticate(self, now: float) -> bool:
        """Start re-authenticating once it is due; True while that holds requests back.

        Called before requests are sent, so, as in the Java client, only a connection with
        something to send renews its session: Kafka checks the session when a request arrives
        (and takes a SaslHandshake after it ran out as a re-authentication), so an idle
        connection is left idle rather than woken every session lifetime for a login that costs
        the broker a PBKDF2 with SCRAM, and connections_max_idle_ms can still close it.
        Nothing new is sent once it is due: the requests in flight are answered first
        (reauth_wait), then SaslHandshake and SaslAuthenticate go out alone (reauth), and the
        held requests follow once the broker accepted the new session.
        """
        if self.state == READY and self._pending and self._reauth_at is not None and now >= self._reauth_at:
            self._reauth_at = None
            if self._in_flight:
                self._enter(REAUTH_WAIT)
            else:
                self._start_sasl(now, REAUTH)
        elif self.state == REAUTH_WAIT and not self._in_flight:
            self._start_sasl(now, REAUTH)
        return self.state in (REAUTH_WAIT, REAUTH)

    def _refused_by_alert(self, exc: BaseException) -> bool:
        """If ``exc`` is a TLS alert refusing us, fail for good (see ``_tls_refusal``)."""
        alert = _tls_refusal(exc)
        if alert is None:
            return False
        mine = f"client certificate {self.config.ssl_certfile}" if self.config.ssl_certfile \
            else "no client certificate (ssl_certfile is not set)"
        if any(a in alert for a in _CERTIFICATE_ALERTS):
            why = f"it wants a client certificate it trusts, and we offered {mine}"
        elif "HANDSHAKE_FAILURE" in alert:
            why = (f"either it wants a client certificate it trusts (we offered {mine}) or it shares "
                   "no TLS version or cipher with us")
        else:
            why = "compare the ssl_* settings with the listener's"
        self._auth_failed(f"the broker refused the TLS connection with {alert}: {why}")
        return True

    def _auth_failed(self, reason: str) -> None:
        self.auth_error = AuthenticationError(f"node {self.node_id} ({self.host}:{self.port}): {reason}")
        log.error("%s", self.auth_error)
        self.close(self.auth_error)

    def _become_ready(self, now: float) -> None:
        self._enter(READY)
        self._reconnect.reset()
        self._sasl = None
        self._flush_pending(now)

    # -- requests -------------------------------------------------------------------------------

    def submit(self, api: Api, body: dict, now: float, *, timeout_ms: int | None = None,
               min_version: int | None = None, max_version: int | None = None) -> Future:
        fut = Future()
        if self.auth_error is not None:
            return fut.failure(self.auth_error)
        timeout = self.config.request_timeout_ms if timeout_ms is None else timeout_ms
        self._pending.append(_Request(api, body, fut, now + timeout / 1000, min_version, max_version))
        if self.state == READY:
            self._flush_pending(now)
        return fut

    def _flush_pending(self, now: float) -> None:
        if self._maybe_reauthenticate(now):
            return
        limit = self.config.max_in_flight_requests_per_connection
        while self._pending and len(self._in_flight) < limit:
            req = self._pending.popleft()
            try:
                version = self.version_for(req.api, req.min_version, req.max_version)
                data = self._proto.send(req.api, version, req.body, context=req)
            except (UnsupportedVersionError, ProtocolError) as exc:
                req.future.failure(exc)
                continue
            self._out += data
            self._observe(req.api, version, req.body, False)
            self._in_flight.append(req)
            self.last_activity = now

    # -- I/O ------------------------------------------------------------------------------------

    def on_writable(self, now: float) -> None:
        if self.state == CONNECTING:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)  # type: ignore[union-attr]
            if err:
                self._connect_failed(now, f"connect to {self._trying()} failed: "
                                          f"{errno.errorcode.get(err, err)}")
                return
            self._on_connected(now)
        if self.state == TLS:
            self._tls_step(now)
            if self.state == TLS:
                return
        if self._out and self.sock is not None:
            try:
                sent = self.sock.send(self._out)
            except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                return
            except OSError as exc:
                if not self._refused_by_alert(exc):
                    self._connect_failed(now, f"send failed: {exc}")
                return
            del self._out[:sent]
            self.last_activity = now

    def on_readable(self, now: float) -> list[tuple[Any, Any]]:
        """Read what is available; return completed (future, (version, body)) pairs."""
        if self.state == TLS:
            self._tls_step(now)
            return []
        if self.state == CONNECTING:
            self.on_writable(now)
            return []
        completed = []
        sock = self.sock
        while sock is not None:
            try:
                data = sock.recv(_RECV_CHUNK)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                break
            except OSError as exc:
                if not self._refused_by_alert(exc):
                    self._connect_failed(now, f"receive failed: {exc}")
                return completed
            if not data:
                self._connect_failed(now, "connection closed by the broker")
                return completed
            self.last_activity = now
            try:
                responses = self._proto.receive_data(data)
            except ProtocolError as exc:
                self._connect_failed(now, f"protocol error: {exc}")
                return completed
            for resp in responses:
                self._observe(resp.api, resp.version, resp.body, True)
                req = self._in_flight.popleft()
                assert req is resp.context
                if resp.trailing:
                    log.debug("node %s: %s v%s response had %d trailing bytes", self.node_id,
                              resp.api.name, resp.version, resp.trailing)
                if req.internal:
                    self._on_internal(resp, now)
                else:
                    completed.append((req.future, (resp.version, resp.body)))
                if self.sock is None:
                    return completed
            if len(data) < _RECV_CHUNK and not (isinstance(sock, ssl.SSLSocket) and sock.pending()):
                break
        if self.state in (READY, REAUTH_WAIT):
            self._flush_pending(now)   # also starts a re-authentication that waited for answers
        return completed

    def _observe(self, api: Api, version: int, body: dict, response: bool) -> None:
        for observer in self._observers:
            observer(self.node_id, api, version, body, response)

    def _on_internal(self, resp, now: float) -> None:
        key = resp.api.key
        if key == API_VERSIONS.key:
            self._on_api_versions(resp.body, resp.version, now)
        elif key == SASL_HANDSHAKE.key:
            self._on_sasl_handshake(resp.body, now)
        elif key == SASL_AUTHENTICATE.key:
            self._on_sasl_authenticate(resp.body, now)

    def check_timeouts(self, now: float) -> None:
        if self.state in (CONNECTING, TLS) and now >= self._connect_deadline:
            what = f"connect to {self._trying()}" if self.state == CONNECTING and self._addresses \
                else "connection setup"
            self._connect_failed(now, f"{what} timed out after {self.config.socket_connection_setup_timeout_ms} ms")
            return
        if self._in_flight and self._in_flight[0].deadline <= now:
            req = self._in_flight[0]
            self._connect_failed(now, f"{req.api.name} request timed out after "
                                      f"{self.config.request_timeout_ms} ms")
            return
        expired = [r for r in self._pending if r.deadline <= now]
        for r in expired:
            self._pending.remove(r)
            r.future.failure(KafkaTimeoutError(
                f"{r.api.name} to node {self.node_id} not sent: no connection within the request timeout"))

    def _drop_socket(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
        self.sock = None
        self._reauth_at = None
        self._enter(DISCONNECTED)

    def close(self, reason: BaseException | None = None) -> None:
        self._drop_socket()
        self._out.clear()
        self._proto.fail_all()
        self._api_versions_attempt = API_VERSIONS.max_version
        exc = reason or ConnectionFailedError(f"node {self.node_id}: connection closed")
        # Everything queued on this connection fails, sent or not: the caller may have to route
        # the retry elsewhere (a new leader, a new coordinator) and is the one that knows.
        failed = list(self._in_flight) + list(self._pending)
        self._in_flight.clear()
        self._pending.clear()
        for req in failed:
            if not req.internal and not req.future.done:
                req.future.failure(exc)


def _address(sockaddr: tuple) -> str:
    host, port = sockaddr[0], sockaddr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _version() -> str:
    from .. import __version__
    return __version__
