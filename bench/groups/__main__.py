"""Group join and rebalance latency: classic (eager, cooperative) vs the consumer protocol (KIP-848),
kdaemon vs the Java consumer vs librdkafka (confluent-kafka), on one Apache Kafka broker in one run.

Run from the repository root::

    python bench/groups [--repeats N] [--protocols ...] [--clients ...] [--heartbeat-ms MS ...]
                        [--trace [--trace-rounds N]] [--daemon [classic] [consumer]]
                        [--json results.json]

Input: one Apache Kafka node (the test suite's launcher, testkit/apache_kafka.py, through
``testkit.common.KafkaBroker``), one topic of 12 partitions with a few records in each, written
by confluent-kafka.  The broker runs with ``group.consumer.heartbeat.interval.ms`` = the
heartbeat interval and ``group.consumer.session.timeout.ms`` = the session timeout the classic
members set themselves (``--heartbeat-ms``, default 1000; ``--session-ms``, default 10000), so
both protocols heartbeat and expire members alike; under the consumer protocol the broker, not
the client, decides both.  The launcher sets ``group.initial.rebalance.delay.ms=0`` (Kafka's
default holds a classic group's first join 3 s).  Several ``--heartbeat-ms`` values run
everything once per value, each on a broker of its own (the interval is a static broker
setting; below the launcher's ``group.consumer.min.heartbeat.interval.ms`` of 500 ms that
minimum is lowered to the value), so one run shows the consumer / classic-eager ratio at each.

Three rebalance protocols: ``eager`` (classic, the ``range`` assignor), ``cooperative``
(classic, ``cooperative-sticky``) and ``consumer`` (KIP-848, the broker's ``uniform``
assignor).  Three clients, each in its own process per member (bench/groups/join_members.py):
kdaemon's ``Consumer``, the Java ``KafkaConsumer`` (testkit/java/KafkaPeer.java) and
confluent-kafka; every member subscribes to the topic, ``auto.offset.reset=earliest``,
auto-commit off, and polls with 200 ms timeouts (the Java peer's) until told to leave.

One *round* is one fresh group of one client and one protocol; every round measures, in order:

* **first assignment**: member 1 (static) builds its consumer in the empty group; the figure
  runs to its first assignment callback.  Members 2-4 (static) then join, untimed.
* **join**: member 5 (dynamic) builds its consumer; the figure runs to the group's stable moment.
* **leave**: member 5 closes (it leaves the group); the figure runs from right before its
  ``close()`` to the stable moment of the four left.
* **kill + restart**: member 4 is killed (SIGKILL, no leave) and started again at once with
  its ``group.instance.id``, well within the session timeout; the figure runs from the new
  process's consumer build to the stable moment (the process start, interpreter or JVM, is left
  out, as for the other figures; the kill → stable time is on a row of its own).  Under the consumer
  protocol Kafka refuses the instance id of a static member that did not leave (epoch -2)
  until its session expires (UNRELEASED_INSTANCE_ID, fatal to the Java consumer and
  librdkafka): a restarted member that fails is started again after 0.5 s, as a supervisor
  would, and the figure runs from its first build; the attempts are printed.

Each figure's clock starts when the member builds its consumer object: imports done, the JVM up
(the Java consumer loads its classes lazily, so that much class loading is inside its figures).

**Stable**, the same for every client: each member's assignment is what its own rebalance
callbacks say it holds (assigned adds the partitions given, revoked and lost take them away:
all three clients pass the whole assignment under eager and the change under the incremental
protocols).  The group is stable at the first instant from which every expected member holds
a non-empty assignment, the assignments are disjoint and cover all 12 partitions, and no
member's callback runs for ``--quiet-s`` (default 3) afterwards; the figure ends at the callback
from which on that holds (callbacks that change nothing, such as an empty "assigned", do not
move it).  Every member stamps its events with its own
``CLOCK_MONOTONIC`` (Python's ``time.monotonic()``, Java's ``System.nanoTime()``), so the
parent lays all members' events on one time line.

**CPU per member**, beside each figure: the parent samples every member process's CPU time
(``/proc/PID/stat``, all threads) every 50 ms; the figure is the CPU the members of the group
used over the figure's interval, divided by their number (the killed member not counted).

Rounds run ``--repeats`` times (default 3), the clients' order reversed every other repeat.
``--trace`` adds, after the timed rounds, ``--trace-rounds`` (default 1) traced rounds per
protocol for kdaemon and confluent-kafka (first assignment, join and leave: no kill + restart)
and prints member 5's timeline up to the group's stable moment after its join (kdaemon: every request and answer; librdkafka: its ``cgrp,protocol``
debug log); under eager and consumer it also decomposes the join (bench/groups/join_decompose.py;
kdaemon: every member reports its group requests and answers live; librdkafka: every member's
debug log; the Java peer logs at WARN only, so not the Java consumer): the median of each step
over the traced rounds: when each revoking member's heartbeat brought its revocation and when
its acknowledgment went out, when the newcomer's heartbeat brought its partitions; under eager,
when each member learned of the rebalance and rejoined.  Traced rounds are not part of the
figures.

``--daemon`` adds ``kdaemon run`` rows (bench/groups/join_daemon.py), ``--repeats`` rounds per group
protocol of the daemon (``[kafka] group_protocol``, classic and consumer): start to stable with
4 workers, one worker SIGKILLed and restarted by the supervisor (kill to stable), SIGTTIN
(4 -> 5) and SIGTTOU (5 -> 4) to stable; stable there is the broker's view (describe_consumer_groups).

Goals, printed as met / not met, never asserted: kdaemon's consumer-protocol rebalance time
(join, leave, kill + restart) ≤ the Java consumer's; under the consumer protocol a member
joining a 4-member group settles kdaemon's group in ≤ 1/3 of kdaemon's classic eager time.
"""

