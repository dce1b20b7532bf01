"""Data files of a Delta table written by the uploader (``arrow_rows``), as ``add`` actions.

The direct path's half of what Delta's ``writeFiles`` does: one Parquet file per partition
value, under Hive-style directories as Delta's writer names them, without the partition columns
(Delta keeps those in the log), and an ``add`` action per file with the statistics Delta's data
skipping reads.  Nothing here commits: ``delta.py`` commits the actions, with the partitions'
``txn`` actions, through Delta's transaction API, and until that commit no reader sees a file.
A file of a commit that never happens stays behind, as one of Delta's own failed writers would
leave it (``VACUUM`` removes it).

Statistics: ``numRecords``, and ``minValues``/``maxValues``/``nullCount`` of the record columns
whose bounds are unambiguous (``offset``, ``timestamp``, ``partition``, ``timestamp_type`` where
not partition columns).  The other columns have none, which Delta reads as "unknown": their
files are never skipped, never wrongly skipped.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

STATS_COLUMNS = ("partition", "offset", "timestamp_type", "timestamp")
# Hive's escapePathName: characters a partition directory name writes as %XX.
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(1, 32)}
# The log names a file by its relative URI, as Hadoop's Path.toUri spells it: characters a URI
# path allows stay as they are ("topic=a/date=…"), the rest (the "%" of an escape, spaces) are %XX.
_URI_PATH_SAFE = "/!$&'()*+,;=:@"


def escape_partition_value(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def write_files(rows: pa.Table, table_path: str, partition_by: list[str]) -> list[dict]:
    """Write ``rows`` (``arrow_rows.COLUMNS``) into the table's directory; return the ``add``
    actions (as Delta's log spells them) for the files written.  The files are synced before
    this returns: the commit that names them must not outlive them."""
    groups = [((), rows)] if not partition_by else _split(rows, partition_by)
    actions = []
    for values, part in groups:
        rel_dir = "/".join(f"{c}={escape_partition_value(v)}" for c, v in zip(partition_by, values))
        name = f"part-00000-{uuid.uuid4()}.c000.snappy.parquet"
        rel = f"{rel_dir}/{name}" if rel_dir else name
        path = os.path.join(table_path, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = part.drop_columns(list(partition_by))
        pq.write_table(data, path, compression="snappy")
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        actions.append({"path": urllib.parse.quote(rel, safe=_URI_PATH_SAFE), "partitionValues": dict(zip(partition_by, values)),
                        "size": size, "modificationTime": int(time.time() * 1000), "dataChange": True,
                        "stats": json.dumps(file_stats(data), separators=(",", ":"))})
    return actions


def file_stats(data: pa.Table) -> dict:
    """Delta's statistics of one file's rows (``STATS_COLUMNS`` that the file holds)."""
    stats: dict = {"numRecords": data.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    for name in STATS_COLUMNS:
        if name not in data.column_names:
            continue
        col = data.column(name)
        stats["nullCount"][name] = col.null_count
        bounds = pc.min_max(col)
        lo, hi = bounds["min"], bounds["max"]
        if not lo.is_valid:
            continue
        if name == "timestamp":
            # Delta's JSON statistics spell a timestamp in the session time zone (UTC here) to
            # the millisecond; kdaemon's timestamps are whole milliseconds, so nothing is cut.
            lo, hi = (_iso_millis(v) for v in (lo, hi))
        else:
            lo, hi = lo.as_py(), hi.as_py()
        stats["minValues"][name], stats["maxValues"][name] = lo, hi
    return stats


def _iso_millis(ts: pa.Scalar) -> str:
    return ts.as_py().strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.as_py().microsecond // 1000:03d}Z"


def _split(rows: pa.Table, partition_by: list[str]) -> list[tuple[tuple[str, ...], pa.Table]]:
    """``rows`` by their partition values (as strings, Delta's ``partitionValues``)."""
    keys = rows.select(partition_by).group_by(partition_by).aggregate([])
    out = []
    for key in keys.to_pylist():
        mask = None
        for c in partition_by:
            m = pc.equal(rows.column(c), pa.scalar(key[c], rows.schema.field(c).type))
            mask = m if mask is None else pc.and_(mask, m)
        out.append((tuple(str(key[c]) for c in partition_by), rows.filter(mask)))
    return out
