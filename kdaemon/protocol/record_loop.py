"""The v2 record loop: what one record decodes to, and the two loops that produce them.

``RecordSetReader`` (records.py) handles batches (header, CRC, codec, transactions); the
per-record work inside one batch payload is this module's: the pure-Python ``python_loop`` and,
when it was built, the C ``accelerated_loop`` from ``_speedups.c``.  Both satisfy ``RecordLoop``,
the contract stated once below, and tests run the same inputs through both and compare.  The
reader calls ``decode_v2_records``, whichever of the two is active (``ACCELERATED``);
``KDAEMON_PURE_PYTHON=1`` forces the Python one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NamedTuple, Protocol

from .primitives import decode_varint, decode_varlong

NO_TIMESTAMP_TYPE = -1
CREATE_TIME = 0
LOG_APPEND_TIME = 1

Headers = list[tuple[str, "bytes | None"]]
HeaderFilter = Callable[[Headers], bool]
"""Called with a record's headers before its key and value are touched; True keeps the record."""


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    leader_epoch: int | None


new_record = tuple.__new__  # skips NamedTuple.__new__'s argument parsing on the hot path

NativeRules = object
"""``HeaderRules.native_rules`` (header_match.py): a filter the C loop evaluates as data.  Only
the accelerated loop accepts it; the reader passes it only when ``ACCELERATED``."""


class RecordLoop(Protocol):
    """Decode ``count`` records of one uncompressed v2 batch payload.

    :param buf: the payload (bytes or bytearray); records start at ``pos``.
    :param base_offset, base_timestamp: from the batch header; each record's offset and timestamp
        are these plus its deltas.
    :param log_append_time: the batch's max_timestamp when the topic uses LogAppendTime (every
        record gets it), else None.
    :param timestamp_type: CREATE_TIME or LOG_APPEND_TIME, stored in each record.
    :param leader_epoch: the batch's partition leader epoch, None when the producer set none (-1).
    :param topic, partition: stored in each record.
    :param min_offset: records below it are skipped (a fetch from the middle of a batch).
    :param header_filter: None, a callable on the record's headers (True keeps it), or, for the
        accelerated loop only, native rules.
    :param out: decoded ``ConsumerRecord``s are appended to it in offset order.
    :returns: (position after the last record, number of records the filter dropped).
    :raises: IndexError, ValueError, UnicodeDecodeError or DecodeError on a short or garbled
        payload (the reader turns each into CorruptRecordError naming the batch);
        ``HeaderFilterError`` from a guarded filter passes through.
    """

    def __call__(self, buf, pos: int, count: int, base_offset: int, base_timestamp: int,
                 log_append_time: int | None, timestamp_type: int, leader_epoch: int | None,
                 topic: str, partition: int, min_offset: int,
                 header_filter: HeaderFilter | NativeRules | None, out: list) -> tuple[int, int]: ...


