"""One settings checker for the daemon's tables, every sink and every plugin: a TOML table in, a
typed value out, every problem worded ``table.key: expected <kind>, found <TOML type> <value>``.

Two ways in, one vocabulary:

* ``parse_settings(Dataclass, table, where)`` for a sink's or plugin's settings: the fields'
  annotations say what each key takes (``int``, ``float``, ``bool``, ``str``, ``Literal[...]``,
  ``tuple[str, ...]``/``list[str]``, ``dict[str, X]``, ``X | None``, a union of these), their
  metadata (``setting(...)``) the bounds, the choices and why a key without a default is
  required.  It returns a frozen instance, or raises one ``SettingsError`` listing every
  problem of the table, not the first.
* ``Kind``/``kinds_of``/``check_table`` for the daemon's own file (``kdaemon.config``), which
  words some of its problems its own way ("unknown option", "must be positive").

Why this is strict where Python is lax: TOML's ``true`` is a Python ``int`` too, so a plain
``isinstance(value, int)`` takes ``workers = true`` as 1 and ``check_crcs = 1`` as true.  Here a
boolean is never an integer or a number, and the reverse.  An operator reads what to write and
what they wrote, never Python's own words ("'int' object is not iterable").

Unknown keys are named with the known key they most likely meant (``did_you_mean``), the same
way in every table, so ``check-config`` says "did you mean" alike everywhere.

A leaf: it imports nothing from kdaemon, so the configuration, the sinks, the plugins and the
protocol's header rules (all layers) use the same checker and the same words.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeVar

_SHORT = 40   # how much of a wrong value a problem quotes
METADATA = "kdaemon.setting"   # the field metadata key ``setting`` fills

T = TypeVar("T")


# -- "did you mean" -----------------------------------------------------------------------------------

def did_you_mean(key: str, known: Iterable[str]) -> str:
    """" (did you mean 'path'?)" when a known key is close to ``key``, else ""."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_keys(unknown: Iterable[str], known: Iterable[str]) -> str:
    """"colour, pth (did you mean 'path'?)": the unknown keys, sorted, each with its guess."""
    known = list(known)
    return ", ".join(k + did_you_mean(k, known) for k in sorted(unknown))


# -- kinds: what a key takes, and how a problem words it ---------------------------------------------

@dataclass(frozen=True)
class Kind:
    """One accepted TOML type: ``expected`` words it for a message ("an integer"); ``item``,
    for arrays, is the kind every element must have (checked element by element), ``value``,
    for tables, the kind of every value (checked key by key)."""

    expected: str
    accepts: Callable[[Any], bool]
    item: Kind | None = None
    value: Kind | None = None

    def problems(self, where: str, value: Any) -> list[str]:
        """Every type problem of ``value`` at ``where``; empty when it fits."""
        return [f"{path}: {text}" for path, text in self.located(where, value)]

    def located(self, where: str, value: Any) -> list[tuple[str, str]]:
        """``problems`` as (where, text) pairs: ``("daemon.topics[1]", "expected a string, ...")``."""
        if not self.accepts(value):
            return [(where, f"expected {self.expected}, found {found(value)}")]
        out: list[tuple[str, str]] = []
        if self.item is not None and isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                out += self.item.located(f"{where}[{i}]", v)
        if self.value is not None and isinstance(value, Mapping):
            for k, v in value.items():
                out += self.value.located(key_path(where, str(k)), v)
        return out


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


STRING = Kind("a string", lambda v: isinstance(v, str))
INTEGER = Kind("an integer", _is_int)
NUMBER = Kind("a number", _is_number)
BOOLEAN = Kind("true or false", lambda v: isinstance(v, bool))
TABLE = Kind("a table", lambda v: isinstance(v, Mapping))


def list_of(item: Kind, expected: str | None = None) -> Kind:
    return Kind(expected or f"a list of {_plural(item)}", lambda v: isinstance(v, list), item)


def table_of(value: Kind, expected: str | None = None) -> Kind:
    return Kind(expected or f"a table of {_plural(value)}", lambda v: isinstance(v, Mapping), value=value)


def one_of(choices: Iterable[Any], base: Kind | None = None) -> Kind:
    """A value among ``choices`` (of ``base``'s type when given: ``True`` is never ``1``)."""
    choices = tuple(choices)
    fits = base.accepts if base is not None else (lambda v: True)
    return Kind(f"one of {', '.join(map(_word, choices))}",
                lambda v: fits(v) and any(v == c and type(v) is type(c) for c in choices))


def _word(choice: Any) -> str:
    return choice if isinstance(choice, str) else toml_value(choice)


def _plural(kind: Kind) -> str:
    return {"a string": "strings", "an integer": "integers", "a number": "numbers",
            "true or false": "booleans", "a table": "tables"}.get(kind.expected, kind.expected)


