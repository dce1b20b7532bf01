"""Fixtures of the Spark sink tests: a SparkSession (local mode) to read the output back.

Each test module skips itself, not fails, without PySpark or a Java runtime
(``support.requires_spark``): the spark extra is optional (``pip install -e '.[spark]'``).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    """A reader session, separate from the daemons' uploaders (they own their own JVMs)."""
    import os
    from pyspark.sql import SparkSession
    from kdaemon.sinks.spark import delta
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # only loopback, whatever the host name says
    builder = SparkSession.builder
    for k, v in delta.session_conf().items():   # reads Delta tables too (make test stages the jars)
        builder = builder.config(k, v)
    session = (builder.master("local[1]").appName("kdaemon-tests-reader")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
