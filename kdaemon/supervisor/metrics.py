"""The supervisor's own metrics and the aggregated /metrics page.

Imported only after the arbiter set PROMETHEUS_MULTIPROC_DIR, so these metrics live in the same
multiprocess directory as the workers' and one collector renders them all.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import multiprocess

WORKER_RESTARTS = Counter("kdaemon_worker_restarts_total", "Workers restarted after a crash or a missed heartbeat")
WORKER_RSS = Gauge("kdaemon_worker_rss_bytes", "Resident memory of each worker", ["worker"],
                   multiprocess_mode="mostrecent")
WORKER_PEAK_RSS = Gauge("kdaemon_worker_peak_rss_bytes",
                        "Highest resident memory of each worker since it started (VmHWM): catches "
                        "peaks between the 5-s samples of kdaemon_worker_rss_bytes", ["worker"],
                        multiprocess_mode="mostrecent")
WORKER_CPU = Gauge("kdaemon_worker_cpu_percent", "CPU use of each worker since the last sample", ["worker"],
                   multiprocess_mode="mostrecent")


def render() -> tuple[bytes, str]:
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def mark_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (lag, assigned partitions) from the aggregate."""
    multiprocess.mark_process_dead(pid)
