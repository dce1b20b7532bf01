"""How soon every worker of ``kdaemon run`` holds partitions, under the consumer protocol (KIP-848),
on Apache Kafka 4.4 with its shipped group settings.

Run from the repository root::

    python bench/groups/spread.py [--repeats N] [--layouts 4x8 2x4] [--settle-s S]
                                  [--log-dir DIR] [--json results.json]

Input: one Apache Kafka node from the test suite's launcher (testkit/apache_kafka.py
``start_kafka``, through ``testkit.common.KafkaBroker``) with no group property of ours: the
shipped ``group.consumer.heartbeat.interval.ms`` (5 s), ``group.consumer.session.timeout.ms``
(45 s) and ``group.consumer.assignment.interval.ms`` (1 s) apply.  Per layout (``WxP``: W workers,
a topic of P partitions with ``RECORDS_PER_PARTITION`` records each) and repeat, a fresh group
and one ``kdaemon run`` (``[kafka] group_protocol`` left at "auto", which picks "consumer" on
Kafka 4.4; the workers' choice is printed), the null sink, through three scenarios in order:

* **start**: from just before ``kdaemon run`` is started (interpreter start included) until
  every one of the W workers holds partitions; printed beside it, how much of that passed before
  the supervisor started its workers (the interpreter, the CLI and the configuration check:
  what a loaded machine stretches most);
* **SIGHUP**: a reload with the configuration unchanged, which rolls every worker one at a time
  (each successor rejoins with its predecessor's static instance id); from the signal until W
  workers started after it are the live ones and every one of them holds partitions;
* **TTIN**: one worker more; from the signal until every one of the W + 1 workers holds
  partitions.

Between scenarios the daemon is left alone until no worker's assignment changed for
``--settle-s`` seconds (default 3).  Before the first round a throwaway group (confluent-kafka)
joins once: Kafka creates ``__consumer_offsets`` when the first group looks for its
coordinator, a one-time cost of seconds that no round should carry.

"Holds partitions" is the workers' own view, through the supervisor's log: the line ``worker
<i> (pid <p>) has its assignment: generation <g>, [<partitions>]``, written whenever a worker's
partitions change (kdaemon/supervisor/child.py), stamped by the supervisor's clock; a worker
stopped or exited (its "stopped with code"/"exited with code" line) no longer counts.  The
figure ends at the line from which on all of them held a non-empty list.  It is an upper bound
of the moment the last worker took its partitions by the worker's loop turn (the line goes out
after the poll in which it reconciled) and the pipe to the supervisor.

Also counted per scenario: how often a worker logged "the group has more members than the
topics have partitions" (never true in these layouts: it must be 0).

The goal, printed as met / not met, never asserted: every figure's median within ``GOAL_S``
(4 s) for both layouts.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from testkit.report import arguments, banner, check_sources, command_line, parse, write_json  # noqa: E402

GOAL_S = 4.0
LAYOUTS = ((4, 8), (2, 4))
RECORDS_PER_PARTITION = 100
EVENT_TIMEOUT_S = 90.0
POLL_S = 0.05
SCENARIOS = (("start", "start: kdaemon run to every worker holding partitions"),
             ("hup", "SIGHUP roll: signal to every new worker holding partitions"),
             ("ttin", "TTIN: signal to every worker (one more) holding partitions"))
FALSE_WARNING = "the group has more members than the topics have partitions"

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_STARTED = re.compile(r"started worker (\d+) \(pid (\d+)\)")
_HOLDS = re.compile(r"worker (\d+) \(pid (\d+)\) has its assignment: generation (?:-?\d+|-), \[(.*?)\]")
_GONE = re.compile(r"worker (\d+) \(pid (\d+)\) (?:stopped|exited) with code")
_SUPERVISOR = re.compile(r"kdaemon supervisor \d+ starting")


def stamp(line: str) -> float | None:
    """The wall-clock instant of a log line of the daemon (its asctime), or None."""
    m = _STAMP.match(line)
    if m is None:
        return None
    return datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def spread_at(log: str, since: float, expect: int, *, started_after: float | None = None) -> float | None:
    """The first instant at or after ``since`` from which ``expect`` live workers (only those
    started after ``started_after``, when given) all held partitions, by the supervisor's log;
    None if not (yet).  Workers are followed from the log's beginning: one that held partitions
    before ``since`` counts from ``since``."""
    live: dict[int, float] = {}      # pid -> when started
    holding: set[int] = set()
    for line in log.splitlines():
        t = stamp(line)
        if t is None:
            continue
        if m := _STARTED.search(line):
            live[int(m[2])] = t
        elif m := _HOLDS.search(line):
            pid = int(m[2])
            if m[3].strip():
                holding.add(pid)
            else:
                holding.discard(pid)
        elif m := _GONE.search(line):
            live.pop(int(m[2]), None)
            holding.discard(int(m[2]))
        else:
            continue
        counted = [p for p, at in live.items() if started_after is None or at >= started_after]
        if len(counted) == expect and all(p in holding for p in counted):
            return max(t, since)
    return None


def write_config(path: Path, *, bootstrap: str, topic: str, group: str, workers: int, state_dir: Path,
                 metrics_port: int) -> None:
    path.write_text(f"""\
