"""compression: every codec and framing decodes, every failure is a CorruptRecordError, and the
uncompressed size limit holds exactly at its boundary.  Bomb properties: test_records_properties."""

from __future__ import annotations

import gzip
import struct

import cramjam
import lz4.frame
import pytest
import zstandard

from kdaemon.protocol import compression
from kdaemon.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, compress, decompress
from kdaemon.protocol.errors import CorruptRecordError, UnsupportedCodecError

XERIAL = b"\x82SNAPPY\x00"
PAYLOADS = [b"", b"a", b"hello kafka " * 100, bytes(range(256)) * 300]


def xerial(*blocks: bytes) -> bytes:
    out = XERIAL + struct.pack(">ii", 1, 1)
    for block in blocks:
        out += struct.pack(">i", len(block)) + block
    return out


def snappy_block(data: bytes) -> bytes:
    return bytes(cramjam.snappy.compress_raw(data))


def zstd_no_size(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(write_content_size=False).compress(data)


ENCODERS = {
    "none": (NONE, lambda d: d),
    "gzip": (GZIP, gzip.compress),
    "snappy-raw": (SNAPPY, snappy_block),
    "snappy-xerial": (SNAPPY, lambda d: compress(SNAPPY, d, xerial=True)),
    "snappy-xerial-3-blocks": (SNAPPY, lambda d: xerial(snappy_block(d[:len(d) // 3]),
                                                        snappy_block(d[len(d) // 3:2 * len(d) // 3]),
                                                        snappy_block(d[2 * len(d) // 3:]))),
    "lz4": (LZ4, lz4.frame.compress),
    "lz4-no-size": (LZ4, lambda d: lz4.frame.compress(d, store_size=False)),
    "lz4-block-checksum": (LZ4, lambda d: lz4.frame.compress(d, block_checksum=True, content_checksum=True)),
    "zstd": (ZSTD, lambda d: zstandard.ZstdCompressor().compress(d)),
    "zstd-no-size": (ZSTD, zstd_no_size),
    "zstd-streamed": (ZSTD, lambda d: _zstd_streamed(d)),
}


def _zstd_streamed(data: bytes) -> bytes:
    cobj = zstandard.ZstdCompressor().compressobj()
    out = b""
    for i in range(0, len(data), 1000):
        out += cobj.compress(data[i:i + 1000])
    return out + cobj.flush()


@pytest.mark.parametrize("name", list(ENCODERS))
@pytest.mark.parametrize("payload", PAYLOADS, ids=["empty", "one", "text", "binary"])
def test_decompress_every_codec_and_framing(name, payload):
    codec, encode = ENCODERS[name]
    encoded = encode(payload)
    out = decompress(codec, encoded)
    assert out == payload and type(out) is bytes
    assert decompress(codec, memoryview(encoded)) == payload
    assert decompress(codec, bytearray(encoded)) == payload


def test_fixtures_have_the_framing_they_claim():
    assert zstandard.frame_content_size(ENCODERS["zstd-no-size"][1](b"x" * 100)) == -1
    assert zstandard.frame_content_size(_zstd_streamed(b"x" * 5000)) == -1
    assert zstandard.frame_content_size(ENCODERS["zstd"][1](b"x" * 100)) == 100
    assert compress(SNAPPY, b"abc", xerial=True).startswith(XERIAL)
    assert not compress(SNAPPY, b"abc").startswith(XERIAL)


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
@pytest.mark.parametrize("payload", PAYLOADS, ids=["empty", "one", "text", "binary"])
def test_compress_round_trip(codec, payload):
    assert decompress(codec, compress(codec, payload)) == payload


@pytest.mark.parametrize("codec", [5, 6, 7, -1, 100])
def test_unknown_codec(codec):
    with pytest.raises(UnsupportedCodecError, match="codec id") as info:
        decompress(codec, b"abc")
    assert isinstance(info.value, CorruptRecordError)
    with pytest.raises(UnsupportedCodecError):
        compress(codec, b"abc")


GARBAGE = [b"", b"\x00", b"not compressed at all, just text" * 4, b"\xff" * 64]


@pytest.mark.parametrize("codec, data", [
    pytest.param(codec, data, id=f"{compression.CODEC_NAMES[codec]}-{name}")
    for codec in (GZIP, SNAPPY, LZ4, ZSTD)
    for name, data in zip(("empty", "zero", "text", "ff"), GARBAGE)
    if not (codec == SNAPPY and data == b"\x00")  # the raw snappy block of b"": see below
])
def test_garbage_is_corrupt_record_error(codec, data):
    with pytest.raises(CorruptRecordError) as info:
        decompress(codec, data)
    assert type(info.value) is CorruptRecordError
    assert info.value.reason


@pytest.mark.parametrize("name", ["gzip", "lz4", "zstd", "zstd-no-size", "snappy-raw", "snappy-xerial"])
@pytest.mark.parametrize("cut", [1, 4, 10])
def test_truncated_streams_are_corrupt(name, cut):
    codec, encode = ENCODERS[name]
    encoded = encode(bytes(range(256)) * 40)
    with pytest.raises(CorruptRecordError):
        decompress(codec, encoded[:-cut])


def test_xerial_framing_errors():
    block = snappy_block(b"payload")
    with pytest.raises(CorruptRecordError, match="truncated"):
        decompress(SNAPPY, xerial(block) + b"\x00\x00")
    with pytest.raises(CorruptRecordError, match="runs past"):
        decompress(SNAPPY, XERIAL + struct.pack(">iii", 1, 1, len(block) + 1) + block)
    with pytest.raises(CorruptRecordError, match="runs past"):
        decompress(SNAPPY, XERIAL + struct.pack(">iii", 1, 1, -4) + block)
    assert decompress(SNAPPY, xerial()) == b""  # header only: no blocks
    for cut in (1, 4, 8):
        with pytest.raises(CorruptRecordError, match="header is truncated"):
            decompress(SNAPPY, xerial()[:-cut])
    assert decompress(SNAPPY, xerial(block, snappy_block(b""), block)) == b"payloadpayload"


def test_single_zero_byte_is_the_empty_raw_snappy_block():
    assert snappy_block(b"") == b"\x00"
    assert decompress(SNAPPY, b"\x00") == b""


def test_snappy_block_with_bad_length_header():
    with pytest.raises(CorruptRecordError, match="length header"):
        decompress(SNAPPY, b"\xff\xff\xff\xff\xff\xff\x01")
    with pytest.raises(CorruptRecordError):
        decompress(SNAPPY, xerial(b"\x80"))


@pytest.mark.parametrize("name", [n for n in ENCODERS if n != "none"])
def test_limit_boundary(name):
    codec, encode = ENCODERS[name]
    payload = bytes(range(256)) * 16  # 4096 bytes
    encoded = encode(payload)
    assert decompress(codec, encoded, max_size=4096) == payload
    with pytest.raises(CorruptRecordError, match="4095"):
        decompress(codec, encoded, max_size=4095)


def test_limit_for_none_codec_is_not_applied():
    # Uncompressed payloads are already in memory: the limit is about expansion only.
    assert decompress(NONE, b"x" * 100, max_size=10) == b"x" * 100


def test_xerial_limit_counts_all_blocks():
    blocks = [snappy_block(b"a" * 1000) for _ in range(3)]
    assert decompress(SNAPPY, xerial(*blocks), max_size=3000) == b"a" * 3000
    with pytest.raises(CorruptRecordError, match="2999"):
        decompress(SNAPPY, xerial(*blocks), max_size=2999)


def test_zstd_declared_size_is_checked_before_decompressing():
    frame = zstandard.ZstdCompressor().compress(b"\x00" * 10_000)
    with pytest.raises(CorruptRecordError, match="max_uncompressed_batch_bytes=9999"):
        decompress(ZSTD, frame, max_size=9_999)


def test_codec_names():
    assert compression.CODEC_BY_NAME == {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
