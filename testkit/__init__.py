"""The test kit: what the tests and the benchmarks share.

Brokers (Apache Kafka from Maven Central jars, Tansu, librdkafka's mock cluster, the Apicurio
registry, a Spark standalone cluster), the Java peers (KafkaConsumer, KafkaProducer), producers
and raw one-request helpers, proxies that cut or capture traffic, the daemon harness, and the
chaos and stall runs.  tests/ and bench/ both import it; neither imports the other.  The pytest
fixtures that wrap these live in ``tests/conftest.py``.
"""
