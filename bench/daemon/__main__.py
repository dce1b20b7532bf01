"""The whole daemon: ``kdaemon run`` with 1 and 2 workers beside the single-process Java
KafkaConsumer, confluent-kafka, kafka-python and aiokafka doing the same work, on Apache Kafka.

Run from the repository root::

    python bench/daemon [--broker kafka|tansu] [--records N] [--repeats R] [--profile] [--json PATH]

``--records`` must be a multiple of 20 (default 1,000,000); ``--repeats`` (default 2) runs every
row that often, interleaved; ``--modes``, ``--workers`` and ``--peers`` run a subset (``--peers``
with no name: the daemon only).  ``--daemon-poll-records N`` sets the daemon's
``max_poll_records`` (default: not set, its own default of 500); ``--poll-records`` (default
10,000, as in bench/consume) is the peers' records per poll call.  ``--compression`` is the
producer's codec (default lz4).  ``--keep DIR`` keeps every run's configuration and log.

Input: the topic of bench/consume, written once by its producer: a broker on a free loopback
port (``testkit/common.py``; Apache Kafka, one combined KRaft node, by default and for the goals,
or Tansu with ``--broker tansu``), 4 partitions, confluent-kafka with lz4 (or ``--compression``)
and large batches, every record a ~200-byte JSON value, a key and two headers, ``type`` (one of
ten values, exactly a tenth each, shuffled) and ``trace``.  Everyone counts records per
partition against the producer's delivery reports (Tansu's high watermark cannot be trusted;
Kafka's could, but one rule serves both).

Two modes, the same work for everyone:

* filter: keep the records whose ``type`` header is ``order.shipped`` (10%) and decode their
  JSON value.  The daemon does it with a ``[[filters]]`` rule (compiled to ``HeaderRules``, which
  the C record loop evaluates) and the ``json`` value deserializer; the peers check the header in
  Python (testkit/workload.py's predicate) and ``json.loads`` the kept values; the Java consumer
  compares the header's bytes and parses the kept values with Jackson.
* json: decode every value: the daemon's ``json`` deserializer, the peers' ``json.loads``, the
  Java consumer's Jackson ``readTree``.

The daemon is the real thing: ``kdaemon run -c FILE --workers N`` as a subprocess (the
supervisor, its forked workers, the group, the ``null`` sink, offsets committed after every
flush), with a fresh group id per run, ``auto_offset_reset = "earliest"``, ``group_protocol`` from
``--group-protocol`` (default ``auto``, the daemon's own: the consumer protocol on Kafka 4.x,
classic on Tansu; every run prints what the workers chose, from their log), a 6 s session
timeout, ``plugins = ["json"]``, ``on_deserialize_error = "stop"``, state directory and metrics
port in a temporary directory.  The session timeout is ``[kafka] session_timeout_ms = 6000``
under classic; under the consumer protocol the broker owns it, so Apache Kafka is started with
``group.consumer.session.timeout.ms=6000`` and the option is left out with
``--group-protocol consumer`` (which refuses it) and dropped by the workers under ``auto``
when they choose consumer (they log that).  Its progress comes from the supervisor's
``/metrics``, sampled every 0.25 s: records processed = ``kdaemon_records_fetched_total`` +
``kdaemon_records_filtered_total`` over all partitions.  When every record is processed and the
sink has accepted every kept one (``kdaemon_records_delivered_total``), the supervisor gets
SIGTERM and must exit 0; the per-partition counts must equal the producer's.

The workers publish those counters once a second by default (``[daemon] metrics_interval_ms``),
which is too coarse for runs whose 10-90% span lasts about a second.  The bench's configuration
sets it to 250 ms (``--metrics-interval``, 1 for the daemon's own cadence).  An update costs one
``consumer.metrics()`` and a few counter increments, so four a second are noise.

The peers run single-process through bench/consume's worker loops (bench/peers.py: ``assign``
of the four partitions from offset 0, no group), each in a fresh child process, with a tally that
also records (time, records counted, CPU time, run-queue wait) after every poll.  The Java
consumer is testkit/java/KafkaPeer.java's ``bench`` sub-command (``peers.run_java``), which records the same
progress points (``--samples``); it gets no warm-up, as the Python peers get none, so its JIT
compiles inside the run (its first-record time, JIT and GC seconds are printed).

Rate, the same definition for everyone: the steady-state rate between 10% and 90% of the records,
so process start, group join, connection set-up and the first fetch are outside it, and so is
the tail where only the last partitions are still being read.  For the peers the two instants
are interpolated between polls.  The daemon's counters are staircases: the bench takes the first
sample showing each new value of a partition as a corner, interpolates linearly between a
partition's corners (from 0 at the last sample before the partition appeared) and sums the
partitions.  A rate with fewer than 4 progress points inside its window is marked as coarse.

Also reported, over the same window: the workers' CPU time (user + system, all threads, per
wall second: 2 cores are 200%), their time runnable but waiting for a CPU (``schedstat``: what
other processes on the machine took from them), the CPU per record, the broker's CPU (for the
daemon), the supervisor's and this script's own (the sampler), and peak RSS:
the highest ``VmHWM`` of any worker (``/proc``), beside the highest ``kdaemon_worker_rss_bytes``
the supervisor published (it samples every 5 s, so short peaks escape it).  The peers' figures
are their child's.  For every row, the daemon's and the peers' alike, the broker's CPU time
(for Kafka the JVM's) is also sampled before and after the run and divided by the records read:
the broker's CPU per record served, start-up and the broker's CPU at rest included (printed
once, measured before the runs).

The machine itself: every round starts with a ``json.loads`` loop over the bench's values in one
process and then in two at once (``machine_scaling``; ``--no-baseline`` skips it).  Their ratio
is what two CPU-bound processes get out of this machine against one with no broker at all; the
2-worker goal is printed beside it, with the ratio of every round (1 and 2 workers back to back)
and their median: on a shared VM the speed of a core drifts by tens of percent between minutes,
which best-against-best does not cancel.

``--profile`` adds one run per mode with one worker under cProfile and prints the top functions
by own time: the configuration enables bench/daemon/profile_plugin.py, whose supervisor process hooks
(``kdaemon_post_fork``, ``kdaemon_worker_exit``) profile each forked worker's whole life.

Nothing here asserts a timing; the goals are printed as met / not met.
"""

