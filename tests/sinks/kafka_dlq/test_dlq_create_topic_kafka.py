"""``[dlq] type = "kafka"`` with ``create_topic = true`` on Apache Kafka 4.4 (the shared ``kafka``
fixture, which does not create topics on its own): ``check-config`` has the cluster validate the
creation and creates nothing; the worker creates the topic with the partitions asked for before
it consumes, and the dead letter is in it; a creation the cluster refuses (more replicas than its
one broker) is named by check-config, and the daemon stops before consuming (exit 6) saying why.
"""

from __future__ import annotations

import subprocess
import sys

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.lookup import topic_partitions
from kdaemon.exit_codes import EXIT_CONFIG, EXIT_SINK_REFUSED
from testkit.daemon import Daemon, wait_for
from testkit.produce import create_topic, produce
from tests.client.readback import read_topic
from tests.sinks.kafka_dlq.test_dlq_refusals_kafka import bad, committed, config_for, good, name


def partitions_of(kafka, topic: str) -> set[int] | None:
    config = ConsumerConfig.from_options(bootstrap_servers=kafka.bootstrap)
    return topic_partitions(config, [topic], timeout_ms=10_000)[topic]


def check_config(d: Daemon) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(d.config_path)],
                          capture_output=True, text=True, timeout=60)


def test_a_missing_dlq_topic_is_created_when_asked(kafka, tmp_path):
    source, dlq, group = name("src"), name("new-dlq"), name("g")
    create_topic(kafka.bootstrap, source, 1)
    produce(kafka.bootstrap, source, [good(0), bad(1), good(2)])
    d = Daemon(tmp_path, config_for(tmp_path, kafka, source, group,
                                    {"topic": dlq, "create_topic": True, "partitions": 2, "replication_factor": 1}))
    proc = check_config(d)
    assert proc.returncode == 0, proc.stderr
    assert partitions_of(kafka, dlq) is None          # validated only
    with d:
        wait_for(lambda: committed(kafka, group, source) == 3, 60, "all three committed", d.log_tail)
    assert partitions_of(kafka, dlq) == {0, 1}
    dead = [r for records in read_topic(kafka.bootstrap, dlq, 2).values() for r in records]
    assert [r.value for r in dead] == [b"not json {1"], dead


def test_a_creation_the_cluster_refuses_is_named(kafka, tmp_path):
    source, dlq, group = name("src"), name("rf3-dlq"), name("g")
    create_topic(kafka.bootstrap, source, 1)
    produce(kafka.bootstrap, source, [good(0), bad(1)])
    d = Daemon(tmp_path, config_for(tmp_path, kafka, source, group,
                                    {"topic": dlq, "create_topic": True, "replication_factor": 3}))
    proc = check_config(d)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"dead-letter topic {dlq} does not exist and cannot be created" in line and \
        "INVALID_REPLICATION_FACTOR" in line and "as many replicas as the cluster has brokers" in line, line
    with d:
        assert d.wait_exit(60) == EXIT_SINK_REFUSED, d.log_tail()
        log = d.log()
    assert "INVALID_REPLICATION_FACTOR" in log and "joined generation" not in log, log
    assert committed(kafka, group, source) < 0 and partitions_of(kafka, dlq) is None
