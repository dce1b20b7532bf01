"""What a client telemetry push (KIP-714) carries: the consumer's metrics, named as the Java
consumer names them, encoded as an OpenTelemetry ``MetricsData`` protobuf.

**Names.**  KIP-714 names a metric ``<domain>.<group>.<name>`` with Java's metric group and name
lower-cased, "-" made ".", and "-metrics" dropped from the group (Java's
``TelemetryMetricNamingConvention``): ``records-lag-max`` of ``consumer-fetch-manager-metrics``
is ``org.apache.kafka.consumer.fetch.manager.records.lag.max``.  Each figure kdaemon has that the
Java consumer also has is pushed under Java's name (``JAVA_NAMES`` below, and the per-topic and
per-partition ones with Java's tags as attributes: ``topic``, ``partition``), so an operator's
dashboards for Java consumers show kdaemon's too.  Figures Java has no name for are pushed under
``kdaemon.consumer.``: a subscription asks for them by that prefix (or for every metric).
Counters (``*.total``) are monotonic Sums, cumulative or, when the subscription asks for delta
temporality, the change since the last push; everything else is a Gauge.  Java's averages,
maxima and rates are over its sample windows (about a minute); kdaemon's latency averages and
maxima are since the consumer started, its rates over the time since the last push.

**Connections, requests and commits** are counted by ``WireCounters``, an observer of the
network client (``NetworkClient.observers``, called for every request and answer): a new
connection is its ApiVersions request, a commit's latency the time from its OffsetCommit to the
answer (answers on a connection come in request order).

**Encoding: opentelemetry-proto, measured.**  The OpenTelemetry project's generated classes
(``opentelemetry-proto``, on the protobuf runtime's upb backend) against a hand-written
encoder of the same message subset (varints and length-delimited fields, ~40 lines), for a push
of 31 metrics, one of them with 16 per-partition points (3.3 kB), on this project's 2-core test
machine, Python 3.11:

=====================================  ====================  =====================
                                       opentelemetry-proto   hand-written
=====================================  ====================  =====================
build + encode one push                150-160 µs            650 µs
import (once per worker, first push)   33-42 ms, +5.1 MiB    ~0
=====================================  ====================  =====================

The library is 4x faster per push and the cost of importing it is paid once per worker, at its
first push, only when a broker subscribes it to metrics; a push goes out once per push
interval (minutes by default).  So the library made for the format is used, imported lazily
(a consumer that never pushes never imports it).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from ..protocol.apis import API_VERSIONS, OFFSET_COMMIT
from ..protocol.compression import NONE, compress
from .metrics import ConsumerMetrics, ShareConsumerMetrics

JAVA_CONSUMER = "org.apache.kafka.consumer."
FETCH_MANAGER = JAVA_CONSUMER + "fetch.manager."
COORDINATOR = JAVA_CONSUMER + "coordinator."
OWN_PREFIX = "kdaemon.consumer."
OWN_SHARE_PREFIX = "kdaemon.share.consumer."

SUM, GAUGE = "sum", "gauge"
# OpenTelemetry's AggregationTemporality values.
DELTA, CUMULATIVE = 1, 2


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One value of one metric, with its attributes (Java's metric tags)."""

    name: str
    kind: str                                   # SUM (monotonic counter) or GAUGE
    value: float
    attributes: tuple[tuple[str, str], ...] = ()


