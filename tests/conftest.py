"""Fixtures shared by the whole suite.

``broker``: one Tansu broker for the session (tests create their own uniquely named topics).
``mock_cluster``: a fresh three-broker librdkafka mock cluster per test, for failure injection.
"""

from __future__ import annotations

import pytest

from tests.support.mockcluster import MockCluster
from tests.support.tansu import TansuBroker, start_tansu


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
