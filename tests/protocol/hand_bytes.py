"""The protocol's string encodings written out by hand, for tests that build frames byte by byte
(independently of ``kdaemon.protocol.primitives``, whose encoders they check)."""

from __future__ import annotations

import struct

from kdaemon.protocol.primitives import encode_uvarint


def str16(s: str | None) -> bytes:
    """STRING / NULLABLE_STRING: int16 length (-1: null), then UTF-8."""
    if s is None:
        return struct.pack(">h", -1)
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def cstr(s: str | None) -> bytes:
    """COMPACT_(NULLABLE_)STRING: unsigned varint length + 1 (0: null), then UTF-8."""
    if s is None:
        return b"\x00"
    b = s.encode()
    return encode_uvarint(len(b) + 1) + b
