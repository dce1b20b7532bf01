"""The chaos run's faults, on a schedule, and how long the daemon took to recover from each.

Each fault kind is one thread (``Schedule``) that injects its fault every ``every_s`` seconds
(or at the given moments) until the run stops it:

* ``worker_kill``: SIGKILL one live worker (pids from the supervisor's "started worker" lines
  and its children); the supervisor restarts it.
* ``leader_kill``: SIGKILL the broker leading a random partition, keep it down ``down_s``, start
  it again and wait until every replica is back in sync (so two brokers are never down at once:
  three KRaft voters survive one loss, not two).
* ``coordinator_kill``: the same for the broker coordinating the daemon's group, once.  It
  shares the broker thread with ``leader_kill``, so broker faults never overlap.
* ``sink_failure``: the sink refuses every write for ``window_s`` (testkit/chaos/sink.py).
* ``proxy_cut``: every connection between the daemon and the brokers is closed at once.
* ``uploader_kill`` (the Spark phase): SIGKILL the Spark uploader and the JVM it started; the
  supervisor restarts it, and the workers' outstanding uploads fail and are retried.

Recovery: a fault names the partitions it affects (the killed worker's assignment, the dead
broker's partitions, or all of them); it has recovered when, in a later sample of the sink's
output, every affected partition holds more records than at the moment recovery is measured
from: the fault itself for a worker kill, a proxy cut and a broker kill (the other replicas
take over while the broker is down), the end of the window for a sink failure (the producers
write to every partition all the time, so a partition that consumes again delivers again).
The sampler (every ``SAMPLE_S``) also keeps the peak lag: records acknowledged and kept, not yet
in the output.
"""

from __future__ import annotations

import os
import random
import re
import signal
import threading
import time
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from testkit.chaos.sink import REFUSALS_SUFFIX

SAMPLE_S = 0.5
KINDS = ("worker_kill", "leader_kill", "coordinator_kill", "sink_failure", "proxy_cut", "uploader_kill")
_TP = re.compile(r"(.+?)(?:-|\[)(\d+)\]?$")


@dataclass
class Fault:
    kind: str
    started: float                       # monotonic
    affected: frozenset                  # {(topic, partition)}
    detail: str = ""
    since: float | None = None           # recovery is measured from here (see FaultLog.watch)
    ended: float | None = None           # the fault is over (window closed, broker restarted)
    baseline: dict = field(default_factory=dict)
    recovered: float | None = None

    @property
    def recovery_s(self) -> float | None:
        return None if self.recovered is None or self.since is None else self.recovered - self.since


class Sampler(threading.Thread):
    """Every SAMPLE_S: what the sink's files hold per partition, and the lag end to end.

    The daemon's /metrics page is read once, at the end, not here: a scrape that races a worker
    creating its metrics files kills the supervisor (prometheus-client reads a file still 0 bytes
    long; found by this run, reported), and a harness that provoked that would measure itself.
    So delivery comes from the output (``OutputReader``), and the lag is the records the ledger
    says were acknowledged and kept minus the distinct ones in the output."""

    def __init__(self, reader, ledger, faults: "FaultLog") -> None:
        super().__init__(name="chaos-sampler", daemon=True)
        self.reader, self.ledger, self.faults = reader, ledger, faults
        self.halt = threading.Event()
        self.latest: dict = {"delivered": {}, "commits": 0.0}
        self.peak_lag = 0
        self.samples = 0

    def sample(self) -> dict:
        distinct, per_partition = self.reader.progress()
        kept = self.ledger.counts()["kept"]
        lag = max(0, kept - distinct)
        self.peak_lag = max(self.peak_lag, lag)
        return {"delivered": per_partition, "lag": lag, "commits": 0.0}

    def run(self) -> None:
        while not self.halt.wait(SAMPLE_S):
            sample = self.sample()
            self.samples += 1
            self.latest = sample
            self.faults.resolve(sample, time.monotonic())


def read_metrics(daemon) -> dict:
    """Rebalances, worker restarts and commits from the supervisor's /metrics (once, at the end)."""
    out = {"rebalances": 0.0, "restarts": 0.0, "commits": 0.0}
    names = {"kdaemon_rebalances_total": "rebalances", "kdaemon_worker_restarts_total": "restarts",
             "kdaemon_commits_total": "commits"}
    try:
        m = daemon.metrics()
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return {**out, "error": repr(exc)}
    for (name, _), value in m.items():
        if name in names:
            out[names[name]] += value
    return out