# The consumer's own figures (ConsumerMetrics) under the Java consumer's names.
JAVA_NAMES: dict[str, tuple[str, str]] = {
    # ConsumerMetrics field: (Java's telemetry name, kind)
    "records_consumed_total": (FETCH_MANAGER + "records.consumed.total", SUM),
    "bytes_consumed_total": (FETCH_MANAGER + "bytes.consumed.total", SUM),
    "fetch_responses_total": (FETCH_MANAGER + "fetch.total", SUM),
    "fetch_latency_avg_ms": (FETCH_MANAGER + "fetch.latency.avg", GAUGE),
    "fetch_latency_max_ms": (FETCH_MANAGER + "fetch.latency.max", GAUGE),
    "records_lag_max": (FETCH_MANAGER + "records.lag.max", GAUGE),
}
# Rates over the time since the last push, of these counters.
JAVA_RATES = {
    FETCH_MANAGER + "records.consumed.total": FETCH_MANAGER + "records.consumed.rate",
    FETCH_MANAGER + "bytes.consumed.total": FETCH_MANAGER + "bytes.consumed.rate",
    FETCH_MANAGER + "fetch.total": FETCH_MANAGER + "fetch.rate",
    JAVA_CONSUMER + "connection.creation.total": JAVA_CONSUMER + "connection.creation.rate",
    JAVA_CONSUMER + "request.total": JAVA_CONSUMER + "request.rate",
    JAVA_CONSUMER + "response.total": JAVA_CONSUMER + "response.rate",
    COORDINATOR + "commit.total": COORDINATOR + "commit.rate",
}
# kdaemon's figures Java has no name for.
OWN_NAMES: dict[str, tuple[str, str]] = {
    "records_filtered_total": (OWN_PREFIX + "records.filtered.total", SUM),
    "control_records_total": (OWN_PREFIX + "control.records.total", SUM),
    "aborted_records_total": (OWN_PREFIX + "aborted.records.total", SUM),
    "fetch_errors_total": (OWN_PREFIX + "fetch.errors.total", SUM),
}


class WireCounters:
    """A ``NetworkClient`` observer counting connections, requests, answers and commits.

    Called under the network client's lock for every request written and answer read, so it
    only adds; the telemetry reads the counters when it builds a push."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.responses = 0
        self.commits = 0
        self.commit_latency_ms_total = 0.0
        self.commit_latency_ms_max = 0.0
        self._commits_out: dict[int, deque[float]] = {}

    def __call__(self, node_id: int, api, version: int, body: dict, response: bool) -> None:
        if not response:
            self.requests += 1
            if api is API_VERSIONS:
                self.connections += 1
            elif api is OFFSET_COMMIT:
                self._commits_out.setdefault(node_id, deque()).append(time.monotonic())
            return
        self.responses += 1
        if api is OFFSET_COMMIT:
            sent = self._commits_out.get(node_id)
            if sent:
                ms = (time.monotonic() - sent.popleft()) * 1000
                self.commits += 1
                self.commit_latency_ms_total += ms
                self.commit_latency_ms_max = max(self.commit_latency_ms_max, ms)

    def points(self, group: bool) -> list[MetricPoint]:
        out = [MetricPoint(JAVA_CONSUMER + "connection.creation.total", SUM, self.connections),
               MetricPoint(JAVA_CONSUMER + "request.total", SUM, self.requests),
               MetricPoint(JAVA_CONSUMER + "response.total", SUM, self.responses)]
        if group:
            avg = self.commit_latency_ms_total / self.commits if self.commits else 0.0
            out += [MetricPoint(COORDINATOR + "commit.total", SUM, self.commits),
                    MetricPoint(COORDINATOR + "commit.latency.avg", GAUGE, avg),
                    MetricPoint(COORDINATOR + "commit.latency.max", GAUGE, self.commit_latency_ms_max)]
        return out


def consumer_points(m: ConsumerMetrics, wire: WireCounters | None, *, group: bool,
                    rebalances: int | None = None) -> list[MetricPoint]:
    """Every figure of a consumer's metrics snapshot (and of its wire counters) as points;
    ``rebalances``: the group member's completed rebalances, when it is one."""
    out = [MetricPoint(name, kind, float(getattr(m, field))) for field, (name, kind) in JAVA_NAMES.items()]
    if group:
        out.append(MetricPoint(COORDINATOR + "assigned.partitions", GAUGE, float(len(m.partitions))))
    if rebalances is not None:
        out.append(MetricPoint(COORDINATOR + "rebalance.total", SUM, float(rebalances)))
    out += [MetricPoint(name, kind, float(getattr(m, field))) for field, (name, kind) in OWN_NAMES.items()]
    per_topic_records: dict[str, int] = {}
    per_topic_bytes: dict[str, int] = {}
    for tp, p in sorted(m.partitions.items()):
        per_topic_records[tp.topic] = per_topic_records.get(tp.topic, 0) + p.records_consumed
        per_topic_bytes[tp.topic] = per_topic_bytes.get(tp.topic, 0) + p.bytes_consumed
        if p.records_lag is not None:
            out.append(MetricPoint(FETCH_MANAGER + "records.lag", GAUGE, float(p.records_lag),
                                   (("topic", tp.topic), ("partition", str(tp.partition)))))
    for topic, n in per_topic_records.items():
        out.append(MetricPoint(FETCH_MANAGER + "records.consumed.total", SUM, float(n), (("topic", topic),)))
        out.append(MetricPoint(FETCH_MANAGER + "bytes.consumed.total", SUM, float(per_topic_bytes[topic]),
                               (("topic", topic),)))
    if wire is not None:
        out += wire.points(group)
    return out


