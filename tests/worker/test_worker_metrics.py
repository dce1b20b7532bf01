"""WorkerMetrics turns the consumer's and the pipeline's running totals into Prometheus
increments and observations (in-process registry: no multiprocess directory here)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import REGISTRY

from kdaemon.client.metrics import ConsumerMetrics, PartitionMetrics
from kdaemon.worker.metrics import WorkerMetrics
from kdaemon.worker.pipeline import WorkerStats


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


class _Consumer:
    def __init__(self) -> None:
        self.responses = 0
        self.latency_ms_total = 0.0

    def answer(self, *latencies_ms: float) -> None:
        self.responses += len(latencies_ms)
        self.latency_ms_total += sum(latencies_ms)

    def group_state(self):
        return None   # assigned by hand, not a group member

    def metrics(self, partitions: dict | None = None) -> ConsumerMetrics:
        return ConsumerMetrics(
            records_consumed_total=0, bytes_consumed_total=0, records_filtered_total=0,
            control_records_total=0, aborted_records_total=0, fetch_requests_total=self.responses,
            fetch_responses_total=self.responses, fetch_errors_total=0, fetch_requests_per_node={},
            fetch_latency_avg_ms=self.latency_ms_total / self.responses if self.responses else 0.0,
            fetch_latency_ms_total=self.latency_ms_total, fetch_latency_max_ms=0.0, records_lag_max=0,
            last_fetch_request=None, partitions=partitions or {})


def test_fetch_latency_observes_the_mean_of_each_interval_not_the_running_average():
    consumer = _Consumer()
    worker = SimpleNamespace(stats=WorkerStats(), consumer=consumer, sink_down_s=0.0, problems=())
    metrics = WorkerMetrics()
    count0 = _sample("kdaemon_fetch_latency_seconds_count")
    sum0 = _sample("kdaemon_fetch_latency_seconds_sum")

    consumer.answer(100, 300)            # mean 200 ms
    metrics.update(worker, force=True)
    metrics.update(worker, force=True)   # no new responses: nothing observed
    consumer.answer(10, 10, 10, 10)      # mean 10 ms; the running average would be 40 ms
    metrics.update(worker, force=True)

    assert _sample("kdaemon_fetch_latency_seconds_count") - count0 == 2
    assert abs(_sample("kdaemon_fetch_latency_seconds_sum") - sum0 - (0.200 + 0.010)) < 1e-9


class _PartitionedConsumer(_Consumer):
    """Per-partition figures as ``Consumer.metrics()`` reports them."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict = {}

    def metrics(self) -> ConsumerMetrics:
        return super().metrics({tp: PartitionMetrics(
            position=None, high_watermark=None, last_stable_offset=None, log_start_offset=None,
            records_lag=None, records_consumed=0, records_filtered=0, bytes_consumed=n, paused=False,
            preferred_read_replica=None) for tp, n in self.bytes.items()})


def test_every_commit_flush_and_sink_write_is_observed_not_one_per_update():
    worker = SimpleNamespace(stats=WorkerStats(), consumer=_Consumer(), sink_down_s=0.0, problems=())
    metrics = WorkerMetrics()
    before = {h: _sample(f"{h}_count") for h in ("kdaemon_commit_latency_seconds", "kdaemon_sink_flush_seconds",
                                                  "kdaemon_sink_batch_records")}
    commits_sum0 = _sample("kdaemon_commit_latency_seconds_sum")
    for seconds in (0.001, 0.002, 0.004):          # three commits between two updates
        worker.stats.commits += 1
        WorkerStats.note(worker.stats.commit_seconds, seconds)
    for _ in range(5):
        worker.stats.flushes += 1
        WorkerStats.note(worker.stats.flush_seconds, 0.01)
        WorkerStats.note(worker.stats.batch_sizes, 100)
    metrics.update(worker, force=True)
    metrics.update(worker, force=True)             # nothing new: nothing observed twice
    assert _sample("kdaemon_commit_latency_seconds_count") - before["kdaemon_commit_latency_seconds"] == 3
    assert abs(_sample("kdaemon_commit_latency_seconds_sum") - commits_sum0 - 0.007) < 1e-9
    assert _sample("kdaemon_sink_flush_seconds_count") - before["kdaemon_sink_flush_seconds"] == 5
    assert _sample("kdaemon_sink_batch_records_count") - before["kdaemon_sink_batch_records"] == 5
    assert not worker.stats.commit_seconds and not worker.stats.flush_seconds and not worker.stats.batch_sizes