def _union(kinds: list[Kind]) -> Kind:
    words = [k.expected for k in kinds]
    expected = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
    items = [k.item for k in kinds if k.item is not None]
    values = [k.value for k in kinds if k.value is not None]
    return Kind(expected, lambda v: any(k.accepts(v) for k in kinds),
                items[0] if len(items) == 1 else None, values[0] if len(values) == 1 else None)


def kind_of(annotation: Any) -> Kind | None:
    """The Kind for a dataclass field's (resolved) annotation; None for what TOML cannot hold
    (callables, objects), which is then not configurable from the file."""
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        kinds = [kind_of(a) for a in args if a is not type(None)]
        if not kinds or any(k is None for k in kinds):
            return None
        return kinds[0] if len(kinds) == 1 else _union(kinds)   # X | None: absent means the default
    if origin is Literal:
        return one_of(args)
    if annotation is str:
        return STRING
    if annotation is bool:
        return BOOLEAN
    if annotation is int:
        return INTEGER
    if annotation is float:
        return NUMBER
    if annotation is dict or annotation is Mapping:
        return TABLE
    if origin in (dict, Mapping) and len(args) == 2:
        value = kind_of(args[1]) if args[1] is not Any else None
        return table_of(value) if value is not None else TABLE
    if (origin is tuple and len(args) == 2 and args[1] is Ellipsis) or (origin is list and len(args) == 1):
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


# -- typed settings: a dataclass per table -----------------------------------------------------------

class SettingsError(ValueError):
    """Every problem of one settings table: ``problems`` holds (key, text) pairs, the key
    relative to the table (``max_bytes``, ``partition_by[2]``, ``""`` for the table itself).
    ``str()`` is one line per problem, ``where.key: text``; ``lines(other)`` words them under
    another name for the table (the daemon says ``dlq.topic`` for a sink that names its table
    ``sink``, being the dead-letter queue)."""

    def __init__(self, where: str, problems: Iterable[tuple[str, str]]) -> None:
        self.where = where
        self.problems = tuple(problems)
        super().__init__("\n".join(self.lines()))

    @classmethod
    def joined(cls, errors: Iterable[SettingsError]) -> SettingsError:
        """The problems of several tables as one error (each keyed by its table's path, under an
        empty ``where``): a factory that checks sub-tables of its settings raises them at once."""
        return cls("", [(_join(e.where, key), text) for e in errors for key, text in e.problems])

    def lines(self, where: str | None = None) -> list[str]:
        return [f"{path}: {text}" for path, text in self.located(where)]

    def located(self, where: str | None = None) -> list[tuple[str, str]]:
        """The problems as (``where.key``, text) pairs, under ``where`` (default: the error's)."""
        w = self.where if where is None else where
        return [(_join(w, key), text) for key, text in self.problems]


def _join(where: str, rel: str) -> str:
    if not rel:
        return where
    if not where or rel.startswith("["):
        return where + rel
    return f"{where}.{rel}"


@dataclass(frozen=True)
class Constraint:
    """What a field's type does not say (``setting`` puts it in the field's metadata)."""

    min: float | None = None        # at least
    max: float | None = None        # at most
    above: float | None = None      # more than
    choices: tuple | None = None    # one of these (each element, for a list)
    pattern: str | None = None      # a string matching this (re.fullmatch)
    expected: str | None = None     # the words for what the key takes, instead of the derived ones
    needs: str | None = None        # why a key without a default is required


def setting(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
            min: float | None = None, max: float | None = None, above: float | None = None,
            choices: Iterable[Any] | None = None, pattern: str | None = None, expected: str | None = None,
            needs: str | None = None, repr: bool = True) -> Any:
    """A dataclass field with constraints ``parse_settings`` checks: ``min``/``max``
    (inclusive) and ``above`` (exclusive) for numbers, ``choices`` (for a list, each
    element's), ``pattern`` for a string (a full match; give ``expected`` to word it),
    ``expected`` to word what the key takes, ``needs`` to say why a key without a default is
    required ("sink.path: required: <needs>")."""
    if pattern is not None and expected is None:
        expected = f"a string matching {pattern}"
    constraint = Constraint(min, max, above, tuple(choices) if choices is not None else None, pattern, expected,
                            needs)
    return dataclasses.field(default=default, default_factory=default_factory, repr=repr,
                             metadata={METADATA: constraint})


@dataclass(frozen=True)
class _Field:
    name: str
    kind: Kind
    convert: Callable[[Any], Any]
    required: bool
    needs: str | None


