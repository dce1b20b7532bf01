"""primitives: varint encodings, the bounds-checked Reader and the Writer.

Random-input properties of these live in test_records_properties.py.
"""

from __future__ import annotations

import uuid

import pytest

from kdaemon.protocol.errors import DecodeError, EncodeError
from kdaemon.protocol.primitives import (
    ZERO_UUID,
    Reader,
    Writer,
    decode_uvarint,
    decode_varint,
    decode_varlong,
    encode_uvarint,
    encode_varint,
    encode_varlong,
)

# Known encodings (Kafka's ByteUtils tests and the protobuf zigzag table).
VARINT_VECTORS = [
    (0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (-2, b"\x03"), (63, b"\x7e"), (-64, b"\x7f"),
    (64, b"\x80\x01"), (-65, b"\x81\x01"), (8191, b"\xfe\x7f"), (-8192, b"\xff\x7f"), (8192, b"\x80\x80\x01"),
    (2**31 - 1, b"\xfe\xff\xff\xff\x0f"), (-(2**31), b"\xff\xff\xff\xff\x0f"),
]
VARLONG_VECTORS = VARINT_VECTORS + [
    (2**31, b"\x80\x80\x80\x80\x10"), (2**63 - 1, b"\xfe" + b"\xff" * 8 + b"\x01"),
    (-(2**63), b"\xff" * 9 + b"\x01"),
]


@pytest.mark.parametrize("value, encoded", VARINT_VECTORS)
def test_varint_vectors(value, encoded):
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))
    assert decode_varint(b"\xaa" + encoded + b"\xbb", 1) == (value, len(encoded) + 1)


@pytest.mark.parametrize("value, encoded", VARLONG_VECTORS)
def test_varlong_vectors(value, encoded):
    assert encode_varlong(value) == encoded
    assert decode_varlong(encoded, 0) == (value, len(encoded))


@pytest.mark.parametrize("value, encoded", [(0, b"\x00"), (1, b"\x01"), (127, b"\x7f"), (128, b"\x80\x01"),
                                            (300, b"\xac\x02"), (2**32 - 1, b"\xff\xff\xff\xff\x0f")])
def test_uvarint_vectors(value, encoded):
    assert encode_uvarint(value) == encoded
    assert decode_uvarint(encoded, 0) == (value, len(encoded))


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 2**40])
def test_varint_out_of_range(value):
    with pytest.raises(EncodeError, match="32-bit"):
        encode_varint(value)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1])
def test_varlong_out_of_range(value):
    with pytest.raises(EncodeError, match="64-bit"):
        encode_varlong(value)


def test_uvarint_negative():
    with pytest.raises(EncodeError):
        encode_uvarint(-1)


@pytest.mark.parametrize("data", [b"", b"\x80", b"\xff\xff", b"\x80\x80\x80\x80"])
def test_varint_running_past_the_end(data):
    with pytest.raises(DecodeError, match="past the end"):
        decode_varint(data, 0)


def test_varint_longer_than_five_bytes():
    with pytest.raises(DecodeError, match="longer than 5"):
        decode_varint(b"\x80\x80\x80\x80\x80\x00", 0)


def test_varint_above_32_bits():
    with pytest.raises(DecodeError, match="32 bits"):
        decode_varint(b"\xff\xff\xff\xff\x1f", 0)


def test_varlong_longer_than_ten_bytes_and_above_64_bits():
    with pytest.raises(DecodeError, match="longer than 10"):
        decode_varlong(b"\x80" * 10 + b"\x00", 0)
    with pytest.raises(DecodeError, match="64 bits"):
        decode_varlong(b"\xff" * 9 + b"\x02", 0)
    assert decode_varlong(b"\xff" * 9 + b"\x01", 0)[0] == -(2**63)


def test_non_canonical_varint_is_accepted():
    assert decode_varint(b"\x82\x80\x00", 0) == (1, 3)


# -- Reader / Writer round trips -------------------------------------------------------------------

