"""The vocabulary for describing Kafka messages declaratively.

Each API is written once, as data, in ``kdaemon/protocol/apis/``: which versions exist, from which
version on it is *flexible* (compact strings/arrays and tagged fields, KIP-482), and for every field
the version range in which it exists, the range in which it may be null, and its tag if it is a
tagged field.  ``codec.py`` walks these descriptions; nothing encodes or decodes a message by hand.

Version ranges use the notation of Kafka's own JSON message definitions: ``"0+"``, ``"3-7"``,
``"5"``, ``"none"``.  Field names are snake_case versions of Kafka's names.

Decoded messages are plain dicts keyed by field name.  Every field of the struct is present in the
result, with its default where the version does not carry it, so callers can read
``response["throttle_time_ms"]`` without checking versions.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Union

MISSING: Any = object()


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; ``hi is None`` means open-ended, ``lo is None`` means never."""

    lo: int | None
    hi: int | None

    @classmethod
    def parse(cls, text: "str | Versions") -> "Versions":
        if isinstance(text, Versions):
            return text
        text = text.strip()
        if text == "none":
            return cls(None, None)
        if text.endswith("+"):
            return cls(int(text[:-1]), None)
        if "-" in text:
            lo, hi = text.split("-", 1)
            return cls(int(lo), int(hi))
        return cls(int(text), int(text))

    def __contains__(self, version: int) -> bool:
        if self.lo is None:
            return False
        return version >= self.lo and (self.hi is None or version <= self.hi)

    def __str__(self) -> str:
        if self.lo is None:
            return "none"
        if self.hi is None:
            return f"{self.lo}+"
        return f"{self.lo}-{self.hi}" if self.lo != self.hi else str(self.lo)


NEVER = Versions(None, None)


@dataclass(frozen=True, slots=True)
class Primitive:
    """A fixed or length-prefixed scalar type.  ``kind`` selects the reader/writer in codec.py."""

    kind: str
    default: Any

    def __repr__(self) -> str:
        return self.kind.upper()


INT8 = Primitive("int8", 0)
INT16 = Primitive("int16", 0)
UINT16 = Primitive("uint16", 0)
INT32 = Primitive("int32", 0)
UINT32 = Primitive("uint32", 0)
INT64 = Primitive("int64", 0)
FLOAT64 = Primitive("float64", 0.0)
BOOL = Primitive("bool", False)
UUID = Primitive("uuid", uuid.UUID(int=0))
STRING = Primitive("string", "")
BYTES = Primitive("bytes", b"")
# A record set: bytes on the wire, kept as a zero-copy slice of the frame when decoded and
# handed to the record-batch decoder by the client.
RECORDS = Primitive("records", None)


class Struct:
    """An ordered list of fields.  Structs nest (struct-typed fields and arrays of structs)."""

    __slots__ = ("fields", "name", "_plans")

    def __init__(self, *fields: "Field", name: str = "") -> None:
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate field names in struct {name or names}")
        tags = [f.tag for f in fields if f.tag is not None]
        if len(set(tags)) != len(tags):
            raise ValueError(f"duplicate tags in struct {name or names}")
        self.fields: tuple[Field, ...] = fields
        self.name = name
        self._plans: dict = {}

    def default(self) -> dict:
        return {f.name: f.default_value() for f in self.fields}

    def __repr__(self) -> str:
        return f"Struct({', '.join(f.name for f in self.fields)})"


@dataclass(frozen=True, slots=True)
class Array:
    """A (compact) array of a primitive or a struct."""

    of: Union[Primitive, Struct]


FieldType = Union[Primitive, Struct, Array]


@dataclass(frozen=True)
class Field:
    """One field of a struct.

    ``versions``: where the field exists.  ``nullable``: where it may be null.  ``tag``: set for a
    tagged field (KIP-482); it is then written in the struct's tagged section, only when its value
    differs from the default, and only in flexible versions within ``versions``.
    """

    name: str
    type: FieldType
    versions: Versions = field(default=Versions(0, None))
    nullable: Versions = NEVER
    tag: int | None = None
    default: Any = MISSING

    def __init__(self, name: str, type: FieldType, versions: "str | Versions" = "0+", *,
                 nullable: "str | Versions" = "none", tag: int | None = None,
                 default: Any = MISSING) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "type", type)
        object.__setattr__(self, "versions", Versions.parse(versions))
        object.__setattr__(self, "nullable", Versions.parse(nullable))
        object.__setattr__(self, "tag", tag)
        object.__setattr__(self, "default", default)

    def default_value(self) -> Any:
        if self.default is not MISSING:
            d = self.default
            return list(d) if isinstance(d, list) else d
        if self.nullable.lo is not None:
            return None
        t = self.type
        if isinstance(t, Array):
            return []
        if isinstance(t, Struct):
            return t.default()
        return t.default


@dataclass(frozen=True)
class Api:
    """One Kafka API: its key, the versions this client implements, and both message bodies."""

    key: int
    name: str
    min_version: int
    max_version: int
    flexible: Versions
    request: Struct
    response: Struct

    def __init__(self, key: int, name: str, versions: tuple[int, int], flexible: "str | Versions",
                 request: Struct, response: Struct) -> None:
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "min_version", versions[0])
        object.__setattr__(self, "max_version", versions[1])
        object.__setattr__(self, "flexible", Versions.parse(flexible))
        object.__setattr__(self, "request", request)
        object.__setattr__(self, "response", response)

    def is_flexible(self, version: int) -> bool:
        return version in self.flexible

    def request_header_version(self, version: int) -> int:
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        # ApiVersions responses always use header v0: a client that sent a version the broker
        # does not know must still be able to read the error and the broker's version list.
        if self.key == 18:
            return 0
        return 1 if self.is_flexible(version) else 0
