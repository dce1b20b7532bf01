"""What the ``jsonl`` sink's directory already holds, per (topic, partition): the highest offset.

The jsonl sink writes, flushes, and only then does the worker commit; a worker killed between
the two leaves records on disk whose offsets were never committed, and its successor consumes
them again.  With this index the sink recognises them and writes nothing twice (the Spark
sink's manifests do the same for Spark output, ``sinks/spark/tables/layout.py``, invariant 3).  Records
are known by the (topic, partition, offset) they carry, so an interceptor must not rewrite
those (the Spark sink assumes the same).

Layout: next to the data files, ``_kdaemon/jsonl-index/<stem>.json`` for each data file
``<stem>.jsonl`` (or ``<stem>.jsonl.open`` while written)::

    {"bytes": 123456, "high": [["orders", 0, 4711], ["orders", 3, 99]]}

``high`` holds the highest offset per partition among the records in the data file's first
``bytes`` bytes.  The writer replaces it (write, rename) after every flush that made data
durable, after the data's fsync: so an index never claims data the file may lose.  It may lag
(a crash between the fsync and the rename, or a rename lost with the directory entry): an index
whose ``bytes`` differs from the file's size, an unreadable one, or none at all, and the data
file is read instead (every line's topic, partition and offset), once; the index is then written
for it.  A live writer's ``.open`` file counts as far as its index says: bytes past it may not be
durable yet.

Pure file work, no state of its own: ``JsonlSink`` keeps the maps.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable

from .offset_ranges import OffsetRanges

INDEX_DIR = os.path.join("_kdaemon", "jsonl-index")

TP = tuple[str, int]


def index_dir(directory: str) -> str:
    return os.path.join(directory, INDEX_DIR)


def index_path(directory: str, stem: str) -> str:
    """The index of data file ``<directory>/<stem>.jsonl`` (``stem`` without directory)."""
    return os.path.join(index_dir(directory), stem + ".json")


def write_index(directory: str, stem: str, nbytes: int, high: dict[TP, int],
                ranges: dict[TP, OffsetRanges] | None = None) -> None:
    """Replace ``stem``'s index (write a temporary file, rename it over).  Not fsync'ed: an index
    lost or stale on power loss is detected and rebuilt from the data file.  ``ranges`` (share
    groups) adds which offsets the file holds."""
    os.makedirs(index_dir(directory), exist_ok=True)
    path = index_path(directory, stem)
    tmp = path + ".tmp"
    obj: dict = {"bytes": nbytes, "high": [[t, p, o] for (t, p), o in sorted(high.items())]}
    if ranges is not None:
        obj["ranges"] = [[t, p, r.flat()] for (t, p), r in sorted(ranges.items())]
    body = json.dumps(obj)
    with open(tmp, "w", encoding="ascii") as f:
        f.write(body)
    os.replace(tmp, path)


def rename_index(directory: str, old_stem: str, new_stem: str) -> None:
    """The data file was published under another name: its index follows (if it has one)."""
    if old_stem == new_stem:
        return
    try:
        os.replace(index_path(directory, old_stem), index_path(directory, new_stem))
    except FileNotFoundError:
        pass


def merge(into: dict[TP, int], high: Iterable[tuple[TP, int]]) -> None:
    for tp, offset in high:
        if offset > into.get(tp, -1):
            into[tp] = offset


def _read_index(directory: str, stem: str) -> tuple[int, dict[TP, int]] | None:
    try:
        with open(index_path(directory, stem), encoding="ascii") as f:
            obj = json.load(f)
        return int(obj["bytes"]), {(str(t), int(p)): int(o) for t, p, o in obj["high"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_index_ranges(directory: str, stem: str) -> tuple[int, dict[TP, OffsetRanges] | None] | None:
    """``stem``'s index as (bytes, ranges per partition); ranges None for an index written
    without them (by a consumer-group sink); None for no index or an unreadable one."""
    try:
        with open(index_path(directory, stem), encoding="ascii") as f:
            obj = json.load(f)
        nbytes = int(obj["bytes"])
        if "ranges" not in obj:
            return nbytes, None
        return nbytes, {(str(t), int(p)): OffsetRanges.from_flat(flat) for t, p, flat in obj["ranges"]}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stored(path: str, nbytes: int | None):
    """(partition, offset) of each complete line of a data file (its first ``nbytes`` bytes when
    given).  A line that is not a record (a torn last line, foreign text) is skipped: it holds
    nothing this sink wrote durably."""
    with open(path, "rb") as f:
        data = f.read() if nbytes is None else f.read(nbytes)
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        try:
            obj = json.loads(line)
            tp, offset = (obj["topic"], int(obj["partition"])), int(obj["offset"])
        except (ValueError, KeyError, TypeError):
            continue
        yield tp, offset


def scan(path: str, nbytes: int | None = None) -> dict[TP, int]:
    """The highest offset per partition in a data file's complete lines."""
    high: dict[TP, int] = {}
    for tp, offset in _stored(path, nbytes):
        if offset > high.get(tp, -1):
            high[tp] = offset
    return high


