"""Record sets: RecordBatch v2 and legacy message sets (magic 0/1), decoded filter-first.

RecordBatch v2 layout (byte offsets from the start of the batch)::

     0 base_offset             int64
     8 batch_length            int32   bytes that follow this field
    12 partition_leader_epoch  int32
    16 magic                   int8    2 (legacy sets have magic 0/1 at this same offset)
    17 crc                     uint32  CRC-32C of every byte from attributes to the batch end
    21 attributes              int16   bits 0-2 codec, 3 timestamp type, 4 transactional,
                                       5 control, 6 has delete horizon
    23 last_offset_delta       int32
    27 base_timestamp          int64
    35 max_timestamp           int64
    43 producer_id             int64
    51 producer_epoch          int16
    53 base_sequence           int32
    57 record_count            int32
    61 records                 (compressed as a whole when the codec is not none)

Record::

    length varint | attributes int8 | timestamp_delta varlong | offset_delta varint |
    key_length varint | key | value_length varint | value | header_count varint |
    [header_key_length varint | header_key utf-8 | header_value_length varint | header_value]

The record loop decodes the headers first-class and hands them to the header filter *before*
key and value are sliced out of the payload, so a dropped record costs a walk over its varints
and headers and nothing else.  Offsets are what the Java consumer does with them: the position
after a record set is the last complete batch's last offset + 1, whatever the filter, the
control markers or read_committed removed from it (seed 004: a filtered record still advances
the position, and so the committed offset).
"""

from __future__ import annotations

import heapq
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import NamedTuple

from crc32c import crc32c

from . import compression, record_loop
from .errors import CorruptRecordError, DecodeError
from .primitives import decode_varint, decode_varlong
from .record_loop import (CREATE_TIME, LOG_APPEND_TIME, NO_TIMESTAMP_TYPE, ConsumerRecord, HeaderFilter,  # noqa: F401
                          Headers, new_record)


_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = _BATCH_HEADER.size  # 61
_LOG_OVERHEAD = 12  # base_offset int64 + length int32
_MIN_V2_LENGTH = BATCH_HEADER_SIZE - _LOG_OVERHEAD
_OFFSET_LENGTH = struct.Struct(">qi")
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21

_ATTR_CODEC = 0x07
_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20

_CONTROL_KEY = struct.Struct(">hh")
CONTROL_ABORT = 0
CONTROL_COMMIT = 1

# Legacy message (magic 0/1) after offset and size: crc uint32, magic int8, attributes int8,
# [timestamp int64 for magic 1], key bytes(int32 length), value bytes(int32 length).
_LEGACY_V0 = struct.Struct(">Ibb")
_LEGACY_V1 = struct.Struct(">Ibbq")
_I32 = struct.Struct(">i")