FIXED = [
    ("int8", [-128, -1, 0, 127]),
    ("int16", [-(2**15), 0, 2**15 - 1]),
    ("uint16", [0, 2**16 - 1]),
    ("int32", [-(2**31), -1, 2**31 - 1]),
    ("uint32", [0, 2**32 - 1]),
    ("int64", [-(2**63), 2**63 - 1]),
    ("float64", [0.0, -1.5, 1e300]),
    ("uvarint", [0, 127, 128, 2**32 - 1]),
    ("varint", [-(2**31), -1, 0, 2**31 - 1]),
    ("varlong", [-(2**63), 0, 2**63 - 1]),
]


@pytest.mark.parametrize("method, values", FIXED, ids=[m for m, _ in FIXED])
def test_fixed_width_round_trip(method, values):
    w = Writer()
    for v in values:
        getattr(w, method)(v)
    data = w.getvalue()
    for buf in (data, memoryview(data)):
        r = Reader(buf)
        assert [getattr(r, method)() for _ in values] == values
        assert r.remaining == 0


@pytest.mark.parametrize("method, width", [("int8", 1), ("boolean", 1), ("int16", 2), ("uint16", 2),
                                           ("int32", 4), ("uint32", 4), ("int64", 8), ("float64", 8),
                                           ("uuid", 16)])
def test_short_reads_name_the_type_and_position(method, width):
    r = Reader(b"\x00" * (width + 2), pos=3)
    with pytest.raises(DecodeError) as info:
        getattr(r, method)()
    assert (method if method != "boolean" else "bool") in str(info.value)
    assert "position 3" in str(info.value)
    assert r.pos == 3  # a failed read does not move the cursor


def test_reader_respects_end_before_buffer_end():
    r = Reader(b"\x00\x01\x02\x03\x04\x05", pos=1, end=3)
    assert r.remaining == 2
    assert r.int16() == 0x0102
    with pytest.raises(DecodeError):
        r.int8()
    r = Reader(b"\x80\x01", end=1)
    with pytest.raises(DecodeError, match="past the end of the message"):
        r.uvarint()
    for method in ("varint", "varlong"):
        with pytest.raises(DecodeError):
            getattr(Reader(b"\x80\x01", end=1), method)()


def test_boolean_and_uuid():
    u = uuid.uuid4()
    w = Writer()
    w.boolean(True)
    w.boolean(False)
    w.uuid(u)
    w.uuid(None)
    data = w.getvalue() + b"\x07"
    r = Reader(data)
    assert [r.boolean(), r.boolean(), r.uuid(), r.uuid(), r.boolean()] == [True, False, u, ZERO_UUID, True]


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize("value", ["", "kafka", "ключ-🔑", "x" * 300])
def test_string_round_trip(compact, value):
    w = Writer()
    w.string(value, compact, nullable=False)
    w.string(None, compact, nullable=True)
    r = Reader(memoryview(w.getvalue()))
    assert r.string(compact, nullable=False) == value
    assert r.string(compact, nullable=True) is None
    assert r.remaining == 0


def test_string_length_counts_utf8_bytes():
    w = Writer()
    w.string("é", compact=False, nullable=False)
    assert w.getvalue() == b"\x00\x02\xc3\xa9"
    w = Writer()
    w.string("é", compact=True, nullable=False)
    assert w.getvalue() == b"\x03\xc3\xa9"


@pytest.mark.parametrize("compact, null", [(False, b"\xff\xff"), (True, b"\x00")])
def test_null_string_where_not_nullable(compact, null):
    with pytest.raises(DecodeError, match="not allowed"):
        Reader(null).string(compact, nullable=False)


def test_negative_string_length_other_than_minus_one():
    with pytest.raises(DecodeError, match="-2"):
        Reader(b"\xff\xfe").string(False, nullable=True)


def test_invalid_utf8_string():
    with pytest.raises(DecodeError, match="UTF-8"):
        Reader(b"\x00\x02\xff\xfe").string(False, nullable=False)


