"""One worker end to end: kdaemon's pipeline beside confluent-kafka, kafka-python and aiokafka
doing the same work by hand.

Run from the repository root::

    python bench/consume/pipeline.py [--records N] [--repeats R] [--flush-ms MS] [--poll-records N] [--json PATH]

``--records`` must be a multiple of 20 (default 1,000,000); ``--clients kdaemon aiokafka ...``
and ``--modes filter ...`` run a subset.

Input: the records of bench/consume (testkit/workload.py's generator and producer): a Tansu
broker on a free loopback port (``testkit/common.py``), one topic of 4 partitions written by
confluent-kafka with lz4 and large batches, each record a ~200-byte JSON value, a key and two headers, ``type`` (one
of ten values, exactly a tenth each) and ``trace``.  Every client stops when it has counted the
records the delivery reports gave for each partition, never on Tansu's high watermark.

Two modes, the same work for every client:

* filter: keep the records whose ``type`` header is ``order.shipped`` (10%), ``json.loads``
  their value, and write each as one JSON line (kdaemon's jsonl format: topic, partition,
  offset, timestamp, timestamp type, key as text, the decoded value, headers as base64) to a
  file; every ``--flush-ms`` (default 1000, kdaemon's flush_interval_ms) the file is flushed and
  fsync'ed, and once more at the end.
* json: ``json.loads`` every value and discard the result.

kdaemon is its real pipeline, built from a configuration exactly as ``kdaemon run --in-process``
builds it (``kdaemon.worker.main.make_worker``): ``assignment = "static"`` (the four partitions
assigned, no group join, like the peers' ``assign``), the offsets committed to a group after
every flush (work the peers do not do), filter mode with a ``[[filters]]`` rule (``HeaderRules``,
evaluated in the C record loop), the ``json`` value and ``str`` key deserializers and the
``jsonl`` sink (fsync on); json mode without a filter and with the ``null`` sink.  Its flushes are
made to follow the clock only (``flush_max_records`` and ``max_buffered_records`` set out of
reach), the cadence the peers use.  The peers assign all four partitions from offset 0, poll,
filter by header in Python (testkit/workload.py's predicate), ``json.loads``, build each line
with one shared ``json.JSONEncoder`` and write it through a buffered file.  Everyone polls
``--poll-records`` (default 10,000) records per call with the same fetch sizes (1 MiB per
partition, 50 MiB per request); otherwise each keeps its defaults.  Two diagnostic rows,
kdaemon with ``fetch_max_wait_ms=10`` and confluent-kafka with ``fetch.queue.backoff.ms=10``,
show the clients without their fetch pauses (see "Consuming" in docs/PERFORMANCE.md).

Checks, outside the timing: every filter-mode run reads its output back; the lines must number
exactly the target records, their ``id``s must add up to the producer's sum, and the sorted lines
must hash the same for every client (so everyone wrote the same bytes).  A json-mode run must
have decoded every record.  A run that fails a check is reported as FAILED.

Timing ("steady state", as in bench/consume): the clock starts when the first poll that
returned records has been processed and stops when the last expected record has been processed
and the final flush + fsync returned; the records of the first poll are not counted.  Each
client runs in a fresh child process (peak RSS is its own ``VmHWM``); repeats are interleaved
and the best is shown.
"""

from __future__ import annotations

# Only the standard library at module level (and bench.peers, testkit.workload and testkit.report,
# which are stdlib-only at module level too): a child imports nothing but its own client.
import binascii
import hashlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if __package__ in (None, ""):  # run as a script: `bench` and kdaemon from this tree
    sys.path.insert(0, str(REPO_ROOT))

from bench.peers import Tally, cpu_s, run_aiokafka, run_confluent, run_kafka_python  # noqa: E402
from testkit.report import (  # noqa: E402
    arguments, banner, best, check_sources, command_line, parse, rate_ratio, table, times, write_json)
from testkit.workload import (  # noqa: E402
    FETCH_MAX_BYTES, MAX_PARTITION_FETCH_BYTES, PARTITIONS, RECORDS_UNIT, TARGET, TOPIC, produce,
    type_is_target)

CHILD_TIMEOUT_S = 900
MODES = ("filter", "json")
CREATE_TIME = 0  # the Kafka wire value kdaemon writes; confluent-kafka numbers it 1


# -- the peers' work, shared ----------------------------------------------------------------------

