"""The test broker's start survives losing a port between choosing it and binding it.

CI once lost a three-node start to that race (a client socket took a freed ephemeral port); the
ports now come from below the ephemeral range and a start whose listener could not bind is
retried on fresh ports.  Here the race is made on purpose: the first port chosen is held open.
"""

from __future__ import annotations

import socket

import pytest

from testkit import apache_kafka
from testkit.wire import request
from kdaemon.protocol.apis import METADATA


def test_a_port_taken_before_the_bind_is_retried_on_fresh_ports(tmp_path, monkeypatch):
    held = socket.socket()
    held.bind((apache_kafka.HOST, 0))
    held.listen()
    taken = held.getsockname()[1]
    real = apache_kafka.listen_port
    handed: list[int] = []

    def first_one_taken() -> int:
        port = taken if not handed else real()
        handed.append(port)
        return port

    monkeypatch.setattr(apache_kafka, "listen_port", first_one_taken)
    try:
        cluster = apache_kafka.start_kafka(tmp_path / "k")
    finally:
        held.close()
    try:
        assert handed[0] == taken and taken not in cluster.node(1).ports.values()
        assert len(handed) == 4   # two listeners, twice: the first start failed on its bind
        log = (tmp_path / "k" / "node1" / "server.log").read_text()
        assert "Address already in use" not in log   # the retry's node started on clean storage
        body = request(apache_kafka.HOST, cluster.port, METADATA, 12,
                       {"topics": [], "allow_auto_topic_creation": False,
                        "include_topic_authorized_operations": False}, timeout=5.0).body
        assert [b["node_id"] for b in body["brokers"]] == [1]
    finally:
        cluster.stop()


def test_a_start_that_fails_for_another_reason_is_not_retried(tmp_path, monkeypatch):
    calls: list[int] = []
    real = apache_kafka._start_once

    def count(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(apache_kafka, "_start_once", count)
    with pytest.raises(apache_kafka.KafkaStartError, match="format failed for node 1"):
        apache_kafka.start_kafka(tmp_path / "k", extra_properties={"num.network.threads": "zero"})
    assert calls == [1]


def test_listen_ports_lie_below_the_ephemeral_range():
    from testkit.ports import listen_port
    low, high = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    ports = {listen_port() for _ in range(20)}
    assert len(ports) == 20 and all(p < low for p in ports)
