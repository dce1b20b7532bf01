"""Prometheus metrics of one worker, in prometheus-client's multiprocess mode.

The supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` before forking and aggregates the files every
worker writes; this module must therefore be imported only in the worker (after fork).  Gauges
use live-aggregating modes so a dead worker's series disappear once the supervisor marks it dead.

Updating is cheap and infrequent: ``WorkerMetrics.update`` turns counters the consumer and the
pipeline keep anyway into Prometheus increments, at most once a second.  A share-group worker
hands its ``ShareConsumer.metrics()`` snapshot to ``WorkerMetrics.update_share`` the same way.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

from ..client.metrics import ACKNOWLEDGE_TYPES, ShareConsumerMetrics
from .health import CONDITIONS

RECORDS_FETCHED = Counter("kdaemon_records_fetched_total", "Records returned by the consumer (after the header filter)",
                          ["topic", "partition"])
RECORDS_FILTERED = Counter("kdaemon_records_filtered_total", "Records dropped by header filters",
                           ["topic", "partition"])
RECORDS_DELIVERED = Counter("kdaemon_records_delivered_total", "Records accepted by the sink",
                            ["topic", "partition"])
RECORDS_DLQ = Counter("kdaemon_records_dlq_total", "Records written to the dead-letter queue",
                      ["topic", "partition", "stage"])
RECORDS_SKIPPED = Counter("kdaemon_records_skipped_total", "Records skipped by an error policy", ["stage"])
RECORDS_INTERCEPTED = Counter("kdaemon_records_dropped_by_interceptors_total",
                              "Records removed by on_consume interceptors", ["plugin"])
COMMITTED = Gauge("kdaemon_committed_offset", "The offset this daemon last committed for the partition",
                  ["topic", "partition"], multiprocess_mode="livemax")
COMMIT_AGE = Gauge("kdaemon_seconds_since_commit", "Seconds since this daemon last committed the partition "
                   "(while a live worker holds it)", ["topic", "partition"], multiprocess_mode="livemax")
LOG_END = Gauge("kdaemon_log_end_offset", "The partition's high watermark (last stable offset under "
                "read_committed) as last fetched", ["topic", "partition"], multiprocess_mode="livemax")
BYTES_FETCHED = Counter("kdaemon_fetch_bytes_total", "Record-set bytes received (as stored: compressed)",
                        ["topic", "partition"])
LAG = Gauge("kdaemon_records_lag", "Records between the position and the high watermark (Java records-lag)",
            ["topic", "partition"], multiprocess_mode="livesum")
FETCH_LATENCY = Histogram("kdaemon_fetch_latency_seconds", "Fetch request round trips (mean per interval)")
COMMIT_LATENCY = Histogram("kdaemon_commit_latency_seconds", "Offset commit latency")
FLUSH_LATENCY = Histogram("kdaemon_sink_flush_seconds", "Sink flush latency")
SINK_BATCH = Histogram("kdaemon_sink_batch_records", "Records per sink write",
                       buckets=(1, 10, 50, 100, 250, 500, 1000, 5000, 10000, 50000))
REBALANCES = Counter("kdaemon_rebalances_total", "Group rebalances this worker took part in")
PLUGIN_ERRORS = Counter("kdaemon_plugin_errors_total", "Exceptions raised by plugins", ["plugin"])
SINK_ERRORS = Counter("kdaemon_sink_errors_total", "Failed sink writes or flushes")
COMMITS = Counter("kdaemon_commits_total", "Successful offset commits")
COMMIT_ERRORS = Counter("kdaemon_commit_errors_total", "Offset commits that failed (the records are durable: the "
                        "next flush commits again, and what a restart meanwhile reads again comes twice)")
ASSIGNED = Gauge("kdaemon_assigned_partitions", "Partitions assigned to live workers", multiprocess_mode="livesum")
SINK_DOWN = Gauge("kdaemon_sink_down_seconds", "How long the sink has been unable to take records (0: it is up); "
                  "the longest over live workers", multiprocess_mode="livemax")
PROBLEMS = Gauge("kdaemon_worker_problems", "Live workers for which a condition holds that keeps them from "
                 "consuming (broker_unreachable, topic_missing, join_incomplete, no_assignment, "
                 "assignment_pending, partition_unowned)", ["condition"],
                 multiprocess_mode="livesum")
SINK_DOWN_WORKERS = Gauge("kdaemon_sink_down_workers", "Live workers whose sink cannot take records (partitions paused)",
                          multiprocess_mode="livesum")

# Share groups (KIP-932): a share member's records, counted in records (client/metrics.py's
# ShareConsumerMetrics says what each counts).
SHARE_ACQUIRED = Counter("kdaemon_share_records_acquired_total", "Records a share group handed to this daemon's "
                         "workers (acquired under a lock; header-filtered records excluded)")
SHARE_REDELIVERED = Counter("kdaemon_share_records_redelivered_total", "Acquired records delivered before "
                            "(delivery count above 1: released, or their lock ran out at a member)")
SHARE_ACKNOWLEDGED = Counter("kdaemon_share_records_acknowledged_total", "Acknowledgements the broker confirmed, "
                             "by type (accept, release, reject, renew)", ["type"])
for _kind in ACKNOWLEDGE_TYPES.values():   # each type at 0 before its first increment (invariant 40)
    SHARE_ACKNOWLEDGED.labels(_kind)
SHARE_ACK_ERRORS = Counter("kdaemon_share_acknowledge_errors_total", "Acknowledgements the broker refused or "
                           "that a failed request carried (the records go to the group again)")
SHARE_LOCK_EXPIRIES = Counter("kdaemon_share_lock_expiries_total", "Acquired records whose lock ran out before "
                              "their acknowledgement was sent (the group delivers them again: a duplicate)")


class WorkerMetrics:
    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval = interval_s
        self._next = 0.0
        self._seen: dict = {}
        self._lag_labels: set = set()
        self._partition_labels: set = set()

    def _delta(self, key, value) -> float:
        old = self._seen.get(key, 0)
        self._seen[key] = value
        return value - old if value >= old else value

    def problems(self, problems: tuple[str, ...]) -> None:
        """1 for each condition that holds for this worker, 0 for the others (health.CONDITIONS)."""
        for name in CONDITIONS:
            PROBLEMS.labels(name).set(1 if name in problems else 0)

    def _partition_gauges(self, worker, consumer_metrics) -> None:
        """Committed offset, its age and the log-end offset of each partition the worker holds.
        A partition that moved away is set to 0 here (as the lag is): the gauges take the
        largest value over live workers, so its new holder's figures show."""
        held = set()
        now = time.time()
        for tp, p in consumer_metrics.partitions.items():
            labels = (tp.topic, str(tp.partition))
            held.add(labels)
            if p.records_lag is not None and p.position is not None:
                LOG_END.labels(*labels).set(p.position + p.records_lag)   # what the lag is measured to
            committed = worker.stats.committed.get(tp)
            if committed is not None:
                COMMITTED.labels(*labels).set(committed[0])
                COMMIT_AGE.labels(*labels).set(now - committed[1])
        for labels in self._partition_labels - held:
            for gauge in (LOG_END, COMMITTED, COMMIT_AGE):
                gauge.labels(*labels).set(0)
        self._partition_labels = held

    def update(self, worker, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.interval
        stats = worker.stats
        consumer_metrics = worker.consumer.metrics()
        for tp, n in stats.fetched.items():
            d = self._delta(("fetched", tp), n)
            if d:
                RECORDS_FETCHED.labels(tp.topic, str(tp.partition)).inc(d)
        for tp, n in stats.delivered.items():
            d = self._delta(("delivered", tp), n)
            if d:
                RECORDS_DELIVERED.labels(tp.topic, str(tp.partition)).inc(d)
        lag_labels = set()
        for tp, p in consumer_metrics.partitions.items():
            d = self._delta(("filtered", tp), p.records_filtered)
            if d:
                RECORDS_FILTERED.labels(tp.topic, str(tp.partition)).inc(d)
            d = self._delta(("bytes", tp), p.bytes_consumed)
            if d:
                BYTES_FETCHED.labels(tp.topic, str(tp.partition)).inc(d)
            if p.records_lag is not None:
                LAG.labels(tp.topic, str(tp.partition)).set(p.records_lag)
                lag_labels.add((tp.topic, str(tp.partition)))
        for labels in self._lag_labels - lag_labels:  # partitions that moved away
            LAG.labels(*labels).set(0)
        self._lag_labels = lag_labels
        ASSIGNED.set(len(consumer_metrics.partitions))
        self.problems(worker.problems)
        down = worker.sink_down_s
        SINK_DOWN.set(down)
        SINK_DOWN_WORKERS.set(1 if down else 0)
        for (tp, stage), n in stats.dlq.items():
            d = self._delta(("dlq", tp, stage), n)
            if d:
                RECORDS_DLQ.labels(tp.topic, str(tp.partition), stage).inc(d)
        for stage, n in stats.skipped.items():
            d = self._delta(("skipped", stage), n)
            if d:
                RECORDS_SKIPPED.labels(stage).inc(d)
        for plugin, n in stats.plugin_errors.items():
            d = self._delta(("plugin", plugin), n)
            if d:
                PLUGIN_ERRORS.labels(plugin).inc(d)
        for plugin, n in stats.dropped_by_interceptors.items():
            d = self._delta(("intercepted", plugin), n)
            if d:
                RECORDS_INTERCEPTED.labels(plugin).inc(d)
        self._partition_gauges(worker, consumer_metrics)
        for key, counter, value in (("sink_errors", SINK_ERRORS, stats.sink_errors),
                                    ("commits", COMMITS, stats.commits),
                                    ("commit_errors", COMMIT_ERRORS, stats.commit_failures)):
            d = self._delta(key, value)
            if d:
                counter.inc(d)
        # Every commit, flush and sink write since the last update, not a sample of them.
        for samples, histogram in ((stats.commit_seconds, COMMIT_LATENCY), (stats.flush_seconds, FLUSH_LATENCY),
                                   (stats.batch_sizes, SINK_BATCH)):
            for v in samples:
                histogram.observe(v)
            samples.clear()
        # The mean round trip of the responses since the last update (not the running average
        # since start, which would flatten the histogram as the worker ages).
        responses = self._delta("fetch_responses", consumer_metrics.fetch_responses_total)
        latency_ms = self._delta("fetch_latency_ms", consumer_metrics.fetch_latency_ms_total)
        if responses:
            FETCH_LATENCY.observe(latency_ms / responses / 1000)
        group = worker.consumer.group_state()
        rebalances = 0 if group is None else group.rebalances
        d = self._delta("rebalances", rebalances)
        if d:
            REBALANCES.inc(d)

    def update_share(self, snapshot: ShareConsumerMetrics) -> None:
        """A share worker's ``ShareConsumer.metrics()`` snapshot as Prometheus increments (the
        counters grow by what the snapshot's totals grew since the last call).  Cheap: call it
        as often as ``update``; nothing is rate-limited here."""
        for key, counter, value in (("share_acquired", SHARE_ACQUIRED, snapshot.records_acquired),
                                    ("share_redelivered", SHARE_REDELIVERED, snapshot.records_redelivered),
                                    ("share_ack_errors", SHARE_ACK_ERRORS, snapshot.acknowledge_errors),
                                    ("share_lock_expiries", SHARE_LOCK_EXPIRIES, snapshot.lock_expiries)):
            d = self._delta(key, value)
            if d:
                counter.inc(d)
        for kind in ACKNOWLEDGE_TYPES.values():
            d = self._delta(("share_acknowledged", kind), snapshot.acknowledged.get(kind, 0))
            if d:
                SHARE_ACKNOWLEDGED.labels(kind).inc(d)