from __future__ import annotations

# Only the standard library at module level: a member's child imports nothing but its own client.
import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

TOPIC = "bench-group-join"
PARTITIONS = 12
RECORDS_PER_PARTITION = 50
EVENT_TIMEOUT_S = 90.0       # one awaited event or stable group
MIN_HEARTBEAT_MS = 500        # group.consumer.min.heartbeat.interval.ms in testkit/apache_kafka.py
RESTART_PAUSE_S = 0.5        # between a failed restart of a killed member and the next
CLIENTS = ("kdaemon", "java", "confluent")
LABELS = {"kdaemon": "kdaemon", "java": "Java consumer", "confluent": "librdkafka"}
PROTOCOL_NAMES = ("eager", "cooperative", "consumer")
SCENARIOS = (("first", "first assignment (empty group)"),
             ("join", "join: 4 -> 5 members, to stable"),
             ("leave", "leave: 5 -> 4 members, to stable"),
             ("restart", "kill + restart static member, to stable"),
             ("kill", "  the same, from the kill"))
REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from bench.groups.join_daemon import SCENARIOS as DAEMON_SCENARIOS, print_daemon_table  # noqa: E402
from bench.groups.join_decompose import DECOMPOSERS, decompose_from_logs, print_decomposition  # noqa: E402
from bench.groups.join_members import ASSIGNMENT_EVENTS, MemberFailed, start_member  # noqa: E402
from testkit.report import arguments, banner, check_sources, command_line, parse, write_json  # noqa: E402


# -- one group's life ----------------------------------------------------------------------------