def test_string_longer_than_buffer():
    with pytest.raises(DecodeError, match="short read"):
        Reader(b"\x00\x10abc").string(False, nullable=False)
    with pytest.raises(DecodeError):
        Reader(b"\x11abc").string(True, nullable=False)


@pytest.mark.parametrize("compact", [False, True])
def test_bytes_round_trip_and_slicing(compact):
    w = Writer()
    w.bytes_(b"\x00\xffdata", compact, nullable=False)
    w.bytes_(None, compact, nullable=True)
    w.bytes_(memoryview(b"mv"), compact, nullable=False)
    data = w.getvalue()
    r = Reader(data)
    assert r.bytes_(compact, False) == b"\x00\xffdata"
    assert r.bytes_(compact, True) is None
    assert r.bytes_(compact, False) == b"mv"
    mv = Reader(memoryview(data)).bytes_(compact, False)
    assert isinstance(mv, memoryview) and bytes(mv) == b"\x00\xffdata"


def test_bytes_errors():
    with pytest.raises(DecodeError, match="not allowed"):
        Reader(b"\xff\xff\xff\xff").bytes_(False, nullable=False)
    with pytest.raises(DecodeError, match="-5"):
        Reader(b"\xff\xff\xff\xfb").bytes_(False, nullable=True)
    with pytest.raises(DecodeError):
        Reader(b"\x7f\xff\xff\xff").bytes_(False, nullable=False)


@pytest.mark.parametrize("compact", [False, True])
def test_array_length(compact):
    w = Writer()
    w.array_length(3, compact, nullable=False)
    w.array_length(None, compact, nullable=True)
    r = Reader(w.getvalue() + b"abc")
    assert r.array_length(compact, False) == 3
    assert r.array_length(compact, True) is None


def test_array_length_larger_than_remaining_bytes():
    with pytest.raises(DecodeError, match="2147483647 elements"):
        Reader(b"\x7f\xff\xff\xff" + b"\x00" * 40).array_length(False, nullable=False)
    with pytest.raises(DecodeError, match="elements"):
        Reader(b"\x05abc").array_length(True, nullable=False)
    with pytest.raises(DecodeError, match="not allowed"):
        Reader(b"\xff\xff\xff\xff").array_length(False, nullable=False)


def test_raw_and_skip():
    r = Reader(b"abcdef")
    assert r.raw(2) == b"ab"
    r.skip(2)
    assert r.raw(2, "tail") == b"ef"
    with pytest.raises(DecodeError, match="tail"):
        r.raw(1, "tail")
    for bad in (-1, 7):
        with pytest.raises(DecodeError):
            Reader(b"abcdef").skip(bad)


@pytest.mark.parametrize("method, value", [
    ("int8", 128), ("int8", -129), ("int16", 2**15), ("uint16", -1), ("int32", 2**31), ("uint32", 2**32),
    ("int64", 2**63), ("int32", "1"), ("float64", "x"), ("int16", None),
])
def test_writer_rejects_out_of_range_and_wrong_types(method, value):
    with pytest.raises(EncodeError):
        getattr(Writer(), method)(value)


def test_writer_other_errors():
    with pytest.raises(EncodeError):
        Writer().string(None, False, nullable=False)
    with pytest.raises(EncodeError):
        Writer().string(b"bytes", False, nullable=False)
    with pytest.raises(EncodeError, match="too long"):
        Writer().string("x" * 0x8000, False, nullable=False)
    Writer().string("x" * 0x8000, True, nullable=False)  # compact strings have no such limit
    with pytest.raises(EncodeError):
        Writer().bytes_(None, True, nullable=False)
    with pytest.raises(EncodeError):
        Writer().bytes_("text", True, nullable=False)
    with pytest.raises(EncodeError):
        Writer().array_length(None, False, nullable=False)
    with pytest.raises(EncodeError):
        Writer().uuid("not-a-uuid")
    with pytest.raises(EncodeError):
        Writer().varint(2**31)
