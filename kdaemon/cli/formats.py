"""How ``kdaemon tail`` prints a record: JSON lines (the sink's line format, with header values
as text when they are UTF-8, as an operator reads them), or a kcat-like ``--format`` template."""

from __future__ import annotations

import dataclasses
import json
import re

from ..sinks.encoding import record_to_json

# kcat's -f tokens that kdaemon prints (kcat -f: "%t [%p] at %o: %k=%s\n").
TOKENS = {
    "t": "topic", "p": "partition", "o": "offset", "k": "key", "s": "value", "T": "timestamp",
    "h": "headers", "K": "key length", "S": "value length", "%": "a percent sign",
}
_TOKEN = re.compile(r"%(.)|\\(.)")
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def _text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "backslashreplace")
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), default=str)


def _utf8_headers(headers):
    out = []
    for k, v in headers or ():
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                pass
        out.append((k, v))
    return out


def as_json(record) -> str:
    """The sink's JSON line, header values as text when they are UTF-8 (else base64)."""
    if record.headers:
        record = dataclasses.replace(record, headers=_utf8_headers(record.headers))
    return record_to_json(record)


def check_template(template: str) -> str | None:
    """None if every %-token is known, else what is wrong (for a one-line usage error)."""
    unknown = sorted({m.group(1) for m in _TOKEN.finditer(template) if m.group(1) and m.group(1) not in TOKENS})
    if unknown:
        return (f"--format: unknown token(s) {', '.join('%' + u for u in unknown)} (known: "
                + ", ".join(f"%{t} {what}" for t, what in TOKENS.items()) + ")")
    return None


def as_template(record, template: str) -> str:
    """``template`` with kcat's tokens replaced (\\n, \\t escapes too); no newline added."""
    def sub(m: re.Match) -> str:
        if m.group(2) is not None:
            return _ESCAPES.get(m.group(2), "\\" + m.group(2))
        t = m.group(1)
        if t == "t":
            return record.topic
        if t == "p":
            return str(record.partition)
        if t == "o":
            return str(record.offset)
        if t == "k":
            return _text(record.key)
        if t == "s":
            return _text(record.value)
        if t == "T":
            return str(record.timestamp)
        if t == "h":
            return ",".join(f"{k}={_text(v)}" for k, v in record.headers or ())
        if t == "K":
            return str(len(record.key)) if isinstance(record.key, (bytes, str)) else "-1"
        if t == "S":
            return str(len(record.value)) if isinstance(record.value, (bytes, str)) else "-1"
        return "%"
    return _TOKEN.sub(sub, template)
