"""The daemon past its partition count: ``kdaemon run`` with share-group workers (``[kafka]
group_type = "share"``) against the same daemon in a consumer group, on a 2-partition topic where
every record costs time in a plugin.

Run from the repository root::

    python bench/share/scaling.py [--records N] [--cpu-us US] [--wait-us US]
                                  [--rows consumer:2 share:2 share:8] [--costs cpu wait]
                                  [--keep DIR] [--json PATH]

A consumer group can use at most one worker per partition: on 2 partitions, 2 workers, whatever
``[daemon] workers`` says.  A share group hands records out one by one, so 8 workers can all
work on 2 partitions.  Whether that is faster depends on what the work waits for: a record that
costs CPU is done no sooner by 8 workers than by 2 on a machine with 2 cores (this one), a
record that waits on something outside (a remote lookup, say) is.  Both costs are run:

* cpu: the ``burn`` deserializer (bench/share/burn_plugin.py) burns ``--cpu-us`` (default 200)
  microseconds of the worker's own CPU time per record;
* wait: it sleeps ``--wait-us`` (default 1,000) microseconds per record instead, costing no CPU.

Input: one Apache Kafka 4.4 node (testkit/common.py: the test launcher's settings, a share
coordinator whose state topic has replication factor 1 and min.isr 1), one topic of 2 partitions,
``--records`` (default 20,000) of bench/consume's records (testkit/workload.py: a ~200-byte JSON
value, a key, two headers) written by confluent-kafka with lz4 before the daemon starts, half per
partition.

Each row (``--rows``, ``group_type:workers``) is a fresh ``kdaemon run`` (testkit/daemon.py: its
configuration, state and output in a directory of its own) with a fresh group: the value through
``burn``, the jsonl sink (its defaults: fsync on, a flush a second), every other setting the
daemon's default; a consumer group reads from the earliest offset (``auto_offset_reset``), a
share group from the earliest record (``[share] auto_offset_reset``, which worker 0 sets on the
group at start).  The bench counts the lines of the sink's files (published and still open) every
0.2 s from outside, and reports:

* all in output: seconds from starting ``kdaemon run`` until every record is in the output
  (process start, group join and the last flush included);
* records/s: the rate between 10% and 90% of the records in the output (interpolated between
  samples), so start-up and the tail are outside it;
* workers CPU: CPU seconds of the daemon's processes (supervisor and workers) from start until
  every record is in the output, and per record;
* after SIGTERM (the daemon must exit 0), every line is parsed: each (partition, offset) must be
  there, and lines beyond that are counted as duplicates (share groups: only after a lock
  expiry or a crash; none expected).

The machine's load average is printed with the table: on a shared machine the figures move with
it.  Nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from testkit.report import banner, check_sources, command_line, number, times, write_json  # noqa: E402

TOPIC = "bench-share-scaling"
PARTITIONS = 2
PLUGIN = "bench.share.burn_plugin:"
SAMPLE_S = 0.2
DEFAULT_ROWS = ("consumer:2", "share:2", "share:8")
COSTS = ("cpu", "wait")
# Options of testkit.daemon.daemon_config's [kafka] that a share group refuses (the broker decides).
CONSUMER_GROUP_ONLY = ("auto_offset_reset", "session_timeout_ms", "heartbeat_interval_ms")


# -- the data -------------------------------------------------------------------------------------

def produce(bootstrap: str, n: int) -> list[int]:
    """n of the workload's records into a fresh 2-partition topic, alternating; the delivered
    count per partition."""
    from testkit.produce import Writer, create_topic
    from testkit.workload import iter_records

    create_topic(bootstrap, TOPIC, PARTITIONS)
    writer = Writer(bootstrap, TOPIC, "lz4", **{"enable.idempotence": False, "linger.ms": 100})
    for i, _, key, value, headers in iter_records(n):
        writer.send(value, key, partition=i % PARTITIONS, headers=headers)
    writer.flush_checked(120)
    counts = [writer.counts.get(p, 0) for p in range(PARTITIONS)]
    if sum(counts) != n:
        raise RuntimeError(f"produce failed: {sum(counts)} of {n} delivered")
    return counts


# -- one daemon run ---------------------------------------------------------------------------------

def config_for(root: Path, bootstrap: str, group: str, group_type: str, workers: int, cost: str,
               cpu_us: int, wait_us: int) -> dict:
    from testkit.daemon import daemon_config

    config = daemon_config(root, bootstrap, TOPIC, group, workers=workers, sink="jsonl")
    d = config["daemon"]
    for key in ("flush_interval_ms", "poll_timeout_ms"):   # the daemon's own defaults
        d.pop(key, None)
    d["on_deserialize_error"] = "stop"
    config["sink"] = {"type": "jsonl", "path": str(root / "out")}
    config["plugins"] = [PLUGIN]
    config["deserializer"] = {"key": "str", "value": "burn",
                              "settings": {"cpu_us": cpu_us if cost == "cpu" else 0,
                                           "wait_us": wait_us if cost == "wait" else 0}}
    if group_type == "share":
        for key in CONSUMER_GROUP_ONLY:
            config["kafka"].pop(key, None)
        config["kafka"]["group_type"] = "share"
        config["share"] = {"auto_offset_reset": "earliest"}
    return config


class OutputCounter:
    """Lines in the jsonl sink's directory, read incrementally: per file (by inode, so the rename
    of ``.jsonl.open`` to ``.jsonl`` is the same file) the bytes read so far and their newlines."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.read: dict[int, list[int]] = {}   # inode -> [bytes read, lines]

    def count(self) -> int:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        for name in names:
            if not (name.endswith(".jsonl") or name.endswith(".jsonl.open")):
                continue
            try:
                with open(self.directory / name, "rb") as f:
                    seen = self.read.setdefault(os.fstat(f.fileno()).st_ino, [0, 0])
                    f.seek(seen[0])
                    data = f.read()
            except FileNotFoundError:
                continue   # renamed between the listing and the open: the next sample has it
            end = data.rfind(b"\n") + 1   # a line being written counts once it is complete
            seen[0] += end
            seen[1] += data.count(b"\n", 0, end)
        return sum(lines for _, lines in self.read.values())


