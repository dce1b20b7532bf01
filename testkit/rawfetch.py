"""Fetch raw record batches with a hand-written Fetch v4, independent of kdaemon's codec.

This is the reference side of golden tests: the exact bytes a broker serves, with the v2 batch
header parsed by ``struct`` alone, so a bug in kdaemon's codec cannot hide itself by being on
both sides of a comparison.  Fetch v4 is the oldest version Kafka 4 still serves and the newest
without tagged fields; Tansu and librdkafka's mock cluster both answer it.

Record batch v2 header (61 bytes):
    baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8, crc uint32,
    attributes int16, lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64,
    producerId int64, producerEpoch int16, baseSequence int32, recordCount int32
attributes: bits 0-2 codec, bit 3 log-append time, bit 4 transactional, bit 5 control.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_FETCH_KEY, _FETCH_VERSION = 1, 4


@dataclass(frozen=True)
class RawBatch:
    base_offset: int
    last_offset_delta: int
    magic: int
    crc: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int
    data: bytes  # the whole batch, header included

    @property
    def codec(self) -> str:
        return CODEC_NAMES.get(self.attributes & 0x07, f"unknown({self.attributes & 0x07})")

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & 0x10)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & 0x20)

    @property
    def control_type(self) -> str | None:
        """The kind of a transaction marker batch, "abort" or "commit"; None for a data batch.

        A control batch holds one record whose key is (version int16, type int16).
        """
        if not self.is_control:
            return None
        pos = _skip_varint(self.data, _BATCH_HEADER.size)  # record length
        pos += 1  # record attributes, int8
        pos = _skip_varint(self.data, _skip_varint(self.data, pos))  # timestamp and offset deltas
        key_len, pos = _read_zigzag(self.data, pos)
        _version, kind = struct.unpack_from(">hh", self.data, pos)
        return {0: "abort", 1: "commit"}.get(kind, f"unknown({kind})") if key_len >= 4 else None


@dataclass(frozen=True)
class RawFetch:
    error_code: int
    high_watermark: int
    last_stable_offset: int
    aborted_transactions: list[tuple[int, int]] | None  # (producer_id, first_offset)
    records: bytes

    def batches(self) -> list[RawBatch]:
        return split_batches(self.records)


def _read_zigzag(buf: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7


def _skip_varint(buf: bytes, pos: int) -> int:
    return _read_zigzag(buf, pos)[1]


def split_batches(records: bytes) -> list[RawBatch]:
    """Complete v2 batches in ``records``; a truncated batch at the end is dropped, as clients do."""
    out, pos, n = [], 0, len(records)
    while n - pos >= _BATCH_HEADER.size:
        (base, length, _epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch,
         base_seq, count) = _BATCH_HEADER.unpack_from(records, pos)
        if magic != 2:
            raise ValueError(f"batch at offset {base} has magic {magic}; only v2 is handled here")
        end = pos + 12 + length
        if end > n:
            break
        out.append(RawBatch(base, last_delta, magic, crc, attrs, base_ts, max_ts, pid, pepoch,
                            base_seq, count, bytes(records[pos:end])))
        pos = end
    return out


def fetch_raw(host: str, port: int, topic: str, partition: int = 0, offset: int = 0, *,
              read_committed: bool = False, max_bytes: int = 64 << 20,
              max_wait_ms: int = 500, timeout: float = 10.0) -> RawFetch:
    """One Fetch v4 for one partition, sent to ``host:port`` (which must lead it)."""
    t = topic.encode()
    body = (struct.pack(">iiiib", -1, max_wait_ms, 1, max_bytes, 1 if read_committed else 0)
            + struct.pack(">ih", 1, len(t)) + t
            + struct.pack(">iiqi", 1, partition, offset, max_bytes))
    client = b"kdaemon-tests"
    frame = struct.pack(">hhih", _FETCH_KEY, _FETCH_VERSION, 1, len(client)) + client + body
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _recv_exactly(sock, 4))[0]
        resp = _recv_exactly(sock, size)
    return _parse_fetch_v4(resp, topic, partition)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _parse_fetch_v4(resp: bytes, topic: str, partition: int) -> RawFetch:
    pos = 0

    def read(fmt: str):
        nonlocal pos
        values = struct.unpack_from(fmt, resp, pos)
        pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def read_bytes(n: int) -> bytes:
        nonlocal pos
        pos += n
        return resp[pos - n:pos]

    read(">ii")  # correlation id, throttle_time_ms
    for _ in range(read(">i")):
        name = read_bytes(read(">h")).decode()
        for _ in range(read(">i")):
            p, err, hw, lso = read(">ihqq")
            n_aborted = read(">i")
            aborted = None if n_aborted < 0 else [read(">qq") for _ in range(n_aborted)]
            rlen = read(">i")
            records = b"" if rlen < 0 else read_bytes(rlen)
            if name == topic and p == partition:
                return RawFetch(err, hw, lso, aborted, records)
    raise ValueError(f"Fetch v4 response has no {topic}[{partition}]")
