"""``python bench/share/jsonl_dedupe.py``: what the jsonl sink's share-group dedupe costs (issue #33).

The sink's write path, in CPU time per record (write and flush, encoding included; fsync off so
the disk does not drown the difference), for the same records:

* consumer: a consumer group's sink (the highest offset per partition);
* share: a share group's (``jsonl_share.py``: which offsets, as ranges), batches in order;
* share, shuffled: the same batches in a random order (released and redelivered batches);
* share, 10% again: every tenth batch is one already written, delivered again (skipped);
* share, 2 writers: two sinks on one directory take turns, so before every batch each finds
  the other's new index (the case of several workers of one daemon);
* share, 300 old files: a directory that already holds 300 published files (and indexes).

No broker: the sink alone, as the worker drives it (a flush every ``--flush-every`` batches).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from kdaemon.plugins.types import Record  # noqa: E402
from kdaemon.sinks.jsonl import JsonlSink  # noqa: E402


def batches(n: int, size: int, partitions: int, value_bytes: int) -> list[list[Record]]:
    value = b"x" * value_bytes
    out = []
    per = size // partitions
    for b in range(n // size):
        out.append([Record("bench", p, b * per + i, 1_700_000_000_000, 0, b"k", value, [])
                    for p in range(partitions) for i in range(per)])
    return out


def once(work: list[list[Record]], group_type: str, flush_every: int, writers: int, old_files: int) -> float:
    """CPU seconds per record to write ``work`` once, in a fresh directory."""
    d = tempfile.mkdtemp(prefix="kd-bench-jsonl-")
    try:
        if old_files:
            old = JsonlSink(d, group_type=group_type, fsync=False, max_bytes=1)
            for i in range(old_files):
                old.write([Record("bench", 9, i, 0, 0, None, b"v", [])])
                old.flush()
            old.close()
        sinks = [JsonlSink(d, group_type=group_type, fsync=False) for _ in range(writers)]
        written = 0
        start = time.process_time()
        for i, batch in enumerate(work):
            sink = sinks[i % writers]
            sink.write(batch)
            written += len(batch)
            if writers > 1 or (i + 1) % flush_every == 0:
                sink.flush()
        for sink in sinks:
            sink.close()
        return (time.process_time() - start) / written
    finally:
        shutil.rmtree(d, ignore_errors=True)


def dedupe_only(work: list[list[Record]], group_type: str) -> float:
    """CPU seconds per record of the dedupe decision alone (no encoding, no file)."""
    d = tempfile.mkdtemp(prefix="kd-bench-jsonl-")
    try:
        sink = JsonlSink(d, group_type=group_type, fsync=False)
        start = time.process_time()
        if group_type == "share":
            share = sink._share
            for batch in work:
                share.written(share.not_stored(batch, None)[2])
        else:
            for batch in work:
                sink._not_stored(batch)
        took = time.process_time() - start
        sink.close()
        return took / sum(len(b) for b in work)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--value-bytes", type=int, default=200)
    ap.add_argument("--flush-every", type=int, default=10, help="batches per flush")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = batches(args.records, args.batch, args.partitions, args.value_bytes)
    rng = random.Random(33)
    shuffled = work[:]
    rng.shuffle(shuffled)
    again = []
    for i, b in enumerate(work):
        again.append(b)
        if i % 10 == 9:
            again.append(work[i - 5])
    cases = [("consumer", work, "consumer", 1, 0), ("share", work, "share", 1, 0),
             ("share, shuffled", shuffled, "share", 1, 0), ("share, 10% again", again, "share", 1, 0),
             ("consumer, 2 writers", work, "consumer", 2, 0), ("share, 2 writers", work, "share", 2, 0),
             ("consumer, 300 old files", work, "consumer", 1, 300), ("share, 300 old files", work, "share", 1, 300)]
    best = {name: float("inf") for name, *_ in cases}
    for _ in range(args.rounds):   # round robin, best of each: the machine is shared, noise is one-sided
        for name, w, group_type, writers, old_files in cases:
            best[name] = min(best[name], once(w, group_type, args.flush_every, writers, old_files))
    dedupe = {g: min(dedupe_only(work, g) for _ in range(args.rounds)) for g in ("consumer", "share")}
    print(f"{args.records} records of {args.value_bytes} B, batches of {args.batch} on {args.partitions} "
          f"partitions, a flush every {args.flush_every} batches (every batch with 2 writers), fsync off; "
          f"CPU per record, best of {args.rounds}")
    print("  write path (write + flush, encoding included):")
    for base_name, pairs in (("consumer", ("consumer", "share", "share, shuffled", "share, 10% again")),
                             ("consumer, 2 writers", ("consumer, 2 writers", "share, 2 writers")),
                             ("consumer, 300 old files", ("consumer, 300 old files", "share, 300 old files"))):
        for name in pairs:
            t = best[name]
            print(f"    {name:<26} {t * 1e6:6.2f} µs   {100 * (t / best[base_name] - 1):+5.1f}% against {base_name}")
    print("  the dedupe decision alone (which records to write; share: and noting them):")
    for g, t in dedupe.items():
        print(f"    {g:<26} {t * 1e6:6.2f} µs")

if __name__ == "__main__":
    main()
