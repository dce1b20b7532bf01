"""Records as JSON: the one line format every kdaemon sink (and the dead-letter queue) writes.

One record is one JSON object::

    {"topic": "orders", "partition": 0, "offset": 42, "timestamp": 1700000000000,
     "timestamp_type": 0, "key": ..., "value": ..., "headers": [["trace", {"base64": "..."}]]}

``key`` and ``value`` are written as the deserializer produced them: JSON-native values (from
the ``json`` deserializer) and ``str`` as they are, ``None`` as ``null``, and ``bytes`` as
``{"base64": "..."}`` — at any depth, so an interceptor that puts bytes inside a dict is fine
too.  Header values are bytes or null and use the same form.  ``decode_data`` is the inverse.
A JSON *value* that is itself exactly ``{"base64": "<str>"}`` reads back as bytes; a consumer
that must tell the two apart should not configure a JSON deserializer for such data.

A dead-letter entry is an ordinary ``Record`` (see ``dead_letter``): its key and value are the
raw bytes from the broker and two headers say what failed, so the same files and the same
reader serve both.

Speed matters here (every delivered record passes through ``record_to_json``): one shared
C-accelerated encoder, compact separators, bytes converted only when present.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Iterable, Sequence
from typing import Any

from ..plugins.types import Record

ERROR_HEADER = "kdaemon.error"
STAGE_HEADER = "kdaemon.stage"
# Which configured plugin raised, as ``<setting>=<name>`` ("deserializer.value=json",
# "sink.type=jsonl"): the line of the file to look at.  Only when the caller knows it.
PLUGIN_HEADER = "kdaemon.plugin"
# "delivery": a share group's record on its last delivery, dead-lettered before any plugin saw it
# (kdaemon/worker/share.py).
STAGES = ("deserialize", "interceptor", "sink", "delivery")
_MAX_ERROR_BYTES = 1024


def _b64(data: bytes | bytearray | memoryview) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def json_default(obj: Any) -> Any:
    """``default=`` for ``json``: bytes-like → ``{"base64": ...}``; anything else is an error."""
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return {"base64": _b64(obj)}
    raise TypeError(f"a {type(obj).__name__} cannot be written as JSON "
                    "(key/value must be JSON-native, str, bytes or None)")


# One encoder for the whole process: json.dumps(..., separators=..., default=...) would build a
# new JSONEncoder per call.  ensure_ascii (the default) keeps lone surrogates from a
# "surrogateescape" str deserializer writable and makes every line pure ASCII.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=json_default)
_encode = _ENCODER.encode
_b2a = binascii.b2a_base64


def record_to_object(record: Record) -> dict:
    """The record as a dict of the line format's fields (values not yet JSON-converted)."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset,
            "timestamp": record.timestamp, "timestamp_type": record.timestamp_type,
            "key": record.key, "value": record.value, "headers": record.headers}


def record_to_json(record: Record) -> str:
    """One line (without the newline).  Raises TypeError for a key/value JSON cannot hold."""
    # Top-level bytes (the usual case for keys and header values) are converted here rather
    # than through json_default: ~15% faster; nested or other bytes-like still go that way.
    key, value, headers = record.key, record.value, record.headers
    if key.__class__ is bytes:
        key = {"base64": _b2a(key, newline=False).decode("ascii")}
    if value.__class__ is bytes:
        value = {"base64": _b2a(value, newline=False).decode("ascii")}
    if headers:
        headers = [(k, {"base64": _b2a(v, newline=False).decode("ascii")}) if v.__class__ is bytes
                   else (k, v) for k, v in headers]
    return _encode({"topic": record.topic, "partition": record.partition, "offset": record.offset,
                    "timestamp": record.timestamp, "timestamp_type": record.timestamp_type,
                    "key": key, "value": value, "headers": headers})


def records_to_jsonl(records: Iterable[Record]) -> str:
    """Newline-terminated lines for a batch (empty string for no records)."""
    lines = [record_to_json(r) for r in records]
    if not lines:
        return ""
    lines.append("")
    return "\n".join(lines)


def encode_batch(records: Sequence[Record]) -> tuple[str, list[int]]:
    """Lines for every record that can be encoded, and the indexes of those that cannot.

    The common case (all encodable) costs one list comprehension; only a failing batch is
    walked record by record to find the culprits.
    """
    try:
        return records_to_jsonl(records), []
    except (TypeError, ValueError):
        pass
    lines: list[str] = []
    failed: list[int] = []
    for i, r in enumerate(records):
        try:
            lines.append(record_to_json(r))
        except (TypeError, ValueError):
            failed.append(i)
    if lines:
        lines.append("")
    return "\n".join(lines), failed


def decode_data(obj: Any) -> Any:
    """Inverse of the key/value/header encoding: ``{"base64": s}`` (at any depth) → bytes."""
    if isinstance(obj, dict):
        if len(obj) == 1 and isinstance(obj.get("base64"), str):
            return binascii.a2b_base64(obj["base64"])
        return {k: decode_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_data(v) for v in obj]
    return obj


def record_from_object(obj: dict) -> Record:
    """Read one line's object back into a ``Record`` (bytes restored; raw_* left unset)."""
    return Record(obj["topic"], obj["partition"], obj["offset"], obj["timestamp"],
                  obj["timestamp_type"], decode_data(obj["key"]), decode_data(obj["value"]),
                  [(k, decode_data(v)) for k, v in obj["headers"]])


def dead_letter(record: Record, stage: str, error: BaseException | str, *, plugin: str | None = None) -> Record:
    """The dead-letter form of a failed record: raw key/value bytes plus two headers (three
    with ``plugin``).

    ``stage`` is where it failed (``deserialize``, ``interceptor``, ``sink``, or ``delivery``: a
    share group's last delivery); ``error`` is
    the exception (written as ``Type: message``, at most 1 KiB; ``error_parts`` reads it back)
    or a ready-made message; ``plugin`` the configured plugin that raised (``PLUGIN_HEADER``).
    """
    if stage not in STAGES:
        raise ValueError(f"dead-letter stage must be one of {', '.join(STAGES)}, not {stage!r}")
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    message = text.encode("utf-8", "replace")[:_MAX_ERROR_BYTES]
    # raw_* hold the broker's bytes; a record built without them (tests, a "bytes"
    # deserializer path that did not keep them) still has its bytes in key/value.
    key = record.raw_key if record.raw_key is not None else _bytes_or_none(record.key)
    value = record.raw_value if record.raw_value is not None else _bytes_or_none(record.value)
    headers = list(record.headers)
    headers.append((ERROR_HEADER, message))
    headers.append((STAGE_HEADER, stage.encode("ascii")))
    if plugin is not None:
        headers.append((PLUGIN_HEADER, plugin.encode("utf-8", "replace")))
    return Record(record.topic, record.partition, record.offset, record.timestamp,
                  record.timestamp_type, key, value, headers, key, value)


def error_parts(message: str) -> tuple[str | None, str]:
    """``dead_letter``'s ``Type: message`` back as (type name, message); (None, message) for a
    ready-made message that does not start with a type name."""
    name, sep, rest = message.partition(": ")
    if sep and name and all(part.isidentifier() for part in name.split(".")):
        return name, rest
    return None, message


def _bytes_or_none(v: Any) -> bytes | None:
    return bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else None