class BatchInfo(NamedTuple):
    """The header fields of one v2 batch, for read_committed bookkeeping and tools."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _ATTR_CONTROL)

    @property
    def codec(self) -> int:
        return self.attributes & _ATTR_CODEC


class HeaderFilterError(Exception):
    """A header filter raised.  Kept apart from CorruptRecordError: the bytes were fine, the
    filter (often a plugin's) was not; the original exception is the ``__cause__``."""


def _guard_filter(fn: HeaderFilter) -> HeaderFilter:
    def guarded(headers):
        try:
            return fn(headers)
        except Exception as exc:
            raise HeaderFilterError(f"header filter {fn!r} raised {type(exc).__name__}: {exc}") from exc
    guarded.__wrapped__ = fn  # type: ignore[attr-defined]
    return guarded


class AbortedTransactions:
    """read_committed bookkeeping across the batches of one partition's record set.

    The broker sends (producer_id, first_offset) for every transaction aborted within the fetched
    range.  A transactional batch is hidden while its producer has an aborted transaction that
    started at or before the batch; the producer's ABORT control marker ends that state.
    """

    __slots__ = ("_pending", "_aborted_producers")

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        self._pending = [(first, pid) for pid, first in aborted]
        heapq.heapify(self._pending)
        self._aborted_producers: set[int] = set()

    def batch_is_aborted(self, batch: BatchInfo, abort_marker: bool) -> bool:
        pending = self._pending
        while pending and pending[0][0] <= batch.last_offset:
            self._aborted_producers.add(heapq.heappop(pending)[1])
        if abort_marker:
            self._aborted_producers.discard(batch.producer_id)
            return False
        return batch.is_transactional and batch.producer_id in self._aborted_producers


class RecordSetReader:
    """Decodes one partition's record set batch by batch.

    Pure: bytes in, records out.  ``read_batch`` returns the next batch's surviving records (an
    empty list when everything in it was filtered, aborted or control) or ``None`` at the end, so
    a fetcher can stop early for ``max_poll_records`` and resume later without decoding twice.

    After reading, ``next_offset`` is the position to fetch from next; ``truncated`` is set when
    the set ended in a partial batch (normal: brokers cut record sets at a byte limit).

    ``on_filtered``: given the records ``header_filter`` dropped, a list per batch, in offset
    order.  A record dropped inside the record loop never becomes an object, so a batch the
    filter dropped records of is decoded a second time without it and the dropped ones are
    handed over: 1.95-2.8 µs of CPU a record against 1.05 µs without ``on_filtered`` (bench/consume
    filter mode, ``kdaemon-told``, 90% dropped; docs/PERFORMANCE.md), where running the filter in
    Python on built records cost 4.45 µs.  Counts, positions and what ``read_batch`` returns are the same either
    way.
    """

    __slots__ = ("_data", "_pos", "_end", "topic", "partition", "fetch_offset", "_filter",
                 "_v2_filter", "_observed", "_check_crcs", "_aborted", "_max_uncompressed", "next_offset", "truncated",
                 "filtered", "control", "aborted", "batches", "last_batch", "last_batch_span")

    def __init__(self, data, *, topic: str, partition: int, fetch_offset: int,
                 header_filter: HeaderFilter | None = None, check_crcs: bool = True,
                 aborted_transactions: Iterable[tuple[int, int]] | None = None,
                 max_uncompressed_batch_bytes: int = compression.DEFAULT_MAX_UNCOMPRESSED,
                 on_filtered: Callable[[list[ConsumerRecord]], None] | None = None) -> None:
        self._data = data
        self._pos = 0
        self._end = len(data) if data is not None else 0
        self.topic = topic
        self.partition = partition
        self.fetch_offset = fetch_offset
        # A filter that can be evaluated natively (header_match.HeaderRules) is passed to the C
        # loop as data; anything else is called with the decoded header list.
        native = getattr(header_filter, "native_rules", None) if ACCELERATED else None
        guarded = None if header_filter is None else _guard_filter(header_filter)
        self._filter = guarded
        self._v2_filter = native if native is not None else guarded
        self._observed = None
        if on_filtered is not None and guarded is not None:
            self._observed = (guarded, on_filtered)
            self._filter = None   # a legacy message set is filtered in _read_legacy, on built records
        self._check_crcs = check_crcs
        self._aborted = None if aborted_transactions is None else AbortedTransactions(aborted_transactions)
        self._max_uncompressed = max_uncompressed_batch_bytes
        self.next_offset = fetch_offset
        self.truncated = False
        self.filtered = 0
        self.control = 0
        self.aborted = 0
        self.batches = 0
        self.last_batch: BatchInfo | None = None
        # Where the batch the last read_batch() read lies in the record set (start, end): a
        # share consumer looks at its offsets again when the filter dropped records of a batch
        # with holes (batch_record_offsets), to tell a dropped record from a compacted-away one.
        self.last_batch_span: tuple[int, int] | None = None

    def read_all(self) -> list[ConsumerRecord]:
        out: list[ConsumerRecord] = []
        while (batch := self.read_batch()) is not None:
            out += batch
        return out

    def read_batch(self) -> list[ConsumerRecord] | None:
        data, pos, end = self._data, self._pos, self._end
        if end - pos < _LOG_OVERHEAD:
            self.truncated = end > pos
            self._pos = end
            return None
        base_offset, length = _OFFSET_LENGTH.unpack_from(data, pos)
        batch_end = pos + _LOG_OVERHEAD + length
        if length < 0:
            raise self._corrupt(f"negative batch length {length}", base_offset)
        if batch_end > end:
            # A partial batch at the end of a fetch response is how brokers cut record sets at
            # a byte limit; the next fetch starts at this batch again.
            self.truncated = True
            self._pos = end
            return None
        if length < 5:
            raise self._corrupt(f"batch length {length} is too small for any format", base_offset)
        magic = data[pos + 16]
        self._pos = batch_end
        self.batches += 1
        self.last_batch_span = (pos, batch_end)
        try:
            if magic == 2:
                return self._read_v2(data, pos, batch_end, base_offset, length)
            if magic in (0, 1):
                return self._read_legacy(data, pos, batch_end, base_offset)
        except CorruptRecordError as exc:
            if exc.topic is None:
                raise CorruptRecordError(exc.reason, topic=self.topic, partition=self.partition,
                                         offset=exc.offset if exc.offset is not None else base_offset) from None
            raise
        raise self._corrupt(f"unknown magic byte {magic}", base_offset)

    def _corrupt(self, reason: str, offset: int | None) -> CorruptRecordError:
        return CorruptRecordError(reason, topic=self.topic, partition=self.partition, offset=offset)

    # -- v2 ------------------------------------------------------------------------------------

    def _read_v2(self, data, pos: int, batch_end: int, base_offset: int, length: int):
        if length < _MIN_V2_LENGTH:
            raise self._corrupt(f"v2 batch length {length} is below the header size", base_offset)
        (_, _, leader_epoch, _, crc, attributes, last_offset_delta, base_timestamp, max_timestamp,
         producer_id, producer_epoch, base_sequence, count) = _BATCH_HEADER.unpack_from(data, pos)
        if self._check_crcs:
            actual = crc32c(data[pos + _ATTRIBUTES_OFFSET:batch_end])
            if actual != crc:
                raise self._corrupt(f"CRC-32C mismatch: stored {crc:#010x}, computed {actual:#010x}",
                                    base_offset)
        if count < 0 or last_offset_delta < 0:
            raise self._corrupt(f"record count {count} / last offset delta {last_offset_delta} invalid",
                                base_offset)
        last_offset = base_offset + last_offset_delta
        info = BatchInfo(base_offset, last_offset, leader_epoch, attributes, base_timestamp,
                         max_timestamp, producer_id, producer_epoch, base_sequence, count)
        self.last_batch = info
        if last_offset + 1 > self.next_offset:
            self.next_offset = last_offset + 1
        if last_offset < self.fetch_offset:
            return []  # wholly before the position (e.g. a compacted batch's old part)

        codec = attributes & _ATTR_CODEC
        payload_start = pos + BATCH_HEADER_SIZE
        if codec:
            payload = compression.decompress(codec, data[payload_start:batch_end], self._max_uncompressed)
            start, stop = 0, len(payload)
        else:
            payload = bytes(data[payload_start:batch_end])
            start, stop = 0, len(payload)

        if attributes & _ATTR_CONTROL:
            return self._read_control(info, payload, count)
        if self._aborted is not None and self._aborted.batch_is_aborted(info, False):
            self.aborted += count
            return []

        if count > (stop - start) // 7 + 1:
            raise self._corrupt(f"record count {count} cannot fit in {stop - start} payload bytes",
                                base_offset)
        log_append = bool(attributes & _ATTR_TIMESTAMP_TYPE)
        out: list[ConsumerRecord] = []
        batch = (payload, start, count, base_offset, base_timestamp, max_timestamp if log_append else None,
                 LOG_APPEND_TIME if log_append else CREATE_TIME, None if leader_epoch < 0 else leader_epoch,
                 self.topic, self.partition, self.fetch_offset)
        try:
            pos_after, filtered = _decode_v2_records(*batch, self._v2_filter, out)
        except (IndexError, ValueError, UnicodeDecodeError, DecodeError) as exc:
            # DecodeError: the loop's fallback for varints of three bytes or more is the shared
            # primitives decoder, which reports over-long or unterminated varints that way.
            raise self._corrupt(f"record inside the batch is malformed: {type(exc).__name__}: {exc}",
                                base_offset) from None
        if pos_after != stop:
            raise self._corrupt(f"{stop - pos_after} bytes left over after {count} records", base_offset)
        self.filtered += filtered
        if filtered and self._observed is not None:
            every: list[ConsumerRecord] = []
            _decode_v2_records(*batch, None, every)
            kept = {r.offset for r in out}
            self._observed[1]([r for r in every if r.offset not in kept])
        return out

    def _read_control(self, info: BatchInfo, payload: bytes, count: int) -> list:
        self.control += count
        abort_marker = False
        if count:
            try:
                _, p = decode_varint(payload, 0)           # record length
                p += 1                                      # attributes
                _, p = decode_varlong(payload, p)           # timestamp delta
                _, p = decode_varint(payload, p)            # offset delta
                key_len, p = decode_varint(payload, p)
                if key_len < 4 or p + 4 > len(payload):
                    raise CorruptRecordError("control record key is shorter than 4 bytes")
                _, kind = _CONTROL_KEY.unpack_from(payload, p)
            except CorruptRecordError:
                raise
            except Exception as exc:
                raise self._corrupt(f"control record is malformed: {exc}", info.base_offset) from None
            abort_marker = kind == CONTROL_ABORT
        if self._aborted is not None:
            self._aborted.batch_is_aborted(info, abort_marker)
        return []

    # -- legacy (magic 0 and 1) ----------------------------------------------------------------

    def _read_legacy(self, data, pos: int, end: int, offset: int):
        out: list[ConsumerRecord] = []
        self._legacy_message(data, pos, end, offset, out, depth=0)
        if self._observed is None or not out:
            return out
        keeps, on_filtered = self._observed
        kept: list[ConsumerRecord] = []
        dropped: list[ConsumerRecord] = []
        for r in out:
            (kept if keeps(r.headers) else dropped).append(r)
        if dropped:
            self.filtered += len(dropped)
            on_filtered(dropped)
        return kept

    def _legacy_message(self, data, pos: int, end: int, offset: int, out: list,
                        depth: int, wrapper_timestamp: int | None = None,
                        offset_shift: int | None = None) -> None:
        body = pos + _LOG_OVERHEAD
        if end - body < _LEGACY_V0.size + 8:
            raise self._corrupt("legacy message is shorter than its fixed fields", offset)
        crc, magic, attributes = _LEGACY_V0.unpack_from(data, body)
        if magic not in (0, 1):
            raise self._corrupt(f"legacy message with magic {magic}", offset)
        if self._check_crcs:
            actual = zlib.crc32(data[body + 4:end]) & 0xFFFFFFFF
            if actual != crc:
                raise self._corrupt(f"CRC-32 mismatch: stored {crc:#010x}, computed {actual:#010x}", offset)
        p = body + _LEGACY_V0.size
        timestamp, ts_type = -1, NO_TIMESTAMP_TYPE
        if magic == 1:
            if end - p < 8:
                raise self._corrupt("legacy v1 message has no timestamp", offset)
            timestamp = struct.unpack_from(">q", data, p)[0]
            p += 8
            ts_type = LOG_APPEND_TIME if attributes & _ATTR_TIMESTAMP_TYPE else CREATE_TIME
            if wrapper_timestamp is not None:
                timestamp, ts_type = wrapper_timestamp, LOG_APPEND_TIME
        key, p = self._legacy_bytes(data, p, end, offset)
        value, p = self._legacy_bytes(data, p, end, offset)
        if p != end:
            raise self._corrupt(f"legacy message has {end - p} trailing bytes", offset)

        codec = attributes & _ATTR_CODEC
        if codec == compression.NONE:
            if offset_shift is not None:
                offset += offset_shift
            if offset + 1 > self.next_offset:
                self.next_offset = offset + 1
            if offset < self.fetch_offset:
                return
            headers: Headers = []
            if self._filter is not None and not self._filter(headers):
                self.filtered += 1
                return
            out.append(new_record(ConsumerRecord, (self.topic, self.partition, offset, timestamp, ts_type,
                                                    key, value, headers, None)))
            return

        if depth > 0:
            raise self._corrupt("compressed message nested inside a compressed message", offset)
        if value is None:
            raise self._corrupt("compressed wrapper message has a null value", offset)
        inner = compression.decompress(codec, value, self._max_uncompressed)
        # Magic 1 wrappers carry the absolute offset of their last inner message, and inner
        # offsets are relative (0..n-1); magic 0 inner offsets are absolute.
        messages = []
        ip, iend = 0, len(inner)
        while iend - ip >= _LOG_OVERHEAD:
            inner_offset, size = _OFFSET_LENGTH.unpack_from(inner, ip)
            if size < 0 or ip + _LOG_OVERHEAD + size > iend:
                # A wrapper's content is written whole; a short inner message is corruption.
                raise self._corrupt("inner message runs past the decompressed wrapper", offset)
            messages.append((ip, ip + _LOG_OVERHEAD + size, inner_offset))
            ip += _LOG_OVERHEAD + size
        if ip != iend:
            raise self._corrupt("decompressed wrapper ends in a partial message", offset)
        shift = None
        if magic == 1 and messages:
            shift = offset - messages[-1][2]
        wrapper_ts = timestamp if (magic == 1 and attributes & _ATTR_TIMESTAMP_TYPE) else None
        if not messages and offset + 1 > self.next_offset:
            self.next_offset = offset + 1
        for start, stop, inner_offset in messages:
            self._legacy_message(inner, start, stop, inner_offset, out, depth + 1, wrapper_ts, shift)

    def _legacy_bytes(self, data, p: int, end: int, offset: int):
        if end - p < 4:
            raise self._corrupt("legacy message key/value length is truncated", offset)
        n = _I32.unpack_from(data, p)[0]
        p += 4
        if n < 0:
            if n != -1:
                raise self._corrupt(f"legacy message key/value length {n}", offset)
            return None, p
        if p + n > end:
            raise self._corrupt("legacy message key/value runs past the message", offset)
        return bytes(data[p:p + n]), p + n



def record_set_end_offset(data) -> int | None:
    """The offset after the last *complete* batch of a record set, from batch headers alone.

    That is where the position will be once the set is drained (whatever filters drop), so a
    fetcher can ask for the next data before decoding this one.  None if no batch is complete.
    Legacy sets report their last message's offset + 1 (a compressed wrapper carries the
    offset of its last inner message).
    """
    if data is None:
        return None
    pos, end, last = 0, len(data), None
    while end - pos >= _LOG_OVERHEAD:
        base_offset, length = _OFFSET_LENGTH.unpack_from(data, pos)
        batch_end = pos + _LOG_OVERHEAD + length
        if length < 5 or batch_end > end:
            break
        if data[pos + 16] == 2:
            if length < _MIN_V2_LENGTH:
                break
            last = base_offset + _I32.unpack_from(data, pos + 23)[0] + 1
        else:
            last = base_offset + 1
        pos = batch_end
    return last


def batch_record_offsets(data, start: int, end: int,
                         max_uncompressed_batch_bytes: int = compression.DEFAULT_MAX_UNCOMPRESSED) -> list[int]:
    """The offsets of the records of the v2 batch at ``data[start:end]``, in order, and nothing
    else of them: each record's length, attributes, timestamp delta and offset delta are read,
    the rest is skipped.  A batch may have holes (compaction removed records; its last offset
    stays), so its offsets are not always ``base..last``.  The batch was read by a
    ``RecordSetReader`` already (CRC and layout checked); a record that does not fit raises
    ``CorruptRecordError``."""
    (base_offset, _, _, _, _, attributes, _, _, _, _, _, _, count) = _BATCH_HEADER.unpack_from(data, start)
    codec = attributes & _ATTR_CODEC
    body = data[start + BATCH_HEADER_SIZE:end]
    payload = compression.decompress(codec, body, max_uncompressed_batch_bytes) if codec else bytes(body)
    offsets, pos = [], 0
    try:
        for _ in range(count):
            length, pos = decode_varint(payload, pos)
            record_end = pos + length
            _, p = decode_varlong(payload, pos + 1)      # attributes, then the timestamp delta
            delta, _ = decode_varint(payload, p)
            if length < 0 or record_end > len(payload):
                raise DecodeError(f"record of {length} bytes runs past the batch")
            offsets.append(base_offset + delta)
            pos = record_end
    except (IndexError, DecodeError) as exc:
        raise CorruptRecordError(f"record offsets of the batch: {exc}", offset=base_offset) from None
    return offsets


def decode_record_set(data, *, topic: str, partition: int, fetch_offset: int, **options) -> tuple[list[ConsumerRecord], RecordSetReader]:
    """Decode a whole record set; return the records and the reader (for next_offset and counts)."""
    reader = RecordSetReader(data, topic=topic, partition=partition, fetch_offset=fetch_offset, **options)
    return reader.read_all(), reader


# The active loop and whether it is the C one, as module globals the reader looks up at each call
# (tests switch them to run the same input through both loops).
_decode_v2_records = record_loop.decode_v2_records
ACCELERATED = record_loop.ACCELERATED