class LineFile:
    """What the peers do instead of a sink: JSON lines through a buffered file, fsync'ed on a
    clock.  The line is kdaemon's jsonl format (kdaemon.sinks.encoding.record_to_json)."""

    def __init__(self, path: Path, flush_s: float) -> None:
        self.f = open(path, "wb", buffering=256 * 1024)   # the jsonl sink's buffer size
        self.flush_s = flush_s
        self.last = time.monotonic()
        self.encode = json.JSONEncoder(separators=(",", ":")).encode
        self.b2a = binascii.b2a_base64

    def line(self, topic, partition, offset, timestamp, timestamp_type, key, value, headers) -> str:
        b2a = self.b2a
        return self.encode({"topic": topic, "partition": partition, "offset": offset,
                            "timestamp": timestamp, "timestamp_type": timestamp_type,
                            "key": None if key is None else key.decode("utf-8"), "value": value,
                            "headers": [(k, None if v is None else {"base64": b2a(v, newline=False).decode("ascii")})
                                        for k, v in headers]})

    def write(self, lines: list[str]) -> None:
        if lines:
            lines.append("")
            self.f.write("\n".join(lines).encode("ascii"))

    def maybe_sync(self) -> None:
        if time.monotonic() - self.last >= self.flush_s:
            self.sync()

    def sync(self) -> None:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.last = time.monotonic()

    def close(self) -> None:
        self.sync()
        self.f.close()


def read_back(directory: Path, pattern: str) -> dict:
    """Line count, sum of the values' ``id`` and a hash of the sorted lines of the output files."""
    lines: list[bytes] = []
    for path in sorted(directory.glob(pattern)):
        lines += path.read_bytes().splitlines()
    lines.sort()
    h = hashlib.sha256()
    check = 0
    for line in lines:
        h.update(line + b"\n")
        check += json.loads(line)["value"]["id"]
    return {"kept": len(lines), "check": check, "out_sha256": h.hexdigest()[:16]}


# -- workers (child processes) --------------------------------------------------------------------

def worker_kdaemon(spec: dict, tally: Tally, out: Path) -> dict:
    from kdaemon.config import parse
    from kdaemon.protocol import records as krecords
    from kdaemon.worker.main import make_worker

    mode = spec["mode"]
    kafka = {"bootstrap_servers": spec["bootstrap"], "group_id": f"bench-pipeline-{uuid.uuid4().hex[:8]}",
             "auto_offset_reset": "earliest", "max_poll_records": spec["poll_records"],
             "fetch_max_bytes": FETCH_MAX_BYTES, "max_partition_fetch_bytes": MAX_PARTITION_FETCH_BYTES}
    if spec.get("variant") == "wait10":
        kafka["fetch_max_wait_ms"] = 10
    raw = {
        "plugins": ["json"],
        "kafka": kafka,
        "daemon": {"topics": [spec["topic"]], "assignment": "static", "state_dir": str(out / "state"),
                   "flush_interval_ms": spec["flush_ms"], "flush_max_records": 1 << 40,
                   "max_buffered_records": 1 << 40, "on_deserialize_error": "stop", "on_sink_error": "stop",
                   "log_level": "WARNING"},
        "deserializer": {"key": "str", "value": "json"},
        "sink": {"type": "jsonl", "path": str(out / "sink"), "fsync": True} if mode == "filter" else {"type": "null"},
    }
    if mode == "filter":
        raw["filters"] = [{"header": "type", "op": "equals", "value": TARGET.decode(), "action": "keep"}]
    config = parse(raw, "<bench/consume/pipeline.py>")
    counts = [0] * PARTITIONS

    def on_tick(worker) -> None:  # after every step of the worker's loop
        positions = worker.consumer.positions()
        for tp, pos in positions.items():
            if pos > counts[tp.partition]:
                tally.add(tp.partition, pos - counts[tp.partition])
                counts[tp.partition] = pos
        if tally.done():
            tally.finish(worker.flush_and_commit)
            worker.request_stop()

    worker = make_worker(config, on_tick=on_tick)
    tally.start()
    code = worker.run()
    if code:
        raise RuntimeError(f"the worker stopped with exit code {code}")
    stats = worker.stats
    extra = {"accelerated": krecords.ACCELERATED, "flushes": stats.flushes, "commits": stats.commits,
             "commit_failures": stats.commit_failures}
    result = tally.result(**extra)
    if mode == "filter":
        result.update(read_back(out / "sink", "*.jsonl"))
    else:
        result["kept"] = result["check"] = sum(stats.delivered.values())
    return result


