"""A Spark the uploader cannot use: the daemon says why (once), commits nothing, does not run
ahead or read anything twice while it waits, and delivers exactly once after the configuration
is fixed and reloaded (SIGHUP).

On Apache Kafka: the reload restarts each worker, a static group member, and on Tansu a static
member restarted after the group's first rebalance can wedge the group (its SyncGroup gets
REBALANCE_IN_PROGRESS forever while the other member's heartbeats succeed; the stop-26 CI run).
"""

from __future__ import annotations

import random
import re
import signal
import time

import pytest

from testkit.spark import (Produced, SizeSampler, SparkDaemon, assert_exact, committed, make_record,
                                 new_topic, produce, read_output, requires_spark, spark_config)

requires_spark()

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

BAD_MASTER = "spark://127.0.0.1:1"
STAGING_LIMIT = 16 * 1024 * 1024   # one staged batch of 5,000 records per worker is well under 1 MB


def test_bad_master_commits_nothing_then_reload_delivers_exactly_once(kafka, spark, tmp_path):
    topic = new_topic(kafka.bootstrap, 4)
    produced = Produced(topic, 4)
    now_ms = int(time.time() * 1000)
    rng = random.Random(5)
    produce(kafka.bootstrap, produced, [make_record(i, rng, now_ms) for i in range(30_000)])
    out = tmp_path / "out"
    group = f"g-{topic}"
    config = spark_config(tmp_path / "d", kafka.bootstrap, topic, group, out,
                          sink={"master": BAD_MASTER, "max_records": 5000, "max_age_s": 1})
    daemon = SparkDaemon(tmp_path / "d", config)
    staging = SizeSampler(daemon.state_dir / "spark-staging")
    with daemon:
        staging.start()
        daemon.wait_log(re.escape(f"the Spark master {BAD_MASTER} is not reachable"), timeout=60)
        # Each worker stages its first batch, cannot hand it over (the uploader waits for the
        # master without a socket), says so once, pauses and probes: nothing is committed,
        # nothing read or staged again, nothing piles up.
        daemon.wait_log(re.escape("sink unavailable (the Spark uploader is not reachable"), timeout=60)
        observed_until = time.monotonic() + 8
        while time.monotonic() < observed_until:
            # -1, or 0: a worker may pin its starting position (the reset to earliest) as Java's
            # consumer does, which says nothing was consumed.  Anything above it is a loss.
            offsets = committed(kafka.bootstrap, group, topic, 4)
            assert all(off <= 0 for off, _ in offsets.values()), \
                f"something was committed although nothing can be uploaded: {offsets}"
            time.sleep(1)
        log = daemon.log()
        assert "kdaemon.spark.uploader: uploaded" not in log
        assert "rewinding to the last commit" not in log          # the staged batch is kept
        assert log.count("the uploader cannot start") == 0        # it waits, it is not restarted
        assert log.count(f"the Spark master {BAD_MASTER} is not reachable") == 1

        config["sink"]["master"] = "local[2]"
        daemon.write_config(config)
        daemon.signal(signal.SIGHUP)
        daemon.wait_log(re.escape("uploader listening on"), timeout=90)
        daemon.wait_caught_up(kafka.bootstrap, produced, timeout=120)
        assert daemon.stop() == 0, daemon.log_tail()
    peak = staging.stop()

    log = daemon.log()
    error_line = next(l for l in log.splitlines() if "is not reachable" in l and "kdaemon.spark.uploader" in l)
    assert "fix [sink] master and reload (SIGHUP)" in error_line
    workers = config["daemon"]["workers"]
    # Once per worker process: those before the reload, and those it started, which may find the
    # restarting uploader not listening yet.
    assert 1 <= log.count("sink unavailable (") <= 2 * workers, log.count("sink unavailable (")
    # A worker the reload's roll stopped while it waited never saw the sink back: at least one did.
    assert 1 <= log.count("sink available again after") <= log.count("sink unavailable (")
    assert peak < STAGING_LIMIT, f"staging grew to {peak} bytes"
    assert_exact(read_output(spark, out), produced.expected())