class FaultLog:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.sampler: Sampler | None = None

    def begin(self, kind: str, affected, detail: str = "") -> Fault:
        fault = Fault(kind, time.monotonic(), frozenset(affected), detail)
        with self.lock:
            self.faults.append(fault)
        return fault

    def watch(self, fault: Fault) -> None:
        """From now on the affected partitions are expected to deliver: a broker kill from the
        kill (the other replicas take over), a sink failure from the end of its window."""
        latest = self.sampler.sample() if self.sampler else {"delivered": {}}
        with self.lock:
            fault.baseline = {tp: latest["delivered"].get(tp, 0) for tp in fault.affected}
            fault.since = time.monotonic()

    def end(self, fault: Fault) -> None:
        if fault.since is None:
            self.watch(fault)
        fault.ended = time.monotonic()

    def resolve(self, sample: dict, now: float) -> None:
        with self.lock:
            for f in self.faults:
                if f.recovered is not None or f.since is None:
                    continue
                if all(sample["delivered"].get(tp, 0) > base for tp, base in f.baseline.items()):
                    f.recovered = now

    def summary(self) -> dict:
        with self.lock:
            out = {}
            for kind in KINDS:
                mine = [f for f in self.faults if f.kind == kind]
                times = sorted(f.recovery_s for f in mine if f.recovery_s is not None)
                out[kind] = {"injected": len(mine), "recovered": len(times),
                             "recovery_s_median": round(times[len(times) // 2], 1) if times else None,
                             "recovery_s_max": round(times[-1], 1) if times else None}
            return out


def parse_partitions(names: list[str]) -> set[tuple[str, int]]:
    out = set()
    for name in names:
        m = _TP.fullmatch(name)
        if m:
            out.add((m[1], int(m[2])))
    return out


class Schedule(threading.Thread):
    """Calls ``inject()`` at ``first_s`` and then every ``every_s`` (``times`` times at most)."""

    def __init__(self, name: str, inject, first_s: float, every_s: float, times: int | None = None) -> None:
        super().__init__(name=f"chaos-{name}", daemon=True)
        self.inject, self.first_s, self.every_s, self.times = inject, first_s, every_s, times
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        n = 0
        delay = self.first_s
        while not self.halt.wait(delay):
            started = time.monotonic()
            try:
                self.inject()
            except BaseException as exc:   # the run reports it and fails
                self.error = exc
                return
            n += 1
            if self.times is not None and n >= self.times:
                return
            delay = max(0.0, self.every_s - (time.monotonic() - started))


class Injector:
    """The faults themselves, against the run's cluster, daemon and sink trigger."""

    def __init__(self, cluster, daemon, faults: FaultLog, topics: list[str], partitions: int,
                 group: str, fail_file: Path, rng: random.Random, *, down_s: float = 8.0,
                 window_s: float = 20.0, coordinator_at: int = 1) -> None:
        self.cluster, self.daemon, self.faults = cluster, daemon, faults
        self.topics, self.partitions, self.group = topics, partitions, group
        self.fail_file, self.rng = fail_file, rng
        self.down_s, self.window_s = down_s, window_s
        self.all = {(t, p) for t in topics for p in range(partitions)}
        self.broker_faults = 0
        self.coordinator_at = coordinator_at   # which broker fault (0-based) is the coordinator's
        self.halt = threading.Event()

    def worker_kill(self) -> None:
        workers = self.daemon.workers()
        if not workers:
            return
        index = self.rng.choice(sorted(workers))
        pid = workers[index]
        mine = [r for r in self.daemon.ready_lines() if r["index"] == index]
        affected = parse_partitions(mine[-1]["partitions"]) if mine else set(self.all)
        fault = self.faults.begin("worker_kill", affected or self.all, f"worker {index} pid {pid}")
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.faults.end(fault)

    def broker_kill(self) -> None:
        if self.broker_faults == self.coordinator_at:
            victim = self.cluster.coordinator(self.group)
            kind, affected = "coordinator_kill", set(self.all)
        else:
            topic = self.rng.choice(self.topics)
            partition = self.rng.randrange(self.partitions)
            victim = self.cluster.leaders(topic)[partition]
            kind = "leader_kill"
            affected = {(t, p) for t in self.topics for p, n in self.cluster.leaders(t).items() if n == victim}
        self.broker_faults += 1
        fault = self.faults.begin(kind, affected or self.all, f"node {victim}")
        self.cluster.kafka.nodes[victim].kill()
        self.faults.watch(fault)
        self.halt.wait(self.down_s)
        self.cluster.kafka.restart(victim)
        self.faults.end(fault)
        self.cluster.wait_in_sync(self.topics, timeout=180.0)

    def sink_failure(self) -> None:
        fault = self.faults.begin("sink_failure", self.all, f"{self.window_s:.0f} s")
        self.fail_file.touch()
        refusals = Path(str(self.fail_file) + REFUSALS_SUFFIX)
        try:
            self.halt.wait(self.window_s)
            # A window no write met proves nothing: held open (up to three windows more) until
            # one does.  Workers write nothing while their sink cannot take records at all (a
            # killed uploader restarting, slowly on a loaded machine), and that can span the window.
            deadline = time.monotonic() + 3 * self.window_s
            while not refusals.exists() and time.monotonic() < deadline and not self.halt.wait(0.5):
                pass
        finally:
            self.fail_file.unlink(missing_ok=True)
        self.faults.end(fault)

    def uploader_kill(self) -> None:
        from testkit.chaos.spark import uploader
        proc = uploader(self.daemon.pid)
        if proc is None:   # being restarted: that is a kill already under way
            return
        try:
            family = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        fault = self.faults.begin("uploader_kill", self.all, f"uploader pid {proc.pid}")
        for p in family:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        self.faults.end(fault)

    def proxy_cut(self) -> None:
        fault = self.faults.begin("proxy_cut", self.all, f"cut {self.cluster.proxy.cuts + 1}")
        self.cluster.proxy.cut_all()
        self.faults.end(fault)
