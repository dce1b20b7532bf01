"""What an Iceberg table (Hadoop layout) has recorded of kdaemon's commits: snapshot summaries
and table properties.

Each append the uploader makes records its offsets twice, in the same commit:

* the snapshot property ``kdaemon.offsets``: JSON ``{"<topic>": {"<partition>": <newest offset in
  the table>}}`` for every partition it knows of (what earlier versions wrote, and all they wrote);
* the table properties ``kdaemon.offsets.<topic>.<partition>`` = the newest offset, one per
  partition (``property_key``).

Snapshots do not last: Spark's ``rewrite_data_files`` commits a snapshot of its own (no
``kdaemon.offsets``), and ``expire_snapshots(retain_last => 1)`` then drops every snapshot but
that one, with the summaries.  Table properties are carried from one metadata version to the
next by every writer, compaction and expiry included, so they outlive both.

A partition's committed offset is the highest the current snapshot's ancestry records (a
snapshot made by another writer, such as compaction or a user's DELETE, carries no summary; two
uploaders that committed one after the other each recorded only what they had read before: the
maximum over the ancestry is right in both cases), or its table property where no snapshot of
the table records that offset any more (expired).  Snapshots rolled back (not ancestors of the
current one) do not count: their rows are not in the table, and a property whose offset such a
snapshot still records is left to the ancestry too.  (Rolled back *and* expired before the
partition's next commit, the property is all that is left and counts.)

Read from the table's metadata files, as the Iceberg table spec lays out a Hadoop table::

    metadata/version-hint.text         the newest version N (written after the commit: may lag)
    metadata/v<N>.metadata.json        snapshots, their parents and summaries; current-snapshot-id;
                                       properties
    metadata/v<N>.gz.metadata.json     the same, gzip-compressed (write.metadata.compression-codec)

No Spark and no pyiceberg are needed, so recovery and the skip of committed rows cost a file read.
"""

from __future__ import annotations

import gzip
import json
import os
import re

SUMMARY_KEY = "kdaemon.offsets"
PROPERTY_PREFIX = "kdaemon.offsets."   # + <topic>.<partition> (a topic name may hold dots, a partition not)
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
    anywhere: dict[tuple[str, int], int] = {}   # what any snapshot of the table records
    for sid, snap in snapshots.items():
        _merge(anywhere, _summary_offsets(snap, sid, table_path))
    out: dict[tuple[str, int], int] = {}
    sid = meta.get("current-snapshot-id")
    seen = set()
    while sid is not None and sid != -1 and sid in snapshots and sid not in seen:
        seen.add(sid)
        _merge(out, _summary_offsets(snapshots[sid], sid, table_path))
        sid = snapshots[sid].get("parent-snapshot-id")
    for key, offset in property_offsets(meta.get("properties") or {}, table_path).items():
        if anywhere.get(key, -1) < offset:   # the snapshots that recorded it are gone: expired
            out[key] = max(out.get(key, -1), offset)
    return out


def _merge(into: dict[tuple[str, int], int], offsets: dict[tuple[str, int], int]) -> None:
    for key, offset in offsets.items():
        into[key] = max(into.get(key, -1), offset)


def _summary_offsets(snap: dict, sid, table_path: str) -> dict[tuple[str, int], int]:
    raw = (snap.get("summary") or {}).get(SUMMARY_KEY)
    if not raw:
        return {}
    out: dict[tuple[str, int], int] = {}
    try:
        for topic, parts in json.loads(raw).items():
            for p, offset in parts.items():
                out[(topic, int(p))] = int(offset)
    except (ValueError, AttributeError, TypeError) as exc:
        raise IcebergMetadataError(f"snapshot {sid} of {table_path} has a {SUMMARY_KEY} that is not "
                                   f"kdaemon's: {raw[:200]!r} ({exc})") from None
    return out


def property_key(topic: str, partition: int) -> str:
    """The table property recording ``topic``'s ``partition``."""
    return f"{PROPERTY_PREFIX}{topic}.{partition}"


def property_offsets(properties: dict, table_path: str = "the table") -> dict[tuple[str, int], int]:
    """The offsets the table properties ``kdaemon.offsets.<topic>.<partition>`` record."""
    out: dict[tuple[str, int], int] = {}
    for name, value in properties.items():
        if not name.startswith(PROPERTY_PREFIX):
            continue
        topic, _, partition = name[len(PROPERTY_PREFIX):].rpartition(".")
        try:
            if not topic or not partition.isdigit():
                raise ValueError("not <topic>.<partition>")
            out[(topic, int(partition))] = int(value)
        except ValueError as exc:
            raise IcebergMetadataError(f"the table property {name} = {value!r} of {table_path} is not kdaemon's "
                                       f"({exc}); kdaemon.offsets.<topic>.<partition> = <offset> is") from None
    return out


def offset_properties(properties: dict, offsets: dict[tuple[str, int], int]) -> tuple[dict[str, str], list[str]]:
    """(the table properties to set, those to remove) for a table whose ``properties`` are
    these to record exactly ``offsets``."""
    wanted = {property_key(t, p): str(o) for (t, p), o in offsets.items()}
    stale = sorted(k for k in properties if k.startswith(PROPERTY_PREFIX) and k not in wanted)
    return {k: v for k, v in sorted(wanted.items()) if properties.get(k) != v}, stale


def summary_value(offsets: dict[tuple[str, int], int]) -> str:
    """The ``kdaemon.offsets`` property for a commit that leaves the table at ``offsets``."""
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = offset
    return json.dumps(nested, separators=(",", ":"))