def test_pending_samples_stay_bounded_when_nothing_publishes():
    samples: list = []
    for i in range(5000):
        WorkerStats.note(samples, i)
    assert len(samples) <= 1000 and samples[-1] == 4999


def test_bytes_and_dead_letters_are_counted_per_topic_and_partition():
    from kdaemon.client.types import TopicPartition
    consumer = _PartitionedConsumer()
    worker = SimpleNamespace(stats=WorkerStats(), consumer=consumer, sink_down_s=0.0, problems=())
    metrics = WorkerMetrics()
    a, b = TopicPartition("metrics-t", 0), TopicPartition("metrics-t", 1)

    def bytes_of(tp):
        return REGISTRY.get_sample_value("kdaemon_fetch_bytes_total",
                                         {"topic": tp.topic, "partition": str(tp.partition)}) or 0.0

    def dlq_of(tp, stage):
        return REGISTRY.get_sample_value("kdaemon_records_dlq_total",
                                         {"topic": tp.topic, "partition": str(tp.partition), "stage": stage}) or 0.0

    consumer.bytes = {a: 1000, b: 10}
    worker.stats.dlq[(a, "deserialize")] += 2
    metrics.update(worker, force=True)
    consumer.bytes = {a: 1500, b: 10}
    worker.stats.dlq[(b, "sink")] += 1
    metrics.update(worker, force=True)
    assert (bytes_of(a), bytes_of(b)) == (1500, 10)
    assert (dlq_of(a, "deserialize"), dlq_of(b, "sink"), dlq_of(b, "deserialize")) == (2, 1, 0)


def test_a_down_sink_shows_how_long_and_on_how_many_workers():
    worker = SimpleNamespace(stats=WorkerStats(), consumer=_Consumer(), sink_down_s=125.0, problems=())
    metrics = WorkerMetrics()
    metrics.update(worker, force=True)
    assert _sample("kdaemon_sink_down_seconds") == 125.0 and _sample("kdaemon_sink_down_workers") == 1
    worker.sink_down_s = 0.0
    metrics.update(worker, force=True)
    assert _sample("kdaemon_sink_down_seconds") == 0.0 and _sample("kdaemon_sink_down_workers") == 0


class _PositionedConsumer(_Consumer):
    """Partitions with a position and a lag, as Consumer.metrics() reports them."""

    def __init__(self, figures: dict) -> None:
        super().__init__()
        self.figures = figures   # tp -> (position, lag)

    def metrics(self) -> ConsumerMetrics:
        return super().metrics({tp: PartitionMetrics(
            position=pos, high_watermark=pos + lag, last_stable_offset=None, log_start_offset=0,
            records_lag=lag, records_consumed=0, records_filtered=0, bytes_consumed=0, paused=False,
            preferred_read_replica=None) for tp, (pos, lag) in self.figures.items()})


def test_committed_offset_its_age_and_the_log_end_per_partition(monkeypatch):
    import time as time_module
    from kdaemon.client.types import TopicPartition
    a, b = TopicPartition("commit-t", 0), TopicPartition("commit-t", 1)
    consumer = _PositionedConsumer({a: (100, 20), b: (5, 0)})
    worker = SimpleNamespace(stats=WorkerStats(), consumer=consumer, sink_down_s=0.0, problems=())
    worker.stats.committed[a] = (90, 1_000.0)
    monkeypatch.setattr(time_module, "time", lambda: 1_012.5)
    metrics = WorkerMetrics()
    metrics.update(worker, force=True)

    def value(name, tp):
        return REGISTRY.get_sample_value(name, {"topic": tp.topic, "partition": str(tp.partition)})

    assert value("kdaemon_committed_offset", a) == 90 and value("kdaemon_seconds_since_commit", a) == 12.5
    assert value("kdaemon_log_end_offset", a) == 120 and value("kdaemon_log_end_offset", b) == 5
    assert value("kdaemon_committed_offset", b) is None   # never committed here
    # a moved away: its figures go to 0, for its new holder's to show.
    consumer.figures = {b: (6, 1)}
    metrics.update(worker, force=True)
    assert value("kdaemon_committed_offset", a) == 0 and value("kdaemon_log_end_offset", a) == 0
    assert value("kdaemon_log_end_offset", b) == 7


