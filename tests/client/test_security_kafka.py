"""TLS, mTLS and SASL against Apache Kafka's own listeners (the session ``kafka_cluster``).

The cluster's SSL listener requires a client certificate; its SASL_SSL listener takes PLAIN and
SCRAM-SHA-256/512 for alice and bob and grants sessions of ``connections.max.reauth.ms`` = 10 s
(KIP-368).  What these tests prove, and how:

* The broker's certificate is verified by default: against ``ssl_cafile``, else against the
  system trust store (our test CA is not in it, so that fails at once with a certificate error;
  pointing OpenSSL's ``SSL_CERT_FILE`` at our CA makes the same consumer succeed, which shows it
  is the system store that was consulted).  Only ``ssl_certificate_verification=False`` turns
  verification off; ``ssl_check_hostname=False`` still verifies the chain.
* A refused login (no client certificate, a wrong password) is one AuthenticationError, not
  retried.  Connection attempts are counted by the broker: every refused connection is one
  "Failed authentication" line in its log (Kafka's Selector logs it at INFO).
* A long-running consumer keeps its connections across several session lifetimes by
  re-authenticating on them: the sockets (by local port) are the same at the end as at the
  start, each was authenticated once, the one it fetches on was re-authenticated again and
  again, and no record was lost or repeated.  A raw connection that does not re-authenticate, opened beside them, is
  closed by the broker: the test would catch a client that does not re-authenticate.
* No password appears in kdaemon's logs at DEBUG.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
import socket
import ssl
import time
import uuid

import psutil
import pytest

from kdaemon.client import AuthenticationError, Consumer, TopicPartition
from kdaemon.protocol.apis import METADATA, SASL_AUTHENTICATE, SASL_HANDSHAKE
from kdaemon.protocol.connection import KafkaConnection
from testkit.apache_kafka import HOST, REAUTH_MS, SASL_USERS, KafkaCluster
from testkit.produce import Writer, create_topic, produce

pytestmark = pytest.mark.kafka

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
USER = "alice"
PASSWORD = SASL_USERS[USER]
WRONG_PASSWORD = "not-alice-secret-7c1e"
N_RECORDS = 20
DEADLINE_S = 30.0
# A refused login must surface this fast: one connection, no retries (generous: shared machine).
AUTH_FAILURE_S = 10.0
# How long the re-authentication test runs: more than three session lifetimes.
LONG_RUN_S = 3.5 * REAUTH_MS / 1000


def _consumer(bootstrap: str, **kw) -> Consumer:
    options = dict(auto_offset_reset="earliest", fetch_max_wait_ms=200, request_timeout_ms=15_000,
                   default_api_timeout_ms=30_000)
    options.update(kw)
    return Consumer(bootstrap, **options)


def _tls(cluster: KafkaCluster, *, ca: bool = True, client_cert: bool = True) -> dict:
    out: dict = {}
    if ca:
        out["ssl_cafile"] = str(cluster.tls.ca)
    if client_cert:
        out.update(ssl_certfile=str(cluster.tls.client_cert), ssl_keyfile=str(cluster.tls.client_key))
    return out


def _sasl(cluster: KafkaCluster, mechanism: str, password: str = PASSWORD) -> dict:
    return dict(security_protocol="SASL_SSL", ssl_cafile=str(cluster.tls.ca), sasl_mechanism=mechanism,
                sasl_username=USER, sasl_password=password)


def _drain(consumer: Consumer, topic: str, expected: int) -> list:
    consumer.assign([TopicPartition(topic, 0)])
    out: list = []
    deadline = time.monotonic() + DEADLINE_S
    while len(out) < expected:
        assert time.monotonic() < deadline, f"only {len(out)} of {expected} records within {DEADLINE_S} s"
        for records in consumer.poll(200).values():
            out.extend(records)
    return out


def _failed_logins(cluster: KafkaCluster) -> int:
    """Connections the brokers refused so far: Kafka logs each one once, at INFO, as
    "Failed authentication with /127.0.0.1 (channelId=...) (<why>)" (a failed TLS handshake
    included)."""
    total = 0
    for node in cluster.nodes.values():
        try:
            total += node.log_path.read_text(errors="replace").count("Failed authentication with")
        except OSError:
            pass
    return total


def _expect_one_refusal(cluster: KafkaCluster, consumer: Consumer, before: int) -> AuthenticationError:
    """Poll until AuthenticationError; then check that the brokers saw exactly one refused
    connection and that further polls fail at once with the same error and connect no more."""
    consumer.assign([TopicPartition("any-topic", 0)])
    start = time.monotonic()
    with pytest.raises(AuthenticationError) as info:
        while time.monotonic() - start < AUTH_FAILURE_S + 5:
            consumer.poll(100)
    took = time.monotonic() - start
    assert took < AUTH_FAILURE_S, f"the refusal took {took:.1f} s"
    # Kafka closes a refused connection after connection.failed.authentication.delay.ms and
    # logs it then: wait for the line rather than read the log too early.
    deadline = time.monotonic() + 10
    while _failed_logins(cluster) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    # "At once" is an event, not a duration: the failed consumer raises without waiting on its
    # sockets even once (a wall-clock bound failed on a loaded machine).
    waits: list[float] = []
    network, real_poll = consumer._network, consumer._network.poll
    network.poll = lambda timeout, until=None: (waits.append(timeout), real_poll(timeout, until))[1]
    try:
        end = time.monotonic() + 1.5   # time for a reconnect that must not happen
        while time.monotonic() < end:
            waits.clear()
            with pytest.raises(AuthenticationError) as again:
                consumer.poll(3000)
            assert [w for w in waits if w > 0] == [], "a failed consumer must raise at once, not wait out poll"
            assert str(again.value) == str(info.value)
    finally:
        network.poll = real_poll
    assert _failed_logins(cluster) - before == 1, "one refused connection, never retried"
    return info.value


def _no_secret_in(caplog: pytest.LogCaptureFixture, *secrets: str) -> None:
    assert caplog.records, "kdaemon logged nothing: the capture is not working"
    texts = [caplog.text] + [str(r.args) for r in caplog.records] + [r.getMessage() for r in caplog.records]
    for secret in secrets:
        for text in texts:
            assert secret not in text


@pytest.fixture(scope="module")
def topic(kafka_cluster: KafkaCluster) -> str:
    """One partition, replicated on all three nodes, holding N_RECORDS records."""
    name = f"secure-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_cluster.bootstrap, name, 1, replication=3)
    produce(kafka_cluster.bootstrap, name, [(b"k", f"v{i}".encode()) for i in range(N_RECORDS)], partition=0)
    return name


def _values(records) -> list[bytes]:
    return [r.value for r in records]


EXPECTED = [f"v{i}".encode() for i in range(N_RECORDS)]


# --- TLS: the broker is verified ---------------------------------------------------------------

def test_tls_verifies_the_broker_against_ssl_cafile_with_a_client_certificate(kafka_cluster, topic):
    """mTLS on the SSL listener: our client certificate is accepted, the broker's is verified
    against ssl_cafile, host name (127.0.0.1, in the certificate's SAN) included."""
    before = _failed_logins(kafka_cluster)
    with _consumer(kafka_cluster.bootstrap_for("SSL"), security_protocol="SSL", **_tls(kafka_cluster)) as c:
        assert c.config.ssl_check_hostname and c.config.ssl_certificate_verification
        assert _values(_drain(c, topic, N_RECORDS)) == EXPECTED
    assert _failed_logins(kafka_cluster) == before


def test_tls_without_ssl_cafile_verifies_against_the_system_trust_store(kafka_cluster, topic, monkeypatch):
    """No ssl_cafile does not mean no verification: the system trust store is used.  Our test CA
    is not in it, so the broker's certificate is refused at once (no hang, no retry).  Pointing
    OpenSSL's default CA file at our CA makes the very same settings work, which shows the
    system store is what was consulted."""
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    before = _failed_logins(kafka_cluster)
    options = dict(security_protocol="SSL", **_tls(kafka_cluster, ca=False))
    with _consumer(kafka_cluster.bootstrap_for("SSL"), **options) as c:
        err = _expect_one_refusal(kafka_cluster, c, before)
    assert "TLS certificate verification failed" in str(err), err
    assert "unable to get local issuer certificate" in str(err), err

    monkeypatch.setenv("SSL_CERT_FILE", str(kafka_cluster.tls.ca))
    with _consumer(kafka_cluster.bootstrap_for("SSL"), **options) as c:
        assert _values(_drain(c, topic, N_RECORDS)) == EXPECTED


def test_tls_hostname_check_off_still_verifies_the_chain(kafka_cluster):
    """ssl_check_hostname=False (Java's ssl.endpoint.identification.algorithm="") skips the name
    check only: with no CA that trusts the broker, the certificate is still refused."""
    before = _failed_logins(kafka_cluster)
    with _consumer(kafka_cluster.bootstrap_for("SSL"), security_protocol="SSL", ssl_check_hostname=False,
                   **_tls(kafka_cluster, ca=False)) as c:
        err = _expect_one_refusal(kafka_cluster, c, before)
    assert "TLS certificate verification failed" in str(err), err


def test_tls_verification_is_off_only_when_asked_for_by_name(kafka_cluster, topic, caplog):
    caplog.set_level(logging.WARNING, logger="kdaemon")
    # Not by a value that merely looks false (a string from a configuration file).
    with pytest.raises(ValueError, match="ssl_certificate_verification must be true or false"):
        Consumer(kafka_cluster.bootstrap_for("SSL"), security_protocol="SSL", ssl_certificate_verification="false")
    with _consumer(kafka_cluster.bootstrap_for("SSL"), security_protocol="SSL",
                   ssl_certificate_verification=False, **_tls(kafka_cluster, ca=False)) as c:
        assert _values(_drain(c, topic, N_RECORDS)) == EXPECTED
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("ssl_certificate_verification=False" in w for w in warnings), warnings


# --- mTLS: no client certificate ---------------------------------------------------------------

def test_mtls_without_a_client_certificate_is_one_authentication_error(kafka_cluster):
    before = _failed_logins(kafka_cluster)
    with _consumer(kafka_cluster.bootstrap_for("SSL"), security_protocol="SSL",
                   **_tls(kafka_cluster, client_cert=False)) as c:
        err = _expect_one_refusal(kafka_cluster, c, before)
    assert "refused the TLS connection" in str(err) and "ALERT" in str(err), err
    assert "ssl_certfile is not set" in str(err), err


# --- SASL over SSL -----------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_ssl_consumes(kafka_cluster, topic, mechanism, caplog):
    caplog.set_level(logging.DEBUG, logger="kdaemon")
    before = _failed_logins(kafka_cluster)
    with _consumer(kafka_cluster.bootstrap_for("SASL_SSL"), **_sasl(kafka_cluster, mechanism)) as c:
        assert _values(_drain(c, topic, N_RECORDS)) == EXPECTED
    assert _failed_logins(kafka_cluster) == before
    assert f"authenticated with {mechanism}" in caplog.text
    _no_secret_in(caplog, PASSWORD)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_sasl_wrong_password_is_one_authentication_error(kafka_cluster, mechanism, caplog):
    caplog.set_level(logging.DEBUG, logger="kdaemon")
    before = _failed_logins(kafka_cluster)
    with _consumer(kafka_cluster.bootstrap_for("SASL_SSL"),
                   **_sasl(kafka_cluster, mechanism, password=WRONG_PASSWORD)) as c:
        err = _expect_one_refusal(kafka_cluster, c, before)
        shown = [str(err), repr(err), repr(c.config), str(c.config)]
    assert f"SASL {mechanism} authentication failed" in str(err), err
    assert re.search(r"invalid (username or password|credentials)", str(err), re.I), err
    for text in shown:
        assert WRONG_PASSWORD not in text
    _no_secret_in(caplog, WRONG_PASSWORD)


# --- KIP-368: re-authentication keeps the connections ------------------------------------------

class _RawSaslConnection:
    """A raw SASL_SSL connection authenticated with PLAIN, for what the broker does after the
    session ran out: close it on the next request, or take a SaslHandshake then as a
    re-authentication (which is why kdaemon leaves idle connections alone)."""

    def __init__(self, cluster: KafkaCluster) -> None:
        port = next(iter(cluster.nodes.values())).ports["SASL_SSL"]
        ctx = ssl.create_default_context(cafile=str(cluster.tls.ca))
        self.sock = ctx.wrap_socket(socket.create_connection((HOST, port), timeout=15), server_hostname=HOST)
        self.proto = KafkaConnection(client_id="unrenewed-control")
        self.session_lifetime_ms = self.authenticate()

    def authenticate(self) -> int:
        handshake = self.request(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert handshake["error_code"] == 0, handshake
        auth = self.request(SASL_AUTHENTICATE, 2, {"auth_bytes": f"\0{USER}\0{PASSWORD}".encode()})
        assert auth["error_code"] == 0, auth
        return auth["session_lifetime_ms"]

    def request(self, api, version: int, body: dict) -> dict:
        self.sock.sendall(self.proto.send(api, version, body))
        while True:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the broker")
            responses = self.proto.receive_data(data)
            if responses:
                return responses[0].body

    def closed_on_next_request(self) -> bool:
        try:
            self.request(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                        "include_topic_authorized_operations": False})
        except (ConnectionError, ssl.SSLError, OSError):
            return True
        return False

    def renewed_late_and_served(self) -> bool:
        """Re-authenticate after the session ran out, then ask for metadata."""
        try:
            self.authenticate()
            return not self.closed_on_next_request()
        except (ConnectionError, ssl.SSLError, OSError):
            return False

    def close(self) -> None:
        self.sock.close()


def _per_node(caplog: pytest.LogCaptureFixture, what: str, mechanism: str) -> Counter:
    """How many times kdaemon logged "node N: <what> with <mechanism>;", per node."""
    pattern = re.compile(rf"node (-?\d+): {what} with {mechanism};")
    return Counter(int(m.group(1)) for r in caplog.records for m in [pattern.match(r.getMessage())] if m)


def _sockets_to(ports: set[int]) -> set[tuple[int, int]]:
    """(local port, broker port) of this process's established TCP connections to ``ports``."""
    return {(c.laddr.port, c.raddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.raddr and c.raddr.port in ports and c.status == psutil.CONN_ESTABLISHED}


def test_sasl_sessions_are_renewed_on_the_same_connections(kafka_cluster, caplog):
    """One consumer per mechanism reads a topic that is written all along, for 3.5 session
    lifetimes.  Each connection is authenticated once; the busy ones are re-authenticated on
    the same socket (KIP-368) before their session runs out, so the sockets at the end are those
    of the start, nothing was lost or repeated, and the broker never had to close one; a
    connection that does not re-authenticate, opened at the same time, is closed on its next
    request."""
    caplog.set_level(logging.DEBUG, logger="kdaemon")
    name = f"reauth-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_cluster.bootstrap, name, 1, replication=3)
    tp = TopicPartition(name, 0)
    sasl_ports = {n.ports["SASL_SSL"] for n in kafka_cluster.nodes.values()}
    writer = Writer(kafka_cluster.bootstrap, name, **{"linger.ms": 5})
    control = _RawSaslConnection(kafka_cluster)
    late = _RawSaslConnection(kafka_cluster)
    consumers = {m: _consumer(kafka_cluster.bootstrap_for("SASL_SSL"), fetch_max_wait_ms=500,
                              **_sasl(kafka_cluster, m)) for m in MECHANISMS}
    got: dict[str, list] = {m: [] for m in MECHANISMS}
    produced = 0

    def round_() -> None:
        for m, c in consumers.items():
            for records in c.poll(50).values():
                got[m].extend(records)

    try:
        for c in consumers.values():
            c.assign([tp])
        # Settle: every consumer connected (bootstrap and leader) and reading.
        deadline = time.monotonic() + DEADLINE_S
        while not all(got.values()):
            assert time.monotonic() < deadline, {m: len(v) for m, v in got.items()}
            writer.send(str(produced).encode(), partition=0)
            produced += 1
            writer.poll(0)
            round_()
        sockets_at_start = _sockets_to(sasl_ports)
        logins_at_start = {m: _per_node(caplog, "authenticated", m) for m in MECHANISMS}
        started = time.monotonic()
        while time.monotonic() - started < LONG_RUN_S:
            writer.send(str(produced).encode(), partition=0)
            produced += 1
            writer.poll(0)
            round_()
        assert writer.flush(30) == 0 and not writer.errors, writer.errors[:3]
        deadline = time.monotonic() + DEADLINE_S
        while any(len(v) < produced for v in got.values()):
            assert time.monotonic() < deadline, {m: len(v) for m, v in got.items()}
            round_()
        sockets_at_end = _sockets_to(sasl_ports)
        fetched_from = {m: c.metrics().fetch_requests_per_node for m, c in consumers.items()}
        control_closed = control.closed_on_next_request()
        late_renewed = late.renewed_late_and_served()
    finally:
        for c in consumers.values():
            c.close()
        control.close()
        late.close()

    expected = [str(i).encode() for i in range(produced)]
    for m in MECHANISMS:
        assert _values(got[m]) == expected, f"{m}: records lost or repeated"
        assert [r.offset for r in got[m]] == list(range(produced))
    # The same sockets throughout (the raw ones' included: nothing was sent on them yet).
    assert len(sockets_at_start) >= 2 * len(MECHANISMS) + 2, sockets_at_start
    assert sockets_at_end == sockets_at_start, "a connection was closed or a new one opened"
    for m in MECHANISMS:
        logins = _per_node(caplog, "authenticated", m)
        assert logins == logins_at_start[m], f"{m}: connections authenticated anew during the run"
        assert len(logins) >= 2 and set(logins.values()) == {1}, logins   # bootstrap + leader, once each
        # The connection that carried the fetches renewed its session every 8.5-9.5 s (on the
        # first request due): three times at least in 35 s.  An idle one (the bootstrap
        # connection) renews nothing, as in Java, and is still open.
        renewals = _per_node(caplog, "re-authenticated", m)
        leader = max(fetched_from[m], key=fetched_from[m].get)
        assert renewals[leader] >= 3, f"{m}: node {leader} renewed {renewals[leader]} times: {renewals}"
    assert "connection closed by the broker" not in caplog.text
    # The broker grants 10 s sessions and enforces them.
    assert control.session_lifetime_ms == REAUTH_MS
    assert control_closed, "the broker kept a connection whose session had expired"
    assert late_renewed, "the broker refused a re-authentication after the session ran out"
    _no_secret_in(caplog, PASSWORD)