from __future__ import annotations

# Only the standard library at module level (and bench.peers, bench.daemon.run,
# testkit.workload and testkit.report, stdlib-only at module level too): a peer child imports nothing but its own client.
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from bench.daemon.run import (  # noqa: E402
    GROUP_PROTOCOLS, SAMPLE_S, SESSION_TIMEOUT_MS, child_env, cpu_over, profile_summary, run_daemon, run_delay_s,
    window_rate)
from bench.peers import (  # noqa: E402
    CHILD_TIMEOUT_S, JAVA_ON_TANSU, PEER_WORKERS, Tally, cpu_s, prepare_java, run_java, skip_java,
    with_broker_cpu)
from testkit.report import (  # noqa: E402
    arguments, banner, best, check_sources, command_line, number, parse, percent, table, times, write_json)
from testkit.workload import (  # noqa: E402
    COMPRESSIONS, FETCH_MAX_BYTES, MAX_PARTITION_FETCH_BYTES, RECORDS_UNIT, TOPIC, iter_records, produce)

MODES = ("filter", "json")
WORKER_COUNTS = (1, 2)
PEERS = ("java", "confluent", "kafka-python", "aiokafka")
PEER_LABELS = {"java": "Java KafkaConsumer", "confluent": "confluent-kafka", "kafka-python": "kafka-python",
               "aiokafka": "aiokafka"}
SHIPPED_METRICS_INTERVAL_S = 1.0   # [daemon] metrics_interval_ms' default
MIN_POINTS = 4   # fewer progress points inside the window than this: the rate is marked coarse

GOAL_SCALING = 1.8          # 2 workers / 1 worker
GOAL_FILTER_VS_CONFLUENT = 2.0
GOAL_JSON_VS_CONFLUENT = 1.5
GOAL_RSS_MB = 80.0

# -- the peers (child process) ------------------------------------------------------------------

class SampledTally(Tally):
    """The peers' tally (bench/peers.py), plus (time, records counted, CPU s, run-queue wait s)
    after every poll."""

    def __init__(self, expected: list[int], max_seconds: float) -> None:
        super().__init__(expected, max_seconds)
        self.samples: list[tuple[float, int, float, float]] = []

    def _sample(self, t: float) -> None:
        self.samples.append((t, sum(self.counts), cpu_s(), run_delay_s(os.getpid())))

    def start(self) -> None:
        super().start()
        self._sample(self.t0)

    def done(self) -> bool:
        finished = super().done()
        self._sample(time.perf_counter())
        return finished


