"""KIP-368 re-authentication of one BrokerConnection, against a scripted broker on a local socket.

The Apache Kafka suite (tests/client/test_security_kafka.py) shows connections surviving many
session lifetimes on a real broker; this one pins down the order on the wire, which a real broker
cannot be made to show deterministically: once re-authentication is due, no request goes out
until the requests in flight are answered, then SaslHandshake and SaslAuthenticate go out alone,
and the requests held meanwhile follow once the broker accepted the new session.  The clock is
the test's own (``now`` is passed in), so nothing waits.  Like the Java client, a connection
renews its session only when it has a request to send.
"""

from __future__ import annotations

import socket
import struct

import pytest

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.connection import READY, REAUTH, REAUTH_WAIT, BrokerConnection
from kdaemon.client.errors import AuthenticationError
from kdaemon.protocol.apis import API_VERSIONS, METADATA, SASL_AUTHENTICATE, SASL_HANDSHAKE, api_by_key
from kdaemon.protocol.messages import decode_request, encode_response

LIFETIME_MS = 10_000
PASSWORD = "s3cret-pw"
METADATA_BODY = {"topics": [], "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
METADATA_ANSWER = {"throttle_time_ms": 0, "brokers": [], "cluster_id": None, "controller_id": 1, "topics": []}


class ScriptedBroker:
    """The broker end of one accepted connection: read whole requests, answer them by hand."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sock: socket.socket | None = None
        self._buf = b""

    def accept(self) -> None:
        self.server.settimeout(5)
        self.sock, _ = self.server.accept()
        self.sock.settimeout(0.05)

    def requests(self) -> list[tuple]:
        """Every complete request received so far: (api, header, body)."""
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    break
                self._buf += data
        except (TimeoutError, BlockingIOError):
            pass
        out = []
        while len(self._buf) >= 4:
            (size,) = struct.unpack(">i", self._buf[:4])
            if len(self._buf) < 4 + size:
                break
            frame, self._buf = self._buf[4:4 + size], self._buf[4 + size:]
            header, body = decode_request(api_by_key, frame)
            out.append((api_by_key(header.api_key), header, body))
        return out

    def answer(self, api, header, body: dict) -> None:
        self.sock.sendall(encode_response(api, header.api_version, header.correlation_id, body))

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.server.close()


def _api_versions_body() -> dict:
    keys = [(API_VERSIONS, 0, 3), (METADATA, 0, 12), (SASL_HANDSHAKE, 0, 1), (SASL_AUTHENTICATE, 0, 2)]
    return {"error_code": 0, "throttle_time_ms": 0, "supported_features": [], "finalized_features": [],
            "api_keys": [{"api_key": api.key, "min_version": lo, "max_version": hi} for api, lo, hi in keys]}


class Harness:
    def __init__(self, broker: ScriptedBroker) -> None:
        self.broker = broker
        config = ConsumerConfig(bootstrap_servers=f"127.0.0.1:{broker.port}", security_protocol="SASL_PLAINTEXT",
                                sasl_mechanism="PLAIN", sasl_username="alice", sasl_password=PASSWORD)
        self.conn = BrokerConnection(1, "127.0.0.1", broker.port, config)
        self.now = 1000.0
        self.conn.connect(self.now)
        broker.accept()

    def pump(self) -> None:
        """Let the connection write what it has and read what the broker sent, completing the
        answered requests' futures as the network client does."""
        for _ in range(3):
            self.conn.on_writable(self.now)
            if self.conn.sock is not None:
                for fut, value in self.conn.on_readable(self.now):
                    fut.success(value)

    def expect(self, *names: str) -> list[tuple]:
        self.pump()
        got = self.broker.requests()
        assert [api.name for api, _, _ in got] == list(names)
        return got

    def authenticate(self, lifetime_ms: int = LIFETIME_MS, *, ok: bool = True) -> None:
        (api, header, body), = self.expect("SaslHandshake")
        assert body["mechanism"] == "PLAIN"
        self.broker.answer(api, header, {"error_code": 0, "mechanisms": ["PLAIN"]})
        (api, header, body), = self.expect("SaslAuthenticate")
        assert bytes(body["auth_bytes"]) == b"\0alice\0" + PASSWORD.encode()
        self.broker.answer(api, header, {"error_code": 0 if ok else 58, "auth_bytes": b"",
                                         "error_message": None if ok else "Authentication failed",
                                         "session_lifetime_ms": lifetime_ms})
        self.pump()


@pytest.fixture
def harness():
    broker = ScriptedBroker()
    h = Harness(broker)
    (api, header, _), = h.expect("ApiVersions")
    broker.answer(api, header, _api_versions_body())
    h.authenticate()
    assert h.conn.state == READY
    yield h
    h.conn.close()
    broker.close()


def test_reauthentication_waits_for_requests_in_flight_and_holds_new_ones(harness):
    h = harness
    first = h.conn.submit(METADATA, METADATA_BODY, h.now)
    (api, header1, _), = h.expect("Metadata")

    # 95% of the lifetime later it is due at the latest.  The next request is not sent, nor is
    # the handshake, while the answer to the request in flight is outstanding.
    h.now += LIFETIME_MS / 1000 * 0.95
    held = h.conn.submit(METADATA, METADATA_BODY, h.now)
    assert h.conn.state == REAUTH_WAIT
    h.expect()

    # The answer arrives: only then does re-authentication start, alone on the wire.
    h.broker.answer(api, header1, METADATA_ANSWER)
    h.pump()
    assert first.done and not first.failed
    assert h.conn.state == REAUTH
    h.authenticate()
    assert h.conn.state == READY and h.conn.reauthentications == 1

    # The request held meanwhile goes out now.
    (api, header2, _), = h.expect("Metadata")
    h.broker.answer(api, header2, METADATA_ANSWER)
    h.pump()
    assert held.done and not held.failed


def test_a_request_before_the_window_goes_out_at_once(harness):
    h = harness
    h.now += LIFETIME_MS / 1000 * 0.84   # before the earliest point of the 85-95% window
    fut = h.conn.submit(METADATA, METADATA_BODY, h.now)
    assert h.conn.state == READY
    (api, header, _), = h.expect("Metadata")
    h.broker.answer(api, header, METADATA_ANSWER)
    h.pump()
    assert fut.done and not fut.failed and h.conn.reauthentications == 0


def test_an_idle_connection_renews_only_when_it_has_something_to_send(harness):
    """As the Java client: nothing is sent on an idle connection, however long past its session
    (Kafka checks the session when a request arrives, and takes a SaslHandshake after it ran
    out as a re-authentication); the next request waits for the renewal."""
    h = harness
    h.now += 3 * LIFETIME_MS / 1000
    h.conn.check_timeouts(h.now)
    h.pump()
    assert h.conn.state == READY
    h.expect()
    fut = h.conn.submit(METADATA, METADATA_BODY, h.now)
    assert h.conn.state == REAUTH
    h.authenticate(lifetime_ms=0)   # a session that no longer expires: no further renewal
    assert h.conn.state == READY and h.conn.reauthentications == 1
    (api, header, _), = h.expect("Metadata")
    h.broker.answer(api, header, METADATA_ANSWER)
    h.pump()
    assert fut.done and not fut.failed
    h.now += 10 * LIFETIME_MS / 1000
    h.conn.submit(METADATA, METADATA_BODY, h.now)
    h.expect("Metadata")


def test_a_refused_reauthentication_is_an_authentication_error(harness):
    """Credentials revoked while connected: the renewal fails like a first login would, for
    good, and the requests held for it fail with the AuthenticationError."""
    h = harness
    h.now += LIFETIME_MS / 1000
    held = h.conn.submit(METADATA, METADATA_BODY, h.now)
    assert h.conn.state == REAUTH
    h.authenticate(ok=False)
    assert held.done and isinstance(held.exception, AuthenticationError)
    assert isinstance(h.conn.auth_error, AuthenticationError)
    assert "SASL PLAIN authentication failed" in str(h.conn.auth_error)
    assert PASSWORD not in str(h.conn.auth_error)
    assert not h.conn.can_attempt(h.now + 3600)
