"""Exactly-once into a Delta table through the maintenance its users run, end to end on Apache
Kafka: compaction (delta-rs's ``optimize.compact`` and Spark's ``OPTIMIZE``, beside the daemon's
commits), ``VACUUM`` (delta-rs's and Spark's, retaining nothing), checkpoints (delta-rs's and
Spark's), and a table that sets ``delta.setTransactionRetentionDuration``.

One scenario, two daemon runs (each starts an uploader and its JVM: the suite's CPU budget):

1. Records to both partitions of a topic; ``kdaemon run`` (the spark sink, Delta, direct
   writes) delivers them.
2. Records trickle into partition 0; both compactions run beside the daemon's commits.  Then,
   the daemon caught up and idle (nothing in flight: VACUUM retaining nothing would remove a
   job's files before their commit), both VACUUMs and both checkpoints.  The recorded versions
   are checked after each, and ``_kdaemon`` survives VACUUM (a hidden directory to both).
3. The table keeps transactions ``RETENTION_S`` only; partition 1 gets its last record, and
   then a control transaction is committed beside kdaemon's: partition 1's own ``txn`` action
   is no newer than the control's.  Records trickle into partition 0 until Delta (delta-rs) no longer
   reports the control's version: partition 1's would have expired by now, were it not
   carried by every commit of partition 0 (``delta.carried_versions``).  Spark's Delta reads
   the versions too, with its own expiry, and a checkpoint (which leaves out expired ``txn``
   actions) keeps them.
4. The daemon stops (leaving the group); the manifests in ``_kdaemon`` are removed, so that
   only the table's own record of the offsets stands between a replay and a duplicate;
   ``kdaemon offsets --reset-offsets --to-earliest --execute``; the daemon runs again until the
   group's offsets are back at the ends: the table holds every record exactly once.

Without the carried versions partition 1's record expires in step 3 (in delta-rs's reading and
Spark's) and the test fails there; past that check, the replay wrote 161 of partition 1's
records a second time (checked by hand, the carrying turned off).
"""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from kdaemon.sinks.spark.tables import delta, delta_state, layout
from testkit.daemon import wait_for
from testkit.produce import Writer
from testkit.spark import (KEPT_TYPES, Produced, Sent, SparkDaemon, assert_exact, committed, new_topic, produce,
                           read_output, requires_spark, spark_config)
from tests.cli.test_cli_errors_kafka import kdaemon

requires_spark()

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

# Longer than from the daemon's last commit to the replay's first look at the table (a stop,
# the maintenance, a reset and a start: under a minute here, loaded), shorter than a test may wait.
RETENTION_S = 90
CONTROL = "kdaemon-test:control"
DAY_MS = 86_400_000


def _record(i: int, now_ms: int) -> Sent:
    """A kept order (every fifth record a page view the header rule drops), on two dates; no
    repeated header key, so every job is the uploader's direct write."""
    kind = "page.view" if i % 5 == 4 else KEPT_TYPES[i % 2]
    return Sent(f"k{i}".encode(), b'{"n": %d}' % i, (("type", kind.encode()),), now_ms - (i % 2) * DAY_MS)


class Trickle(threading.Thread):
    """Records into one partition (0 unless told), one a second, until stopped (then flushed)."""

    def __init__(self, bootstrap: str, produced: Produced, start: int, partition: int = 0) -> None:
        super().__init__(daemon=True)
        self.writer = Writer(bootstrap, produced.topic, "none", **{"linger.ms": 5})
        self.produced, self.next, self.partition, self.done = produced, start, partition, threading.Event()

    def run(self) -> None:
        while not self.done.wait(1.0):
            self._send()
        assert self.writer.flush(60) == 0 and not self.writer.errors, self.writer.errors

    def send_one(self) -> None:
        """One record (a kept one: ``start`` a multiple of five), delivered."""
        assert _record(self.next, 0).headers[0][1] != b"page.view"
        self._send()
        assert self.writer.flush(60) == 0 and not self.writer.errors, self.writer.errors

    def _send(self) -> None:
        sent = _record(self.next, int(time.time() * 1000))
        self.writer.send(sent.value, sent.key, partition=self.partition, headers=sent.headers,
                         timestamp=sent.timestamp, on_delivered=self._delivered(sent))
        self.writer.poll(0)
        self.next += 1

    def _delivered(self, sent: Sent):
        def record(msg):
            with self.produced._lock:
                self.produced.records[(msg.partition(), msg.offset())] = sent
        return record


def _recorded(out) -> dict[tuple[str, int], int]:
    return delta.committed_offsets(str(out))   # the partitions its manifests name


def _jvm_txns(spark, out) -> dict[str, int]:
    """Spark's Delta's own view of the application versions (a fresh snapshot; its own expiry)."""
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(out))
    none = spark._jvm.scala.Option.empty()
    txns = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(log.update(False, none, none).transactions())
    return {str(k): int(txns.get(k)) for k in txns.keySet() if str(k).startswith("kdaemon:")}


def _jvm_checkpoint(spark, out) -> None:
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(out))
    none = spark._jvm.scala.Option.empty()
    log.checkpoint(log.update(False, none, none), none)


