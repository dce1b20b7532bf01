"""What an Iceberg table (Hadoop layout) has recorded of kdaemon's commits: snapshot summaries.

Each append the uploader makes carries the snapshot property ``kdaemon.offsets``: JSON
``{"<topic>": {"<partition>": <newest offset in the table>}}`` for every partition it knows of.
A partition's committed offset is the highest any snapshot in the current snapshot's ancestry
records: a snapshot made by another writer (compaction, a user's DELETE) carries no property,
and two uploaders that committed one after the other each recorded only what they had read
before; the maximum over the ancestry is right in both cases.  Snapshots rolled back (not
ancestors of the current one) do not count: their rows are not in the table.

Read from the table's metadata files, as the Iceberg table spec lays out a Hadoop table::

    metadata/version-hint.text         the newest version N (written after the commit: may lag)
    metadata/v<N>.metadata.json        snapshots, their parents and summaries; current-snapshot-id
    metadata/v<N>.gz.metadata.json     the same, gzip-compressed (write.metadata.compression-codec)

No Spark and no pyiceberg are needed, so recovery and the skip of committed rows cost a file read.
"""

from __future__ import annotations

import gzip
import json
import os
import re

SUMMARY_KEY = "kdaemon.offsets"
_METADATA = re.compile(r"^v(\d+)(\.gz)?\.metadata\.json$")


class IcebergMetadataError(Exception):
    """The table's metadata cannot be read as the Iceberg spec describes it."""


def metadata_dir(table_path: str) -> str:
    return os.path.join(table_path, "metadata")


def version_of(location: str) -> int | None:
    """N of a metadata file ``.../v<N>.metadata.json`` (or ``v<N>.gz.metadata.json``), else None."""
    m = _METADATA.match(location.rsplit("/", 1)[-1])
    return int(m[1]) if m else None


def _versions(table_path: str) -> dict[int, str]:
    try:
        names = os.listdir(metadata_dir(table_path))
    except FileNotFoundError:
        return {}
    return {int(m[1]): name for name in names if (m := _METADATA.match(name))}


def newest_version(table_path: str) -> int | None:
    """The newest N of the table's ``v<N>`` metadata files (a listing, nothing read), None without any."""
    return max(_versions(table_path), default=None)


def current_metadata(table_path: str) -> dict | None:
    """The newest metadata of the table (None if it has none yet)."""
    current = load_current(table_path)
    return None if current is None else current[2]


def load_current(table_path: str) -> tuple[int, str, dict] | None:
    """(version N, file name, parsed JSON) of the table's newest metadata, None without any.
    The newest version file is authoritative (a Hadoop commit is the atomic creation of
    v<N+1>); the hint only saves a listing in Iceberg's reader, so it is not trusted here."""
    versions = _versions(table_path)
    if not versions:
        return None
    version = max(versions)
    name = versions[version]
    path = os.path.join(metadata_dir(table_path), name)
    try:
        with (gzip.open if name.endswith(".gz.metadata.json") else open)(path, "rb") as fh:
            return version, name, json.load(fh)
    except (OSError, ValueError) as exc:
        raise IcebergMetadataError(f"cannot read the Iceberg metadata {path}: {exc}") from None


def committed_offsets(table_path: str) -> dict[tuple[str, int], int]:
    """Each (topic, partition)'s newest offset in the table by its snapshots' summaries."""
    meta = current_metadata(table_path)
    return {} if meta is None else offsets_of(meta, table_path)


def offsets_of(meta: dict, table_path: str = "the table") -> dict[tuple[str, int], int]:
    """``committed_offsets`` of the metadata ``meta`` (a ``v<N>.metadata.json``, parsed)."""
    snapshots = {s["snapshot-id"]: s for s in meta.get("snapshots") or []}
    out: dict[tuple[str, int], int] = {}
    sid = meta.get("current-snapshot-id")
    seen = set()
    while sid is not None and sid != -1 and sid in snapshots and sid not in seen:
        seen.add(sid)
        snap = snapshots[sid]
        raw = (snap.get("summary") or {}).get(SUMMARY_KEY)
        if raw:
            try:
                for topic, parts in json.loads(raw).items():
                    for p, offset in parts.items():
                        key = (topic, int(p))
                        out[key] = max(out.get(key, -1), int(offset))
            except (ValueError, AttributeError, TypeError) as exc:
                raise IcebergMetadataError(f"snapshot {sid} of {table_path} has a {SUMMARY_KEY} that is not "
                                           f"kdaemon's: {raw[:200]!r} ({exc})") from None
        sid = snap.get("parent-snapshot-id")
    return out


def summary_value(offsets: dict[tuple[str, int], int]) -> str:
    """The ``kdaemon.offsets`` property for a commit that leaves the table at ``offsets``."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(nested, separators=(",", ":"))
