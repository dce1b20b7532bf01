"""Fixtures shared by the whole suite.

``kafka``: one Apache Kafka node (KRaft, combined broker+controller, PLAINTEXT) for the session:
the reference broker.  ``kafka_cluster``: three Apache Kafka nodes with racks r1-r3, and SSL
(client certificates required) and SASL_SSL (PLAIN, SCRAM-SHA-256/512) listeners beside
PLAINTEXT, for the session; tests that kill or restart a node must leave it running again.
Both come from Maven Central jars (testkit/apache_kafka.py); their logs are printed under
any test that used them and failed.

``broker``: one Tansu broker for the session (the embedded default, for quick tests).
``mock_cluster``: a fresh three-broker librdkafka mock cluster per test, for injected errors.
Tests create their own uniquely named topics.
"""

from __future__ import annotations

import pytest

from testkit.apache_kafka import KafkaCluster, start_or_fail
from testkit.mockcluster import MockCluster
from testkit.schema_registry import SchemaRegistryServer
from testkit.tansu import TansuBroker, start_tansu


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    """A running single-node Apache Kafka: ``.bootstrap`` ("127.0.0.1:PORT"), ``.host``, ``.port``."""
    cluster = start_or_fail(tmp_path_factory, "kafka")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    """Three Apache Kafka nodes (racks r1, r2, r3) with PLAINTEXT, SSL and SASL_SSL listeners."""
    cluster = start_or_fail(tmp_path_factory, "kafka-cluster", nodes=3, secure=True)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> TansuBroker:
    """A running Tansu broker: ``.bootstrap`` ("127.0.0.1:PORT"), ``.host``, ``.port``.

    Its log is kept under pytest's temporary directory (``.log_path``).
    """
    tansu = start_tansu(tmp_path_factory.mktemp("tansu"))
    yield tansu
    tansu.stop()


@pytest.fixture
def mock_cluster() -> MockCluster:
    """A librdkafka mock cluster with brokers 1, 2 and 3, destroyed after the test."""
    with MockCluster(3) as cluster:
        yield cluster


# The servers whose log ends are attached to the report of a failed test that used one (as a
# fixture of any scope, the session's or a suite's own), and the section's title.
LOGGED_SERVERS = ((KafkaCluster, "Apache Kafka logs"), (SchemaRegistryServer, "Apicurio Registry log"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach the logs of the servers a failed test used (``LOGGED_SERVERS``) to its report."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        for server_type, title in LOGGED_SERVERS:
            if isinstance(value, server_type):
                report.sections.append((f"{title} ({name})", value.log_tail(40)))
