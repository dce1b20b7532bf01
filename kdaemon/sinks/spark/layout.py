"""Names and places in the Spark output, and the rules that make uploads exactly-once.

Output (``path`` mode)::

    <path>/topic=<t>/date=<yyyy-mm-dd>/part-p<partition>-<first>-<last>-<n>.parquet
    <path>/_kdaemon/manifests/<topic>/<partition>/<first>-<last>.json
    <path>/_kdaemon/tmp/<job>/                 (Spark's own output of a job, moved from here)
    <path>/_kdaemon/dlq/topic=<t>/part-p<partition>-<first>-<last>-<n>.parquet

Invariants:

1. A batch's files are named after its identity (partition, first, last offset).  Uploading the
   same batch again replaces them, never adds.
2. A batch is *uploaded* iff its manifest exists.  The manifest is written (fsynced, renamed)
   after every file of the batch is in place; files of a batch without a manifest are leftovers
   of an interrupted upload and are deleted before that partition's next upload.
3. Rows whose offset lies inside the range of an existing manifest are dropped before writing,
   so a worker that re-reads records after a crash (its commit was lost, the upload was not)
   adds nothing twice, whatever its new batch boundaries.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_PART = re.compile(r"^part-p(\d+)-(\d{19})-(\d{19})-(\d+)\.parquet$")


@dataclass(frozen=True, order=True)
class BatchId:
    partition: int
    first: int
    last: int

    @property
    def name(self) -> str:
        return f"p{self.partition}-{self.first:019d}-{self.last:019d}"

    def part_file(self, n: int) -> str:
        return f"part-{self.name}-{n:03d}.parquet"

    def overlaps(self, first: int, last: int) -> bool:
        return self.first <= last and first <= self.last


def parse_part_file(filename: str) -> tuple[BatchId, int] | None:
    m = _PART.match(filename)
    if m is None:
        return None
    return BatchId(int(m.group(1)), int(m.group(2)), int(m.group(3))), int(m.group(4))


def topic_dir(root: str, topic: str) -> str:
    return os.path.join(root, f"topic={topic}")


def manifest_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, "_kdaemon", "manifests", topic, str(partition))


def manifest_path(root: str, topic: str, batch: BatchId) -> str:
    return os.path.join(manifest_dir(root, topic, batch.partition), f"{batch.first:019d}-{batch.last:019d}.json")


def uploaded_ranges(root: str, topic: str, partition: int) -> list[tuple[int, int]]:
    """Offset ranges (inclusive) of every uploaded batch of a partition, sorted."""
    d = manifest_dir(root, topic, partition)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.endswith(".json"):
            first, _, last = name[:-5].partition("-")
            if first.isdigit() and last.isdigit():
                out.append((int(first), int(last)))
    return sorted(out)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: str, data: bytes) -> None:
    """Write a small file so that after return it is complete or absent, never partial."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(d)