class Round:
    """One group of one client and one protocol: its members, every event they printed (on one
    monotonic time line) and their CPU samples."""

    def __init__(self, args, bootstrap: str, client: str, protocol: str, log_dir: Path, tag: str,
                 env: dict) -> None:
        self.args, self.client, self.protocol = args, client, protocol
        self.log_dir, self.tag, self.env = log_dir, tag, env
        self.spec = {"client": client, "protocol": protocol, "bootstrap": bootstrap, "topic": TOPIC,
                     "group": f"gj-{protocol}-{client}-{uuid.uuid4().hex[:8]}",
                     "session_ms": args.session_ms, "heartbeat_ms": args.heartbeat_ms, "poll_ms": args.poll_ms}
        self.members: dict = {}
        self.history: list[tuple[float, str, dict]] = []
        self.cpu: dict[str, list[tuple[float, float]]] = {}
        self.gone: set[str] = set()     # members asked to leave or killed: their exit is expected
        self.failures: list[str] = []   # restarts that failed (``restart``)

    def start(self, name: str, instance_id: str | None, trace: bool = False):
        spec = dict(self.spec, instance_id=instance_id, trace=trace)
        member = start_member(name, spec, self.log_dir / f"{self.tag}-{name}.log", self.env)
        self.members[name] = member
        self.cpu[name] = []
        return member

    def leave(self, name: str) -> None:
        self.gone.add(name)
        self.members[name].leave()

    def kill(self, name: str) -> float:
        self.gone.add(name)
        self.members[name].kill()
        return time.monotonic()

    def pump(self) -> None:
        """Take every member's new events and a CPU sample of every live one; a member that
        exits unasked, or reports an error, fails the round."""
        from testkit.common import process_cpu_s
        now = time.monotonic()
        for name, m in self.members.items():
            for ev in m.pump():
                self.history.append((ev["t"], name, ev))
                if ev["event"] == "error":
                    raise MemberFailed(name, f"{LABELS[self.client]} member {name}: {ev['error']}; "
                                             f"see {m.log_path}")
            if m.alive():
                cpu = process_cpu_s(m.pid)
                if cpu is not None:
                    self.cpu[name].append((now, cpu))
            elif name not in self.gone:
                for ev in m.pump():
                    self.history.append((ev["t"], name, ev))
                raise MemberFailed(name, f"{LABELS[self.client]} member {name} exited (code "
                                         f"{m.proc.returncode}); see {m.log_path}")

    def _wait(self, done, what: str, timeout: float = EVENT_TIMEOUT_S):
        deadline = time.monotonic() + timeout
        while True:
            self.pump()
            answer = done()
            if answer is not None:
                return answer
            if time.monotonic() > deadline:
                raise TimeoutError(f"{LABELS[self.client]}, {self.protocol}: {what} not within {timeout:.0f} s")
            time.sleep(0.05)

    def event(self, name: str, kind: str, nonempty: bool = False) -> dict:
        """``name``'s first event ``kind`` (with partitions, when ``nonempty``), waiting for it."""
        def find():
            return next((ev for _, who, ev in self.history if who == name and ev["event"] == kind
                         and (not nonempty or ev.get("partitions"))), None)
        return self._wait(find, f"{name}'s {kind!r}")

    def stable(self, names: list[str], since: float) -> float:
        """The instant the group of ``names`` became stable (module docstring), waiting for it."""
        def check():
            owned = {n: set() for n in self.members}
            became, last = None, None
            for t, who, ev in sorted(self.history, key=lambda h: h[0]):
                if ev["event"] not in ASSIGNMENT_EVENTS:
                    continue
                parts = set(ev["partitions"])
                owned[who] = owned[who] | parts if ev["event"] == "assigned" else owned[who] - parts
                last = t
                held = [owned[n] for n in names]
                ok = (all(held) and sum(map(len, held)) == PARTITIONS
                      and set().union(*held) == set(range(PARTITIONS)))
                became = (became or t) if ok else None
            if became is None or time.monotonic() - max(last, became) < self.args.quiet_s:
                return None
            return max(became, since)
        return self._wait(check, f"a stable group of {', '.join(names)}")

    def restart(self, name: str, instance_id: str) -> tuple[str, float, int]:
        """Start a member with ``instance_id`` again, as a supervisor would: once more, after
        ``RESTART_PAUSE_S``, each time it fails before its first assignment (under the consumer
        protocol the broker refuses the instance id of a member that did not leave,
        UNRELEASED_INSTANCE_ID, until that member's session expires; the Java consumer and
        librdkafka treat that as fatal).  (its name, its first build, attempts)."""
        deadline = time.monotonic() + EVENT_TIMEOUT_S
        first_build = None
        for attempt in range(1, 1000):
            current = f"{name}.{attempt}"
            self.start(current, instance_id)
            try:
                t = self.event(current, "building")["t"]
                first_build = first_build or t
                self.event(current, "assigned", nonempty=True)
                return current, first_build, attempt
            except MemberFailed as exc:
                if exc.name != current or time.monotonic() > deadline:
                    raise
                self.gone.add(current)
                self.failures.append(str(exc))
                time.sleep(RESTART_PAUSE_S)
        raise RuntimeError("unreachable")

    def cpu_used(self, name: str, t0: float, t1: float) -> float | None:
        """CPU seconds ``name`` used from ``t0`` to ``t1``, from the samples nearest outside them."""
        samples = self.cpu.get(name) or []
        if not samples:
            return None
        before = [c for t, c in samples if t <= t0]
        after = [c for t, c in samples if t >= t1]
        return (after[0] if after else samples[-1][1]) - (before[-1] if before else samples[0][1])

    def cpu_per_member(self, names: list[str], t0: float, t1: float) -> float | None:
        used = [c for c in (self.cpu_used(n, t0, t1) for n in names) if c is not None]
        return sum(used) / len(used) if used else None

    def close(self) -> list[str]:
        """Every live member leaves; one that does not exit in time is killed and named in the
        list returned."""
        for name, m in self.members.items():
            if m.alive():
                self.leave(name)
        errors = []
        for m in self.members.values():
            try:
                m.finish(30.0)
            except RuntimeError as exc:
                errors.append(str(exc))
        return errors