def output_records(directory: Path) -> tuple[int, set[tuple[int, int]]]:
    """(lines, distinct (partition, offset)) of every jsonl file in ``directory``."""
    lines, seen = 0, set()
    for path in directory.iterdir():
        if path.name.endswith(".jsonl") or path.name.endswith(".jsonl.open"):
            with open(path, "rb") as f:
                for line in f:
                    if line.endswith(b"\n"):
                        obj = json.loads(line)
                        lines += 1
                        seen.add((int(obj["partition"]), int(obj["offset"])))
    return lines, seen


def crossing(samples: list[tuple[float, int]], target: float) -> float | None:
    """The first instant the (t, count) curve, linear between samples, reaches ``target``."""
    for i, (t, v) in enumerate(samples):
        if v >= target:
            if i == 0:
                return t
            t0, v0 = samples[i - 1]
            return t0 + (target - v0) / (v - v0) * (t - t0)
    return None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children."""
    import psutil
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            c = p.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


def run_row(broker, expected: list[int], group_type: str, workers: int, cost: str, args, root: Path) -> dict:
    from testkit import common as _common
    from testkit.daemon import Daemon

    n = sum(expected)
    group = f"bench-share-scaling-{group_type}-{workers}-{cost}-{uuid.uuid4().hex[:8]}"
    config = config_for(root, broker.bootstrap, group, group_type, workers, cost, args.cpu_us, args.wait_us)
    env = _common.child_env(drop=("PROMETHEUS_MULTIPROC_DIR", "NOTIFY_SOCKET"))
    counter = OutputCounter(root / "out")
    samples: list[tuple[float, int]] = []
    broker_cpu0 = broker.cpu_s()
    daemon = Daemon(root, config, env=env)
    out: dict = {"group_type": group_type, "workers": workers, "cost": cost, "group": group}
    try:
        t0 = time.monotonic()
        daemon.start()
        deadline = t0 + args.max_seconds
        cpu = 0.0
        while True:
            time.sleep(SAMPLE_S)
            now, got = time.monotonic(), counter.count()
            samples.append((now - t0, got))
            if got >= n:
                cpu = tree_cpu_s(daemon.pid)
                break
            if not daemon.alive():
                raise RuntimeError(f"kdaemon run exited {daemon.proc.returncode} with {got} of {n} records "
                                   f"in the output\n{daemon.log_tail(30)}")
            if now > deadline:
                raise RuntimeError(f"{got} of {n} records in the output after {args.max_seconds:g} s\n"
                                   f"{daemon.log_tail(30)}")
        broker_cpu = broker.cpu_s() - broker_cpu0
        code = daemon.stop(60)
        if code != 0:
            raise RuntimeError(f"kdaemon run exited {code} after SIGTERM\n{daemon.log_tail(30)}")
        lines, seen = output_records(root / "out")
        missing = [(p, o) for p in range(PARTITIONS) for o in range(expected[p]) if (p, o) not in seen]
        if missing:
            raise RuntimeError(f"{len(missing)} record(s) missing from the output, e.g. {missing[:5]}")
        t_all = samples[-1][0]
        first = next(t for t, v in samples if v)
        ta, tb = crossing(samples, 0.1 * n), crossing(samples, 0.9 * n)
        out.update({"records": n, "lines": lines, "duplicates": lines - len(seen), "all_in_output_s": t_all,
                    "first_in_output_s": first,
                    "records_per_s": 0.8 * n / (tb - ta) if ta is not None and tb and tb > ta else None,
                    "window_points": sum(ta < t < tb for t, _ in samples) if ta is not None and tb else 0,
                    "daemon_cpu_s": cpu, "daemon_us_per_record": cpu / n * 1e6,
                    "broker_cpu_s": broker_cpu, "broker_us_per_record": broker_cpu / n * 1e6,
                    "samples": samples})
    except Exception as exc:  # noqa: BLE001 - a failed row is reported, the others still run
        out["error"] = str(exc)
    finally:
        daemon.kill_all()
    return out


# -- report ------------------------------------------------------------------------------------------

def print_table(rows: list[dict], args) -> None:
    head = (f"{'cost per record':<18} {'group':<9} {'workers':>7} {'records/s':>10} {'vs cg':>6} "
            f"{'all in output s':>15} {'1st out s':>9} {'daemon CPU s':>12} {'us/rec':>7} {'broker us/rec':>13} "
            f"{'dupl.':>5}")
    print()
    print(head)
    print("-" * len(head))
    for r in rows:
        cost = f"{args.cpu_us} us CPU" if r["cost"] == "cpu" else f"{args.wait_us} us wait"
        if "error" in r:
            print(f"{cost:<18} {r['group_type']:<9} {r['workers']:>7} FAILED: {r['error'][:400]}")
            continue
        base = next((b for b in rows if b["cost"] == r["cost"] and b["group_type"] == "consumer"
                     and "error" not in b and b.get("records_per_s")), None)
        ratio = r["records_per_s"] / base["records_per_s"] if base and r.get("records_per_s") else None
        print(f"{cost:<18} {r['group_type']:<9} {r['workers']:>7} {number(r['records_per_s'], ',.0f'):>10} "
              f"{times(ratio):>6} {r['all_in_output_s']:>15.1f} {r['first_in_output_s']:>9.1f} "
              f"{r['daemon_cpu_s']:>12.1f} {r['daemon_us_per_record']:>7.0f} {r['broker_us_per_record']:>13.0f} "
              f"{r['duplicates']:>5}")
    print("-" * len(head))
    print("records/s: between 10% and 90% of the records in the jsonl output; vs cg: that / the consumer "
          "group's with the same cost; all in output s: from starting `kdaemon run` until every record is "
          "in the output (start, join, last flush included); 1st out s: until the first; daemon CPU s: the "
          "daemon's processes' CPU from start until then (us/rec: per record, the plugin's cost included); "
          "broker us/rec: the broker's CPU over the same run per record; dupl.: lines beyond one per record")


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="records to produce (default 20,000)")
    parser.add_argument("--cpu-us", type=int, default=200, help="CPU microseconds per record, cost cpu (default 200)")
    parser.add_argument("--wait-us", type=int, default=1000,
                        help="microseconds of sleep per record, cost wait (default 1,000)")
    parser.add_argument("--rows", nargs="*", default=list(DEFAULT_ROWS),
                        help="group_type:workers per row (default consumer:2 share:2 share:8)")
    parser.add_argument("--costs", nargs="*", default=list(COSTS), choices=COSTS)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="give up on a row after this long")
    parser.add_argument("--keep", metavar="DIR", help="keep every run's configuration, log and output under DIR")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    args = parser.parse_args(argv)
    rows_spec = []
    for spec in args.rows:
        group_type, _, workers = spec.partition(":")
        if group_type not in ("consumer", "share") or not workers.isdigit() or int(workers) < 1:
            parser.error(f"--rows takes group_type:workers with group_type consumer or share, got {spec!r}")
        rows_spec.append((group_type, int(workers)))
    if args.records <= 0 or args.records % PARTITIONS:
        parser.error(f"--records must be a positive multiple of {PARTITIONS}")

    from testkit import common as _common

    head = banner("bench/share/scaling.py", require_accelerated=True)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kdaemon-bench-scaling-"))
    rows = []
    with _common.open_broker("kafka", base / "broker") as broker:
        print(broker.describe(), flush=True)
        expected = produce(broker.bootstrap, args.records)
        print(f"{args.records:,} records in {TOPIC} ({PARTITIONS} partitions: {expected})", flush=True)
        for cost in args.costs:
            for group_type, workers in rows_spec:
                root = base / f"{cost}-{group_type}-{workers}"
                load = os.getloadavg()[0]
                print(f"  {cost:<5} {group_type:<9} {workers} worker(s) (load {load:.2f}) ... ", end="", flush=True)
                r = run_row(broker, expected, group_type, workers, cost, args, root)
                r["loadavg_1m_at_start"] = load
                rows.append(r)
                print(f"FAILED: {r['error'][:300]}" if "error" in r else
                      f"{number(r['records_per_s'], ',.0f')} rec/s, all in output after {r['all_in_output_s']:.1f} s, "
                      f"{r['duplicates']} duplicate(s)", flush=True)
    print_table(rows, args)
    load = os.getloadavg()
    print(f"load average at the end {', '.join(f'{v:.2f}' for v in load)}")
    if not args.keep:
        import shutil
        shutil.rmtree(base, ignore_errors=True)
    report = {"date": head["started"].isoformat(timespec="seconds"), "machine": head["machine"],
              "versions": head["versions"], "kdaemon_source": head["source"],
              "command": command_line("bench/share/scaling.py", argv), "records": args.records,
              "cpu_us": args.cpu_us, "wait_us": args.wait_us, "rows": rows, "loadavg_at_end": load,
              "kdaemon_source_after": check_sources(head["source"])}
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
