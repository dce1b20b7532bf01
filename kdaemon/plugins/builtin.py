"""kdaemon's built-in deserializers, registered like any plugin (name ``builtin``).

The built-in sinks live in ``kdaemon.sinks.builtin`` (registered as ``builtin-sinks``).

``[deserializer.settings]`` is one table for the key and the value deserializer, so each parses
only its own keys of it (``deserializer_settings``) and leaves the rest to the other one.  A
problem is worded the same by both (the encoding's, ``encoding_problems``): the daemon lists a
line once, however many deserializers found it.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

from . import found, hookimpl, parse_settings

T = TypeVar("T")

# The error handlers that decode (xmlcharrefreplace and namereplace only encode).
DecodeErrors = Literal["strict", "replace", "ignore", "backslashreplace", "surrogateescape", "surrogatepass"]


def deserializer_settings(cls: type[T], settings: Any,
                          check: Callable[[T], Iterable[tuple[str, str]]] | None = None) -> T:
    """``cls`` parsed from the keys of ``[deserializer.settings]`` it has fields for; the others
    are the other deserializer's (or a sub-table such as ``schema_registry``), not refused."""
    own = {f.name for f in fields(cls)}
    others = [k for k in settings if k not in own] if isinstance(settings, Mapping) else ()
    return parse_settings(cls, settings, "", ignore=others, check=check)


def text_encoding(name: str) -> str | None:
    """``name`` as Python spells it ("UTF8" → "utf-8"); None when Python has no text encoding
    of that name.  ``codecs.lookup`` alone would take base64 or rot13 too, codecs that do not
    turn bytes into text and would fail every record instead of the start."""
    try:
        "".encode(name)
        return codecs.lookup(name).name
    except (LookupError, ValueError):   # ValueError: a NUL in the name, or the "undefined" codec
        return None


def encoding_problems(settings: Any) -> Iterator[tuple[str, str]]:
    """``check`` for settings with an ``encoding``: one Python can decode bytes with."""
    if text_encoding(settings.encoding) is None:
        yield "encoding", f'expected a text encoding ("utf-8", "latin-1", ...), found {found(settings.encoding)}'


def _bytes(settings: Mapping):
    """Takes no settings (the keys of ``[deserializer.settings]`` are the other deserializer's)."""
    def deserialize(topic, headers, data):
        return data
    # The worker then skips the call per record (see Pipeline.deserialize).
    deserialize.returns_data_unchanged = True
    return deserialize


@dataclass(frozen=True)
class StrSettings:
    """The ``str`` deserializer's keys of ``[deserializer.settings]``."""

    encoding: str = "utf-8"
    errors: DecodeErrors = "strict"


def _str(settings: Mapping):
    s = deserializer_settings(StrSettings, settings, check=encoding_problems)
    encoding, errors = text_encoding(s.encoding), s.errors

    def deserialize(topic, headers, data):
        return None if data is None else str(data, encoding, errors)
    return deserialize


@hookimpl
def kdaemon_deserializers():
    return {"bytes": _bytes, "str": _str}
