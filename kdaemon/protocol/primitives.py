"""Kafka's primitive types: a bounds-checked reader and an append-only writer.

Every read checks the remaining length first and raises ``DecodeError`` naming the type and the
position, so untrusted bytes can never surface as ``IndexError`` or ``struct.error`` from deep
inside a message.  Length prefixes (strings, bytes, arrays) are checked against the bytes that are
actually left before anything is allocated: an array claiming two billion elements in a
forty-byte frame fails at once instead of looping.
"""

from __future__ import annotations

import struct
import uuid

from .errors import DecodeError, EncodeError

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

ZERO_UUID = uuid.UUID(int=0)


def encode_uvarint(value: int) -> bytes:
    """Unsigned LEB128, as used by compact lengths and tagged-field headers."""
    if value < 0:
        raise EncodeError(f"unsigned varint cannot hold {value}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zigzag varint (32-bit range) as used inside records."""
    if not -(1 << 31) <= value < (1 << 31):
        raise EncodeError(f"varint out of 32-bit range: {value}")
    return encode_uvarint((value << 1) ^ (value >> 31))


def encode_varlong(value: int) -> bytes:
    """Zigzag varlong (64-bit range) as used inside records."""
    if not -(1 << 63) <= value < (1 << 63):
        raise EncodeError(f"varlong out of 64-bit range: {value}")
    return encode_uvarint((value << 1) ^ (value >> 63))


def decode_uvarint(buf, pos: int, max_bytes: int = 10) -> tuple[int, int]:
    """Decode an unsigned varint at ``pos``; return (value, new_pos).

    ``max_bytes`` is 5 for 32-bit quantities and 10 for 64-bit ones; a longer run of
    continuation bits is corruption, not a big number.
    """
    result = 0
    shift = 0
    end = len(buf)
    for _ in range(max_bytes):
        if pos >= end:
            raise DecodeError(f"varint runs past the end of the buffer at position {pos}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
    raise DecodeError(f"varint longer than {max_bytes} bytes ending at position {pos}")


def decode_varint(buf, pos: int) -> tuple[int, int]:
    """Zigzag-decode a 32-bit varint at ``pos``; return (value, new_pos)."""
    raw, pos = decode_uvarint(buf, pos, 5)
    if raw >> 32:
        raise DecodeError(f"varint exceeds 32 bits before position {pos}")
    return (raw >> 1) ^ -(raw & 1), pos


def decode_varlong(buf, pos: int) -> tuple[int, int]:
    """Zigzag-decode a 64-bit varlong at ``pos``; return (value, new_pos)."""
    raw, pos = decode_uvarint(buf, pos, 10)
    if raw >> 64:
        raise DecodeError(f"varlong exceeds 64 bits before position {pos}")
    return (raw >> 1) ^ -(raw & 1), pos


class Reader:
    """A cursor over a bytes-like object.  ``buf`` may be ``bytes`` or a ``memoryview``."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf, pos: int = 0, end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def _need(self, n: int, what: str) -> int:
        pos = self.pos
        if n < 0 or pos + n > self.end:
            raise DecodeError(f"short read: {what} needs {n} bytes at position {pos}, "
                              f"{self.end - pos} left")
        self.pos = pos + n
        return pos

    def int8(self) -> int:
        return _I8.unpack_from(self.buf, self._need(1, "int8"))[0]

    def boolean(self) -> bool:
        return self.buf[self._need(1, "bool")] != 0

    def int16(self) -> int:
        return _I16.unpack_from(self.buf, self._need(2, "int16"))[0]

    def uint16(self) -> int:
        return _U16.unpack_from(self.buf, self._need(2, "uint16"))[0]

    def int32(self) -> int:
        return _I32.unpack_from(self.buf, self._need(4, "int32"))[0]

    def uint32(self) -> int:
        return _U32.unpack_from(self.buf, self._need(4, "uint32"))[0]

    def int64(self) -> int:
        return _I64.unpack_from(self.buf, self._need(8, "int64"))[0]

    def float64(self) -> float:
        return _F64.unpack_from(self.buf, self._need(8, "float64"))[0]

    def uuid(self) -> uuid.UUID:
        start = self._need(16, "uuid")
        return uuid.UUID(bytes=bytes(self.buf[start:start + 16]))

    def uvarint(self) -> int:
        value, self.pos = decode_uvarint(self.buf, self.pos, 5)
        if self.pos > self.end:
            raise DecodeError("unsigned varint runs past the end of the message")
        return value

    def varint(self) -> int:
        value, self.pos = decode_varint(self.buf, self.pos)
        if self.pos > self.end:
            raise DecodeError("varint runs past the end of the message")
        return value

    def varlong(self) -> int:
        value, self.pos = decode_varlong(self.buf, self.pos)
        if self.pos > self.end:
            raise DecodeError("varlong runs past the end of the message")
        return value

    def raw(self, n: int, what: str = "bytes"):
        start = self._need(n, what)
        return self.buf[start:start + n]

    def skip(self, n: int) -> None:
        self._need(n, "skipped bytes")

    # Length-prefixed values.  ``compact`` lengths are unsigned varints holding length + 1 with 0
    # meaning null; classic lengths are int16 (strings) or int32 (bytes, arrays) with -1 as null.

    def _length(self, compact: bool, classic_width: int) -> int:
        if compact:
            return self.uvarint() - 1
        return self.int16() if classic_width == 2 else self.int32()

    def string(self, compact: bool, nullable: bool) -> str | None:
        n = self._length(compact, 2)
        if n < 0:
            if n == -1 and nullable:
                return None
            raise DecodeError(f"string length {n} at position {self.pos} is not allowed here")
        start = self._need(n, "string")
        try:
            return str(self.buf[start:start + n], "utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"string at position {start} is not valid UTF-8: {exc.reason}") from None

    def bytes_(self, compact: bool, nullable: bool):
        """Bytes as a slice of the underlying buffer (a memoryview slice when the buffer is one)."""
        n = self._length(compact, 4)
        if n < 0:
            if n == -1 and nullable:
                return None
            raise DecodeError(f"bytes length {n} at position {self.pos} is not allowed here")
        start = self._need(n, "bytes")
        return self.buf[start:start + n]

    def array_length(self, compact: bool, nullable: bool) -> int | None:
        n = self._length(compact, 4)
        if n < 0:
            if n == -1 and nullable:
                return None
            raise DecodeError(f"array length {n} at position {self.pos} is not allowed here")
        # Every element of every array in the protocol takes at least one byte.
        if n > self.end - self.pos:
            raise DecodeError(f"array claims {n} elements but only {self.end - self.pos} bytes remain")
        return n


class Writer:
    """Append-only builder; ``getvalue()`` returns the bytes."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self.buf)

    def _pack(self, st: struct.Struct, value, what: str) -> None:
        try:
            self.buf += st.pack(value)
        except (struct.error, TypeError) as exc:
            raise EncodeError(f"cannot encode {value!r} as {what}: {exc}") from None

    def int8(self, v: int) -> None:
        self._pack(_I8, v, "int8")

    def boolean(self, v: bool) -> None:
        self.buf.append(1 if v else 0)

    def int16(self, v: int) -> None:
        self._pack(_I16, v, "int16")

    def uint16(self, v: int) -> None:
        self._pack(_U16, v, "uint16")

    def int32(self, v: int) -> None:
        self._pack(_I32, v, "int32")

    def uint32(self, v: int) -> None:
        self._pack(_U32, v, "uint32")

    def int64(self, v: int) -> None:
        self._pack(_I64, v, "int64")

    def float64(self, v: float) -> None:
        self._pack(_F64, v, "float64")

    def uuid(self, v: uuid.UUID | None) -> None:
        if v is None:
            v = ZERO_UUID
        if not isinstance(v, uuid.UUID):
            raise EncodeError(f"expected uuid.UUID, got {type(v).__name__}")
        self.buf += v.bytes

    def uvarint(self, v: int) -> None:
        self.buf += encode_uvarint(v)

    def varint(self, v: int) -> None:
        self.buf += encode_varint(v)

    def varlong(self, v: int) -> None:
        self.buf += encode_varlong(v)

    def raw(self, data) -> None:
        self.buf += data

    def _length(self, n: int, compact: bool, classic_width: int) -> None:
        if compact:
            self.uvarint(n + 1)
        elif classic_width == 2:
            self.int16(n)
        else:
            self.int32(n)

    def string(self, v: str | None, compact: bool, nullable: bool) -> None:
        if v is None:
            if not nullable:
                raise EncodeError("null given for a non-nullable string")
            self._length(-1, compact, 2)
            return
        if not isinstance(v, str):
            raise EncodeError(f"expected str, got {type(v).__name__}")
        data = v.encode("utf-8")
        if not compact and len(data) > 0x7FFF:
            raise EncodeError(f"string of {len(data)} bytes is too long for an int16 length")
        self._length(len(data), compact, 2)
        self.buf += data

    def bytes_(self, v, compact: bool, nullable: bool) -> None:
        if v is None:
            if not nullable:
                raise EncodeError("null given for non-nullable bytes")
            self._length(-1, compact, 4)
            return
        if not isinstance(v, (bytes, bytearray, memoryview)):
            raise EncodeError(f"expected bytes, got {type(v).__name__}")
        self._length(len(v), compact, 4)
        self.buf += v

    def array_length(self, n: int | None, compact: bool, nullable: bool) -> None:
        if n is None:
            if not nullable:
                raise EncodeError("null given for a non-nullable array")
            n = -1
        self._length(n, compact, 4)
