"""A supervisor's death takes its children with it (issue #36): the Spark sink's case, on
Apache Kafka.

``kdaemon run`` with the Spark sink was SIGKILLed: the uploader (a companion, started by the
supervisor as a fresh interpreter), both workers and the uploader's Spark JVM were all alive
seconds later.  Now the workers stop as in test_supervisor_death_kafka.py, the uploader gets its
own stop signal (it finishes the job under way and stops its JVM), and the JVM, the uploader's
child, goes with it.  Nothing is committed that is not in the output, and the daemon started
again gets its assignment without fighting a leftover member.

The one Spark test of the issue (a JVM start is expensive); it runs in the Spark lane.  The
output is read with pyarrow, without a reader session.
"""

from __future__ import annotations

import re
import signal
import threading
import time
import uuid

import pytest

from testkit.daemon import wait_for, wait_gone
from testkit.spark import Produced, Sent, SparkDaemon, committed, new_topic, produce, requires_spark, spark_config

requires_spark()

pytestmark = pytest.mark.spark   # the Spark lane, though no reader session is needed

PARTITIONS = 2


def kept(i: int, now_ms: int) -> Sent:
    """A record the tests' header rule keeps: every offset is in the output once uploaded."""
    return Sent(f"k{i}".encode(), f'{{"id": {i}}}'.encode(), (("type", b"order.created"),), now_ms)


def output_rows(out) -> list[dict]:
    import pyarrow.dataset as ds
    table = ds.dataset(str(out), format="parquet", partitioning="hive").to_table(
        columns=["topic", "partition", "offset"])
    return table.to_pylist()


def test_a_killed_supervisors_uploader_jvm_and_workers_exit_committing_only_what_was_uploaded(kafka, tmp_path):
    bootstrap = kafka.bootstrap
    topic = new_topic(bootstrap, PARTITIONS)
    produced = Produced(topic, PARTITIONS)
    out = tmp_path / "out"
    group = f"g-{uuid.uuid4().hex[:8]}"
    # Path mode: every job goes through Spark, so the JVM is up once a batch is uploaded.
    config = spark_config(tmp_path / "d", bootstrap, topic, group, out, sink={"max_age_s": 1})
    now_ms = int(time.time() * 1000)
    stop_producing = threading.Event()
    producer = threading.Thread(target=produce, args=(bootstrap, produced, (kept(i, now_ms) for i in range(200_000))),
                                kwargs={"rate": 500, "stop": stop_producing}, daemon=True)
    with SparkDaemon(tmp_path / "d", config) as d:
        producer.start()
        d.wait_log(r"uploaded \d+ batch", timeout=120)
        wait_for(lambda: any(c > 0 for c, _ in committed(bootstrap, group, topic, PARTITIONS).values()), 60,
                 "a first commit", d.log_tail, interval=0.5)   # records keep coming meanwhile
        family = d.descendants()
        names = [" ".join(p.cmdline()) for p in family]
        assert sum("kdaemon.sinks.spark.uploader.process" in n for n in names) == 1, names
        assert any(p.name() == "java" for p in family), names     # the uploader's Spark JVM
        assert len(family) == 4, names                            # and two workers
        d.signal(signal.SIGKILL)
        d.wait_exit(10)
        wait_gone(family, 90, "the workers, the uploader and its JVM to exit after the supervisor was killed",
                  d.log_tail)
        log = d.log()
        said = re.findall(rf"(worker-\d|spark-uploader) \S+: supervisor \(pid {d.pid}\) is gone: stopping", log)
        assert sorted(said) == ["spark-uploader", "worker-0", "worker-1"], d.log_tail()
        stop_producing.set()
        producer.join(60)
        assert not producer.is_alive()
        # Committed offsets never run ahead of the output.
        rows = output_rows(out)
        stored = {(r["partition"], r["offset"]) for r in rows if r["topic"] == topic}
        commits = committed(bootstrap, group, topic, PARTITIONS)
        for p, (c, _) in commits.items():
            missing = [o for o in range(max(c, 0)) if (p, o) not in stored]
            assert not missing, f"partition {p} committed at {c}, offsets not in the output: {missing[:10]}"
        first_pid, mark = d.pid, len(log)

    # Started again at once: every worker gets its assignment, no leftover member to fight.  (Not
    # run to the end: its uploader's JVM would cost another start; the teardown kills it.)
    with SparkDaemon(tmp_path / "d", config) as again:
        again.wait_all_ready(60, after=mark)
        after = again.log()[mark:]
        assert not re.search(r"FENCED_INSTANCE_ID|UNRELEASED_INSTANCE_ID|[Ff]enced", after), again.log_tail()
        assert f"supervisor (pid {first_pid})" not in after