def parse_settings(cls: type[T], table: Any, where: str, *, ignore: Collection[str] = ("type",),
                   retired: Mapping[str, str] | None = None,
                   check: Callable[[T], Iterable[tuple[str, str]]] | None = None) -> T:
    """``table`` (a TOML table) as an instance of the dataclass ``cls``; ``SettingsError``
    naming every problem, each under ``where`` (the table as the operator knows it: ``sink``,
    ``schema_registry``).

    Each key takes what its field's annotation and ``setting(...)`` metadata say; a key
    without a field is unknown ("did you mean" the closest known one), one in ``retired`` is
    refused with its text (a setting that was taken out, and what to do instead), one in
    ``ignore`` is skipped (a ``[sink]`` table's ``type`` names the sink: it is no setting).  A
    field without a default is required.  Once every value fits, ``check(instance)`` may name
    problems between fields as (key, text) pairs; they are raised with the rest."""
    if not isinstance(table, Mapping):
        raise SettingsError(where, [("", f"expected a table, found {found(table)}")])
    known = _fields(cls)
    problems: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in ignore:
            continue
        name = toml_key(str(key))
        if retired is not None and key in retired:
            problems.append((name, retired[key]))
            continue
        f = known.get(key)
        if f is None:
            names = ", ".join(sorted(known)) or "none"
            problems.append((name, f"unknown setting{did_you_mean(str(key), known)} (known: {names})"))
            continue
        wrong = f.kind.located(name, value)
        if wrong:
            problems += wrong
            continue
        values[key] = f.convert(value)
    for f in known.values():
        if f.required and f.name not in table:
            problems.append((f.name, "required" + (f": {f.needs}" if f.needs else "")))
    if problems:
        raise SettingsError(where, problems)
    out = cls(**values)
    if check is not None:
        problems = list(check(out))
        if problems:
            raise SettingsError(where, problems)
    return out


def settings_table(settings: Any) -> dict[str, Any]:
    """A settings dataclass back as the TOML table ``parse_settings`` reads (JSON values too:
    tuples as lists; fields left at None are left out, as TOML has no null).  For sending typed
    settings to another process, which parses them again."""
    out = {}
    for f in fields(settings):
        value = getattr(settings, f.name)
        if value is not None:
            out[f.name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


@functools.cache
def _fields(cls: type) -> dict[str, _Field]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"parse_settings needs a dataclass, not {cls!r}")
    hints = typing.get_type_hints(cls)
    out = {}
    for f in fields(cls):
        if not f.init:
            continue
        annotation = hints[f.name]
        kind = kind_of(annotation)
        if kind is None:
            raise TypeError(f"{cls.__name__}.{f.name}: {annotation!r} is not a type a TOML table holds")
        c = f.metadata.get(METADATA, Constraint())
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = _Field(f.name, _constrained(kind, c), _converter(annotation), required, c.needs)
    return out


def _constrained(kind: Kind, c: Constraint) -> Kind:
    """``kind`` narrowed by the field's constraint, with the words for both: a value of the
    wrong type and one out of bounds read alike ("expected a positive integer, found ...")."""
    if kind.item is not None and c.choices is not None:   # a list: each element among the choices
        item = one_of(c.choices, kind.item)
        return Kind(c.expected or f"a list of {item.expected}", kind.accepts, item)
    if c.choices is not None:
        narrowed = one_of(c.choices, kind)
        return Kind(c.expected or narrowed.expected, narrowed.accepts)
    tests: list[Callable[[Any], bool]] = []
    bounds: list[str] = []
    if c.min is not None:
        tests.append(lambda v: v >= c.min)
        bounds.append(f">= {_number(c.min)}")
    if c.above is not None:
        tests.append(lambda v: v > c.above)
        bounds.append(f"> {_number(c.above)}")
    if c.max is not None:
        tests.append(lambda v: v <= c.max)
        bounds.append(f"<= {_number(c.max)}")
    if c.pattern is not None:
        regex = re.compile(c.pattern)
        tests.append(lambda v: isinstance(v, str) and regex.fullmatch(v) is not None)
    if kind is NUMBER:   # inf and nan are numbers TOML writes, never a setting's value
        tests.append(lambda v: math.isfinite(v))
    if not tests and c.expected is None:
        return kind
    expected = c.expected or _bounded(kind, c, bounds)
    base = kind.accepts
    return Kind(expected, lambda v: base(v) and all(t(v) for t in tests), kind.item, kind.value)


def _bounded(kind: Kind, c: Constraint, bounds: list[str]) -> str:
    noun = {"an integer": "integer", "a number": "number"}.get(kind.expected)
    if noun is None or not bounds:
        return kind.expected
    if c.max is None and ((c.above == 0 and c.min is None) or (c.min == 1 and c.above is None and noun == "integer")):
        return f"a positive {noun}"
    return f"{kind.expected} {' and '.join(bounds)}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _converter(annotation: Any) -> Callable[[Any], Any]:
    """From the TOML value (already checked) to the field's type: arrays to tuples (or lists),
    integers to floats, tables copied."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is float:
        return float
    if origin is tuple:
        item = _converter(args[0])
        return lambda v: tuple(item(x) for x in v)
    if origin is list:
        item = _converter(args[0])
        return lambda v: [item(x) for x in v]
    if annotation is dict or annotation is Mapping or origin in (dict, Mapping):
        return lambda v: dict(v)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _converter(members[0])
        # A union of kinds (a string or a list of strings): arrays become tuples, the rest stays.
        return lambda v: tuple(v) if isinstance(v, list) else v
    return lambda v: v


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
