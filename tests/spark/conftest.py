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
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from kdaemon.sinks.spark import delta
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # only loopback, whatever the host name says
    # Only a JVM's launch puts spark.jars on the driver's classpath: a JVM another suite started
    # earlier in this process (the chaos run's reader, stopped since) cannot load Delta, so it
    # is shut down and the session below launches its own.
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._gateway is not None:
        SparkContext._gateway.shutdown()
        SparkContext._gateway = None
        SparkContext._jvm = None
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
