"""The processes bench/spark/peer.py measures: a ``kdaemon run`` and bench/spark/peer_spark.py's
streaming query, each started in its own session, and the sampler that adds up CPU and memory
over a process tree."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil

from testkit.common import child_env, free_port
from bench.spark.peer_spark import PROTOCOL
from testkit.workload import TARGET, TYPES
from confluent_kafka import Consumer, KafkaException, TopicPartition

SPARK_SCRIPT = Path(__file__).resolve().with_name("peer_spark.py")
MASTER = "local[2]"
WORKERS = 2
PARTITION_BY = ["topic", "date"]
# testkit/workload.py's JSON values, all seven fields.
VALUE_SCHEMA = "id BIGINT, event STRING, user STRING, amount DOUBLE, currency STRING, items ARRAY<INT>, note STRING"
WORKLOADS = {
    "filter-10%": [{"header": "type", "op": "in", "action": "drop",
                    "values": [t.decode() for t in TYPES if t != TARGET]}],
    "all": [{"header": "type", "op": "equals", "value": "debug.synthetic", "action": "drop"}],
}
UPLOADER_MODULE = "kdaemon.sinks.spark.uploader.process"


# -- measuring a process tree --------------------------------------------------------------------

class TreeSampler(threading.Thread):
    """CPU seconds and RSS of a process and all its descendants, sampled every ``interval``.

    CPU: each process's own user+system time as last seen; at the end, the reaped-children times
    of the processes still alive are added (what exited and was waited for: a launcher, Spark's
    ``spark-class`` launcher JVM, the workers a reload replaced), less the last-seen own time of
    exited processes whose parent is alive (already inside that parent's reaped-children time),
    and less what such a process had used before ``rebase`` (a parent's reaped-children time
    holds a child's whole life: a worker replaced in the warm run brought its earlier run's CPU).  RSS: the sum over the tree at
    each sample, and its peak; ``hwm_sum_mb``: the sum of each process's own peak (VmHWM)."""

    def __init__(self, root_pid: int, classify, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root_pid, self.classify, self.interval = root_pid, classify, interval
        self.seen: dict[int, dict] = {}     # pid -> kind, ppid, own cpu, children cpu, hwm
        self.peak_rss = 0
        self.peak_by_kind: dict[str, int] = {}
        self.samples = 0
        self._done = threading.Event()
        self._lock = threading.Lock()

    def sample(self) -> set[int]:
        alive: set[int] = set()
        try:
            root = psutil.Process(self.root_pid)
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return alive
        total = 0
        by_kind: dict[str, int] = {}
        for p in procs:
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    rss = p.memory_info().rss
                    entry = self.seen.get(p.pid)
                    if entry is None:
                        entry = self.seen[p.pid] = {"kind": None, "ppid": p.ppid(), "hwm": 0}
                    entry["kind"] = self.classify(p, p.pid == self.root_pid) or entry["kind"]
                    entry["own"] = t.user + t.system
                    entry["children"] = t.children_user + t.children_system
                    entry["hwm"] = max(entry["hwm"], _hwm(p.pid) or rss)
                total += rss
                by_kind[entry["kind"]] = by_kind.get(entry["kind"], 0) + rss
                alive.add(p.pid)
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        if total > self.peak_rss:
            self.peak_rss, self.peak_by_kind = total, by_kind
        self.samples += 1
        return alive

    def run(self) -> None:
        while not self._done.is_set():
            with self._lock:
                self.sample()
            self._done.wait(self.interval)

    def rebase(self) -> None:
        """Count from now on: CPU from here, the RSS peak over samples from here (``hwm_sum_mb``
        stays each process's lifetime peak)."""
        with self._lock:
            self.sample()
            for e in self.seen.values():
                e["base"] = e.get("own", 0.0) + e.get("children", 0.0)
            self.peak_rss, self.peak_by_kind = 0, {}

    def stop(self) -> dict:
        self._done.set()
        with self._lock:
            alive = self.sample()
        self.join(5)
        by_kind: dict[str, float] = {}
        before: dict[int, float] = {}   # per live parent: its reaped children's CPU before rebase
        for pid, e in self.seen.items():
            if pid not in alive and e["ppid"] in alive:
                before[e["ppid"]] = before.get(e["ppid"], 0.0) + e.get("base", 0.0)
        for pid, e in self.seen.items():
            cpu = e.get("own", 0.0)
            if pid in alive:
                cpu += e.get("children", 0.0) - before.get(pid, 0.0)
            elif e["ppid"] in alive:
                continue   # counted in its parent's reaped-children time
            cpu = max(0.0, cpu - e.get("base", 0.0))
            kind = e["kind"] or "other"
            by_kind[kind] = by_kind.get(kind, 0.0) + cpu
        return {"cpu_s": sum(by_kind.values()), "cpu_s_by_process": by_kind, "rss_peak_mb": self.peak_rss / 2**20,
                "rss_at_peak_mb_by_process": {k: v / 2**20 for k, v in self.peak_by_kind.items()},
                "hwm_sum_mb": sum(e["hwm"] for e in self.seen.values()) / 2**20, "processes": len(self.seen),
                "samples": self.samples}


def _hwm(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _is_java(p: psutil.Process) -> bool:
    return p.name() == "java" or os.path.basename((p.cmdline() or [""])[0]) == "java"


def kdaemon_kind(p: psutil.Process, root: bool) -> str:
    if root:
        return "supervisor"
    if _is_java(p):
        return "uploader JVM"
    cmd = " ".join(p.cmdline())
    if UPLOADER_MODULE in cmd:
        return "uploader (Python)"
    if "kdaemon" in cmd:
        return "workers"
    return "uploader JVM launcher"


def spark_kind(p: psutil.Process, root: bool) -> str:
    if root:
        return "driver (Python)"
    return "JVM" if _is_java(p) else "JVM launcher"


# -- kdaemon -------------------------------------------------------------------------------------

def _toml(x) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (str, list)):
        return json.dumps(x)   # a JSON string or list of strings is TOML
    return repr(x)


def write_config(path: Path, *, bootstrap: str, topic: str, group: str, state: Path, rules: list[dict],
                 sink: dict) -> None:
    """bench/spark/sink.py's daemon settings, the workload's rule as a ``[[filters]]`` entry."""
    lines = ["plugins = []", "", "[kafka]", f"bootstrap_servers = {_toml(bootstrap)}", f"group_id = {_toml(group)}",
             'auto_offset_reset = "earliest"', "session_timeout_ms = 6000", "fetch_max_wait_ms = 100",
             "max_poll_records = 10000", "", "[daemon]", f"topics = [{_toml(topic)}]", f"workers = {WORKERS}",
             f"state_dir = {_toml(str(state))}", f'metrics_addr = "127.0.0.1:{free_port()}"',
             'on_deserialize_error = "skip"', "max_buffered_records = 400000", "heartbeat_timeout_s = 120", ""]
    for rule in rules:
        lines += ["[[filters]]"] + [f"{k} = {_toml(v)}" for k, v in rule.items()] + [""]
    lines += ["[deserializer]", 'key = "bytes"', 'value = "bytes"', "", "[sink]"]
    lines += [f"{k} = {_toml(v)}" for k, v in sink.items()]
    path.write_text("\n".join(lines) + "\n")


class CommittedWatch:
    """A group's committed offsets, read by one confluent-kafka consumer kept open (OffsetFetch,
    never a group member); a new group's coordinator that is not ready yet reads as nothing
    committed."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.topic = topic
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def reached(self, ends: dict[int, int]) -> bool:
        try:
            got = self.consumer.committed([TopicPartition(self.topic, p) for p in ends], timeout=10)
        except KafkaException:   # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS: not yet
            return False
        return all(tp.offset >= ends[tp.partition] for tp in got)

    def close(self) -> None:
        self.consumer.close()


class Kdaemon:
    """One ``kdaemon run``, started in its own session, stopped with SIGTERM."""

    def __init__(self, run_dir: Path, bootstrap: str, topic: str, rules: list[dict], sink: dict) -> None:
        self.run_dir, self.bootstrap, self.topic = run_dir, bootstrap, topic
        self.group = f"bench-peer-{uuid.uuid4().hex[:8]}"
        self.config = run_dir / "kdaemon.toml"
        self._settings = {"bootstrap": bootstrap, "group": self.group, "state": run_dir / "state", "rules": rules,
                          "sink": sink}
        write_config(self.config, topic=topic, **self._settings)
        self.log_path = run_dir / "kdaemon.log"
        self.proc: subprocess.Popen | None = None
        self.watch: CommittedWatch | None = None

    def start(self) -> float:
        env = child_env(drop=("NOTIFY_SOCKET", "PROMETHEUS_MULTIPROC_DIR"))
        t0 = time.time()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "kdaemon.cli", "run", "-c", str(self.config)],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)
        return t0

    def alive_or_raise(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"kdaemon exited with {self.proc.returncode}; see {self.log_path}")

    def switch_topic(self, topic: str) -> None:
        """What an operator does to give a running daemon another topic: the configuration
        names ``topic`` instead, and SIGHUP (the supervisor rolls its workers; the uploader,
        whose settings did not change, keeps running)."""
        write_config(self.config, topic=topic, **self._settings)
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        self.topic = topic
        self.proc.send_signal(signal.SIGHUP)

    def wait_committed(self, ends: dict[int, int], timeout: float, interval: float = 0.05) -> float:
        """When the group's commits reached ``ends``, asked every ``interval``: Spark's side
        reports its own end, so a long interval would add up to itself to kdaemon's time only."""
        deadline = time.monotonic() + timeout
        if self.watch is None:
            self.watch = CommittedWatch(self.bootstrap, self.group, self.topic)
        while True:
            self.alive_or_raise()
            if self.watch.reached(ends):
                return time.time()
            if time.monotonic() > deadline:
                raise RuntimeError(f"kdaemon did not commit {ends} within {timeout:g} s; see {self.log_path}")
            time.sleep(interval)

    def wait_settled(self, quiet_s: float, timeout: float) -> float:
        """Until the daemon is in its steady state: every worker ready and holding partitions
        (the bench's topics have more partitions than ``WORKERS``), the assignment unchanged for
        ``quiet_s``.  The seconds waited.  ``kdaemon status`` (the control socket) is asked,
        as an operator would."""
        from kdaemon.supervisor.control import ControlError, request_status
        started = deadline = time.monotonic()
        deadline += timeout
        last, since = None, time.monotonic()
        while True:
            self.alive_or_raise()
            try:
                status = request_status(str(self._settings["state"]), timeout_s=5)
                held = tuple(sorted((w.pid, w.state, tuple(sorted((p.topic, p.partition) for p in w.partitions)))
                                    for w in status.workers))
            except ControlError:
                held = None
            now = time.monotonic()
            if held != last:
                last, since = held, now
            elif held and len(held) == WORKERS and all(state == "ready" and parts for _, state, parts in held) \
                    and now - since >= quiet_s:
                return now - started
            if now > deadline:
                raise RuntimeError(f"kdaemon's workers did not settle within {timeout:g} s (last seen: {last}); "
                                   f"see {self.log_path}")
            time.sleep(0.1)

    def wait_serving(self, timeout: float = 180) -> None:
        self._wait_logged("uploader listening on", "start", timeout)

    def _wait_logged(self, line: str, what: str, timeout: float) -> None:
        """Until the daemon's log holds ``line``; RuntimeError naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        while line not in self.log_path.read_text(errors="replace"):
            self.alive_or_raise()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the uploader did not {what} within {timeout:g} s; see {self.log_path}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        if code is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise RuntimeError(f"kdaemon did not stop within 120 s of SIGTERM; see {self.log_path}")
        if code != 0:
            raise RuntimeError(f"kdaemon exited with {code} after SIGTERM; see {self.log_path}")

    def kill(self) -> None:
        if self.watch is not None:
            self.watch.close()
            self.watch = None
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def kdaemon_sink(fmt: str, path: Path, extra: dict) -> dict:
    return {"type": "spark", "format": fmt, "path": str(path), "master": MASTER, "value_format": "json",
            "value_schema": VALUE_SCHEMA, "partition_by": PARTITION_BY, **extra}


# -- the Spark peer ------------------------------------------------------------------------------

class SparkPeer:
    """bench/spark/peer_spark.py's streaming query in a child process: its protocol lines on
    stdout, its (and Spark's) log in a file, stopped by closing its stdin."""

    def __init__(self, run_dir: Path, spec: dict) -> None:
        self.run_dir, self.spec = run_dir, spec
        self.log_path = run_dir / "spark.log"
        self.proc: subprocess.Popen | None = None
        self.events: queue.Queue = queue.Queue()

    def start(self) -> float:
        t0 = time.time()
        spec = dict(self.spec, t_launch=t0)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(SPARK_SCRIPT), "stream", json.dumps(spec)],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                         env=child_env(), start_new_session=True, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        return t0

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                self.events.put(json.loads(line[len(PROTOCOL):]))
        self.events.put({"event": "exit"})

    def wait_event(self, name: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                ev = self.events.get(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Spark peer sent no {name!r} within {timeout:g} s; see {self.log_path}")
                continue
            if ev["event"] == name:
                return ev
            if ev["event"] == "exit":
                self.proc.wait(10)
                raise RuntimeError(f"the Spark peer exited with {self.proc.returncode} before {name!r}; "
                                   f"see {self.log_path}:\n{self.log_tail()}")

    def go(self) -> None:
        """After "warm": start the main query (``stream_main``)."""
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def log_tail(self, lines: int = 15) -> str:
        text = [x for x in self.log_path.read_text(errors="replace").splitlines() if not x.lstrip().startswith("at ")]
        return "\n".join(text[-lines:])

    def stop(self) -> dict:
        """Close stdin (the query stops, then the session); its last summary."""
        self.proc.stdin.close()
        ev = self.wait_event("stopped", 180)
        self.proc.wait(60)
        return ev

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def processed(self, ends: dict[int, int]) -> bool:
        """Whether the query's last committed micro-batch (checkpoint ``commits/N``) read up to
        ``ends`` (its ``offsets/N``): its rows are in the table by then."""
        cp = Path(self.spec["checkpoint"])
        try:
            done = [int(f.name) for f in (cp / "commits").iterdir() if f.name.isdigit()]
        except FileNotFoundError:
            return False
        if not done:
            return False
        lines = (cp / "offsets" / str(max(done))).read_text().splitlines()
        offsets = json.loads(lines[-1]).get(self.spec["topic"], {})
        return all(int(offsets.get(str(p), 0)) >= e for p, e in ends.items())

    def wait_processed(self, ends: dict[int, int], timeout: float, interval: float = 0.25) -> float:
        deadline = time.monotonic() + timeout
        while not self.processed(ends):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Spark peer exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Spark peer did not process {ends} within {timeout:g} s; see {self.log_path}")
            time.sleep(interval)
        return time.time()


def spark_spec(fmt: str, path: Path, checkpoint: Path, bootstrap: str, topic: str, workload: str,
               trigger) -> dict:
    return {"format": fmt, "path": str(path), "checkpoint": str(checkpoint), "bootstrap": bootstrap,
            "topic": topic, "rules": WORKLOADS[workload], "value_schema": VALUE_SCHEMA, "master": MASTER,
            "partition_by": PARTITION_BY, "trigger": trigger}