def _peer_run(spec: dict, tally: Tally, out: Path, loop, work) -> dict:
    """One peer's run through its loop in bench/peers.py: JSON lines through a ``LineFile``,
    fsync'ed on the clock after a poll and once more at the end (inside the clock), read back
    afterwards (filter mode); ``json.loads`` of every value (json mode)."""
    if spec["mode"] != "filter":
        return loop(work(None))
    sink = LineFile(out / "out.jsonl", spec["flush_ms"] / 1000)
    result = loop(work(sink), after_poll=sink.maybe_sync, final=sink.close)
    result.update(read_back(out, "*.jsonl"))
    return result


def _message_work(sink):
    """work(messages, counts) -> (records, lines written) for confluent-kafka's Messages."""
    from confluent_kafka import KafkaException

    loads, pred = json.loads, type_is_target
    if sink is None:
        def work(msgs, counts) -> tuple[int, int]:
            for m in msgs:
                if m.error():
                    raise KafkaException(m.error())
                counts[m.partition()] += 1
                loads(m.value())
            return len(msgs), len(msgs)
        return work
    line = sink.line

    def work(msgs, counts) -> tuple[int, int]:
        lines = []
        for m in msgs:
            if m.error():
                raise KafkaException(m.error())
            counts[m.partition()] += 1
            headers = m.headers()
            if pred(headers):
                ts_type, ts = m.timestamp()
                lines.append(line(m.topic(), m.partition(), m.offset(), ts, CREATE_TIME if ts_type == 1 else ts_type,
                                  m.key(), loads(m.value()), headers))
        sink.write(lines)
        return 0, len(lines)
    return work


def _attr_work(sink):
    """work(records) -> (records, lines written) for clients whose records have .topic/.partition/... attributes."""
    loads, pred = json.loads, type_is_target
    if sink is None:
        def work(recs) -> tuple[int, int]:
            for r in recs:
                loads(r.value)
            return len(recs), len(recs)
        return work
    line = sink.line

    def work(recs) -> tuple[int, int]:
        lines = [line(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key,
                      loads(r.value), r.headers) for r in recs if pred(r.headers)]
        sink.write(lines)
        return 0, len(lines)
    return work


def worker_confluent(spec: dict, tally: Tally, out: Path) -> dict:
    def loop(work, **kw):
        return run_confluent(spec, tally, work, group="bench-pipeline", **kw)
    return _peer_run(spec, tally, out, loop, _message_work)


def worker_kafka_python(spec: dict, tally: Tally, out: Path) -> dict:
    return _peer_run(spec, tally, out, lambda work, **kw: run_kafka_python(spec, tally, work, **kw), _attr_work)


def worker_aiokafka(spec: dict, tally: Tally, out: Path) -> dict:
    # after_poll is a blocking fsync in the event loop, as a simple consumer would do it.
    return _peer_run(spec, tally, out, lambda work, **kw: run_aiokafka(spec, tally, work, **kw), _attr_work)


WORKERS = {"kdaemon": worker_kdaemon, "confluent": worker_confluent,
           "kafka-python": worker_kafka_python, "aiokafka": worker_aiokafka}


def run_worker(spec: dict) -> dict:
    tally = Tally(spec["expected"], spec["max_seconds"])
    with tempfile.TemporaryDirectory(prefix="kdaemon-bench-pipeline-", dir=spec.get("out_dir")) as tmp:
        result = WORKERS[spec["client"]](spec, tally, Path(tmp))
    result["cpu_s_total"] = cpu_s()
    return result


def run_child(spec: dict) -> dict:
    from testkit import common as _common
    return _common.run_child(__file__, "--worker", spec, CHILD_TIMEOUT_S)


# -- the parent ---------------------------------------------------------------------------------

# (run id, client, variant, label)
RUNS = (
    ("kdaemon", "kdaemon", None, "kdaemon Worker"),
    ("confluent", "confluent", None, "confluent-kafka"),
    ("kafka-python", "kafka-python", None, "kafka-python"),
    ("aiokafka", "aiokafka", None, "aiokafka"),
    ("kdaemon-wait10", "kdaemon", "wait10", "diagnostic: kdaemon Worker, fetch_max_wait_ms=10"),
    ("confluent-b10", "confluent", "backoff10", "diagnostic: confluent-kafka, fetch.queue.backoff.ms=10"),
)
WORK = {"filter": "filter 10% by header, json.loads kept, JSON lines + fsync",
        "json": "json.loads every value, discard"}


