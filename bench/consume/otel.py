"""What the otel plugin costs a worker per record: the worker's record stages with and without
it, side by side in one run.

Run from the repository root::

    python bench/consume/otel.py [--records N] [--batch N] [--repeats R] [--rows NAME ...] [--json PATH]

Each row is a fresh child process that builds a worker's parts from a configuration exactly as a
worker does (``kdaemon.config.parse``, the real ``PluginManager`` with its allowlist,
``kdaemon_configure``, ``build_pipeline_parts``) and runs ``--records`` records (default 50,000)
of bench/consume's workload (testkit/workload.py: ~200-byte JSON values, a key, two headers),
each also carrying a W3C ``traceparent``, through the stages the worker runs per poll:
``Pipeline.deserialize`` (the ``json`` value and ``str`` key deserializers), ``Pipeline.intercept``,
the sink's ``write`` (the ``null`` sink, wrapped by the plugin when it is on) in polls of
``--batch`` records (default 500, the consumer's ``max_poll_records``), a flush and a commit
(``Pipeline.on_commit``, the settle spans' source) every 20 polls.  No broker: the Kafka client's
own cost is the same in every row and is measured by bench/consume and bench/daemon.

The spans go out for real: the SDK's ``BatchSpanProcessor`` and OTLP/HTTP exporter, to
testkit's OTLP receiver running in this (the parent) process, so the child's CPU includes
encoding and sending every span but not decoding them.  The child ends by closing the sink
(the drain's flush: every span exported), and the receiver's count must equal the spans the row
should make (a row that lost spans is reported as FAILED).  ``OTEL_BSP_MAX_QUEUE_SIZE`` is set
above the records so the SDK's queue (2,048 by default, dropping what does not fit) keeps every
span: the figures are the cost of exporting them all.

Rows:

* ``off``: ``plugins = ["json"]``: the plugin not enabled (never imported);
* ``record``: ``[otel] spans = "record"``, every producer span sampled (traceparent flags 01):
  a ``process`` span per record, a child of the producer's;
* ``batch``: ``spans = "batch"`` (the default): a span per partition and poll, a link per record;
* ``record-unsampled``, ``batch-unsampled``: every producer span not sampled (flags 00): the
  context is read, no record span is made and no link (the default sampler is parent-based),
  the batch spans (new traces) still are;
* ``batch-no-context``: records without trace headers (producers that do not trace), the
  default mode and sampler.

Every otel row has the ``otel`` interceptor (a settle span per partition and commit); the
sampler is the SDK's default, ``parentbased_always_on``.

Figures per row (best of ``--repeats``, interleaved): records/s over the timed loop (wall), CPU
µs per record (the child's user+system CPU over the loop and the final flush, every thread),
its ratio to ``off``, and the spans received; apart, the time to build the worker's parts
(plugins, deserializers, the sink, and with it the SDK and its exporter), once per worker start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):
    sys.path.insert(0, str(REPO_ROOT))

ROWS = ("off", "record", "batch", "record-unsampled", "batch-unsampled", "batch-no-context")
COMMIT_EVERY = 20   # polls


def child(row: str, records: int, batch: int, endpoint: str) -> dict:
    """One row, in this process; returns its figures."""
    import resource
    import tempfile

    sys.path.insert(0, str(REPO_ROOT / "plugins"))
    from bench.peers import rss_mb
    from kdaemon.client.types import OffsetAndMetadata, TopicPartition
    from kdaemon.config import parse
    from kdaemon.protocol.record_loop import ConsumerRecord
    from kdaemon.worker.build import build_pipeline_parts
    from kdaemon.worker.main import load_plugins
    from kdaemon.worker.stages import Pipeline
    from testkit.workload import PARTITIONS, iter_records

    raw = {"plugins": ["json"], "kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "bench-otel"},
           "daemon": {"topics": ["bench"], "state_dir": tempfile.mkdtemp(prefix="kdaemon-bench-otel-")},
           "deserializer": {"key": "str", "value": "json"}, "sink": {"type": "null"}}
    if row != "off":
        raw["plugins"].append("kdaemon_otel:")
        raw["interceptors"] = [{"name": "otel"}]
        raw["otel"] = {"endpoint": endpoint, "spans": row.split("-")[0]}
    config = parse(raw, "bench.toml")
    started = time.perf_counter()
    parts = build_pipeline_parts(config, load_plugins(config))   # the SDK starts with the sink
    start_s = time.perf_counter() - started
    pipeline = Pipeline(config, parts)
    flags = "00" if row.endswith("-unsampled") else "01"
    polls = []
    current = []
    for i, partition, key, value, headers in iter_records(records):
        if not row.endswith("-no-context"):
            headers = headers + [("traceparent", f"00-{i + 1:032x}-{i + 1:016x}-{flags}".encode())]
        current.append(ConsumerRecord("bench", partition, i // PARTITIONS, 1_700_000_000_000 + i, 0, key, value,
                                      headers, 0))
        if len(current) == batch:
            polls.append(current)
            current = []
    if current:
        polls.append(current)
    sink = parts.sink

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    ends: dict = {}
    wall0, cpu0 = time.perf_counter(), cpu()
    for n, poll in enumerate(polls, 1):
        out, dead = pipeline.deserialize(poll)
        out = pipeline.intercept(out)
        sink.write(out)
        for r in poll:
            ends[TopicPartition(r.topic, r.partition)] = r.offset + 1
        if n % COMMIT_EVERY == 0 or n == len(polls):
            sink.flush()
            pipeline.on_commit({tp: OffsetAndMetadata(o) for tp, o in ends.items()})
    loop_s = time.perf_counter() - wall0
    sink.close()   # the drain: exports every span still queued
    commits = (len(polls) + COMMIT_EVERY - 1) // COMMIT_EVERY
    # The spans this row must export: a process span per record (record mode) or per partition
    # and poll, cut at 128 links (batch); a settle span per partition and commit, unless the
    # sampler drops new traces (no-context's sampling = 0).
    batch_spans = sum(-(-sum(1 for r in poll if r.partition == p) // 128) for poll in polls for p in range(PARTITIONS))
    process = {"record": records, "record-unsampled": 0}.get(row, 0 if row == "off" else batch_spans)
    settle = 0 if row == "off" else commits * PARTITIONS
    return {"row": row, "records": records, "loop_s": loop_s, "records_per_s": records / loop_s,
            "cpu_s": cpu() - cpu0, "wall_s": time.perf_counter() - wall0, "rss_peak_mb": rss_mb(),
            "start_s": start_s, "expected_spans": process + settle}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.records, args.batch, args.endpoint)))
        return 0

    from testkit.otlp_receiver import OtlpReceiver
    from testkit.report import banner, command_line, write_json
    info = banner("bench/consume/otel.py", accelerated=True)
    print(f"{args.records:,} records in polls of {args.batch}, a commit every {COMMIT_EVERY} polls; "
          f"best of {args.repeats}")
    env = {**os.environ, "OTEL_BSP_MAX_QUEUE_SIZE": str(args.records * 2 + 10_000),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "plugins")])}
    runs: dict[str, list[dict]] = {row: [] for row in args.rows}
    with OtlpReceiver() as otlp:
        for rep in range(args.repeats):
            for row in args.rows:
                before = len(otlp.snapshot())
                done = subprocess.run([sys.executable, __file__, "--child", row, "--records", str(args.records),
                                       "--batch", str(args.batch), "--endpoint", otlp.endpoint],
                                      env=env, capture_output=True, text=True)
                if done.returncode != 0:
                    print(f"  [{rep + 1}] {row:<17} FAILED: {done.stderr[-500:]}")
                    runs[row].append({"row": row, "error": done.stderr[-2000:]})
                    continue
                r = json.loads(done.stdout.strip().splitlines()[-1])
                r["spans"] = len(otlp.snapshot()) - before
                want = r["expected_spans"]
                if r["spans"] != want:
                    r["error"] = f"{r['spans']:,} spans received, {want:,} expected"
                print(f"  [{rep + 1}] {row:<17} {r['records_per_s']:>10,.0f} rec/s  cpu {r['cpu_s']:6.2f} s  "
                      f"{r['cpu_s'] / r['records'] * 1e6:6.2f} µs/record  spans {r['spans']:,}  start {r['start_s']:.2f} s"
                      + (f"  FAILED: {r['error']}" if "error" in r else ""), flush=True)
                runs[row].append(r)

    def best(row: str) -> dict | None:
        ok = [r for r in runs.get(row, []) if "error" not in r]
        return min(ok, key=lambda r: r["cpu_s"]) if ok else None

    base = best("off")
    print()
    head = f"{'row':<17} {'records/s':>10} {'vs off':>7} {'CPU µs/rec':>11} {'vs off':>7} {'+µs/rec':>8} {'spans':>9} {'start s':>8}"
    print(head)
    print("-" * len(head))
    rows = []
    for row in args.rows:
        r = best(row)
        if r is None:
            print(f"{row:<17} FAILED")
            continue
        us = r["cpu_s"] / r["records"] * 1e6
        base_us = base["cpu_s"] / base["records"] * 1e6 if base else None
        rate_vs = r["records_per_s"] / base["records_per_s"] if base else None
        print(f"{row:<17} {r['records_per_s']:>10,.0f} {rate_vs or 0:>6.2f}x {us:>11.2f} "
              f"{us / base_us if base_us else 0:>6.2f}x {us - base_us if base_us else 0:>8.2f} {r['spans']:>9,} {r['start_s']:>8.2f}")
        rows.append({**r, "cpu_us_per_record": us, "rate_vs_off": rate_vs,
                     "cpu_vs_off": us / base_us if base_us else None})
    print("records/s: the timed loop's wall clock; CPU: the child's, every thread, loop + final flush "
          "(best of the repeats by CPU)")
    write_json(args.json, {**info, "command": command_line("bench/consume/otel.py", argv), "rows": rows,
                           "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
