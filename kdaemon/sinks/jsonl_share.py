"""The jsonl sink's dedupe in a share group: which offsets the directory holds, not how far.

In a consumer group a partition's offsets rise, so "the highest stored offset" is enough
(``jsonl_index.directory_high``).  In a share group (``SinkContext.group_type == "share"``)
several workers take records of one partition at once, a RELEASEd record comes back later than
its successors, and a record comes again after its lock expired or its worker crashed: the
highest offset would drop records never written.  Here a record is dropped only when its very
offset is stored, and every other is written:

* What is stored, per partition: ``OffsetRanges`` (sorted merged ``[start, end)`` ranges,
  bounded: the lowest are forgotten first, and a forgotten offset counts as not stored, so the
  bound can cost a duplicate, never a record).  ``known`` holds what is durable in the
  directory (this sink's flushes and every other writer's indexes), ``pending`` what this sink
  wrote since its last flush (a record that comes again before the flush is not written twice
  either: the flush that makes the first durable comes before any acknowledgement).
* On disk: each data file's index (``jsonl_index.py``) also carries ``ranges``, the offsets of
  the file's durable part, capped as in memory.  A data file without such an index (a crash
  between the data's fsync and the index's rename, a file a consumer-group sink wrote) is read
  instead, as there.
* Fresh: a crashed worker's records are redelivered to any worker, so before a batch the sink
  looks for what other writers of the directory flushed since its last look: at its first
  batch, then at most every ``REFRESH_INTERVAL_S`` (0.2 s).  A look is two ``stat`` calls when
  neither directory changed (their mtimes; ``_Listing``); after a flush elsewhere, one ``stat``
  of each other writer's open file's index, and only a changed index read; after a file was
  created, published or removed, every data file and index listed again (``refresh``,
  ``jsonl_index.directory_ranges``).  A record another worker flushed less than 0.2 s before it
  comes here again is written twice; so is one whose lock expired while its first worker's
  flush was still running.  Both are duplicates the share group's at-least-once allows (a
  redelivery after a crash waits for the lock: ``share.record.lock.duration.ms``, 30 s by
  default, never below the broker's ``group.share.min.record.lock.duration.ms``), never a loss.
* One group type per directory and prefix: a consumer-group sink reads a share-mode index's
  ``high`` (kept for it) and would drop records below it that the share group never wrote (one
  still in flight when the daemon was switched over); a share-mode sink reads a consumer-group
  file by its lines.  Give a daemon switched from one to the other a new ``prefix``.
* Retention: indexes of removed data files are kept, as in a consumer group (a record of a
  removed file that comes again is still skipped), and read when a sink starts; afterwards
  they are listed only when a data file comes or goes.  Measured with 5,000 of them and 8
  writers: a look after another writer's flush 0.15-0.26 ms, a full listing 70 ms.  Removing
  old indexes with their data files loses only the dedupe of records that old.

Cost, ``python bench/share/jsonl_dedupe.py`` (100,000 records of 200 B in batches of 500 on 2
partitions, a flush every 10 batches, fsync off so the disk does not hide the difference, CPU
per record, best of 5 rounds).  On a quiet machine (2026-12-02 07:30 UTC): the dedupe decision
(which records to write, and noting them) 0.26 µs a record in both modes; the whole write path
7.5 µs in both in order (encoding is most of it), share mode 3.9% less shuffled, 9.1% less with
10% delivered again (skipped, not written), 4.5% more with two writers on one directory (each
takes in the other's flushes), 3.4% less beside 300 old files.  Earlier runs at a load average
of 17-20 ranged from 13% faster to 18% slower with no consistent sign.  With fsync on, both
wait for the disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from itertools import groupby
from operator import attrgetter

from ..plugins.types import Record
from .jsonl_index import TP, data_files, directory_ranges, index_dir, index_inode
from .offset_ranges import DEFAULT_LIMIT, OffsetRanges, runs


# A directory's mtime comes from a coarse clock (a kernel tick): a change within the same tick as
# a listing may leave it unchanged.  A listing made less than this after the mtime it saw is
# therefore made again at the next look, whatever the mtime says then.
_MTIME_MARGIN_NS = 1_000_000_000
# How often a sink looks at most for other writers' flushes (see the module docstring).
REFRESH_INTERVAL_S = 0.2


class _Listing:
    """When a directory was last listed, and whether its mtime can tell of later changes."""

    __slots__ = ("mtime", "sure")

    def __init__(self) -> None:
        self.mtime: int | None = None
        self.sure = False

    def stale(self, path: str) -> bool:
        """Whether ``path`` must be listed again (noting what its mtime is now)."""
        try:
            mtime = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self.mtime and self.sure:
            return False
        self.mtime = mtime
        self.sure = mtime is None or time.time_ns() - mtime > _MTIME_MARGIN_NS
        return True


class SharedOffsets:
    """What a share-group jsonl sink knows is stored: per partition, which offsets."""

    def __init__(self, directory: str, prefix: str, open_suffix: str, done_suffix: str,
                 limit: int = DEFAULT_LIMIT, *, clock: Callable[[], float] = time.monotonic,
                 refresh_interval_s: float = REFRESH_INTERVAL_S) -> None:
        self.directory = directory
        self._clock = clock
        self.refresh_interval_s = refresh_interval_s
        self._refreshed: float | None = None        # when the directory was last looked at
        self.prefix = prefix
        self.suffixes = (open_suffix, done_suffix)
        self.limit = limit
        self.known: dict[TP, OffsetRanges] = {}     # durable in the directory
        self.pending: dict[TP, OffsetRanges] = {}   # written by this sink since its last sync
        self.file: dict[TP, OffsetRanges] = {}      # the current file's durable part
        self._seen: dict[str, tuple] = {}           # jsonl_index.directory_ranges's memory
        self._data: dict[str, tuple[str, int]] = {}   # the data files, as last listed
        self._data_listing = _Listing()
        self._index_listing = _Listing()

    def _ranges(self, into: dict[TP, OffsetRanges], tp: TP) -> OffsetRanges:
        r = into.get(tp)
        if r is None:
            r = into[tp] = OffsetRanges(self.limit)
        return r

    def refresh(self, own_stem: str | None) -> None:
        """Take in what the directory's other files hold now (OSError if it cannot be read):
        at the first call, then at most every ``refresh_interval_s``.

        Two ``stat`` calls when neither directory changed.  When the data files' directory did
        (a file created, published or removed) every data file and index is listed again (two
        ``scandir``).  When only the indexes' did (a flush), only the indexes of the other
        writers' open files are looked at (one ``stat`` each): a published file's index does
        not change, and one whose data file is gone was read while it was there."""
        now = self._clock()
        if self._refreshed is not None and now - self._refreshed < self.refresh_interval_s:
            return
        self._refreshed = now
        open_suffix, done_suffix = self.suffixes
        indexes = index_dir(self.directory)
        relist = self._data_listing.stale(self.directory)
        flushed = self._index_listing.stale(indexes)
        if relist:
            self._data = data_files(self.directory, self.prefix, open_suffix, done_suffix)
            found = directory_ranges(self.directory, self.prefix, open_suffix, done_suffix, own_stem,
                                     self._seen, self._data)
        elif flushed:
            live = {stem: index_inode(self.directory, stem) for stem, (name, _) in self._data.items()
                    if name.endswith(open_suffix) and stem != own_stem}
            found = directory_ranges(self.directory, self.prefix, open_suffix, done_suffix, own_stem,
                                     self._seen, self._data, live)
        else:
            return
        for tp, ranges in found.items():
            self._ranges(self.known, tp).update(ranges)

    def not_stored(self, records: Sequence[Record], own_stem: str | None
                   ) -> tuple[Sequence[Record], list[int] | None, dict[TP, list[tuple[int, int]]]]:
        """The records whose offsets are neither stored nor written since the last flush (nor
        earlier in this batch), (when some were dropped) the index in ``records`` of each one
        kept, and the kept offsets as runs per partition (for ``written``).  In the usual case
        (nothing to drop, each partition's offsets one run) one pass in C over the batch and one
        range look-up per partition."""
        self.refresh(own_stem)
        by_tp: dict[TP, list[int]] = {}
        for tp, group in groupby(records, _TP):
            offsets = list(map(_OFFSET, group))
            had = by_tp.get(tp)
            if had is None:
                by_tp[tp] = offsets
            else:
                had.extend(offsets)
        clean = True
        spans: dict[TP, list[tuple[int, int]]] = {}
        for tp, offsets in by_tp.items():
            low, high = min(offsets), max(offsets)
            known, pending = self.known.get(tp), self.pending.get(tp)
            distinct = len(set(offsets))
            if ((known is not None and known.overlaps(low, high))
                    or (pending is not None and pending.overlaps(low, high))
                    or distinct != len(offsets)):
                clean = False
                break
            spans[tp] = [(low, high + 1)] if high - low + 1 == distinct else runs(offsets)
        if clean:
            return records, None, spans
        empty = OffsetRanges(1)
        kept: list[int] = []
        taken: set[tuple[TP, int]] = set()
        for i, r in enumerate(records):
            tp, offset = (r.topic, r.partition), r.offset
            if (offset in self.known.get(tp, empty) or offset in self.pending.get(tp, empty)
                    or (tp, offset) in taken):
                continue
            taken.add((tp, offset))
            kept.append(i)
        records = [records[i] for i in kept]
        return records, kept, spans_of(records)

    def written(self, spans: dict[TP, list[tuple[int, int]]]) -> None:
        """Records with these offsets are in the current file's buffer now (durable at the
        next sync)."""
        for tp, pairs in spans.items():
            ranges = self._ranges(self.pending, tp)
            for start, end in pairs:
                ranges.add(start, end)

    def opened(self) -> None:
        """A new current file: it holds nothing yet."""
        self.file = {}

    def lost(self) -> None:
        """What was written since the last sync is gone (a failed write or flush)."""
        self.pending = {}

    def synced(self) -> dict[TP, OffsetRanges] | None:
        """Everything written is durable: it counts as stored.  Returns the current file's
        ranges for its index, None when nothing was written since the last sync."""
        if not self.pending:
            return None
        for tp, ranges in self.pending.items():
            self._ranges(self.known, tp).update(ranges)
            self._ranges(self.file, tp).update(ranges)
        self.pending = {}
        return self.file


_TP = attrgetter("topic", "partition")
_OFFSET = attrgetter("offset")


def spans_of(records: Sequence[Record]) -> dict[TP, list[tuple[int, int]]]:
    """The offsets of ``records`` as runs per partition."""
    by_tp: dict[TP, list[int]] = {}
    for r in records:
        by_tp.setdefault((r.topic, r.partition), []).append(r.offset)
    return {tp: runs(offsets) for tp, offsets in by_tp.items()}
