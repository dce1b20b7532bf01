"""Share groups (KIP-932), one member: kdaemon's ShareConsumer beside Java's KafkaShareConsumer and
confluent-kafka's ShareConsumer (librdkafka's preview), on Apache Kafka 4.4.

Run from the repository root::

    python bench/share [--records N] [--repeats R] [--poll-records N] [--modes raw json filter]
                       [--acks implicit explicit] [--clients kdaemon java confluent] [--json PATH]

``--records`` must be a multiple of 20 (default 40,000: the figures in docs/PERFORMANCE.md were
taken on a loaded 2-core machine, where larger runs would take others' CPU).

Input: bench/consume's data set (testkit/workload.py), written once by confluent-kafka with lz4
into one topic of 4 partitions on one Apache Kafka node (testkit/common.py's broker: the test
launcher's settings, a share coordinator whose state topic has replication factor 1 and
min.isr 1).  Each client's run is one member of a share group of its own, fresh per run, whose
``share.auto.offset.reset`` is set to ``earliest`` first (IncrementalAlterConfigs on the GROUP
resource, testkit/group_configs.py): it subscribes to the topic and reads every record.

Every client in its own child process (the Java one is testkit/java/KafkaPeer.java's
``share-bench``), the same work per record (bench/consume's modes: raw = the value's length,
json = ``json.loads`` / Jackson of every value, filter = the ``type`` header compared in the loop,
the kept tenth parsed), the same ``max_poll_records`` (``--poll-records``, default 500, Java's
share default; a soft limit for all three: a share fetch hands out what the broker acquired),
fetch sizes left at everyone's default.  Two acknowledgement modes (``--acks``): implicit (the
next poll accepts what the last one returned) and explicit (``acknowledge(record, ACCEPT)`` for
every record as it is processed; the verdicts ride on the next fetch).  A run stops once every
partition had the producer's count of records; a record delivered twice is an error (no lock
expires in a run this short), and so is a wrong check value.  Then ``commit_sync`` inside the
clock, so the last verdicts are part of the work, and ``close``.  Afterwards the bench asks the
group coordinator for the group's lag (DescribeShareGroupOffsets v1, testkit/share_groups.py):
it must be 0 on every partition, every record settled.

Timing as bench/consume's: the steady state from the end of the first poll that returned records
to the end of the final commit, the first poll's records not counted (the group join, the first
ShareFetch and the assignment stay outside); the client's CPU over the same window per record
(all its threads; for Java the whole JVM), and the broker's CPU sampled before and after each
run, per record read (its start-up and the broker's CPU at rest included).  Rates and CPU per
record are printed as ratios against Java's KafkaShareConsumer in the same mode and
acknowledgement mode.  Before the measured runs, one unmeasured read of the whole topic by
confluent-kafka in a share group of its own (``--no-warmup`` skips it): the broker's first share
group pays its JIT and the share coordinator's first state writes, about 3x the broker CPU per
record and half the rate of the runs after it, whichever client comes first.  Rates on a loaded
machine move by 2x from run to run: ``--repeats`` runs every row again, interleaved, and the
table shows the best.  Nothing here asserts a timing.
"""

from __future__ import annotations

# Only the standard library at module level (and bench.peers, testkit.workload, testkit.report,
# stdlib-only at module level too): a worker imports nothing but its own client.
import json
import sys
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from bench.peers import CHILD_TIMEOUT_S, Tally, attr_work, client_us_per_record, message_work, prepare_java, with_broker_cpu  # noqa: E402
from testkit.report import (  # noqa: E402
    arguments, banner, best, check_sources, command_line, number, parse, rate_ratio, table, times, write_json)
from testkit.workload import RECORDS_UNIT, TARGET, TOPIC, produce  # noqa: E402

MODES = ("raw", "json", "filter")
ACKS = ("implicit", "explicit")
CLIENTS = (("kdaemon", "kdaemon ShareConsumer"), ("java", "Java KafkaShareConsumer"),
           ("confluent", "confluent-kafka ShareConsumer"))
DEFAULT_RECORDS = 40_000
DEFAULT_POLL_RECORDS = 500


# -- the workers (child processes) ---------------------------------------------------------------

