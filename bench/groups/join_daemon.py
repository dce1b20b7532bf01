"""bench/groups' daemon rows: ``kdaemon run`` with 4 workers on the bench topic, its group
changed from outside, and the time until the broker sees a stable group again.

One round per group protocol (the daemon's ``[kafka] group_protocol``, "classic" or
"consumer"), a fresh group each, in order:

* **start**: ``kdaemon run`` starts (process start to stable, 4 workers);
* **kill**: one worker is SIGKILLed (its pid from the supervisor's "started worker" line, still
  its child); the supervisor starts a successor, which under the consumer protocol first releases
  its predecessor's static membership (kdaemon/client/group/release.py); from the kill to stable;
* **ttin**: SIGTTIN to the supervisor, 4 -> 5 workers; from the signal to stable;
* **ttou**: SIGTTOU, 5 -> 4 workers; from the signal to stable.

**Stable** is the broker's view, since the workers are separate processes: confluent-kafka's
AdminClient ``describe_consumer_groups`` (ConsumerGroupDescribe under the consumer protocol,
DescribeGroups under classic), polled every ``POLL_S``.  A sample is good when the group's state
is STABLE, its members are exactly the live workers (by static instance id, ``gj-<index>``; after
a kill the killed worker's member id must be gone: its successor rejoined under the same
instance id with a new one.  Classic Kafka keeps the old member's client id on such a
replacement, so client ids cannot tell),
every member's assignment is non-empty (under the consumer protocol: equal to its target
assignment), and the assignments are disjoint and cover every partition.  The figure ends at the
first good sample from which on the description did not change for ``--quiet-s``; a sample's
instant is the middle of its request.  The classic members use ``--session-ms`` and the
heartbeat interval; under the consumer protocol the broker's ``group.consumer.*`` settings
(bench/groups sets them to the same) apply.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.1
EVENT_TIMEOUT_S = 120.0
WORKERS = 4
PROTOCOLS = ("classic", "consumer")
SCENARIOS = (("start", "daemon start: 4 workers to stable"),
             ("kill", "worker SIGKILLed, restarted: kill to stable"),
             ("ttin", "TTIN: 4 -> 5 workers, to stable"),
             ("ttou", "TTOU: 5 -> 4 workers, to stable"))
REPO_ROOT = Path(__file__).resolve().parents[2]


def write_config(path: Path, *, bootstrap: str, topic: str, group: str, protocol: str, session_ms: int,
                 heartbeat_ms: int, state_dir: Path, metrics_port: int) -> None:
    classic = (f"session_timeout_ms = {session_ms}\nheartbeat_interval_ms = {heartbeat_ms}\n"
               if protocol == "classic" else "# session and heartbeat: the broker's group.consumer.* settings\n")
    path.write_text(f"""\
# Written by bench/groups --daemon for one round ({protocol}).
plugins = []

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
group_protocol = "{protocol}"
auto_offset_reset = "earliest"
{classic}
[daemon]
topics = ["{topic}"]
workers = {WORKERS}
daemon_id = "gj"
state_dir = "{state_dir}"
metrics_addr = "127.0.0.1:{metrics_port}"
log_level = "INFO"

[deserializer]
key = "str"
value = "str"

