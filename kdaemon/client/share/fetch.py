"""One partition of a ShareFetch answer, decoded: the member's records and the offsets it settles itself.

A ShareFetch answer holds whole record batches, of which only the ``acquired_records`` ranges
are this member's (invariant 47).  The batches are read by the same ``RecordSetReader`` as a
Fetch's, filter-first: the header filter runs on raw headers, and with ``HeaderRules`` in the C
loop a record it drops never becomes a Python object (invariant 2).  Every acquired offset then
ends in exactly one of three places:

* a **record** handed to the application, as a ``ShareRecord`` carrying its delivery count;
* **ACCEPT**, settled by the consumer: a record the header filter dropped.  It was delivered to
  this member and this member does not want it: accepted, it is never delivered again (Java has
  no header filter; kdaemon's Consumer advances its position past such records the same way);
* **GAP**, settled by the consumer: an acquired offset with no record behind it (a control
  batch, a record compaction removed), as Java's ``ShareCompletedFetch`` does.

Telling a dropped record from a hole in a batch: the filter's count says how many records of
the batch it dropped; a batch without holes (record count = last - base + 1, the usual case)
has a record at every offset, so every acquired offset not returned was dropped.  Only for a
batch with holes *and* dropped records are the batch's record offsets read again, offsets only
(``batch_record_offsets``).

A batch that cannot be read (``CorruptRecordError``) makes the rest of the answer's acquired
offsets REJECT, as Java rejects a corrupt batch (delivered again, it would fail again); a header
filter that raises makes them RELEASE (the bytes were fine, the filter was not).  The error is
raised after the records before it were handed out.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from ...protocol.errors import CorruptRecordError
from ...protocol.records import HeaderFilter, HeaderFilterError, RecordSetReader, batch_record_offsets
from ..types import TopicPartition
from .types import GAP, AcknowledgeType, ShareRecord, new_share_record

_V2_BOUNDS = struct.Struct(">q8xbxxxxhi")   # base_offset, magic, attributes, last_offset_delta
_COUNT = struct.Struct(">i")
_ATTR_CONTROL = 0x20


@dataclass
class DecodedPartition:
    records: list[ShareRecord] = field(default_factory=list)
    settled: list[tuple[int, int]] = field(default_factory=list)   # (offset, GAP or ACCEPT ...)
    filtered: int = 0
    error: Exception | None = None


class Acquired:
    """The acquired ranges of one answer: is an offset in them, and with what delivery count."""

    __slots__ = ("firsts", "ranges")

    def __init__(self, ranges: list[dict]) -> None:
        self.ranges = sorted((r["first_offset"], r["last_offset"], r["delivery_count"]) for r in ranges)
        self.firsts = [r[0] for r in self.ranges]

    def count(self, offset: int) -> int | None:
        """The delivery count of ``offset``, None when it is not acquired."""
        i = bisect.bisect_right(self.firsts, offset) - 1
        if i >= 0 and offset <= self.ranges[i][1]:
            return self.ranges[i][2]
        return None

    def offsets(self):
        for first, last, _ in self.ranges:
            yield from range(first, last + 1)

    def within(self, first: int, last: int):
        """The acquired offsets in ``first..last``."""
        for lo, hi, _ in self.ranges:
            if hi < first or lo > last:
                continue
            yield from range(max(lo, first), min(hi, last) + 1)


def decode_partition(tp: TopicPartition, data: dict, *, header_filter: HeaderFilter | None,
                     check_crcs: bool, max_uncompressed: int,
                     on_filtered: Callable[[list], None] | None = None) -> DecodedPartition:
    """This member's part of one partition's answer (see the module docstring)."""
    out = DecodedPartition()
    acquired = Acquired(data["acquired_records"])
    if not acquired.ranges:
        return out
    raw = data["records"]
    done: set[int] = set()
    told = None
    if on_filtered is not None:
        def told(dropped: list) -> None:   # this member's records only: the others' are not its to report
            mine = [r for r in dropped if acquired.count(r.offset) is not None]
            if mine:
                on_filtered(mine)
    reader = RecordSetReader(raw, topic=tp.topic, partition=tp.partition, fetch_offset=acquired.firsts[0],
                             header_filter=header_filter, check_crcs=check_crcs, on_filtered=told,
                             max_uncompressed_batch_bytes=max_uncompressed)
    try:
        while True:
            before = reader.filtered
            batch = reader.read_batch()
            if batch is None:
                break
            kept = set()
            for r in batch:
                count = acquired.count(r.offset)
                if count is not None:
                    out.records.append(new_share_record(ShareRecord, (*r, count)))
                    kept.add(r.offset)
            done |= kept
            dropped = reader.filtered - before
            out.filtered += dropped
            _settle_batch(raw, reader, acquired, kept, dropped, max_uncompressed, out, done)
    except (CorruptRecordError, HeaderFilterError) as exc:
        kind = AcknowledgeType.REJECT if isinstance(exc, CorruptRecordError) else AcknowledgeType.RELEASE
        out.error = exc.located(tp.topic, tp.partition) if isinstance(exc, CorruptRecordError) and exc.topic is None else exc
        out.settled += [(o, int(kind)) for o in acquired.offsets() if o not in done]
        return out
    # Acquired offsets the record set had nothing at (Java: "any remaining acquired records are gaps").
    out.settled += [(o, GAP) for o in acquired.offsets() if o not in done]
    return out


def _settle_batch(raw, reader: RecordSetReader, acquired: Acquired, kept: set[int], dropped: int,
                  max_uncompressed: int, out: DecodedPartition, done: set[int]) -> None:
    """The acquired offsets of the batch just read that were not returned: ACCEPT the dropped
    records, GAP the rest."""
    start, end = reader.last_batch_span
    if raw[start + 16] != 2:
        # A legacy (magic 0/1) message set, which Kafka 4 no longer writes: its offsets not
        # returned are left to the end, GAP.
        return
    base, _, attributes, last_delta = _V2_BOUNDS.unpack_from(raw, start)
    last = base + last_delta
    missing = [o for o in acquired.within(base, last) if o not in kept]
    if not missing:
        return
    if attributes & _ATTR_CONTROL or not dropped:
        settled = [(o, GAP) for o in missing]
    elif _COUNT.unpack_from(raw, start + 57)[0] == last - base + 1:
        settled = [(o, int(AcknowledgeType.ACCEPT)) for o in missing]   # no holes: all dropped
    else:
        records = set(batch_record_offsets(raw, start, end, max_uncompressed))
        settled = [(o, int(AcknowledgeType.ACCEPT) if o in records else GAP) for o in missing]
    out.settled += settled
    done.update(missing)
