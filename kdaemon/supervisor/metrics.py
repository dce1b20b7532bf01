"""The supervisor's own metrics and the aggregated /metrics page.

Imported only after the arbiter set PROMETHEUS_MULTIPROC_DIR, so the restart counter lives in the
same multiprocess directory as the workers' metrics and one collector renders them all; the
per-worker resource gauges come from the supervisor's live state (``WorkerResources``).
"""

from __future__ import annotations

import glob
import logging
import os
import platform

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import multiprocess
from prometheus_client.core import GaugeMetricFamily

from .. import __version__
from ..protocol.records import ACCELERATED

WORKER_RESTARTS = Counter("kdaemon_worker_restarts_total", "Workers restarted after a crash or a missed heartbeat")
BUILD_INFO = Gauge("kdaemon_build_info", "1, labelled with the kdaemon and Python versions and whether the C record "
                   "decoder is in use", ["version", "python", "accelerated"], multiprocess_mode="livemax")
BUILD_INFO.labels(__version__, platform.python_version(), str(ACCELERATED).lower()).set(1)


class WorkerResources:
    """Each worker's RSS, peak RSS (VmHWM) and CPU as the supervisor last sampled them.

    Rendered from the supervisor's own state at scrape time, not kept in the multiprocess files:
    a value written there stays in every later scrape, so a worker removed by TTOU (or by a
    smaller ``workers`` on reload) would go on reporting its last RSS forever.  Here a worker's
    series goes when its process does."""

    def __init__(self) -> None:
        self._samples: dict[int, tuple[int, float, float | None, float]] = {}   # index -> (pid, rss, peak, cpu)

    def set(self, index: int, pid: int, rss_bytes: float, peak_bytes: float | None, cpu_percent: float) -> None:
        self._samples[index] = (pid, rss_bytes, peak_bytes, cpu_percent)

    def forget(self, index: int, pid: int) -> None:
        """Drop the sample of worker ``index`` if it is still that of ``pid`` (a replacement may
        already have been sampled under the same index)."""
        if self._samples.get(index, (None,))[0] == pid:
            del self._samples[index]

    def collect(self):
        rss = GaugeMetricFamily("kdaemon_worker_rss_bytes", "Resident memory of each worker", labels=["worker"])
        peak = GaugeMetricFamily("kdaemon_worker_peak_rss_bytes",
                                 "Highest resident memory of each worker since it started (VmHWM): catches "
                                 "peaks between the 5-s samples of kdaemon_worker_rss_bytes", labels=["worker"])
        cpu = GaugeMetricFamily("kdaemon_worker_cpu_percent", "CPU use of each worker since the last sample",
                                labels=["worker"])
        for index, (_, rss_bytes, peak_bytes, cpu_percent) in sorted(self._samples.items()):
            rss.add_metric([str(index)], rss_bytes)
            if peak_bytes is not None:
                peak.add_metric([str(index)], peak_bytes)
            cpu.add_metric([str(index)], cpu_percent)
        return [rss, peak, cpu]


WORKER_RESOURCES = WorkerResources()


log = logging.getLogger("kdaemon.supervisor")

# A worker's metrics file starts with the 4-byte count of bytes used (8 with its padding).
_HEADER_BYTES = 8


class WorkerFiles:
    """The multiprocess files of every process, merged as prometheus_client's
    ``MultiProcessCollector`` does, except a file too short to hold its header: prometheus_client
    creates a file empty and sizes it a moment later, and a scrape in between raised
    ``struct.error`` (the chaos run of bench/chaos.py caught one as a worker started).  Such a
    file has no value yet; it is skipped and counted next time."""

    def __init__(self, path: str) -> None:
        self._path = path

    def collect(self):
        ready = []
        for f in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(f) >= _HEADER_BYTES:
                    ready.append(f)
            except FileNotFoundError:   # a dead worker's live gauges, removed meanwhile
                continue
        return multiprocess.MultiProcessCollector.merge(ready, accumulate=True)


def render() -> tuple[bytes, str]:
    registry = CollectorRegistry()
    registry.register(WorkerFiles(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    registry.register(WORKER_RESOURCES)
    return generate_latest(registry), CONTENT_TYPE_LATEST


def mark_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (lag, assigned partitions) from the aggregate."""
    multiprocess.mark_process_dead(pid)
