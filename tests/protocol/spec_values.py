"""Deterministic sample values for any message spec, for round-trip tests.

``sample_value(struct, version, flexible, seed)`` walks the Struct/Field/Array description and
returns a dict holding every field of the struct:

* a field present at ``version`` (tagged fields only when ``flexible``) gets a value that differs
  from its default, except that a field nullable at that version is sometimes ``None``;
* a field absent at ``version`` gets its default, which is what decoding gives back for it.

So ``decode(encode(v)) == v`` is the whole round-trip check.  With ``absent="noise"`` the absent
fields get non-default values instead: the encoder must ignore them, and the decoded value then
equals the ``absent="default"`` sample for the same seed.

Every field draws from its own random stream, seeded by ``seed`` and the field's path, so the value
of a present field does not depend on what was generated for its neighbours.
"""

from __future__ import annotations

import random
import string
import uuid
from typing import Any

from kdaemon.protocol.schema import Array, Field, Primitive, Struct

_INT_RANGES = {
    "int8": (-(1 << 7), (1 << 7) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "uint16": (0, (1 << 16) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "uint32": (0, (1 << 32) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
}

# Characters outside ASCII catch a writer that counts characters instead of UTF-8 bytes.
_ALPHABET = string.ascii_letters + string.digits + "-._é✓"


def sample_value(struct: Struct, version: int, flexible: bool, seed: int = 0, *,
                 absent: str = "default") -> dict:
    """A dict for ``struct`` at ``version``; see the module docstring."""
    if absent not in ("default", "noise"):
        raise ValueError(f"absent must be 'default' or 'noise', not {absent!r}")
    return _struct(struct, version, flexible, f"{seed}", absent)


def field_present(f: Field, version: int, flexible: bool) -> bool:
    """Whether ``f`` is on the wire at ``version`` (the codec's rule, restated for tests)."""
    return version in f.versions and (f.tag is None or flexible)


def _struct(struct: Struct, version: int, flexible: bool, path: str, absent: str) -> dict:
    out = {}
    for f in struct.fields:
        fpath = f"{path}/{f.name}"
        if field_present(f, version, flexible):
            out[f.name] = _field(f, version, flexible, fpath, absent)
        elif absent == "noise":
            # A value of the right shape that the encoder must drop; generated as if the field
            # were present in a flexible version, which every field of a struct type can be.
            out[f.name] = _value(f.type, version, flexible, random.Random(fpath + "#noise"),
                                 fpath + "#noise", absent, f.default_value())
        else:
            out[f.name] = f.default_value()
    return out


def _field(f: Field, version: int, flexible: bool, path: str, absent: str) -> Any:
    rng = random.Random(path)
    if version in f.nullable and rng.random() < 0.3:
        return None
    return _value(f.type, version, flexible, rng, path, absent, f.default_value())


def _value(t, version: int, flexible: bool, rng: random.Random, path: str, absent: str,
           default: Any) -> Any:
    if isinstance(t, Primitive):
        return _primitive(t, rng, default)
    if isinstance(t, Struct):
        return _struct(t, version, flexible, path, absent)
    if isinstance(t, Array):
        n = rng.randint(1, 3 if isinstance(t.of, Primitive) else 2)
        if isinstance(t.of, Primitive):
            return [_primitive(t.of, rng, t.of.default) for _ in range(n)]
        return [_struct(t.of, version, flexible, f"{path}[{i}]", absent) for i in range(n)]
    raise TypeError(f"not a field type: {t!r}")


def _primitive(p: Primitive, rng: random.Random, default: Any) -> Any:
    k = p.kind
    for _ in range(100):
        if k in _INT_RANGES:
            lo, hi = _INT_RANGES[k]
            # Mostly small numbers, sometimes the extremes of the type.
            v = rng.choice([lo, hi, rng.randint(lo, hi), rng.randint(-1000, 1000)])
            v = min(max(v, lo), hi)
        elif k == "float64":
            v = rng.uniform(-1e9, 1e9)
        elif k == "bool":
            v = not default
        elif k == "uuid":
            v = uuid.UUID(int=rng.getrandbits(128))
        elif k == "string":
            v = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 12)))
        elif k in ("bytes", "records"):
            v = rng.randbytes(rng.randint(1, 24))
        else:
            raise ValueError(f"no sample for primitive {k}")
        if v != default:
            return v
    raise AssertionError(f"could not draw a non-default {k}")
