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

import psutil

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import choose_encoder
from prometheus_client import multiprocess
from prometheus_client.core import GaugeMetricFamily

from .. import __version__
from ..protocol.records import ACCELERATED

WORKER_RESTARTS = Counter("kdaemon_worker_restarts_total",
                          "Workers the supervisor replaced, by worker index and reason: exit (it exited; the log "
                          "has the code), signal (a signal killed it; a SIGKILL the supervisor did not send is "
                          "most often the OOM killer), heartbeat_timeout (killed for a missed heartbeat), memory "
                          "(recycled above max_worker_rss_mb)", ["worker", "reason"])
START_TIME = Gauge("kdaemon_start_time_seconds", "When the daemon's supervisor process started, in seconds since the "
                   "Unix epoch: a new value means the daemon itself was restarted", multiprocess_mode="livemax")
BUILD_INFO = Gauge("kdaemon_build_info", "1, labelled with the kdaemon and Python versions and whether the C record "
                   "decoder is in use", ["version", "python", "accelerated"], multiprocess_mode="livemax")
BUILD_INFO.labels(__version__, platform.python_version(), str(ACCELERATED).lower()).set(1)
# The process's own start, not this import's: the supervisor imports this module a moment later.
START_TIME.set(psutil.Process().create_time())


# The ``reason`` label's values: a closed set, each worker's series created at 0 when it is first
# started, since increase() cannot see the first restart of a series that appears at 1 (three
# restarts for three new reasons would read as none).  The exact code or signal is in the log.
RESTART_REASONS = ("exit", "signal", "heartbeat_timeout", "memory")


def restart_reason(code: int, replaced_for: str | None) -> str:
    """The ``reason`` label of a restart: the supervisor's own reason when it killed or recycled
    the worker (``WorkerProc.replaced_for``: "heartbeat_timeout", "memory"), else how the worker
    ended as waitpid saw it: "signal" (``code`` < 0) or "exit"."""
    if replaced_for is not None:
        if replaced_for not in RESTART_REASONS:
            raise ValueError(f"unknown restart reason {replaced_for!r}; one of {RESTART_REASONS}")
        return replaced_for
    return "signal" if code < 0 else "exit"


def worker_started(index: int) -> None:
    """Create worker ``index``'s restart series at 0 (a no-op once they exist)."""
    for reason in RESTART_REASONS:
        WORKER_RESTARTS.labels(str(index), reason)


def worker_restarted(index: int, code: int, replaced_for: str | None) -> None:
    """Count one replacement of worker ``index`` (exit ``code`` as ``os.waitstatus_to_exitcode``)."""
    WORKER_RESTARTS.labels(str(index), restart_reason(code, replaced_for)).inc()


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
    ``struct.error`` (the chaos run of testkit/chaos/run.py caught one as a worker started).  Such a
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


def render(accept: str = "") -> tuple[bytes, str]:
    """The page and its content type: OpenMetrics when ``accept`` (the scrape's Accept header)
    asks for it, the Prometheus text format otherwise (prometheus_client's ``choose_encoder``,
    as its own server decides)."""
    registry = CollectorRegistry()
    registry.register(WorkerFiles(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
    registry.register(WORKER_RESOURCES)
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def mark_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (lag, assigned partitions) from the aggregate."""
    multiprocess.mark_process_dead(pid)
