"""Bundled plugin ``json``: the ``json`` deserializer::

    [deserializer]
    value = "json"
    settings = { encoding = "utf-8" }

A null key or value stays ``None``.  Invalid data raises ``ValueError`` with a short message
(what and where, never the payload, which may be large or sensitive); the daemon's
``on_deserialize_error`` policy then applies.  ``NaN`` and ``Infinity`` are not JSON and are
refused unless ``allow_nan = true`` (sinks write JSON other tools must be able to read); so is a
number too large for a float (``1e400``), which would otherwise be read as ``Infinity``.

``[deserializer.settings]`` is shared by the key and value deserializers, so keys meant for the
other one (e.g. the ``str`` deserializer's ``errors``) are ignored here rather than refused.
This one's keys (``JsonSettings``) are checked by the daemon's checker, as the built-in
deserializers' are: a problem reads ``deserializer.settings.allow_nan: expected true or false,
found ...``.

Parsing: msgspec, straight from the record's bytes, and the standard library for what msgspec
refuses.  Measured with ``python bench/consume/json_parsers.py`` (Python 3.11.7, msgspec 0.23.0,
orjson 3.13.0, 2-core AMD EPYC shared with other work, load 3.0, 2026-12-02): CPU µs per value
from ``bytes`` to Python objects, best of 7 (on a shared machine a column moves by about 10%
between runs; msgspec and orjson have traded places on the bench value from run to run)::

    value    bytes  json.loads  scan_once (before)  msgspec  orjson  this plugin
    bench      200       2.98               1.55      0.52    0.54      0.56
    small       34       2.55               0.76      0.19    0.24      0.28
    nested     800       9.53               8.24      3.33    3.14      3.02
    numbers    245       7.07               5.02      0.79    0.59      0.83
    text       517       4.94               3.60      2.60    1.40      2.43

(``bench`` is the consuming benchmarks' value, testkit/workload.py; the script describes the
others.)  msgspec and orjson are level on the benchmark's value, orjson ahead on long non-ASCII
text; but orjson reads an integer beyond 64 bits as a float (``18446744073709551616`` becomes
``1.8446744073709552e+19``), silently, so no fallback could catch it: an id or an amount in
minor units would change.  msgspec keeps such integers exact, as the standard library does, and
refuses what it does not read as the standard library would, which the fallback then takes:

* What msgspec refuses (``NaN``/``Infinity`` always, numbers beyond a float's range, escaped
  lone surrogates such as ``"\\ud800"``, integers past Python's digit limit, and every invalid
  value) goes to the standard library's decoder, with ``allow_nan`` applied: the result is what
  ``json.loads`` gives, and an error is worded with line and column as before.  A value is so
  parsed twice only when msgspec refuses it.  One difference from before, on purpose: without
  ``allow_nan`` a number beyond a float's range (``1e400``) is refused rather than read as
  ``Infinity``, which the sinks would then write as the ``Infinity`` that ``allow_nan`` keeps out.
* Encodings other than UTF-8: the bytes are decoded to ``str`` first, then parsed (msgspec takes
  a ``str``).
* Decoding into a Spark sink's ``value_schema`` directly (a msgspec ``Struct``) is not done: the
  Spark sink keeps the raw value bytes and its uploader turns them into columns with pyarrow's
  JSON reader, 1.6 CPU µs per bench value against 2.4 for msgspec into a ``Struct`` and columns
  built from those (the same script); the worker never parses a value for it.
* Duplicate keys: the last one wins, in both.  Whitespace around the value and trailing data:
  accepted and refused alike.  tests/plugins/test_json_parsing.py checks each case where the two
  parsers differ, and any JSON against ``json.loads`` (hypothesis).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import msgspec

from kdaemon.plugins import hookimpl
# Not in kdaemon.plugins' public names: the parse of one deserializer's keys of the shared
# [deserializer.settings] table and the encoding check, which must be worded exactly as the
# built-in str deserializer's so a problem both find is listed once.
from kdaemon.plugins.builtin import deserializer_settings, encoding_problems, text_encoding


@dataclass(frozen=True)
class JsonSettings:
    """The ``json`` deserializer's keys of ``[deserializer.settings]``."""

    encoding: str = "utf-8"   # a text encoding Python knows, checked and spelled as Python does
    allow_nan: bool = False


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not JSON (set allow_nan = true to accept it)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("a number is too large for a float (set allow_nan = true to read it as Infinity)")
    return value


def _stdlib_decoder(encoding: str, allow_nan: bool):
    """text or bytes -> object with the standard library, its errors worded without the payload."""
    if allow_nan:
        decoder = json.JSONDecoder()
    else:
        decoder = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite_float)
    decode = decoder.decode

    def parse(data) -> object:
        if not isinstance(data, str):
            try:
                data = str(data, encoding)
            except UnicodeDecodeError as exc:
                raise ValueError(f"not valid {encoding}: {exc.reason} at byte {exc.start}") from None
        try:
            return decode(data)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    return parse


def json_deserializer(settings: dict):
    s = deserializer_settings(JsonSettings, settings, check=encoding_problems)   # SettingsError: every problem
    encoding, allow_nan = text_encoding(s.encoding), s.allow_nan   # unknown encodings fail at start-up
    fast, refused = msgspec.json.Decoder().decode, msgspec.DecodeError   # ValidationError is one too
    slow = _stdlib_decoder(encoding, allow_nan)

    if encoding == "utf-8":
        # msgspec reads the bytes as they are (no str copy) and validates their UTF-8; anything
        # it refuses is decoded again by the standard library, which gives the result or the error.
        def deserialize(topic, headers, data):
            if data is None:
                return None
            try:
                return fast(data)
            except refused:
                pass
            return slow(data)   # outside the except: no msgspec error chained to ours
    else:
        def deserialize(topic, headers, data):
            if data is None:
                return None
            try:
                text = str(data, encoding)
            except UnicodeDecodeError as exc:
                raise ValueError(f"not valid {encoding}: {exc.reason} at byte {exc.start}") from None
            try:
                return fast(text)
            except refused:
                pass
            return slow(text)
    return deserialize


@hookimpl
def kdaemon_deserializers():
    return {"json": json_deserializer}
