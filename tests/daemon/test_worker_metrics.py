"""WorkerMetrics turns the consumer's and the pipeline's running totals into Prometheus
increments and observations (in-process registry: no multiprocess directory here)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import REGISTRY

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

    def metrics(self) -> dict:
        return {"partitions": {}, "bytes_consumed_total": 0,
                "fetch_responses_total": self.responses, "fetch_latency_ms_total": self.latency_ms_total,
                "fetch_latency_avg_ms": self.latency_ms_total / self.responses if self.responses else 0.0}


def test_fetch_latency_observes_the_mean_of_each_interval_not_the_running_average():
    consumer = _Consumer()
    worker = SimpleNamespace(stats=WorkerStats(), consumer=consumer)
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