def python_loop(buf: bytes, pos: int, count: int, base_offset: int, base_timestamp: int,
                       log_append_time: int | None, timestamp_type: int, leader_epoch: int | None,
                       topic: str, partition: int, min_offset: int,
                       header_filter: "HeaderFilter | NativeRules | None", out: list) -> tuple[int, int]:
    """The hot loop.

    Varints are decoded inline for their one- and two-byte forms, which cover nearly all of them
    (lengths under 8 KiB, deltas under 8192); longer ones fall back to the shared decoder.
    Timestamp and offset deltas are only located, not decoded, until the header filter has kept
    the record: a dropped record pays for its lengths and headers only.  A delta of three bytes
    or more is still run through the checked decoder when located, so an over-long or
    out-of-range varint is corrupt in a dropped record too, as in the C loop.  Any IndexError,
    ValueError or DecodeError from a short or garbled payload is turned into CorruptRecordError by
    the caller.
    """
    append = out.append
    filtered = 0
    check_offsets = base_offset < min_offset
    for _ in range(count):
        b = buf[pos]
        if b < 0x80:
            length = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            c = buf[pos + 1]
            if c < 0x80:
                length = ((b & 0x7F) | (c << 7)) >> 1  # a record length is never negative here
                if b & 1:
                    raise ValueError("negative record length")
                pos += 2
            else:
                length, pos = decode_varint(buf, pos)
        record_end = pos + length
        ts_pos = pos + 1  # skip the record attributes, unused in v2
        pos = ts_pos + 1
        if buf[ts_pos] >= 0x80:
            if buf[pos] >= 0x80:  # three bytes or more: checked for length and range
                pos = decode_varlong(buf, ts_pos)[1]
            else:
                pos += 1
        offset_pos = pos
        pos += 1
        if buf[offset_pos] >= 0x80:
            if buf[pos] >= 0x80:
                pos = decode_varint(buf, offset_pos)[1]
            else:
                pos += 1
        b = buf[pos]
        if b < 0x80:
            key_len = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            c = buf[pos + 1]
            if c < 0x80:
                key_len = (((b >> 1) & 0x3F) | (c << 6)) ^ -(b & 1)
                pos += 2
            else:
                key_len, pos = decode_varint(buf, pos)
        key_pos = pos
        if key_len > 0:
            pos += key_len
        elif key_len < -1:
            raise ValueError(f"key length {key_len}")
        b = buf[pos]
        if b < 0x80:
            value_len = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            c = buf[pos + 1]
            if c < 0x80:
                value_len = (((b >> 1) & 0x3F) | (c << 6)) ^ -(b & 1)
                pos += 2
            else:
                value_len, pos = decode_varint(buf, pos)
        value_pos = pos
        if value_len > 0:
            pos += value_len
        elif value_len < -1:
            raise ValueError(f"value length {value_len}")
        n_headers = buf[pos]
        if n_headers < 0x80 and not n_headers & 1:
            n_headers >>= 1
            pos += 1
        else:
            n_headers, pos = decode_varint(buf, pos)
            if n_headers < 0:
                raise ValueError(f"negative header count {n_headers}")
        headers = []
        for _ in range(n_headers):
            n = buf[pos]
            if n < 0x80 and not n & 1:
                n >>= 1
                pos += 1
            else:
                n, pos = decode_varint(buf, pos)
                if n < 0:
                    raise ValueError("null header key")
            hkey = str(buf[pos:pos + n], "utf-8")
            pos += n
            n = buf[pos]
            if n < 0x80:
                n = (n >> 1) ^ -(n & 1)
                pos += 1
            else:
                n, pos = decode_varint(buf, pos)
            if n >= 0:
                headers.append((hkey, buf[pos:pos + n]))
                pos += n
            elif n == -1:
                headers.append((hkey, None))
            else:
                raise ValueError(f"header value length {n}")
        if pos != record_end:
            raise ValueError(f"record length says {length} bytes, fields take {length + pos - record_end}")
        if check_offsets and _offset_at(buf, offset_pos, base_offset) < min_offset:
            continue  # before the position: neither delivered, filtered nor shown to the filter
        if header_filter is not None and not header_filter(headers):
            filtered += 1
            continue
        b = buf[offset_pos]
        if b < 0x80:
            offset = base_offset + ((b >> 1) ^ -(b & 1))
        elif (c := buf[offset_pos + 1]) < 0x80:
            offset = base_offset + ((((b >> 1) & 0x3F) | (c << 6)) ^ -(b & 1))
        else:
            offset = _offset_at(buf, offset_pos, base_offset)
        if check_offsets and offset < min_offset:
            continue
        if log_append_time is None:
            b = buf[ts_pos]
            if b < 0x80:
                timestamp = base_timestamp + ((b >> 1) ^ -(b & 1))
            elif (c := buf[ts_pos + 1]) < 0x80:
                timestamp = base_timestamp + ((((b >> 1) & 0x3F) | (c << 6)) ^ -(b & 1))
            else:
                timestamp = base_timestamp + decode_varlong(buf, ts_pos)[0]
        else:
            timestamp = log_append_time
        append(new_record(ConsumerRecord, (
            topic, partition, offset, timestamp, timestamp_type,
            buf[key_pos:key_pos + key_len] if key_len >= 0 else None,
            buf[value_pos:value_pos + value_len] if value_len >= 0 else None,
            headers, leader_epoch)))
    return pos, filtered


def _offset_at(buf, pos: int, base_offset: int) -> int:
    return base_offset + decode_varint(buf, pos)[0]


def _load_accelerator() -> RecordLoop | None:
    """The C record loop if it was built and not disabled with KDAEMON_PURE_PYTHON=1."""
    if os.environ.get("KDAEMON_PURE_PYTHON"):
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    _speedups.configure(ConsumerRecord)
    return _speedups.decode_v2_records


accelerated_loop: RecordLoop | None = _load_accelerator()
ACCELERATED = accelerated_loop is not None
decode_v2_records: RecordLoop = accelerated_loop if accelerated_loop is not None else python_loop
