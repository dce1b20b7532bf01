"""The chaos run: no loss, no duplicates, no aborted record delivered, while everything breaks.

    .venv/bin/python bench/chaos --records 1000000 --duration 600 --json chaos.json
    .venv/bin/python bench/chaos --sink spark --records 1000000 --duration 600 --json chaos-spark.json

On a three-node Apache Kafka cluster (testkit/chaos/cluster.py: the daemon reaches it through a
cutting proxy) two producers write ``--records`` records over ``--duration`` seconds
(testkit/chaos/produce.py: lz4 and idempotent on one topic, zstd and transactional on the other,
about 5 % inside aborted transactions, about 10 % carrying the header the rule drops).
``kdaemon run`` consumes both topics with 3 workers, ``isolation_level = "read_committed"``, the
header rule, and the jsonl sink (or with ``--sink spark`` the Spark sink, its uploader on
``local[2]``) wrapped by testkit/chaos/sink.py, while testkit/chaos/faults.py SIGKILLs a worker
every 10 s, kills and restarts the broker leading a random partition every 30 s (the group
coordinator's broker once instead), makes the sink fail for 20 s, cuts the daemon's connections
every 15 s and, with the Spark sink, SIGKILLs the uploader (and its JVM) at a quarter and at
two thirds of the run.

When the producers are done the faults stop, every broker runs again, and the daemon drains;
then the (topic, partition, offset) multiset in the output is compared with what the delivery
reports said: produced - filtered - aborted, each exactly once (testkit/chaos/verify.py).  The
jsonl output is read line by line; the Spark output is read back with Spark
(testkit/chaos/spark.py), as a user would.  The figures are printed (and written with
``--json``); the exit code is 1 unless nothing was lost, nothing duplicated and no aborted or
filtered record delivered.  ``--at-least-once`` accepts duplicates (still counted), for a sink
that promises no more (jsonl with ``dedupe = false``: a worker killed between a flush and its
commit leaves records its successor writes again).

``run_chaos(ChaosOptions(...))`` is the same run for tests/chaos/test_chaos_reduced.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from testkit.chaos.cluster import start_chaos_cluster  # noqa: E402
from testkit.daemon import wait_for  # noqa: E402
from testkit.chaos.faults import FaultLog, Injector, Sampler, Schedule, read_metrics  # noqa: E402
from testkit.chaos.produce import (  # noqa: E402
    HEADER_RULE, Ledger, PlainProducer, TransactionalProducer, reconcile)
from testkit.chaos.sink import REFUSALS_SUFFIX, SINK_TYPES  # noqa: E402
from testkit.chaos.spark import SparkOutputReader  # noqa: E402
from testkit.chaos.verify import OutputReader, compare, verdict_ok  # noqa: E402
from testkit.report import VerdictResult, print_examples_and_errors, verdict_report  # noqa: E402
from testkit.daemon import Daemon, daemon_config  # noqa: E402

PARTITIONS = 6          # per topic: 12 over 3 workers
WORKERS = 3
TOPICS = ("chaos-lz4", "chaos-zstd")


@dataclass
class ChaosOptions:
    records: int = 200_000
    duration_s: float = 180.0
    sink: str = "jsonl"
    workdir: Path | None = None
    seed: int = 15
    worker_kill_every_s: float = 10.0
    broker_kill_every_s: float = 30.0
    broker_down_s: float = 8.0
    proxy_cut_every_s: float = 15.0
    sink_failure_s: float = 20.0
    sink_failure_at: float = 0.35        # of the duration
    uploader_kills_at: tuple = (0.25, 0.67)   # of the duration (the Spark sink)
    coordinator_at: int = 1              # which broker fault is the coordinator's (0-based)
    drain_timeout_s: float = 300.0
    group_protocol: str = "auto"         # [kafka] group_protocol: auto (consumer on Kafka 4.x) | classic
    at_least_once: bool = False          # accept duplicates (counted all the same)


def _daemon(cluster, root: Path, group: str, fail_file: Path, group_protocol: str, sink: str) -> Daemon:
    config = daemon_config(root, cluster.proxied_bootstrap, TOPICS[0], group, workers=WORKERS,
                           filters=[HEADER_RULE], topics=list(TOPICS), metrics_interval_ms=250,
                           sink_retry_backoff_max_ms=2000)
    config["kafka"]["isolation_level"] = "read_committed"
    config["kafka"]["group_protocol"] = group_protocol
    if group_protocol == "consumer":   # the broker decides these (and "auto" drops them itself)
        for key in ("session_timeout_ms", "heartbeat_interval_ms"):
            config["kafka"].pop(key, None)
    config["plugins"] = ["testkit.chaos.sink:"]
    if sink == "spark":
        # Batches of at most 20,000 records or 2 s per partition, uploaded by one local[2]
        # SparkSession; a worker waits for its upload without heartbeating the supervisor, so
        # the supervisor's patience (and with it the upload timeout, 0.8 of it) is a minute.
        config["daemon"].update(heartbeat_timeout_s=60.0, shutdown_timeout_s=60.0)
        config["sink"] = {"type": SINK_TYPES["spark"], "master": "local[2]", "path": str(root / "out"),
                          "max_records": 20000, "max_age_s": 2, "fail_file": str(fail_file)}
    else:
        config["sink"] = {"type": SINK_TYPES["jsonl"], "path": str(root / "out"), "fsync": False,
                          "fail_file": str(fail_file)}
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return Daemon(root, config, env={"PYTHONPATH": path})


def run_chaos(opts: ChaosOptions) -> VerdictResult:
    if opts.sink not in SINK_TYPES:
        raise ValueError(f"--sink {opts.sink!r}: expected one of {', '.join(SINK_TYPES)}")
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="kdaemon-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    rng = random.Random(opts.seed)
    errors: list[str] = []
    t_setup = time.monotonic()
    cluster = start_chaos_cluster(work / "kafka")
    daemon = None
    schedules: list[Schedule] = []
    try:
        cluster.create_topics(list(TOPICS), PARTITIONS)
        group = f"chaos-{uuid.uuid4().hex[:8]}"
        fail_file = work / "sink-fails-now"
        daemon = _daemon(cluster, work / "daemon", group, fail_file, opts.group_protocol, opts.sink)
        daemon.start()
        daemon.wait_all_ready(180)
        setup_s = time.monotonic() - t_setup

        ledger = Ledger()
        rate = opts.records / opts.duration_s / 2
        half = opts.records // 2
        producers = [
            PlainProducer("lz4", cluster.bootstrap, TOPICS[0], PARTITIONS, half, rate, ledger, seed=opts.seed),
            TransactionalProducer("zstd", cluster.bootstrap, TOPICS[1], PARTITIONS, opts.records - half,
                                  rate, ledger, seed=opts.seed + 1,
                                  transactional_id=f"chaos-txn-{uuid.uuid4().hex[:8]}"),
        ]
        faults = FaultLog()
        out = Path(daemon.config["sink"]["path"])
        reader = SparkOutputReader(out) if opts.sink == "spark" else OutputReader(out)
        sampler = Sampler(reader, ledger, faults)
        faults.sampler = sampler
        injector = Injector(cluster, daemon, faults, list(TOPICS), PARTITIONS, group, fail_file, rng,
                            down_s=opts.broker_down_s, window_s=opts.sink_failure_s,
                            coordinator_at=opts.coordinator_at)
        schedules = [
            Schedule("worker-kill", injector.worker_kill, opts.worker_kill_every_s, opts.worker_kill_every_s),
            Schedule("broker-kill", injector.broker_kill, min(15.0, opts.broker_kill_every_s / 2),
                     opts.broker_kill_every_s),
            Schedule("sink-failure", injector.sink_failure, opts.duration_s * opts.sink_failure_at, 0, times=1),
            Schedule("proxy-cut", injector.proxy_cut, opts.proxy_cut_every_s / 2, opts.proxy_cut_every_s),
        ]
        if opts.sink == "spark":   # twice: at a quarter and at two thirds of the run, by default
            first, second = (opts.duration_s * at for at in opts.uploader_kills_at)
            schedules.append(Schedule("uploader-kill", injector.uploader_kill, first, second - first, times=2))
        started = time.monotonic()
        sampler.start()
        for t in producers + schedules:
            t.start()

        # -- produce under faults -----------------------------------------------------------
        while any(p.is_alive() for p in producers):
            for s in schedules:
                if s.error is not None:
                    raise RuntimeError(f"fault {s.name} failed: {s.error!r}") from s.error
            if not daemon.alive():
                raise RuntimeError(f"kdaemon exited with {daemon.proc.returncode}\n{daemon.log_tail()}")
            time.sleep(0.5)
        produced_s = time.monotonic() - started
        errors += ledger.errors

        # -- stop the faults, heal, drain -----------------------------------------------------
        for s in schedules:
            s.halt.set()
        injector.halt.set()
        for s in schedules:
            s.join(300)
            if s.error is not None:
                errors.append(f"fault {s.name} failed: {s.error!r}")
        fail_file.unlink(missing_ok=True)
        cluster.revive_all()
        reconciled = 0
        if producers[0].restarts:   # reports lost with a replaced producer: ask the log
            reconciled = reconcile(cluster.bootstrap, TOPICS[0], PARTITIONS, ledger)
        expected = {k for k, fate in ledger.fates.items() if fate == "kept"}
        t_drain = time.monotonic()
        try:
            wait_for(lambda: reader.covers(expected) or not daemon.alive(), opts.drain_timeout_s,
                     "the daemon to deliver every kept record", interval=2.0)
        except AssertionError as exc:
            errors.append(str(exc))
        drain_s = time.monotonic() - t_drain
        sampler.halt.set()
        sampler.join(10)
        last = read_metrics(daemon) if daemon.alive() else {"error": "the daemon had exited"}
        exit_code = daemon.stop(120) if daemon.alive() else daemon.proc.returncode
        if exit_code != 0:
            errors.append(f"kdaemon exited with {exit_code}")
        verdict = compare(ledger.fates, reader.final())
        log = daemon.log()
        figures = {
            "records": opts.records, "duration_s": opts.duration_s, "group_protocol": opts.group_protocol,
            "sink": opts.sink,
            "at_least_once": opts.at_least_once,
            "produce_s": round(produced_s, 1), "drain_s": round(drain_s, 1), "setup_s": round(setup_s, 1),
            "faults": faults.summary(),
            "faults_injected": sum(1 for _ in faults.faults),
            "worker_restarts": int(last.get("restarts", 0)),
            "worker_starts_logged": log.count("started worker"),
            "rebalances": int(last.get("rebalances", 0)),
            "peak_lag": int(sampler.peak_lag),
            "proxy_cuts": cluster.proxy.cuts, "proxy_connections": cluster.proxy.connections,
            "sink_refusals": _lines(Path(str(fail_file) + REFUSALS_SUFFIX)),
            "sink_unavailable_logged": log.count("sink unavailable ("),
            "uploader_starts_logged": log.count("started companion spark-uploader"),
            "producer_restarts": producers[0].restarts, "producer_incidents": producers[0].incidents,
            "records_reconciled_from_log": reconciled,
            "txn_aborted_on_purpose": producers[1].aborted_on_purpose,
            "txn_aborted_by_error": producers[1].aborted_by_error,
            "txn_commit_retries": producers[1].commit_retries,
            "samples": sampler.samples, "commits": int(last.get("commits", 0)),
            "metrics_error": last.get("error"),
        }
        return VerdictResult(verdict_ok(verdict, at_least_once=opts.at_least_once) and not errors, verdict, figures, errors, str(work))
    finally:
        for s in schedules:
            s.halt.set()
        if daemon is not None:
            daemon.kill_all()
        cluster.stop()


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def print_result(r: VerdictResult) -> None:
    v, f = r.verdict, r.figures
    print(f"chaos run: {'PASS' if r.ok else 'FAIL'} ({r.workdir})")
    print(f"  records produced {v['produced']:,}: kept {v['kept']:,}, filtered {v['filtered']:,}, "
          f"in aborted transactions {v['aborted']:,}")
    print(f"  delivered {v['delivered_lines']:,} {'rows' if f.get('sink') == 'spark' else 'lines'}, "
          f"{v['delivered_distinct']:,} distinct")
    print(f"  lost {v['lost']}, duplicates {v['duplicates']}, aborted delivered {v['aborted_delivered']}, "
          f"filtered delivered {v['filtered_delivered']}, unknown {v['unknown_delivered']}")
    print(f"  faults injected {f['faults_injected']}, worker restarts {f['worker_restarts']}, "
          f"rebalances {f['rebalances']}, peak lag {f['peak_lag']:,}, proxy cuts {f['proxy_cuts']}")
    for kind, s in f["faults"].items():
        print(f"  {kind:17s} injected {s['injected']:3d}, recovered {s['recovered']:3d}, recovery "
              f"median {s['recovery_s_median']} s, max {s['recovery_s_max']} s")
    print(f"  produce {f['produce_s']} s, drain {f['drain_s']} s; transactions aborted on purpose "
          f"{f['txn_aborted_on_purpose']}, by error {f['txn_aborted_by_error']}")
    if f.get("producer_restarts"):
        print(f"  the idempotent producer was replaced {f['producer_restarts']} time(s) "
              f"({f['producer_incidents'][0].splitlines()[0]}); "
              f"{f['records_reconciled_from_log']:,} record(s) taken from the log instead of reports")
    print_examples_and_errors(v["examples"], r.errors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=ChaosOptions.records)
    ap.add_argument("--duration", type=float, default=ChaosOptions.duration_s,
                    help="seconds the producers take (the faults run meanwhile)")
    ap.add_argument("--sink", choices=("jsonl", "spark"), default="jsonl")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--workdir", type=Path, help="keep the cluster, daemon logs and output here")
    ap.add_argument("--seed", type=int, default=ChaosOptions.seed)
    ap.add_argument("--group-protocol", choices=("auto", "classic", "consumer"), default="auto")
    ap.add_argument("--at-least-once", action="store_true",
                    help="pass with duplicates (still counted): for a sink without dedupe")
    args = ap.parse_args(argv)
    if args.records <= 0 or args.duration <= 0:
        ap.error("--records and --duration must be positive")
    opts = ChaosOptions(records=args.records, duration_s=args.duration, sink=args.sink,
                        workdir=args.workdir, seed=args.seed, group_protocol=args.group_protocol,
                        at_least_once=args.at_least_once)
    try:
        result = run_chaos(opts)
    except ValueError as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    print_result(result)
    if args.json:
        args.json.write_text(json.dumps(verdict_report("bench/chaos", argv, opts, result), indent=2) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