def scan_ranges(path: str, nbytes: int | None = None) -> dict[TP, OffsetRanges]:
    """Which offsets per partition a data file's complete lines hold: ``scan`` for a share
    group's sink, where the highest says too little."""
    offsets: dict[TP, list[int]] = {}
    for tp, offset in _stored(path, nbytes):
        offsets.setdefault(tp, []).append(offset)
    out = {}
    for tp, found in offsets.items():
        out[tp] = ranges = OffsetRanges()
        ranges.add_offsets(found)
    return out


def highest_of(ranges: dict[TP, OffsetRanges]) -> dict[TP, int]:
    """The ``high`` of an index written with ranges (so a consumer-group reader reads it too)."""
    return {tp: r.highest() for tp, r in ranges.items() if len(r)}


def _held_by_a_writer(path: str) -> bool:
    """A ``.open`` file a live writer holds (its ``flock``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def directory_high(directory: str, prefix: str, open_suffix: str, done_suffix: str,
                   own_stem: str | None = None) -> dict[TP, int]:
    """The highest durable offset per partition over every data file of ``prefix`` in
    ``directory`` and every index whose data file is gone (removed by retention: what it held
    was stored once).  ``own_stem``: the caller's own current file, whose durable part the
    caller knows best (skipped here)."""
    high: dict[TP, int] = {}
    stems: dict[str, str] = {}   # stem -> data file path
    for name in os.listdir(directory):
        if not name.startswith(prefix + "-"):
            continue
        for suffix in (done_suffix, open_suffix):
            if name.endswith(suffix):
                stems[name[: -len(suffix)]] = os.path.join(directory, name)
                break
    try:
        indexed = {n[:-5] for n in os.listdir(index_dir(directory))
                   if n.endswith(".json") and n.startswith(prefix + "-")}
    except FileNotFoundError:
        indexed = set()
    for stem in indexed - set(stems):
        found = _read_index(directory, stem)
        if found is not None:
            merge(high, found[1].items())
    for stem, path in stems.items():
        if stem == own_stem:
            continue
        found = _read_index(directory, stem)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:       # published or removed meanwhile: its index counts next time
            if found is not None:
                merge(high, found[1].items())
            continue
        held = path.endswith(open_suffix) and _held_by_a_writer(path)
        if found is not None and (found[0] == size or held):
            merge(high, found[1].items())
            continue
        if held:
            continue   # a live writer that has flushed nothing yet (or its first index is on its way)
        try:
            scanned = scan(path)
        except FileNotFoundError:
            continue
        merge(high, scanned.items())
        if not path.endswith(open_suffix):
            try:
                write_index(directory, stem, size, scanned)
            except OSError:
                pass   # read again next time
    return high


def data_files(directory: str, prefix: str, open_suffix: str, done_suffix: str) -> dict[str, tuple[str, int]]:
    """The data files of ``prefix`` in ``directory``: stem -> (file name, inode), one ``scandir``."""
    data: dict[str, tuple[str, int]] = {}
    with os.scandir(directory) as it:
        for entry in it:
            name = entry.name
            if not name.startswith(prefix + "-"):
                continue
            for suffix in (done_suffix, open_suffix):
                if name.endswith(suffix):
                    data[name[: -len(suffix)]] = (name, entry.inode())
                    break
    return data


def index_inodes(directory: str, prefix: str) -> dict[str, int]:
    """The indexes of ``prefix``'s data files: stem -> inode, one ``scandir``."""
    indexes: dict[str, int] = {}
    try:
        with os.scandir(index_dir(directory)) as it:
            for entry in it:
                name = entry.name
                if name.endswith(".json") and name.startswith(prefix + "-"):
                    indexes[name[:-5]] = entry.inode()
    except FileNotFoundError:
        pass
    return indexes


