"""One test per fuzzer finding (fuzz/, issue #15): the input, reduced to what matters, and the
behaviour the fix restored.  Each names the target that found it."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c

from kdaemon.protocol import record_loop, records
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.errors import CorruptRecordError
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from kdaemon.protocol.primitives import encode_varint

needs_c = pytest.mark.skipif(not records.ACCELERATED, reason="C record loop not built or disabled")


def _read(monkeypatch, data: bytes, loop: str, header_filter, **options):
    if loop == "python":
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.python_loop)
        monkeypatch.setattr(records, "ACCELERATED", False)
    else:
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.accelerated_loop)
        monkeypatch.setattr(records, "ACCELERATED", True)
    reader = records.RecordSetReader(memoryview(data), topic="t", partition=0, fetch_offset=0,
                                     header_filter=header_filter, **options)
    return reader.read_all()


def _batch_with_bad_header_key() -> bytes:
    """A batch whose second record has a header key that is not UTF-8 (0xE4 0x80: a 3-byte
    sequence cut short), the rest well formed.  Built with 'ÿ' (C3 BF) and patched, so the CRC
    no longer matches: read with check_crcs=False, as the fuzzer's mode did."""
    data = build_batch([RecordSpec(b"k0", b"v0", [("keep", b"1")]),
                        RecordSpec(b"k1", b"v1", [("drop", b"x"), ("\u00ff", b"y")])])
    assert data.count("\u00ff".encode()) == 1
    return data.replace("\u00ff".encode(), b"\xe4\x80")


@pytest.mark.parametrize("loop", ["python", pytest.param("c", marks=needs_c)])
@pytest.mark.parametrize("native", [True, False], ids=["native-rules", "python-callable"])
def test_header_key_not_utf8_is_corrupt_even_when_the_native_filter_drops_the_record(monkeypatch, loop, native):
    """records_c: the C loop's native rules dropped the record without decoding its header
    keys, so a key that is not UTF-8 went unnoticed there while the Python loop (and the C loop
    with a callable filter) reported the batch corrupt.  Both loops now reject it, whatever the
    filter."""
    rules = HeaderRules([HeaderRule("drop", "exists", keep=False)], default=True)
    assert rules.native_rules is not None
    header_filter = rules if native else (lambda headers: rules(headers))
    with pytest.raises(CorruptRecordError, match="UnicodeDecodeError"):
        _read(monkeypatch, _batch_with_bad_header_key(), loop, header_filter, check_crcs=False)


def _batch_of(*records_: bytes, base_offset: int = 0, base_timestamp: int = 1_700_000_000_000) -> bytes:
    """A v2 batch around raw record bytes, offsets 0..n-1, with a correct CRC-32C."""
    payload = b"".join(encode_varint(len(r)) + r for r in records_)
    after_crc = struct.pack(">hiqqqhii", 0, len(records_) - 1, base_timestamp, base_timestamp,
                            -1, -1, -1, len(records_)) + payload
    header = struct.pack(">qiibI", base_offset, 4 + 1 + 4 + len(after_crc), 0, 2, crc32c(after_crc))
    return header + after_crc


def _record(timestamp_delta: bytes, offset_delta: bytes, header_key: bytes) -> bytes:
    """attributes, the given raw delta varints, null key and value, one header with a null value."""
    return b"\x00" + timestamp_delta + offset_delta + b"\x01\x01\x02" + encode_varint(len(header_key)) + header_key + b"\x01"


