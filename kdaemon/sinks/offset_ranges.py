"""A set of offsets kept as sorted, disjoint, merged half-open ranges, with a size bound.

The jsonl sink in a share group (``jsonl_share.py``) must know *which* offsets of a partition it
stored, not only the highest: records arrive out of order there, and one may come again after a
lock expiry or a crash.  Written offsets come in runs (a member acquires whole batches), so a
partition's set is a handful of ranges, merged as they touch.

Bounded: past ``limit`` ranges the lowest are forgotten (``floor`` rises).  Forgetting errs on
the safe side: an offset below the floor counts as *not* stored, so a record there is written
(again, perhaps), never dropped.  Why the lowest is the right end to forget: a share group can
deliver again only records in a partition's in-flight window, between its start offset (SPSO)
and end offset, and the broker keeps that window to ``share.partition.max.record.locks``
offsets (``group.share.partition.max.record.locks``, default 2000): the written offsets inside
it make at most that many ranges, all above any range further down.

Pure: no files, no clock.  Offsets in ``array('q')`` (16 bytes a range).
"""

from __future__ import annotations

import heapq
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

DEFAULT_LIMIT = 65536   # ranges per partition: 1 MiB, far above any in-flight window


class OffsetRanges:
    """Offsets as ``[start, end)`` ranges, sorted and merged (touching ranges become one)."""

    __slots__ = ("starts", "ends", "limit", "floor")

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit!r}")
        self.starts = array("q")
        self.ends = array("q")
        self.limit = limit
        self.floor = 0          # offsets below were forgotten (or never seen): not known stored

    def __len__(self) -> int:
        return len(self.starts)

    def __contains__(self, offset: int) -> bool:
        i = bisect_right(self.starts, offset) - 1
        return i >= 0 and offset < self.ends[i]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OffsetRanges) and self.starts == other.starts and self.ends == other.ends

    def __repr__(self) -> str:
        return f"OffsetRanges({self.pairs()!r})"

    def pairs(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))

    def highest(self) -> int:
        """The highest offset held, -1 if none."""
        return self.ends[-1] - 1 if self.ends else -1

    def overlaps(self, low: int, high: int) -> bool:
        """Whether any offset in ``[low, high]`` (both included) is held."""
        i = bisect_right(self.ends, low)      # the first range ending past low
        return i < len(self.starts) and self.starts[i] <= high

    def add(self, start: int, end: int) -> None:
        """Hold ``[start, end)`` too."""
        if end <= start:
            return
        starts, ends = self.starts, self.ends
        i = bisect_left(ends, start)          # the first range ending at or past start: touches
        j = bisect_right(starts, end)         # ranges starting at or before end: touch too
        if i < j:
            start = min(start, starts[i])
            end = max(end, ends[j - 1])
            starts[i:j] = array("q", (start,))
            ends[i:j] = array("q", (end,))
        else:
            starts.insert(i, start)
            ends.insert(i, end)
            if len(starts) > self.limit:
                self._trim()

    def add_offsets(self, offsets: Iterable[int]) -> None:
        """Hold each of ``offsets`` (any order; consecutive ones become one range)."""
        for start, end in runs(offsets):
            self.add(start, end)

    def update(self, other: OffsetRanges) -> None:
        """Hold ``other``'s offsets too: range by range when it has few, else one merge of the
        two sorted lists (adding many ranges one by one would move the arrays each time)."""
        if len(other) <= 8:
            for start, end in zip(other.starts, other.ends):
                self.add(start, end)
            return
        merged_starts, merged_ends = array("q"), array("q")
        a = zip(self.starts, self.ends)
        b = zip(other.starts, other.ends)
        for start, end in heapq.merge(a, b):
            if merged_ends and start <= merged_ends[-1]:
                if end > merged_ends[-1]:
                    merged_ends[-1] = end
            else:
                merged_starts.append(start)
                merged_ends.append(end)
        self.starts, self.ends = merged_starts, merged_ends
        if len(merged_starts) > self.limit:
            self._trim()

    def _trim(self) -> None:
        drop = len(self.starts) - self.limit
        self.floor = max(self.floor, self.ends[drop - 1])
        del self.starts[:drop]
        del self.ends[:drop]

    # -- as stored in an index file: [start0, end0, start1, end1, ...] -----------------------------

    def flat(self) -> list[int]:
        out: list[int] = []
        for start, end in zip(self.starts, self.ends):
            out.append(start)
            out.append(end)
        return out

    @classmethod
    def from_flat(cls, flat: Sequence[int], limit: int = DEFAULT_LIMIT) -> OffsetRanges:
        """The inverse of ``flat``; ValueError for anything that is not pairs of integers."""
        if len(flat) % 2:
            raise ValueError("ranges must be pairs of offsets")
        ranges = cls(limit)
        for k in range(0, len(flat), 2):
            start, end = flat[k], flat[k + 1]
            if type(start) is not int or type(end) is not int:
                raise ValueError(f"ranges must be integers, not {start!r}, {end!r}")
            ranges.add(start, end)
        return ranges


def runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """``offsets`` as sorted ``[start, end)`` runs of consecutive offsets (duplicates merge)."""
    out: list[tuple[int, int]] = []
    start = end = None
    for o in sorted(offsets):
        if end is not None and o <= end:
            if o == end:
                end += 1
            continue
        if start is not None:
            out.append((start, end))
        start, end = o, o + 1
    if start is not None:
        out.append((start, end))
    return out