def _trickle(kafka, daemon, produced: Produced, start: int, until, what: str) -> int:
    """Records into partition 0 from offset-numbering ``start`` while ``until()`` is false;
    then every one of them delivered.  The next record number."""
    trickle = Trickle(kafka.bootstrap, produced, start)
    trickle.start()
    try:
        wait_for(until, RETENTION_S + 120, what, daemon.log_tail, interval=1.0)
    finally:
        trickle.done.set()
        trickle.join(90)
    daemon.wait_caught_up(kafka.bootstrap, produced, timeout=120)
    return trickle.next


def test_the_offsets_survive_compaction_vacuum_checkpoints_and_transaction_expiry(kafka, spark, tmp_path):
    from deltalake import CommitProperties, DeltaTable, Transaction
    topic = new_topic(kafka.bootstrap, 2)
    produced = Produced(topic, 2)
    now_ms = int(time.time() * 1000)
    produce(kafka.bootstrap, produced, [_record(i, now_ms) for i in range(400)])
    out, group = tmp_path / "out", f"g-{topic}"
    config = spark_config(tmp_path / "d", kafka.bootstrap, topic, group, out, on_stop="leave_group",
                          sink={"format": "delta", "max_records": 200, "max_age_s": 1})

    def expected() -> dict[tuple[str, int], int]:
        """Each partition's newest offset the header rule keeps: what the table records."""
        newest: dict[tuple[str, int], int] = {}
        for t, p, o in produced.expected():
            newest[(t, p)] = max(newest.get((t, p), -1), o)
        return newest

    def check(after: str) -> None:
        delta_state.forget(str(out))   # read anew, from the newest checkpoint
        assert _recorded(out) == expected(), after
        assert _jvm_txns(spark, out) == {delta.app_id(*k): v for k, v in expected().items()}, after

    with SparkDaemon(tmp_path / "d", config) as daemon:
        daemon.wait_caught_up(kafka.bootstrap, produced, timeout=180)
        check("the first delivery")
        # 2. Compactions beside the daemon's commits; VACUUM and checkpoints once it is idle.
        start = produced.ends()[0]
        compacted = []

        def compact_once() -> bool:
            if _recorded(out)[(topic, 0)] < start:   # (the first trickled record is kept)
                return False   # the trickle's first commit first
            if not compacted:
                compacted.append(DeltaTable(str(out)).optimize.compact())
                spark.sql(f"OPTIMIZE delta.`{out}`")
            return daemon.count("uploaded ") >= 6
        n = _trickle(kafka, daemon, produced, 400, compact_once, "the compactions beside partition 0's trickle")
        n += -n % 5   # a kept record next
        assert compacted[0]["numFilesRemoved"] > 0, compacted
        check("the compactions")
        spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
        try:
            removed = DeltaTable(str(out)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
            assert removed, "the compactions left files for VACUUM"
            spark.sql(f"VACUUM delta.`{out}` RETAIN 0 HOURS")
        finally:
            spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
        assert layout.uploaded_ranges(str(out), topic, 1), "VACUUM removed kdaemon's manifests"
        check("VACUUM")
        DeltaTable(str(out)).create_checkpoint()
        check("delta-rs's checkpoint")
        _jvm_checkpoint(spark, out)
        check("Spark's checkpoint")

        # 3. Transactions expire.  Partition 1's last record, then the control, as old as it.
        DeltaTable(str(out)).alter.set_table_properties({delta.RETENTION: f"interval {RETENTION_S} seconds"})
        last = Trickle(kafka.bootstrap, produced, n, partition=1)
        last.send_one()
        n += 1
        wait_for(lambda: _recorded(out).get((topic, 1)) == expected()[(topic, 1)], 120,
                 "partition 1's last record in the table", daemon.log_tail)
        table = DeltaTable(str(out))
        table.create_write_transaction([], "append", table.schema(), partition_by=table.metadata().partition_columns,
                                       commit_properties=CommitProperties(app_transactions=[
                                           Transaction(CONTROL, 0, int(time.time() * 1000))]))
        assert DeltaTable(str(out)).transaction_version(CONTROL) == 0
        _trickle(kafka, daemon, produced, n, lambda: DeltaTable(str(out)).transaction_version(CONTROL) is None,
                 "the control's transaction to expire")
        check("the retention period")
        DeltaTable(str(out)).create_checkpoint()
        check("a checkpoint past the retention period")
        assert daemon.stop() == 0, daemon.log_tail()
    stopped = time.monotonic()

    # 4. A replay from the earliest offsets adds nothing.
    shutil.rmtree(layout.kdaemon_dir(str(out)) + "/manifests")
    reset = kdaemon("offsets", "-c", str(daemon.config_path), "--reset-offsets", "--to-earliest", "--execute",
                    cwd=daemon.root)
    assert reset.returncode == 0, (reset.stdout, reset.stderr)
    assert {p: offset for p, (offset, _) in committed(kafka.bootstrap, group, topic, 2).items()} == {0: 0, 1: 0}
    with SparkDaemon(tmp_path / "d", config) as again:
        again.wait_caught_up(kafka.bootstrap, produced, timeout=180)
        print(f"the replay caught up {time.monotonic() - stopped:.0f} s after the first run stopped "
              f"(the retention: {RETENTION_S} s)")
        assert again.stop() == 0, again.log_tail()
    assert_exact(read_output(spark, out, "delta"), produced.expected())
    assert delta.committed_offsets(str(out), list(expected())) == expected()
