"""What TOML type each configuration key takes, described once and used both to check a file
and to word the problem.

A key's description (a ``Kind``) comes from the annotation of the dataclass field it fills
(``DaemonSection``, ``FilterConfig``, ``ConsumerConfig`` ...), so the type a key is parsed into
and the type its error message asks for cannot drift apart.  Every type problem is one line,
``section.key: expected <kind>, found <TOML type> <value>``, with an index for list elements
(``daemon.topics[1]``): an operator reads what to write and what they wrote, never Python's own
words ("'int' object is not iterable").

Why this is strict where Python is lax: TOML's ``true`` is a Python ``int`` too, so a plain
``isinstance(value, int)`` takes ``workers = true`` as 1 and ``check_crcs = 1`` as true.  Here a
boolean is never an integer or a number, and the reverse.
"""

from __future__ import annotations

import datetime
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

_SHORT = 40   # how much of a wrong value a problem quotes


@dataclass(frozen=True)
class Kind:
    """One accepted TOML type: ``expected`` words it for a message ("an integer"); ``item``,
    for arrays, is the kind every element must have (checked element by element)."""

    expected: str
    accepts: Callable[[Any], bool]
    item: Kind | None = None

    def problems(self, where: str, value: Any) -> list[str]:
        """Every type problem of ``value`` at ``where``; empty when it fits."""
        if not self.accepts(value):
            return [f"{where}: expected {self.expected}, found {found(value)}"]
        if self.item is not None and isinstance(value, list):
            return [p for i, v in enumerate(value) for p in self.item.problems(f"{where}[{i}]", v)]
        return []


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


STRING = Kind("a string", lambda v: isinstance(v, str))
INTEGER = Kind("an integer", _is_int)
NUMBER = Kind("a number", _is_number)
BOOLEAN = Kind("true or false", lambda v: isinstance(v, bool))
TABLE = Kind("a table", lambda v: isinstance(v, dict))


def list_of(item: Kind, expected: str | None = None) -> Kind:
    return Kind(expected or f"a list of {_plural(item)}", lambda v: isinstance(v, list), item)


def string_or_list(expected: str) -> Kind:
    """A comma-separated string or a list of strings (what the consumer takes for its list
    options, e.g. ``bootstrap_servers``)."""
    return Kind(expected, lambda v: isinstance(v, (str, list)), STRING)


def _plural(kind: Kind) -> str:
    return {"a string": "strings", "an integer": "integers", "a number": "numbers",
            "true or false": "booleans", "a table": "tables"}.get(kind.expected, kind.expected)


def kind_of(annotation: Any) -> Kind | None:
    """The Kind for a dataclass field's (resolved) annotation; None for what TOML cannot hold
    (callables, objects), which is then not configurable from the file."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = [kind_of(a) for a in args if a is not type(None)]
        return kinds[0] if len(kinds) == 1 else None   # X | None: absent means the default
    if annotation is str:
        return STRING
    if annotation is bool:
        return BOOLEAN
    if annotation is int:
        return INTEGER
    if annotation is float:
        return NUMBER
    if annotation is dict or origin is dict:
        return TABLE
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = kind_of(args[0])
        return list_of(item) if item is not None else None
    return None


def kinds_of(cls: type) -> dict[str, Kind]:
    """Each TOML-settable field of dataclass ``cls`` and its Kind, from its annotations."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        kind = kind_of(hints[f.name])
        if kind is not None:
            out[f.name] = kind
    return out


def key_path(where: str, key: str) -> str:
    """``where.key`` as a problem names it; a key that is not bare is quoted as in TOML, so an
    odd key (one holding a newline, say) cannot break a problem's line."""
    return f"{where}.{toml_key(key)}" if where else toml_key(key)


def check_table(where: str, table: Mapping, kinds: Mapping[str, Kind], problems: list[str]) -> dict:
    """The keys of ``table`` whose values fit their Kind; a problem for each that does not.
    Keys without a Kind are returned as they are (the caller decides what unknown means)."""
    out = {}
    for key, value in table.items():
        kind = kinds.get(key)
        wrong = kind.problems(key_path(where, key), value) if kind is not None else []
        if wrong:
            problems += wrong
        else:
            out[key] = value
    return out


# -- naming what was found --------------------------------------------------------------------------

def toml_type(value: Any) -> str:
    """The TOML name of a parsed value's type."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, Mapping):
        return "table"
    if isinstance(value, datetime.datetime):
        return "datetime"
    if isinstance(value, datetime.date):
        return "date"
    if isinstance(value, datetime.time):
        return "time"
    return type(value).__name__


def found(value: Any) -> str:
    """``integer 5``, ``table { ms = 5 }``, ``string "x"``: the type and a short TOML repr."""
    try:
        text = toml_value(value)
    except TypeError:
        text = repr(value)
    if len(text) > _SHORT:
        text = text[: _SHORT - 3] + "..."
    return f"{toml_type(value)} {text}"


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else toml_string(key)


_SHORT_ESCAPES = {"\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(text: str) -> str:
    """A TOML basic string.  Not ``json.dumps``: JSON writes a character beyond the BMP as a
    surrogate pair of escapes, which TOML refuses (it escapes scalar values only).  Every
    character that does not print (controls, U+0085, line and paragraph separators) is escaped,
    so a problem quoting a value stays one visible line."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    """One value as TOML text (tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if isinstance(value, float) and value != value:
            return "nan"
        if isinstance(value, float) and value in (float("inf"), float("-inf")):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{toml_key(str(k))} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")
