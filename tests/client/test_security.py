"""TLS, SASL and connection failures, end to end against Tansu.

What Tansu 0.6.0 can and cannot do is written up in ``testkit/secure.py``.  In short:
* TLS and successful SASL go through ``SecureProxy``, which terminates TLS (Python's ssl module,
  certificates made with openssl for this run) and answers SaslHandshake/SaslAuthenticate like a
  Kafka listener (PLAIN and a SCRAM server written from RFC 5802), in front of a plaintext Tansu
  that advertises the proxy's port, so every connection the consumer makes goes through it.
  librdkafka authenticates through it too (``test_reference_client_authenticates_through_the_proxy``),
  so the test server is not only checked against our own client.
* SCRAM against Tansu itself works up to the credential check: it has no users (they cannot be
  created on an authenticating broker), so Tansu rejects every login with ``e=unknown-user``.
  That is the real-broker failure test.  For PLAIN, Tansu drops the connection at the handshake.

Authentication failures must surface once, quickly, as AuthenticationError, without reconnecting
(that would lock accounts), and never show the password anywhere.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
import uuid

import pytest

from kdaemon.client import (AuthenticationError, Consumer, NoBrokersAvailableError, TopicPartition,
                            UnknownTopicError)
from testkit.produce import create_topic, produce
from testkit.secure import SecureProxy, make_pki, openssl_available, server_context
from testkit.tansu import start_tansu

PASSWORD = "Pa55-\u00e9t\u00e9\u00a0\ufb01-9f2c"  # non-ASCII, with a no-break space and a ligature
USER = "alice,admin=1"  # "," and "=" must be escaped in SCRAM's n= attribute
N_RECORDS = 5
DEADLINE_S = 15
# An authentication failure must come back this fast: it needs one connection, no retries.
AUTH_FAILURE_S = 5.0

needs_openssl = pytest.mark.skipif(not openssl_available(), reason="needs the openssl command line tool")


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def _consumer(bootstrap: str, **kw) -> Consumer:
    options = dict(auto_offset_reset="earliest", fetch_max_wait_ms=50, request_timeout_ms=10_000,
                   default_api_timeout_ms=10_000)
    options.update(kw)
    return Consumer(bootstrap, **options)


def _drain(consumer: Consumer, topic: str, expected: int) -> list:
    consumer.assign([TopicPartition(topic, 0)])
    out = []
    deadline = time.monotonic() + DEADLINE_S
    while len(out) < expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {len(out)} of {expected} records within {DEADLINE_S} s")
        for records in consumer.poll(200).values():
            out.extend(records)
    return out


def _expect_auth_failure(consumer: Consumer, topic: str = "any-topic") -> tuple[AuthenticationError, float]:
    """Poll until AuthenticationError; return it and how long it took."""
    consumer.assign([TopicPartition(topic, 0)])
    start = time.monotonic()
    with pytest.raises(AuthenticationError) as info:
        while time.monotonic() - start < AUTH_FAILURE_S + 5:
            consumer.poll(100)
    return info.value, time.monotonic() - start


def _assert_not_retried(consumer: Consumer, proxy: SecureProxy, first: AuthenticationError,
                        expected_connections: int = 1) -> None:
    """For another second every call fails at once with the same error, and nothing reconnects."""
    connections = proxy.connections
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        t = time.monotonic()
        with pytest.raises(AuthenticationError) as again:
            consumer.poll(30_000)
        # "At once" against the poll's 30 s: a loaded 2-core machine took 1.05-1.5 s for calls
        # that do no I/O, so a 1 s bound measured the machine, not the consumer.
        assert time.monotonic() - t < 10.0, "a failed consumer must raise at once, not wait out poll"
        assert str(again.value) == str(first)
    assert proxy.connections == connections == expected_connections


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if not openssl_available():
        pytest.skip("needs the openssl command line tool")
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def fronted_proxy(tmp_path_factory):
    """A SecureProxy in front of its own Tansu, which advertises the proxy's port."""
    proxy = SecureProxy()
    tansu = start_tansu(tmp_path_factory.mktemp("tansu-fronted"), advertised_port=proxy.port)
    proxy.start((tansu.host, tansu.port))
    yield proxy
    proxy.close()
    tansu.stop()


@pytest.fixture
def proxy(fronted_proxy):
    fronted_proxy.configure()  # plaintext pass-through until the test says otherwise
    yield fronted_proxy
    fronted_proxy.configure()


@pytest.fixture
def filled_topic(proxy) -> str:
    """A one-partition topic with N_RECORDS records, written through the proxy in plaintext."""
    topic = _topic("secure")
    create_topic(proxy.bootstrap, topic)
    produce(proxy.bootstrap, topic, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(N_RECORDS)],
            partition=0)
    return topic


