"""Record decoding: kdaemon's filter-first decoder beside kafka-python's and aiokafka's.

Run from the repository root::

    python bench/consume/decode.py [--synthetic] [--repeats N] [--min-time S] [--json results.json]

The input is ONE RecordBatch v2 of 1,000 lz4-compressed records, each a ~200-byte JSON value
with two headers: ``type`` (one of ten values, exactly 100 records each, shuffled) and
``trace`` (a 32-hex-digit id).  By default the bytes are written by a real producer:
confluent-kafka (librdkafka) produces to a Tansu broker started on a free loopback port, and
the record set is fetched back with kdaemon's own protocol layer (``KafkaConnection`` + the
Fetch spec).  ``--synthetic``, or no Tansu binary, uses ``kdaemon.protocol.builder.build_batch``
with the same records instead; the output says which.

Every decoder gets the same bytes and does the same job per batch: check the CRC-32C (all
three clients do by default), decompress, and produce offset, timestamp, key, value and headers
for every record it keeps.  Two modes:

* keep-all: no filter.
* filter: keep the records whose ``type`` header equals one value (10%).  kdaemon filters
  before key and value are sliced, with a Python callable and with a ``HeaderRules`` rule (which
  the C loop evaluates natively; without the C loop it is an ordinary Python callable).  The
  peers have no filter-first path, so the same Python callable is applied to each decoded
  record's headers while iterating.

kdaemon's pure-Python decoder runs in a child process started with ``KDAEMON_PURE_PYTHON=1``,
the documented switch, so it is measured exactly as a user without the C loop would get it.

Timing: one "run" decodes the whole batch once.  Each measurement is repeated ``--repeats``
times, each repeat looping for at least ``--min-time`` seconds; the figure is the best (min)
repeat divided by 1,000 records.  Repeats are interleaved across decoders so a noisy moment
hurts all of them alike.  As in ``timeit``, the garbage collector is off while timing.
Nothing here asserts a timing; the goals are printed as met / not met.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from testkit import common as _common  # noqa: E402
from testkit.report import banner  # noqa: E402
from testkit.workload import SEED, TARGET, iter_records, type_is_target  # noqa: E402
from kdaemon.protocol import compression, records  # noqa: E402
from kdaemon.protocol.builder import RecordSpec, build_batch  # noqa: E402
from kdaemon.protocol.header_match import HeaderRule, HeaderRules  # noqa: E402

N_RECORDS = 1000
TOPIC = "bench-decode"

GOAL_SPEEDUP = 3.0          # ours at least 3x faster than kafka-python
GOAL_DROPPED_RATIO = 0.60   # a dropped record costs at most 60% of a kept one

_BATCH_CODEC = struct.Struct(">h")  # attributes at byte 21; bits 0-2 are the codec


# -- input -------------------------------------------------------------------------------------

def make_records(n: int = N_RECORDS, seed: int = SEED) -> list[tuple[bytes, bytes, list]]:
    """(key, value, headers) for n records: the consuming benchmarks' records (testkit/workload.py),
    ~200-byte JSON values, exactly n/10 of each type."""
    return [(key, value, headers) for _, _, key, value, headers in iter_records(n, seed)]


def synthetic_batch(recs) -> bytes:
    specs = [RecordSpec(key=k, value=v, headers=list(h), timestamp_delta=i)
             for i, (k, v, h) in enumerate(recs)]
    return build_batch(specs, codec=compression.LZ4)


def produced_batch(recs, log_dir: Path) -> tuple[bytes, dict]:
    """Produce recs with confluent-kafka to a fresh Tansu, fetch the record set back with kdaemon."""
    from kdaemon.protocol.apis.fetch import FETCH
    from kdaemon.protocol.versions import choose_version

    with _common.TansuBroker(log_dir / "tansu.log") as broker:
        _produce(broker.bootstrap, recs)
        # v13+ names topics by id; v12 is the newest that still takes a name, and Tansu offers it.
        version = min(choose_version(FETCH, broker.offered), 12)
        body = {"max_wait_ms": 500, "min_bytes": 1, "max_bytes": 64 << 20, "topics": [
            {"topic": TOPIC, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 64 << 20}]}]}
        resp = _common.request(broker.host, broker.port, FETCH, version, body)
        info = {"broker": "tansu", "broker_pid": broker.pid, "fetch_version": version}
    if resp.body["error_code"]:
        raise RuntimeError(f"Fetch failed with error code {resp.body['error_code']}")
    part = resp.body["responses"][0]["partitions"][0]
    if part["error_code"] or part["records"] is None:
        raise RuntimeError(f"Fetch of {TOPIC}[0] failed: error code {part['error_code']}")
    return bytes(part["records"]), info


def _produce(bootstrap: str, recs) -> None:
    # Imported here: --synthetic must work without confluent-kafka.  The producer is local so it
    # is destroyed before the broker stops (no reconnect noise on stderr).
    from testkit.produce import Writer, create_topic

    create_topic(bootstrap, TOPIC)
    writer = Writer(bootstrap, TOPIC, "lz4", **{
        # Everything is queued before the first send, so it all goes out as one batch.
        "linger.ms": 10_000, "batch.size": 16 << 20, "batch.num.messages": N_RECORDS,
        "message.max.bytes": 32 << 20, "enable.idempotence": False})
    for key, value, headers in recs:
        writer.send(value, key, partition=0, headers=headers)
    writer.flush_checked(30)
    del writer


def describe_record_set(data: bytes) -> dict:
    batches, pos = [], 0
    while len(data) - pos >= records.BATCH_HEADER_SIZE:
        base, length = struct.unpack_from(">qi", data, pos)
        attributes = _BATCH_CODEC.unpack_from(data, pos + 21)[0]
        count = struct.unpack_from(">i", data, pos + 57)[0]
        batches.append({"base_offset": base, "bytes": 12 + length, "records": count,
                        "codec": compression.CODEC_NAMES.get(attributes & 7, "?"),
                        "log_append_time": bool(attributes & 8)})
        pos += 12 + length
    payload = compression.decompress(compression.LZ4, data[records.BATCH_HEADER_SIZE:]) \
        if len(batches) == 1 and batches[0]["codec"] == "lz4" else b""
    return {"bytes": len(data), "batches": batches, "uncompressed_payload_bytes": len(payload)}


# -- decoders ----------------------------------------------------------------------------------

HEADER_RULES = HeaderRules([HeaderRule("type", "equals", (TARGET,))], default=False)


def ours(data: bytes, header_filter) -> Callable[[], list]:
    reader_cls = records.RecordSetReader

    def run():
        return reader_cls(data, topic=TOPIC, partition=0, fetch_offset=0,
                          header_filter=header_filter).read_all()
    return run


def peer(batch_cls, data: bytes, predicate) -> Callable[[], list]:
    """kafka-python / aiokafka: one batch object, CRC check first (as their fetchers do)."""
    def run():
        batch = batch_cls(data)
        if not batch.validate_crc():
            raise RuntimeError(f"{batch_cls.__module__}.{batch_cls.__name__}: CRC mismatch")
        if predicate is None:
            return list(batch)
        return [r for r in batch if predicate(r.headers)]
    return run


def floor(data: bytes) -> Callable[[], bytes]:
    """CRC-32C + lz4 decompression alone: the per-batch work every decoder shares."""
    from crc32c import crc32c
    codec = _BATCH_CODEC.unpack_from(data, 21)[0] & 7
    body = data[records.BATCH_HEADER_SIZE:]
    tail = data[21:]

    def run():
        crc32c(tail)
        return compression.decompress(codec, body)
    return run


def predicate_alone(data: bytes) -> Callable[[], list]:
    """The Python callable by itself over the batch's already-decoded header lists."""
    header_lists = [r.headers for r in records.RecordSetReader(
        data, topic=TOPIC, partition=0, fetch_offset=0).read_all()]

    def run():
        return list(filter(type_is_target, header_lists))
    return run


