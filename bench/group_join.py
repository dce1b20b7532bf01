"""Group join latency: kdaemon's Consumer beside confluent-kafka, on the same Tansu broker.

Run from the repository root::

    python bench/group_join.py [--repeats N] [--heartbeat-ms MS] [--poll-ms MS] [--trace]
                               [--json results.json]

Input: a Tansu broker on a free loopback port (``bench/_common.py``), one topic of 4 partitions
pre-filled by confluent-kafka with 250 records in every partition, so whichever partitions a
member gets, it has records to read from offset 0.

Both clients get the same group settings: ``session.timeout.ms`` 6000, the same heartbeat
interval (``--heartbeat-ms``, default 1000), the ``range`` assignor only,
``auto.offset.reset=earliest`` and auto-commit off.  Auto-commit is off so that no member ever
commits: a newcomer then starts its partitions at offset 0 (by the reset) and always has a record
to return, and no commit round trip sits in either client's rebalance.  Fetch settings stay at
both clients' defaults (``fetch_max_wait_ms`` / ``fetch.wait.max.ms`` 500).  Every run uses a
fresh group id.

Two cases, each repeated ``--repeats`` times (default 5), clients interleaved and their order
alternated from one repeat to the next:

* (a) solo: one member joins an empty group.  Figure: subscribe → first record.
* (b) newcomer: a first member (same client) has joined, read its first records and is polling
  (``--poll-ms`` per poll call, default 1000); ``--settle-s`` later (default 1.0) a second member
  subscribes.  Figures: the newcomer's subscribe → first record, and subscribe → both stable, the
  moment the later of the two members' assignment callbacks ran with assignments that are
  disjoint, non-empty and together cover all four partitions.

Every member runs in its own child process (``--worker``), so each client connects to the broker
from scratch: connection set-up, ApiVersions, metadata and coordinator discovery are inside the
figure for both.  The clock starts right before the consumer object is built (``subscribe`` is
the very next call) because confluent-kafka starts connecting in its constructor; imports are
done before, including the group module kdaemon's ``Consumer()`` would otherwise import lazily.
Children report ``time.monotonic()`` instants, which are comparable across processes on one
Linux machine (CLOCK_MONOTONIC), so the parent can combine two members' events.

Tansu's group coordinator holds every JoinGroup about 3 s (an initial-rebalance-style delay,
also on the rejoin of a member that is already in the group) and, in (b), the non-leader's
SyncGroup about 1 s.  Those holds are most of every figure and the same for both clients; the
breakdown printed with ``--trace`` shows them apart from the clients' own time.

``--trace`` adds, after the timed runs, one traced run of each case per client and prints the
timelines: kdaemon's with a wrapper around its ``NetworkClient.send`` (every request's send and
answer), its connections' set-up and the ``kdaemon.client`` DEBUG log; confluent-kafka's from
librdkafka's ``debug=cgrp,protocol`` log (millisecond wall-clock stamps).  Traced runs are not
part of the figures.

Nothing here asserts a timing; the goal (kdaemon ≤ confluent-kafka) is printed as met / not met.
"""

from __future__ import annotations

# Only the standard library at module level: a worker imports nothing but its own client.
import importlib
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

TOPIC = "bench-group-join"
PARTITIONS = 4
RECORDS_PER_PARTITION = 250
SESSION_TIMEOUT_MS = 6000
ASSIGNOR = "range"
CHILD_TIMEOUT_S = 90.0       # one member's whole life, set-up to exit
EVENT_TIMEOUT_S = 60.0       # one awaited event (ready, first record, stable)
CLIENTS = ("kdaemon", "confluent")
LABELS = {"kdaemon": "kdaemon", "confluent": "confluent-kafka"}
REPO_ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from bench._join_trace import (  # noqa: E402
    PHASES, KdaemonTrace, confluent_timeline, kdaemon_timeline, phases, print_timeline, rebalance_reaction)
from bench._report import arguments, banner, check_sources, command_line, parse, write_json  # noqa: E402


# -- the worker (child process) ----------------------------------------------------------------

