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
* Fresh: before each batch the sink looks for what other writers of the directory flushed
  since (a crashed worker's records are redelivered to any worker): two ``scandir`` calls and
  no ``stat`` when nothing changed, and only the changed indexes read when something did
  (``jsonl_index.directory_ranges``).  A record flushed by another worker whose index this
  sink has not yet seen is written twice: a duplicate, as the share group's at-least-once
  allows, never a loss.

Cost (``scripts/bench_jsonl_share.py``, 2 cores shared with other work, 200,000 records of
200 bytes in batches of 500 on 2 partitions, fsync off so the disk does not drown the
difference): the share-mode write path costs about 7% more CPU than the consumer-group path
(1.33 against 1.24 µs a record, for write alone, encoding included); with fsync on both are
bound by the disk.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..plugins.types import Record
from .jsonl_index import TP, directory_ranges
from .offset_ranges import DEFAULT_LIMIT, OffsetRanges

log = logging.getLogger(__name__)


class SharedOffsets:
    """What a share-group jsonl sink knows is stored: per partition, which offsets."""

    def __init__(self, directory: str, prefix: str, open_suffix: str, done_suffix: str,
                 limit: int = DEFAULT_LIMIT) -> None:
        self.directory = directory
        self.prefix = prefix
        self.suffixes = (open_suffix, done_suffix)
        self.limit = limit
        self.known: dict[TP, OffsetRanges] = {}     # durable in the directory
        self.pending: dict[TP, OffsetRanges] = {}   # written by this sink since its last sync
        self.file: dict[TP, OffsetRanges] = {}      # the current file's durable part
        self._seen: dict[str, tuple] = {}           # jsonl_index.directory_ranges's memory

    def _ranges(self, into: dict[TP, OffsetRanges], tp: TP) -> OffsetRanges:
        r = into.get(tp)
        if r is None:
            r = into[tp] = OffsetRanges(self.limit)
        return r

    def refresh(self, own_stem: str | None) -> None:
        """Take in what the directory's other files hold now (OSError if it cannot be read)."""
        open_suffix, done_suffix = self.suffixes
        found = directory_ranges(self.directory, self.prefix, open_suffix, done_suffix, own_stem, self._seen)
        for tp, ranges in found.items():
            self._ranges(self.known, tp).update(ranges)

    def not_stored(self, records: Sequence[Record], own_stem: str | None
                   ) -> tuple[Sequence[Record], list[int] | None]:
        """The records whose offsets are neither stored nor written since the last flush (nor
        earlier in this batch), and (when some were dropped) the index in ``records`` of each
        one kept.  One pass and one range look-up per partition when nothing is dropped."""
        self.refresh(own_stem)
        by_tp: dict[TP, list[int]] = {}
        for r in records:
            tp = (r.topic, r.partition)
            offsets = by_tp.get(tp)
            if offsets is None:
                by_tp[tp] = [r.offset]
            else:
                offsets.append(r.offset)
        clean = True
        for tp, offsets in by_tp.items():
            low, high = min(offsets), max(offsets)
            known, pending = self.known.get(tp), self.pending.get(tp)
            if ((known is not None and known.overlaps(low, high))
                    or (pending is not None and pending.overlaps(low, high))
                    or len(set(offsets)) != len(offsets)):
                clean = False
                break
        if clean:
            return records, None
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
        return [records[i] for i in kept], kept

    def written(self, records: Sequence[Record]) -> None:
        """``records`` are in the current file's buffer now (durable at the next sync)."""
        by_tp: dict[TP, list[int]] = {}
        for r in records:
            by_tp.setdefault((r.topic, r.partition), []).append(r.offset)
        for tp, offsets in by_tp.items():
            self._ranges(self.pending, tp).add_offsets(offsets)

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
