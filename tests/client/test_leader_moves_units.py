"""What the client does when a partition's leader moves, found against a three-node Apache Kafka
(tests/client/test_cluster_faults_kafka.py) and pinned here without a broker.

1. A killed leader is never asked anything again, so no error says its partitions moved: the
   metadata must refresh because its connection failed (Java: ``handleServerDisconnect``).
   Before, the consumer went on reconnecting to the dead broker until ``metadata_max_age_ms``
   (5 minutes) and its partitions delivered nothing.
2. A fetch-ahead (the next Fetch sent while an answer is still buffered) starts at that answer's
   end.  It once carried the position's older epoch as ``last_fetched_epoch``: the leader
   elected meanwhile saw that epoch end before the fetch offset and answered
   ``diverging_epoch``, a log truncation that never happened, and the records since were
   delivered twice.  Every Fetch now sends -1 there, as the Java consumer does; truncation is
   found by validating positions after a leader change.
"""

from __future__ import annotations

import threading
import uuid

from kdaemon.client import ConsumerConfig
from kdaemon.client.fetcher import Fetcher
from kdaemon.client.future import Future
from kdaemon.client.metadata import ClusterMetadata
from kdaemon.client.subscription import SubscriptionState
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.apis import FETCH, METADATA
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.records import record_set_end_offset

TOPIC_ID = uuid.UUID(int=7)
TP = TopicPartition("t", 0)


class FakeNetwork:
    """The parts of NetworkClient that metadata and the fetcher use; requests are kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, object, dict, Future]] = []
        self.failure_at = 0.0
        self.lock = threading.RLock()

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


def test_record_set_end_offset_gives_the_end_of_the_last_complete_batch():
    data = build_batch([RecordSpec(value=b"a")] * 2, base_offset=10, leader_epoch=4) + \
        build_batch([RecordSpec(value=b"b")] * 3, base_offset=12, leader_epoch=6)
    assert record_set_end_offset(data) == 15
    assert record_set_end_offset(data[:-1]) == 12     # the last batch is cut off
    assert record_set_end_offset(b"") is None and record_set_end_offset(None) is None


def test_fetches_and_fetch_aheads_send_no_last_fetched_epoch_as_java():
    net = FakeNetwork()
    md = fresh_metadata(net, now=100.0)
    md.handle_response(metadata_body(leader=1, epoch=1), 101.0)   # the leader moved: epoch 1
    subs = SubscriptionState("earliest")
    subs.assign([TP])
    subs.seek(TP, 302)
    subs.state(TP).position_epoch = 0          # read under the old leader up to 302
    fetcher = Fetcher(ConsumerConfig(fetch_max_wait_ms=0), net, md, subs)
    fetcher.validator.check_leaders()
    subs.state(TP).awaiting_validation = False   # the new leader confirmed 302 (epoch 0 ends there)
    subs.state(TP).position_leader = (1, 1)

    assert fetcher.send_fetches() == 1
    first = net.requests(FETCH)[-1]["topics"][0]["partitions"][0]
    # Java's AbstractFetch sends Optional.empty(): -1, whatever the position's epoch (0 here).
    assert (first["fetch_offset"], first["current_leader_epoch"], first["last_fetched_epoch"]) == (302, 1, -1)
    # The new leader's records, 302-328, written in epoch 1, arrive and stay buffered.
    records = build_batch([RecordSpec(value=b"x")] * 27, base_offset=302, leader_epoch=1)
    net.sent[-1][3].success((13, {
        "throttle_time_ms": 0, "error_code": 0, "session_id": 0,
        "responses": [{"topic_id": TOPIC_ID, "topic": "", "partitions": [{
            "partition_index": 0, "error_code": 0, "high_watermark": 329, "last_stable_offset": 329,
            "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
            "records": records}]}]}))

    assert fetcher.send_fetches() == 1     # the fetch-ahead, sent before the answer is drained
    ahead = net.requests(FETCH)[-1]["topics"][0]["partitions"][0]
    assert ahead["fetch_offset"] == 329
    assert (ahead["current_leader_epoch"], ahead["last_fetched_epoch"]) == (1, -1), \
        "an epoch older than the fetch offset's reads as a truncation to the broker"