def run_peer(spec: dict) -> dict:
    tally = SampledTally(spec["expected"], spec["max_seconds"])
    result = PEER_WORKERS[spec["client"]](spec, tally)
    return with_window(result, tally.samples, sum(spec["expected"]))


def with_window(result: dict, samples: list, total: int) -> dict:
    """A peer's result with its 10-90% window rate, CPU and run-queue wait over that window, from
    its progress points (t, records counted, CPU s, wait s), one after every poll."""
    times = [s[0] for s in samples]
    win = result["window"] = window_rate(times, [s[1] for s in samples], total)
    if win:
        result["window_cpu"] = cpu_over([(s[0], s[2]) for s in samples], win["t_start"], win["t_end"])
        result["window_cpu_wait"] = cpu_over([(s[0], s[3]) for s in samples], win["t_start"], win["t_end"])
    result["polls"] = len(samples) - 1
    return result


def java_peer(spec: dict) -> dict:
    """The Java consumer (``peers.run_java``, progress points on), its window figured as a Python
    peer's."""
    r = run_java(spec, samples=True)
    if "error" in r:
        return r
    return with_window(r, r.pop("samples"), sum(spec["expected"]))


def peer_child(spec: dict) -> dict:
    from testkit import common as _common
    return _common.run_child(__file__, "--peer", spec, CHILD_TIMEOUT_S, env=child_env())


# -- the machine's own scaling -----------------------------------------------------------------

BASELINE_S = 4.0


def cpu_loop(seconds: float) -> dict:
    """``json.loads`` over the bench's values for ``seconds`` of wall time, nothing else: the
    json mode's main cost with no broker, no I/O and nothing shared."""
    values = [v for _, _, _, v, _ in iter_records(20_000)]
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for v in values:
            json.loads(v)
        n += len(values)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"records_per_s": n / wall, "cpu_us_per_record": cpu / n * 1e6}