def check(r: dict, spec: dict, produced: dict) -> str | None:
    if r.get("capped"):
        return None
    n = sum(produced["expected"])
    if spec["mode"] == "json":
        return None if r["kept"] == n else f"decoded {r['kept']} of {n} records"
    want_kept, want_check = produced["kept"]["filter"], produced["check"]["filter"]
    if r["kept"] != want_kept or r["check"] != want_check:
        return f"wrote {r['kept']} lines with id sum {r['check']}, want {want_kept} / {want_check}"
    return None


def pipeline_benchmark(args, tmpdir: Path) -> dict:
    from testkit import common as _common

    with _common.TansuBroker(tmpdir / "tansu.log") as broker:
        print(f"Tansu on {broker.bootstrap} (pid {broker.pid})", flush=True)
        print(f"producing {args.records:,} records with confluent-kafka (lz4)...", flush=True)
        produced = produce(broker.bootstrap, args.records)
        print(f"  {produced['seconds']:.1f} s; per partition {produced['expected']}", flush=True)
        specs = []
        for run_id, client, variant, label in RUNS:
            if args.clients and run_id not in args.clients and client not in args.clients:
                continue
            for mode in args.modes:
                specs.append({"run": run_id, "client": client, "variant": variant, "label": label, "mode": mode,
                              "bootstrap": broker.bootstrap, "topic": TOPIC, "expected": produced["expected"],
                              "poll_records": args.poll_records, "flush_ms": args.flush_ms,
                              "max_seconds": args.max_seconds, "out_dir": str(tmpdir)})
        results: dict[tuple[str, str], list[dict]] = {}
        for rep in range(args.repeats):
            for spec in specs:
                print(f"  [{rep + 1}/{args.repeats}] {spec['label']:<56} {spec['mode']:<6} ", end="", flush=True)
                r = run_child(spec)
                if "error" not in r:
                    problem = check(r, spec, produced)
                    if problem:
                        r["error"] = f"wrong result: {problem}"
                results.setdefault((spec["run"], spec["mode"]), []).append(r)
                if "error" in r:
                    print(f"FAILED: {r['error'][:300]}", flush=True)
                else:
                    print(f"{r['records_per_s'] or 0:>11,.0f} rec/s steady  {r['rate_incl_setup']:>11,.0f} incl. setup  "
                          f"cpu {r['cpu_s']:6.2f} s  rss {r['rss_peak_mb']:5.1f} MB"
                          f"{'  out ' + r['out_sha256'] if 'out_sha256' in r else ''}"
                          f"{'  CAPPED' if r['capped'] else ''}", flush=True)
    # Everyone must have written the same lines.
    hashes = {r["out_sha256"] for (run, mode), rs in results.items() if mode == "filter"
              for r in rs if "error" not in r}
    if len(hashes) > 1:
        for (run, mode), rs in results.items():
            for r in rs:
                if mode == "filter" and "error" not in r:
                    print(f"  output of {run}: sorted-lines sha256 {r['out_sha256']}")
        raise SystemExit("the clients wrote different lines in filter mode; the comparison is not fair")
    return {"produced": produced, "results": results, "out_sha256": hashes.pop() if hashes else None}