def peer_decoders(data: bytes) -> dict[str, dict]:
    """Each importable peer: {name: {"label", "kind", "keep", "filter"}}; missing ones are skipped."""
    out = {}
    try:
        import kafka
        from kafka.record.default_records import DefaultRecordBatch as KafkaPythonBatch
        out["kafka-python"] = {
            "label": f"kafka-python {kafka.__version__}", "kind": "pure Python",
            "class": f"{KafkaPythonBatch.__module__}.{KafkaPythonBatch.__name__}",
            "keep": peer(KafkaPythonBatch, data, None),
            "filter": peer(KafkaPythonBatch, data, type_is_target)}
    except ImportError:
        pass
    try:
        import aiokafka
        from aiokafka.record import default_records as aio
        if aio.DefaultRecordBatch is not aio._DefaultRecordBatchPy:
            cls = aio.DefaultRecordBatch
            out["aiokafka-c"] = {
                "label": f"aiokafka {aiokafka.__version__}", "kind": "Cython _crecords",
                "class": f"{cls.__module__}.{cls.__name__}",
                "keep": peer(cls, data, None), "filter": peer(cls, data, type_is_target)}
        cls = aio._DefaultRecordBatchPy
        out["aiokafka-py"] = {
            "label": f"aiokafka {aiokafka.__version__}", "kind": "pure Python",
            "class": f"{cls.__module__}.{cls.__name__}",
            "keep": peer(cls, data, None), "filter": peer(cls, data, type_is_target)}
    except ImportError:
        pass
    return out