def machine_scaling(seconds: float = BASELINE_S) -> dict:
    """What two processes get out of this machine against one, before any broker takes its share:
    the same ``cpu_loop`` in one process, then in two at once.  A VM's two vCPUs rarely give 2.0:
    shared caches, memory bandwidth, the clock, the hypervisor's other tenants.  The daemon's
    2-worker ratio is read against this."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--cpu-loop", repr(seconds)]

    def run(k: int) -> list[dict]:
        procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=child_env()) for _ in range(k)]
        return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    one, two = run(1), run(2)
    rate1 = one[0]["records_per_s"]
    return {"one": one, "two": two, "ratio": sum(r["records_per_s"] for r in two) / rate1,
            "cpu_penalty": statistics.mean(r["cpu_us_per_record"] for r in two) / one[0]["cpu_us_per_record"] - 1}


# -- report -------------------------------------------------------------------------------------

def build_rows(results: dict, modes, worker_counts, peers) -> list[dict]:
    rows = []
    run_ids = [(f"kdaemon-{w}w", f"kdaemon run, {w} worker{'s' if w > 1 else ''}") for w in worker_counts]
    run_ids += [(p, PEER_LABELS[p]) for p in peers]
    for mode in modes:
        base_conf = best(results.get(("confluent", mode), []), need_rate=True)
        base_java = best(results.get(("java", mode), []), need_rate=True)
        base_1w = best(results.get(("kdaemon-1w", mode), []), need_rate=True)
        for run_id, label in run_ids:
            runs = results.get((run_id, mode))
            if not runs:
                continue
            r = best(runs, need_rate=True)
            row = {"run": run_id, "label": label, "mode": mode, "repeats": len(runs)}
            if r is None:
                row["error"] = next((x["error"] for x in runs if "error" in x), "no rate")
                rows.append(row)
                continue
            ok = [x for x in runs if "error" not in x and x.get("records_per_s")]
            rates = [x["records_per_s"] for x in ok]
            row.update({
                "records_per_s": r["records_per_s"], "all_records_per_s": rates,
                "median_records_per_s": statistics.median(rates),
                "failed": len(runs) - len(ok),
                "window": r["window"]["window"], "window_s": r["window"]["window_s"],
                "window_points": r["window"]["points"], "coarse": r["window"]["points"] < MIN_POINTS,
                "rss_peak_mb": max(x["rss_peak_mb"] for x in ok),
                "first_record_s": r.get("first_record_s"),
                "vs_confluent": r["records_per_s"] / base_conf["records_per_s"] if base_conf else None,
                "vs_java": r["records_per_s"] / base_java["records_per_s"] if base_java else None,
                "broker_us_per_record": r.get("broker_us_per_record"),
                "vs_1w": (r["records_per_s"] / base_1w["records_per_s"]
                          if base_1w and run_id.startswith("kdaemon") else None),
            })
            if run_id.startswith("kdaemon"):
                row.update({"workers_cpu": r.get("workers_cpu"), "cpu_wait": r.get("workers_cpu_wait"),
                            "broker_cpu": r.get("broker_cpu"),
                            "rss_metric_mb": max(x["rss_metric_mb"] for x in ok),
                            "group_joins": max(x["group_joins"] for x in ok),
                            "group_protocols": sorted({p for x in ok for p in x.get("group_protocols", ())}),
                            "stalled_s": r.get("stalled_s"), "longest_stall_s": r.get("longest_stall_s"),
                            "assignments_logged": max(x["assignments_logged"] for x in ok),
                            "stop_seconds": max(x["stop_seconds"] for x in ok)})
            else:
                row.update({"workers_cpu": r.get("window_cpu"), "cpu_wait": r.get("window_cpu_wait"),
                            "consume_py_rate": r["records_per_s_consume_py"]})
                for k in ("jit_compile_s", "gc_count", "gc_s", "jvm_uptime_at_first_poll_s", "java"):
                    if k in r:
                        row[k] = r[k]
            if row.get("workers_cpu"):
                row["cpu_us_per_record"] = row["workers_cpu"] / r["records_per_s"] * 1e6
            rows.append(row)
        java_row = next((row for row in rows if row["run"] == "java" and row["mode"] == mode
                         and "error" not in row), None)
        for row in rows:
            if row["mode"] == mode and "error" not in row:
                mine, theirs = row.get("cpu_us_per_record"), (java_row or {}).get("cpu_us_per_record")
                row["vs_java_per_core"] = theirs / mine if mine and theirs else None
    return rows


def print_table(rows: list[dict], broker: str = "the broker") -> None:
    x, pct, num = times, percent, number
    head = (f"{'run':<26} {'mode':<6} {'records/s':>10} {'median':>9} {'range over repeats':>19} {'x 1w':>6} "
            f"{'x conf':>6} {'x java':>6} {'window':>10} {'CPU':>5} {'wait':>5} {'us/rec':>6} {'core/java':>9} "
            f"{'broker':>6} {'br us/rec':>9} {'RSS MB':>6} {'1st rec s':>9}")
    for r in table(head, rows, 26, 300):
        lo, hi = min(r["all_records_per_s"]), max(r["all_records_per_s"])
        window = f"{r['window'][0]:.0%}-{r['window'][1]:.0%}"
        first = "-" if r.get("first_record_s") is None else f"{r['first_record_s']:.2f}"
        rate = f"{r['records_per_s']:,.0f}{'*' if r['coarse'] else ''}"
        us = "-" if r.get("cpu_us_per_record") is None else f"{r['cpu_us_per_record']:.2f}"
        print(f"{r['label']:<26} {r['mode']:<6} {rate:>10} {r['median_records_per_s']:>9,.0f} "
              f"{f'{lo:,.0f}-{hi:,.0f}':>19} "
              f"{x(r['vs_1w']):>6} {x(r['vs_confluent']):>6} {x(r['vs_java']):>6} {window:>10} "
              f"{pct(r['workers_cpu']):>5} {pct(r.get('cpu_wait')):>5} {us:>6} {x(r.get('vs_java_per_core')):>9} "
              f"{pct(r.get('broker_cpu')):>6} {num(r.get('broker_us_per_record')):>9} "
              f"{r['rss_peak_mb']:>6.1f} {first:>9}"
              f"{'  (' + str(r['failed']) + ' failed)' if r['failed'] else ''}")
    print("-" * len(head))
    chosen = sorted({p for r in rows for p in r.get("group_protocols") or ()})
    if chosen:
        print(f"daemon workers' group protocol (their log): {'; '.join(chosen)}")
    print("records/s: steady state between 10% and 90% of the records (the window column: where it "
          "started, later than 10% when the daemon's first counter update came later); best of the "
          f"repeats, their median and range beside it; * fewer than {MIN_POINTS} progress points inside the window "
          "(daemon: counter updates), so the figure is coarse")
    print("x 1w / x conf / x java: this rate / the daemon's 1-worker rate (same mode) / confluent-kafka's / "
          "the Java consumer's; CPU: "
          "the workers' (or the peer's) CPU over the window, per wall second (2 cores = 200%); wait: "
          "their time runnable but waiting for a CPU (other processes), per wall second; us/rec: that CPU "
          "per record processed (microseconds); core/java: the Java consumer's us/rec / this one's (records "
          f"per CPU-second against Java's); broker: {broker}'s CPU over the daemon's window, per wall second; "
          f"br us/rec: {broker}'s CPU per record over the whole run (sampled before and after it, start-up and "
          "its CPU at rest included); RSS: peak VmHWM of any worker (daemon) or of the child (peers; Java: the "
          "whole JVM), highest over the repeats; "
          "1st rec s: daemon start (or the peer's first poll) to the first record seen (Java: JIT warm-up "
          "included, it gets none)")


def per_round_ratios(results: dict, mode: str) -> list[float]:
    """2 workers / 1 worker within each round (the two runs were back to back)."""
    ones, twos = results.get(("kdaemon-1w", mode), []), results.get(("kdaemon-2w", mode), [])
    return [b["records_per_s"] / a["records_per_s"] for a, b in zip(ones, twos)
            if "error" not in a and "error" not in b and a.get("records_per_s") and b.get("records_per_s")]


def goals(rows: list[dict], worker_counts, results: dict | None = None,
          baselines: list[dict] | None = None, broker: str = "Apache Kafka") -> list[str]:
    """The goals (met / not met) and the daemon's ratio to the Java consumer in every mode; each
    line names the broker the figures come from."""
    by = {(r["run"], r["mode"]): r for r in rows if "error" not in r}
    on = f"goal [on {broker}] "
    lines = []

    def coarse(*rs) -> str:
        return "; coarse: a rate with few progress points (*)" if any(r.get("coarse") for r in rs) else ""
    machine = ""
    if baselines:
        ratios = [b["ratio"] for b in baselines]
        machine = (f"; this machine's own 2-process ratio (json.loads loop, no broker): median "
                   f"{statistics.median(ratios):.2f}x of {', '.join(f'{v:.2f}' for v in ratios)}")
    for mode in MODES:
        one, two = by.get(("kdaemon-1w", mode)), by.get(("kdaemon-2w", mode))
        if one and two:
            v = two["records_per_s"] / one["records_per_s"]
            med = two["median_records_per_s"] / one["median_records_per_s"]
            rounds = per_round_ratios(results or {}, mode)
            per_round = (f"; per round {', '.join(f'{r:.2f}' for r in rounds)}, median "
                         f"{statistics.median(rounds):.2f}x" if rounds else "")
            lines.append(f"{on}{mode}: 2 workers >= {GOAL_SCALING}x 1 worker: "
                         f"{'met' if v >= GOAL_SCALING else 'NOT met'} (best/best {v:.2f}x, median/median "
                         f"{med:.2f}x{per_round}{coarse(one, two)}{machine})")
    for mode, goal in (("filter", GOAL_FILTER_VS_CONFLUENT), ("json", GOAL_JSON_VS_CONFLUENT)):
        conf = by.get(("confluent", mode))
        for w in worker_counts:
            kd = by.get((f"kdaemon-{w}w", mode))
            if kd and conf:
                v = kd["records_per_s"] / conf["records_per_s"]
                lines.append(f"{on}{mode}: daemon with {w} worker{'s' if w > 1 else ''} >= {goal}x confluent-kafka: "
                             f"{'met' if v >= goal else 'NOT met'} ({v:.2f}x{coarse(kd)})")
    kd_rows = [r for r in rows if r["run"].startswith("kdaemon") and "error" not in r]
    if kd_rows:
        worst = max(kd_rows, key=lambda r: r["rss_peak_mb"])
        metric = max(r["rss_metric_mb"] for r in kd_rows)
        met = worst["rss_peak_mb"] <= GOAL_RSS_MB
        lines.append(f"{on}worker RSS <= {GOAL_RSS_MB:.0f} MB: {'met' if met else 'NOT met'} "
                     f"(highest VmHWM {worst['rss_peak_mb']:.1f} MB, {worst['label']} / {worst['mode']}; "
                     f"highest kdaemon_worker_rss_bytes sample {metric:.1f} MB)")
    for mode in MODES:
        java = by.get(("java", mode))
        for w in worker_counts:
            kd = by.get((f"kdaemon-{w}w", mode))
            if kd and java and kd.get("vs_java"):
                core = kd.get("vs_java_per_core")
                lines.append(f"vs Java [on {broker}] {mode}: daemon with {w} worker{'s' if w > 1 else ''} "
                             f"{kd['vs_java']:.2f}x the Java consumer's rate, "
                             f"{'-' if core is None else f'{core:.2f}x'} its records per CPU-second{coarse(kd)}")
    return lines


# -- main ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = arguments(
        __doc__, broker=True, records=True, repeats=(2, "runs per row, interleaved; best is shown"),
        poll_records="the peers' records per poll call (default 10,000, as in bench/consume)",
        max_seconds="stop a run after this long and report it as CAPPED (default 300)", modes=MODES)
    parser.add_argument("--daemon-poll-records", type=int, default=None,
                        help="the daemon's max_poll_records (default: not set, the daemon's own default)")
    parser.add_argument("--workers", nargs="*", type=int, default=list(WORKER_COUNTS),
                        help="daemon worker counts (default 1 2)")
    parser.add_argument("--peers", nargs="*", choices=PEERS,
                        help=f"the single-process peers (default {' '.join(PEERS)}; on Tansu without java); "
                             "with no name: the daemon only")
    parser.add_argument("--compression", choices=COMPRESSIONS, default="lz4",
                        help="the producer's codec for the topic (default lz4).  The broker's CPU per record served "
                             "follows the stored bytes (on Tansu zstd halved lz4's), which leaves the workers more of "
                             "a small machine")
    parser.add_argument("--metrics-interval", type=float, default=SAMPLE_S,
                        help="seconds between the workers' counter updates (default 0.25, the sampling "
                             "period; 1.0 is the daemon's own cadence): [daemon] metrics_interval_ms")
    parser.add_argument("--profile", action="store_true",
                        help="also run the daemon with 1 worker under cProfile per mode, print the top")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--keep", metavar="DIR", help="keep configs, logs and profiles in DIR")
    parser.add_argument("--group-protocol", choices=GROUP_PROTOCOLS, default="auto",
                        help="the daemon's [kafka] group_protocol (default auto, the daemon's default: consumer "
                             "on Kafka 4.x, classic on Tansu)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="skip the machine's own 1- vs 2-process ratio (a json.loads loop, 8 s per round)")
    args = parse(parser, argv, {"--peer": lambda spec: run_peer(json.loads(spec)),
                                "--cpu-loop": lambda seconds: cpu_loop(float(seconds))}, RECORDS_UNIT)
    if args is None:
        return 0
    if args.broker == "tansu" and args.group_protocol == "consumer":
        parser.error("--group-protocol consumer needs --broker kafka: Tansu speaks only the classic protocol")
    if args.peers is None:  # the default: every peer, but the Java consumer only where it works
        args.peers = list(PEERS)
        if skip_java(args.broker, None):
            args.peers.remove("java")
            print(JAVA_ON_TANSU)

    import shutil
    import tempfile

    from testkit import common as _common

    head = banner("bench/daemon", require_accelerated=True)
    machine, started, source = head["machine"], head["started"], head["source"]
    print(f"daemon workers publish their counters every {args.metrics_interval:g} s"
          + (" (the daemon's own cadence)" if args.metrics_interval == SHIPPED_METRICS_INTERVAL_S
             else f" ([daemon] metrics_interval_ms; the daemon's own cadence is {SHIPPED_METRICS_INTERVAL_S:g} s)")
          + f"; /metrics sampled every {SAMPLE_S:g} s")
    from kdaemon.client.config import ConsumerConfig
    daemon_poll = args.daemon_poll_records or ConsumerConfig.max_poll_records
    print(f"records per poll: the daemon {daemon_poll:,} (max_poll_records, "
          f"{'set by --daemon-poll-records' if args.daemon_poll_records else 'its default'}), the peers "
          f"{args.poll_records:,}; fetch sizes "
          f"{MAX_PARTITION_FETCH_BYTES >> 20} MiB per partition, {FETCH_MAX_BYTES >> 20} MiB "
          "per request", flush=True)

    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kdaemon-bench-daemon-"))
    tmp.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    baselines: list[dict] = []
    profiles: dict = {}
    try:
        if args.broker == "kafka":   # the consumer protocol's session timeout is the broker's
            broker_cm = _common.KafkaBroker(tmp / "kafka", properties={
                "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS)})
        else:
            broker_cm = _common.open_broker(args.broker, tmp)
        print(f"daemon group protocol: [kafka] group_protocol = \"{args.group_protocol}\"; session timeout "
              f"{SESSION_TIMEOUT_MS} ms (classic: [kafka] session_timeout_ms; consumer: the broker's "
              "group.consumer.session.timeout.ms)", flush=True)
        with broker_cm as broker:
            print(broker.describe(), flush=True)
            print(f"producing {args.records:,} records with confluent-kafka ({args.compression})...", flush=True)
            produced = produce(broker.bootstrap, args.records, compression=args.compression)
            print(f"  {produced['seconds']:.1f} s; per partition {produced['expected']}", flush=True)
            broker_idle = broker.idle_cpu()
            if "java" in args.peers:
                prepare_java()
            print(f"{broker.name} at rest (no client): {broker_idle:.1%} of a core", flush=True)
            n = 0
            for rep in range(args.repeats):
                if not args.no_baseline:
                    print(f"  [{rep + 1}/{args.repeats}] machine: json.loads loop, 1 then 2 processes ", end="", flush=True)
                    b = machine_scaling()
                    baselines.append(b)
                    two = " + ".join(f"{r['records_per_s']:,.0f}" for r in b["two"])
                    print(f"{b['one'][0]['records_per_s']:,.0f} rec/s; 2 processes {two} = {b['ratio']:.2f}x, "
                          f"CPU per record {b['cpu_penalty']:+.0%}", flush=True)
                for mode in args.modes:
                    for workers in args.workers:
                        n += 1
                        label = f"kdaemon run, {workers} worker{'s' if workers > 1 else ''}"
                        print(f"  [{rep + 1}/{args.repeats}] {label:<26} {mode:<6} ", end="", flush=True)
                        r = with_broker_cpu(
                            broker, run_daemon, broker=broker, produced=produced, mode=mode, workers=workers,
                            run_dir=tmp / f"run-{n:02d}-{mode}-{workers}w", args=args)
                        results.setdefault((f"kdaemon-{workers}w", mode), []).append(r)
                        _print_daemon_run(r)
                    for peer in args.peers:
                        spec = {"client": peer, "variant": None, "mode": mode, "bootstrap": broker.bootstrap,
                                "topic": TOPIC, "expected": produced["expected"],
                                "poll_records": args.poll_records, "max_seconds": args.max_seconds}
                        print(f"  [{rep + 1}/{args.repeats}] {PEER_LABELS[peer]:<26} {mode:<6} ", end="", flush=True)
                        r = with_broker_cpu(broker, java_peer if peer == "java" else peer_child, spec)
                        if "error" not in r:
                            r["records_per_s_consume_py"] = r["records_per_s"]
                            r["records_per_s"] = (r["window"] or {}).get("records_per_s")
                            want = (produced["check"][mode], produced["kept"][mode])
                            if not r["capped"] and (r["check"], r["kept"]) != want:
                                r["error"] = f"wrong result: check/kept {r['check']}/{r['kept']}, want {want}"
                        results.setdefault((peer, mode), []).append(r)
                        _print_peer_run(r)
            if args.profile:
                for mode in args.modes:
                    pdir = tmp / f"profile-{mode}"
                    pdir.mkdir(exist_ok=True)
                    print(f"  profiling the daemon's worker, {mode}, 1 worker, under cProfile...", flush=True)
                    r = run_daemon(broker=broker, produced=produced, mode=mode, workers=1,
                                   run_dir=tmp / f"run-profile-{mode}", args=args, profile_dir=pdir)
                    _print_daemon_run(r, prefix="    ")
                    profiles[mode] = {"run": r, "text": profile_summary(pdir, args.profile_top)}
            broker_described = broker.describe()
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    rows = build_rows(results, args.modes, args.workers, args.peers)
    print_table(rows, broker.name)
    for mode, prof in profiles.items():
        print(f"\ncProfile of the daemon's worker, {mode} mode, 1 worker (whole worker life, join "
              f"included; top {args.profile_top} by own time):")
        print(prof["text"])
    print()
    lines = goals(rows, args.workers, results, baselines, broker.name)
    for line in lines:
        print(line)
    machine["loadavg_at_end"] = os.getloadavg()
    print(f"load average at the end {', '.join(f'{v:.2f}' for v in machine['loadavg_at_end'])}")
    after = check_sources(source)
    if args.json:
        write_json(args.json, {
            "date": started.isoformat(timespec="seconds"), "machine": machine, "versions": head["versions"],
            "kdaemon_source": source, "kdaemon_source_after": after,
            "command": command_line("bench/daemon", argv),
            "daemon_max_poll_records": daemon_poll, "peer_poll_records": args.poll_records,
            "metrics_interval_s": args.metrics_interval, "group_protocol": args.group_protocol,
            "broker": {"kind": args.broker, "name": broker.name, "describe": broker_described,
                       "idle_cpu": broker_idle},
            "produced": produced, "rows": rows, "goals": lines, "machine_scaling": baselines,
            "runs": {f"{k[0]}/{k[1]}": v for k, v in results.items()},
            "profiles": {m: {"text": p["text"], "run": p["run"]} for m, p in profiles.items()}})
    return 0


def _print_daemon_run(r: dict, prefix: str = "") -> None:
    if "error" in r:
        print(f"{prefix}FAILED: {r['error'][:400]}", flush=True)
        return
    w = r["window"] or {}
    cpu = "-" if r.get("workers_cpu") is None else f"{r['workers_cpu']:.0%}"
    wait = "-" if r.get("workers_cpu_wait") is None else f"{r['workers_cpu_wait']:.0%}"
    bcpu = "-" if r.get("broker_cpu") is None else f"{r['broker_cpu']:.0%}"
    scpu = "-" if r.get("supervisor_cpu") is None else f"{r['supervisor_cpu']:.0%}"
    bench_cpu = "-" if r.get("sampler_cpu") is None else f"{r['sampler_cpu']:.0%}"
    bus = "-" if r.get("broker_us_per_record") is None else f"{r['broker_us_per_record']:.2f}"
    print(f"{prefix}{r['records_per_s'] or 0:>11,.0f} rec/s  window {w.get('window', [0, 0])[0]:.0%}-90% "
          f"over {w.get('window_s', 0):.2f} s ({w.get('points', 0)} updates inside)  "
          f"1st rec {r['first_record_s'] or 0:5.2f} s  all done "
          f"{r['seconds']:6.2f} s  stop {r['stop_seconds']:.2f} s  workers cpu {cpu} (waiting {wait}) broker {bcpu} "
          f"({bus} us/rec over the run) supervisor {scpu} sampler {bench_cpu}  "
          f"rss {r['rss_peak_mb']:5.1f} MB (metric {r['rss_metric_mb']:.1f})  joins {r['group_joins']}  "
          f"stalls {r.get('stalled_s') or 0:.2f} s (longest {r.get('longest_stall_s') or 0:.2f} s)"
          f"{'  CAPPED' if r['capped'] else ''}", flush=True)
    print(f"{prefix}      workers chose: {'; '.join(r.get('group_protocols') or ['(no log line)'])}", flush=True)


def _print_peer_run(r: dict) -> None:
    if "error" in r:
        print(f"FAILED: {r['error'][:400]}", flush=True)
        return
    w = r["window"] or {}
    bus = r.get("broker_us_per_record")
    print(f"{r['records_per_s'] or 0:>11,.0f} rec/s  window 10-90% over {w.get('window_s', 0):.2f} s  "
          f"(bench/consume steady {r['records_per_s_consume_py'] or 0:,.0f})  cpu {r.get('window_cpu') or 0:.0%} "
          f"(waiting {r.get('window_cpu_wait') or 0:.0%})  1st rec "
          f"{r['first_record_s'] or 0:5.2f} s  polls {r['polls']}  rss {r['rss_peak_mb']:5.1f} MB  broker "
          f"{'-' if bus is None else f'{bus:.2f}'} us/rec{'  CAPPED' if r['capped'] else ''}", flush=True)
    if "jit_compile_s" in r:
        print(f"      JVM: first poll {r['jvm_uptime_at_first_poll_s']:.2f} s after JVM start, first records "
              f"after {r['first_record_s'] or 0:.2f} s; JIT compiling {r['jit_compile_s']:.2f} s, GC "
              f"{r['gc_count']}x {r['gc_s']:.2f} s while consuming", flush=True)


if __name__ == "__main__":
    sys.exit(main())
