"""Writing record batches: the DLQ's producer, tests, benchmarks and fault-injecting fake brokers.

``build_batch`` is what ``kdaemon/client/producer.py`` sends (with the producer id, epoch and
base sequence of an idempotent producer).  The rest exists so unit and property tests can make
batches the real producers never write (legacy magic 0/1, control batches at chosen places,
deliberately corrupt bytes); golden tests use bytes written by real producers.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from crc32c import crc32c

from . import compression
from .primitives import encode_varint, encode_varlong
from .records import _BATCH_HEADER, CONTROL_ABORT, CONTROL_COMMIT

_ATTR_TIMESTAMP_TYPE = 0x08
_ATTR_TRANSACTIONAL = 0x10
_ATTR_CONTROL = 0x20


@dataclass
class RecordSpec:
    key: bytes | None = None
    value: bytes | None = None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)
    timestamp_delta: int = 0
    offset_delta: int | None = None


def encode_record(offset_delta: int, timestamp_delta: int, key, value, headers) -> bytes:
    body = bytearray(b"\x00")
    body += encode_varlong(timestamp_delta)
    body += encode_varint(offset_delta)
    for data in (key, value):
        if data is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(data))
            body += data
    body += encode_varint(len(headers))
    for hkey, hvalue in headers:
        raw = hkey.encode("utf-8")
        body += encode_varint(len(raw))
        body += raw
        if hvalue is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(hvalue))
            body += hvalue
    return encode_varint(len(body)) + bytes(body)


def build_batch(records: Iterable[RecordSpec], *, base_offset: int = 0, codec: int = compression.NONE,
                base_timestamp: int = 1_700_000_000_000, log_append_time: int | None = None,
                leader_epoch: int = 0, producer_id: int = -1, producer_epoch: int = -1,
                base_sequence: int = -1, transactional: bool = False, control: bool = False,
                xerial_snappy: bool = False, last_offset_delta: int | None = None) -> bytes:
    """A complete v2 batch with a correct CRC-32C."""
    records = list(records)
    payload = bytearray()
    max_delta = -1
    # The largest record timestamp, which is below the base when every delta is negative; an
    # empty batch keeps the base timestamp.
    max_ts = max((base_timestamp + r.timestamp_delta for r in records), default=base_timestamp)
    for i, r in enumerate(records):
        delta = i if r.offset_delta is None else r.offset_delta
        max_delta = max(max_delta, delta)
        payload += encode_record(delta, r.timestamp_delta, r.key, r.value, r.headers)
    body = compression.compress(codec, bytes(payload), xerial=xerial_snappy) if codec else bytes(payload)
    attributes = codec
    if log_append_time is not None:
        attributes |= _ATTR_TIMESTAMP_TYPE
        max_ts = log_append_time
    if transactional:
        attributes |= _ATTR_TRANSACTIONAL
    if control:
        attributes |= _ATTR_CONTROL
    if last_offset_delta is None:
        last_offset_delta = max(max_delta, 0)
    length = _BATCH_HEADER.size - 12 + len(body)
    header = bytearray(_BATCH_HEADER.pack(
        base_offset, length, leader_epoch, 2, 0, attributes, last_offset_delta, base_timestamp,
        max_ts, producer_id, producer_epoch, base_sequence, len(records)))
    crc = crc32c(bytes(header[21:]) + body)
    struct.pack_into(">I", header, 17, crc)
    return bytes(header) + body


def build_control_batch(*, base_offset: int, producer_id: int, producer_epoch: int = 0,
                        commit: bool, timestamp: int = 1_700_000_000_000) -> bytes:
    key = struct.pack(">hh", 0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = struct.pack(">hi", 0, 0)  # version, coordinator epoch
    return build_batch([RecordSpec(key=key, value=value)], base_offset=base_offset,
                       base_timestamp=timestamp, producer_id=producer_id,
                       producer_epoch=producer_epoch, transactional=True, control=True)


def build_legacy_message(offset: int, key: bytes | None, value: bytes | None, *, magic: int = 1,
                         timestamp: int = 1_700_000_000_000, codec: int = compression.NONE,
                         log_append_time: bool = False) -> bytes:
    """One magic 0/1 message with its offset and size prefix."""
    attributes = codec | (_ATTR_TIMESTAMP_TYPE if log_append_time else 0)
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp)
    for data in (key, value):
        body += struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data
    crc = zlib.crc32(body) & 0xFFFFFFFF
    message = struct.pack(">I", crc) + body
    return struct.pack(">qi", offset, len(message)) + message


def build_legacy_wrapper(first_offset: int, messages: list[tuple[bytes | None, bytes | None]], *,
                         magic: int = 1, codec: int = compression.GZIP,
                         timestamp: int = 1_700_000_000_000, log_append_time: bool = False) -> bytes:
    """A compressed wrapper message holding ``messages``, laid out as brokers store them."""
    inner = b""
    for i, (k, v) in enumerate(messages):
        inner_offset = i if magic == 1 else first_offset + i
        inner += build_legacy_message(inner_offset, k, v, magic=magic, timestamp=timestamp + i)
    wrapper_offset = first_offset + len(messages) - 1
    return build_legacy_message(wrapper_offset, None, compression.compress(codec, inner), magic=magic,
                                timestamp=timestamp, codec=codec, log_append_time=log_append_time)