def index_inode(directory: str, stem: str) -> int | None:
    try:
        return os.stat(index_path(directory, stem)).st_ino
    except FileNotFoundError:
        return None


def directory_ranges(directory: str, prefix: str, open_suffix: str, done_suffix: str,
                     own_stem: str | None, seen: dict[str, tuple], data: dict[str, tuple[str, int]],
                     indexes: dict[str, int | None] | None = None) -> dict[TP, OffsetRanges]:
    """A share group's ``directory_high``: which offsets per partition the data files of
    ``prefix`` (``data``, from ``data_files``) and the indexes whose data file is gone hold, read
    only where something changed since the last call.

    ``seen`` (the caller keeps it between calls) maps a stem to what its files were when they
    were read: (data file name, its inode, its index's inode).  A writer replaces its index on
    every flush and a publish renames the data file, so a stem whose names and inodes are the
    same holds nothing new.  ``indexes`` (stem -> its index's inode, None for none): look at
    these stems only (a caller that knows only live writers' indexes can have changed); without
    it every index is listed (one ``scandir``) and a stem whose files are gone leaves ``seen``
    (what it held stays with the caller).  A consumer-group index (no ``ranges``) is not
    enough: its data file is read (and, published, indexed anew with ranges); one whose data
    file is gone says nothing usable and is passed over."""
    found: dict[TP, OffsetRanges] = {}

    def take(ranges: dict[TP, OffsetRanges]) -> None:
        for tp, r in ranges.items():
            into = found.get(tp)
            if into is None:
                found[tp] = r
            else:
                into.update(r)

    if indexes is None:
        indexes = index_inodes(directory, prefix)
        for stem in [s for s in seen if s not in data and s not in indexes]:
            del seen[stem]
        stems = data.keys() | indexes.keys()
    else:
        stems = indexes.keys()
    for stem in stems:
        if stem == own_stem:
            continue
        name, inode = data.get(stem, (None, None))
        signature = (name, inode, indexes.get(stem))
        if seen.get(stem) == signature:
            continue
        index = read_index_ranges(directory, stem) if indexes.get(stem) is not None else None
        if name is None:                      # removed by retention: its index is what is left
            if index is not None and index[1] is not None:
                take(index[1])
            seen[stem] = signature
            continue
        path = os.path.join(directory, name)
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:             # published or removed meanwhile: next time
            continue
        held = name.endswith(open_suffix) and _held_by_a_writer(path)
        if index is not None and (index[0] == size or held):
            if index[1] is not None:
                take(index[1])
                seen[stem] = signature
                continue
            try:
                scanned = scan_ranges(path, index[0])
            except FileNotFoundError:
                continue
            take(scanned)
            if held:
                continue                      # read again once its writer indexes it with ranges
        elif held:
            continue                          # a live writer whose index is on its way
        else:
            try:
                scanned = scan_ranges(path)
            except FileNotFoundError:
                continue
            take(scanned)
        if not name.endswith(open_suffix):
            try:
                write_index(directory, stem, size, highest_of(scanned), scanned)
                # The index just written has a new inode: noted, or the next call reads it again.
                signature = (name, inode, os.stat(index_path(directory, stem)).st_ino)
            except OSError:
                pass                          # read again next time
        seen[stem] = signature
    return found