[sink]
type = "null"
""")


def _live_children(pid: int) -> set[int]:
    """The supervisor's live (not zombie) children: its workers."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids = [int(x) for x in f.read().split()]
    except OSError:
        return set()
    out = set()
    for child in pids:
        try:
            with open(f"/proc/{child}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            out.add(child)
    return out


class DaemonGroup:
    """One ``kdaemon run`` in its own session and the broker's view of its group."""

    def __init__(self, *, bootstrap: str, topic: str, partitions: int, protocol: str, run_dir: Path,
                 session_ms: int, heartbeat_ms: int, quiet_s: float, env: dict) -> None:
        import uuid

        from testkit.common import free_port
        from confluent_kafka.admin import AdminClient

        self.topic, self.partitions, self.quiet_s = topic, partitions, quiet_s
        self.group = f"gj-daemon-{protocol}-{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.config = run_dir / "kdaemon.toml"
        self.log_path = run_dir / "kdaemon.log"
        write_config(self.config, bootstrap=bootstrap, topic=topic, group=self.group, protocol=protocol,
                     session_ms=session_ms, heartbeat_ms=heartbeat_ms, state_dir=run_dir / "state",
                     metrics_port=free_port())
        self.env = dict(env, PYTHONUNBUFFERED="1")
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self.proc: subprocess.Popen | None = None

    def start(self) -> float:
        exe = Path(sys.executable).with_name("kdaemon")
        cmd = ([str(exe)] if exe.exists() else [sys.executable, "-m", "kdaemon.cli"]) + ["run", "-c", str(self.config)]
        t = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.config.parent, start_new_session=True)
        return t

    def signal(self, sig: int) -> float:
        t = time.monotonic()
        os.kill(self.proc.pid, sig)
        return t

    def workers(self) -> set[int]:
        return _live_children(self.proc.pid)

    def started(self) -> list[tuple[int, int]]:
        """(index, pid) of every worker the supervisor logged starting."""
        import re
        return [(int(m[1]), int(m[2])) for m in re.finditer(r"started worker (\d+) \(pid (\d+)\)", self.log())]

    def live_instances(self) -> set[str]:
        live = self.workers()
        return {f"gj-{i}" for i, p in self.started() if p in live}

    def kill_worker(self, view) -> tuple[float, str]:
        """SIGKILL the worker with the highest index (its pid from the supervisor's log, still
        its live child): (the instant, its member id in ``view``)."""
        live = self.workers()
        index, pid = max((i, p) for i, p in self.started() if p in live)
        member_id = next(m[1] for m in view[1] if m[2] == f"gj-{index}")
        t = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        return t, member_id

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def chosen_protocols(self) -> list[str]:
        """The workers' own "worker <i>: group protocol ..." log lines, what follows "worker <i>: "."""
        import re
        return [m[1] for m in re.finditer(r"worker \d+: (group protocol .*)", self.log())]

    def describe(self):
        """(state name, ((client id, member id, instance id, partitions, target partitions or
        None), ...)) or
        None when the describe failed (the group may not exist yet)."""
        from confluent_kafka import KafkaException
        future = self.admin.describe_consumer_groups([self.group], request_timeout=5)[self.group]
        try:
            g = future.result()
        except KafkaException:
            return None

        def parts(a):
            return None if a is None else tuple(sorted(tp.partition for tp in a.topic_partitions
                                                       if tp.topic == self.topic))
        members = tuple(sorted((m.client_id, m.member_id, m.group_instance_id or "", parts(m.assignment) or (),
                                parts(m.target_assignment)) for m in g.members))
        return (getattr(g.state, "name", str(g.state)), members)

    def good(self, view, instances: set[str], gone: set[str]) -> bool:
        if view is None:
            return False
        state, members = view
        if state != "STABLE" or len(members) != len(instances) or {m[2] for m in members} != instances:
            return False
        if any(m[1] in gone or not m[3] or (m[4] is not None and m[4] != m[3]) for m in members):
            return False
        held = [p for m in members for p in m[3]]
        return sorted(held) == list(range(self.partitions))

    def stable(self, since: float, expect: int, gone: set[str] = frozenset()) -> tuple[float, object]:
        """The instant of the first good sample from which on nothing changed for quiet_s (and
        ``expect`` workers live), waiting for it; (instant, description)."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        became, last = None, None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdaemon exited with {self.proc.returncode}; see {self.log_path}")
            ta = time.monotonic()
            view = self.describe()
            instances = self.live_instances()
            t = (ta + time.monotonic()) / 2
            if view != last or became is None:
                became = t if len(instances) == expect and self.good(view, instances, gone) else None
                last = view
            if became is not None and t - became >= self.quiet_s:
                return max(became, since), view
            if t > deadline:
                raise TimeoutError(f"daemon group {self.group}: no stable group of {expect} workers within "
                                   f"{EVENT_TIMEOUT_S:.0f} s (last view {last}); see {self.log_path}")
            time.sleep(max(0.0, POLL_S - (time.monotonic() - ta)))

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
            raise RuntimeError(f"kdaemon did not stop within 60 s of SIGTERM; see {self.log_path}") from None


def run_daemon_round(*, bootstrap: str, topic: str, partitions: int, protocol: str, run_dir: Path,
                     session_ms: int, heartbeat_ms: int, quiet_s: float, env: dict) -> dict:
    """One daemon through the four scenarios (module docstring): seconds, and what the workers chose."""
    d = DaemonGroup(bootstrap=bootstrap, topic=topic, partitions=partitions, protocol=protocol, run_dir=run_dir,
                    session_ms=session_ms, heartbeat_ms=heartbeat_ms, quiet_s=quiet_s, env=env)
    out: dict = {"log": str(d.log_path)}
    try:
        t0 = d.start()
        t1, view = d.stable(t0, WORKERS)
        out["start_s"] = t1 - t0
        t0, killed = d.kill_worker(view)
        t1, _ = d.stable(t0, WORKERS, {killed})
        out["kill_s"] = t1 - t0
        t0 = d.signal(signal.SIGTTIN)
        t1, _ = d.stable(t0, WORKERS + 1)
        out["ttin_s"] = t1 - t0
        t0 = d.signal(signal.SIGTTOU)
        t1, view = d.stable(t0, WORKERS)
        out["ttou_s"] = t1 - t0
        out["protocols"] = d.chosen_protocols()
        out["released"] = [line for line in d.log().splitlines() if "static membership" in line][-3:]
    except BaseException as exc:
        try:
            d.stop()
        except RuntimeError as stop_error:
            exc.add_note(str(stop_error))
        raise
    d.stop()
    if d.proc.returncode != 0:
        raise RuntimeError(f"kdaemon exited with {d.proc.returncode} after SIGTERM; see {d.log_path}")
    return out


def print_daemon_table(daemon_stats: dict) -> None:
    """One row per scenario, per protocol the median (min-max) seconds."""
    if not daemon_stats:
        return
    protocols = list(daemon_stats)
    head = f"{'kdaemon run, 4 workers':<46}" + "".join(f"{p + ' s (min-max)':>30}" for p in protocols)
    print()
    print(head)
    print("-" * len(head))
    for key, label in SCENARIOS:
        cells = []
        for p in protocols:
            s = daemon_stats[p].get(key)
            cells.append(f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f})" if s else "-")
        print(f"{label:<46}" + "".join(f"{c:>30}" for c in cells))
    print("-" * len(head))