@pytest.mark.parametrize("loop", ["python", pytest.param("c", marks=needs_c)])
@pytest.mark.parametrize("bad", [
    pytest.param((b"\x80" * 10 + b"\x00", b"\x02"), id="timestamp-delta-11-bytes"),
    pytest.param((b"\x00", b"\x80" * 5 + b"\x00"), id="offset-delta-6-bytes"),
    pytest.param((b"\x00", b"\xff\xff\xff\xff\x7f"), id="offset-delta-over-32-bits"),
])
def test_overlong_delta_in_a_dropped_record_is_corrupt_in_both_loops(monkeypatch, loop, bad):
    """records_c: the Python loop only located the timestamp and offset deltas of a record the
    filter then dropped (skipping continuation bytes without a bound), so an 11-byte varlong
    passed there while the C loop, which reads every varint with its limit, reported the batch
    corrupt.  Deltas of three bytes or more now go through the checked decoder when located."""
    data = _batch_of(_record(b"\x00", b"\x00", b"keep"), _record(*bad, b"drop"))
    rules = HeaderRules([HeaderRule("drop", "exists", keep=False)], default=True)
    with pytest.raises(CorruptRecordError, match="varint|varlong"):
        _read(monkeypatch, data, loop, rules)


def test_long_but_valid_deltas_in_a_dropped_record_still_decode(monkeypatch):
    """The checked path accepts what it should: 3-byte and 10-byte deltas that fit."""
    big_ts = b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"   # zigzag: the largest positive int64
    data = _batch_of(_record(b"\x80\x80\x01", b"\x00", b"keep"), _record(big_ts, b"\x82\x80\x00", b"drop"))
    rules = HeaderRules([HeaderRule("drop", "exists", keep=False)], default=True)
    got = _read(monkeypatch, data, "python", rules)
    assert [(r.offset, r.timestamp) for r in got] == [(0, 1_700_000_000_000 + 8192)]


INT64_MAX = (1 << 63) - 1


@needs_c
@pytest.mark.parametrize("fetch_offset", [0, INT64_MAX])
@pytest.mark.parametrize("native", [True, False], ids=["native-rules", "python-callable"])
def test_offset_and_timestamp_past_64_bits_decode_alike_in_both_loops(monkeypatch, fetch_offset, native):
    """Found while fixing the finding above, by reading the C loop (the fuzzer had not reached
    it yet): the C loop reported a record whose base + delta does not fit in 64 bits as
    corrupt, dropped or not, while the Python loop (the reference, with unbounded ints)
    delivered it.  The C loop now builds such a record with Python ints, as the Python loop does,
    and a record past the position compares by the sign of its delta."""
    data = _batch_of(_record(b"\x0a", b"\x00", b"keep"), _record(b"\x00", b"\x02", b"keep"),
                     base_offset=INT64_MAX, base_timestamp=INT64_MAX - 2)
    rules = HeaderRules([HeaderRule("drop", "exists", keep=False)], default=True)
    header_filter = rules if native else (lambda headers: rules(headers))

    def both(loop):
        monkeypatch.setattr(records, "_decode_v2_records",
                            record_loop.python_loop if loop == "python" else record_loop.accelerated_loop)
        monkeypatch.setattr(records, "ACCELERATED", loop == "c")
        reader = records.RecordSetReader(memoryview(data), topic="t", partition=0, fetch_offset=fetch_offset,
                                         header_filter=header_filter)
        return [tuple(r) for r in reader.read_all()]
    python, c = both("python"), both("c")
    assert c == python
    assert [(r[2], r[3]) for r in python] == [(INT64_MAX, INT64_MAX + 3), (INT64_MAX + 1, INT64_MAX - 2)]


def test_config_file_that_is_not_utf8_is_a_config_error(tmp_path):
    """config (found by the fuzzer): ``load`` caught TOMLDecodeError only, but tomllib decodes
    the file as UTF-8 first, so one stray byte (0xFF) let a bare UnicodeDecodeError out instead
    of a ConfigError naming the file."""
    from kdaemon.config import ConfigError, load
    path = tmp_path / "kdaemon.toml"
    path.write_bytes(b'[daemon]\ntopics = ["orders\xff"]\n')
    with pytest.raises(ConfigError, match=r"kdaemon.toml: not UTF-8 text: byte 0xff"):
        load(path)
