"""Declarative header rules compiled to one predicate, evaluated natively when possible.

Rules run in order against a record's raw headers; the first rule that matches decides keep or
drop; a record no rule matches gets ``default``.  When a header key occurs more than once, the
last occurrence is the one compared (Kafka's ``Headers.lastHeader``).  Values are compared as
bytes: a rule given ``str`` values compares their UTF-8 encoding.

``HeaderRules`` is an ordinary callable over ``[(key, value), ...]`` and also exposes
``native_rules``, a plain-data form the optional C decoder evaluates without calling back into
Python, so a dropped record never becomes a Python object at all.  Regex rules have no native
form; a rule list containing one is always evaluated in Python.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Op = Literal["equals", "in", "prefix", "regex", "exists", "missing"]
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
        if self.op not in ("equals", "in", "prefix", "regex", "exists", "missing"):
            raise ValueError(f"unknown header rule op {self.op!r}")
        if self.op in ("equals", "prefix", "regex") and len(self.values) != 1:
            raise ValueError(f"header rule {self.op!r} on {self.key!r} takes exactly one value")
        if self.op == "in" and not self.values:
            raise ValueError(f"header rule 'in' on {self.key!r} needs at least one value")
        object.__setattr__(self, "values", tuple(_as_bytes(v) for v in self.values))
        if self.op == "regex":
            re.compile(self.values[0])  # fail at configuration time, not per record

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
