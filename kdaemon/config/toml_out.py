"""Writing a configuration: for files kdaemon generates (``kdaemon demo``, tests, benchmarks),
which must not need a TOML writer dependency."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..settings import toml_key, toml_value


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def dump_toml(raw: Mapping[str, Any]) -> str:
    """A configuration mapping (what ``tomllib`` gives for our files) as TOML text that ``load``
    reads back to the same mapping: top-level keys first, then ``[tables]``, then
    ``[[arrays of tables]]``; deeper levels become inline tables."""
    lines = [f"{toml_key(k)} = {toml_value(v)}" for k, v in raw.items()
             if not isinstance(v, Mapping) and not _is_table_array(v)]
    for key, value in raw.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{toml_key(key)}]"]
            lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()]
        elif _is_table_array(value):
            for entry in value:
                lines += ["", f"[[{toml_key(key)}]]"]
                lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"