@pytest.fixture(scope="module")
def authenticating_tansu(tmp_path_factory):
    """Tansu with --authentication (no users exist), behind a pass-through proxy that counts
    connections."""
    tansu = start_tansu(tmp_path_factory.mktemp("tansu-auth"), extra_args=["--authentication"])
    proxy = SecureProxy().start((tansu.host, tansu.port))
    yield proxy
    proxy.close()
    tansu.stop()


# --- TLS ---------------------------------------------------------------------------------------

@needs_openssl
def test_ssl_consumes_with_the_right_ca(proxy, filled_topic, pki):
    proxy.configure(ssl_context=server_context(pki.server_cert, pki.server_key))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca)) as c:
        got = _drain(c, filled_topic, N_RECORDS)
    assert [r.value for r in got] == [f"v{i}".encode() for i in range(N_RECORDS)]
    assert proxy.connections >= 1 and proxy.tls_failures == 0


@needs_openssl
def test_ssl_wrong_ca_fails_once_and_is_not_retried(proxy, pki, caplog):
    caplog.set_level(logging.DEBUG, logger="kdaemon")
    proxy.configure(ssl_context=server_context(pki.server_cert, pki.server_key))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.other_ca)) as c:
        err, took = _expect_auth_failure(c)
        assert took < AUTH_FAILURE_S
        assert "TLS certificate verification failed" in str(err)
        assert f"127.0.0.1:{proxy.port}" in str(err)
        _assert_not_retried(c, proxy, err)
    assert proxy.tls_failures == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("kdaemon")]
    assert len(errors) == 1, "the failure is logged once, not once per poll"


@needs_openssl
def test_ssl_hostname_mismatch_is_an_authentication_error(proxy, pki):
    proxy.configure(ssl_context=server_context(pki.wrong_host_cert, pki.wrong_host_key))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca)) as c:
        err, took = _expect_auth_failure(c)
    assert took < AUTH_FAILURE_S
    assert "Hostname mismatch" in str(err) or "IP address mismatch" in str(err)
    assert proxy.connections == 1


@needs_openssl
def test_ssl_check_hostname_off_accepts_another_name(proxy, filled_topic, pki):
    proxy.configure(ssl_context=server_context(pki.wrong_host_cert, pki.wrong_host_key))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca),
                   ssl_check_hostname=False) as c:
        assert len(_drain(c, filled_topic, N_RECORDS)) == N_RECORDS


@needs_openssl
def test_mtls_client_certificate_is_accepted(proxy, filled_topic, pki):
    proxy.configure(ssl_context=server_context(pki.server_cert, pki.server_key, client_ca=pki.ca))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca),
                   ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key)) as c:
        got = _drain(c, filled_topic, N_RECORDS)
    assert [r.value for r in got] == [f"v{i}".encode() for i in range(N_RECORDS)]
    assert proxy.tls_failures == 0


def _mtls_options(pki, offered: str) -> dict:
    return dict(ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key)) if offered == "untrusted" else {}


def _assert_mtls_refusal(err: AuthenticationError, pki, offered: str) -> None:
    assert "refused the TLS connection" in str(err) and "ALERT_" in str(err), err
    assert ("ssl_certfile is not set" if offered == "none" else str(pki.client_cert)) in str(err), err


@needs_openssl
@pytest.mark.parametrize("offered", ["none", "untrusted"])
def test_mtls_refusal_in_the_tls12_handshake_is_an_authentication_error_and_not_retried(proxy, pki, offered):
    """A broker that wants a client certificate refuses a connection without one, or with one
    it does not trust.  In TLS 1.2 the alert ends the handshake itself: an authentication
    failure, reported once, at once, and never retried (not a connection error retried until
    default_api_timeout_ms)."""
    ctx = server_context(pki.server_cert, pki.server_key, client_ca=pki.other_ca)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    proxy.configure(ssl_context=ctx)
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca), **_mtls_options(pki, offered)) as c:
        err, took = _expect_auth_failure(c)
        assert took < AUTH_FAILURE_S
        _assert_mtls_refusal(err, pki, offered)
        _assert_not_retried(c, proxy, err)


