"""Every failure visible (issue #19), on Apache Kafka: the cases that used to be silence each give
a WARNING naming the cause and the setting to look at within 10 s of the daemon's start, a
``kdaemon_worker_problems{condition}`` gauge, and a STATUS= line — and the INFO when it is over.

* no broker answers at ``bootstrap_servers``;
* a configured topic does not exist (then is created: the warning ends);
* more workers than partitions: a worker left without any;
* a group join that does not complete: a kafka-python member that joined and stopped polling
  holds the classic group's rebalance for its ``max_poll_interval_ms``.
"""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest

from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.notify_socket import NotifySocket
from testkit.produce import create_topic

pytestmark = pytest.mark.kafka

WITHIN_S = 10.0


def _started_at(d: Daemon) -> float:
    """When the supervisor logged its start (from the log's own clock)."""
    return _stamp(re.search(r"^(\S+ \S+) INFO MainProcess kdaemon\.supervisor: kdaemon supervisor", d.log(), re.M)[1])


def _stamp(text: str) -> float:
    t = time.strptime(text.split(",")[0], "%Y-%m-%d %H:%M:%S")
    return time.mktime(t) + int(text.split(",")[1]) / 1000


def _warned(d: Daemon, pattern: str, timeout: float = 30) -> float:
    """Seconds from the supervisor's start to the first WARNING matching ``pattern``."""
    m = d.wait_log(rf"(?m)^(\S+ \S+) WARNING worker-\d \S+: {pattern}", timeout)
    return _stamp(m[1]) - _started_at(d)


def _gauge(d: Daemon, condition: str) -> float:
    return sum(v for (name, labels), v in d.metrics().items()
               if name == "kdaemon_worker_problems" and dict(labels).get("condition") == condition)


def _run(tmp_path, config, name: str):
    address = str(tmp_path / f"{name}.sock")
    sock = NotifySocket(address)
    d = Daemon(tmp_path / name, config, env={"NOTIFY_SOCKET": address})
    return sock, d


def test_an_unreachable_broker(tmp_path):
    config = daemon_config(tmp_path / "unreachable", "127.0.0.1:1", "t", "g", workers=1)
    sock, d = _run(tmp_path, config, "unreachable")
    with sock, d:
        took = _warned(d, r"worker 0: no broker of 127\.0\.0\.1:1 answered ApiVersions within 5 s \(last error: "
                          r".*ECONNREFUSED\); check \[kafka\] bootstrap_servers")
        assert took <= WITHIN_S, (took, d.log_tail())
        sock.wait_for(lambda n: "broker unreachable on 1 worker(s)" in n.message, 15, "STATUS= saying so")
        wait_for(lambda: _gauge(d, "broker_unreachable") == 1, 10, "kdaemon_worker_problems{broker_unreachable}",
                 d.log_tail)


