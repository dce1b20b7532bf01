"""Suites that run against Apache Kafka (testkit/apache_kafka.py), the reference broker,
and compare kdaemon with the Java KafkaConsumer (testkit/java) where a behaviour is shared."""