def run_round(args, bootstrap: str, client: str, protocol: str, log_dir: Path, tag: str, env: dict,
              trace: bool = False) -> dict:
    """One group through the four scenarios (module docstring): figures in seconds, CPU per member."""
    r = Round(args, bootstrap, client, protocol, log_dir, tag, env)
    out: dict = {}
    four = ["m1", "m2", "m3", "m4"]
    # Traced: every member reports its group requests (kdaemon), for the join's decomposition.
    try:
        r.start("m1", f"{r.spec['group']}-1", trace=trace)
        t0 = r.event("m1", "building")["t"]
        t1 = r.event("m1", "assigned", nonempty=True)["t"]
        out["first_s"], out["first_cpu"] = t1 - t0, r.cpu_per_member(["m1"], t0, t1)
        r.stable(["m1"], t0)
        for n in (2, 3, 4):
            r.start(f"m{n}", f"{r.spec['group']}-{n}", trace=trace)
        r.stable(four, 0.0)

        r.start("m5", None, trace=trace)
        t0 = r.event("m5", "building")["t"]
        t1 = r.stable(four + ["m5"], t0)
        out["join_s"], out["join_cpu"] = t1 - t0, r.cpu_per_member(four + ["m5"], t0, t1)
        join_window = (t0, t1)
        if trace and client == "kdaemon" and (client, protocol) in DECOMPOSERS:
            decompose = DECOMPOSERS[(client, protocol)][0]
            out["decomposition"] = decompose([h for h in r.history if h[0] <= t1 + 0.5], t0, t1, "m5", four)

        r.leave("m5")
        t0 = r.event("m5", "closing")["t"]
        t1 = r.stable(four, t0)
        out["leave_s"], out["leave_cpu"] = t1 - t0, r.cpu_per_member(four + ["m5"], t0, t1)
        r.members["m5"].finish(30.0)
        r.pump()
        out["m5_result"] = r.members["m5"].result
        out["m5_log"] = str(r.members["m5"].log_path)

        if not trace:   # a traced round is about the join: the kill + restart is left out
            t_kill = r.kill("m4")
            again, t0, attempts = r.restart("m4", f"{r.spec['group']}-4")
            back = ["m1", "m2", "m3", again]
            t1 = r.stable(back, t0)
            out["restart_s"], out["restart_cpu"] = t1 - t0, r.cpu_per_member(back, t0, t1)
            out["kill_s"], out["restart_attempts"] = t1 - t_kill, attempts
            out["restart_failures"] = r.failures
        out["history"] = [(t, who, ev["event"], ev.get("partitions")) for t, who, ev in r.history]
    except BaseException as exc:
        for error in r.close():     # the round's own error is the one raised; these go with it
            exc.add_note(f"while closing the group: {error}")
        raise
    errors = r.close()
    if errors:
        raise RuntimeError("; ".join(errors))
    if trace and client == "confluent" and (client, protocol) in DECOMPOSERS:
        logs = {name: m.log_path for name, m in r.members.items()}
        out["decomposition"] = decompose_from_logs(r.history, logs, protocol, four, "m5", *join_window)
    return out


