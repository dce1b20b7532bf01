"""The stall run: a sink away for ten minutes, two million records waiting; memory, CPU, recovery.

    .venv/bin/python bench/stall --sink-fault jsonl-unwritable --json jsonl.json
    .venv/bin/python bench/stall --sink-fault spark-master-down --json master.json
    .venv/bin/python bench/stall --sink-fault spark-uploader-killed --json uploader.json

Issue #18 asks what a worker costs while its sink cannot take records: its memory must stay
within the per-worker budget (``[daemon] memory_budget_mb``, 80 MB RSS by default) whatever the
backlog, it should use next to no CPU, and when the sink is back every record must be delivered
exactly once.  This run shows it with the daemon's default settings (two workers, nothing tuned
but what a run must say: broker, group, topic, state directory, metrics port, sink):

1. one Apache Kafka node (testkit/apache_kafka.py), a topic of 4 partitions;
2. the sink broken before any record exists (testkit/stall/faults.py: the jsonl directory mode
   0555, the Spark standalone master absent, or the Spark uploader SIGKILLed whenever it runs),
   ``kdaemon run`` started, every worker assigned, a few idle seconds (the baseline RSS);
3. ``--records`` records of about 200 bytes produced with delivery reports (testkit/stall/input.py);
   the stall starts when a worker first logs "sink unavailable" and lasts ``--stall-s``, and at
   least until the last delivery report is in (so every record waits);
4. every worker's RSS and CPU-seconds (and the supervisor's, the uploader's) sampled every
   0.5 s throughout (testkit/stall/procs.py), the Spark staging directory's size too, and what
   the workers fetched while paused (/metrics read once every worker has reported the stall,
   and again when the sink is brought back);
5. the sink brought back; the time until the first record and until every record is in the
   sink, and until every offset is committed; the daemon stopped;
6. the verdict: every record read back (jsonl lines; Spark output read with Spark) against the
   delivery reports: lost 0, duplicates 0, nothing unknown.

The exit code is 1 unless the verdict holds.  The memory budget is reported (per worker, peak
during the stall and during recovery, against ``memory_budget_mb``), not part of the exit code.
``run_stall(StallOptions(...))`` is the same run for tests/stall/test_stall_reduced.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.error
import uuid
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from testkit.report import VerdictResult, commit_id, print_examples_and_errors, verdict_report  # noqa: E402
from testkit.stall.faults import FAULTS, make_fault  # noqa: E402
from testkit.stall.input import Produced, Producer, Progress, verdict  # noqa: E402
from testkit.stall.procs import EVENTS, MB, ProcessSampler, first_unavailable, log_events  # noqa: E402
from kdaemon.config.model import DaemonSection  # noqa: E402
from testkit.daemon import free_port, wait_for  # noqa: E402
from testkit.apache_kafka import start_kafka  # noqa: E402
from testkit.produce import committed_offsets, create_topic  # noqa: E402

PARTITIONS = 4
WORKERS = 2
SETTLE_S = 5.0          # idle seconds after every worker has its assignment: the baseline
SETTLE_PAUSED_S = 3.0   # after every worker reported the stall: fetches in flight are in, metrics published
BUDGET_MB = getattr(DaemonSection(), "memory_budget_mb", 80)


@dataclass
class StallOptions:
    fault: str = "jsonl-unwritable"
    records: int = 2_000_000
    stall_s: float = 600.0
    workdir: Path | None = None
    bootstrap: str | None = None        # a broker already running (tests); else one is started
    master_return: str = "standalone"   # spark-master-down: "reload" skips the standalone master
    first_stall_timeout_s: float = 300.0
    drain_timeout_s: float = 1800.0
    commit_timeout_s: float = 300.0


def stall_config(root: Path, bootstrap: str, topic: str, group: str, sink: dict) -> dict:
    """The daemon's defaults but what this run must name.  ``auto_offset_reset = "earliest"``
    is what to read, not tuning: the group is new."""
    return {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group, "auto_offset_reset": "earliest"},
        "daemon": {"topics": [topic], "workers": WORKERS, "daemon_id": "stall",
                   "state_dir": str(root / "state"), "metrics_addr": f"127.0.0.1:{free_port()}"},
        "sink": sink,
    }


def fetch_metrics(daemon) -> dict:
    """What the workers fetched so far and who says the sink is down (/metrics), or the error."""
    names = {"kdaemon_fetch_bytes_total": "bytes_fetched", "kdaemon_records_fetched_total": "records_fetched",
             "kdaemon_sink_down_workers": "sink_down_workers"}
    out = {v: 0.0 for v in names.values()} | {"sink_down_seconds": 0.0, "at": time.time()}
    try:
        metrics = daemon.metrics()
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return {"error": repr(exc), "at": time.time()}
    for (name, _), v in metrics.items():
        if name in names:
            out[names[name]] += v
        elif name == "kdaemon_sink_down_seconds":
            out["sink_down_seconds"] = max(out["sink_down_seconds"], v)
    return out


def _say(msg: str) -> None:
    print(f"stall {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


def run_stall(opts: StallOptions) -> VerdictResult:
    work = Path(opts.workdir or tempfile.mkdtemp(prefix="kdaemon-stall-"))
    work.mkdir(parents=True, exist_ok=True)
    fault = make_fault(opts.fault, work, master_return=opts.master_return)
    errors: list[str] = []
    cluster = daemon = sampler = producer = None
    t: dict[str, float] = {}
    fetched: dict[str, dict] = {}
    progress_at_heal = 0
    exit_code = None
    try:
        t["setup"] = time.time()
        if opts.bootstrap is None:
            cluster = start_kafka(work / "kafka")
        bootstrap = opts.bootstrap or cluster.bootstrap
        topic, group = f"stall-{uuid.uuid4().hex[:8]}", f"stall-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, PARTITIONS)
        root = work / "daemon"
        out = root / "out"
        fault.prepare(out)
        config = stall_config(root, bootstrap, topic, group, fault.sink_settings(out))
        env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        if fault.sink == "spark":
            env["SPARK_LOCAL_IP"] = "127.0.0.1"   # the uploader's driver: loopback, as the executors
        daemon = fault.make_daemon(root, config, env)
        staging = Path(config["daemon"]["state_dir"]) / "spark-staging" if fault.sink == "spark" else None
        sampler = ProcessSampler(daemon, staging)
        daemon.start()
        sampler.start()
        daemon.wait_all_ready(180)
        t["ready"] = time.time()
        fault.after_ready(daemon, sampler)
        time.sleep(SETTLE_S)
        _say(f"{opts.fault}: daemon ready, producing {opts.records:,} records")

        produced = Produced(topic, PARTITIONS)
        producer = Producer(bootstrap, produced, opts.records)
        t["produce"] = time.time()
        producer.start()

        def alive() -> None:
            if not daemon.alive():
                raise RuntimeError(f"kdaemon exited with {daemon.proc.returncode}\n{daemon.log_tail()}")
            if producer.error is not None:
                raise RuntimeError(f"producing failed: {producer.error!r}") from producer.error
            if hasattr(fault, "check"):
                fault.check()

        # -- the stall: from a worker's first "sink unavailable" ---------------------------------
        wait_for(lambda: alive() or first_unavailable(daemon.log()), opts.first_stall_timeout_s,
                 'a worker to log "sink unavailable"', daemon.log_tail, interval=0.2)
        t["stall"] = first_unavailable(daemon.log())
        _say("the sink is unavailable (logged by a worker); stalling")
        mark = None   # when every worker has paused: from then on nothing may be fetched
        while True:
            alive()
            now = time.time()
            if mark is None:
                firsts = log_events(daemon.log())["first_by_worker"]["unavailable"]
                if len(firsts) >= WORKERS:
                    mark = max(firsts.values()) + SETTLE_PAUSED_S
            if mark is not None and "mark" not in fetched and now >= mark:
                fetched["mark"] = fetch_metrics(daemon)
            if now >= t["stall"] + opts.stall_s and producer.done_at is not None:
                break
            time.sleep(0.5)
        fetched.setdefault("mark", {"error": f"not every worker reported the stall ({WORKERS} expected)"})
        fetched["heal"] = fetch_metrics(daemon)
        t["produced"] = producer.done_at
        progress = Progress(fault.sink, out)
        progress_at_heal = progress.count()

        # -- recovery ----------------------------------------------------------------------------
        t["heal"] = time.time()
        _say("bringing the sink back")
        fault.heal(daemon)
        t["back"] = time.time()
        n = len(produced)
        deadline = t["back"] + opts.drain_timeout_s
        while True:
            count = progress.count()
            now = time.time()
            if count > 0 and "first" not in t:
                t["first"] = now
            if count >= n:
                t["all"] = now
                break
            if not daemon.alive() or now > deadline:
                errors.append(f"{count:,} of {n:,} records in the sink after {now - t['back']:.0f} s"
                              + ("" if daemon.alive() else f"; kdaemon exited with {daemon.proc.returncode}"))
                break
            time.sleep(0.5)
        if "all" in t:
            _say("every record is in the sink; waiting for the commits")
            ends = produced.ends()
            try:
                wait_for(lambda: all(committed_offsets(bootstrap, group, topic, PARTITIONS).get(p, -1) >= e
                                     for p, e in ends.items()),
                         opts.commit_timeout_s, f"committed offsets to reach {ends}", interval=2.0)
                t["committed"] = time.time()
            except AssertionError as exc:
                errors.append(str(exc).splitlines()[0])
        t["end"] = time.time()
        sampler.halt.set()
        sampler.join(10)
        exit_code = daemon.stop(120) if daemon.alive() else daemon.proc.returncode
        if exit_code != 0:
            errors.append(f"kdaemon exited with {exit_code}")
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        if sampler is not None:
            sampler.halt.set()
        fault.close()
        if daemon is not None:
            daemon.kill_all()
        if cluster is not None:
            cluster.stop()
    v: dict = {}
    if producer is not None and producer.done_at is not None and "back" in t:
        _say("reading every record back for the verdict")
        try:
            v = verdict(fault.sink, Path(daemon.config["sink"]["path"]), producer.produced)
        except Exception as exc:
            errors.append(f"reading the output back failed: {type(exc).__name__}: {exc}")
    figures = _figures(opts, fault, daemon, sampler, producer, t, fetched, progress_at_heal, exit_code)
    if sampler is not None:
        errors += [f"sampler: {e}" for e in sampler.errors]
    ok = bool(v) and not errors and (v["lost"], v["duplicates"], v["unknown_delivered"]) == (0, 0, 0) \
        and v["delivered_distinct"] == v["produced"] == opts.records
    return VerdictResult(ok, v, figures, errors, str(work))


def _mb(x: int | None) -> float | None:
    return None if x is None else round(x / MB, 1)


def _since(t: dict, key: str, start: str) -> float | None:
    return round(t[key] - t[start], 1) if key in t and start in t and t[key] is not None else None


def _figures(opts, fault, daemon, sampler, producer, t, fetched, progress_at_heal, exit_code) -> dict:
    f = {"sink_fault": opts.fault, "records": opts.records, "stall_s_requested": opts.stall_s,
         "partitions": PARTITIONS, "workers": WORKERS, "memory_budget_mb": BUDGET_MB,
         "fault": fault.details, "times_wall": {k: v for k, v in t.items() if v is not None}}
    if daemon is None or sampler is None or "stall" not in t:
        return f
    end = t.get("end", time.time())
    heal = t.get("heal", end)
    text = daemon.log()
    ev = log_events(text, t.get("ready", 0.0), end)
    stall_s = heal - t["stall"]
    quiet_from = max(t["stall"], t.get("produced") or heal)
    f.update(
        stall_s=round(stall_s, 1), produce_s=_since(t, "produced", "produce"),
        records_arrived_during_stall=bool(t.get("produced") and t["produced"] > t["stall"]),
        quiet_stall_s=round(max(0.0, heal - quiet_from), 1),
        heal_s=_since(t, "back", "heal"), first_delivered_s=_since(t, "first", "back"),
        all_delivered_s=_since(t, "all", "back"), all_committed_s=_since(t, "committed", "back"),
        records_in_sink_at_heal=progress_at_heal, daemon_exit_code=exit_code,
        first_unavailable_line=ev["first_line"].get("unavailable", ""),
    )
    workers = {}
    for i in sampler.worker_indexes():
        firsts = ev["first_by_worker"]["unavailable"]
        workers[i] = {
            "rss_mb_at_ready": _mb(sampler.rss_near(i, t["ready"], before=False)),
            "rss_mb_before_stall": _mb(sampler.rss_near(i, t["stall"], before=True)),
            "rss_mb_peak_stall": _mb(sampler.peak_rss("worker", t["stall"], heal, i)),
            "rss_mb_peak_recovery": _mb(sampler.peak_rss("worker", heal, end, i)),
            "rss_mb_peak_run": _mb(sampler.peak_rss("worker", t["ready"], end, i)),
            "cpu_s_stall": round(sampler.cpu("worker", t["stall"], heal, i), 2),
            "cpu_s_quiet_stall": round(sampler.cpu("worker", quiet_from, heal, i), 2),
            "cpu_s_recovery": round(sampler.cpu("worker", heal, end, i), 2),
            "first_unavailable_after_s": round(firsts[i] - t["stall"], 1) if i in firsts else None,
            "logged": {kind: ev["counts"][kind].get(i, 0) for kind in EVENTS},
            "rss_mb_per_10s_from_stall_start": sampler.rss_series(i, t["ready"], end, t["stall"]),
        }
    f["per_worker"] = workers
    peaks = [w[k] for w in workers.values() for k in ("rss_mb_peak_stall", "rss_mb_peak_recovery") if w[k] is not None]
    f["rss_mb_peak_any_worker"] = max(peaks) if peaks else None
    f["within_budget"] = bool(peaks) and max(peaks) <= BUDGET_MB
    f["cpu_s_stall"] = {role: round(sampler.cpu(role, t["stall"], heal), 2) for role in ("worker", "supervisor", "uploader")}
    f["cpu_s_quiet_stall"] = {role: round(sampler.cpu(role, quiet_from, heal), 2) for role in ("worker", "supervisor", "uploader")}
    f["uploader_processes_in_stall"] = sampler.processes("uploader", t["stall"], heal)
    f["staged_mb_peak_stall"] = _mb(sampler.peak_staged(t["stall"], heal))
    f["staged_mb_peak_recovery"] = _mb(sampler.peak_staged(heal, end))
    f["worker_starts_logged"] = text.count("started worker")
    f["uploader_starts_logged"] = text.count("started companion spark-uploader")
    f["sampler_rounds"] = sampler.rounds
    mark, at_heal = fetched.get("mark", {}), fetched.get("heal", {})
    if "error" not in mark and "error" not in at_heal and mark and at_heal:
        f["fetched_while_paused"] = {
            "window_s": round(at_heal["at"] - mark["at"], 1),
            "bytes": int(at_heal["bytes_fetched"] - mark["bytes_fetched"]),
            "records": int(at_heal["records_fetched"] - mark["records_fetched"]),
            # Produced but not yet polled when every worker had paused: what a paused worker
            # must leave alone (in Kafka or in its fetch buffer) until the sink is back.
            "records_unpolled_at_pause": int(opts.records - mark["records_fetched"]),
            "sink_down_workers_at_heal": at_heal["sink_down_workers"],
            "sink_down_seconds_at_heal": round(at_heal["sink_down_seconds"], 1)}
    else:
        f["fetched_while_paused"] = {"error": mark.get("error") or at_heal.get("error") or "not read"}
    return f


def print_result(r: VerdictResult) -> None:
    v, f = r.verdict, r.figures
    print(f"stall run ({f['sink_fault']}): {'PASS' if r.ok else 'FAIL'} ({r.workdir})")
    for k, val in f.get("fault", {}).items():
        print(f"  {k}: {val}")
    if "stall_s" in f:
        print(f"  records {f['records']:,} produced in {f['produce_s']} s "
              f"({'arriving during the stall' if f['records_arrived_during_stall'] else 'before the stall'}); "
              f"in the sink when it came back: {f['records_in_sink_at_heal']:,}")
        print(f"  stall {f['stall_s']} s (asked {f['stall_s_requested']:.0f} s; {f['quiet_stall_s']} s of it with "
              f"every record produced); first line: {f['first_unavailable_line'][:160]}")
        print(f"  RSS per worker, MB (budget {f['memory_budget_mb']}): "
              + ("within budget" if f["within_budget"] else "OVER BUDGET")
              + f", peak {f['rss_mb_peak_any_worker']}")
        for i, w in f.get("per_worker", {}).items():
            logged = ", ".join(f"{k} {n}" for k, n in w["logged"].items())
            print(f"    worker {i}: at ready {w['rss_mb_at_ready']}, before the stall {w['rss_mb_before_stall']}, "
                  f"peak stall {w['rss_mb_peak_stall']}, peak recovery {w['rss_mb_peak_recovery']}; "
                  f"CPU s stall {w['cpu_s_stall']} (quiet part {w['cpu_s_quiet_stall']}), recovery "
                  f"{w['cpu_s_recovery']}; logged: {logged}")
        c, q = f["cpu_s_stall"], f["cpu_s_quiet_stall"]
        print(f"  CPU s during the stall: workers {c['worker']}, supervisor {c['supervisor']}, uploader "
              f"{c['uploader']} ({f['uploader_processes_in_stall']} process(es)); quiet part: workers "
              f"{q['worker']}, supervisor {q['supervisor']}, uploader {q['uploader']}")
        print(f"  fetched while paused: {f['fetched_while_paused']}")
        if f["staged_mb_peak_stall"] or f["staged_mb_peak_recovery"]:
            print(f"  staged on disk, MB: peak stall {f['staged_mb_peak_stall']}, peak recovery "
                  f"{f['staged_mb_peak_recovery']}")
        print(f"  recovery: sink back after {f['heal_s']} s of healing; first record {f['first_delivered_s']} s, "
              f"all in the sink {f['all_delivered_s']} s, all committed {f['all_committed_s']} s after that")
        print(f"  worker starts logged {f['worker_starts_logged']}, uploader starts logged "
              f"{f['uploader_starts_logged']}; daemon exit code {f['daemon_exit_code']}")
    if v:
        print(f"  verdict: produced {v['produced']:,}, delivered {v['delivered_lines']:,} "
              f"({v['delivered_distinct']:,} distinct): lost {v['lost']}, duplicates {v['duplicates']}, "
              f"unknown {v['unknown_delivered']}")
    print_examples_and_errors(v["examples"] if v else {}, r.errors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sink-fault", choices=FAULTS, required=True)
    ap.add_argument("--records", type=int, default=StallOptions.records)
    ap.add_argument("--stall-s", type=float, default=StallOptions.stall_s,
                    help="seconds the sink stays down after a worker first reports it")
    ap.add_argument("--master-return", choices=("standalone", "reload"), default="standalone",
                    help="spark-master-down: start a standalone master (default), or reload to local[2]")
    ap.add_argument("--drain-timeout-s", type=float, default=StallOptions.drain_timeout_s)
    ap.add_argument("--workdir", type=Path, help="keep the broker's and daemon's logs and the output here")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    if args.records <= 0 or args.stall_s <= 0:
        ap.error("--records and --stall-s must be positive")
    opts = StallOptions(fault=args.sink_fault, records=args.records, stall_s=args.stall_s,
                        workdir=args.workdir, master_return=args.master_return,
                        drain_timeout_s=args.drain_timeout_s)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    commit = commit_id()   # at the start: what the daemon runs (the tree may change meanwhile)
    load = os.getloadavg()
    result = run_stall(opts)
    print_result(result)
    if args.json:
        out = verdict_report("bench/stall", argv, opts, result, date=started, commit=commit,
                             commit_at_end=commit_id(), cpus=os.cpu_count(),
                             loadavg_at_start=[round(x, 2) for x in load])
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
