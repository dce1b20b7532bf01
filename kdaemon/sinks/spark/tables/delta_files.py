"""Data files of a Delta table written by the uploader (``arrow_rows``), as ``add`` actions.

The direct path's half of what Delta's ``writeFiles`` does: one Parquet file per partition
value and write lane (``arrow_rows.WRITE_LANES``), under Hive-style directories as Delta's
writer names them, without the partition columns (Delta keeps those in the log), and an
``add`` action per file (delta-rs's ``AddAction``: the path as it is on disk, relative to the
table; delta-rs writes it into the log as the URI the protocol asks for) with the statistics
Delta's data skipping reads.  Nothing here commits: ``delta_commit.py`` commits the actions
through delta-rs, with the partitions' ``txn`` actions, and until that commit no reader sees a
file.  Not delta-rs's ``write_deltalake``, which writes the files too: it was slower on the
same rows (bench/spark/delta_write.py, the figures in ``delta.py``).  A file of a commit that
is known not to happen is removed (``remove_files``); one of a writer that died before its
commit stays behind, as one of Delta's own failed writers would leave it (``VACUUM`` removes
it).

Statistics: ``numRecords``, and ``minValues``/``maxValues``/``nullCount`` of the record columns
whose bounds are unambiguous (``offset``, ``timestamp``, ``partition``, ``timestamp_type`` where
not partition columns).  The other columns have none, which Delta reads as "unknown": their
files are never skipped, never wrongly skipped.
"""

from __future__ import annotations

import datetime
import json
import os
import time
import uuid

import pyarrow.parquet as pq

from .arrow_rows import PartitionedFiles, write_pieces

STATS_COLUMNS = ("partition", "offset", "timestamp_type", "timestamp")
# Hive's escapePathName: characters a partition directory name writes as %XX.
_ESCAPED = set('"#%\'*/:=?\\\x7f{[]^') | {chr(c) for c in range(1, 32)}


def escape_partition_value(value: str) -> str:
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)


def write_files(pieces, table_path: str, partition_by: list[str]) -> list:
    """Write the rows of ``pieces`` (tables of ``arrow_rows.COLUMNS``, a batch each) into the
    table's directory; return the ``add`` actions (``deltalake.transaction.AddAction``) for the
    files, synced.  An error (NotDirect from building a piece) leaves no file behind."""
    from deltalake.transaction import AddAction

    def path_for(values: tuple[str, ...]) -> str:
        rel = [f"{c}={escape_partition_value(v)}" for c, v in zip(partition_by, values)]
        return os.path.join(table_path, *rel, f"part-00000-{uuid.uuid4()}.c000.snappy.parquet")

    # Delta keeps partition values in the log, not in the files.
    files = PartitionedFiles(partition_by, path_for, lambda part: part.drop_columns(list(partition_by)), "snappy")
    actions = []
    for values, path, size in write_pieces(pieces, files):
        rel = os.path.relpath(path, table_path).replace(os.sep, "/")
        actions.append(AddAction(rel, size, dict(zip(partition_by, values)), int(time.time() * 1000), True,
                                 json.dumps(file_stats(path), separators=(",", ":"))))
    return actions


def file_stats(path: str) -> dict:
    """Delta's statistics of one data file (``STATS_COLUMNS`` that it holds), from its footer."""
    meta = pq.ParquetFile(path).metadata
    stats: dict = {"numRecords": meta.num_rows, "minValues": {}, "maxValues": {}, "nullCount": {}}
    names = [meta.schema.column(i).path for i in range(meta.num_columns)]
    for name in STATS_COLUMNS:
        if name not in names:
            continue
        col = names.index(name)
        groups = [meta.row_group(g).column(col).statistics for g in range(meta.num_row_groups)]
        if any(g is None or not g.has_null_count for g in groups):
            continue
        stats["nullCount"][name] = sum(g.null_count for g in groups)
        bounded = [g for g in groups if g.has_min_max]
        if len(bounded) != len([g for g in groups if g.null_count < g.num_values]):
            continue   # a row group with values but no bounds: leave the column's bounds unknown
        if bounded:
            lo, hi = min(g.min for g in bounded), max(g.max for g in bounded)
            if name == "timestamp":
                # Delta's JSON statistics spell a timestamp in the session time zone (UTC here)
                # to the millisecond; kdaemon's timestamps are whole milliseconds, nothing is cut.
                lo, hi = _iso_millis(lo), _iso_millis(hi)
            stats["minValues"][name], stats["maxValues"][name] = lo, hi
    return stats


def _iso_millis(ts: datetime.datetime) -> str:
    if ts.tzinfo is not None:
        ts = ts.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def remove_files(table_path: str, adds: list) -> None:
    """Remove the data files of ``adds`` (``write_files``'s) that no commit took: nobody reads a
    file the log does not name.  Their partition directories stay (another writer may be
    writing into one)."""
    for add in adds:
        try:
            os.unlink(os.path.join(table_path, add.path))
        except FileNotFoundError:
            pass
