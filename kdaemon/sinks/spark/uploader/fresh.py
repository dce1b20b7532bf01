"""A job's batches as the uploader sees them before writing: which rows are new (not inside the
ranges of manifests a batch overlaps) and each partition's newest offset, which a table commit
records (``layout.py``: the exactly-once rules)."""

from __future__ import annotations

from dataclasses import dataclass
import pyarrow.compute as pc

from ..wire import Request


@dataclass(eq=False)
class Fresh:
    """A batch of this job that is not uploaded yet: how many of its rows are new (not inside
    ``drop``, the ranges of manifests it overlaps) and its record timestamps (ms)."""

    req: Request
    drop: list[tuple[int, int]]
    new_rows: int
    min_ts: int | None
    max_ts: int | None
    rows: object = None   # the batch without the rows in ``drop`` (a pyarrow Table), until held
    built: object = None  # its job rows, built ahead (``ahead.py``; only where ``drop`` is empty)


def versions_of(fresh: list[Fresh]) -> dict[tuple[str, int], int]:
    """Each (topic, partition)'s newest offset among the job's batches: what a table records."""
    versions: dict[tuple[str, int], int] = {}
    for f in fresh:
        key = (f.req.topic, f.req.batch.partition)
        versions[key] = max(versions.get(key, -1), f.req.batch.last)
    return versions


def inspect_batch(req: Request, table, drop: list[tuple[int, int]]) -> Fresh:
    """A staged batch's number of rows not inside ``drop``, its timestamp range, and the batch
    without those rows, which is what the job writes: a partition read again by its next owner
    after a rebalance (kdaemon/worker/delivery.py ``on_revoked``) comes in batches that overlap
    what is uploaded, and the job need not read those rows only to drop them."""
    ts = pc.min_max(table.column("timestamp"))
    if drop:
        offsets = table.column("offset")
        inside = None
        for first, last in drop:
            c = pc.and_(pc.greater_equal(offsets, first), pc.less_equal(offsets, last))
            inside = c if inside is None else pc.or_(inside, c)
        table = table.filter(pc.invert(inside))
    return Fresh(req, drop, table.num_rows, ts["min"].as_py(), ts["max"].as_py(), table)