def prepare_topic(bootstrap: str) -> None:
    """Create the topic, write RECORDS_PER_PARTITION records to every partition, and have one
    group join before any round."""
    from testkit.produce import Writer, create_topic

    create_topic(bootstrap, TOPIC, PARTITIONS)
    writer = Writer(bootstrap, TOPIC, **{"linger.ms": 20})
    for i in range(PARTITIONS * RECORDS_PER_PARTITION):
        writer.send(f"record {i:06d} ".encode() * 8, f"k{i}".encode(), partition=i % PARTITIONS)
    writer.flush_checked(60)
    delivered = [writer.counts.get(p, 0) for p in range(PARTITIONS)]
    if delivered != [RECORDS_PER_PARTITION] * PARTITIONS:
        raise RuntimeError(f"produce failed: delivered {delivered}")
    # A throwaway group before the timed rounds: Kafka creates __consumer_offsets when the first
    # group looks for its coordinator, a one-time cost that no round should carry.
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"gj-warm-up-{uuid.uuid4().hex[:8]}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([TOPIC])
    deadline = time.monotonic() + EVENT_TIMEOUT_S
    while not consumer.assignment():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm-up group got no assignment within {EVENT_TIMEOUT_S:.0f} s")
        consumer.poll(0.2)
    consumer.close()


# -- report ------------------------------------------------------------------------------------

def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values),
            "all": values} if values else {}


def print_table(stats: dict, protocols: list[str], clients: list[str]) -> None:
    """One row per scenario and protocol: per client the median (min-max) seconds and the median
    CPU seconds per member."""
    head = f"{'scenario':<42} {'protocol':<12}" + "".join(f"{LABELS[c] + ' s (min-max) cpu/m':>36}"
                                                        for c in clients)
    print()
    print(head)
    print("-" * len(head))
    for key, label in SCENARIOS:
        for protocol in protocols:
            cells = []
            for c in clients:
                s, cpu = stats[protocol][c].get(f"{key}_s"), stats[protocol][c].get(f"{key}_cpu")
                cpu = f"{cpu['median']:.3f}" if cpu else "-"
                cells.append(f"{s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) {cpu:>5}" if s else "-")
            print(f"{label:<42} {protocol:<12}" + "".join(f"{cell:>36}" for cell in cells))
    print("-" * len(head))


def goals(stats: dict) -> list[str]:
    """The issue's goals as met / not met lines (only those whose figures were all measured)."""
    lines = []

    def median(protocol: str, client: str, key: str) -> float | None:
        s = stats.get(protocol, {}).get(client, {}).get(f"{key}_s")
        return s["median"] if s else None
    for key, label in SCENARIOS[1:4]:
        k, j = median("consumer", "kdaemon", key), median("consumer", "java", key)
        if k is not None and j is not None:
            lines.append(f"kdaemon <= Java consumer, consumer protocol, {label}: "
                         f"{'met' if k <= j else 'NOT met'} (median {k:.3f} s vs {j:.3f} s)")
    k, e = median("consumer", "kdaemon", "join"), median("eager", "kdaemon", "join")
    if k is not None and e is not None:
        lines.append(f"kdaemon consumer-protocol join <= 1/3 of kdaemon classic eager join: "
                     f"{'met' if k <= e / 3 else 'NOT met'} (median {k:.3f} s vs {e:.3f} s / 3 = {e / 3:.3f} s)")
    return lines