def build_table(results: dict, modes) -> list[dict]:
    rows = []
    base = {(client, m): best(results.get((client, m), [])) for client in ("kafka-python", "aiokafka", "confluent")
            for m in modes}

    for mode in modes:
        for run_id, _, _, label in RUNS:
            runs = results.get((run_id, mode))
            if not runs:
                continue
            r = best(runs)
            row = {"run": run_id, "label": label, "mode": mode, "repeats": len(runs)}
            if r is None:
                row["error"] = runs[-1]["error"]
            else:
                ok = [x for x in runs if "error" not in x]
                row.update({
                    "records_per_s": r["records_per_s"], "rate_incl_setup": r["rate_incl_setup"],
                    "all_records_per_s": [x["records_per_s"] for x in ok],
                    "steady_seconds": r["steady_seconds"], "steady_cpu_s": r["steady_cpu_s"],
                    "cpu_wall": r["steady_cpu_s"] / r["steady_seconds"] if r["steady_seconds"] else None,
                    "rss_peak_mb": max(x["rss_peak_mb"] for x in ok), "capped": r["capped"],
                    "vs_kafka_python": rate_ratio(r, base[("kafka-python", mode)]),
                    "vs_aiokafka": rate_ratio(r, base[("aiokafka", mode)]),
                    "vs_confluent": rate_ratio(r, base[("confluent", mode)]),
                })
                for k in ("flushes", "commits", "commit_failures"):
                    if k in r:
                        row[k] = r[k]
            rows.append(row)
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'client':<56} {'mode':<6} {'records/s':>10} {'vs k-p':>7} {'vs aio':>7} {'vs ckf':>7} "
            f"{'cpu/wall':>8} {'RSS MB':>7}")
    for r in table(head, rows, 56):
        rate = "-" if r["records_per_s"] is None else f"{r['records_per_s']:,.0f}"
        load = "-" if r["cpu_wall"] is None else f"{r['cpu_wall']:.0%}"
        print(f"{r['label']:<56} {r['mode']:<6} {rate:>10} {times(r['vs_kafka_python']):>7} "
              f"{times(r['vs_aiokafka']):>7} {times(r['vs_confluent']):>7} {load:>8} {r['rss_peak_mb']:>7.1f}"
              f"{'  CAPPED' if r['capped'] else ''}")
    print("-" * len(head))
    for mode, text in WORK.items():
        print(f"{mode}: {text}")
    print("records/s: steady state (records consumed, filtered ones included), best of the repeats; "
          "vs k-p / aio / ckf: this rate over kafka-python's / aiokafka's / confluent-kafka's default row "
          "in the same mode; cpu/wall: the child's CPU over the steady window; RSS: peak VmHWM")


def markdown_table(rows: list[dict]) -> str:
    out = ["| client | mode | records/s (best) | all runs | × kafka-python | × aiokafka | × confluent-kafka "
           "| CPU / wall | peak RSS MB |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['label']} | {r['mode']} | FAILED | | | | | | |")
            continue
        runs = ", ".join(f"{v:,.0f}" for v in r["all_records_per_s"] if v is not None)
        load = "-" if r["cpu_wall"] is None else f"{r['cpu_wall']:.0%}"
        label = r["label"].replace("diagnostic: ", "*diagnostic:* ")
        out.append(f"| {label} | {r['mode']} | {r['records_per_s']:,.0f} | {runs} | {times(r['vs_kafka_python'])} "
                   f"| {times(r['vs_aiokafka'])} | {times(r['vs_confluent'])} | {load} | {r['rss_peak_mb']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(
        __doc__, records=True, repeats=(1, "runs per client and mode; the best is shown"),
        poll_records="max records per poll/consume/getmany call, every client (default 10,000)",
        max_seconds="stop a client after this long and report it as CAPPED (default 300)",
        clients="only these run ids or clients (default all)", modes=MODES)
    parser.add_argument("--flush-ms", type=int, default=1000,
                        help="flush + fsync cadence, every client (default 1000, kdaemon's flush_interval_ms)")
    args = parse(parser, argv, {"--worker": lambda spec: run_worker(json.loads(spec))}, RECORDS_UNIT)
    if args is None:
        return 0

    from kdaemon.protocol import records as krecords

    head = banner("bench/consume/pipeline.py", accelerated=krecords.ACCELERATED, require_accelerated=True)
    source = head["source"]
    print(f"poll size {args.poll_records:,} records; flush + fsync every {args.flush_ms} ms; fetch sizes "
          f"{MAX_PARTITION_FETCH_BYTES >> 20} MiB per partition, {FETCH_MAX_BYTES >> 20} MiB per request")
    with tempfile.TemporaryDirectory(prefix="kdaemon-bench-pipeline-") as tmpdir:
        bench = pipeline_benchmark(args, Path(tmpdir))
    rows = build_table(bench["results"], args.modes)
    print_table(rows)
    if bench["out_sha256"]:
        print(f"filter mode: every client wrote the same {bench['produced']['kept']['filter']:,} lines "
              f"(sorted-lines sha256 {bench['out_sha256']})")
    print()
    print(markdown_table(rows))
    after = check_sources(source)
    if args.json:
        write_json(args.json, {
            "date": head["started"].isoformat(timespec="seconds"), "command": command_line("bench/consume/pipeline.py", argv),
            "machine": head["machine"], "versions": head["versions"], "kdaemon_source": source,
            "kdaemon_source_after": after, "accelerated": krecords.ACCELERATED, "produced": bench["produced"],
            "rows": rows, "out_sha256": bench["out_sha256"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