# Written by bench/groups/spread.py for one round.  group_protocol: "auto" (consumer on Kafka 4.4);
# session and heartbeat: the broker's shipped group.consumer.* settings.
plugins = []

[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
auto_offset_reset = "earliest"

[daemon]
topics = ["{topic}"]
workers = {workers}
daemon_id = "spread"
state_dir = "{state_dir}"
metrics_addr = "127.0.0.1:{metrics_port}"
log_level = "INFO"

[deserializer]
key = "str"
value = "str"

[sink]
type = "null"
""")


class SpreadRound:
    """One ``kdaemon run`` of one layout, its log, and the waits on it."""

    def __init__(self, bootstrap: str, workers: int, partitions: int, run_dir: Path, env: dict) -> None:
        from testkit.common import free_port
        from testkit.produce import Writer, create_topic

        self.workers, self.partitions = workers, partitions
        tag = uuid.uuid4().hex[:8]
        self.topic = f"spread-{workers}x{partitions}-{tag}"
        self.group = f"spread-{workers}x{partitions}-{tag}"
        create_topic(bootstrap, self.topic, partitions)
        writer = Writer(bootstrap, self.topic, **{"linger.ms": 20})
        for i in range(partitions * RECORDS_PER_PARTITION):
            writer.send(f"record {i:06d}".encode(), f"k{i}".encode(), partition=i % partitions)
        writer.flush_checked(60)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.config = run_dir / "kdaemon.toml"
        self.log_path = run_dir / "kdaemon.log"
        write_config(self.config, bootstrap=bootstrap, topic=self.topic, group=self.group, workers=workers,
                     state_dir=run_dir / "state", metrics_port=free_port())
        self.env = dict(env, PYTHONUNBUFFERED="1")
        self.proc: subprocess.Popen | None = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def start(self) -> float:
        cmd = [sys.executable, "-m", "kdaemon.cli", "run", "-c", str(self.config)]
        t = time.time()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env, cwd=self.config.parent, start_new_session=True)
        return t

    def signal(self, sig: int) -> float:
        t = time.time()
        os.kill(self.proc.pid, sig)
        return t

    def wait_spread(self, since: float, expect: int, *, new_only: bool = False) -> float:
        """Seconds from ``since`` until ``expect`` workers held partitions (module docstring)."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"kdaemon exited with {self.proc.returncode}; see {self.log_path}")
            at = spread_at(self.log(), since, expect, started_after=since if new_only else None)
            if at is not None:
                return at - since
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expect} workers did not all hold partitions within {EVENT_TIMEOUT_S:.0f} s; "
                                   f"see {self.log_path}")
            time.sleep(POLL_S)

    def settle(self, quiet_s: float) -> None:
        """Until no assignment line was written for ``quiet_s`` seconds."""
        seen, since = -1, time.monotonic()
        while True:
            n = len(_HOLDS.findall(self.log()))
            if n != seen:
                seen, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return
            time.sleep(0.1)

    def supervisor_started(self) -> float:
        """When the supervisor logged that it starts its workers (wall clock)."""
        return next(stamp(line) for line in self.log().splitlines() if _SUPERVISOR.search(line))

    def false_warnings(self) -> int:
        return self.log().count(FALSE_WARNING)

    def chosen_protocols(self) -> list[str]:
        return sorted(set(re.findall(r"worker \d+: (group protocol \S+)", self.log())))

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


def warm_up(bootstrap: str) -> None:
    """One throwaway group joins (see the module docstring)."""
    from confluent_kafka import Consumer

    from testkit.produce import create_topic
    topic = f"spread-warm-up-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the warm-up group got no assignment within {EVENT_TIMEOUT_S:.0f} s")
            consumer.poll(0.2)
    finally:
        consumer.close()


