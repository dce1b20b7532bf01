"""Fixtures of the Spark sink tests: a SparkSession (local mode) to read the output back.

Each test module skips itself, not fails, without PySpark or a Java runtime
(``testkit.spark.requires_spark``): the spark extra is optional (``pip install -e '.[spark]'``).
"""

from __future__ import annotations

import pytest


_reader: list = []   # the reader session, while its JVM lives


@pytest.fixture
def spark():
    """A reader session, separate from the daemons' uploaders (they own their own JVMs).

    Started once and reused; started again when a test module shut this process's JVM down to
    launch one with other settings (the Iceberg and schema tests' writers do)."""
    from pyspark import SparkContext
    if not _reader or SparkContext._gateway is None or _reader[0].sparkContext._jsc is None:
        _reader[:] = [_start_reader()]
    return _reader[0]


def _start_reader():
    from testkit.spark import reader_session
    return reader_session()