def test_interceptor_drops_are_counted_per_plugin():
    worker = SimpleNamespace(stats=WorkerStats(), consumer=_Consumer(), sink_down_s=0.0, problems=())
    metrics = WorkerMetrics()

    def dropped(plugin):
        return REGISTRY.get_sample_value("kdaemon_records_dropped_by_interceptors_total", {"plugin": plugin}) or 0.0

    before = dropped("ttl"), dropped("sampler")
    worker.stats.dropped_by_interceptors["ttl"] += 3
    worker.stats.dropped_by_interceptors["sampler"] += 1
    metrics.update(worker, force=True)
    worker.stats.dropped_by_interceptors["ttl"] += 2
    metrics.update(worker, force=True)
    assert (dropped("ttl") - before[0], dropped("sampler") - before[1]) == (5, 1)


def test_failed_commits_are_counted_beside_the_successful_ones():
    worker = SimpleNamespace(stats=WorkerStats(), consumer=_Consumer(), sink_down_s=0.0, problems=())
    metrics = WorkerMetrics()
    before = _sample("kdaemon_commit_errors_total"), _sample("kdaemon_commits_total")
    worker.stats.commit_failures += 2
    worker.stats.commits += 1
    metrics.update(worker, force=True)
    worker.stats.commit_failures += 1
    metrics.update(worker, force=True)
    assert (_sample("kdaemon_commit_errors_total") - before[0], _sample("kdaemon_commits_total") - before[1]) == (3, 1)


def _share(acquired=0, redelivered=0, errors=0, expiries=0, **acknowledged):
    from types import MappingProxyType

    from kdaemon.client.metrics import ShareConsumerMetrics
    counts = {"accept": 0, "release": 0, "reject": 0, "renew": 0, **acknowledged}
    return ShareConsumerMetrics(acquired, redelivered, MappingProxyType(counts), errors, expiries)


def test_a_share_members_snapshot_becomes_counters_by_type():
    metrics = WorkerMetrics()

    def ack(kind):
        return REGISTRY.get_sample_value("kdaemon_share_records_acknowledged_total", {"type": kind}) or 0.0

    names = ("kdaemon_share_records_acquired_total", "kdaemon_share_records_redelivered_total",
             "kdaemon_share_acknowledge_errors_total", "kdaemon_share_lock_expiries_total")
    before = {n: _sample(n) for n in names}
    kinds = ("accept", "release", "reject", "renew")
    acks0 = {k: ack(k) for k in kinds}
    metrics.update_share(_share(10, 2, 0, 1, accept=6, release=2))
    metrics.update_share(_share(10, 2, 0, 1, accept=6, release=2))     # nothing new: nothing added
    metrics.update_share(_share(15, 3, 1, 1, accept=9, release=2, reject=1, renew=2))
    assert {n: _sample(n) - before[n] for n in names} == dict(zip(names, (15, 3, 1, 1)))
    assert {k: ack(k) - acks0[k] for k in kinds} == {"accept": 9, "release": 2, "reject": 1, "renew": 2}
    # A new consumer (the worker rebuilt it) starts from 0: its figures are added, none lost.
    metrics.update_share(_share(4, 0, 0, 0, accept=4))
    assert _sample("kdaemon_share_records_acquired_total") - before[names[0]] == 19
    assert ack("accept") - acks0["accept"] == 13