@needs_openssl
@pytest.mark.parametrize("offered", ["none", "untrusted"])
def test_mtls_refusal_after_the_tls13_handshake_is_an_authentication_error(proxy, pki, offered):
    """In TLS 1.3 the client's handshake is complete before the server judges the certificate,
    so the client has already sent ApiVersions when the alert comes.  A server that closes with
    that request unread makes the kernel send a reset, which can overtake the alert: the client
    then sees a dropped connection, retried like any other (as a real broker's would be).  Once
    an alert is read, the failure is final: AuthenticationError, and no connection after it."""
    proxy.configure(ssl_context=server_context(pki.server_cert, pki.server_key, client_ca=pki.other_ca))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.ca), reconnect_backoff_ms=20,
                   reconnect_backoff_max_ms=100, default_api_timeout_ms=30_000, **_mtls_options(pki, offered)) as c:
        c.assign([TopicPartition("any-topic", 0)])
        deadline = time.monotonic() + 20
        with pytest.raises(AuthenticationError) as info:
            while time.monotonic() < deadline:
                c.poll(100)
        _assert_mtls_refusal(info.value, pki, offered)
        _assert_not_retried(c, proxy, info.value, expected_connections=proxy.connections)


@needs_openssl
def test_ssl_check_hostname_off_still_verifies_the_chain(proxy, pki):
    proxy.configure(ssl_context=server_context(pki.wrong_host_cert, pki.wrong_host_key))
    with _consumer(proxy.bootstrap, security_protocol="SSL", ssl_cafile=str(pki.other_ca),
                   ssl_check_hostname=False) as c:
        err, _ = _expect_auth_failure(c)
    assert "certificate verification failed" in str(err)


def test_tls_handshake_waiting_for_the_server_does_not_spin(monkeypatch):
    """A listener that accepts TCP but never answers the ClientHello: while the handshake waits
    to read, the poll loop must sleep in select, not wake up for writability over and over."""
    from kdaemon.client.network import NetworkClient
    calls = 0
    poll_once = NetworkClient._poll_once

    def counting(self, timeout):
        nonlocal calls
        calls += 1
        return poll_once(self, timeout)

    monkeypatch.setattr(NetworkClient, "_poll_once", counting)
    with socket.create_server(("127.0.0.1", 0)) as silent:
        port = silent.getsockname()[1]
        with _consumer(f"127.0.0.1:{port}", security_protocol="SSL", default_api_timeout_ms=1000,
                       socket_connection_setup_timeout_ms=5000) as c:
            c.assign([TopicPartition("any-topic", 0)])
            with pytest.raises(NoBrokersAvailableError):
                c.poll(5000)
    # About one select per retry_backoff_ms (100 ms) in that second; the spin made ~70,000.
    assert calls < 100


# --- SASL --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_consumes_with_correct_credentials(proxy, filled_topic, mechanism):
    proxy.configure(users={USER: PASSWORD}, mechanisms=(mechanism,))
    with _consumer(proxy.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                   sasl_username=USER, sasl_password=PASSWORD) as c:
        got = _drain(c, filled_topic, N_RECORDS)
    assert len(got) == N_RECORDS
    # Every connection (bootstrap, then the broker from metadata) authenticated.
    assert proxy.auth_failures == 0
    assert proxy.auth_successes == proxy.connections >= 1


@needs_openssl
def test_sasl_ssl_scram(proxy, filled_topic, pki):
    proxy.configure(ssl_context=server_context(pki.server_cert, pki.server_key),
                    users={USER: PASSWORD}, mechanisms=("SCRAM-SHA-512",))
    with _consumer(proxy.bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(pki.ca),
                   sasl_mechanism="SCRAM-SHA-512", sasl_username=USER, sasl_password=PASSWORD) as c:
        assert len(_drain(c, filled_topic, N_RECORDS)) == N_RECORDS
    assert proxy.tls_failures == proxy.auth_failures == 0
    assert proxy.auth_successes == proxy.connections >= 1


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_reference_client_authenticates_through_the_proxy(proxy, mechanism):
    """librdkafka gets through the test SASL server, with the same escaped user name and
    non-ASCII password: the server is not only checked against our own client, and librdkafka,
    like Kafka, salts the password's plain UTF-8 (no SASLprep)."""
    topic = _topic("ref-sasl")
    create_topic(proxy.bootstrap, topic)
    proxy.configure(users={USER: PASSWORD}, mechanisms=(mechanism,))
    produce(proxy.bootstrap, topic, [(b"k", b"v")], partition=0,
            **{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
               "sasl.username": USER, "sasl.password": PASSWORD})
    assert proxy.auth_successes >= 1 and proxy.auth_failures == 0


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_wrong_password_fails_once_without_leaking_it(proxy, mechanism, caplog):
    caplog.set_level(logging.DEBUG, logger="kdaemon")
    proxy.configure(users={USER: "the-right-one"}, mechanisms=(mechanism,))
    with _consumer(proxy.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                   sasl_username=USER, sasl_password=PASSWORD) as c:
        err, took = _expect_auth_failure(c)
        assert took < AUTH_FAILURE_S
        assert f"SASL {mechanism} authentication failed" in str(err)
        _assert_not_retried(c, proxy, err)
        shown = [str(err), repr(err), repr(c), repr(c.config), str(c.config), caplog.text]
        shown += [str(r.args) for r in caplog.records]
    assert proxy.auth_failures == 1
    assert caplog.text, "the failure must be logged"
    for text in shown:
        assert PASSWORD not in text


