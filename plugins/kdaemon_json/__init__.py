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
This one's keys (``JsonSettings``) are checked by the daemon's checker, as the built-in
deserializers' are: a problem reads ``deserializer.settings.allow_nan: expected true or false,
found ...``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kdaemon.plugins import hookimpl
from kdaemon.plugins.builtin import deserializer_settings, encoding_problems, text_encoding


@dataclass(frozen=True)
class JsonSettings:
    """The ``json`` deserializer's keys of ``[deserializer.settings]``."""

    encoding: str = "utf-8"   # a text encoding Python knows, checked and spelled as Python does
    allow_nan: bool = False


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (set allow_nan = true to accept it)")


def json_deserializer(settings: dict):
    s = deserializer_settings(JsonSettings, settings, check=encoding_problems)   # SettingsError: every problem
    encoding, allow_nan = text_encoding(s.encoding), s.allow_nan   # unknown encodings fail at start-up
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