def share_points(m: ShareConsumerMetrics, wire: WireCounters | None) -> list[MetricPoint]:
    """A share consumer's counters (kdaemon's own names: not compared with Java's share
    consumer yet) and its wire counters (Java's consumer names)."""
    out = [MetricPoint(OWN_SHARE_PREFIX + "records.acquired.total", SUM, float(m.records_acquired)),
           MetricPoint(OWN_SHARE_PREFIX + "records.redelivered.total", SUM, float(m.records_redelivered)),
           MetricPoint(OWN_SHARE_PREFIX + "acknowledge.errors.total", SUM, float(m.acknowledge_errors)),
           MetricPoint(OWN_SHARE_PREFIX + "lock.expiries.total", SUM, float(m.lock_expiries))]
    out += [MetricPoint(OWN_SHARE_PREFIX + "acknowledged.total", SUM, float(n), (("type", kind),))
            for kind, n in sorted(m.acknowledged.items())]
    if wire is not None:
        out += wire.points(group=False)
    return out


class PushPayload:
    """Turns points into a push's ``metrics`` bytes, keeping what delta temporality and the
    rates need between pushes: each counter's value at the last push."""

    def __init__(self) -> None:
        self._started_ns = time.time_ns()
        self._last_ns = self._started_ns
        self._last: dict[tuple[str, tuple], float] = {}

    def reset(self) -> None:
        """A new subscription: deltas and rates start again from here."""
        self._last_ns = time.time_ns()
        self._last.clear()

    def points_with_rates(self, points: list[MetricPoint], now_ns: int) -> list[MetricPoint]:
        elapsed = (now_ns - self._last_ns) / 1e9
        out = list(points)
        for p in points:
            rate = JAVA_RATES.get(p.name)
            if rate is not None and not p.attributes and elapsed > 0:
                before = self._last.get((p.name, p.attributes), 0.0)
                out.append(MetricPoint(rate, GAUGE, max(0.0, p.value - before) / elapsed))
        return out

    def encode(self, points: list[MetricPoint], resource: dict[str, str], *, delta: bool,
               now_ns: int | None = None) -> bytes:
        """A serialized ``MetricsData``: one resource (the client's attributes), one scope, one
        metric a point.  Counters then count as pushed (for deltas and rates)."""
        from opentelemetry.proto.metrics.v1 import metrics_pb2   # lazily: see the module docstring

        now_ns = time.time_ns() if now_ns is None else now_ns
        data = metrics_pb2.MetricsData()
        rm = data.resource_metrics.add()
        for key, value in resource.items():
            kv = rm.resource.attributes.add()
            kv.key = key
            kv.value.string_value = value
        scope = rm.scope_metrics.add()
        for p in points:
            m = scope.metrics.add()
            m.name = p.name
            if p.kind == SUM:
                key = (p.name, p.attributes)
                m.sum.is_monotonic = True
                m.sum.aggregation_temporality = DELTA if delta else CUMULATIVE
                dp = m.sum.data_points.add()
                dp.start_time_unix_nano = self._last_ns if delta else self._started_ns
                dp.as_double = p.value - self._last.get(key, 0.0) if delta else p.value
            else:
                dp = m.gauge.data_points.add()
                dp.as_double = p.value
            dp.time_unix_nano = now_ns
            for k, v in p.attributes:
                a = dp.attributes.add()
                a.key = k
                a.value.string_value = v
        return data.SerializeToString()

    def pushed(self, points: list[MetricPoint], now_ns: int) -> None:
        """The push carrying ``points`` went out: deltas and rates count from here."""
        self._last_ns = now_ns
        for p in points:
            if p.kind == SUM:
                self._last[(p.name, p.attributes)] = p.value


def compressed(codec: int, payload: bytes) -> bytes:
    """The push's bytes in ``codec`` (as a record batch's: lz4 frames, raw-stream zstd, gzip,
    snappy in Java's xerial framing)."""
    return payload if codec == NONE else compress(codec, payload, xerial=True)
