"""Chaos: kill -9 the uploader and workers of a running daemon while records keep coming; the
Spark output must still hold every kept record exactly once.

What each kill exercises:
* the uploader dies mid-job: workers' flushes fail (nothing committed), they rewind; files it
  had moved without a manifest are removed by the next upload of that partition (pending
  records); the supervisor restarts it with backoff;
* a worker dies after its upload was confirmed but before its commit: its successor reads the
  records again, and the uploader drops the rows that manifests already cover.
"""

from __future__ import annotations

import random
import re
import threading
import time

import psutil
import pytest

from testkit.spark import (Produced, SizeSampler, SparkDaemon, assert_exact, make_record, new_topic,
                                 produce, read_output, requires_spark, spark_config, wait_for)

requires_spark()

pytestmark = [pytest.mark.spark, pytest.mark.broker, pytest.mark.slow]

SEED = 20261122
RECORDS = 200_000
RATE = 8_000                      # records/s produced during the run
STAGING_LIMIT = 64 * 1024 * 1024  # two workers' staged batches of 20,000 records are ~2-3 MB each


@pytest.mark.parametrize("fmt", ["parquet", "delta", "iceberg"])
def test_kill_uploader_and_workers_loses_and_duplicates_nothing(broker, spark, tmp_path, fmt):
    rng = random.Random(SEED)
    topic = new_topic(broker.bootstrap, 4)
    produced = Produced(topic, 4)
    out = tmp_path / "lake" / "db" / "events" if fmt == "iceberg" else tmp_path / "out"   # <warehouse>/<ns>/<table>
    # Static assignment (each worker index owns a fixed half of the partitions, commits still go
    # to the group): on Tansu, a static group member killed and restarted after the group's
    # first rebalance wedges the group (its SyncGroup gets REBALANCE_IN_PROGRESS forever while
    # the other member's heartbeats succeed; reproduced with two bare kdaemon consumers, no
    # sink).  Group rebalances with this sink are covered by the two-daemon test.
    config = spark_config(tmp_path / "d", broker.bootstrap, topic, f"g-{topic}", out, assignment="static",
                          sink={"max_records": 20000, "max_age_s": 2, "format": fmt})
    daemon = SparkDaemon(tmp_path / "d", config)
    staging = SizeSampler(daemon.state_dir / "spark-staging")
    now_ms = int(time.time() * 1000)
    records = [make_record(i, random.Random(i), now_ms) for i in range(RECORDS)]
    producer = threading.Thread(target=produce, args=(broker.bootstrap, produced, records),
                                kwargs={"rate": RATE}, daemon=True)
    kills: list[tuple[float, str, int]] = []
    orphans: list[psutil.Process] = []   # the JVMs of killed uploaders
    with daemon:
        staging.start()
        producer.start()
        daemon.wait_log(re.escape("uploaded "), timeout=240)   # a deadline: 90 s ran out on a loaded machine
        started = time.monotonic()
        plan = ["uploader"] * 3 + ["worker"] * 3
        rng.shuffle(plan)
        for kind in plan:
            time.sleep(rng.uniform(0.5, 3.0))
            if kind == "uploader":
                # Kill a serving uploader (one that is still starting Spark is a weaker test):
                # wait until every start so far has logged "listening", then a little more.
                wait_for(lambda: daemon.uploader() is not None and
                         daemon.count("uploader listening on") >= daemon.count("started companion spark-uploader"),
                         60, "the restarted uploader to serve", daemon.log_tail)
                time.sleep(rng.uniform(0.0, 1.5))
                victim = daemon.uploader()
                orphans += victim.children(recursive=True)
            else:
                victim = rng.choice(wait_for(daemon.worker_processes, 30, "a running worker", daemon.log_tail))
            victim.kill()
            kills.append((round(time.monotonic() - started, 1), kind, victim.pid))
        producer.join(120)
        assert not producer.is_alive(), "the producer did not finish"
        assert len(produced) == RECORDS
        daemon.wait_caught_up(broker.bootstrap, produced, timeout=180)
        assert daemon.stop() == 0, daemon.log_tail()
    peak = staging.stop()

    log = daemon.log()
    print(f"kills (s after the first upload, kind, pid): {kills}")
    print(f"staging peak {peak / 1e6:.1f} MB over {staging.samples} samples; "
          f"interrupted uploads cleaned: {log.count('an upload that did not finish')}; "
          f"rewinds: {log.count('rewinding to the last commit')}")
    assert log.count("companion spark-uploader exited with code -9") == 3, daemon.log_tail()
    assert sum(f"(pid {pid}) exited with code -9" in log for _, kind, pid in kills if kind == "worker") == 3

    rows = read_output(spark, out, fmt)
    assert_exact(rows, produced.expected())
    if fmt != "parquet":
        # The table records each partition's newest offset it holds (a batch may end in records
        # the header rule dropped: at most the partition's end).
        from kdaemon.sinks.spark.tables import formats
        recorded = formats.FORMATS[fmt].committed_offsets(str(out))
        newest = {p: max(r["offset"] for r in rows if r["partition"] == p) for p in range(4)}
        for p, end in produced.ends().items():
            assert newest[p] <= recorded.get((topic, p), -1) < end, (p, recorded, newest, end)
        print(f"{fmt}: recorded {recorded}; recovered commits: {log.count('its manifest is written now')}")
    assert peak < STAGING_LIMIT, f"staging grew to {peak} bytes"
    # A killed uploader's JVM follows it (it exits when its stdin, the dead uploader's pipe, closes).
    wait_for(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in orphans), 30,
             "the killed uploaders' JVMs to exit")
