"""The Kafka DLQ's failures on Apache Kafka 4.4 (the shared ``kafka`` fixture, which does not
create topics on its own): what no retry changes stops the daemon and says so once, what passes
is retried quietly and delivered.

* A DLQ topic that does not exist: ``check-config`` names it with the command that creates it;
  ``kdaemon run`` refuses before any worker joins the group, exit 6, one line.
* A topic deleted while the daemon runs: the next dead letter stops it (exit 6), the group's
  commit stays at that record.
* Records too large for their topic (``max.message.bytes``): the sink's (``[sink] type =
  "kafka"``) go to the DLQ under ``on_sink_error = "dlq"``; a dead letter too large for the DLQ
  topic can be kept nowhere, so the worker stops at it (exit 3) with everything before it
  committed.
* The DLQ's broker unreachable for a while (a proxy that drops every connection at its first
  request): one WARNING when it starts, one INFO when it is over, nothing in between; then the
  dead letter is in the topic and the group committed past it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kdaemon.exit_codes import EXIT_CONFIG, EXIT_SINK_REFUSED, EXIT_STOPPED_ON_ERROR
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.kafka_capture import KafkaCapture
from testkit.produce import committed_offsets, create_topic, produce
from tests.client.readback import read_topic

# Now, as a producer stamps them: records years old (a fixed 2023 stamp, before) are deleted by
# the shared broker's time-based retention (7 days by default) at its next check, the active
# segment included, and a test that read them back found nothing (a source read from offset 5
# was reset to 10; the dead letter it had delivered was gone).
BASE_TS = int(time.time() * 1000)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def config_for(root: Path, kafka, source: str, group: str, dlq: dict, **daemon) -> dict:
    config = daemon_config(root, kafka.bootstrap, source, group, workers=1, on_deserialize_error="dlq", **daemon)
    config["plugins"] = ["json"]
    config["deserializer"] = {"key": "str", "value": "json"}
    config["dlq"] = {"type": "kafka", "timeout_ms": 3_000, **dlq}
    return config


def good(i: int) -> tuple:
    return (b"k%d" % i, json.dumps({"id": i}).encode(), (("seq", str(i).encode()),), BASE_TS + i)


def bad(i: int) -> tuple:
    return (b"k%d" % i, b"not json {%d" % i, (("seq", str(i).encode()),), BASE_TS + i)


def committed(kafka, group: str, topic: str) -> int:
    return committed_offsets(kafka.bootstrap, group, topic, 1)[0]


def worker_lines(d: Daemon, after: int = 0) -> list[str]:
    return [line for line in d.log()[after:].splitlines() if " worker-0 " in line]


def test_a_missing_dlq_topic_is_refused_by_check_config_and_before_consuming(kafka, tmp_path):
    source, dlq, group = name("src"), name("no-dlq"), name("g")
    create_topic(kafka.bootstrap, source, 1)
    produce(kafka.bootstrap, source, [good(0), bad(1)])
    d = Daemon(tmp_path, config_for(tmp_path, kafka, source, group, {"topic": dlq}))
    proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(d.config_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert proc.stderr.splitlines() == [
        f"{d.config_path}: dlq: dead-letter topic {dlq}: topic {dlq} does not exist on the cluster at "
        f"{kafka.bootstrap} (to fix: create it: kafka-topics --bootstrap-server {kafka.bootstrap} --create "
        f"--topic {dlq} --partitions <n> --replication-factor <n> (kdaemon's producer never creates topics); "
        f"or let the sink create it: create_topic = true in [dlq])"]
    with d:
        assert d.wait_exit(60) == EXIT_SINK_REFUSED, d.log_tail()
        log = d.log()
    refused = [line for line in log.splitlines() if "refused for good" in line and " worker-0 " in line]
    assert len(refused) == 1 and f"topic {dlq} does not exist" in refused[0] and "kafka-topics" in refused[0], log
    assert "has its assignment" not in log and "joined generation" not in log, log   # never in the group
    assert committed(kafka, group, source) < 0                                       # nothing committed
    assert "supervisor exiting with code 6" in log


def test_a_dlq_topic_deleted_while_running_stops_the_daemon_at_the_dead_letter(kafka, tmp_path):
    source, dlq, group = name("src"), name("dlq"), name("g")
    create_topic(kafka.bootstrap, source, 1)
    create_topic(kafka.bootstrap, dlq, 1)
    produce(kafka.bootstrap, source, [good(i) if i != 5 else bad(i) for i in range(10)])
    with Daemon(tmp_path, config_for(tmp_path, kafka, source, group, {"topic": dlq})) as d:
        wait_for(lambda: committed(kafka, group, source) == 10, 60, "the first ten committed", d.log_tail)
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        admin.delete_topics([dlq])[dlq].result(30)
        wait_for(lambda: dlq not in admin.list_topics(timeout=10).topics, 30, f"{dlq} gone")
        produce(kafka.bootstrap, source, [bad(10), good(11), good(12)])
        assert d.wait_exit(90) == EXIT_SINK_REFUSED, d.log_tail()
        lines = worker_lines(d)
    assert committed(kafka, group, source) == 10                 # nothing past the undelivered dead letter
    refused = [line for line in lines if "refused for good" in line]
    assert len(refused) == 1 and f"topic {dlq} does not exist" in refused[0], lines[-20:]
    # The producer's metadata still had the topic (a dead letter went there before): its
    # Produce requests were refused, and the Metadata answer that followed decided, not a timeout.
    assert not [line for line in lines if "sink unavailable" in line], lines[-20:]


def test_records_too_large_for_their_topic_follow_the_policy(kafka, tmp_path):
    """The sink is a Kafka topic taking records of at most 4 KiB, the DLQ one of 16 KiB.  Record 10
    (6 KB) is refused by the sink and dead-lettered (on_sink_error = "dlq"); record 20 (20 KB) is
    refused by both: the worker stops at it, everything before it committed."""
    source, out, dlq, group = name("src"), name("out"), name("dlq"), name("g")
    create_topic(kafka.bootstrap, source, 1)
    create_topic(kafka.bootstrap, out, 1, config={"max.message.bytes": "4096"})
    create_topic(kafka.bootstrap, dlq, 1, config={"max.message.bytes": "16384"})
    size = {10: 6_000, 20: 20_000}
    produce(kafka.bootstrap, source, [(b"k%d" % i, b"v" * size.get(i, 50), (("seq", str(i).encode()),),
                                       BASE_TS + i) for i in range(30)])
    config = config_for(tmp_path, kafka, source, group, {"topic": dlq}, on_sink_error="dlq")
    config["deserializer"] = {"key": "bytes", "value": "bytes"}
    config["sink"] = {"type": "kafka", "topic": out, "timeout_ms": 3_000}
    with Daemon(tmp_path, config) as d:
        assert d.wait_exit(90) == EXIT_STOPPED_ON_ERROR, d.log_tail()
        lines = worker_lines(d)
    assert committed(kafka, group, source) == 20
    stop = [line for line in lines if "worker stopping" in line]
    assert len(stop) == 1 and f"the DLQ refused 1 dead letter(s) for good ({source}-0@20)" in stop[0], lines[-20:]
    assert "MESSAGE_TOO_LARGE" in stop[0] and "max.message.bytes" in stop[0]
    (dead,) = read_topic(kafka.bootstrap, dlq, 1).values()
    assert [(dict(r.headers)["__connect.errors.offset"], dict(r.headers)["kdaemon.stage"]) for r in dead] == \
        [(b"10", b"sink")]
    (written,) = read_topic(kafka.bootstrap, out, 1).values()
    seqs = {int(dict(r.headers)["seq"]) for r in written}
    assert set(range(20)) - {10} <= seqs and not seqs & {10, 20}


class Outage(KafkaCapture):
    """A proxy in front of the broker that, while ``down``, drops each connection at its first
    request: the DLQ's broker unreachable.  ``dropped`` counts them."""

    def __init__(self, upstreams) -> None:
        self.down = False
        self.dropped = 0
        super().__init__(upstreams)

    def _on_request(self, conn: int, frame: bytes) -> bytes:
        if self.down:
            self.dropped += 1
            raise OSError("the DLQ's broker is unreachable (the test's outage)")
        return super()._on_request(conn, frame)


