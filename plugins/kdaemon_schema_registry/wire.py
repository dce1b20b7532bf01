"""The Confluent wire format shared by every Schema Registry serializer::

    byte 0      magic byte, always 0
    bytes 1-4   schema id, big-endian unsigned 32-bit (the registry's global id)
    bytes 5-    the payload (Avro: the binary datum alone, no container header)

Protobuf and JSON Schema use the same five-byte header; Protobuf adds message indexes after it
(``message_indexes`` below), JSON Schema puts the UTF-8 JSON text there.
"""

from __future__ import annotations

import struct

from .errors import WireFormatError

MAGIC = 0
HEADER = struct.Struct(">BI")   # magic, schema id
HEADER_SIZE = HEADER.size       # 5


def split(data: bytes) -> tuple[int, memoryview]:
    """``(schema_id, payload)`` of one serialized key or value; raises ``WireFormatError``."""
    if len(data) < HEADER_SIZE:
        raise WireFormatError(
            f"{len(data)} byte(s) is too short for the Confluent wire format "
            f"(magic byte 0, 4-byte schema id, then the payload)")
    magic, schema_id = HEADER.unpack_from(data)
    if magic != MAGIC:
        hint = " (it looks like JSON text: was it written without a registry serializer?)" \
            if magic in (0x7B, 0x5B) else ""
        raise WireFormatError(f"magic byte is 0x{magic:02x}, not 0x00: not written by a Schema "
                              f"Registry serializer{hint}")
    return schema_id, memoryview(data)[HEADER_SIZE:]


# -- Protobuf's message indexes ------------------------------------------------------------------
#
# Confluent's Protobuf serializers put, between the header and the protobuf payload, which
# message of the schema's .proto file was written: an array of indexes, each a zigzag varint
# (protobuf's sint32 encoding), preceded by its length (also a zigzag varint).  The first index
# is the message's position among the file's top-level messages, each next one its position
# among the previous one's nested messages.  The common case, the file's first message, is
# written as the single byte 0 (an empty array) instead of [1, 0].

MAX_VARINT_BYTES = 5        # a 32-bit value, as Java's ByteUtils.readVarint reads it


def _zigzag_varint(data, pos: int, what: str) -> tuple[int, int]:
    """(value, next position) of one zigzag varint at ``pos``; ``WireFormatError`` otherwise."""
    shift = result = 0
    for i in range(MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise WireFormatError(f"the Protobuf message indexes end inside {what} (the value is "
                                  f"{len(data)} byte(s) after the 5-byte header)")
        byte = data[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), pos + i + 1
        shift += 7
    raise WireFormatError(f"the Protobuf message indexes have a varint longer than {MAX_VARINT_BYTES} "
                          f"bytes in {what}: not written by a Confluent Protobuf serializer")


def message_indexes(payload) -> tuple[tuple[int, ...], int]:
    """``(indexes, offset of the protobuf message)`` of a Protobuf payload (after the header).

    ``(0,)`` for the single-zero shorthand.  Raises ``WireFormatError`` for a truncated or
    negative count or index, or a count longer than the bytes that follow."""
    count, pos = _zigzag_varint(payload, 0, "their count")
    if count == 0:
        return (0,), pos
    if count < 0 or count > len(payload) - pos:
        raise WireFormatError(f"the Protobuf message-index count is {count}, with {len(payload) - pos} "
                              "byte(s) left: not written by a Confluent Protobuf serializer")
    indexes = []
    for n in range(count):
        index, pos = _zigzag_varint(payload, pos, f"index {n}")
        if index < 0:
            raise WireFormatError(f"the Protobuf message index {n} is negative ({index}): not written by "
                                  "a Confluent Protobuf serializer")
        indexes.append(index)
    return tuple(indexes), pos