def our_decoders(data: bytes) -> dict[str, Callable]:
    return {"keep": ours(data, None), "callable": ours(data, type_is_target),
            "rules": ours(data, HEADER_RULES)}


# -- checking and timing -----------------------------------------------------------------------

def normalised(recs) -> list[tuple]:
    """(offset, timestamp, key, value, headers) as plain bytes, whatever the decoder's types."""
    def b(x):
        return None if x is None else bytes(x)
    return [(r.offset, r.timestamp, b(r.key), b(r.value), [(k, b(v)) for k, v in r.headers])
            for r in recs]


def digest(recs) -> str:
    return hashlib.sha256(repr(normalised(recs)).encode()).hexdigest()


def calibrate(fn: Callable, min_time: float) -> int:
    """Loops per repeat so one repeat lasts at least min_time (after a warm-up run)."""
    fn()
    number = 1
    while True:
        t = _loop(fn, number)
        if t >= min_time:
            return number
        number = max(number * 2, int(number * min_time / max(t, 1e-9) * 1.1) + 1)


def _loop(fn: Callable, number: int) -> float:
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            fn()
        return time.perf_counter() - start
    finally:
        if gc_was_enabled:
            gc.enable()


def measure_all(fns: dict[str, Callable], repeats: int, min_time: float) -> dict[str, dict]:
    """Best-of-``repeats`` seconds per run for every function, repeats interleaved."""
    numbers = {name: calibrate(fn, min_time) for name, fn in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            best[name] = min(best[name], _loop(fn, numbers[name]) / numbers[name])
    return {name: {"seconds_per_batch": best[name], "loops_per_repeat": numbers[name],
                   "repeats": repeats} for name in fns}


# -- the pure-Python child -----------------------------------------------------------------------

def run_worker(input_path: str, repeats: int, min_time: float) -> None:
    """Measure our three decoders in this process (started with KDAEMON_PURE_PYTHON=1)."""
    data = Path(input_path).read_bytes()
    fns = our_decoders(data)
    result = {"accelerated": records.ACCELERATED,
              "digests": {name: digest(fn()) for name, fn in fns.items()},
              "kept": {name: len(fn()) for name, fn in fns.items()},
              "timings": measure_all(fns, repeats, min_time) if not records.ACCELERATED else {}}
    json.dump(result, sys.stdout)


def pure_python_child(data: bytes, repeats: int, min_time: float, tmp: Path) -> dict:
    path = tmp / "batch.bin"
    path.write_bytes(data)
    env = dict(os.environ, KDAEMON_PURE_PYTHON="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", str(path),
           "--repeats", str(repeats), "--min-time", str(min_time)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise RuntimeError(f"pure-Python child failed ({proc.returncode}):\n{proc.stderr}")
    result = json.loads(proc.stdout)
    if result["accelerated"]:
        raise RuntimeError("KDAEMON_PURE_PYTHON=1 did not disable the C loop in the child")
    return result


# -- report ------------------------------------------------------------------------------------

def per_record_us(entry: dict) -> float:
    return entry["seconds_per_batch"] / N_RECORDS * 1e6


def dropped_ratio(t_keep: float, t_filter: float, kept_fraction: float) -> float:
    """Cost of a dropped record over a kept one, from per-record times of the two modes."""
    dropped = (t_filter - kept_fraction * t_keep) / (1 - kept_fraction)
    return dropped / t_keep


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--synthetic", action="store_true",
                        help="build the batch with kdaemon.protocol.builder instead of a producer")
    parser.add_argument("--repeats", type=int, default=9, help="best-of-N repeats (default 9)")
    parser.add_argument("--min-time", type=float, default=0.2,
                        help="seconds each repeat loops for at least (default 0.2)")
    parser.add_argument("--json", metavar="PATH", help="also write the results to PATH as JSON")
    parser.add_argument("--worker", metavar="BATCH_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        run_worker(args.worker, args.repeats, args.min_time)
        return 0

    recs = make_records()
    with tempfile.TemporaryDirectory(prefix="kdaemon-bench-") as tmpdir:
        tmp = Path(tmpdir)
        source: dict
        if args.synthetic:
            data, source = synthetic_batch(recs), {"kind": "synthetic", "why": "--synthetic"}
        else:
            try:
                data, info = produced_batch(recs, tmp)
                source = {"kind": "producer", "producer": _producer_version(), **info}
            except (_common.BrokerUnavailable, ImportError) as exc:
                data = synthetic_batch(recs)
                source = {"kind": "synthetic", "why": f"no broker: {exc}"}
        layout = describe_record_set(data)
        check_input(data, layout, recs)

        machine = banner("bench/consume/decode.py", accelerated=records.ACCELERATED)["machine"]
        print(f"Input: {_source_line(source)}")
        b = layout["batches"][0]
        print(f"       {len(layout['batches'])} batch, {b['records']} records, codec {b['codec']}, "
              f"{layout['bytes']:,} bytes on the wire, {layout['uncompressed_payload_bytes']:,} "
              f"bytes of records uncompressed; filter keeps type == {TARGET.decode()!r}")
        print(f"Timing: best of {args.repeats} repeats, each >= {args.min_time} s; GC off while timing")
        print("measuring...", flush=True)

        # Ours (C loop, in process), the peers, and the shared floor, interleaved.
        fns: dict[str, Callable] = {}
        for mode, fn in our_decoders(data).items():
            fns[f"ours-c/{mode}"] = fn
        peers = peer_decoders(data)
        for name, p in peers.items():
            fns[f"{name}/keep"] = p["keep"]
            fns[f"{name}/callable"] = p["filter"]
        fns["floor"] = floor(data)
        fns["predicate"] = predicate_alone(data)
        reference = digest(fns["ours-c/keep"]())
        reference_filtered = digest(fns["ours-c/callable"]())
        verify(fns, reference, reference_filtered)
        timings = measure_all(fns, args.repeats, args.min_time) if records.ACCELERATED else \
            measure_all({k: v for k, v in fns.items() if not k.startswith("ours-c/")},
                        args.repeats, args.min_time)
        child = pure_python_child(data, args.repeats, args.min_time, tmp)
        for mode, d in child["digests"].items():
            want = reference if mode == "keep" else reference_filtered
            if d != want:
                raise RuntimeError(f"pure-Python decoder ({mode}) disagrees with the C decoder")
        for mode, entry in child["timings"].items():
            timings[f"ours-py/{mode}"] = entry

    results = build_results(timings, peers, machine, source, layout, args)
    print_table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwrote {args.json}")
    return 0


def _producer_version() -> str:
    import confluent_kafka
    return f"confluent-kafka {confluent_kafka.__version__} (librdkafka {confluent_kafka.libversion()[0]})"


def _source_line(source: dict) -> str:
    if source["kind"] == "producer":
        return (f"written by {source['producer']} to Tansu, fetched back with kdaemon's "
                f"KafkaConnection + Fetch v{source['fetch_version']}")
    return f"SYNTHETIC (kdaemon.protocol.builder.build_batch, codec lz4): {source['why']}"


def check_input(data: bytes, layout: dict, recs) -> None:
    """The batch holds exactly our records, in order, as one lz4 batch."""
    if len(layout["batches"]) != 1 or layout["batches"][0]["records"] != N_RECORDS:
        raise RuntimeError(f"expected one batch of {N_RECORDS} records, got {layout['batches']}; "
                           "the producer split the batch")
    if layout["batches"][0]["codec"] != "lz4":
        raise RuntimeError(f"expected an lz4 batch, got {layout['batches'][0]['codec']}")
    decoded = records.RecordSetReader(data, topic=TOPIC, partition=0, fetch_offset=0).read_all()
    got = [(r.key, r.value, [(k, bytes(v)) for k, v in r.headers]) for r in decoded]
    if got != [(k, v, list(h)) for k, v, h in recs]:
        raise RuntimeError("the batch does not hold the records this benchmark produced")


def verify(fns: dict[str, Callable], reference: str, reference_filtered: str) -> None:
    """Every decoder yields the same records before any of them is timed."""
    for name, fn in fns.items():
        if name in ("floor", "predicate"):
            continue
        out = fn()
        want, n = (reference, N_RECORDS) if name.endswith("/keep") else (reference_filtered, N_RECORDS // 10)
        if len(out) != n or digest(out) != want:
            raise RuntimeError(f"{name} decoded {len(out)} records that differ from kdaemon's")


ROWS = (
    # (row id, decoder label, filter label, keep-all key, filter key)
    ("ours-c-callable", "kdaemon, C loop", "Python callable", "ours-c/keep", "ours-c/callable"),
    ("ours-c-rules", "kdaemon, C loop", "HeaderRules (native)", "ours-c/keep", "ours-c/rules"),
    ("ours-py-callable", "kdaemon, pure Python", "Python callable", "ours-py/keep", "ours-py/callable"),
    ("ours-py-rules", "kdaemon, pure Python", "HeaderRules (Python)", "ours-py/keep", "ours-py/rules"),
)


def build_results(timings: dict, peers: dict, machine: dict, source: dict, layout: dict, args) -> dict:
    rows = [r for r in ROWS if r[3] in timings]
    for name, p in peers.items():
        rows.append((name, f"{p['label']}, {p['kind']}", "callable per record",
                     f"{name}/keep", f"{name}/callable"))
    base = peers.get("kafka-python") and (per_record_us(timings["kafka-python/keep"]),
                                          per_record_us(timings["kafka-python/callable"]))
    kept_fraction = 0.1
    table = []
    for row_id, decoder, filt, keep_key, filter_key in rows:
        keep, filtered = per_record_us(timings[keep_key]), per_record_us(timings[filter_key])
        table.append({
            "id": row_id, "decoder": decoder, "filter": filt,
            "keep_all_us_per_record": keep, "filter_us_per_record": filtered,
            "speedup_vs_kafka_python_keep_all": base[0] / keep if base else None,
            "speedup_vs_kafka_python_filter": base[1] / filtered if base else None,
            "dropped_over_kept": dropped_ratio(keep, filtered, kept_fraction),
        })
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/consume/decode.py" + (" --synthetic" if args.synthetic else "")
                   + (f" --repeats {args.repeats}" if args.repeats != 9 else "")
                   + (f" --min-time {args.min_time}" if args.min_time != 0.2 else ""),
        "machine": machine, "accelerated": records.ACCELERATED, "input": {**source, **layout},
        "peer_classes": {name: p["class"] for name, p in peers.items()},
        "floor_us_per_record": per_record_us(timings["floor"]),
        "predicate_us_per_record": per_record_us(timings["predicate"]),
        "rows": table, "timings": timings,
        "goals": {"speedup_vs_kafka_python": GOAL_SPEEDUP, "dropped_over_kept": GOAL_DROPPED_RATIO},
    }


def print_table(results: dict) -> None:
    def x(v):
        return "-" if v is None else f"{v:.2f}x"
    print()
    head = (f"{'decoder':<34} {'filter':<22} {'keep-all':>9} {'10% kept':>9} "
            f"{'vs k-p keep':>11} {'vs k-p filt':>11} {'drop/kept':>9}")
    print(head)
    print(f"{'':<34} {'':<22} {'µs/rec':>9} {'µs/rec':>9} {'(faster)':>11} {'(faster)':>11} {'':>9}")
    print("-" * len(head))
    for r in results["rows"]:
        print(f"{r['decoder']:<34} {r['filter']:<22} {r['keep_all_us_per_record']:>9.3f} "
              f"{r['filter_us_per_record']:>9.3f} {x(r['speedup_vs_kafka_python_keep_all']):>11} "
              f"{x(r['speedup_vs_kafka_python_filter']):>11} {r['dropped_over_kept']:>9.0%}")
    print("-" * len(head))
    print(f"floor (CRC-32C + lz4 decompress of the batch, shared by all): "
          f"{results['floor_us_per_record']:.3f} µs/rec")
    print(f"the Python callable alone (filter() over the 1,000 decoded header lists): "
          f"{results['predicate_us_per_record']:.3f} µs/rec")
    for name, cls in results["peer_classes"].items():
        print(f"  {name}: {cls}")
    print("drop/kept = ((t_filter - 0.1 t_keep) / 0.9) / t_keep, per record; "
          "'faster' = kafka-python time / this time, same mode")
    print()
    rows = {r["id"]: r for r in results["rows"]}
    for row_id in ("ours-c-callable", "ours-c-rules", "ours-py-callable", "ours-py-rules"):
        r = rows.get(row_id)
        if r is None or r["speedup_vs_kafka_python_keep_all"] is None:
            continue
        worst = min(r["speedup_vs_kafka_python_keep_all"], r["speedup_vs_kafka_python_filter"])
        print(f"goal >= {GOAL_SPEEDUP:.0f}x vs kafka-python, {r['decoder']} / {r['filter']}: "
              f"{'met' if worst >= GOAL_SPEEDUP else 'NOT met'} (worst mode {worst:.2f}x)")
        print(f"goal drop/kept <= {GOAL_DROPPED_RATIO:.0%}, {r['decoder']} / {r['filter']}: "
              f"{'met' if r['dropped_over_kept'] <= GOAL_DROPPED_RATIO else 'NOT met'} "
              f"({r['dropped_over_kept']:.0%})")


if __name__ == "__main__":
    sys.exit(main())