def sink_errors(d: Daemon) -> float:
    return sum(v for (metric, _), v in d.metrics().items() if metric == "kdaemon_sink_errors_total")


def test_an_unreachable_dlq_is_retried_said_once_then_delivered(kafka, tmp_path):
    source, dlq, group = name("src"), name("dlq"), name("g")
    create_topic(kafka.bootstrap, source, 1)
    create_topic(kafka.bootstrap, dlq, 1)
    produce(kafka.bootstrap, source, [good(i) for i in range(5)])
    with Outage([(kafka.host, kafka.port)]) as proxy:
        config = config_for(tmp_path, kafka, source, group, {"topic": dlq, "bootstrap_servers": proxy.bootstrap,
                                                             "timeout_ms": 1_500}, metrics_interval_ms=200)
        with Daemon(tmp_path, config) as d:
            wait_for(lambda: committed(kafka, group, source) == 5, 60, "the first five committed", d.log_tail)
            proxy.down = True
            start = len(d.log())
            produce(kafka.bootstrap, source, [bad(5)] + [good(i) for i in range(6, 10)])
            d.wait_log(r"worker-0 kdaemon\.worker\.delivery: sink unavailable \(flush failed", 60, after=start)
            # Retried with backoff: each attempt rebuilds the sinks, reads the records again and
            # flushes; three that failed (kdaemon_sink_errors_total counts them).
            wait_for(lambda: sink_errors(d) >= 3, 90, "three failed attempts", d.log_tail, interval=0.5)
            assert committed(kafka, group, source) == 5 and proxy.dropped
            proxy.down = False
            wait_for(lambda: committed(kafka, group, source) == 10, 60, "the rest committed", d.log_tail)
            d.wait_log(r"worker-0 kdaemon\.worker\.delivery: sink available again after", 30, after=start)
            assert d.stop(60) == 0, d.log_tail()
            lines = worker_lines(d, start)
    loud = [line for line in lines if re.search(r" (WARNING|ERROR) ", line)
            and "sink still unavailable after" not in line]   # the minute's reminder, if it lasted that long
    assert len(loud) == 1 and "sink unavailable (flush failed: KafkaTimeoutError" in loud[0], loud
    assert sum("sink available again after" in line for line in lines) == 1
    (dead,) = read_topic(kafka.bootstrap, dlq, 1).values()
    assert [dict(r.headers)["__connect.errors.offset"] for r in dead] == [b"5"]
