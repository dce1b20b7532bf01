"""A bootstrap host that resolves to several addresses: every one is tried in turn, as Java's
``client.dns.lookup = use_all_dns_ips`` does.  The case that matters in practice: ``localhost``
resolves to ``::1`` first on most distributions, and a broker listening on 127.0.0.1 only must
still be reached.  Here the unreachable address is another loopback address (127.0.0.2, where
nothing listens) put before the broker's real one by a stub resolver; the broker is Tansu."""

from __future__ import annotations

import socket
import time
import uuid

import pytest

from kdaemon.client import Consumer, KafkaTimeoutError, NoBrokersAvailableError, TopicPartition
from testkit.produce import create_topic, produce

HOST = "kafka.kdaemon-test.invalid"   # never resolved by a real resolver: the stub answers it


def _stub_resolver(monkeypatch, answers: list[str]) -> list[str]:
    """Make ``HOST`` resolve to ``answers`` (IPv4 loopback addresses), in that order; returns the
    list of hosts the client asked for."""
    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host != HOST:
            return real(host, port, *args, **kwargs)
        asked.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port))) for a in answers]
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_an_unreachable_first_address_falls_through_to_the_next(broker, monkeypatch):
    topic = f"addr-{uuid.uuid4().hex[:10]}"
    create_topic(broker.bootstrap, topic, 1)
    produce(broker.bootstrap, topic, [{"value": b"v%d" % i} for i in range(5)], partition=0)
    asked = _stub_resolver(monkeypatch, ["127.0.0.2", broker.host])
    # A long reconnect backoff: had the client waited for it between addresses, the deadline
    # below would pass first.
    c = Consumer(f"{HOST}:{broker.port}", reconnect_backoff_ms=30_000, reconnect_backoff_max_ms=30_000,
                 auto_offset_reset="earliest", fetch_max_wait_ms=50, default_api_timeout_ms=10_000)
    try:
        t0 = time.monotonic()
        assert c.partitions_for(topic) == {0}
        assert time.monotonic() - t0 < 5
        c.assign([TopicPartition(topic, 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            for recs in c.poll(500).values():
                got += [r.value for r in recs]
        assert got == [b"v%d" % i for i in range(5)]
    finally:
        c.close()
    assert asked, "the stub resolver was never asked: the test did not exercise the fallback"


def test_when_no_address_answers_the_error_names_each_of_them(broker, monkeypatch):
    _stub_resolver(monkeypatch, ["127.0.0.2", "127.0.0.3"])
    c = Consumer(f"{HOST}:{broker.port}", default_api_timeout_ms=1500, reconnect_backoff_ms=100)
    try:
        with pytest.raises(KafkaTimeoutError) as info:
            c.partitions_for("anything")
    finally:
        c.close()
    message = str(info.value)
    assert "last connection error" in message, message
    assert f"connect to 127.0.0.2:{broker.port} failed: ECONNREFUSED" in message, message
    assert f"connect to 127.0.0.3:{broker.port} failed: ECONNREFUSED" in message, message


def test_poll_says_why_no_broker_answered(monkeypatch):
    _stub_resolver(monkeypatch, ["127.0.0.2"])
    c = Consumer(f"{HOST}:1", default_api_timeout_ms=500, reconnect_backoff_ms=50)
    try:
        c.assign([TopicPartition("t", 0)])
        with pytest.raises(NoBrokersAvailableError, match=r"last connection error: node -1 .*127\.0\.0\.2:1 failed"):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                c.poll(200)
    finally:
        c.close()