def test_a_missing_topic_then_created(kafka, tmp_path):
    topic = f"later-{uuid.uuid4().hex[:8]}"
    config = daemon_config(tmp_path / "missing", kafka.bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", workers=1)
    sock, d = _run(tmp_path, config, "missing")
    with sock, d:
        took = _warned(d, rf"worker: topic\(s\) {topic} do not exist for [\d.]+s; check \[daemon\] topics")
        assert took <= WITHIN_S, (took, d.log_tail())
        sock.wait_for(lambda n: "topic missing on 1 worker(s)" in n.message, 15, "STATUS= saying so")
        wait_for(lambda: _gauge(d, "topic_missing") == 1, 10, "kdaemon_worker_problems{topic_missing}", d.log_tail)
        create_topic(kafka.bootstrap, topic, 1)
        d.wait_log(r"INFO worker-0 \S+: worker: topic missing is over, after", 60)
        d.wait_all_ready(60)
        wait_for(lambda: _gauge(d, "topic_missing") == 0, 10, "the gauge back to 0", d.log_tail)


def test_more_workers_than_partitions(kafka, tmp_path):
    """Three workers on two partitions: the one left out says so, with both counts (the group's
    members and the topics' partitions: ``ownership.GroupCensus``).  A worker that only waits for
    partitions is not told this (tests/supervisor/test_spread_kafka.py)."""
    topic = f"two-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2)
    config = daemon_config(tmp_path / "idle", kafka.bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", workers=3)
    sock, d = _run(tmp_path, config, "idle")
    with sock, d:
        took = _warned(d, r"worker: group \S+: its 3 members share 2 partition\(s\) and this worker has none "
                          r"for [\d.]+s; the group has more members than the topics have partitions: lower "
                          r"\[daemon\] workers")
        assert took <= WITHIN_S + 10, (took, d.log_tail())   # from the join's end, which takes a few seconds
        sock.wait_for(lambda n: "no assignment on 1 worker(s)" in n.message, 15, "STATUS= saying so")
        wait_for(lambda: _gauge(d, "no_assignment") == 1, 10, "kdaemon_worker_problems{no_assignment}", d.log_tail)


def test_a_join_held_by_a_member_that_stopped_polling(kafka, tmp_path):
    from kafka import KafkaConsumer
    topic = f"held-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2)
    # Joined, then no poll(): its heartbeat thread keeps it in the group, and it rejoins only from
    # poll(), so a rebalance waits for it up to its max_poll_interval_ms.
    other = KafkaConsumer(topic, bootstrap_servers=kafka.bootstrap, group_id=group, max_poll_interval_ms=40_000,
                          session_timeout_ms=30_000, heartbeat_interval_ms=1_000)   # 30 s: heartbeats starved under load
    try:
        deadline = time.monotonic() + 60
        while not other.assignment() and time.monotonic() < deadline:
            other.poll(200)
        assert other.assignment(), "the kafka-python member did not join"
        config = daemon_config(tmp_path / "held", kafka.bootstrap, topic, group, workers=1)
        config["kafka"]["group_protocol"] = "classic"
        sock, d = _run(tmp_path, config, "held")
        with sock, d:
            took = _warned(d, r"worker: group \S+: the join has not completed for [\d.]+s; look at the group coordinator")
            assert took <= WITHIN_S + 5, (took, d.log_tail())
            sock.wait_for(lambda n: "join incomplete on 1 worker(s)" in n.message, 15, "STATUS= saying so")
            assert _gauge(d, "join_incomplete") == 1
            # The member polls again: the rebalance completes, the warning ends.
            stop = threading.Event()
            t = threading.Thread(target=lambda: [other.poll(200) for _ in iter(stop.is_set, True)], daemon=True)
            t.start()
            try:
                d.wait_log(r"INFO worker-0 \S+: worker: join incomplete is over, after", 60)
            finally:
                stop.set()
                t.join(5)
    finally:
        other.close(autocommit=False)


def _add_partitions(bootstrap: str, topic: str, total: int) -> float:
    """Grow ``topic`` to ``total`` partitions; when it was done (time.time)."""
    from confluent_kafka.admin import AdminClient, NewPartitions
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(30)
    return time.time()


def _warned_after(d: Daemon, pattern: str, since: float, timeout: float = 30) -> float:
    m = d.wait_log(rf"(?m)^(\S+ \S+) WARNING worker-\d \S+: {pattern}", timeout)
    return _stamp(m[1]) - since


@pytest.mark.parametrize("assignment", ["static", "group"])
def test_partitions_added_that_nobody_consumes(kafka, tmp_path, assignment):
    """A topic grows: a static assignment never takes the new partitions on, a classic group only
    at its leader's next metadata refresh (5 min by default).  Worker 0 says so within 10 s."""
    topic = f"grow-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 2)
    config = daemon_config(tmp_path / assignment, kafka.bootstrap, topic, group, workers=2, assignment=assignment)
    config["kafka"]["group_protocol"] = "classic"
    sock, d = _run(tmp_path, config, assignment)
    with sock, d:
        d.wait_all_ready(60)
        time.sleep(4)   # several looks at the settled group: none may find a partition unowned
        assert "partition(s) consumed by" not in d.log(), d.log_tail()
        grown = _add_partitions(kafka.bootstrap, topic, 4)
        holder = r"no worker of this daemon \(static assignment\)" if assignment == "static" else \
            rf"no member of group {group}"
        took = _warned_after(d, rf"worker: 2 partition\(s\) consumed by {holder}: {topic}-2, {topic}-3 for [\d.]+s; "
                                r"partitions added since the assignment was made", grown)
        assert took <= WITHIN_S, (took, d.log_tail())
        sock.wait_for(lambda n: "partition unowned on 1 worker(s)" in n.message, 15, "STATUS= saying so")
        wait_for(lambda: _gauge(d, "partition_unowned") == 1, 10, "kdaemon_worker_problems{partition_unowned}",
                 d.log_tail)