def test_sasl_mechanism_the_broker_does_not_enable(proxy):
    proxy.configure(users={USER: PASSWORD}, mechanisms=("SCRAM-SHA-512",))
    with _consumer(proxy.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                   sasl_username=USER, sasl_password=PASSWORD) as c:
        err, _ = _expect_auth_failure(c)
    assert "UNSUPPORTED_SASL_MECHANISM" in str(err)
    assert "broker enables: SCRAM-SHA-512" in str(err)
    assert proxy.connections == 1


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_tansu_rejects_scram_login_once(authenticating_tansu, mechanism, caplog):
    """The real broker: Tansu has no users, so it answers the proof with e=unknown-user."""
    caplog.set_level(logging.DEBUG, logger="kdaemon")
    proxy = authenticating_tansu
    proxy.configure()
    with _consumer(proxy.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                   sasl_username=USER, sasl_password=PASSWORD) as c:
        err, took = _expect_auth_failure(c)
        assert took < AUTH_FAILURE_S
        assert "unknown-user" in str(err)
        _assert_not_retried(c, proxy, err)
    assert PASSWORD not in str(err) and PASSWORD not in caplog.text


def test_broker_dropping_the_connection_during_sasl_is_retried_with_backoff(authenticating_tansu):
    """Tansu closes the connection on a PLAIN handshake instead of answering
    UNSUPPORTED_SASL_MECHANISM.  A dropped connection is not proof of bad credentials (Kafka's
    Java client retries too), so the consumer reconnects with exponential backoff, not in a tight
    loop, and gives up after default_api_timeout_ms."""
    proxy = authenticating_tansu
    proxy.configure()
    with _consumer(proxy.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                   sasl_username=USER, sasl_password=PASSWORD, default_api_timeout_ms=1500,
                   reconnect_backoff_ms=50, reconnect_backoff_max_ms=1000) as c:
        c.assign([TopicPartition("any-topic", 0)])
        start = time.monotonic()
        with pytest.raises(NoBrokersAvailableError):
            while time.monotonic() - start < 10:
                c.poll(100)
        took = time.monotonic() - start
    assert 1.4 <= took < 4
    # 50, 100, 200, 400, 800 ms (+-20%) fit in 1.5 s: about six attempts, never dozens.
    assert 2 <= proxy.connections <= 8


# --- connection failures and missing topics ----------------------------------------------------

def test_unreachable_bootstrap_raises_no_brokers_available_after_the_api_timeout():
    with socket.socket() as s:  # a port nobody listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with _consumer(f"127.0.0.1:{port}", default_api_timeout_ms=1000) as c:
            c.assign([TopicPartition("any-topic", 0)])
            start = time.monotonic()
            with pytest.raises(NoBrokersAvailableError) as info:
                c.poll(10_000)  # one call: it must not wait out its own timeout
            took = time.monotonic() - start
    assert 0.9 <= took < 3
    assert f"127.0.0.1:{port}" in str(info.value)
    assert "default_api_timeout_ms=1000" in str(info.value)


def test_unknown_topic_error_mode_raises(broker):
    topic = _topic("missing")
    with _consumer(broker.bootstrap, unknown_topic="error") as c:
        c.assign([TopicPartition(topic, 0)])
        start = time.monotonic()
        with pytest.raises(UnknownTopicError) as info:
            while time.monotonic() - start < DEADLINE_S:
                c.poll(100)
    assert topic in str(info.value)
    assert time.monotonic() - start < 5


def test_unknown_topic_wait_mode_picks_the_topic_up_once_created(broker, caplog):
    topic = _topic("later")
    with _consumer(broker.bootstrap, unknown_topic="wait", retry_backoff_ms=50) as c:
        c.assign([TopicPartition(topic, 0)])
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            assert c.poll(100) == {}
        assert any(topic in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
        create_topic(broker.bootstrap, topic)
        produce(broker.bootstrap, topic, [(b"k", b"hello"), (b"k", b"world")], partition=0)
        got = []
        deadline = time.monotonic() + DEADLINE_S
        while len(got) < 2:
            assert time.monotonic() < deadline, "records never arrived after the topic was created"
            for records in c.poll(200).values():
                got.extend(records)
    assert [r.value for r in got] == [b"hello", b"world"]
