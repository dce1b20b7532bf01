"""Declarative header rules compiled to one predicate, evaluated natively when possible.

Rules run in order against a record's raw headers; the first rule that matches decides keep or
drop; a record no rule matches gets ``default``.  When a header key occurs more than once, the
last occurrence is the one compared (Kafka's ``Headers.lastHeader``).  Values are compared as
bytes: a rule given ``str`` values compares their UTF-8 encoding.

``HeaderRules`` is an ordinary callable over ``[(key, value), ...]`` and also exposes
``native_rules``, a plain-data form the optional C decoder evaluates without calling back into
Python, so a dropped record never becomes a Python object at all.  Regex rules have no native
form; a rule list containing one is always evaluated in Python.

This module is also the one vocabulary of a rule written as data (a ``[[filters]]`` entry of
the daemon's configuration, a ``[[rules]]`` entry of the header_rules plugin's file): the ops,
the keys of a rule table, what each op takes (``rule_problems``), the table → rule conversion
(``rule_from_table``) and the "auto" default (``resolve_default``).  Every caller uses these,
so an op added here is accepted, checked and documented the same way everywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ..settings import did_you_mean

Op = Literal["equals", "in", "prefix", "regex", "exists", "missing"]
OPS: tuple[str, ...] = ("equals", "in", "prefix", "regex", "exists", "missing")
ONE_VALUE_OPS = ("equals", "prefix", "regex")
ACTIONS = ("keep", "drop")
DEFAULTS = ("keep", "drop", "auto")
RULE_KEYS = ("header", "op", "values", "value", "action")
_NATIVE_KIND = {"equals": 0, "in": 0, "exists": 1, "missing": 2, "prefix": 3}
_SMALL_SET = 16


def _as_bytes(v: str | bytes) -> bytes:
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


@dataclass(frozen=True)
class HeaderRule:
    key: str
    op: Op
    values: tuple[bytes, ...] = ()
    keep: bool = True

    def __post_init__(self) -> None:
        for _field, text in _op_problems(self.op, self.values, check_pattern=False):
            raise ValueError(f"header rule on {self.key!r}: {text}")
        object.__setattr__(self, "values", tuple(_as_bytes(v) for v in self.values))
        if self.op == "regex":
            re.compile(self.values[0])  # re.error at configuration time, not per record

    def matches(self, value_present: bool, value: bytes | None) -> bool:
        op = self.op
        if op == "exists":
            return value_present
        if op == "missing":
            return not value_present
        if value is None:
            return False
        if op in ("equals", "in"):
            return value in self.values
        if op == "prefix":
            return value.startswith(self.values[0])
        return re.search(self.values[0], value) is not None


class HeaderRules:
    """An ordered rule list with a default; callable as a header filter."""

    __slots__ = ("rules", "default", "native_rules", "_compiled")

    def __init__(self, rules: list[HeaderRule], default: bool = True) -> None:
        self.rules = tuple(rules)
        self.default = default
        compiled = []
        for r in self.rules:
            pattern = re.compile(r.values[0]) if r.op == "regex" else None
            compiled.append((r.key, r, pattern))
        self._compiled = tuple(compiled)
        if all(r.op in _NATIVE_KIND for r in self.rules):
            native = []
            for r in self.rules:
                if r.op in ("equals", "in"):
                    arg = tuple(r.values) if len(r.values) <= _SMALL_SET else frozenset(r.values)
                elif r.op == "prefix":
                    arg = r.values[0]
                else:
                    arg = None
                native.append((_NATIVE_KIND[r.op], r.key.encode("utf-8"), arg, r.keep))
            self.native_rules = (tuple(native), default)
        else:
            self.native_rules = None

    def __call__(self, headers) -> bool:
        for key, rule, pattern in self._compiled:
            present = False
            value = None
            for hk, hv in headers:
                if hk == key:
                    present, value = True, hv
            if pattern is not None:
                matched = value is not None and pattern.search(value) is not None
            else:
                matched = rule.matches(present, value)
            if matched:
                return rule.keep
        return self.default

    def __repr__(self) -> str:
        return f"HeaderRules({list(self.rules)!r}, default={self.default})"


# --- rules written as data ---------------------------------------------------------------------

def _op_problems(op: object, values: tuple | list, *, check_pattern: bool = True) -> list[tuple[str, str]]:
    """What is wrong with ``op`` and its values, as (field, text) pairs; empty when nothing is."""
    if op not in OPS:
        return [("op", f"{op!r} is not one of {', '.join(OPS)}")]
    if op in ONE_VALUE_OPS and len(values) != 1:
        return [("value", f"op {op!r} takes exactly one value")]
    if op == "in" and not values:
        return [("values", "op 'in' needs at least one value")]
    if op == "regex" and check_pattern:
        try:
            re.compile(_as_bytes(values[0]))   # fail at configuration time, not per record
        except re.error as exc:
            return [("value", f"not a valid regular expression: {exc}")]
    return []


def rule_problems(table: dict) -> list[tuple[str, str]]:
    """Every problem of one rule table (``header``, ``op``, ``value``/``values``, ``action``),
    as (field, text) pairs naming the key at fault; empty when the table is a valid rule."""
    out = [(k, f"unknown key{did_you_mean(k, RULE_KEYS)} (known: {', '.join(RULE_KEYS)})")
           for k in sorted(set(table) - set(RULE_KEYS))]
    header = table.get("header")
    if not isinstance(header, str) or not header:
        out.append(("header", "required: the header key to test"))
    if "value" in table and "values" in table:
        out.append(("values", "give value or values, not both"))
    values = _table_values(table)
    if values is None:
        out.append(("values", "must be a list of strings"))
        values = []
    out += _op_problems(table.get("op", "equals"), values)
    action = table.get("action", "keep")
    if action not in ACTIONS:
        out.append(("action", f"must be \"keep\" or \"drop\", not {action!r}"))
    return out


def _table_values(table: dict) -> list[str] | None:
    values = table.get("values", [table["value"]] if "value" in table else [])
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    return values


def rule_from_table(table: dict) -> HeaderRule:
    """A ``HeaderRule`` from a rule table; ValueError("field: text; ...") when it is not valid."""
    problems = rule_problems(table)
    if problems:
        raise ValueError("; ".join(f"{field}: {text}" for field, text in problems))
    return HeaderRule(table["header"], table.get("op", "equals"), tuple(_table_values(table)),
                      keep=table.get("action", "keep") == "keep")


def resolve_default(setting: str, rules: list[HeaderRule] | tuple[HeaderRule, ...]) -> bool:
    """What a record no rule matches gets: ``keep``, ``drop``, or ``auto`` — the opposite of the
    last rule's action, so a list of keep rules is an allowlist and a list of drop rules a
    blocklist (no rules at all: keep)."""
    if setting not in DEFAULTS:
        raise ValueError(f"the default is one of {', '.join(DEFAULTS)}, not {setting!r}")
    if setting == "auto":
        return not rules[-1].keep if rules else True
    return setting == "keep"