def worker_kdaemon(spec: dict, tally: Tally) -> dict:
    from kdaemon.client import ShareConsumer
    from kdaemon.protocol import records as krecords

    explicit = spec["ack"] == "explicit"
    consumer = ShareConsumer(spec["bootstrap"], group_id=spec["group"], client_id="bench-kdaemon-share",
                             share_acknowledgement_mode=spec["ack"], max_poll_records=spec["poll_records"])
    consumer.subscribe([spec["topic"]])
    work = attr_work(spec["mode"], False)
    acknowledge, poll = consumer.acknowledge, consumer.poll
    tally.start()
    while True:
        for tp, recs in poll(1000).items():
            s, k = work(recs)
            tally.check += s
            tally.kept += k
            tally.add(tp.partition, len(recs))
            if explicit:
                for r in recs:
                    acknowledge(r)
        if tally.done():
            tally.finish(consumer.commit_sync)
            break
    m = consumer.metrics()
    out = tally.result(accelerated=krecords.ACCELERATED, records_acquired=m.records_acquired,
                       records_redelivered=m.records_redelivered, acknowledged=dict(m.acknowledged),
                       acknowledge_errors=m.acknowledge_errors, lock_expiries=m.lock_expiries)
    consumer.close()
    return out


def worker_confluent(spec: dict, tally: Tally) -> dict:
    from confluent_kafka import ShareConsumer

    explicit = spec["ack"] == "explicit"
    consumer = ShareConsumer({"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
                              "client.id": "bench-confluent-share", "share.acknowledgement.mode": spec["ack"],
                              "max.poll.records": spec["poll_records"], "log_level": 3})
    consumer.subscribe([spec["topic"]])
    work = message_work(spec["mode"])
    counts = [0] * len(tally.expected)
    acknowledge = consumer.acknowledge
    tally.start()
    while True:
        msgs = consumer.poll(1.0)
        tally.take(*work(msgs, counts), counts)
        if explicit:
            for m in msgs:
                acknowledge(m)
        if tally.done():
            tally.finish(lambda: consumer.commit_sync(30.0))
            break
    out = tally.result()
    consumer.close()
    return out


WORKERS = {"kdaemon": worker_kdaemon, "confluent": worker_confluent}


def run_worker(spec: dict) -> dict:
    return WORKERS[spec["client"]](spec, Tally(spec["expected"], spec["max_seconds"]))


# -- the parent: broker, groups, children ------------------------------------------------------

def run_java(spec: dict) -> dict:
    import subprocess as sp

    from testkit.apache_kafka import KafkaUnavailable
    from testkit.java_peer import JavaPeerError, java_share_bench
    try:
        return java_share_bench(spec["bootstrap"], spec["group"], spec["topic"], spec["expected"], spec["mode"],
                                ack=spec["ack"], header="type", value=TARGET.decode(),
                                settings={"max.poll.records": str(spec["poll_records"])},
                                max_seconds=spec["max_seconds"], timeout=CHILD_TIMEOUT_S)
    except (JavaPeerError, KafkaUnavailable) as exc:
        return {"error": str(exc)[-2000:]}
    except sp.TimeoutExpired:
        return {"error": f"no answer from the Java share consumer within {CHILD_TIMEOUT_S} s"}


def run_child(spec: dict) -> dict:
    from testkit import common as _common
    return _common.run_child(__file__, "--worker", spec, CHILD_TIMEOUT_S)


def run_client(spec: dict, broker) -> dict:
    """One member's run in a share group of its own: the group's reset set to earliest first,
    the run with the broker's CPU beside it, then the group's lag (0 everywhere: all settled)."""
    from testkit.group_configs import set_group_configs
    from testkit.share_groups import share_lag

    set_group_configs(broker.bootstrap, spec["group"], {"share.auto.offset.reset": "earliest"})
    r = with_broker_cpu(broker, run_java if spec["client"] == "java" else run_child, spec)
    if "error" not in r:
        lag = share_lag(broker.host, broker.port, spec["group"])
        r["lag"] = sum(v for _, v in lag.values())
        if r["lag"] and not r["capped"]:
            r["error"] = f"records left unsettled after the run: lag per partition {sorted(lag.items())}"
    return r


