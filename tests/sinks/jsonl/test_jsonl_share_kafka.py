"""The jsonl sink behind real share-group members (Apache Kafka 4.4, the shared ``kafka`` broker).

Two members of one share group, each with its own share-mode jsonl sink on one directory, as two
workers of a daemon.  A acquires offsets 0-19 of the partition first; B takes 20-59, writes,
flushes and ACCEPTs them.  A then stores 0-9 (written, flushed), RELEASEs 10-19 (a sink failure:
never written) and stops without a verdict for 0-9 (as a worker killed after its flush): the
broker gives 0-19 to B, after the later offsets it already wrote, each with delivery count 2.
B must write 10-19 (a consumer-group index, "59 is stored", would drop them) and skip 0-9.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from kdaemon.client import AcknowledgeType, ShareConsumer
from kdaemon.plugins.types import Record
from kdaemon.sinks.jsonl import JsonlSink
from testkit.group_configs import set_group_configs
from testkit.produce import create_topic, produce
from testkit.share_groups import share_lag

pytestmark = pytest.mark.kafka

WAIT = 60.0   # bound of every wait for an event; never a duration the test relies on


class Ticking:
    """A clock a second further on at every reading: the sink looks at the directory at every
    batch (in a daemon, a redelivery comes a lock duration, at least a second, later)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def as_records(polled) -> list[Record]:
    return [Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers))
            for r in polled]


def poll_until(c: ShareConsumer, done, on_records) -> list:
    got: list = []
    deadline = time.monotonic() + WAIT
    while not done(got):
        assert time.monotonic() < deadline, f"not done after {WAIT} s: {sorted(r.offset for r in got)}"
        polled = [r for rs in c.poll(200).values() for r in rs]
        if polled:
            got += polled
            on_records(polled)
    return got


def stored_offsets(d) -> list[int]:
    out = []
    for name in os.listdir(d):
        if name.endswith(".jsonl") or name.endswith(".jsonl.open"):
            with open(os.path.join(d, name)) as f:
                out += [json.loads(line)["offset"] for line in f]
    return sorted(out)


def test_redelivered_and_out_of_order_records_from_a_share_group(kafka, tmp_path):
    topic = f"share-jsonl-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1)
    produce(kafka.bootstrap, topic, [(None, b"v%d" % i, []) for i in range(60)], partition=0)
    group = f"share-jsonl-{uuid.uuid4().hex[:8]}"
    set_group_configs(kafka.bootstrap, group, {"share.auto.offset.reset": "earliest"})
    out = tmp_path / "out"

    def member(limit: int) -> ShareConsumer:
        c = ShareConsumer(kafka.bootstrap, group_id=group, client_id=f"share-jsonl-{uuid.uuid4().hex[:6]}",
                          share_acknowledgement_mode="explicit", share_acquire_mode="record_limit",
                          max_poll_records=limit)
        c.subscribe([topic])
        return c

    a = member(20)
    held = poll_until(a, lambda got: len(got) >= 20, lambda rs: None)
    assert sorted(r.offset for r in held) == list(range(20))

    b = member(500)
    sink_b = JsonlSink(out, group_type="share", clock=Ticking())
    by_b: list = []

    def deliver(polled) -> None:   # what a worker does: write, flush, then ACCEPT
        by_b.extend(polled)
        sink_b.write(as_records(polled))
        sink_b.flush()
        for r in polled:
            b.acknowledge(r, AcknowledgeType.ACCEPT)

    poll_until(b, lambda got: {r.offset for r in got} >= set(range(20, 60)), deliver)
    b.commit_sync()

    sink_a = JsonlSink(out, group_type="share")
    sink_a.write(as_records([r for r in held if r.offset < 10]))
    sink_a.flush()                                        # stored, never acknowledged
    for r in held:
        if r.offset >= 10:
            a.acknowledge(r, AcknowledgeType.RELEASE)     # the sink failed: not stored
    a.commit_sync()
    a.close()                                             # 0-9 go back to the group unsettled

    again = poll_until(b, lambda got: {r.offset for r in got} >= set(range(20)), deliver)
    b.commit_sync()
    sink_a.close()
    sink_b.close()
    b.close()
    assert {r.delivery_count for r in again} == {2}
    assert stored_offsets(out) == list(range(60))          # each once: 10-19 written, 0-9 not again
    assert sink_b.skipped == 10
    deadline = time.monotonic() + WAIT
    while share_lag(kafka.host, kafka.port, group).get((topic, 0), (None, None))[1] != 0:
        assert time.monotonic() < deadline, share_lag(kafka.host, kafka.port, group)
        time.sleep(0.2)
