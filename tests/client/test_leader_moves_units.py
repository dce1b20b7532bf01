"""What the client does when a partition's leader moves, found against a three-node Apache Kafka
(tests/kafka/test_cluster_faults_kafka.py) and pinned here without a broker.

A killed leader is never asked anything again, so no error says its partitions moved: the
metadata must refresh because its connection failed (Java: ``handleServerDisconnect``).
Before, the consumer went on reconnecting to the dead broker until ``metadata_max_age_ms``
(5 minutes) and its partitions delivered nothing.
"""

from __future__ import annotations

import uuid

from kdaemon.client.future import Future
from kdaemon.client.metadata import ClusterMetadata
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.apis import METADATA

TOPIC_ID = uuid.UUID(int=7)
TP = TopicPartition("t", 0)


class FakeNetwork:
    """The parts of NetworkClient that metadata and the fetcher use; requests are kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, object, dict, Future]] = []
        self.failure_at = 0.0

    def least_loaded_node(self) -> int:
        return 1

    def ready(self, node_id: int) -> bool:
        return True

    def is_ready(self, node_id: int) -> bool:
        return True

    def connection_failed(self, node_id: int) -> bool:
        return False

    def last_connection_failure_at(self) -> float:
        return self.failure_at

    def api_version(self, node_id: int, api, max_version: int | None = None) -> int:
        return 13 if max_version is None else min(13, max_version)

    def set_brokers(self, brokers) -> None:
        pass

    def send(self, node_id: int, api, body: dict, **kw) -> Future:
        fut = Future()
        self.sent.append((node_id, api, body, fut))
        return fut

    def requests(self, api) -> list[dict]:
        return [body for _, a, body, _ in self.sent if a is api]


def metadata_body(leader: int, epoch: int) -> dict:
    return {
        "brokers": [{"node_id": n, "host": "127.0.0.1", "port": 9000 + n, "rack": None} for n in (1, 2, 3)],
        "cluster_id": "c", "controller_id": 1,
        "topics": [{"name": "t", "error_code": 0, "topic_id": TOPIC_ID, "is_internal": False,
                    "partitions": [{"error_code": 0, "partition_index": 0, "leader_id": leader,
                                    "leader_epoch": epoch, "replica_nodes": [1, 2, 3],
                                    "isr_nodes": [1, 2, 3], "offline_replicas": []}]}],
    }


def fresh_metadata(net: FakeNetwork, now: float) -> ClusterMetadata:
    md = ClusterMetadata()
    md.set_wanted({"t"})
    md.maybe_update(net, now)
    net.sent[-1][3].success((12, metadata_body(leader=3, epoch=0)))
    assert md.leader_for(TP) == 3
    return md


def test_a_failed_broker_connection_makes_the_metadata_refresh():
    net = FakeNetwork()
    md = fresh_metadata(net, now=100.0)
    assert md.maybe_update(net, 101.0) is None and len(net.requests(METADATA)) == 1  # fresh: nothing due

    net.failure_at = 101.5          # the leader's connection failed (a killed broker)
    fut = md.maybe_update(net, 102.0)
    assert fut is not None and len(net.requests(METADATA)) == 2
    fut.success((12, metadata_body(leader=1, epoch=1)))
    assert md.leader_for(TP) == 1

    # The same failure does not ask again; the next one does.
    assert md.maybe_update(net, 103.0) is None and len(net.requests(METADATA)) == 2
    net.failure_at = 103.5
    assert md.maybe_update(net, 104.0) is not None and len(net.requests(METADATA)) == 3

