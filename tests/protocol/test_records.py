"""RecordSetReader: v2 batches, legacy message sets, offsets, read_committed, CRCs, corruption.

Reader-level tests run twice through the ``impl`` fixture: once with the pure-Python record loop
and once with the C loop from ``_speedups`` (skipped when it is not built or disabled).  The
direct loop-parity tests at the end call both loop functions on the same payloads.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import zlib

import pytest
import zstandard
from crc32c import crc32c

from kdaemon.protocol import compression, record_loop, records
from kdaemon.protocol.builder import (
    RecordSpec,
    build_batch,
    build_control_batch,
    build_legacy_message,
    build_legacy_wrapper,
    encode_record,
)
from kdaemon.protocol.errors import CorruptRecordError, DecodeError
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from kdaemon.protocol.primitives import encode_varint, encode_varlong
from kdaemon.protocol.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    NO_TIMESTAMP_TYPE,
    ConsumerRecord,
    RecordSetReader,
    decode_record_set,
)

TOPIC = "orders"
PARTITION = 3
BASE_TS = 1_700_000_000_000

needs_c = pytest.mark.skipif(not records.ACCELERATED, reason="C record loop not built or disabled")


@pytest.fixture(params=["python", pytest.param("c", marks=needs_c)])
def impl(request, monkeypatch):
    """Route RecordSetReader through one record-loop implementation."""
    if request.param == "python":
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.python_loop)
        monkeypatch.setattr(records, "ACCELERATED", False)  # no native rules for the Python loop
    else:
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.accelerated_loop)
    return request.param


def read(data, fetch_offset=0, **options):
    reader = RecordSetReader(data, topic=TOPIC, partition=PARTITION, fetch_offset=fetch_offset, **options)
    return reader.read_all(), reader


def reframe(batch: bytes, body: bytes, *, codec: int | None = None, count: int | None = None,
            last_offset_delta: int | None = None) -> bytes:
    """``batch`` with its payload replaced by ``body``; length and CRC-32C recomputed."""
    header = bytearray(batch[:records.BATCH_HEADER_SIZE])
    struct.pack_into(">i", header, 8, records.BATCH_HEADER_SIZE - 12 + len(body))
    if codec is not None:
        attributes = struct.unpack_from(">h", header, 21)[0]
        struct.pack_into(">h", header, 21, (attributes & ~0x07) | codec)
    if count is not None:
        struct.pack_into(">i", header, 57, count)
    if last_offset_delta is not None:
        struct.pack_into(">i", header, 23, last_offset_delta)
    struct.pack_into(">I", header, 17, crc32c(bytes(header[21:]) + body))
    return bytes(header) + body


def raw_record(fields: bytes) -> bytes:
    return encode_varint(len(fields)) + fields


def specs(n: int, prefix: str = "") -> list[RecordSpec]:
    return [RecordSpec(key=f"{prefix}k{i}".encode(), value=f"{prefix}v{i}".encode(),
                       headers=[("i", str(i).encode())], timestamp_delta=i * 10) for i in range(n)]


def offsets(recs) -> list[int]:
    return [r.offset for r in recs]


# -- codecs -------------------------------------------------------------------------------------

SAMPLE = [
    RecordSpec(key=b"alpha", value=b"first value", headers=[("h", b"1")]),
    RecordSpec(key=None, value=b"x" * 300, headers=[], timestamp_delta=5),
    RecordSpec(key=b"", value=None, headers=[("n", None), ("e", b"")], timestamp_delta=-3),
    RecordSpec(key=b"gamma", value=b"\x00\x01\x02" * 1000, headers=[("ключ", "значение".encode())],
               timestamp_delta=70_000),
]


def _zstd_no_size(payload: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=False).compress(payload)


def _xerial_blocks(payload: bytes, block: int = 512) -> bytes:
    import cramjam
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(payload), block):
        chunk = bytes(cramjam.snappy.compress_raw(payload[i:i + block]))
        out += struct.pack(">i", len(chunk)) + chunk
    return out


def _batch(codec_name: str, recs=SAMPLE, **kw) -> bytes:
    if codec_name == "zstd-no-size":
        plain = build_batch(recs, **kw)
        body = _zstd_no_size(plain[records.BATCH_HEADER_SIZE:])
        assert zstandard.frame_content_size(body) == -1
        return reframe(plain, body, codec=compression.ZSTD)
    if codec_name == "snappy-xerial-multiblock":
        plain = build_batch(recs, **kw)
        body = _xerial_blocks(plain[records.BATCH_HEADER_SIZE:])
        return reframe(plain, body, codec=compression.SNAPPY)
    codec, xerial = {
        "none": (compression.NONE, False), "gzip": (compression.GZIP, False),
        "snappy-raw": (compression.SNAPPY, False), "snappy-xerial": (compression.SNAPPY, True),
        "lz4": (compression.LZ4, False), "zstd": (compression.ZSTD, False),
    }[codec_name]
    return build_batch(recs, codec=codec, xerial_snappy=xerial, **kw)


CODEC_NAMES = ["none", "gzip", "snappy-raw", "snappy-xerial", "snappy-xerial-multiblock", "lz4", "zstd",
               "zstd-no-size"]


def _expected(recs, base_offset=0, base_ts=BASE_TS, epoch=0, log_append=None):
    out = []
    for i, r in enumerate(recs):
        delta = i if r.offset_delta is None else r.offset_delta
        out.append(ConsumerRecord(
            TOPIC, PARTITION, base_offset + delta,
            log_append if log_append is not None else base_ts + r.timestamp_delta,
            LOG_APPEND_TIME if log_append is not None else CREATE_TIME,
            r.key, r.value, list(r.headers), None if epoch < 0 else epoch))
    return out


@pytest.mark.parametrize("codec_name", CODEC_NAMES)
def test_every_codec_decodes(impl, codec_name):
    data = _batch(codec_name, base_offset=40)
    recs, reader = read(data, fetch_offset=40)
    assert recs == _expected(SAMPLE, base_offset=40)
    assert reader.next_offset == 44
    assert reader.filtered == 0 and reader.control == 0 and not reader.truncated
    expected_codec = {"none": 0, "gzip": 1, "lz4": 3, "zstd": 4, "zstd-no-size": 4}.get(codec_name, 2)
    assert reader.last_batch.codec == expected_codec


def test_codec_fixtures_use_the_framing_they_claim():
    xerial = _batch("snappy-xerial")[records.BATCH_HEADER_SIZE:]
    raw = _batch("snappy-raw")[records.BATCH_HEADER_SIZE:]
    assert xerial.startswith(b"\x82SNAPPY\x00") and not raw.startswith(b"\x82SNAPPY\x00")
    multi = _batch("snappy-xerial-multiblock")[records.BATCH_HEADER_SIZE:]
    assert len(multi) > 16 + 4 + 512 // 4  # several blocks
    with_size = _batch("zstd")[records.BATCH_HEADER_SIZE:]
    assert zstandard.frame_content_size(with_size) > 0


def test_records_are_consumer_records_with_named_fields(impl):
    recs, _ = read(build_batch([RecordSpec(key=b"k", value=b"v")], base_offset=9, leader_epoch=4))
    (r,) = recs
    assert isinstance(r, ConsumerRecord)
    assert (r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.leader_epoch) == (
        TOPIC, PARTITION, 9, b"k", b"v", [], 4)
    assert type(r.key) is bytes and type(r.value) is bytes


def test_memoryview_input(impl):
    data = build_batch(SAMPLE, codec=compression.NONE) + build_batch(specs(2), base_offset=4)
    recs, reader = read(memoryview(data))
    assert offsets(recs) == [0, 1, 2, 3, 4, 5]
    assert recs[:4] == _expected(SAMPLE)


def test_none_or_empty_record_set():
    for data in (None, b""):
        recs, reader = read(data, fetch_offset=17)
        assert recs == [] and reader.next_offset == 17 and not reader.truncated
        assert reader.read_batch() is None


# -- record contents ----------------------------------------------------------------------------

def test_null_and_empty_keys_values_and_header_values(impl):
    recs_in = [
        RecordSpec(key=None, value=None, headers=[("a", None)]),
        RecordSpec(key=b"", value=b"", headers=[("a", b"")]),
        RecordSpec(key=None, value=b"", headers=[("", b"empty key"), ("z", None)]),
        RecordSpec(key=b"", value=None),
    ]
    recs, _ = read(build_batch(recs_in))
    assert [(r.key, r.value) for r in recs] == [(None, None), (b"", b""), (None, b""), (b"", None)]
    assert [r.headers for r in recs] == [[("a", None)], [("a", b"")], [("", b"empty key"), ("z", None)], []]


def test_unicode_header_keys(impl):
    headers = [("ключ", b"1"), ("🔑", b"2"), ("é", None), ("日本語のキー", "値".encode())]
    recs, _ = read(build_batch([RecordSpec(value=b"v", headers=headers)], codec=compression.LZ4))
    assert recs[0].headers == headers
    assert all(type(k) is str for k, _ in recs[0].headers)


@pytest.mark.parametrize("n_headers", [31, 32, 33, 100, 300])
def test_many_headers(impl, n_headers):
    last = f"h{n_headers - 1}"
    headers = [(f"h{i}", None if i % 7 == 0 else f"value-{i}".encode()) for i in range(n_headers - 1)]
    headers.append((last, b"wanted"))
    # Native rules on a key past the C loop's inline header array decide the record.
    rules = HeaderRules([HeaderRule(last, "equals", ("wanted",), keep=True),
                         HeaderRule(last, "exists", keep=False)], default=False)
    recs_in = [
        RecordSpec(key=b"keep", headers=headers),
        RecordSpec(key=b"drop", headers=headers[:-1] + [(last, b"other")]),
        RecordSpec(key=b"few", headers=headers[:3]),  # no rule matches: the default drops it
        RecordSpec(key=b"keep2", headers=headers + [("extra", b"x")] * 40),
        RecordSpec(key=b"drop2", headers=headers + [("extra", b"x")] * 40 + [(last, None)]),
    ]
    data = build_batch(recs_in)
    recs, reader = read(data)
    assert [r.key for r in recs] == [b"keep", b"drop", b"few", b"keep2", b"drop2"]
    assert recs[0].headers == headers
    assert len(recs[3].headers) == n_headers + 40
    recs, reader = read(data, header_filter=rules)
    assert [r.key for r in recs] == [b"keep", b"keep2"]
    assert recs[1].headers == headers + [("extra", b"x")] * 40
    assert reader.filtered == 3


def test_one_megabyte_value(impl):
    big = bytes(range(256)) * 4096  # 1 MiB
    for codec in (compression.NONE, compression.ZSTD, compression.GZIP):
        recs, _ = read(build_batch([RecordSpec(key=b"k", value=big), RecordSpec(key=b"after", value=b"x")],
                                   codec=codec))
        assert recs[0].value == big and recs[1].key == b"after" and recs[1].offset == 1


def test_create_time_timestamps(impl):
    deltas = [0, 1, -1, 63, -64, 64, 8191, 8192, -8193, 1 << 40, -(1 << 40)]
    recs_in = [RecordSpec(value=b"v", timestamp_delta=d) for d in deltas]
    recs, reader = read(build_batch(recs_in, base_timestamp=BASE_TS))
    assert [r.timestamp for r in recs] == [BASE_TS + d for d in deltas]
    assert {r.timestamp_type for r in recs} == {CREATE_TIME}
    assert reader.last_batch.max_timestamp == BASE_TS + (1 << 40)


def test_log_append_time_gives_every_record_the_max_timestamp(impl):
    recs_in = [RecordSpec(value=b"v", timestamp_delta=d) for d in (0, 5, -70_000, 1 << 33)]
    recs, _ = read(build_batch(recs_in, log_append_time=1_800_000_000_123, codec=compression.SNAPPY))
    assert [r.timestamp for r in recs] == [1_800_000_000_123] * 4
    assert {r.timestamp_type for r in recs} == {LOG_APPEND_TIME}


def test_builder_max_timestamp_is_the_largest_record_timestamp():
    # All deltas negative: the batch's max timestamp is below its base timestamp.
    data = build_batch([RecordSpec(timestamp_delta=-50), RecordSpec(timestamp_delta=-20)],
                       base_timestamp=BASE_TS)
    header = records._BATCH_HEADER.unpack_from(data, 0)
    assert header[8] == BASE_TS - 20


@pytest.mark.parametrize("epoch, expected", [(-1, None), (0, 0), (7, 7), (2**31 - 1, 2**31 - 1)])
def test_leader_epoch(impl, epoch, expected):
    recs, reader = read(build_batch(specs(2), leader_epoch=epoch))
    assert [r.leader_epoch for r in recs] == [expected, expected]
    assert reader.last_batch.leader_epoch == epoch


# -- offsets ------------------------------------------------------------------------------------

def test_offsets_with_gaps_from_compaction(impl):
    deltas = [0, 3, 10, 200, 100_000, 2**31 - 2]
    recs_in = [RecordSpec(key=str(d).encode(), offset_delta=d) for d in deltas]
    base = 5_000_000_000
    recs, reader = read(build_batch(recs_in, base_offset=base, codec=compression.GZIP), fetch_offset=base)
    assert offsets(recs) == [base + d for d in deltas]
    assert reader.next_offset == base + 2**31 - 1


def test_compacted_away_tail_still_advances_to_last_offset_delta(impl):
    # The batch header says offsets 100..109; only 100 and 104 survived compaction.
    data = build_batch([RecordSpec(offset_delta=0), RecordSpec(offset_delta=4)], base_offset=100,
                       last_offset_delta=9)
    recs, reader = read(data, fetch_offset=100)
    assert offsets(recs) == [100, 104]
    assert reader.next_offset == 110


def test_empty_batch_after_compaction_advances(impl):
    data = build_batch([], base_offset=50, last_offset_delta=4) + build_batch(specs(1), base_offset=55)
    recs, reader = read(data, fetch_offset=50)
    assert offsets(recs) == [55] and reader.next_offset == 56 and reader.batches == 2


@pytest.mark.parametrize("codec", [compression.NONE, compression.GZIP, compression.ZSTD])
def test_fetch_offset_inside_a_batch_skips_earlier_records_without_counting_them(impl, codec):
    data = build_batch(specs(10), base_offset=100, codec=codec)
    recs, reader = read(data, fetch_offset=105)
    assert offsets(recs) == [105, 106, 107, 108, 109]
    assert reader.filtered == 0 and reader.next_offset == 110
    # A filter that drops everything counts only the records at or after the position.
    for flt in (lambda headers: False, HeaderRules([], default=False)):
        recs, reader = read(data, fetch_offset=105, header_filter=flt)
        assert recs == [] and reader.filtered == 5 and reader.next_offset == 110
    # A filter keeping odd offsets: its decisions apply to the records after the position only.
    odd = HeaderRules([HeaderRule("i", "in", tuple(str(i) for i in range(1, 10, 2)))], default=False)
    recs, reader = read(data, fetch_offset=104, header_filter=odd)
    assert offsets(recs) == [105, 107, 109] and reader.filtered == 3


def test_fetch_offset_inside_a_batch_with_offset_gaps(impl):
    data = build_batch([RecordSpec(offset_delta=d, key=b"%d" % d) for d in (0, 2, 4, 6)], base_offset=10)
    recs, reader = read(data, fetch_offset=13, header_filter=lambda h: True)
    assert offsets(recs) == [14, 16] and reader.filtered == 0 and reader.next_offset == 17


def test_batch_wholly_before_fetch_offset(impl):
    calls = []

    def flt(headers):
        calls.append(headers)
        return True

    data = build_batch(specs(3), base_offset=0) + build_batch(specs(3, "b"), base_offset=3)
    reader = RecordSetReader(data, topic=TOPIC, partition=PARTITION, fetch_offset=4, header_filter=flt)
    assert reader.read_batch() == []          # offsets 0..2: nothing, and no filter calls
    assert calls == [] and reader.next_offset == 4
    second = reader.read_batch()
    assert offsets(second) == [4, 5] and reader.filtered == 0
    assert reader.read_batch() is None and reader.next_offset == 6 and reader.batches == 2


def test_next_offset_advances_when_every_record_is_filtered(impl):
    data = build_batch(specs(4), base_offset=20) + build_batch(specs(2), base_offset=24, codec=compression.LZ4)
    for flt in (lambda headers: False, HeaderRules([HeaderRule("i", "exists", keep=False)])):
        recs, reader = read(data, fetch_offset=20, header_filter=flt)
        assert recs == [] and reader.filtered == 6 and reader.next_offset == 26


def test_read_batch_is_incremental(impl):
    data = (build_batch(specs(2), base_offset=0) + build_batch(specs(3), base_offset=2, codec=compression.GZIP)
            + build_batch(specs(1), base_offset=5))
    reader = RecordSetReader(data, topic=TOPIC, partition=PARTITION, fetch_offset=0)
    assert offsets(reader.read_batch()) == [0, 1] and reader.next_offset == 2
    assert offsets(reader.read_batch()) == [2, 3, 4] and reader.next_offset == 5
    assert reader.last_batch.base_offset == 2 and reader.last_batch.last_offset == 4
    assert reader.last_batch.record_count == 3
    assert offsets(reader.read_batch()) == [5]
    assert reader.read_batch() is None and reader.read_batch() is None
    assert reader.batches == 3 and reader.next_offset == 6


def test_decode_record_set(impl):
    recs, reader = decode_record_set(build_batch(specs(3), base_offset=7), topic=TOPIC, partition=PARTITION,
                                     fetch_offset=8, header_filter=lambda h: h != [("i", b"2")])
    assert offsets(recs) == [8] and reader.filtered == 1 and reader.next_offset == 10


# -- control batches, truncation ------------------------------------------------------------------

def test_control_batches_are_never_returned_and_are_counted(impl):
    data = (build_batch(specs(2), base_offset=0, producer_id=9, transactional=True)
            + build_control_batch(base_offset=2, producer_id=9, commit=True)
            + build_batch(specs(1), base_offset=3)
            + build_control_batch(base_offset=4, producer_id=9, commit=False))
    recs, reader = read(data)
    assert offsets(recs) == [0, 1, 3]
    assert reader.control == 2 and reader.next_offset == 5 and reader.filtered == 0
    assert reader.last_batch.is_control and reader.last_batch.is_transactional


def test_control_batch_with_short_key_is_corrupt(impl):
    plain = build_control_batch(base_offset=8, producer_id=1, commit=True)
    body = raw_record(b"\x00\x00\x00" + encode_varint(2) + b"\x00\x00" + encode_varint(-1) + b"\x00")
    with pytest.raises(CorruptRecordError) as info:
        read(reframe(plain, body))
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PARTITION, 8)


@pytest.mark.parametrize("cut", [1, 5, 30, 60, 61, 70])
def test_truncated_trailing_batch_is_ignored(impl, cut):
    first = build_batch(specs(3), base_offset=10)
    second = build_batch(specs(4, "second"), base_offset=13, codec=compression.GZIP)
    data = first + second[:len(second) - cut] if cut < len(second) else first
    recs, reader = read(data, fetch_offset=10)
    assert offsets(recs) == [10, 11, 12]
    assert reader.truncated is True and reader.next_offset == 13


@pytest.mark.parametrize("keep", [1, 11, 12, 40])
def test_only_a_partial_batch(impl, keep):
    recs, reader = read(build_batch(specs(4), base_offset=30)[:keep], fetch_offset=30)
    assert recs == [] and reader.truncated and reader.next_offset == 30 and reader.batches == 0


def test_complete_record_set_is_not_truncated(impl):
    _, reader = read(build_batch(specs(2)))
    assert reader.truncated is False


# -- read_committed -------------------------------------------------------------------------------

def _txn_log():
    """pid 1 aborts 0-2; 3-4 non-transactional; pid 2 commits 5-6; markers 7 (abort 1), 8 (commit 2);
    pid 1 commits 9-10 with its marker at 11."""
    return (build_batch(specs(3, "aborted"), base_offset=0, producer_id=1, transactional=True)
            + build_batch(specs(2, "plain"), base_offset=3)
            + build_batch(specs(2, "committed"), base_offset=5, producer_id=2, transactional=True,
                          codec=compression.ZSTD)
            + build_control_batch(base_offset=7, producer_id=1, commit=False)
            + build_control_batch(base_offset=8, producer_id=2, commit=True)
            + build_batch(specs(2, "again"), base_offset=9, producer_id=1, transactional=True)
            + build_control_batch(base_offset=11, producer_id=1, commit=True))


def test_read_committed_hides_aborted_transaction_until_its_abort_marker(impl):
    recs, reader = read(_txn_log(), aborted_transactions=[(1, 0)])
    assert offsets(recs) == [3, 4, 5, 6, 9, 10]
    assert [r.key for r in recs] == [b"plaink0", b"plaink1", b"committedk0", b"committedk1", b"againk0",
                                     b"againk1"]
    assert reader.aborted == 3 and reader.control == 3 and reader.next_offset == 12
    assert reader.filtered == 0


def test_read_uncommitted_returns_aborted_records(impl):
    recs, reader = read(_txn_log())
    assert offsets(recs) == [0, 1, 2, 3, 4, 5, 6, 9, 10]
    assert reader.aborted == 0 and reader.control == 3


def test_read_committed_with_no_aborted_transactions(impl):
    recs, reader = read(_txn_log(), aborted_transactions=[])
    assert offsets(recs) == [0, 1, 2, 3, 4, 5, 6, 9, 10]


def test_aborted_transaction_starting_later_only_hides_that_transaction(impl):
    recs, reader = read(_txn_log(), aborted_transactions=[(1, 9)])
    assert offsets(recs) == [0, 1, 2, 3, 4, 5, 6]
    assert reader.aborted == 2


def test_interleaved_transactions(impl):
    data = (build_batch(specs(2), base_offset=0, producer_id=1, transactional=True)
            + build_batch(specs(2), base_offset=2, producer_id=2, transactional=True)
            + build_batch(specs(2), base_offset=4, producer_id=1, transactional=True, codec=compression.LZ4)
            + build_batch(specs(1), base_offset=6, producer_id=3, transactional=True)
            + build_control_batch(base_offset=7, producer_id=1, commit=False)
            + build_control_batch(base_offset=8, producer_id=2, commit=True)
            + build_control_batch(base_offset=9, producer_id=3, commit=False))
    recs, reader = read(data, aborted_transactions=[(3, 6), (1, 0)])
    assert offsets(recs) == [2, 3]
    assert reader.aborted == 5 and reader.control == 3 and reader.next_offset == 10


def test_read_committed_only_hides_transactional_batches(impl):
    # An idempotent (non-transactional) batch that shares the aborted producer's id stays.
    data = (build_batch(specs(2), base_offset=0, producer_id=1, transactional=True)
            + build_batch(specs(2), base_offset=2, producer_id=1, transactional=False)
            + build_control_batch(base_offset=4, producer_id=1, commit=False))
    recs, reader = read(data, aborted_transactions=[(1, 0)])
    assert offsets(recs) == [2, 3] and reader.aborted == 2


def test_control_count_is_in_records(impl):
    marker = RecordSpec(key=struct.pack(">hh", 0, records.CONTROL_COMMIT), value=struct.pack(">hi", 0, 0))
    data = (build_batch([marker, marker], base_offset=0, producer_id=2, transactional=True, control=True)
            + build_batch(specs(1), base_offset=2))
    recs, reader = read(data)
    assert offsets(recs) == [2] and reader.control == 2 and reader.batches == 2


def test_aborted_transactions_and_filter_together(impl):
    recs, reader = read(_txn_log(), aborted_transactions=[(1, 0)],
                        header_filter=HeaderRules([HeaderRule("i", "equals", ("0",))], default=False))
    assert offsets(recs) == [3, 5, 9]
    assert reader.filtered == 3 and reader.aborted == 3


# -- legacy message sets --------------------------------------------------------------------------

def test_legacy_magic0_messages(impl):
    data = b"".join(build_legacy_message(o, b"k%d" % o, b"v%d" % o, magic=0) for o in (5, 6, 8))
    data += build_legacy_message(9, None, None, magic=0)
    recs, reader = read(data, fetch_offset=6)
    assert offsets(recs) == [6, 8, 9]
    assert recs[0] == ConsumerRecord(TOPIC, PARTITION, 6, -1, NO_TIMESTAMP_TYPE, b"k6", b"v6", [], None)
    assert (recs[2].key, recs[2].value) == (None, None)
    assert reader.next_offset == 10 and reader.batches == 4


def test_legacy_magic1_messages(impl):
    data = (build_legacy_message(0, b"k", b"v", magic=1, timestamp=1234)
            + build_legacy_message(1, b"", b"", magic=1, timestamp=99, log_append_time=True))
    recs, reader = read(data)
    assert recs == [
        ConsumerRecord(TOPIC, PARTITION, 0, 1234, CREATE_TIME, b"k", b"v", [], None),
        ConsumerRecord(TOPIC, PARTITION, 1, 99, LOG_APPEND_TIME, b"", b"", [], None),
    ]


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4])
def test_legacy_magic1_compressed_wrapper_has_relative_inner_offsets(impl, codec):
    msgs = [(b"k%d" % i, b"v%d" % i) for i in range(4)]
    data = build_legacy_wrapper(100, msgs, magic=1, codec=codec, timestamp=5000)
    # Inner offsets really are relative: 0..3 inside, wrapper at 103.
    assert struct.unpack_from(">q", data, 0)[0] == 103
    recs, reader = read(data, fetch_offset=100)
    assert offsets(recs) == [100, 101, 102, 103]
    assert [r.timestamp for r in recs] == [5000, 5001, 5002, 5003]
    assert {r.timestamp_type for r in recs} == {CREATE_TIME}
    assert [(r.key, r.value) for r in recs] == msgs
    assert reader.next_offset == 104


def test_legacy_magic1_wrapper_relative_offsets_with_compaction_gaps(impl):
    inner = (build_legacy_message(0, b"a", b"1", magic=1) + build_legacy_message(2, b"b", b"2", magic=1)
             + build_legacy_message(5, b"c", b"3", magic=1))
    data = build_legacy_message(205, None, compression.compress(compression.GZIP, inner), magic=1,
                                codec=compression.GZIP)
    recs, reader = read(data, fetch_offset=200)
    assert offsets(recs) == [200, 202, 205] and reader.next_offset == 206


def test_legacy_magic0_compressed_wrapper_has_absolute_inner_offsets(impl):
    msgs = [(None, b"v%d" % i) for i in range(3)]
    data = build_legacy_wrapper(40, msgs, magic=0, codec=compression.GZIP)
    recs, reader = read(data, fetch_offset=40)
    assert offsets(recs) == [40, 41, 42]
    assert {(r.timestamp, r.timestamp_type) for r in recs} == {(-1, NO_TIMESTAMP_TYPE)}
    assert reader.next_offset == 43


def test_legacy_log_append_time_wrapper_overrides_inner_timestamps(impl):
    data = build_legacy_wrapper(0, [(b"a", b"1"), (b"b", b"2")], magic=1, codec=compression.LZ4,
                                timestamp=777, log_append_time=True)
    recs, _ = read(data)
    assert [(r.timestamp, r.timestamp_type) for r in recs] == [(777, LOG_APPEND_TIME)] * 2


def test_legacy_fetch_offset_inside_wrapper_and_filter(impl):
    data = build_legacy_wrapper(10, [(b"k", b"v")] * 5, magic=1)
    recs, reader = read(data, fetch_offset=12)
    assert offsets(recs) == [12, 13, 14] and reader.filtered == 0
    seen = []
    recs, reader = read(data, fetch_offset=12, header_filter=lambda h: seen.append(h) or False)
    assert recs == [] and reader.filtered == 3 and seen == [[], [], []] and reader.next_offset == 15


def test_legacy_then_v2_after_upgrade(impl):
    data = (build_legacy_message(0, b"old", b"0", magic=0) + build_legacy_wrapper(1, [(b"w", b"1")] * 2)
            + build_batch(specs(2), base_offset=3, codec=compression.ZSTD))
    recs, reader = read(data)
    assert offsets(recs) == [0, 1, 2, 3, 4] and reader.next_offset == 5
    assert [r.leader_epoch for r in recs] == [None, None, None, 0, 0]


def test_a_reader_told_hands_over_what_the_filter_drops_legacy_and_v2_alike(impl):
    """``on_filtered``: the same records returned and counted as without it; the dropped ones
    handed over whole, a list per batch, in offset order (a v2 batch is decoded again for
    them; a legacy message set is filtered on built records)."""
    data = (build_legacy_wrapper(0, [(b"w", b"1")] * 3, magic=1)
            + build_batch(specs(6), base_offset=3, codec=compression.LZ4) + build_batch(specs(2), base_offset=9))
    drop_odd = lambda headers: int(dict(headers)["i"]) % 2 == 0 if headers else False  # noqa: E731
    plain, counted = read(data, header_filter=drop_odd)
    told: list[list] = []
    recs, reader = read(data, header_filter=drop_odd, on_filtered=told.append)
    assert recs == plain and reader.filtered == counted.filtered == 3 + 3 + 1
    assert [offsets(batch) for batch in told] == [[0, 1, 2], [4, 6, 8], [10]]
    assert all(r.value is not None and r.topic == TOPIC for batch in told for r in batch)
    rules = HeaderRules([HeaderRule("i", "in", (b"1", b"3", b"5"), keep=False)])
    told.clear()
    recs, reader = read(data, header_filter=rules, on_filtered=told.append)
    assert offsets(recs) == [0, 1, 2, 3, 5, 7, 9] and [offsets(b) for b in told] == [[4, 6, 8], [10]]


def test_legacy_nested_compression_is_corrupt(impl):
    inner_wrapper = build_legacy_wrapper(0, [(b"a", b"b")], codec=compression.GZIP)
    data = build_legacy_message(0, None, compression.compress(compression.GZIP, inner_wrapper), magic=1,
                                codec=compression.GZIP)
    with pytest.raises(CorruptRecordError, match="nested"):
        read(data)


def test_legacy_wrapper_with_null_value_is_corrupt(impl):
    with pytest.raises(CorruptRecordError, match="null value"):
        read(build_legacy_message(3, None, None, magic=1, codec=compression.GZIP))


def test_legacy_wrapper_with_partial_inner_message_is_corrupt(impl):
    inner = build_legacy_message(0, b"a", b"b", magic=1)
    data = build_legacy_message(0, None, compression.compress(compression.GZIP, inner[:-3]), magic=1,
                                codec=compression.GZIP)
    with pytest.raises(CorruptRecordError) as info:
        read(data)
    assert info.value.offset == 0 and info.value.topic == TOPIC


def test_legacy_negative_key_length_is_corrupt(impl):
    msg = bytearray(build_legacy_message(4, b"k", b"v", magic=0))
    struct.pack_into(">i", msg, 18, -2)
    body = bytes(msg[16:])
    struct.pack_into(">I", msg, 12, zlib.crc32(body) & 0xFFFFFFFF)
    with pytest.raises(CorruptRecordError, match="-2"):
        read(bytes(msg))


# -- CRCs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("where", [records.BATCH_HEADER_SIZE + 5, 21, 30, -1])
def test_v2_crc_mismatch_names_topic_partition_and_batch(impl, where):
    first = build_batch(specs(2), base_offset=500)
    second = bytearray(build_batch(specs(3), base_offset=502))
    second[where] ^= 0x10
    with pytest.raises(CorruptRecordError) as info:
        read(first + bytes(second), fetch_offset=500)
    err = info.value
    assert (err.topic, err.partition, err.offset) == (TOPIC, PARTITION, 502)
    assert "CRC" in err.reason
    assert "topic=orders" in str(err) and "partition=3" in str(err) and "offset=502" in str(err)


def test_v2_check_crcs_false_skips_the_check(impl):
    data = bytearray(build_batch([RecordSpec(key=b"k", value=b"value")], base_offset=1))
    idx = bytes(data).index(b"value")
    data[idx] ^= 0x01  # "value" -> "walue"
    with pytest.raises(CorruptRecordError, match="CRC"):
        read(bytes(data), fetch_offset=1)
    recs, _ = read(bytes(data), fetch_offset=1, check_crcs=False)
    assert recs[0].value == b"walue"


def test_legacy_crc_mismatch(impl):
    good = build_legacy_message(0, b"k", b"v", magic=1)
    bad = bytearray(build_legacy_message(1, b"k", b"value", magic=1))
    bad[-3] ^= 0x04
    with pytest.raises(CorruptRecordError) as info:
        read(good + bytes(bad))
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PARTITION, 1)
    assert "CRC-32" in info.value.reason
    recs, _ = read(good + bytes(bad), check_crcs=False)
    assert recs[1].value == b"vahue"  # "l" ^ 0x04


def test_legacy_wrapper_crc_mismatch(impl):
    data = bytearray(build_legacy_wrapper(20, [(b"k", b"v")] * 3))
    data[-1] ^= 0x80
    with pytest.raises(CorruptRecordError) as info:
        read(bytes(data))
    assert info.value.offset == 22


# -- structural corruption --------------------------------------------------------------------------

def _one_record_batch(fields: bytes, count: int = 1, base_offset: int = 70) -> bytes:
    return reframe(build_batch([RecordSpec()], base_offset=base_offset), raw_record(fields), count=count)


# attributes | ts delta | offset delta | key | value | header count [...]
MALFORMED_RECORDS = {
    "key length -2": b"\x00\x00\x00" + encode_varint(-2) + encode_varint(-1) + b"\x00",
    "value length -5": b"\x00\x00\x00" + encode_varint(-1) + encode_varint(-5) + b"\x00",
    "key runs past record": b"\x00\x00\x00" + encode_varint(50) + b"abc",
    "value runs past record": b"\x00\x00\x00" + encode_varint(-1) + encode_varint(300) + b"abc" + b"\x00",
    "negative header count": b"\x00\x00\x00\x01\x01" + encode_varint(-1),
    "header count too large": b"\x00\x00\x00\x01\x01" + encode_varint(5) + b"\x02a\x00",
    "null header key": b"\x00\x00\x00\x01\x01\x02" + encode_varint(-1) + b"\x00",
    "header value length -2": b"\x00\x00\x00\x01\x01\x02\x02ab" + encode_varint(-2),
    "header key not utf-8": b"\x00\x00\x00\x01\x01\x02\x04\xff\xfe\x00",
    "trailing bytes inside record": b"\x00\x00\x00\x01\x01\x00JUNK",
    "six-byte key length": b"\x00\x00\x00" + b"\xff\xff\xff\xff\xff\x01" + b"\x01\x00",
    "key length above 32 bits": b"\x00\x00\x00" + b"\xff\xff\xff\xff\x7f" + b"\x01\x00",
    "six-byte offset delta": b"\x00\x00" + b"\x80\x80\x80\x80\x80\x00" + b"\x01\x01\x00",
    "six-byte header count": b"\x00\x00\x00\x01\x01" + b"\x80\x80\x80\x80\x80\x00",
    "six-byte header key length": b"\x00\x00\x00\x01\x01\x02" + b"\x82\x80\x80\x80\x80\x00" + b"ab\x00",
    "eleven-byte timestamp delta": b"\x00" + b"\x80" * 10 + b"\x00" + b"\x00\x01\x01\x00",
    "varlong above 64 bits": b"\x00" + b"\xff" * 9 + b"\x7f" + b"\x00\x01\x01\x00",
    "no attributes byte": b"",
}


@pytest.mark.parametrize("name", list(MALFORMED_RECORDS))
def test_malformed_record_is_corrupt_record_error(impl, name):
    data = _one_record_batch(MALFORMED_RECORDS[name])
    with pytest.raises(CorruptRecordError) as info:
        read(data, fetch_offset=70)
    assert type(info.value) is CorruptRecordError
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PARTITION, 70)


@pytest.mark.parametrize("name", ["six-byte key length", "key length above 32 bits", "six-byte header count",
                                  "header key not utf-8", "eleven-byte timestamp delta"])
def test_malformed_record_is_corrupt_with_a_filter_too(impl, name):
    data = _one_record_batch(MALFORMED_RECORDS[name])
    with pytest.raises(CorruptRecordError):
        read(data, fetch_offset=70, header_filter=lambda h: True)


def test_record_length_beyond_payload(impl):
    data = reframe(build_batch([RecordSpec()]), encode_varint(40) + b"\x00\x00\x00\x01\x01\x00")
    with pytest.raises(CorruptRecordError):
        read(data)


def test_negative_record_length(impl):
    for length in (encode_varint(-1), encode_varint(-100), encode_varint(-(2**30))):
        data = reframe(build_batch([RecordSpec()]), length + b"\x00\x00\x00\x01\x01\x00")
        with pytest.raises(CorruptRecordError):
            read(data)


@pytest.mark.parametrize("count", [2, 3, 0, -1, 10**9])
def test_record_count_that_does_not_match_payload(impl, count):
    plain = build_batch([RecordSpec(key=b"k")], base_offset=12)
    data = reframe(plain, plain[records.BATCH_HEADER_SIZE:], count=count)
    with pytest.raises(CorruptRecordError) as info:
        read(data, fetch_offset=12)
    assert info.value.offset == 12


def test_negative_last_offset_delta(impl):
    plain = build_batch(specs(1))
    with pytest.raises(CorruptRecordError, match="last offset delta"):
        read(reframe(plain, plain[records.BATCH_HEADER_SIZE:], last_offset_delta=-1))


def test_negative_batch_length():
    data = bytearray(build_batch(specs(1), base_offset=33))
    struct.pack_into(">i", data, 8, -5)
    with pytest.raises(CorruptRecordError, match="negative") as info:
        read(bytes(data))
    assert info.value.offset == 33


@pytest.mark.parametrize("length", [0, 4, 5, 20, 48])
def test_batch_length_too_small(length):
    data = bytearray(build_batch(specs(1)))
    struct.pack_into(">i", data, 8, length)
    with pytest.raises(CorruptRecordError):
        read(bytes(data[:12 + max(length, 5)]), check_crcs=False)


@pytest.mark.parametrize("magic", [3, 7, 0x80])
def test_unknown_magic(magic):
    data = bytearray(build_batch(specs(1), base_offset=2))
    data[16] = magic
    with pytest.raises(CorruptRecordError, match="magic") as info:
        read(bytes(data), check_crcs=False)
    assert info.value.offset == 2


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(impl, codec):
    plain = build_batch(specs(1), base_offset=6)
    with pytest.raises(CorruptRecordError, match="codec") as info:
        read(reframe(plain, plain[records.BATCH_HEADER_SIZE:], codec=codec))
    assert (info.value.topic, info.value.offset) == (TOPIC, 6)


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD])
def test_garbage_compressed_payload(impl, codec):
    plain = build_batch(specs(1), base_offset=6)
    with pytest.raises(CorruptRecordError) as info:
        read(reframe(plain, b"\x00\x01this is not compressed at all" * 3, codec=codec))
    assert (info.value.topic, info.value.partition, info.value.offset) == (TOPIC, PARTITION, 6)


def test_decompression_limit_applies_to_batches(impl):
    data = build_batch([RecordSpec(value=b"\x00" * 100_000)], codec=compression.ZSTD, base_offset=3)
    with pytest.raises(CorruptRecordError, match="max_uncompressed_batch_bytes") as info:
        read(data, max_uncompressed_batch_bytes=50_000)
    assert info.value.offset == 3
    recs, _ = read(data, max_uncompressed_batch_bytes=200_000)
    assert len(recs[0].value) == 100_000


def test_header_filter_exceptions_propagate(impl):
    def boom(headers):
        raise KeyError("from the filter")

    with pytest.raises(records.HeaderFilterError) as info:
        read(build_batch(specs(1)), header_filter=boom)
    assert isinstance(info.value.__cause__, KeyError)


# -- callable header filters ----------------------------------------------------------------------

def test_callable_filter_sees_decoded_headers_before_keeping(impl):
    seen = []

    def flt(headers):
        seen.append(list(headers))
        return dict(headers).get("keep") == b"yes"

    recs_in = [RecordSpec(key=b"a", headers=[("keep", b"yes"), ("ключ", None)]),
               RecordSpec(key=b"b", headers=[("keep", b"no")]),
               RecordSpec(key=b"c", headers=[]),
               RecordSpec(key=b"d", headers=[("keep", b"yes")])]
    recs, reader = read(build_batch(recs_in, codec=compression.SNAPPY), header_filter=flt)
    assert [r.key for r in recs] == [b"a", b"d"]
    assert seen == [r.headers for r in recs_in]
    assert reader.filtered == 2
    assert recs[0].headers == [("keep", b"yes"), ("ключ", None)]


def test_truthiness_of_filter_result(impl):
    recs, reader = read(build_batch(specs(4)), header_filter=lambda h: int(h[0][1]) % 2)
    assert offsets(recs) == [1, 3] and reader.filtered == 2


# -- accelerator selection and direct loop parity -------------------------------------------------

def test_accelerator_selection():
    if records.ACCELERATED:
        assert records._decode_v2_records is record_loop.accelerated_loop
        assert records._decode_v2_records is not record_loop.python_loop
    else:
        assert records._decode_v2_records is record_loop.python_loop
    code = "from kdaemon.protocol import records as r; print(r.ACCELERATED, r._decode_v2_records is r.record_loop.python_loop)"
    env = dict(os.environ, KDAEMON_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True"]


def run_loop(fn, payload: bytes, count: int, *, base_offset=1000, base_ts=BASE_TS, log_append=None,
             epoch=5, min_offset=0, header_filter=None):
    out: list = []
    pos, filtered = fn(payload, 0, count, base_offset, base_ts, log_append,
                       LOG_APPEND_TIME if log_append is not None else CREATE_TIME, epoch, TOPIC, PARTITION,
                       min_offset, header_filter, out)
    return out, pos, filtered


PARITY_RECORDS = [
    RecordSpec(key=None, value=None, headers=[]),
    RecordSpec(key=b"", value=b"", headers=[("a", None), ("a", b"")], timestamp_delta=-1),
    RecordSpec(key=b"k" * 70, value=b"v" * 9000, headers=[("ключ", b"x" * 200)], timestamp_delta=1 << 45,
               offset_delta=3),
    RecordSpec(key=b"\x00", value=b"\xff" * 64, headers=[(f"h{i}", bytes([i])) for i in range(50)],
               timestamp_delta=-(1 << 20), offset_delta=70),
    RecordSpec(key=b"x", value=b"y", headers=[("type", b"order")], timestamp_delta=8192, offset_delta=8192),
    RecordSpec(key=b"z", value=None, headers=[("type", b"debug"), ("", None)], offset_delta=1 << 20),
]


@needs_c
@pytest.mark.parametrize("min_offset", [0, 1000, 1003, 1071, 1000 + 8192, 1000 + (1 << 20), 1000 + (1 << 20) + 1])
@pytest.mark.parametrize("log_append", [None, 1_800_000_000_000])
@pytest.mark.parametrize("flt", ["none", "callable", "rules"])
def test_loop_parity(min_offset, log_append, flt):
    payload = build_batch(PARITY_RECORDS)[records.BATCH_HEADER_SIZE:]
    rules = HeaderRules([HeaderRule("type", "equals", ("debug",), keep=False),
                         HeaderRule("h49", "exists", keep=True),
                         HeaderRule("a", "missing", keep=True)], default=False)
    py_filter = c_filter = None
    if flt == "callable":
        py_filter = c_filter = lambda headers: len(headers) % 2 == 0
    elif flt == "rules":
        py_filter, c_filter = rules, rules.native_rules
    py = run_loop(record_loop.python_loop, payload, len(PARITY_RECORDS), log_append=log_append,
                  min_offset=min_offset, header_filter=py_filter)
    c = run_loop(record_loop.accelerated_loop, payload, len(PARITY_RECORDS), log_append=log_append,
                 min_offset=min_offset, header_filter=c_filter)
    assert c == py
    assert py[1] == len(payload)
    assert all(r.offset >= min_offset for r in py[0])
    assert len(py[0]) + py[2] == sum(1 for i, r in enumerate(PARITY_RECORDS)
                                     if 1000 + (r.offset_delta if r.offset_delta is not None else i) >= min_offset)


@needs_c
def test_loop_parity_with_nonzero_start_position():
    payload = b"\xAA" * 7 + build_batch(specs(3))[records.BATCH_HEADER_SIZE:]
    results = []
    for fn in (record_loop.python_loop, record_loop.accelerated_loop):
        out: list = []
        pos, filtered = fn(payload, 7, 3, 0, BASE_TS, None, CREATE_TIME, None, TOPIC, PARTITION, 0, None, out)
        assert pos == len(payload) and filtered == 0
        assert [r.key for r in out] == [b"k0", b"k1", b"k2"]
        results.append(out)
    assert results[0] == results[1]


@needs_c
@pytest.mark.parametrize("name", list(MALFORMED_RECORDS))
def test_loop_errors_are_value_or_index_errors(name):
    """The loops' contract: malformed input raises what _read_v2 converts, nothing else."""
    payload = raw_record(MALFORMED_RECORDS[name])
    for fn in (record_loop.python_loop, record_loop.accelerated_loop):
        with pytest.raises((ValueError, IndexError, DecodeError)):
            run_loop(fn, payload, 1)


@needs_c
def test_c_loop_rejects_bad_arguments():
    with pytest.raises(TypeError):
        record_loop.accelerated_loop(b"", 0, 0)
    with pytest.raises(TypeError):
        run_loop(record_loop.accelerated_loop, bytearray(b"\x00"), 0)


def test_encode_record_layout():
    # 11 bytes: attributes 0, ts delta 1 (varlong 02), offset delta 0, key "ab", value null, 1 header
    rec = encode_record(0, 1, b"ab", None, [("h", None)])
    assert rec == encode_varint(11) + b"\x00" + encode_varlong(1) + b"\x00" + b"\x04ab" + b"\x01" + b"\x02" + b"\x02h\x01"
