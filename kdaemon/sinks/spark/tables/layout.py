"""Names and places in the Spark output, and the rules that make uploads exactly-once.

Output (``path`` mode)::

    <path>/topic=<t>/date=<yyyy-mm-dd>/part-p<partition>-<first>-<last>-<n>.parquet
    <path>/_kdaemon/manifests/<topic>/<partition>/<first>-<last>.json   (an upload's commit point)
    <path>/_kdaemon/pending/<topic>/<partition>/<first>-<last>.json     (an upload under way)
    <path>/_kdaemon/locks/<topic>/<partition>.lock                      (one uploader at a time)
    <path>/_kdaemon/tmp/<uploader>-<job>/                   (Spark's own output of a job, moved from here)
    <path>/_kdaemon/dlq/topic=<t>/part-p<partition>-<first>-<last>-<n>.parquet

Spark ignores ``_kdaemon`` when reading ``<path>`` (names starting with ``_`` are hidden).

Invariants:

1. A batch's files are named after its identity (partition, first, last offset).  Uploading the
   same batch again replaces them, never adds.
2. A batch is *uploaded* iff its manifest exists.  Before the first file of a batch is moved into
   place, a *pending* record listing every file it will create is written (fsynced, renamed);
   then the files are moved, then the manifest is written, then the pending record is removed.
   A pending record without a manifest is what an interrupted upload left: its files are deleted
   before that partition's next upload.  (Finding leftovers this way costs nothing per job,
   unlike listing the whole output, and works whatever ``partition_by`` is.)
3. Rows whose offset lies inside the range of an existing manifest are dropped before writing,
   so a worker that re-reads records after a crash (its commit was lost, the upload was not)
   adds nothing twice, whatever its new batch boundaries.  This needs every kept offset of a
   manifest's range to be in the output: a batch holds every record its worker read between
   its first and last offset (the worker reads a partition contiguously, and a seek forward only
   goes to a committed offset, i.e. past records already uploaded).
4. Everything from reading a partition's manifests to writing its new manifests happens under
   that partition's lock (``flock``), so two uploaders (two daemons sharing the output, or an
   uploader whose predecessor's job is still finishing) never both decide that the same offsets
   are new, and one never removes files the other is moving in.  ``flock`` is reliable on a local
   filesystem; on a network filesystem it is only as good as that filesystem's locking.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import uuid
from dataclasses import dataclass

log = logging.getLogger("kdaemon.spark.uploader")

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


def kdaemon_dir(root: str) -> str:
    return os.path.join(root, "_kdaemon")


def manifest_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, "_kdaemon", "manifests", topic, str(partition))


def _range_name(batch: BatchId) -> str:
    return f"{batch.first:019d}-{batch.last:019d}.json"


def manifest_path(root: str, topic: str, batch: BatchId) -> str:
    return os.path.join(manifest_dir(root, topic, batch.partition), _range_name(batch))


def pending_dir(root: str, topic: str, partition: int) -> str:
    return os.path.join(root, "_kdaemon", "pending", topic, str(partition))


def pending_path(root: str, topic: str, batch: BatchId) -> str:
    return os.path.join(pending_dir(root, topic, batch.partition), _range_name(batch))


def dlq_root(root: str) -> str:
    return os.path.join(root, "_kdaemon", "dlq")


def _parse_range(name: str) -> tuple[int, int] | None:
    if not name.endswith(".json"):
        return None
    first, _, last = name[:-5].partition("-")
    if first.isdigit() and last.isdigit():
        return int(first), int(last)
    return None


def uploaded_ranges(root: str, topic: str, partition: int) -> list[tuple[int, int]]:
    """Offset ranges (inclusive) of every uploaded batch of a partition, sorted."""
    try:
        names = os.listdir(manifest_dir(root, topic, partition))
    except FileNotFoundError:
        return []
    return sorted(r for r in map(_parse_range, names) if r is not None)


def pending_uploads(root: str, topic: str, partition: int) -> list[tuple[BatchId, dict]]:
    """Uploads of a partition that were started and not finished: (batch, its pending record:
    ``files`` relative to ``root``, and for a Delta table the ``delta`` commit it announced).
    A pending record that cannot be read is reported with no files."""
    d = pending_dir(root, topic, partition)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    out = []
    for name in sorted(names):
        r = _parse_range(name)
        if r is None:
            continue
        try:
            with open(os.path.join(d, name), "rb") as fh:
                record = json.load(fh)
            record["files"] = list(record["files"])
        except (OSError, ValueError, KeyError, TypeError):
            record = {"files": []}  # written durably, so only a foreign file gets here; nothing to delete
        out.append((BatchId(partition, *r), record))
    return out


@contextlib.contextmanager
def partition_locks(root: str, topic_partitions):
    """Hold the upload lock of every (topic, partition) given, taken in sorted order (so two
    uploaders wanting overlapping sets cannot deadlock).  Released when the process dies."""
    fds = []
    try:
        for topic, partition in sorted(set(topic_partitions)):
            d = os.path.join(root, "_kdaemon", "locks", topic)
            os.makedirs(d, exist_ok=True)
            fd = os.open(os.path.join(d, f"{partition}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        for fd in fds:
            os.close(fd)  # closing drops the flock


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_if_absent(directory: str, name: str, data: bytes) -> bool:
    """Create ``directory/name`` holding ``data``, atomically and only if no file of that name
    exists: False, with nothing changed, when one does.  A table commit is this (Delta's
    ``<version>.json``, Iceberg's ``v<N>.metadata.json``): the writer that creates the name
    has the version, and the loser reads the table again.

    A synced temporary file (named with a leading dot, as the formats' own writers name theirs,
    so no reader takes it for the real one) is hard-linked to the name: ``link`` fails on an
    existing name on every local filesystem, where ``rename`` replaces it.  A reader sees no
    file or all of it.  Once the link is made the file exists, whatever fails after: that is
    logged, never raised (a caller would take a commit that happened for one that failed)."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.{uuid.uuid4()}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, os.path.join(directory, name))
        except FileExistsError:
            return False
    finally:
        try:
            os.unlink(tmp)
        except OSError as exc:
            log.warning("could not remove the temporary file %s: %s", tmp, exc)
    try:
        fsync_dir(directory)
    except OSError as exc:
        log.warning("created %s, but syncing %s failed: %s", name, directory, exc)
    return True


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


def remove_durably(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(os.path.dirname(path))


def move_durably(moves: dict[str, list[tuple[str, str]]]) -> None:
    """Move each (src, target) of ``moves`` into place, the file synced first and each target
    directory after (``plan_moves`` makes the plan)."""
    dirs = set()
    for pairs in moves.values():
        for src, target in pairs:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(src, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(src, target)
            dirs.add(os.path.dirname(target))
    for d in dirs:
        fsync_dir(d)


def plan_moves(src: str, dest_root: str, moves: dict[str, list[tuple[str, str]]]) -> None:
    """Spark's ``src/<partition dirs>/_batch=<id>/part-*.parquet`` go to
    ``dest_root/<partition dirs>/part-<id>-<n>.parquet``: names from the batch identity."""
    for dirpath, _, filenames in os.walk(src):
        parts = [f for f in sorted(filenames) if f.endswith(".parquet")]
        if not parts:
            continue
        segments = os.path.relpath(dirpath, src).split(os.sep)
        batch_seg = [s for s in segments if s.startswith("_batch=")]
        if not batch_seg:
            continue
        batch_name = batch_seg[0][len("_batch="):]
        target_dir = os.path.join(dest_root, *[s for s in segments if not s.startswith("_batch=")])
        for n, name in enumerate(parts):
            moves[batch_name].append((os.path.join(dirpath, name),
                                      os.path.join(target_dir, f"part-{batch_name}-{n:03d}.parquet")))
