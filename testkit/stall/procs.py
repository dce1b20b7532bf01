"""What the stall run measures of the daemon's processes, and what it reads from the daemon's log.

``ProcessSampler`` samples, every ``SAMPLE_S``, each process of the daemon: the supervisor, every
worker (its index from the supervisor's ``started worker <i> (pid <p>)`` lines) and the Spark
uploader with what it started (its JVM).  A sample is (wall time, CPU-seconds user+system, RSS).
It samples rather than reads once because the issue asks for the *peak* RSS during the stall and
during recovery (a figure at the end misses a peak in between) and for the CPU-seconds of the
stall alone: the difference of cumulative ``cpu_times`` at the stall's two ends.  A process that
dies takes its CPU counter with it, so its last sample is what counts; the uploader killer
hands in a sample taken right before each kill (``note``), so a SIGKILLed uploader's CPU is
counted up to its death.  The sampler also keeps the size on disk of the Spark sink's staging
directory (staged batches waiting for the uploader).

Wall time (``time.time``) throughout, because the stall's start is read from the daemon's log,
whose timestamps are wall-clock (``log_events``).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from testkit.spark import dir_size   # one definition of a directory's size

SAMPLE_S = 0.5
MB = 1024 * 1024            # the daemon's MB (kdaemon/worker/memory.py): MiB
UPLOADER_MODULE = "kdaemon.sinks.spark.uploader.process"

_STARTED = re.compile(rb"started worker (\d+) \(pid (\d+)\)")
# "%(asctime)s %(levelname)s worker-<i> %(name)s: %(message)s" (kdaemon/supervisor/child.py)
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (\w+) (\S+) (\S+): (.*)$", re.M)

# What the log says about a stall (kdaemon/worker/stall.py, kdaemon/worker/delivery.py).
EVENTS = {
    "unavailable": "sink unavailable (",
    "still_unavailable": "sink still unavailable after",
    "available_again": "sink available again after",
    "rewinding": "rewinding to the last commit",       # a flush whose batch is gone: re-read, re-staged
    "rebuilt": "sink rebuilt; consuming again",
    "over_budget": "is above its memory budget",       # kdaemon/worker/memory.py, once per excursion
}


@dataclass
class Track:
    """One process: its role ("supervisor", "worker", "uploader"), a worker's index, and samples."""

    pid: int
    role: str
    created: float
    index: int | None = None
    samples: list[tuple[float, float, int]] = field(default_factory=list)  # (time, cpu s, rss bytes)

    def cpu_at(self, t: float) -> float:
        """Cumulative CPU-seconds at ``t``: the last sample at or before it; 0 for a process
        created after ``t``; the first sample for one created before but first seen after."""
        last = None
        for ts, cpu, _ in self.samples:
            if ts > t:
                break
            last = cpu
        if last is not None:
            return last
        if self.created >= t or not self.samples:
            return 0.0
        return self.samples[0][1]

    def rss_in(self, a: float, b: float) -> list[int]:
        return [rss for ts, _, rss in self.samples if a <= ts <= b]


def _sample(p: psutil.Process) -> tuple[float, float, int, float]:
    with p.oneshot():
        cpu = p.cpu_times()
        return time.time(), cpu.user + cpu.system, p.memory_info().rss, p.create_time()


