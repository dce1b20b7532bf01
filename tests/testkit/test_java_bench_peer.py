"""The Java peer's ``bench`` sub-command (the consuming benchmarks' workload, testkit/workload.py, in
the Java KafkaConsumer) and ``share-bench`` (the same in a KafkaShareConsumer, bench/share): the
benchmarks compare kdaemon with them, so each must read every record once and do the same work.

Correctness only: no figure it prints is asserted (no timed assertions in tests).
"""

from __future__ import annotations

import uuid

import pytest

from testkit import workload
from testkit.group_configs import set_group_configs
from testkit.java_peer import java_bench, java_share_bench
from testkit.produce import Record, create_topic, produce
from testkit.share_groups import share_lag

pytestmark = pytest.mark.kafka

N = 400   # a multiple of 20: equal partitions, exactly a tenth of each type


@pytest.fixture(scope="module")
def bench_topic(kafka):
    """The benchmarks' records (lz4) in a fresh 4-partition topic; the check values every mode
    must reach, computed as testkit/workload.py's producer does."""
    topic = f"java-bench-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, workload.PARTITIONS)
    by_partition: dict[int, list[Record]] = {p: [] for p in range(workload.PARTITIONS)}
    check = {"raw": 0, "json": 0, "filter": 0}
    kept = {"raw": N, "json": N, "filter": 0}
    for i, p, key, value, headers in workload.iter_records(N):
        by_partition[p].append(Record(key, value, tuple(headers)))
        check["raw"] += len(value)
        check["json"] += i
        if dict(headers)["type"] == workload.TARGET:
            check["filter"] += i
            kept["filter"] += 1
    for p, records in by_partition.items():
        produce(kafka.bootstrap, topic, records, compression="lz4", partition=p)
    expected = [len(by_partition[p]) for p in range(workload.PARTITIONS)]
    return topic, expected, check, kept


@pytest.mark.parametrize("mode", ["raw", "json", "filter"])
def test_java_bench_reads_every_record_once_and_does_the_work(kafka, bench_topic, mode):
    topic, expected, check, kept = bench_topic
    r = java_bench(kafka.bootstrap, topic, expected, mode, value=workload.TARGET.decode(),
                   settings={"max.poll.records": "37"}, samples=True, timeout=180)
    assert (r["records"], r["counts"], r["capped"]) == (N, expected, False)
    assert (r["check"], r["kept"]) == (check[mode], kept[mode])
    assert r["first_batch"] > 0 and r["first_record_s"] is not None
    # Progress points after every poll: from (0, 0) to every record, never going back.
    points = r["samples"]
    assert points[0][:2] == [0.0, 0] and points[-1][1] == N
    assert all(a[0] <= b[0] and a[1] <= b[1] and a[2] <= b[2] for a, b in zip(points, points[1:]))


def test_java_bench_stops_capped_when_records_are_missing(kafka, bench_topic):
    """More records expected than there are: it polls until --max-seconds, stops and says so, with
    the counts it did read (how many it reached by then depends on the machine's load)."""
    topic, expected, _, _ = bench_topic
    r = java_bench(kafka.bootstrap, topic, [n + 1 for n in expected], "raw", max_seconds=3.0, timeout=180)
    assert r["capped"] is True and r["seconds"] > 3.0
    assert all(0 <= got <= n for got, n in zip(r["counts"], expected)), r["counts"]
    assert r["records"] == sum(r["counts"])


@pytest.mark.parametrize("ack", ["implicit", "explicit"])
def test_java_share_bench_reads_every_record_once_and_settles_it(kafka, bench_topic, ack):
    """One member of a fresh share group (reset to earliest) reads every record once, does the
    work, and leaves nothing unsettled: the group's lag is 0 on every partition afterwards."""
    topic, expected, check, kept = bench_topic
    group = f"java-share-bench-{ack}-{uuid.uuid4().hex[:8]}"
    set_group_configs(kafka.bootstrap, group, {"share.auto.offset.reset": "earliest"})
    r = java_share_bench(kafka.bootstrap, group, topic, expected, "json", ack=ack,
                         value=workload.TARGET.decode(), settings={"max.poll.records": "37"}, timeout=180)
    assert (r["records"], r["counts"], r["capped"], r["ack"]) == (N, expected, False, ack)
    assert (r["check"], r["kept"]) == (check["json"], kept["json"])
    assert r["first_batch"] > 0 and r["commit_s"] >= 0
    lag = share_lag(kafka.host, kafka.port, group)
    assert {tp: v for tp, (_, v) in lag.items()} == {(topic, p): 0 for p in range(workload.PARTITIONS)}
