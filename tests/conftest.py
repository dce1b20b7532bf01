"""Fixtures shared by the whole suite.

``kafka``: one Apache Kafka node (KRaft, combined broker+controller, PLAINTEXT) for the session:
the reference broker.  ``kafka_cluster``: three Apache Kafka nodes with racks r1-r3, and SSL
(client certificates required) and SASL_SSL (PLAIN, SCRAM-SHA-256/512) listeners beside
PLAINTEXT, for the session; tests that kill or restart a node must leave it running again.
Both come from Maven Central jars (tests/support/apache_kafka.py); their logs are printed under
any test that used them and failed.

``broker``: one Tansu broker for the session (the embedded default, for quick tests).
``mock_cluster``: a fresh three-broker librdkafka mock cluster per test, for injected errors.
Tests create their own uniquely named topics.
"""

from __future__ import annotations

import pytest

from tests.support.apache_kafka import KafkaCluster, KafkaUnavailable, start_kafka
from tests.support.mockcluster import MockCluster
from tests.support.tansu import TansuBroker, start_tansu


def _start_or_fail(tmp_path_factory: pytest.TempPathFactory, name: str, **kw) -> KafkaCluster:
    try:
        return start_kafka(tmp_path_factory.mktemp(name), **kw)
    except KafkaUnavailable as exc:
        # Not a skip: the suite promises Apache Kafka; a machine that cannot start it fails loudly.
        pytest.fail(f"Apache Kafka cannot start here: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    """A running single-node Apache Kafka: ``.bootstrap`` ("127.0.0.1:PORT"), ``.host``, ``.port``."""
    cluster = _start_or_fail(tmp_path_factory, "kafka")
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    """Three Apache Kafka nodes (racks r1, r2, r3) with PLAINTEXT, SSL and SASL_SSL listeners."""
    cluster = _start_or_fail(tmp_path_factory, "kafka-cluster", nodes=3, secure=True)
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach the Apache Kafka logs to the report of a failed test that used a Kafka cluster."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, KafkaCluster):   # the session fixtures and any suite's own cluster
            report.sections.append((f"Apache Kafka logs ({name})", value.log_tail(40)))
