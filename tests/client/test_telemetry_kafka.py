"""Client telemetry (KIP-714) against Apache Kafka 4.4 with a ClientTelemetry plugin: what kdaemon's
consumer pushes, as the broker's plugin receives it, beside what the Java consumer pushes.

One broker of this module's own (a telemetry plugin must be on a broker's class path and among
its ``metric.reporters`` from its start: testkit/telemetry_recorder.py), started once; one
client-metrics subscription to every consumer metric, pushed every second.  The kdaemon consumer
and the Java consumer each read the same records in a group of their own, commit, and close; the
plugin's record of their pushes is compared: the terminating push last, a client instance id
each, the compression the broker prefers, and kdaemon's metric names, where Java has the metric,
being Java's.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest

from kdaemon.client.consumer import Consumer
from kdaemon.client.share import ShareConsumer
from kdaemon.protocol.apis import GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY
from kdaemon.protocol.compression import ZSTD
from testkit.apache_kafka import KafkaCluster, KafkaUnavailable
from testkit.daemon import wait_for
from testkit.java_peer import JavaConsumerProcess
from testkit.produce import create_topic, produce
from testkit.telemetry_recorder import pushes, start_recording_kafka, subscribe

pytestmark = pytest.mark.kafka

TIMEOUT = 60.0
RECORDS = 50
INTERVAL_MS = 1000
# The figures both consumers have, under the names Java's consumer pushes them by.
SHARED_NAMES = {
    "org.apache.kafka.consumer.fetch.manager.records.consumed.total",
    "org.apache.kafka.consumer.fetch.manager.bytes.consumed.total",
    "org.apache.kafka.consumer.fetch.manager.fetch.latency.avg",
    "org.apache.kafka.consumer.fetch.manager.records.lag.max",
    "org.apache.kafka.consumer.fetch.manager.records.lag",
    "org.apache.kafka.consumer.connection.creation.rate",
    "org.apache.kafka.consumer.connection.creation.total",
    "org.apache.kafka.consumer.coordinator.commit.latency.avg",
    "org.apache.kafka.consumer.coordinator.assigned.partitions",
    "org.apache.kafka.consumer.coordinator.rebalance.total",
}


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("telemetry-kafka")
    try:
        cluster = start_recording_kafka(directory)
    except KafkaUnavailable as exc:
        pytest.fail(f"Apache Kafka cannot start here: {exc}", pytrace=False)
    try:
        subscribe(cluster, "every-consumer-metric", ["org.apache.kafka.consumer.", "kdaemon.consumer."], INTERVAL_MS)
        yield cluster, directory
    finally:
        cluster.stop()


def pushes_of(directory: Path, client_id: str):
    return [p for p in pushes(directory) if p.client_id == client_id]


def test_kdaemon_pushes_what_java_pushes(recording: tuple[KafkaCluster, Path]):
    cluster, directory = recording
    assert {k: cluster.offered.get(k) for k in (71, 72)} == {71: (0, 0), 72: (0, 0)}
    topic = f"telemetry-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.bootstrap, topic, 2)
    produce(cluster.bootstrap, topic, [(None, f"v{i}".encode()) for i in range(RECORDS)])

    # kdaemon's consumer: reads everything, pushes at least once, commits, closes.
    ours = Consumer(cluster.bootstrap, client_id="kd-telemetry", group_id=f"{topic}-kd",
                    auto_offset_reset="earliest", enable_auto_commit=False)
    sent = []
    ours._network.observers.append(lambda node, api, version, body, response: sent.append((api, body, response))
                                   if api in (GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY) else None)
    consumed = 0
    try:
        ours.subscribe([topic])

        def read_and_pushed():
            nonlocal consumed
            consumed += sum(len(v) for v in ours.poll(200).values())
            return consumed == RECORDS and pushes_of(directory, "kd-telemetry")

        wait_for(read_and_pushed, TIMEOUT, "kdaemon's consumer to read every record and push its metrics")
        ours.commit()
        instance = ours.client_instance_id()
        # One more push after the commit, so it carries the commit latency.
        seen = len(pushes_of(directory, "kd-telemetry"))
        wait_for(lambda: ours.poll(100) is not None and len(pushes_of(directory, "kd-telemetry")) > seen,
                 TIMEOUT, "a push after the commit")
    finally:
        ours.close()
    kd = wait_for(lambda: (p := pushes_of(directory, "kd-telemetry")) and p[-1].terminating and p,
                  TIMEOUT, "kdaemon's terminating push")

    # The Java consumer on the same broker, the same records.
    java = JavaConsumerProcess(cluster.bootstrap, topics=[topic], group=f"{topic}-java", client_id="java-telemetry",
                               commit=True, print_records=False)
    try:
        wait_for(lambda: len([p for p in pushes_of(directory, "java-telemetry")
                              if "org.apache.kafka.consumer.coordinator.commit.latency.avg" in p.names]) >= 1,
                 TIMEOUT, "the Java consumer's pushes after a commit", on_timeout=lambda: java.stderr[-3000:])
    finally:
        java.stop()
    jv = wait_for(lambda: (p := pushes_of(directory, "java-telemetry")) and p[-1].terminating and p,
                  TIMEOUT, "the Java consumer's terminating push", on_timeout=lambda: java.stderr[-3000:])

    # Each: one client instance id for all its pushes, exactly one terminating push, the last.
    for name, got in (("kdaemon", kd), ("java", jv)):
        assert len({p.client_instance_id for p in got}) == 1, (name, got)
        assert [p.terminating for p in got] == [False] * (len(got) - 1) + [True], (name, got)
        assert all(p.error is None and p.content_type == "OTLP" for p in got), (name, got)
    # Kafka prints a Uuid as URL-safe base64 without padding.
    assert base64.urlsafe_b64encode(instance.bytes).rstrip(b"=").decode() == kd[0].client_instance_id
    assert kd[0].client_instance_id != jv[0].client_instance_id

    # Our requests: subscribed once, every push answered without error, compressed with the
    # broker's first choice (zstd), the last one terminating.
    answers = [(api, body) for api, body, response in sent if response]
    requests = [(api, body) for api, body, response in sent if not response]
    (subscription,) = [b for a, b in answers if a is GET_TELEMETRY_SUBSCRIPTIONS]
    assert subscription["accepted_compression_types"][0] == ZSTD, subscription
    assert subscription["requested_metrics"] == ["org.apache.kafka.consumer.", "kdaemon.consumer."], subscription
    push_requests = [b for a, b in requests if a is PUSH_TELEMETRY]
    assert {b["compression_type"] for b in push_requests} == {ZSTD}
    assert [b["terminating"] for b in push_requests][-1] is True
    assert [b["error_code"] for a, b in answers if a is PUSH_TELEMETRY] == [0] * len(push_requests)

    # The names: every name kdaemon pushes under Java's prefix is one the Java consumer pushes
    # too, the figures both have among them, with Java's kinds and attributes.
    ours_by_name = {m["name"]: m for p in kd for m in p.metrics}
    java_by_name = {m["name"]: m for p in jv for m in p.metrics}
    java_prefixed = {n for n in ours_by_name if n.startswith("org.apache.kafka.consumer.")}
    assert java_prefixed - set(java_by_name) == set(), sorted(java_prefixed - set(java_by_name))
    assert SHARED_NAMES <= java_prefixed, sorted(SHARED_NAMES - java_prefixed)
    for name in SHARED_NAMES:
        assert ours_by_name[name]["kind"] == java_by_name[name]["kind"], (name, ours_by_name[name], java_by_name[name])
    lag_attributes = lambda by_name: {tuple(sorted(k for k in pt["attributes"] if k != "client_id"))  # noqa: E731
                                      for pt in by_name["org.apache.kafka.consumer.fetch.manager.records.lag"]["points"]}
    assert lag_attributes(ours_by_name) == lag_attributes(java_by_name) == {("partition", "topic")}
    # What kdaemon's final push says: everything read, the group it read in.
    # Counters are Sums in the subscription's temporality (Kafka 4.4 asks for deltas), as Java's.
    consumed_name = "org.apache.kafka.consumer.fetch.manager.records.consumed.total"
    temporality = 1 if subscription["delta_temporality"] else 2
    assert ours_by_name[consumed_name]["temporality"] == java_by_name[consumed_name]["temporality"] == temporality
    counts = [pt["value"] for p in kd for m in p.metrics if m["name"] == consumed_name
              for pt in m["points"] if not pt["attributes"]]
    assert (sum(counts) if subscription["delta_temporality"] else counts[-1]) == RECORDS, counts
    assert kd[-1].resource["group_id"] == f"{topic}-kd"
    assert any(n.startswith("kdaemon.consumer.") for n in ours_by_name)


def test_share_consumer_pushes_and_says_goodbye(recording: tuple[KafkaCluster, Path]):
    """A share group member (KIP-932) pushes too: its own counters under kdaemon.share.consumer.,
    its connections under Java's consumer names, and the terminating push on close.  Its
    subscription asks for every metric ("*"), which only it matches."""
    cluster, directory = recording
    subscribe(cluster, "share-members", ["*"], INTERVAL_MS, match=["client_id=kd-share-telemetry"])
    topic = f"telemetry-share-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.bootstrap, topic, 1)
    member = ShareConsumer(cluster.bootstrap, client_id="kd-share-telemetry", group_id=f"{topic}-share")
    try:
        member.subscribe([topic])
        wait_for(lambda: member.poll(100) is not None and pushes_of(directory, "kd-share-telemetry"),
                 TIMEOUT, "the share consumer's first push")
    finally:
        member.close()
    got = wait_for(lambda: (p := pushes_of(directory, "kd-share-telemetry")) and p[-1].terminating and p,
                   TIMEOUT, "the share consumer's terminating push")
    assert [p.terminating for p in got] == [False] * (len(got) - 1) + [True]
    names = {n for p in got for n in p.names}
    assert "kdaemon.share.consumer.records.acquired.total" in names
    assert "org.apache.kafka.consumer.connection.creation.total" in names
    assert got[-1].resource["group_id"] == f"{topic}-share"
