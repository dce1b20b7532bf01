"""The table formats of the Spark sink, one interface: Delta Lake (``delta.py``) and Apache
Iceberg (``iceberg.py``).

Each format module offers ``session_conf(path)`` (jars, extensions, catalog),
``committed_offsets(path)`` (each (topic, partition)'s newest offset the table itself has
recorded, read from its files without Spark; Delta's takes the partitions to ask about, as
delta-rs answers per application id: ``recorded``) and ``append(spark, df, path, partition_by,
versions, merge_schema)``.  On top of path mode's bookkeeping (``layout.py``: locks, manifests, pending
records), the uploader uses the recorded offsets twice:

* before a job, rows at or below a partition's committed offset are dropped, as rows inside a
  manifest's range are (the table may know of commits whose manifest was never written);
* a pending record names the (topic, partition, version) its commit records; an upload killed
  between the commit and its manifest rolls *forward* (manifest written) when the table's
  committed offset reaches that version, and back when not (both formats commit all or
  nothing).
"""

from __future__ import annotations

from types import ModuleType

from . import delta, iceberg, layout

FORMATS: dict[str, ModuleType] = {"delta": delta, "iceberg": iceberg}


def pending_entry(fmt: str, topic: str, partition: int, version: int) -> dict:
    """What a pending record says of the table commit it announces."""
    return {"format": fmt, "topic": topic, "partition": partition, "version": version}


def recorded(fmt: str, table_path: str, keys) -> dict[tuple[str, int], int]:
    """The newest offset the table records of each (topic, partition) of ``keys`` it records."""
    if fmt == "delta":
        return delta.committed_offsets(table_path, keys)
    wanted = set(keys)
    return {key: v for key, v in FORMATS[fmt].committed_offsets(table_path).items() if key in wanted}


def committed(table_path: str, entry: dict) -> bool:
    """Did the commit a pending record announced happen?"""
    key = (entry["topic"], int(entry["partition"]))
    return recorded(entry["format"], table_path, [key]).get(key, -1) >= int(entry["version"])


def uploaded_ranges(root: str, fmt: str, keys) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """What counts as uploaded, per (topic, partition) of ``keys``: every manifest's range
    (inclusive), and in a table every offset up to the one the table recorded (it may know of
    commits whose manifest was never written).  A job drops rows inside these
    (``uploader.Uploader.upload``); a partition's next owner starts after them (``resume.py``)."""
    out = {key: list(layout.uploaded_ranges(root, *key)) for key in keys}
    if fmt in FORMATS:
        offsets = recorded(fmt, root, list(out))
        for key, ranges in out.items():
            if offsets.get(key, -1) >= 0:
                ranges.append((0, offsets[key]))
    return out
