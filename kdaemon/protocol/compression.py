"""Decompression (and, for tests and tools, compression) of record-batch payloads.

Every decompressor is bounded by ``max_size``: a few kilobytes of zstd can describe gigabytes of
zeros, and "never allocate more than the input justifies" means the caller decides how much a
batch may expand to (``max_uncompressed_batch_bytes`` in the client).

Snappy comes in two framings: the raw block format, and the *xerial* stream format that Java
producers (snappy-java) write: an 8-byte magic ``\\x82SNAPPY\\x00``, two int32 versions, then
blocks each prefixed by an int32 compressed length.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam
import lz4.frame
import zstandard

from .errors import CorruptRecordError, UnsupportedCodecError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
CODEC_BY_NAME = {v: k for k, v in CODEC_NAMES.items()}

DEFAULT_MAX_UNCOMPRESSED = 256 * 1024 * 1024

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_I32 = struct.Struct(">i")

_zstd_decompressor = zstandard.ZstdDecompressor()


def decompress(codec: int, data, max_size: int = DEFAULT_MAX_UNCOMPRESSED) -> bytes:
    """Return the uncompressed payload or raise ``CorruptRecordError``/``UnsupportedCodecError``."""
    try:
        if codec == GZIP:
            out = _gunzip(data, max_size)
        elif codec == SNAPPY:
            out = _unsnappy(data, max_size)
        elif codec == LZ4:
            out = _unlz4(data, max_size)
        elif codec == ZSTD:
            out = _unzstd(data, max_size)
        elif codec == NONE:
            return bytes(data)
        else:
            raise UnsupportedCodecError(f"compression codec id {codec} is not known "
                                        "(0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd)")
    except CorruptRecordError:
        raise
    except Exception as exc:  # each library has its own error types; none may escape as such
        name = CODEC_NAMES.get(codec, str(codec))
        raise CorruptRecordError(f"{name} payload does not decompress: {type(exc).__name__}: {exc}") from None
    if len(out) > max_size:
        raise CorruptRecordError(f"payload expands beyond the limit of {max_size} bytes")
    return out


def _too_big(max_size: int) -> CorruptRecordError:
    return CorruptRecordError(
        f"payload expands beyond max_uncompressed_batch_bytes={max_size}; raise the limit if "
        "such batches are legitimate")


def _gunzip(data, max_size: int) -> bytes:
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, max_size + 1)
    if len(out) > max_size:
        raise _too_big(max_size)
    if not d.eof:
        raise CorruptRecordError("gzip stream is truncated")
    return out


def _unlz4(data, max_size: int) -> bytes:
    data = bytes(data)
    declared = lz4.frame.get_frame_info(data).get("content_size") or 0
    if declared > max_size:
        raise _too_big(max_size)
    if declared:
        # The frame says how big it is: the one-shot call allocates exactly that (and is
        # several times faster than the streaming object).  It raises on a truncated frame.
        out = lz4.frame.decompress(data)
        if len(out) != declared:
            raise CorruptRecordError(f"lz4 frame declares {declared} bytes but holds {len(out)}")
        return out
    # No declared size: bounded steps (a max_length of max_size would allocate all of it).
    d = lz4.frame.LZ4FrameDecompressor()
    parts, total, chunk = [], 0, 1 << 20
    part = d.decompress(data, max_length=chunk)
    while True:
        total += len(part)
        if total > max_size:
            raise _too_big(max_size)
        parts.append(part)
        if d.eof or d.needs_input:
            break
        part = d.decompress(b"", max_length=chunk)
    if not d.eof:
        raise CorruptRecordError("lz4 frame is truncated")
    return b"".join(parts)


def _unzstd(data, max_size: int) -> bytes:
    data = bytes(data)
    declared = zstandard.frame_content_size(data)
    if declared > max_size:
        raise _too_big(max_size)
    if declared >= 0:
        return _zstd_decompressor.decompress(data)
    # Streaming producers (zstd-jni, librdkafka) do not declare the size.  decompressobj has no
    # output cap, so feed it small slices: one 2 KiB slice cannot expand past ~64 MiB even as
    # run-length blocks, which bounds how far past the limit we can get before we notice.
    d = _zstd_decompressor.decompressobj()
    parts = []
    total = 0
    for i in range(0, len(data), 2048):
        chunk = d.decompress(data[i:i + 2048])
        if chunk:
            total += len(chunk)
            if total > max_size:
                raise _too_big(max_size)
            parts.append(chunk)
        if d.eof:
            break
    if not d.eof:
        raise CorruptRecordError("zstd frame is truncated")
    return b"".join(parts)


def _snappy_block(block, budget: int, max_size: int) -> bytes:
    # The raw format starts with the uncompressed length as an unsigned varint: check it before
    # letting the library allocate.  ``budget`` is what is left of ``max_size`` after earlier
    # xerial blocks; the error names the configured limit, not the remainder.
    n, shift, i = 0, 0, 0
    while True:
        if i >= len(block) or i > 4:
            raise CorruptRecordError("snappy block has no valid length header")
        b = block[i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            break
        shift += 7
    if n > budget:
        raise _too_big(max_size)
    return bytes(cramjam.snappy.decompress_raw(bytes(block)))


def _unsnappy(data, max_size: int) -> bytes:
    data = bytes(data)
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, max_size, max_size)
    pos = 16  # magic(8) + version(4) + compatible version(4)
    if len(data) < pos:
        raise CorruptRecordError("xerial snappy header is truncated")
    parts = []
    total = 0
    end = len(data)
    while pos < end:
        if end - pos < 4:
            raise CorruptRecordError("xerial snappy block length is truncated")
        n = _I32.unpack_from(data, pos)[0]
        pos += 4
        if n < 0 or pos + n > end:
            raise CorruptRecordError(f"xerial snappy block of {n} bytes runs past the payload")
        part = _snappy_block(data[pos:pos + n], max_size - total, max_size)
        total += len(part)
        parts.append(part)
        pos += n
    return b"".join(parts)


def compress(codec: int, data: bytes, *, xerial: bool = False) -> bytes:
    """Compress a payload.  Used by the batch builder in tests and tools, not by the consumer."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return gzip.compress(data)
    if codec == SNAPPY:
        block = bytes(cramjam.snappy.compress_raw(data))
        if not xerial:
            return block
        return _XERIAL_MAGIC + _I32.pack(1) + _I32.pack(1) + _I32.pack(len(block)) + block
    if codec == LZ4:
        return lz4.frame.compress(data)
    if codec == ZSTD:
        return zstandard.ZstdCompressor().compress(data)
    raise UnsupportedCodecError(f"compression codec id {codec} is not known")
