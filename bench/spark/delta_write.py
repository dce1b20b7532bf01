"""The direct path's Delta write, two ways: kdaemon's own data files handed to delta-rs, or
delta-rs's ``write_deltalake`` writing them.

What runs: no broker, no Spark.  ``--batches`` staged batches of ``--rows`` records each (the
peer bench's records: testkit/workload.py's ~200-byte JSON values under its ``value_schema``,
a key, two headers; each job's timestamps straddle a midnight, so each job writes two
``date`` partitions) are written once as the workers stage them.  Then each mode appends them as
``--jobs`` jobs, one after the other, into a fresh table partitioned by ``topic, date``, each
job recording every partition's newest offset, as the uploader does:

* **files**: ``delta.append_files``, the direct path itself: ``arrow_rows`` builds a batch's
  rows while the previous one is written (``each_batch_rows``), ``delta_files`` writes the
  Parquet files on two write lanes (``arrow_rows.WRITE_LANES``) with their statistics, and
  delta-rs commits them (``create_write_transaction`` with the app transactions);
* **write_deltalake**: the same rows (``each_batch_rows``, a reader over its tables) given to
  ``deltalake.write_deltalake`` (mode append, the same partitioning and app transactions,
  snappy), which writes the files and commits.

Per job: wall seconds and CPU seconds of the process (user + system; the machine has two cores,
so a mode that is faster on the wall by using both is visible), and the files it left.  The
first job of each mode creates the table; the figures are the median and best over the jobs
after it.  Every table is read back (pyarrow) and must hold each record exactly once.

    .venv/bin/python bench/spark/delta_write.py --rows 25000 --batches 4 --jobs 6
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import pyarrow as pa  # noqa: E402
import pyarrow.dataset as ds  # noqa: E402

from kdaemon.sinks.spark import staged  # noqa: E402
from kdaemon.sinks.spark.tables import arrow_rows, ddl, delta  # noqa: E402
from testkit.workload import iter_records  # noqa: E402

VALUE_SCHEMA = "id BIGINT, event STRING, user STRING, amount DOUBLE, currency STRING, items ARRAY<INT>, note STRING"
PARTITION_BY = ["topic", "date"]
TOPIC = "events"
MIDNIGHT = 1_764_028_800_000   # 2025-11-25T00:00:00Z: every job's records straddle it


def rows_schema():
    """The rows' Spark schema, as ``SparkWriter`` gives ``append_files``."""
    return arrow_rows.rows_schema(ddl.parse_schema(VALUE_SCHEMA))


def stage(directory: str, jobs: int, batches: int, rows: int) -> list[list[tuple[str, int, int]]]:
    """Each job's staged batches: (file, partition, newest offset), one per partition."""
    records = iter_records(jobs * batches * rows)
    out = []
    for job in range(jobs):
        files = []
        for p in range(batches):
            offsets = range(job * rows, (job + 1) * rows)
            got = [next(records) for _ in offsets]
            path = os.path.join(directory, f"{job}-{p}.staged")
            stamps = [MIDNIGHT + (o - job * rows - rows // 2) * 5 for o in offsets]
            staged.write(path, TOPIC, p, list(offsets), stamps, [0] * rows,
                         [r[2] for r in got], [r[3] for r in got], [r[4] for r in got])
            files.append((path, p, offsets[-1]))
        out.append(files)
    return out


def pieces_of(files, value_type):
    return arrow_rows.each_batch_rows([staged.read(f) for f, _, _ in files], "json", value_type)


def append_files(table: str, files, value_type, schema) -> None:
    versions = {(TOPIC, p): last for _, p, last in files}
    assert delta.append_files(pieces_of(files, value_type), table, PARTITION_BY, versions, schema) is not None


def append_write_deltalake(table: str, files, value_type, schema) -> None:
    from deltalake import CommitProperties, Transaction, WriterProperties, write_deltalake
    pieces = pieces_of(files, value_type)
    first = next(pieces)

    def batches():
        yield from first.to_batches()
        for piece in pieces:
            yield from piece.to_batches()
    now = int(time.time() * 1000)
    txns = [Transaction(delta.app_id(TOPIC, p), last, now) for _, p, last in files]
    write_deltalake(table, pa.RecordBatchReader.from_batches(first.schema, batches()), mode="append",
                    partition_by=PARTITION_BY, writer_properties=WriterProperties(compression="SNAPPY"),
                    commit_properties=CommitProperties(app_transactions=txns))


MODES = {"files": append_files, "write_deltalake": append_write_deltalake}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def data_files(table: str) -> list[str]:
    return [os.path.join(d, f) for d, _, names in os.walk(table) if "_delta_log" not in d
            for f in names if f.endswith(".parquet")]


def run_mode(mode: str, root: str, jobs, value_type, schema) -> dict:
    table = os.path.join(root, mode)
    runs = []
    for files in jobs:
        before = set(data_files(table))
        wall0, cpu0 = time.perf_counter(), cpu()
        MODES[mode](table, files, value_type, schema)
        wall, used = time.perf_counter() - wall0, cpu() - cpu0
        new = set(data_files(table)) - before
        runs.append({"wall_s": round(wall, 3), "cpu_s": round(used, 3), "files": len(new),
                     "bytes": sum(os.path.getsize(f) for f in new)})
    got = ds.dataset([f for f in data_files(table)], format="parquet").to_table(columns=["partition", "offset"])
    keys = set(zip(got.column("partition").to_pylist(), got.column("offset").to_pylist()))
    rows = jobs[0][0][2] + 1
    expected = {(p, o) for files in jobs for _, p, last in files for o in range(last - rows + 1, last + 1)}
    assert got.num_rows == len(expected) and keys == expected, f"{mode}: {got.num_rows} rows, {len(expected)} expected"
    warm = runs[1:] or runs
    return {"runs": runs, "median_wall_s": statistics.median(r["wall_s"] for r in warm),
            "best_wall_s": min(r["wall_s"] for r in warm), "median_cpu_s": statistics.median(r["cpu_s"] for r in warm)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=25_000, help="records per batch (one batch a partition)")
    ap.add_argument("--batches", type=int, default=4, help="batches (partitions) per job")
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rounds", type=int, default=2, help="each mode this many times, alternating")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    schema = rows_schema()
    value_type = arrow_rows.value_arrow_type(schema["value"].dataType)
    out: dict = {"rows_per_job": args.rows * args.batches, "jobs": args.jobs, "cpus": os.cpu_count(),
                 "deltalake": __import__("deltalake").__version__, "pyarrow": pa.__version__, "modes": {}}
    with tempfile.TemporaryDirectory(prefix="delta-write-") as tmp:
        jobs = stage(tmp, args.jobs, args.batches, args.rows)
        for r in range(args.rounds):
            for mode in args.modes.split(","):
                result = run_mode(mode, os.path.join(tmp, f"round{r}"), jobs, value_type, schema)
                out["modes"].setdefault(mode, []).append(result)
                per = result["median_wall_s"]
                print(f"round {r} {mode:>15}: median {per:.3f}s wall ({out['rows_per_job'] / per:,.0f} rows/s), "
                      f"best {result['best_wall_s']:.3f}s, median CPU {result['median_cpu_s']:.3f}s, "
                      f"{result['runs'][-1]['files']} files a job", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