class ProcessSampler(threading.Thread):
    def __init__(self, daemon, staging: Path | None = None, interval: float = SAMPLE_S) -> None:
        super().__init__(name="stall-sampler", daemon=True)
        self.daemon_ = daemon
        self.staging = staging
        self.interval = interval
        self.tracks: dict[int, Track] = {}
        self.staged: list[tuple[float, int]] = []       # (time, bytes under the staging dir)
        self.lock = threading.Lock()
        self.halt = threading.Event()
        self.rounds = 0
        self.errors: list[str] = []
        self._log_pos = 0
        self._index: dict[int, int] = {}                # worker pid -> index

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample_once()
            except Exception as exc:   # keep sampling: one bad round must not end the figures
                if len(self.errors) < 20:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            self.halt.wait(self.interval)

    def _read_indexes(self) -> None:
        try:
            with open(self.daemon_.log_path, "rb") as f:
                f.seek(self._log_pos)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        for m in _STARTED.finditer(data[:end]):
            self._index[int(m[2])] = int(m[1])
        self._log_pos += end

    def sample_once(self) -> None:
        self._read_indexes()
        try:
            sup = psutil.Process(self.daemon_.pid)
            own = sup.cmdline()
        except psutil.NoSuchProcess:
            return
        found: list[tuple[psutil.Process, str]] = [(sup, "supervisor")]
        for child in sup.children():
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmd = child.cmdline()
                if UPLOADER_MODULE in " ".join(cmd):
                    found.append((child, "uploader"))
                    found += [(c, "uploader") for c in child.children(recursive=True)]
                elif cmd == own:
                    found.append((child, "worker"))
                else:
                    found.append((child, "other"))
            except psutil.NoSuchProcess:
                continue
        for p, role in found:
            self.note(p, role)
        if self.staging is not None:
            size = dir_size(self.staging) if self.staging.is_dir() else 0
            with self.lock:
                self.staged.append((time.time(), size))
        self.rounds += 1

    def note(self, p: psutil.Process, role: str) -> None:
        """Sample one process now (also called by the uploader killer right before a kill)."""
        try:
            t, cpu, rss, created = _sample(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            return
        with self.lock:
            track = self.tracks.get(p.pid)
            if track is None or abs(track.created - created) > 0.01:   # a new process, maybe a reused pid
                track = self.tracks[p.pid] = Track(p.pid, role, created)
            if track.index is None and role == "worker":
                track.index = self._index.get(p.pid)
            track.samples.append((t, cpu, rss))

    # -- figures ----------------------------------------------------------------------------------

    def _of(self, role: str, index: int | None = None) -> list[Track]:
        with self.lock:
            return [t for t in self.tracks.values()
                    if t.role == role and (index is None or t.index == index)]

    def worker_indexes(self) -> list[int]:
        return sorted({t.index for t in self._of("worker") if t.index is not None})

    def cpu(self, role: str, a: float, b: float, index: int | None = None) -> float:
        """CPU-seconds the processes of ``role`` used between ``a`` and ``b`` (those that died
        meanwhile included, up to their last sample)."""
        return sum(max(0.0, t.cpu_at(b) - t.cpu_at(a)) for t in self._of(role, index)
                   if t.created <= b)

    def peak_rss(self, role: str, a: float, b: float, index: int | None = None) -> int | None:
        values = [r for t in self._of(role, index) for r in t.rss_in(a, b)]
        return max(values) if values else None

    def rss_near(self, index: int, t: float, *, before: bool) -> int | None:
        """Worker ``index``'s RSS in the last sample before ``t`` (or the first after it)."""
        samples = sorted(s for tr in self._of("worker", index) for s in tr.samples)
        if before:
            earlier = [s for s in samples if s[0] <= t]
            return earlier[-1][2] if earlier else None
        later = [s for s in samples if s[0] >= t]
        return later[0][2] if later else None

    def rss_series(self, index: int, a: float, b: float, origin: float, bucket_s: float = 10.0) -> list:
        """Worker ``index``'s peak RSS (MB) per ``bucket_s`` between ``a`` and ``b``, as
        [seconds from ``origin`` at the bucket's start, MB]: the shape of the run, for the JSON."""
        peaks: dict[int, int] = {}
        for tr in self._of("worker", index):
            for ts, _, rss in tr.samples:
                if a <= ts <= b:
                    k = int((ts - origin) // bucket_s)
                    peaks[k] = max(peaks.get(k, 0), rss)
        return [[k * bucket_s, round(v / MB, 1)] for k, v in sorted(peaks.items())]

    def processes(self, role: str, a: float, b: float) -> int:
        """How many processes of ``role`` lived at some point between ``a`` and ``b``."""
        return sum(1 for t in self._of(role) if t.created <= b and t.samples and t.samples[-1][0] >= a)

    def peak_staged(self, a: float, b: float) -> int:
        with self.lock:
            return max((size for ts, size in self.staged if a <= ts <= b), default=0)


def log_time(stamp: str, millis: str) -> float:
    """A log line's asctime (local time, as ``logging`` writes it) as a wall-clock timestamp."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


def log_events(text: str, since: float = 0.0, until: float = float("inf")) -> dict:
    """Per worker index, how often each of ``EVENTS`` was logged between ``since`` and
    ``until``; when each kind was first logged (by any worker, and by each), and that line."""
    counts: dict[str, dict[int, int]] = {k: {} for k in EVENTS}
    first: dict[str, float] = {}
    first_by_worker: dict[str, dict[int, float]] = {k: {} for k in EVENTS}
    lines: dict[str, str] = {}
    for m in _LINE.finditer(text):
        who = m[4]
        if not who.startswith("worker-"):
            continue
        message = m[6]
        for kind, needle in EVENTS.items():
            if needle in message:
                t = log_time(m[1], m[2])
                if not since <= t <= until:
                    continue
                index = int(who[len("worker-"):])
                counts[kind][index] = counts[kind].get(index, 0) + 1
                first_by_worker[kind].setdefault(index, t)
                if kind not in first:
                    first[kind] = t
                    lines[kind] = m[0]
    return {"counts": counts, "first": first, "first_by_worker": first_by_worker, "first_line": lines}


def first_unavailable(text: str) -> float | None:
    """When a worker first logged "sink unavailable (" (wall clock), or None."""
    return log_events(text)["first"].get("unavailable")