def share_benchmark(args, log_dir: Path) -> dict:
    from testkit import common as _common

    with _common.open_broker("kafka", log_dir) as broker:
        print(broker.describe(), flush=True)
        print(f"producing {args.records:,} records with confluent-kafka (lz4)...", flush=True)
        produced = produce(broker.bootstrap, args.records)
        print(f"  {produced['seconds']:.1f} s; per partition {produced['expected']}", flush=True)
        idle = broker.idle_cpu()
        print(f"{broker.name} at rest (no client): {idle:.1%} of a core", flush=True)
        labels = dict(CLIENTS)
        specs = [{"client": client, "label": labels[client], "mode": mode, "ack": ack,
                  "bootstrap": broker.bootstrap, "topic": TOPIC, "expected": produced["expected"],
                  "poll_records": args.poll_records, "max_seconds": args.max_seconds}
                 for client in (c for c, _ in CLIENTS if not args.clients or c in args.clients)
                 for mode in args.modes for ack in args.acks]
        if any(s["client"] == "java" for s in specs):
            prepare_java()
        if args.warmup:
            # The broker's first share group pays its JIT and the share coordinator's first state
            # writes (seen: 3x the broker CPU per record, and half the rate, of the runs after
            # it, whichever client came first): one unmeasured read of the whole topic first.
            warm = dict(specs[0], client="confluent", mode="raw", ack="implicit",
                        group=f"bench-share-warmup-{uuid.uuid4().hex[:8]}")
            r = run_client(warm, broker)
            said = f"FAILED: {r['error'][:200]}" if "error" in r else f"{r['seconds']:.1f} s"
            print(f"  broker warm-up (confluent-kafka, raw, not measured): {said}", flush=True)
        results: dict[tuple[str, str, str], list[dict]] = {}
        for rep in range(args.repeats):
            for spec in specs:
                spec = dict(spec, group=f"bench-share-{spec['client']}-{spec['mode']}-{spec['ack']}-{uuid.uuid4().hex[:8]}")
                print(f"  [{rep + 1}/{args.repeats}] {spec['label']:<30} {spec['mode']:<6} {spec['ack']:<8} ",
                      end="", flush=True)
                r = run_client(spec, broker)
                if "error" not in r and not r["capped"]:
                    want_check, want_kept = produced["check"][spec["mode"]], produced["kept"][spec["mode"]]
                    if r["check"] != want_check or r["kept"] != want_kept:
                        r["error"] = (f"wrong result: check {r['check']} (want {want_check}), "
                                      f"kept {r['kept']} (want {want_kept})")
                results.setdefault((spec["client"], spec["mode"], spec["ack"]), []).append(r)
                if "error" in r:
                    print(f"FAILED: {r['error'][:300]}", flush=True)
                else:
                    us, bus = client_us_per_record(r), r["broker_us_per_record"]
                    print(f"{r['records_per_s'] or 0:>9,.0f} rec/s steady  1st rec {r['first_record_s'] or 0:5.2f} s  "
                          f"wall {r['seconds']:6.2f} s  cpu {r['cpu_s']:6.2f} s ({number(us)} us/rec)  "
                          f"broker {number(bus)} us/rec  rss {r['rss_peak_mb']:5.1f} MB"
                          f"{'  CAPPED' if r['capped'] else ''}", flush=True)
        described = broker.describe()
    return {"produced": produced, "results": results, "broker": {"name": broker.name, "describe": described,
                                                                  "idle_cpu": idle}}


# -- report ------------------------------------------------------------------------------------

