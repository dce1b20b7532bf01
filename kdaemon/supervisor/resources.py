"""What a worker process uses (RSS, peak RSS, CPU), as the supervisor samples it every few seconds
for ``/metrics`` and for recycling a worker above ``max_worker_rss_mb``.

One ``psutil.Process`` is kept per worker between samples: ``cpu_percent`` is the CPU used since
the previous call on the same object, so a fresh object per sample would always read 0.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    rss_bytes: int
    peak_rss_bytes: int | None   # VmHWM; None where /proc has no such figure
    cpu_percent: float           # since the previous sample (100 = one core); 0.0 on the first


def peak_rss_bytes(pid: int) -> int | None:
    """VmHWM from /proc (Linux); None where there is no such file."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class ResourceSampler:
    def __init__(self) -> None:
        try:
            import psutil
        except ImportError:   # psutil is a dependency; without it there is just nothing to sample
            psutil = None
        self._psutil = psutil
        self._procs: dict[int, object] = {}

    def sample(self, pid: int) -> Usage | None:
        """The process's usage now, or None if it is gone (or psutil is missing)."""
        psutil = self._psutil
        if psutil is None:
            return None
        try:
            p = self._procs.get(pid)
            if p is None:
                p = self._procs[pid] = psutil.Process(pid)
            return Usage(p.memory_info().rss, peak_rss_bytes(pid), p.cpu_percent(interval=None))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            self._procs.pop(pid, None)
            return None

    def forget(self, pid: int) -> None:
        """The process was reaped (its pid may be reused)."""
        self._procs.pop(pid, None)
