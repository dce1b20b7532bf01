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
    import os
    from pyspark.sql import SparkSession

    from kdaemon.sinks.spark.tables import delta, iceberg
    from kdaemon.sinks.spark.uploader.writer import merged_conf
    from testkit.spark import fresh_jvm
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # only loopback, whatever the host name says
    fresh_jvm()   # one with Delta's and Iceberg's jars
    builder = SparkSession.builder
    # Reads Delta and Iceberg tables too (make test stages the jars); Iceberg's by path, so its
    # catalog entries are left out.
    iceberg_conf = iceberg.session_conf("/nowhere/ns/t")
    conf = merged_conf(delta.session_conf(), {k: iceberg_conf[k] for k in ("spark.jars", "spark.sql.extensions")})
    for k, v in conf.items():
        builder = builder.config(k, v)
    session = (builder.master("local[1]").appName("kdaemon-tests-reader")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session
