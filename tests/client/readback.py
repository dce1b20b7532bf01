"""Reading a topic back whole with confluent-kafka (librdkafka), for the producer's tests here
(test_producer_mock.py) and the Kafka DLQ's (tests/sinks/kafka_dlq/test_kafka_dlq_kafka.py)."""

from __future__ import annotations

from testkit.produce import ConsumedRecord, consume_all, high_watermarks


def read_topic(bootstrap: str, topic: str, partitions: int) -> dict[int, list[ConsumedRecord]]:
    """Every record of every partition, up to the high watermark each has now (a topic nobody
    writes to any more: on Apache Kafka and the mock the watermark is the end)."""
    ends = high_watermarks(bootstrap, topic, partitions)
    return {p: consume_all(bootstrap, topic, p, end=end) if end else [] for p, end in ends.items()}
