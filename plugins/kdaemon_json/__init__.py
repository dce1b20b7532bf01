"""Bundled plugin ``json``: the ``json`` deserializer::

    [deserializer]
    value = "json"
    settings = { encoding = "utf-8" }

A null key or value stays ``None``.  Invalid data raises ``ValueError`` with a short message
(what and where, never the payload, which may be large or sensitive); the daemon's
``on_deserialize_error`` policy then applies.  ``NaN`` and ``Infinity`` are not JSON and are
refused unless ``allow_nan = true`` (sinks write JSON other tools must be able to read).

``[deserializer.settings]`` is shared by the key and value deserializers, so keys meant for the
other one (e.g. the ``str`` deserializer's ``errors``) are ignored here rather than refused.
"""

from __future__ import annotations

import codecs
import json

from kdaemon.plugins import hookimpl


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (set allow_nan = true to accept it)")


def json_deserializer(settings: dict):
    encoding = settings.get("encoding", "utf-8")
    if not isinstance(encoding, str):
        raise ValueError(f"encoding must be a string, not {encoding!r}")
    try:
        encoding = codecs.lookup(encoding).name  # unknown encodings fail at start-up
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r}") from None
    allow_nan = settings.get("allow_nan", False)
    if not isinstance(allow_nan, bool):
        raise ValueError(f"allow_nan must be true or false, not {allow_nan!r}")
    decoder = json.JSONDecoder(parse_constant=None if allow_nan else _refuse_constant)
    decode, scan_once = decoder.decode, decoder.scan_once

    def deserialize(topic, headers, data):
        if data is None:
            return None
        try:
            text = str(data, encoding)
        except UnicodeDecodeError as exc:
            raise ValueError(f"not valid {encoding}: {exc.reason} at byte {exc.start}") from None
        # The scanner alone is what ``decode`` runs after two whitespace regex matches; those
        # were a third of the time on typical 200-byte values.  Anything unusual (leading or
        # trailing whitespace, trailing data, invalid JSON) goes through ``decode``, which
        # accepts or rejects exactly as before and words the error.
        try:
            obj, end = scan_once(text, 0)
        except (StopIteration, json.JSONDecodeError):
            pass
        else:
            if end == len(text):
                return obj
        try:
            return decode(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None

    return deserialize


@hookimpl
def kdaemon_deserializers():
    return {"json": json_deserializer}
