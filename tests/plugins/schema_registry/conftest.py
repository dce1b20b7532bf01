"""``schema_registry``: one Apicurio Registry for the session (testkit/schema_registry.py),
in-memory, Confluent's API at ``.ccompat_url``; its log is printed under a failed test that used it (tests/conftest.py).
Tests register their own uniquely named subjects."""

from __future__ import annotations

import pytest

from testkit.schema_registry import RegistryUnavailable, SchemaRegistryServer, start_registry


@pytest.fixture(scope="session")
def schema_registry(tmp_path_factory: pytest.TempPathFactory) -> SchemaRegistryServer:
    try:
        server = start_registry(tmp_path_factory.mktemp("schema-registry"))
    except RegistryUnavailable as exc:
        # Not a skip, as for Apache Kafka: a machine that cannot start it fails loudly.
        pytest.fail(f"Apicurio Registry cannot start here: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def pb2(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The test .proto files (protos/) compiled by protoc into imported _pb2 modules."""
    from tests.plugins.schema_registry.helpers import compile_protos
    return compile_protos(tmp_path_factory.mktemp("pb2"))
