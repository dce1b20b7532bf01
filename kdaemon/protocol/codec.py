"""The one generic encoder/decoder: it walks the declarative specs of ``schema.py``.

For each (struct, version, flexible) the walk is compiled once into a *plan*: a tuple of
(name, read, write) for the regular fields in wire order, a map tag -> (name, read, write, default)
for the tagged fields, and the defaults of the fields the version does not carry.  Plans are cached
on the struct, so steady-state encoding and decoding is a loop over closures with no version
arithmetic.
"""

from __future__ import annotations

from typing import Any, Callable

from .errors import DecodeError, EncodeError
from .primitives import Reader, Writer
from .schema import Array, Field, Primitive, Struct

ReadFn = Callable[[Reader], Any]
WriteFn = Callable[[Writer, Any], None]

_ABSENT: Any = object()


class _Plan:
    __slots__ = ("regular", "tagged", "tagged_out", "absent", "flexible")

    def __init__(self, regular, tagged, absent, flexible) -> None:
        self.regular: tuple[tuple[str, ReadFn, WriteFn, Field], ...] = regular
        self.tagged: dict[int, tuple[str, ReadFn, WriteFn, Field]] = tagged
        self.tagged_out = tuple(sorted(tagged.items()))
        self.absent: tuple[Field, ...] = absent
        self.flexible: bool = flexible


def _primitive_fns(p: Primitive, compact: bool, nullable: bool) -> tuple[ReadFn, WriteFn]:
    k = p.kind
    if k == "int8":
        return Reader.int8, Writer.int8
    if k == "int16":
        return Reader.int16, Writer.int16
    if k == "uint16":
        return Reader.uint16, Writer.uint16
    if k == "int32":
        return Reader.int32, Writer.int32
    if k == "uint32":
        return Reader.uint32, Writer.uint32
    if k == "int64":
        return Reader.int64, Writer.int64
    if k == "float64":
        return Reader.float64, Writer.float64
    if k == "bool":
        return Reader.boolean, Writer.boolean
    if k == "uuid":
        return Reader.uuid, Writer.uuid
    if k == "string":
        return (lambda r: r.string(compact, nullable)), (lambda w, v: w.string(v, compact, nullable))
    if k in ("bytes", "records"):
        # Record sets are nullable in every version that has them.
        n = nullable or k == "records"
        return (lambda r: r.bytes_(compact, n)), (lambda w, v: w.bytes_(v, compact, n))
    raise ValueError(f"unknown primitive {k}")


def _type_fns(t, version: int, flexible: bool, nullable: bool) -> tuple[ReadFn, WriteFn]:
    if isinstance(t, Primitive):
        return _primitive_fns(t, flexible, nullable)
    if isinstance(t, Struct):
        plan = plan_for(t, version, flexible)
        if not nullable:
            return (lambda r: _read_struct(plan, r)), (lambda w, v: _write_struct(plan, w, v))

        def read_nullable_struct(r: Reader):
            return None if r.int8() < 0 else _read_struct(plan, r)

        def write_nullable_struct(w: Writer, v) -> None:
            if v is None:
                w.int8(-1)
            else:
                w.int8(1)
                _write_struct(plan, w, v)
        return read_nullable_struct, write_nullable_struct
    if isinstance(t, Array):
        elem_read, elem_write = _type_fns(t.of, version, flexible, False)

        def read_array(r: Reader):
            n = r.array_length(flexible, nullable)
            if n is None:
                return None
            return [elem_read(r) for _ in range(n)]

        def write_array(w: Writer, v) -> None:
            if v is None:
                w.array_length(None, flexible, nullable)
                return
            w.array_length(len(v), flexible, nullable)
            for item in v:
                elem_write(w, item)
        return read_array, write_array
    raise TypeError(f"not a field type: {t!r}")


def plan_for(struct: Struct, version: int, flexible: bool) -> _Plan:
    key = (version, flexible)
    plan = struct._plans.get(key)
    if plan is not None:
        return plan
    regular = []
    tagged: dict[int, tuple[str, ReadFn, WriteFn, Field]] = {}
    absent = []
    for f in struct.fields:
        present = version in f.versions and (f.tag is None or flexible)
        if not present:
            absent.append(f)
            continue
        read, write = _type_fns(f.type, version, flexible, version in f.nullable)
        if f.tag is None:
            regular.append((f.name, read, write, f))
        else:
            tagged[f.tag] = (f.name, read, write, f)
    plan = _Plan(tuple(regular), tagged, tuple(absent), flexible)
    struct._plans[key] = plan
    return plan


def _read_struct(plan: _Plan, r: Reader) -> dict:
    out = {}
    for name, read, _, _f in plan.regular:
        out[name] = read(r)
    for f in plan.absent:
        out[f.name] = f.default_value()
    if plan.flexible:
        for _, (name, _r, _w, f) in plan.tagged_out:
            out[name] = f.default_value()
        count = r.uvarint()
        last_tag = -1
        for _ in range(count):
            tag = r.uvarint()
            size = r.uvarint()
            if tag <= last_tag:
                raise DecodeError(f"tagged fields out of order: tag {tag} after {last_tag}")
            last_tag = tag
            end = r.pos + size
            if end > r.end:
                raise DecodeError(f"tagged field {tag} of {size} bytes runs past the end")
            entry = plan.tagged.get(tag)
            if entry is None:
                r.pos = end  # unknown tags are skipped: that is what makes them compatible
                continue
            sub = Reader(r.buf, r.pos, end)
            out[entry[0]] = entry[1](sub)
            if sub.pos != end:
                raise DecodeError(f"tagged field {entry[0]} (tag {tag}) has {end - sub.pos} trailing bytes")
            r.pos = end
    return out


def _write_struct(plan: _Plan, w: Writer, value) -> None:
    if not isinstance(value, dict):
        raise EncodeError(f"expected a dict for a struct, got {type(value).__name__}")
    get = value.get
    for name, _, write, f in plan.regular:
        v = get(name, _ABSENT)
        if v is _ABSENT:
            v = f.default_value()
        try:
            write(w, v)
        except EncodeError as exc:
            raise EncodeError(f"{name}: {exc}") from None
    if plan.flexible:
        chunks = []
        for tag, (name, _, write, f) in plan.tagged_out:
            v = get(name, _ABSENT)
            if v is _ABSENT or v == f.default_value():
                continue
            sub = Writer()
            write(sub, v)
            chunks.append((tag, sub.buf))
        w.uvarint(len(chunks))
        for tag, data in chunks:
            w.uvarint(tag)
            w.uvarint(len(data))
            w.raw(data)



def encode(struct: Struct, version: int, flexible: bool, value: dict) -> bytes:
    """Encode ``value`` (a dict; missing fields take their defaults) as ``struct`` at ``version``."""
    w = Writer()
    _write_struct(plan_for(struct, version, flexible), w, value)
    return w.getvalue()


def encode_into(w: Writer, struct: Struct, version: int, flexible: bool, value: dict) -> None:
    _write_struct(plan_for(struct, version, flexible), w, value)


def decode(struct: Struct, version: int, flexible: bool, reader: Reader) -> dict:
    """Decode one ``struct`` at ``version`` from ``reader``, advancing it."""
    return _read_struct(plan_for(struct, version, flexible), reader)
