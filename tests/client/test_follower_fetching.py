"""Follower fetching (KIP-392) against librdkafka's mock cluster.

The mock's leader answers a Fetch (v11+) with ``preferred_read_replica`` when the partition has a
follower set; the consumer must then fetch from that replica, and fall back to the leader when
the replica goes away, without losing or repeating records.
"""

from __future__ import annotations

import time

from kdaemon.client import Consumer, TopicPartition
from testkit.produce import produce


def _produce(bootstrap: str, topic: str, start: int, n: int) -> None:
    produce(bootstrap, topic, [(None, f"{i}".encode()) for i in range(start, start + n)], partition=0)


def _drain(c: Consumer, n: int, deadline_s: float = 20.0) -> list:
    out = []
    deadline = time.monotonic() + deadline_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} records"
        for records in c.poll(100).values():
            out.extend(records)
    return out


def test_fetches_from_preferred_replica_and_falls_back_to_leader(mock_cluster):
    topic = "follower"
    mock_cluster.topic_create(topic, 1, 3)
    mock_cluster.partition_set_leader(topic, 0, 1)
    mock_cluster.partition_set_follower(topic, 0, 2)
    _produce(mock_cluster.bootstrap, topic, 0, 50)
    tp = TopicPartition(topic, 0)
    with Consumer(mock_cluster.bootstrap, auto_offset_reset="earliest", client_rack="rack-b",
                  fetch_max_wait_ms=50, reconnect_backoff_ms=20, reconnect_backoff_max_ms=100,
                  retry_backoff_ms=20, request_timeout_ms=2000,
                  socket_connection_setup_timeout_ms=1000) as c:
        c.assign([tp])
        first = _drain(c, 50)
        assert [r.offset for r in first] == list(range(50))
        assert c.metrics().partitions[tp].preferred_read_replica == 2
        assert c.metrics().fetch_requests_per_node.get(2, 0) > 0

        # The replica disappears (and, as a real leader would, the mock stops recommending it):
        # back to the leader, nothing lost or repeated.
        mock_cluster.broker_set_down(2)
        mock_cluster.partition_set_follower(topic, 0, -1)
        _produce(mock_cluster.bootstrap, topic, 50, 50)
        before = c.metrics().fetch_requests_per_node.get(1, 0)
        second = _drain(c, 50)
        assert [r.offset for r in second] == list(range(50, 100))
        assert [r.value for r in second] == [f"{i}".encode() for i in range(50, 100)]
        assert c.metrics().fetch_requests_per_node.get(1, 0) > before