class Emitter:
    """One JSON object per stdout line, flushed at once: the parent reacts to events live."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": time.monotonic(), **fields}, default=str)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def _stop_on_stdin(stop: threading.Event) -> None:
    """The parent writes a line (or closes stdin) when this member may stop."""
    def read() -> None:
        sys.stdin.readline()
        stop.set()
    threading.Thread(target=read, daemon=True).start()


def read_until_stopped(poll, spec: dict, emit: Emitter, stop: threading.Event, t_build: float,
                       on_first=None) -> tuple[float, int]:
    """Poll until the first records came and (a newcomer, a first member) the parent said stop:
    (when the first records came, records read).  ``poll()`` -> (records, their partitions)."""
    deadline = t_build + spec["max_seconds"]
    first = None
    records = 0
    while time.monotonic() < deadline:
        n, partitions = poll()
        if n and first is None:
            first = time.monotonic()
            if on_first is not None:
                on_first(n)
            emit("first", records=n, partitions=partitions)
        records += n
        if first is not None and (spec["role"] == "solo" or stop.is_set()):
            break
    if first is None:
        raise RuntimeError(f"no record within {spec['max_seconds']} s")
    return first, records


def worker_kdaemon(spec: dict, emit: Emitter) -> dict:
    from kdaemon.client import Consumer
    # Consumer() imports its group module lazily, the first time one is built with a group_id
    # (about 14 ms here).  Imported now, so that the clock, as for confluent-kafka, runs no imports.
    importlib.import_module("kdaemon.client.group.coordinator")

    trace = KdaemonTrace() if spec["trace"] else None
    if trace:
        trace.install()
    stop = threading.Event()
    _stop_on_stdin(stop)

    class Listener:
        def on_partitions_revoked(self, partitions) -> None:
            emit("revoked", partitions=sorted(tp.partition for tp in partitions))

        def on_partitions_assigned(self, partitions) -> None:
            emit("assigned", partitions=sorted(tp.partition for tp in consumer.assignment()))

        def on_partitions_lost(self, partitions) -> None:
            emit("revoked", partitions=sorted(tp.partition for tp in partitions))

    t_build = time.monotonic()
    consumer = Consumer(spec["bootstrap"], group_id=spec["group"], session_timeout_ms=SESSION_TIMEOUT_MS,
                        heartbeat_interval_ms=spec["heartbeat_ms"], partition_assignment_strategy=(ASSIGNOR,),
                        auto_offset_reset="earliest", enable_auto_commit=False)
    t_subscribe = time.monotonic()
    consumer.subscribe([spec["topic"]], listener=Listener())
    emit("subscribed", t_build=t_build, t_subscribe=t_subscribe)
    if trace:
        trace.events.insert(0, (t_build, "Consumer() built"))
        trace.add("subscribe() returned")

    def poll() -> tuple[int, list[int]]:
        batch = consumer.poll(spec["poll_ms"])
        n = sum(len(v) for v in batch.values())
        return n, sorted(tp.partition for tp in batch) if n else []

    def on_first(n: int) -> None:
        if trace:
            trace.add(f"poll() returned the first {n} records")
    first, records = read_until_stopped(poll, spec, emit, stop, t_build, on_first)
    consumer.close()
    return {"t_build": t_build, "t_subscribe": t_subscribe, "t_first": first, "records": records,
            "trace": [(t - t_build, text) for t, text in trace.events] if trace else None}


def worker_confluent(spec: dict, emit: Emitter) -> dict:
    from confluent_kafka import Consumer

    stop = threading.Event()
    _stop_on_stdin(stop)
    conf = {"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
            "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": spec["heartbeat_ms"],
            "partition.assignment.strategy": ASSIGNOR, "auto.offset.reset": "earliest",
            "enable.auto.commit": False}
    if spec["trace"]:
        conf.update({"debug": "cgrp,protocol", "log_level": 7})

    def on_assign(consumer, partitions) -> None:
        emit("assigned", partitions=sorted(tp.partition for tp in partitions))

    def on_revoke(consumer, partitions) -> None:
        emit("revoked", partitions=sorted(tp.partition for tp in partitions))

    wall0, t_build = time.time(), time.monotonic()
    consumer = Consumer(conf)
    t_subscribe = time.monotonic()
    consumer.subscribe([spec["topic"]], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    emit("subscribed", t_build=t_build, t_subscribe=t_subscribe)
    timeout = spec["poll_ms"] / 1000

    def poll() -> tuple[int, list[int]]:
        msg = consumer.poll(timeout)
        return (1, [msg.partition()]) if msg is not None and not msg.error() else (0, [])
    first, records = read_until_stopped(poll, spec, emit, stop, t_build)
    consumer.close()
    # librdkafka's debug log goes to stderr; the parent turns it into a timeline.
    return {"t_build": t_build, "t_subscribe": t_subscribe, "t_first": first, "records": records,
            "wall_at_build": wall0, "t_first_rel": first - t_build}


WORKERS = {"kdaemon": worker_kdaemon, "confluent": worker_confluent}


def run_worker(spec: dict) -> None:
    emit = Emitter()
    try:
        result = WORKERS[spec["client"]](spec, emit)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        emit("error", error=f"{type(exc).__name__}: {exc}")
        raise
    emit("result", **result)


# -- the parent: broker, topic, members --------------------------------------------------------

class Member:
    """A child process running one consumer; its stdout events arrive on a queue."""

    def __init__(self, spec: dict, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        from bench import _common
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        env = _common.child_env()   # kdaemon from the tree this script lives in, as the parent's
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, text=True, bufsize=1)
        self.events: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self.events.put({"event": "exit"})

    def next_event(self, timeout: float) -> dict:
        try:
            ev = self.events.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.spec['client']} {self.spec['role']}: no event within {timeout:.0f} s; "
                               f"see {self.log_path}") from None
        self.seen.append(ev)
        if ev["event"] == "error":
            raise RuntimeError(f"{self.spec['client']} {self.spec['role']}: {ev['error']}")
        if ev["event"] == "exit":
            raise RuntimeError(f"{self.spec['client']} {self.spec['role']} exited early "
                               f"(code {self.proc.wait()}); see {self.log_path}")
        return ev

    def wait_for(self, name: str, timeout: float = EVENT_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            ev = self.next_event(max(0.0, deadline - time.monotonic()))
            if ev["event"] == name:
                return ev

    def stop(self) -> dict:
        """Ask the member to stop, and return its result."""
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass
        try:
            return self.wait_for("result", CHILD_TIMEOUT_S)
        finally:
            self.kill()

    def kill(self) -> None:
        """Stop our own child by its Popen handle (never by name)."""
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


def prepare_topic(bootstrap: str) -> None:
    """Create the topic and write RECORDS_PER_PARTITION records to every partition."""
    from tests.support.produce import Writer, create_topic

    create_topic(bootstrap, TOPIC, PARTITIONS)
    writer = Writer(bootstrap, TOPIC, **{"linger.ms": 20})
    for i in range(PARTITIONS * RECORDS_PER_PARTITION):
        writer.send(f"record {i:06d} ".encode() * 8, f"k{i}".encode(), partition=i % PARTITIONS)
    writer.flush_checked(60)
    delivered = [writer.counts.get(p, 0) for p in range(PARTITIONS)]
    if delivered != [RECORDS_PER_PARTITION] * PARTITIONS:
        raise RuntimeError(f"produce failed: delivered {delivered}")


def _spec(args, bootstrap: str, client: str, role: str, group: str, trace: bool) -> dict:
    return {"client": client, "role": role, "bootstrap": bootstrap, "topic": TOPIC, "group": group,
            "heartbeat_ms": args.heartbeat_ms, "poll_ms": args.poll_ms, "trace": trace,
            "max_seconds": CHILD_TIMEOUT_S - 10}


def run_solo(args, bootstrap: str, client: str, log_dir: Path, tag: str, trace: bool = False) -> dict:
    group = f"gj-solo-{client}-{uuid.uuid4().hex[:8]}"
    member = Member(_spec(args, bootstrap, client, "solo", group, trace), log_dir / f"{tag}-solo.log")
    try:
        result = member.wait_for("result", CHILD_TIMEOUT_S)
    finally:
        member.kill()
    return {"first_s": result["t_first"] - result["t_build"],
            "build_s": result["t_subscribe"] - result["t_build"],
            "events": member.seen, "result": result, "log": str(member.log_path)}


def _stable_at(events: dict[str, list[dict]], since: float) -> float | None:
    """The first instant after ``since`` at which both members' latest assignments are disjoint,
    non-empty and cover every partition (the later of the two callbacks that made them so)."""
    timeline = sorted((ev["t"], who, ev) for who, evs in events.items() for ev in evs
                      if ev["event"] in ("assigned", "revoked"))
    current: dict[str, tuple[float, set]] = {}
    for t, who, ev in timeline:
        parts = set(ev["partitions"]) if ev["event"] == "assigned" else set()
        current[who] = (t, parts)
        if len(current) == 2 and t >= since:
            (ta, a), (tb, b) = current.values()
            if a and b and not a & b and a | b == set(range(PARTITIONS)):
                return max(ta, tb)
    return None


def run_newcomer(args, bootstrap: str, client: str, log_dir: Path, tag: str, trace: bool = False) -> dict:
    group = f"gj-pair-{client}-{uuid.uuid4().hex[:8]}"
    first = Member(_spec(args, bootstrap, client, "first", group, trace), log_dir / f"{tag}-first.log")
    newcomer = None
    try:
        first.wait_for("first")
        time.sleep(args.settle_s)
        newcomer = Member(_spec(args, bootstrap, client, "newcomer", group, trace),
                          log_dir / f"{tag}-newcomer.log")
        sub = newcomer.wait_for("subscribed")
        newcomer.wait_for("first")
        # Collect assignment events from both until the pair is stable.
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        stable = None
        while stable is None:
            for m in (first, newcomer):
                while True:
                    try:
                        ev = m.events.get_nowait()
                    except queue.Empty:
                        break
                    m.seen.append(ev)
                    if ev["event"] in ("error", "exit"):
                        raise RuntimeError(f"{client} {m.spec['role']}: {ev.get('error', 'exited')}; "
                                           f"see {m.log_path}")
            stable = _stable_at({"first": first.seen, "newcomer": newcomer.seen}, sub["t_build"])
            if stable is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{client}: the pair was not stable within {EVENT_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
        r_new = newcomer.stop()
        newcomer_events = newcomer.seen
        newcomer = None
        r_first = first.stop()
    finally:
        if newcomer is not None:
            newcomer.kill()
        first.kill()
    t0 = r_new["t_build"]
    return {"first_s": r_new["t_first"] - t0, "stable_s": stable - t0,
            "build_s": r_new["t_subscribe"] - t0, "result_newcomer": r_new, "result_first": r_first,
            "events_first": first.seen, "events_newcomer": newcomer_events,
            "log_first": str(first.log_path), "log_newcomer": str(log_dir / f"{tag}-newcomer.log")}


# -- report ------------------------------------------------------------------------------------

def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values),
            "all": values} if values else {}


METRICS = (("solo_first_s", "(a) solo: subscribe → first record"),
           ("newcomer_first_s", "(b) newcomer: subscribe → first record"),
           ("pair_stable_s", "(b) newcomer: subscribe → both members stable"))


def print_table(stats: dict) -> list[str]:
    head = (f"{'case':<48} {'client':<16} {'min s':>7} {'median s':>9} {'max s':>7} {'n':>3}   "
            f"{'kdaemon/confluent (median)':>26}")
    print()
    print(head)
    print("-" * len(head))
    verdicts = []
    for key, label in METRICS:
        for client in CLIENTS:
            s = stats.get(client, {}).get(key)
            if not s:
                continue
            ratio = ""
            if client == "confluent" and stats.get("kdaemon", {}).get(key):
                k = stats["kdaemon"][key]
                ratio = f"{k['median'] / s['median']:.2f}x  (min {k['min'] / s['min']:.2f}x)"
            print(f"{label:<48} {LABELS[client]:<16} {s['min']:>7.3f} {s['median']:>9.3f} {s['max']:>7.3f} "
                  f"{s['n']:>3}   {ratio:>26}")
        k, c = stats.get("kdaemon", {}).get(key), stats.get("confluent", {}).get(key)
        if k and c:
            met = k["median"] <= c["median"]
            verdicts.append(f"kdaemon <= confluent-kafka, {label}: {'met' if met else 'NOT met'} "
                            f"(median {k['median']:.3f} s vs {c['median']:.3f} s, "
                            f"{(k['median'] - c['median']) * 1000:+.1f} ms)")
    print("-" * len(head))
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, repeats=(5, "runs per client and case (default 5)"))
    parser.add_argument("--heartbeat-ms", type=int, default=1000,
                        help="heartbeat interval of every member, both clients (default 1000)")
    parser.add_argument("--poll-ms", type=int, default=1000,
                        help="timeout of each poll call in the members' loops (default 1000)")
    parser.add_argument("--settle-s", type=float, default=1.0,
                        help="(b): wait this long after the first member's first record (default 1.0)")
    parser.add_argument("--cases", nargs="*", default=["solo", "newcomer"], choices=("solo", "newcomer"))
    parser.add_argument("--clients", nargs="*", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--trace", action="store_true",
                        help="after the timed runs, one traced run per case and client, timelines printed")
    parser.add_argument("--log-dir", metavar="DIR", help="keep the broker's and members' logs here")
    args = parse(parser, argv, {"--worker": lambda spec: run_worker(json.loads(spec))})
    if args is None:
        return 0

    import tempfile

    from bench import _common

    head = banner("bench/group_join.py")
    source = head["source"]
    print(f"group settings, both clients: session timeout {SESSION_TIMEOUT_MS} ms, heartbeat "
          f"{args.heartbeat_ms} ms, assignor {ASSIGNOR}, auto.offset.reset earliest, auto-commit off; "
          f"members poll with {args.poll_ms} ms timeouts; (b) settles {args.settle_s} s")

    log_ctx = tempfile.TemporaryDirectory(prefix="kdaemon-bench-") if not args.log_dir else None
    log_dir = Path(args.log_dir or log_ctx.name)
    log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list]] = {c: {k: [] for k, _ in METRICS} for c in args.clients}
    errors: list[str] = []
    traces: dict = {}
    build_times: dict[str, list[float]] = {c: [] for c in args.clients}
    with _common.TansuBroker(log_dir / "tansu.log") as broker:
        print(f"Tansu on {broker.bootstrap} (pid {broker.pid}); topic {TOPIC}: {PARTITIONS} partitions x "
              f"{RECORDS_PER_PARTITION} records written by confluent-kafka", flush=True)
        prepare_topic(broker.bootstrap)
        for rep in range(args.repeats):
            order = list(args.clients) if rep % 2 == 0 else list(reversed(args.clients))
            for case in args.cases:
                for client in order:
                    tag = f"r{rep}-{client}"
                    print(f"  [{rep + 1}/{args.repeats}] {case:<8} {LABELS[client]:<16} ", end="", flush=True)
                    try:
                        if case == "solo":
                            r = run_solo(args, broker.bootstrap, client, log_dir, tag)
                            runs[client]["solo_first_s"].append(r["first_s"])
                            build_times[client].append(r["build_s"])
                            print(f"first record {r['first_s']:6.3f} s", flush=True)
                        else:
                            r = run_newcomer(args, broker.bootstrap, client, log_dir, tag)
                            runs[client]["newcomer_first_s"].append(r["first_s"])
                            build_times[client].append(r["build_s"])
                            runs[client]["pair_stable_s"].append(r["stable_s"])
                            print(f"newcomer first record {r['first_s']:6.3f} s, both stable "
                                  f"{r['stable_s']:6.3f} s", flush=True)
                    except (RuntimeError, TimeoutError) as exc:
                        errors.append(f"{case} {client} repeat {rep + 1}: {exc}")
                        print(f"FAILED: {exc}", flush=True)
        if args.trace:
            for case in args.cases:
                for client in args.clients:
                    tag = f"trace-{client}"
                    try:
                        if case == "solo":
                            traces[f"solo/{client}"] = run_solo(args, broker.bootstrap, client, log_dir, tag,
                                                                trace=True)
                        else:
                            traces[f"newcomer/{client}"] = run_newcomer(args, broker.bootstrap, client,
                                                                        log_dir, tag, trace=True)
                    except (RuntimeError, TimeoutError) as exc:
                        errors.append(f"trace {case} {client}: {exc}")

    stats = {c: {k: summary(v) for k, v in per.items()} for c, per in runs.items()}
    verdicts = print_table(stats)
    builds = {c: statistics.median(v) * 1000 for c, v in build_times.items() if v}
    print("building the consumer object (inside every figure above), median: "
          + ", ".join(f"{LABELS[c]} {v:.1f} ms" for c, v in builds.items()))
    breakdowns: dict[str, dict] = {}
    reactions: dict[str, float] = {}
    for key, tr in traces.items():
        case, client = key.split("/")
        if case == "solo":
            res, first_s, log = tr["result"], tr["first_s"], tr["log"]
        else:
            res, first_s, log = tr["result_newcomer"], tr["first_s"], tr["log_newcomer"]
        if client == "kdaemon":
            events = kdaemon_timeline(res["trace"] or [], first_s)
        else:
            events = confluent_timeline(log, res["wall_at_build"], first_s)
        who = "newcomer" if case == "newcomer" else "solo member"
        print_timeline(f"trace: {case}, {LABELS[client]} {who}", events, first_s)
        breakdowns.setdefault(case, {})[client] = phases(events, first_s)
        if case == "newcomer":
            print(f"  both stable at {tr['stable_s'] * 1000:.1f} ms; first member's events relative to the "
                  f"newcomer's build:")
            t0 = res["t_build"]
            for ev in tr["events_first"]:
                if ev["event"] in ("assigned", "revoked") and ev["t"] >= t0:
                    print(f"  {(ev['t'] - t0) * 1000:9.1f}  first member {ev['event']} {ev['partitions']}")
            first_res = tr["result_first"]
            if client == "kdaemon":
                first_events = list(first_res["trace"] or [])
            else:
                first_events = confluent_timeline(tr["log_first"], first_res["wall_at_build"], 1e9)
            # The first member's own timeline, shifted to the newcomer's clock.
            shifted = [(first_res["t_build"] + rel - t0, text) for rel, text in first_events]
            shifted = [(t, text) for t, text in shifted if t >= 0]
            for t, text in shifted:
                if t <= tr["stable_s"] + 0.05 and "Fetch" not in text.replace("OffsetFetch", ""):
                    print(f"  {t * 1000:9.1f}  first member: {text}")
            react = rebalance_reaction(shifted)
            if react:
                reactions[client] = (react[1] - react[0]) * 1000
                print(f"  first member: heartbeat saw the rebalance at {react[0] * 1000:.1f} ms, JoinGroup sent "
                      f"at {react[1] * 1000:.1f} ms (+{reactions[client]:.1f} ms)")
    for case, per_client in breakdowns.items():
        print(f"\nbreakdown of the traced {case} run, ms per phase (each phase ends at the milestone named)")
        clients = [c for c in CLIENTS if c in per_client]
        print(f"  {'phase':<58}" + "".join(f"{LABELS[c]:>17}" for c in clients))
        for i, (label, _, _) in enumerate(PHASES):
            cells = []
            for c in clients:
                v = per_client[c][i][1]
                cells.append(f"{'-' if v is None else f'{v:.1f}':>17}")
            print(f"  {label:<58}" + "".join(cells))
    if reactions:
        print("\nfirst member in (b), heartbeat answer REBALANCE_IN_PROGRESS -> JoinGroup sent: "
              + ", ".join(f"{LABELS[c]} {v:.1f} ms" for c, v in reactions.items()))
    print()
    for line in verdicts:
        print("goal " + line)
    for e in errors:
        print("ERROR " + e)
    after = check_sources(source)
    if args.json:
        write_json(args.json, {
            "date": head["started"].isoformat(timespec="seconds"), "machine": head["machine"],
            "versions": head["versions"], "kdaemon_source": source, "kdaemon_source_after": after,
            "command": command_line("bench/group_join.py", argv),
            "settings": {"session_timeout_ms": SESSION_TIMEOUT_MS, "heartbeat_ms": args.heartbeat_ms,
                         "poll_ms": args.poll_ms, "settle_s": args.settle_s, "assignor": ASSIGNOR,
                         "partitions": PARTITIONS, "records_per_partition": RECORDS_PER_PARTITION},
            "stats": stats, "goals": verdicts, "errors": errors, "build_ms_median": builds,
            "breakdowns": breakdowns, "rebalance_reaction_ms": reactions,
            "traces": {k: {kk: vv for kk, vv in v.items() if kk.startswith(("first_s", "stable_s"))}
                       for k, v in traces.items()}})
    if log_ctx is not None:
        log_ctx.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