def build_table(results: dict, modes, acks) -> list[dict]:
    rows = []
    for client, label in CLIENTS:
        for mode in modes:
            for ack in acks:
                runs = results.get((client, mode, ack))
                if not runs:
                    continue
                r = best(runs)
                row = {"client": client, "label": label, "mode": mode, "ack": ack, "repeats": len(runs)}
                if r is None:
                    row["error"] = runs[-1]["error"]
                    rows.append(row)
                    continue
                java = best(results.get(("java", mode, ack), []))
                us, jus = client_us_per_record(r), client_us_per_record(java) if java else None
                row.update({k: r.get(k) for k in (
                    "records_per_s", "rate_incl_setup", "seconds", "steady_seconds", "records", "first_batch",
                    "first_record_s", "cpu_s", "steady_cpu_s", "capped", "broker_us_per_record", "rss_peak_mb",
                    "lag", "commit_s", "records_acquired", "records_redelivered", "acknowledged",
                    "lock_expiries", "jit_compile_s", "gc_s", "java", "accelerated")})
                row.update({"client_us_per_record": us, "records_per_cpu_s": 1e6 / us if us else None,
                            "all_records_per_s": [x["records_per_s"] for x in runs if "error" not in x],
                            "vs_java": rate_ratio(r, java),
                            "vs_java_per_core": jus / us if us and jus else None,
                            "broker_vs_java": (r["broker_us_per_record"] / java["broker_us_per_record"]
                                               if java and r.get("broker_us_per_record")
                                               and java.get("broker_us_per_record") else None)})
                rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    x, num = times, number
    for r in rows:
        r.setdefault("label", "")
    head = (f"{'client':<30} {'mode':<6} {'ack':<8} {'records/s':>10} {'vs java':>7} {'rec/CPU-s':>10} "
            f"{'core/java':>9} {'us/rec':>6} {'broker':>6} {'brk/java':>8} {'1st rec s':>9} {'cpu/wall':>8} "
            f"{'RSS MB':>7}")
    for r in table(head, [dict(r, mode=f"{r['mode']:<6} {r['ack']:<8}") for r in rows], 30):
        load = r["steady_cpu_s"] / r["steady_seconds"] if r["steady_seconds"] and r["steady_cpu_s"] else 0.0
        first = "-" if r["first_record_s"] is None else f"{r['first_record_s']:.2f}"
        rate = "-" if r["records_per_s"] is None else f"{r['records_per_s']:,.0f}"
        print(f"{r['label']:<30} {r['mode']} {rate:>10} {x(r['vs_java']):>7} "
              f"{num(r['records_per_cpu_s'], ',.0f'):>10} {x(r['vs_java_per_core']):>9} "
              f"{num(r['client_us_per_record'], '.2f'):>6} {num(r['broker_us_per_record'], '.2f'):>6} "
              f"{x(r['broker_vs_java']):>8} {first:>9} {load:>8.0%} {r['rss_peak_mb']:>7.1f}"
              f"{'  CAPPED' if r['capped'] else ''}")
    print("-" * len(head))
    print("records/s: steady state, from the end of the first poll with records to the end of the final "
          "commit_sync, that poll's records not counted; best of the repeats.  vs java: this rate / Java "
          "KafkaShareConsumer's in the same mode and acknowledgement mode; rec/CPU-s: records per CPU-second "
          "of the client (all its threads; Java: the whole JVM) over the same window; core/java: that / "
          "Java's; us/rec: the client's CPU per record (microseconds); broker: the broker process's CPU per "
          "record read, sampled around the run (start-up, group join and its CPU at rest included); "
          "brk/java: that / the broker's for the Java run; 1st rec s: first poll call to the end of the "
          "first poll with records (group join included; Java: no JIT warm-up); cpu/wall: the client's "
          "CPU over the steady window; RSS: the child's peak (VmHWM)")


def main(argv: list[str] | None = None) -> int:
    parser = arguments(
        __doc__, repeats=(1, "runs per client, mode and acknowledgement mode; best is shown"),
        max_seconds="stop a client after this long and report it as CAPPED (default 300)", modes=MODES,
        clients="only these clients (default all): kdaemon, java, confluent")
    parser.add_argument("--records", type=int, default=DEFAULT_RECORDS,
                        help=f"records to produce (default {DEFAULT_RECORDS:,})")
    parser.add_argument("--poll-records", type=int, default=DEFAULT_POLL_RECORDS,
                        help=f"max_poll_records of every client (default {DEFAULT_POLL_RECORDS})")
    parser.add_argument("--acks", nargs="*", default=list(ACKS), choices=ACKS, help="acknowledgement modes")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="no unmeasured read of the topic before the measured runs")
    args = parse(parser, argv, {"--worker": lambda spec: run_worker(json.loads(spec))}, RECORDS_UNIT)
    if args is None:
        return 0
    head = banner("bench/share", require_accelerated=True)
    report: dict = {"date": head["started"].isoformat(timespec="seconds"), "machine": head["machine"],
                    "versions": head["versions"], "kdaemon_source": head["source"],
                    "command": command_line("bench/share", argv)}
    import os
    import tempfile
    with tempfile.TemporaryDirectory(prefix="kdaemon-bench-share-") as tmpdir:
        bench = share_benchmark(args, Path(tmpdir))
    rows = build_table(bench["results"], args.modes, args.acks)
    print_table(rows)
    load = os.getloadavg()
    print(f"load average at the end {', '.join(f'{v:.2f}' for v in load)}")
    report.update({"produced": bench["produced"], "rows": rows, "broker": bench["broker"], "loadavg_at_end": load})
    report["kdaemon_source_after"] = check_sources(head["source"])
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