def run_round(bootstrap: str, workers: int, partitions: int, run_dir: Path, env: dict, settle_s: float) -> dict:
    r = SpreadRound(bootstrap, workers, partitions, run_dir, env)
    out: dict = {"log": str(r.log_path)}
    try:
        warned = 0
        t0 = r.start()
        out["start_s"] = r.wait_spread(t0, workers)
        out["start_before_supervisor_s"] = r.supervisor_started() - t0
        r.settle(settle_s)
        out["start_false_warnings"], warned = r.false_warnings() - warned, r.false_warnings()
        t0 = r.signal(signal.SIGHUP)
        out["hup_s"] = r.wait_spread(t0, workers, new_only=True)
        r.settle(settle_s)
        out["hup_false_warnings"], warned = r.false_warnings() - warned, r.false_warnings()
        t0 = r.signal(signal.SIGTTIN)
        out["ttin_s"] = r.wait_spread(t0, workers + 1)
        r.settle(settle_s)
        out["ttin_false_warnings"] = r.false_warnings() - warned
        out["protocols"] = r.chosen_protocols()
    except BaseException as exc:
        try:
            r.stop()
        except RuntimeError as stop_error:
            exc.add_note(str(stop_error))
        raise
    r.stop()
    if r.proc.returncode != 0:
        raise RuntimeError(f"kdaemon exited with {r.proc.returncode} after SIGTERM; see {r.log_path}")
    return out


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def cell(s: dict | None) -> str:
    return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})" if s else "-"


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, repeats=(3, "rounds per layout (default 3)"))
    parser.add_argument("--layouts", nargs="+", default=[f"{w}x{p}" for w, p in LAYOUTS],
                        help="WxP: W workers on a topic of P partitions (default 4x8 2x4)")
    parser.add_argument("--settle-s", type=float, default=3.0,
                        help="between scenarios, seconds without an assignment change (default 3)")
    parser.add_argument("--log-dir", metavar="DIR", help="keep the broker's and daemons' logs here")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="a running Apache Kafka 4.4 with the shipped group settings instead of a new one")
    args = parse(parser, argv, {})
    if args is None:
        return 0
    layouts = []
    for spec in args.layouts:
        m = re.fullmatch(r"(\d+)x(\d+)", spec)
        if m is None or int(m[1]) < 1 or int(m[2]) <= int(m[1]):
            parser.error(f"--layouts: {spec!r} is not WxP with more partitions than workers (TTIN adds one)")
        layouts.append((int(m[1]), int(m[2])))

    import tempfile

    from testkit import common as _common

    head = banner("bench/groups/spread.py")
    log_ctx = tempfile.TemporaryDirectory(prefix="kdaemon-spread-") if not args.log_dir else None
    log_dir = Path(args.log_dir or log_ctx.name)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _common.child_env()   # kdaemon from the tree this script lives in
    runs: dict[str, list[dict]] = {f"{w}x{p}": [] for w, p in layouts}
    errors: list[str] = []
    with contextlib.ExitStack() as stack:
        if args.bootstrap:
            bootstrap = args.bootstrap
            print(f"broker: {bootstrap}, already running (--bootstrap)", flush=True)
        else:
            broker = stack.enter_context(_common.KafkaBroker(log_dir / "kafka"))
            bootstrap = broker.bootstrap
            print(f"{broker.describe()}\nbroker group settings: the shipped ones (no group.consumer.* property set)",
                  flush=True)
        warm_up(bootstrap)
        for rep in range(args.repeats):
            for w, p in layouts:
                key = f"{w}x{p}"
                print(f"  [{rep + 1}/{args.repeats}] {w} workers, {p} partitions  ", end="", flush=True)
                try:
                    r = run_round(bootstrap, w, p, log_dir / f"{key}-{rep}", env, args.settle_s)
                except (RuntimeError, TimeoutError) as exc:
                    errors.append(f"{key} repeat {rep + 1}: {exc}")
                    print(f"FAILED: {exc}", flush=True)
                    continue
                runs[key].append(r)
                print("  ".join(f"{k} {r[f'{k}_s']:.2f} s" for k, _ in SCENARIOS)
                      + f"  (false warnings {sum(r[f'{k}_false_warnings'] for k, _ in SCENARIOS)}; "
                        f"{'; '.join(r['protocols'])})", flush=True)

    stats = {key: {k: summary([r[f"{k}_s"] for r in rs]) for k, _ in SCENARIOS} for key, rs in runs.items()}
    print()
    head_line = f"{'seconds until every worker holds partitions':<62}" + "".join(
        f"{key + ' median (min-max)':>28}" for key in runs)
    print(head_line)
    print("-" * len(head_line))
    before = {key: summary([r["start_before_supervisor_s"] for r in rs]) for key, rs in runs.items()}
    for k, label in SCENARIOS:
        print(f"{label:<62}" + "".join(f"{cell(stats[key][k]):>28}" for key in runs))
        if k == "start":
            print(f"{'  of it, kdaemon run until its supervisor starts workers':<62}"
                  + "".join(f"{cell(before[key]):>28}" for key in runs))
    false = {key: sum(r[f"{k}_false_warnings"] for r in rs for k, _ in SCENARIOS) for key, rs in runs.items()}
    print(f"{'false more-members-than-partitions warnings':<62}" + "".join(f"{false[key]:>28}" for key in runs))
    print("-" * len(head_line))
    medians = [s["median"] for per in stats.values() for s in per.values() if s]
    met = bool(medians) and max(medians) <= GOAL_S and not errors
    print(f"goal every median within {GOAL_S:.0f} s: {'met' if met else 'NOT met'}"
          + (f" (worst median {max(medians):.2f} s)" if medians else ""))
    for e in errors:
        print("ERROR " + e)
    after = check_sources(head["source"])
    write_json(args.json, {
        "date": head["started"].isoformat(timespec="seconds"), "machine": head["machine"],
        "versions": head["versions"], "kdaemon_source": head["source"], "kdaemon_source_after": after,
        "command": command_line("bench/groups/spread.py", argv), "goal_s": GOAL_S, "met": met,
        "stats": stats, "start_before_supervisor": before, "false_warnings": false, "runs": runs,
        "errors": errors})
    if log_ctx is not None:
        log_ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
