"""The Spark sink on a real cluster: a standalone master with two workers, and a Spark Connect
server, started from the pyspark distribution (testkit/spark_cluster.py), on Apache Kafka.

Each test produces with confluent-kafka, runs ``kdaemon run`` with the uploader's master set to
``spark://`` or ``sc://``, SIGKILLs the uploader once after its first upload (the supervisor
restarts it; its successor settles what it left), waits until the committed offsets reach the
produced ends, and reads the table back with Spark: every kept record exactly once.

* ``spark://``: a Delta table.  The uploader is the driver; the executors run on the workers,
  with Delta's jars shipped to them by ``spark.jars``.
* ``sc://``: an Iceberg table through a Connect server whose own driver runs on the standalone
  cluster.  The server is started with the Iceberg runtime jar and extensions (a Connect client
  cannot add jars or extensions); the uploader's session sets the catalog, a runtime setting.
"""

from __future__ import annotations

import os
import random
import re
import time

import pytest

from kdaemon.sinks.spark.tables import iceberg, formats
from testkit.spark import (Produced, SparkDaemon, assert_exact, make_record, new_topic, produce,
                                 read_output, requires_spark, spark_config, wait_for)
from testkit.spark_cluster import start_connect, start_standalone

requires_spark()

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

RECORDS = 40_000
# Executors small enough for two workers, an uploader and a Connect server on this machine.
EXECUTOR = {"spark.executor.memory": "512m", "spark.cores.max": "2"}


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    cluster = start_standalone(tmp_path_factory.mktemp("spark-standalone"), workers=2, cores=2)
    yield cluster
    cluster.stop()


def _run(kafka, spark, tmp_path, master: str, fmt: str, conf: dict, out) -> None:
    topic = new_topic(kafka.bootstrap, 4)
    produced = Produced(topic, 4)
    rng = random.Random(16)
    now_ms = int(time.time() * 1000)
    produce(kafka.bootstrap, produced, (make_record(i, rng, now_ms) for i in range(RECORDS)))
    config = spark_config(tmp_path / "d", kafka.bootstrap, topic, f"g-{topic}", out,
                          sink={"master": master, "format": fmt, "max_records": 5000, "conf": conf},
                          log_level=os.environ.get("KD_TEST_LOG_LEVEL", "INFO"))
    daemon = SparkDaemon(tmp_path / "d", config)
    with daemon:
        daemon.wait_log(re.escape("uploaded "), timeout=180)
        assert f"Spark session ready (master {master}" in daemon.log(), daemon.log_tail()
        victim = daemon.uploader()
        victim.kill()
        wait_for(lambda: daemon.count("uploader listening on") >= 2, 120, "the restarted uploader", daemon.log_tail)
        daemon.wait_caught_up(kafka.bootstrap, produced, timeout=300)
        assert daemon.stop() == 0, daemon.log_tail()
    assert "companion spark-uploader exited with code -9" in daemon.log()
    rows = read_output(spark, out, fmt)
    assert_exact(rows, produced.expected())
    recorded = formats.FORMATS[fmt].committed_offsets(str(out))
    newest = {p: max(r["offset"] for r in rows if r["partition"] == p) for p in range(4)}
    for p, end in produced.ends().items():
        assert newest[p] <= recorded[(topic, p)] < end, (p, recorded, newest, end)


def test_standalone_master_delta_exactly_once(kafka, spark, standalone, tmp_path):
    _run(kafka, spark, tmp_path, standalone.master_url, "delta",
         {**EXECUTOR, "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"},
         tmp_path / "table")


def test_spark_connect_iceberg_exactly_once(kafka, spark, standalone, tmp_path):
    out = tmp_path / "lake" / "db" / "events"
    server_conf = {k: v for k, v in iceberg.session_conf(str(out)).items()
                   if k in ("spark.jars", "spark.sql.extensions")}
    server = start_connect(tmp_path / "connect", standalone.master_url, conf={**EXECUTOR, **server_conf})
    try:
        _run(kafka, spark, tmp_path, server.url, "iceberg", {}, out)
    except BaseException:
        print(server.log_tail())
        raise
    finally:
        server.stop()
