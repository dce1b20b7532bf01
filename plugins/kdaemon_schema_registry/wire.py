"""The Confluent wire format shared by every Schema Registry serializer::

    byte 0      magic byte, always 0
    bytes 1-4   schema id, big-endian unsigned 32-bit (the registry's global id)
    bytes 5-    the payload (Avro: the binary datum alone, no container header)

Protobuf and JSON Schema use the same five-byte header (Protobuf adds message indexes after it).
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
