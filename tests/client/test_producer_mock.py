"""kdaemon's idempotent producer against librdkafka's mock cluster, which injects the Produce
errors a real broker cannot make on demand; every record is read back with confluent-kafka.

Each case: records with keys (and some without), an error pushed for the next Produce
requests, one ``flush``; then the topic holds every record exactly once, each keyed record in
the partition Java's partitioner picks, in the order sent.  ``Producer.answers`` shows the
injected errors were answered (a test where the error never happened would prove nothing).

The mock checks sequence numbers only for transactional producers, so an append whose answer
is lost (the retry must be taken as a duplicate) is shown on Apache Kafka instead
(tests/sinks/kafka_dlq/test_kafka_dlq_kafka.py)."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer as ConfluentProducer

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.errors import RecordsRefusedError, RefusedError, UnknownTopicError
from kdaemon.client.partitioner import Partitioner, murmur2, to_positive
from kdaemon.client.producer import Producer, ProduceError, ProducerSettings
from kdaemon.protocol.errors import Errors
from tests.client.readback import read_topic

PARTITIONS = 3
ERR_TRANSPORT = -195   # librdkafka's RD_KAFKA_RESP_ERR__TRANSPORT: the mock closes the connection


def producer(mock, **settings) -> Producer:
    config = ConsumerConfig.from_options(bootstrap_servers=mock.bootstrap, request_timeout_ms=2_000,
                                         retry_backoff_ms=20, retry_backoff_max_ms=200)
    return Producer(config, ProducerSettings(**settings))


def records(n: int) -> list[tuple[bytes | None, bytes | None, list]]:
    return [(None if i % 5 == 0 else b"key-%d" % i, None if i % 7 == 3 else b"value-%d" % i,
             [("seq", str(i).encode()), ("empty", None)]) for i in range(n)]


def send_all(p: Producer, topic: str, batch) -> None:
    for k, v, h in batch:
        p.send(topic, k, v, h, timestamp=1_700_000_000_000 + int(dict(h)["seq"]))


def check_exactly_once(mock, topic: str, batch) -> None:
    got = read_topic(mock.bootstrap, topic, PARTITIONS)
    seen = [int(dict(r.headers)["seq"]) for p in range(PARTITIONS) for r in got[p]]
    assert sorted(seen) == list(range(len(batch))), f"{len(seen)} read for {len(batch)} sent: {sorted(seen)}"
    expect = Partitioner()
    for p, rs in got.items():
        order = [int(dict(r.headers)["seq"]) for r in rs]
        assert order == sorted(order), f"partition {p} out of order: {order}"
        for r in rs:
            i = int(dict(r.headers)["seq"])
            key, value, headers = batch[i]
            assert (r.key, r.value, r.headers, r.timestamp) == (key, value, headers, 1_700_000_000_000 + i)
            if key is not None:
                assert p == expect.partition(topic, key, PARTITIONS)


@pytest.fixture
def topic(mock_cluster) -> str:
    name = f"dlq-{uuid.uuid4().hex[:8]}"
    mock_cluster.topic_create(name, PARTITIONS, 1)
    return name


@pytest.mark.parametrize("error", [Errors.NOT_LEADER_OR_FOLLOWER, Errors.REQUEST_TIMED_OUT,
                                   Errors.NOT_ENOUGH_REPLICAS, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                   Errors.LEADER_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR, ERR_TRANSPORT],
                         ids=lambda e: str(e))
def test_retriable_produce_errors_are_retried_without_duplicates(mock_cluster, topic, error):
    batch = records(60)
    mock_cluster.push_request_errors(0, [error] * 4)
    p = producer(mock_cluster)
    try:
        send_all(p, topic, batch)
        p.flush(30)
        assert p.unacknowledged() == 0
        name = "NO_ANSWER" if error == ERR_TRANSPORT else \
            next(k for k, v in vars(Errors).items() if v == error)
        assert p.answers.get(name, 0) >= 1, p.answers
        assert p.attempts > PARTITIONS, p.answers   # retried
        assert p.producer_epoch == 0
    finally:
        p.close()
    check_exactly_once(mock_cluster, topic, batch)


@pytest.mark.parametrize("error", [Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, Errors.UNKNOWN_PRODUCER_ID],
                         ids=["OUT_OF_ORDER_SEQUENCE_NUMBER", "UNKNOWN_PRODUCER_ID"])
def test_lost_producer_state_bumps_the_epoch_and_writes_once(mock_cluster, topic, error):
    first, second = records(60)[:30], records(60)[30:]
    p = producer(mock_cluster)
    try:
        send_all(p, topic, first)
        p.flush(30)
        mock_cluster.push_request_errors(0, [error])
        send_all(p, topic, second)
        p.flush(30)
        assert p.producer_epoch == 1, p.answers    # bumped locally, same id
    finally:
        p.close()
    check_exactly_once(mock_cluster, topic, records(60))


def test_a_permanent_refusal_fails_the_flush_and_every_later_one(mock_cluster, topic):
    p = producer(mock_cluster)
    try:
        mock_cluster.push_request_errors(0, [Errors.TOPIC_AUTHORIZATION_FAILED])
        send_all(p, topic, records(3))
        with pytest.raises(RefusedError, match=rf"refuses writes to topic {topic}: TOPIC_AUTHORIZATION_FAILED \(29\)") \
                as info:
            p.flush(30)
        assert info.value.topic == topic and f"WRITE and DESCRIBE on topic {topic}" in info.value.fix
        with pytest.raises(RefusedError, match="TOPIC_AUTHORIZATION_FAILED"):
            p.flush(30)
        with pytest.raises(ProduceError, match="failed earlier") as info:
            p.send(topic, b"k", b"v")
        assert info.value.fix and info.value.topic == topic
    finally:
        p.close()


def test_a_missing_topic_is_named_with_the_command_that_creates_it(mock_cluster):
    p = producer(mock_cluster)
    try:
        p.send("no-such-dlq", b"k", b"v")
        with pytest.raises(UnknownTopicError, match="topic no-such-dlq does not exist on the cluster at") as info:
            p.flush(30)
        assert "kafka-topics" in info.value.fix and "--create --topic no-such-dlq" in info.value.fix
        assert p.unacknowledged() == 1   # kept, not dropped
    finally:
        p.close()


def test_a_record_too_large_for_the_topic_is_named_by_its_tag_and_the_producer_goes_on(mock_cluster, topic):
    """MESSAGE_TOO_LARGE for a batch of one: that record is refused for what it is (no retry
    changes it), the flush names it once every other record is acknowledged, and the producer
    takes the next ones with the same sequence numbers (the refused batch used none)."""
    p = producer(mock_cluster)
    try:
        p.send(topic, b"key-big", b"x" * 1000, tag="the big one")
        mock_cluster.push_request_errors(0, [Errors.MESSAGE_TOO_LARGE])
        with pytest.raises(RecordsRefusedError, match="MESSAGE_TOO_LARGE") as info:
            p.flush(30)
        assert [(r.tag, r.topic) for r in info.value.records] == [("the big one", topic)]
        assert "max.message.bytes" in info.value.fix and p.unacknowledged() == 0
        p.flush(30)                        # said once
        batch = records(60)
        send_all(p, topic, batch)
        p.flush(30)
        assert p.producer_epoch == 0
    finally:
        p.close()
    check_exactly_once(mock_cluster, topic, batch)


def test_a_batch_too_large_is_split_until_it_goes(mock_cluster, topic):
    batch = records(60)
    p = producer(mock_cluster)
    try:
        send_all(p, topic, batch)
        mock_cluster.push_request_errors(0, [Errors.MESSAGE_TOO_LARGE] * 2)
        p.flush(30)
        assert p.answers.get("MESSAGE_TOO_LARGE", 0) >= 2, p.answers
    finally:
        p.close()
    check_exactly_once(mock_cluster, topic, batch)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_read_back(mock_cluster, topic, codec):
    batch = records(40)
    p = producer(mock_cluster, compression=codec)
    try:
        send_all(p, topic, batch)
        p.flush(30)
    finally:
        p.close()
    check_exactly_once(mock_cluster, topic, batch)


def test_keys_go_where_librdkafkas_java_compatible_partitioner_puts_them(mock_cluster):
    """librdkafka's ``murmur2_random`` is Java's default partitioner for keyed records."""
    name = f"keys-{uuid.uuid4().hex[:8]}"
    mock_cluster.topic_create(name, 7, 1)
    placed = {}
    cp = ConfluentProducer({"bootstrap.servers": mock_cluster.bootstrap, "partitioner": "murmur2_random"})
    keys = [b"k%d" % i for i in range(200)] + [b"", b"a", b"ab", b"abc", "é✓".encode(), bytes(range(256))]
    for key in keys:
        cp.produce(name, b"v", key, on_delivery=lambda err, msg: placed.__setitem__(msg.key(), msg.partition()))
    assert cp.flush(30) == 0
    ours = Partitioner()
    assert {k: ours.partition(name, k, 7) for k in keys} == placed
    # kafka-clients' UtilsTest vectors
    assert [murmur2(b) for b in (b"21", b"foobar", b"a-little-bit-long-string", b"abc")] == \
        [-973932308, -790332482, -985981536, 479470107]
    assert to_positive(-2147483648) == 0
