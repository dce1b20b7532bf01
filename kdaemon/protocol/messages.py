"""Request/response headers and whole-frame encoding on top of the generic codec.

Request header v1: api_key int16, api_version int16, correlation_id int32, client_id nullable
string (always the classic int16-length form, even in v2).  v2 adds a tagged-field section.
Response header v0: correlation_id int32; v1 adds a tagged-field section.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from . import codec
from .errors import DecodeError, Errors
from .primitives import Reader, Writer
from .schema import Api

_SIZE = struct.Struct(">i")
_HEADER_FIXED = struct.Struct(">hhi")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def encode_request(api: Api, version: int, correlation_id: int, client_id: str | None,
                   body: dict) -> bytes:
    """Return a complete size-prefixed request frame."""
    if not api.min_version <= version <= api.max_version:
        raise ValueError(f"{api.name} v{version} is outside the implemented range "
                         f"{api.min_version}-{api.max_version}")
    w = Writer()
    w.raw(b"\0\0\0\0")  # size, patched below
    w.raw(_HEADER_FIXED.pack(api.key, version, correlation_id))
    w.string(client_id, compact=False, nullable=True)
    flexible = api.is_flexible(version)
    if api.request_header_version(version) >= 2:
        w.uvarint(0)  # no tagged header fields
    codec.encode_into(w, api.request, version, flexible, body)
    buf = w.buf
    buf[0:4] = _SIZE.pack(len(buf) - 4)
    return bytes(buf)


def decode_request(api_lookup, frame) -> tuple[RequestHeader, dict]:
    """Decode a request frame body (without size prefix).  Used by tests and fake brokers."""
    r = Reader(frame)
    api_key, version, correlation_id = r.int16(), r.int16(), r.int32()
    client_id = r.string(compact=False, nullable=True)
    api = api_lookup(api_key)
    if api.request_header_version(version) >= 2:
        _skip_tagged(r)
    body = codec.decode(api.request, version, api.is_flexible(version), r)
    _expect_end(r, f"{api.name} v{version} request")
    return RequestHeader(api_key, version, correlation_id, client_id), body


def encode_response(api: Api, version: int, correlation_id: int, body: dict) -> bytes:
    """Return a complete size-prefixed response frame.  Used by tests and fake brokers."""
    w = Writer()
    w.raw(b"\0\0\0\0")
    w.int32(correlation_id)
    if api.response_header_version(version) >= 1:
        w.uvarint(0)
    codec.encode_into(w, api.response, version, api.is_flexible(version), body)
    buf = w.buf
    buf[0:4] = _SIZE.pack(len(buf) - 4)
    return bytes(buf)


def read_correlation_id(frame) -> int:
    if len(frame) < 4:
        raise DecodeError(f"response frame of {len(frame)} bytes has no correlation id")
    return _SIZE.unpack_from(frame, 0)[0]


def decode_response(api: Api, version: int, frame) -> dict:
    """Decode a response frame body (without size prefix, correlation id included), strictly."""
    return read_response(api, version, frame, strict=True)[0]


def read_response(api: Api, version: int, frame, *, strict: bool = True) -> tuple[dict, int]:
    """Decode a response frame body (without size prefix, correlation id included).

    Returns the body and the number of trailing bytes left after it.  With ``strict`` (the
    default) trailing bytes are an error: they mean our spec and the broker disagree.  Clients
    talking to real brokers pass ``strict=False``, as the Java client effectively does, because
    some brokers pad (librdkafka's mock cluster adds a zero byte to Metadata responses).

    ApiVersions is special: a broker that does not support the requested version answers
    UNSUPPORTED_VERSION in the v0 layout, so that body is decoded as v0 whatever we asked for.
    """
    r = Reader(frame)
    r.int32()  # correlation id, matched by the connection
    if api.response_header_version(version) >= 1:
        _skip_tagged(r)
    if api.key == 18 and version > 0 and r.remaining >= 2:
        if _HEADER_FIXED_ERR.unpack_from(frame, r.pos)[0] == Errors.UNSUPPORTED_VERSION:
            return _unsupported_api_versions(api, version, frame, r.pos), 0
    body = codec.decode(api.response, version, api.is_flexible(version), r)
    if strict:
        _expect_end(r, f"{api.name} v{version} response")
    return body, r.remaining


_HEADER_FIXED_ERR = struct.Struct(">h")


def _unsupported_api_versions(api: Api, version: int, frame, start: int) -> dict:
    """Read an UNSUPPORTED_VERSION answer to ApiVersions as well as the broker wrote it.

    KIP-511 says the body is in the v0 layout, and Kafka does that.  librdkafka's mock cluster
    writes a body of its own (a one-byte count, the ApiVersions entry, a throttle time).  What we
    need from it is at most the broker's ApiVersions range; if no layout fits, an empty list
    makes the caller step down one version and ask again.
    """
    for layout_version, flexible in ((0, False), (version, api.is_flexible(version))):
        r = Reader(frame, start)
        try:
            body = codec.decode(api.response, layout_version, flexible, r)
        except DecodeError:
            continue
        if all(0 <= e["min_version"] <= e["max_version"] for e in body["api_keys"]):
            return body
    body = api.response.default()
    body["error_code"] = Errors.UNSUPPORTED_VERSION
    return body


def _skip_tagged(r: Reader) -> None:
    for _ in range(r.uvarint()):
        r.uvarint()
        r.skip(r.uvarint())


def _expect_end(r: Reader, what: str) -> None:
    if r.remaining:
        raise DecodeError(f"{what} has {r.remaining} unexpected trailing bytes")
