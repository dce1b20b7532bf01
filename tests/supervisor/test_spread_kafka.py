"""Workers spread over the partitions without waiting for the coordinator's heartbeat interval,
on Apache Kafka (the shared ``kafka`` node), under the consumer protocol ("auto" picks it).

Under KIP-848 a member hears of a new target assignment only in a heartbeat's answer.  This
group's own heartbeat interval is set to 15 s (the broker's maximum; a group config, so the test
does not depend on what the shared broker's default is): without the supervisor's pokes
(kdaemon/supervisor/siblings.py) the workers that joined after the first would sit without
partitions for a whole interval or two, and each would say, after five seconds, that "the group
has more members than the topics have partitions", which is false with 4 workers on 8.  With
them every worker gets partitions, and a worker waiting for some is never told that.  How soon
is the benchmark's figure (bench/groups/spread.py), not asserted here.
"""

from __future__ import annotations

import uuid

import pytest

from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.group_members import set_group_session
from testkit.produce import create_topic

pytestmark = pytest.mark.kafka

WAIT = 90.0
FALSE_WARNING = "the group has more members than the topics have partitions"


def holders(d: Daemon) -> dict[int, list[str]]:
    """pid -> the partitions each live worker last reported (the supervisor's "has its
    assignment" lines, written whenever a worker's partitions change)."""
    live = d.worker_pids()
    last = {r["pid"]: r["partitions"] for r in d.ready_lines()}
    return {pid: parts for pid, parts in last.items() if pid in live}


def test_four_workers_on_eight_partitions_all_get_some_and_none_is_told_the_group_is_too_big(kafka, tmp_path):
    tag = uuid.uuid4().hex[:8]
    topic = group = f"spread-{tag}"
    create_topic(kafka.bootstrap, topic, 8)
    set_group_session(kafka.bootstrap, group, 45_000, heartbeat_ms=15_000)
    config = daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=4)
    with Daemon(tmp_path, config) as d:
        def spread():
            now = holders(d)
            return now if len(now) == 4 and all(now.values()) else None
        every = wait_for(spread, WAIT, "every one of the 4 workers holding partitions", d.log_tail)
        assert sorted(p for parts in every.values() for p in parts) == sorted(f"{topic}-{p}" for p in range(8))
        assert FALSE_WARNING not in d.log(), d.log_tail()
        assert "group protocol consumer" in d.log(), d.log_tail()
