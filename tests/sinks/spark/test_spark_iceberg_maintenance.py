"""Exactly-once through the maintenance users run on an Iceberg table, by a real replay.

Records from a producer to Apache Kafka; ``kdaemon run`` (spark sink, ``format = "iceberg"``,
direct writes) delivers them; Spark's Iceberg procedures compact the table
(``rewrite_data_files``) and expire every snapshot but the newest (``expire_snapshots(
retain_last => 1)``), which is compaction's and records no offsets; ``kdaemon offsets
--reset-offsets --to-earliest --execute`` rewinds the group; the daemon runs again and the
table still holds every record exactly once.

Before the replay the uploader's own manifests (``<table>/_kdaemon/manifests``) are removed:
they cover every uploaded batch as well, and with them the replay drops every record whatever
the table records.  Without them the table's own record of its offsets is all that stands
between the replay and a second copy of every record, which is what this test is about (a
table restored or copied without ``_kdaemon``, an upload killed between its commit and its
manifest and then maintained: ``formats.committed`` settles it by the table alone).  Before
the offsets were also table properties (``iceberg_meta.py``), the replay wrote every record a
second time.
"""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import replace

import pytest

from kdaemon.sinks.spark.tables import iceberg_meta, layout
from testkit.spark import (Produced, SparkDaemon, assert_exact, committed, make_record, new_topic, produce,
                           read_output, requires_spark, spark_config)

requires_spark()

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 2
ROUNDS = 4


def _kdaemon(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


def _maintain(spark, table) -> list[dict]:
    """Compaction, then expiry down to one snapshot, through Spark's Iceberg procedures on a
    Hadoop catalog of the table's warehouse (a name of this test's own: the session is shared);
    the snapshots left."""
    name = f"maint_{uuid.uuid4().hex[:8]}"
    warehouse = table.parent.parent
    spark.conf.set(f"spark.sql.catalog.{name}", "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set(f"spark.sql.catalog.{name}.type", "hadoop")
    spark.conf.set(f"spark.sql.catalog.{name}.warehouse", str(warehouse))
    ident = f"{table.parent.name}.{table.name}"
    spark.sql(f"CALL {name}.system.rewrite_data_files(table => '{ident}', options => map('rewrite-all', 'true'))")
    spark.sql(f"CALL {name}.system.expire_snapshots(table => '{ident}', "
              f"older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    return [r.asDict() for r in spark.sql(f"SELECT operation, summary FROM {name}.{ident}.snapshots").collect()]


def test_a_replay_after_compaction_and_expiry_adds_nothing(kafka, spark, tmp_path):
    topic = new_topic(kafka.bootstrap, PARTITIONS)
    produced = Produced(topic, PARTITIONS)
    rng = random.Random(34)
    now_ms = int(time.time() * 1000)
    table = tmp_path / "lake" / "db" / "events"
    group = f"g-{topic}"
    # A stop leaves the group, so the reset goes through at once.
    config = spark_config(tmp_path / "d", kafka.bootstrap, topic, group, table, on_stop="leave_group",
                          sink={"format": "iceberg", "value_format": "string"})
    daemon = SparkDaemon(tmp_path / "d", config)
    with daemon:
        for n in range(ROUNDS):   # a job or more each: snapshots and files to compact
            # Records the uploader writes itself (direct writes, the default path): no header key twice.
            records = [make_record(i, rng, now_ms) for i in range(n * 2000, n * 2000 + 2000)]
            produce(kafka.bootstrap, produced, [replace(r, headers=tuple(h for h in r.headers if h[0] != "dup"))
                                                for r in records])
            daemon.wait_caught_up(kafka.bootstrap, produced, timeout=120)
        assert daemon.stop() == 0, daemon.log_tail()
    assert daemon.count("uploaded ") >= ROUNDS
    expected = produced.expected()
    recorded = iceberg_meta.committed_offsets(str(table))   # each partition's last uploaded batch's end
    assert sorted(recorded) == [(topic, p) for p in range(PARTITIONS)]

    snapshots = _maintain(spark, table)
    assert [s["operation"] for s in snapshots] == ["replace"], snapshots
    assert iceberg_meta.SUMMARY_KEY not in snapshots[0]["summary"]
    assert_exact(read_output(spark, table, "iceberg"), expected)

    shutil.rmtree(table / "_kdaemon" / "manifests")
    assert layout.uploaded_ranges(str(table), topic, 0) == []
    reset = _kdaemon("offsets", "-c", str(daemon.config_path), "--reset-offsets", "--to-earliest", "--execute",
                     cwd=daemon.root)
    assert reset.returncode == 0, (reset.stdout, reset.stderr)
    assert {p: o for p, (o, _) in committed(kafka.bootstrap, group, topic, PARTITIONS).items()} == \
        {p: 0 for p in range(PARTITIONS)}

    mark = len(daemon.log())
    with daemon:
        daemon.wait_caught_up(kafka.bootstrap, produced, timeout=120)
        assert daemon.stop() == 0, daemon.log_tail()
    assert_exact(read_output(spark, table, "iceberg"), expected)
    # The table still records where every partition is (its properties came through the
    # maintenance); what was read again (a partition read before the uploader could say where
    # the output ends) was dropped whole.
    assert iceberg_meta.committed_offsets(str(table)) == recorded
    uploads = re.findall(r"uploaded \d+ batch\(es\), \d+ rows \((\d+) new\)", daemon.log()[mark:])
    assert set(uploads) <= {"0"}, daemon.log_tail()
