"""Suites that run against Apache Kafka (tests/support/apache_kafka.py), the reference broker,
and compare kdaemon with the Java KafkaConsumer (bench/java) where a behaviour is shared."""
