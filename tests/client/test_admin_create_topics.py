"""``kdaemon.client.admin.create_topics`` against the two real brokers the suite shares: Tansu
(the demo's embedded broker) and Apache Kafka 4.4.  A topic is created with the partitions asked
for and is in the metadata when the call returns (kdaemon's producer writes to it at once, and
its consumer reads the records back); creating it again is a success only with ``exist_ok``; on
Kafka, the refusals a one-node cluster can produce (more replicas than brokers, a bad config,
a bad name) come back as ``TopicCreateRefused`` naming the topic, the code and the fix, and
``validate_only`` creates nothing.
"""

from __future__ import annotations

import uuid

import pytest

from kdaemon.client import Consumer, TopicPartition
from kdaemon.client.admin import NewTopic, TopicCreateRefused, create_topics
from kdaemon.client.config import ConsumerConfig
from kdaemon.client.lookup import topic_partitions
from kdaemon.client.producer import Producer
from kdaemon.protocol.errors import Errors

BROKERS = [pytest.param("broker", id="tansu", marks=pytest.mark.broker), pytest.param("kafka", id="kafka", marks=pytest.mark.kafka)]


def config(bootstrap: str) -> ConsumerConfig:
    return ConsumerConfig.from_options(bootstrap_servers=bootstrap, client_id="admin-test")


@pytest.mark.parametrize("which", BROKERS)
def test_create_write_read_and_create_again(request, which):
    broker = request.getfixturevalue(which)
    c = config(broker.bootstrap)
    name = f"admin-{uuid.uuid4().hex[:8]}"
    done = create_topics(c, [NewTopic(name, 3, 1)], timeout_ms=30_000)
    assert done[name].created, done
    assert topic_partitions(c, [name], timeout_ms=10_000) == {name: {0, 1, 2}}
    # Written by kdaemon's producer straight away: no "unknown topic" while metadata catches up.
    producer = Producer(c)
    try:
        for p in range(3):
            producer.send(name, b"k%d" % p, b"v%d" % p)
        producer.flush(30)
    finally:
        producer.close()
    with Consumer(broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
        consumer.assign([TopicPartition(name, p) for p in range(3)])
        got = []
        for _ in range(200):
            got += [r.value for records in consumer.poll(100).values() for r in records]
            if len(got) == 3:
                break
    assert sorted(got) == [b"v0", b"v1", b"v2"]

    again = create_topics(c, [NewTopic(name, 3, 1)], exist_ok=True, timeout_ms=30_000)
    assert not again[name].created, again
    with pytest.raises(TopicCreateRefused) as refused:
        create_topics(c, [NewTopic(name, 3, 1)], timeout_ms=30_000)
    exc = refused.value
    assert (exc.topic, exc.code, exc.retriable) == (name, Errors.TOPIC_ALREADY_EXISTS, False), exc
    assert name in str(exc) and "TOPIC_ALREADY_EXISTS" in str(exc) and "kafka-topics" in exc.fix, (exc, exc.fix)


@pytest.mark.kafka
def test_kafkas_refusals_are_named(kafka):
    c = config(kafka.bootstrap)
    base = f"admin-{uuid.uuid4().hex[:8]}"
    ok, rf3, bad_config = f"{base}-ok", f"{base}-rf3", f"{base}-cfg"
    with pytest.raises(TopicCreateRefused) as refused:
        create_topics(c, [NewTopic(ok, 1, 1), NewTopic(rf3, 1, 3),
                          NewTopic(bad_config, 1, 1, {"cleanup.policy": "sometimes"})], timeout_ms=30_000)
    exc = refused.value
    assert {name: code for name, (code, _) in exc.refusals.items()} == \
        {rf3: Errors.INVALID_REPLICATION_FACTOR, bad_config: Errors.INVALID_CONFIG}, exc.refusals
    assert (exc.topic, exc.code) == (rf3, Errors.INVALID_REPLICATION_FACTOR)
    assert "INVALID_REPLICATION_FACTOR" in str(exc) and "INVALID_CONFIG" in str(exc) and exc.broker_message, str(exc)
    assert "replicas" in exc.fix and "brokers" in exc.fix, exc.fix
    # Kafka decides per topic: the good one of the refused request was created.
    assert topic_partitions(c, [ok, rf3], timeout_ms=10_000) == {ok: {0}, rf3: None}

    with pytest.raises(TopicCreateRefused) as refused:
        create_topics(c, [NewTopic("bad/name")], timeout_ms=30_000)
    assert refused.value.code == Errors.INVALID_TOPIC_EXCEPTION and "249" in refused.value.fix

    checked = create_topics(c, [NewTopic(f"{base}-checked", 2, 1)], validate_only=True, timeout_ms=30_000)
    assert checked[f"{base}-checked"].created
    assert topic_partitions(c, [f"{base}-checked"], timeout_ms=10_000) == {f"{base}-checked": None}
