"""kdaemon's Consumer beside the Java consumer: read to the end, map records, compare field by field.

The parity suites (test_parity_records_kafka, test_read_committed_kafka, test_offsets_for_times_kafka)
read the same partitions with kdaemon's ``Consumer`` and with the Java peer and compare what came
back per partition, in order.  A kdaemon ``ConsumerRecord`` maps to a ``JavaRecord`` one to one;
only the timestamp type is spelled differently (0/1 here, "CreateTime"/"LogAppendTime" in Java).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from kdaemon.client import Consumer, ConsumerMetrics, TopicPartition
from kdaemon.client.types import CREATE_TIME, LOG_APPEND_TIME, NO_TIMESTAMP_TYPE
from testkit.java_peer import JavaRecord

TIMESTAMP_TYPE_NAMES = {CREATE_TIME: "CreateTime", LOG_APPEND_TIME: "LogAppendTime",
                        NO_TIMESTAMP_TYPE: "NoTimestampType"}
READ_DEADLINE_S = 120.0


def as_java(r) -> JavaRecord:
    """A kdaemon ConsumerRecord in the Java peer's terms (bytes copied out of any buffer view)."""
    def b(x):
        return None if x is None else bytes(x)
    return JavaRecord(r.topic, r.partition, r.offset, r.timestamp, TIMESTAMP_TYPE_NAMES[r.timestamp_type],
                      r.leader_epoch, b(r.key), b(r.value), tuple((k, b(v)) for k, v in r.headers))


def by_partition(records: Iterable[JavaRecord]) -> dict[tuple[str, int], list[JavaRecord]]:
    out: dict[tuple[str, int], list[JavaRecord]] = defaultdict(list)
    for r in records:
        out[(r.topic, r.partition)].append(r)
    return dict(out)


def _short(r: JavaRecord) -> str:
    def cut(x):
        return None if x is None else (x if len(x) <= 40 else x[:40] + b"...(%d bytes)" % len(x))
    return repr(replace(r, key=cut(r.key), value=cut(r.value)))


def first_difference(ours: Sequence[JavaRecord], theirs: Sequence[JavaRecord]) -> str | None:
    """None when equal; else where the two per-partition sequences part, field by field."""
    a, b = by_partition(ours), by_partition(theirs)
    for tp in sorted(set(a) | set(b)):
        x, y = a.get(tp, []), b.get(tp, [])
        for i, (rx, ry) in enumerate(zip(x, y)):
            if rx != ry:
                fields = [f for f in JavaRecord.__dataclass_fields__ if getattr(rx, f) != getattr(ry, f)]
                return (f"{tp} record #{i}: fields {fields} differ\n  kdaemon: {_short(rx)}\n"
                        f"  java:    {_short(ry)}")
        if len(x) != len(y):
            return f"{tp}: kdaemon returned {len(x)} records, Java {len(y)}"
    return None


@dataclass
class KdaemonRun:
    records: list[JavaRecord]
    positions: dict[tuple[str, int], int]
    end_offsets: dict[tuple[str, int], int]
    metrics: ConsumerMetrics

    def lags(self) -> dict[tuple[str, int], int | None]:
        """records_lag per partition at the end, keyed as JavaRun.lags()."""
        return {tuple(tp): m.records_lag for tp, m in self.metrics.partitions.items()}


def read_to_end(bootstrap: str, partitions: Iterable[tuple[str, int]], *,
                isolation: str = "read_uncommitted", deadline_s: float = READ_DEADLINE_S,
                **options) -> KdaemonRun:
    """kdaemon's Consumer, assigned ``partitions`` from the beginning, polled until every position
    reached the end offset read at start (the LSO under read_committed), as the Java peer's
    ``--until-end`` does."""
    tps = [TopicPartition(t, p) for t, p in partitions]
    opts = dict(auto_offset_reset="earliest", isolation_level=isolation, fetch_max_wait_ms=100)
    opts.update(options)
    with Consumer(bootstrap, **opts) as c:
        c.assign(tps)
        end = c.end_offsets(tps)
        records = drain_until(c, lambda: all(c.position(tp) >= end[tp] for tp in tps), deadline_s,
                              what=f"positions {end}")
        return KdaemonRun(records, {tuple(tp): c.position(tp) for tp in tps},
                          {tuple(tp): o for tp, o in end.items()}, c.metrics())


def drain_until(c: Consumer, done, deadline_s: float = READ_DEADLINE_S, what: str = "the condition") -> list[JavaRecord]:
    """Poll ``c`` until ``done()``; every record returned meanwhile, in the Java peer's terms."""
    out: list[JavaRecord] = []
    deadline = time.monotonic() + deadline_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"kdaemon did not reach {what} within {deadline_s} s "
                                 f"({len(out)} records read; positions {c.positions()})")
        for recs in c.poll(200).values():
            out.extend(as_java(r) for r in recs)
    return out