def print_trace(protocol: str, client: str, r: dict) -> None:
    """Member 5's timeline from its consumer build to the group's stable moment after its join."""
    from bench.groups.join_trace import confluent_timeline, kdaemon_timeline, print_timeline
    result, until = r["m5_result"], r["join_s"]
    if client == "kdaemon":
        events = kdaemon_timeline(result.get("trace") or [], until)
    else:
        events = confluent_timeline(r["m5_log"], result["wall_at_build"], until)
    print_timeline(f"trace: {protocol}, {LABELS[client]}, member 5 joining 4", events, until,
                   end_label="group stable")


def broker_properties(heartbeat_ms: int, session_ms: int) -> dict:
    """The consumer protocol's heartbeat interval and session timeout, set on the broker (the
    launcher's minimum heartbeat interval, 500 ms, lowered when the interval is below it)."""
    props = {"group.consumer.heartbeat.interval.ms": str(heartbeat_ms),
             "group.consumer.session.timeout.ms": str(session_ms)}
    if heartbeat_ms < MIN_HEARTBEAT_MS:
        props["group.consumer.min.heartbeat.interval.ms"] = str(heartbeat_ms)
    return props


def run_interval(args, heartbeat_ms: int, log_dir: Path, env: dict) -> dict:
    """Every round at one heartbeat interval, on a broker of its own (the consumer protocol's
    interval is a static broker setting): the timed rounds, the traced ones, the daemon's."""
    from testkit import common as _common
    from bench.groups.join_daemon import PROTOCOLS as DAEMON_PROTOCOLS, run_daemon_round

    sub = argparse.Namespace(**vars(args))
    sub.heartbeat_ms = heartbeat_ms
    runs = {p: {c: [] for c in args.clients} for p in args.protocols}
    traces: dict = {}
    daemon: dict = {p: [] for p in (args.daemon or [])}
    errors: list[str] = []
    properties = broker_properties(heartbeat_ms, args.session_ms)
    with _common.KafkaBroker(log_dir / f"kafka-{heartbeat_ms}ms", properties=properties) as broker:
        print(f"\n== heartbeat {heartbeat_ms} ms ==\n{broker.describe()}")
        print(f"broker: {', '.join(f'{k}={v}' for k, v in properties.items())}; topic {TOPIC}: "
              f"{PARTITIONS} partitions x {RECORDS_PER_PARTITION} records", flush=True)
        prepare_topic(broker.bootstrap)
        for rep in range(args.repeats):
            order = list(args.clients) if rep % 2 == 0 else list(reversed(args.clients))
            for protocol in args.protocols:
                for client in order:
                    print(f"  [{rep + 1}/{args.repeats}] {protocol:<12} {LABELS[client]:<14} ", end="", flush=True)
                    try:
                        r = run_round(sub, broker.bootstrap, client, protocol, log_dir,
                                      f"hb{heartbeat_ms}-r{rep}-{protocol}-{client}", env)
                    except (RuntimeError, TimeoutError) as exc:
                        errors.append(f"heartbeat {heartbeat_ms} ms, {protocol} {client} repeat {rep + 1}: {exc}")
                        print(f"FAILED: {exc}", flush=True)
                        continue
                    runs[protocol][client].append(r)
                    print("  ".join(f"{key} {r[f'{key}_s']:.3f} s" for key, _ in SCENARIOS)
                          + f"  (restart attempts {r['restart_attempts']})", flush=True)
        if args.trace:
            for n in range(args.trace_rounds):
                for protocol in args.protocols:
                    for client in [c for c in args.clients if c != "java"]:
                        print(f"  [trace {n + 1}/{args.trace_rounds}] {protocol:<12} {LABELS[client]:<14} ",
                              end="", flush=True)
                        try:
                            r = run_round(sub, broker.bootstrap, client, protocol, log_dir,
                                          f"hb{heartbeat_ms}-trace{n}-{protocol}-{client}", env, trace=True)
                        except (RuntimeError, TimeoutError) as exc:
                            errors.append(f"heartbeat {heartbeat_ms} ms, trace {protocol} {client}: {exc}")
                            print(f"FAILED: {exc}", flush=True)
                            continue
                        traces.setdefault((protocol, client), []).append(r)
                        print(f"join {r['join_s']:.3f} s", flush=True)
        for rep in range(args.repeats if args.daemon else 0):
            for protocol in [p for p in DAEMON_PROTOCOLS if p in args.daemon]:
                print(f"  [{rep + 1}/{args.repeats}] kdaemon run, {protocol:<9} ", end="", flush=True)
                try:
                    run_dir = log_dir / f"daemon-hb{heartbeat_ms}-{rep}-{protocol}"
                    r = run_daemon_round(bootstrap=broker.bootstrap, topic=TOPIC, partitions=PARTITIONS,
                                         protocol=protocol, run_dir=run_dir,
                                         session_ms=args.session_ms, heartbeat_ms=heartbeat_ms,
                                         quiet_s=args.quiet_s, env=env)
                except (RuntimeError, TimeoutError) as exc:
                    errors.append(f"heartbeat {heartbeat_ms} ms, daemon {protocol} repeat {rep + 1}: {exc}")
                    print(f"FAILED: {exc}", flush=True)
                    continue
                daemon[protocol].append(r)
                print("  ".join(f"{key} {r[f'{key}_s']:.3f} s" for key, _ in DAEMON_SCENARIOS)
                      + f"  (workers chose: {'; '.join(sorted(set(r['protocols'])))})", flush=True)

    stats = {p: {c: {f"{key}{suffix}": summary([r[f"{key}{suffix}"] for r in rs if r.get(f"{key}{suffix}")
                                                is not None])
                     for key, _ in SCENARIOS for suffix in ("_s", "_cpu")}
                 for c, rs in per.items()} for p, per in runs.items()}
    daemon_stats = {p: {key: summary([r[f"{key}_s"] for r in rs]) for key, _ in DAEMON_SCENARIOS}
                    for p, rs in daemon.items()}
    return {"heartbeat_ms": heartbeat_ms, "properties": properties, "runs": runs, "stats": stats,
            "traces": traces, "daemon": daemon, "daemon_stats": daemon_stats, "errors": errors}


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, repeats=(3, "rounds per client and protocol (default 3)"))
    parser.add_argument("--heartbeat-ms", type=int, nargs="+", default=[1000],
                        help="heartbeat interval, every client and protocol (default 1000); several values: "
                             "every round at each, on a broker of its own")
    parser.add_argument("--session-ms", type=int, default=10000,
                        help="session timeout, every client and protocol (default 10000)")
    parser.add_argument("--poll-ms", type=int, default=200,
                        help="timeout of the Python members' poll calls (default 200, the Java peer's)")
    parser.add_argument("--quiet-s", type=float, default=3.0,
                        help="a group is stable once no callback ran for this long (default 3)")
    parser.add_argument("--protocols", nargs="*", default=list(PROTOCOL_NAMES), choices=PROTOCOL_NAMES)
    parser.add_argument("--clients", nargs="*", default=list(CLIENTS), choices=CLIENTS)
    parser.add_argument("--trace", action="store_true",
                        help="after the timed rounds, traced rounds per protocol for kdaemon and "
                             "confluent-kafka: member 5's join timeline, and kdaemon's join decomposed")
    parser.add_argument("--trace-rounds", type=int, default=1,
                        help="traced rounds per protocol and client with --trace (default 1); the "
                             "decomposition prints the median of each step over them")
    parser.add_argument("--daemon", nargs="*", choices=("classic", "consumer"),
                        help="also the daemon rows (bench/groups/join_daemon.py), --repeats rounds of each "
                             "group protocol named (none named: both)")
    parser.add_argument("--log-dir", metavar="DIR", help="keep the broker's and members' logs here")
    args = parse(parser, argv, {"--worker": lambda spec: _worker(spec)})
    if args is None:
        return 0
    if args.daemon is not None and not args.daemon:
        args.daemon = ["classic", "consumer"]
    if any(h <= 0 or h >= args.session_ms for h in args.heartbeat_ms):
        parser.error(f"--heartbeat-ms: every value must be above 0 and below --session-ms ({args.session_ms})")

    import tempfile

    from testkit import common as _common

    head = banner("bench/groups")
    source = head["source"]
    print(f"group settings: session timeout {args.session_ms} ms, heartbeat "
          f"{' / '.join(map(str, args.heartbeat_ms))} ms (the consumer protocol's set on the broker), "
          f"auto.offset.reset earliest, auto-commit off; Python members poll with {args.poll_ms} ms timeouts; "
          f"stable after {args.quiet_s} s without a callback")
    log_ctx = tempfile.TemporaryDirectory(prefix="kdaemon-bench-") if not args.log_dir else None
    log_dir = Path(args.log_dir or log_ctx.name)
    log_dir.mkdir(parents=True, exist_ok=True)
    env = _common.child_env()   # kdaemon from the tree this script lives in, as the parent's
    results = [run_interval(args, hb, log_dir, env) for hb in args.heartbeat_ms]

    verdicts: list[str] = []
    for res in results:
        hb = res["heartbeat_ms"]
        print(f"\n== heartbeat {hb} ms: figures ==")
        if args.protocols and args.clients and args.repeats:
            print_table(res["stats"], args.protocols, args.clients)
        print_daemon_table(res["daemon_stats"])
        for (protocol, client), rounds in res["traces"].items():
            print_trace(protocol, client, rounds[0])
            decomposed = [r["decomposition"] for r in rounds if r.get("decomposition")]
            if decomposed:
                print_decomposition(client, protocol, LABELS[client], decomposed, hb)
        for line in goals(res["stats"]):
            verdicts.append(f"[heartbeat {hb} ms] {line}")
    ratios = []
    for res in results:
        k = res["stats"].get("consumer", {}).get("kdaemon", {}).get("join_s")
        e = res["stats"].get("eager", {}).get("kdaemon", {}).get("join_s")
        if k and e:
            ratios.append(f"heartbeat {res['heartbeat_ms']} ms: {k['median']:.3f} s / {e['median']:.3f} s = "
                          f"{k['median'] / e['median']:.2f}")
    print()
    for line in verdicts:
        print("goal " + line)
    if ratios:
        print("kdaemon join, consumer protocol / classic eager (medians): " + "; ".join(ratios))
    errors = [e for res in results for e in res["errors"]]
    for e in errors:
        print("ERROR " + e)
    after = check_sources(source)
    if args.json:
        write_json(args.json, {
            "date": head["started"].isoformat(timespec="seconds"), "machine": head["machine"],
            "versions": head["versions"], "kdaemon_source": source, "kdaemon_source_after": after,
            "command": command_line("bench/groups", argv),
            "settings": {"session_ms": args.session_ms, "heartbeat_ms": args.heartbeat_ms,
                         "poll_ms": args.poll_ms, "quiet_s": args.quiet_s, "partitions": PARTITIONS,
                         "records_per_partition": RECORDS_PER_PARTITION},
            "goals": verdicts, "ratios": ratios, "errors": errors,
            "intervals": [{
                "heartbeat_ms": res["heartbeat_ms"], "broker_properties": res["properties"],
                "stats": res["stats"], "daemon_stats": res["daemon_stats"], "daemon": res["daemon"],
                "decompositions": {f"{p}/{c}": [r.get("decomposition") for r in rs]
                                   for (p, c), rs in res["traces"].items()},
                "runs": {p: {c: [{k: v for k, v in r.items() if k not in ("m5_result", "m5_log")} for r in rs]
                             for c, rs in per.items()} for p, per in res["runs"].items()}}
                for res in results]})
    if log_ctx is not None:
        log_ctx.cleanup()
    return 0


def _worker(spec: str) -> None:
    from bench.groups.join_members import run_worker
    run_worker(json.loads(spec))


if __name__ == "__main__":
    sys.exit(main())
