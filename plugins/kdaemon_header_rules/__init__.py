"""Bundled plugin ``header_rules``: header rules kept in their own TOML file.

For rule lists that are long, generated, or shared between daemons.  A ``[[filters]]`` entry
names the file::

    [[filters]]
    plugin = "rules_file"
    settings = { path = "/etc/kdaemon/tenants.toml" }

and the file holds the same rules as inline ``[[filters]]`` entries, plus an optional default::

    default = "drop"            # "keep" | "drop"; absent: the opposite of the last rule's action
    [[rules]]
    header = "tenant"
    op = "in"                   # equals | in | prefix | regex | exists | missing
    values = ["acme", "globex"]
    action = "keep"             # keep | drop (default keep)

The factory returns a ``kdaemon.protocol.header_match.HeaderRules``, so the C decoder evaluates
the rules natively (unless one is a regex).  The file is read once, at start-up; a relative path
is relative to the daemon's working directory, so prefer an absolute one.
"""

from __future__ import annotations

import re
import tomllib

from kdaemon.plugins import hookimpl
from kdaemon.protocol.header_match import HeaderRule, HeaderRules

OPS = ("equals", "in", "prefix", "regex", "exists", "missing")
_RULE_KEYS = {"header", "op", "values", "value", "action"}


def load_rules(path: str) -> HeaderRules:
    """Read and check a rules file; every problem is a ValueError naming the file and rule."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise ValueError(f"rules file {path} not found") from None
    except OSError as exc:
        raise ValueError(f"cannot read rules file {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"rules file {path} is not valid TOML: {exc}") from None

    unknown = sorted(set(doc) - {"rules", "default"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {', '.join(unknown)} (known: rules, default)")
    entries = doc.get("rules", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError(f"{path}: rules must be an array of tables ([[rules]])")
    rules = [_rule(path, i, e) for i, e in enumerate(entries)]

    default = doc.get("default")
    if default is None:
        # Same as the daemon's filter_default = "auto": keep rules form an allowlist, drop
        # rules a blocklist.  No rules at all keeps everything.
        keep_by_default = not rules[-1].keep if rules else True
    elif default in ("keep", "drop"):
        keep_by_default = default == "keep"
    else:
        raise ValueError(f"{path}: default must be \"keep\" or \"drop\", not {default!r}")
    return HeaderRules(rules, default=keep_by_default)


def _rule(path: str, i: int, e: dict) -> HeaderRule:
    where = f"{path}: rules[{i}]"
    unknown = sorted(set(e) - _RULE_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(_RULE_KEYS))})")
    header = e.get("header")
    if not isinstance(header, str) or not header:
        raise ValueError(f"{where}.header: required, the header key to test")
    op = e.get("op", "equals")
    if op not in OPS:
        raise ValueError(f"{where}.op: {op!r} is not one of {', '.join(OPS)}")
    if "value" in e and "values" in e:
        raise ValueError(f"{where}: give value or values, not both")
    values = e.get("values", [e["value"]] if "value" in e else [])
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise ValueError(f"{where}.values: must be a list of strings")
    action = e.get("action", "keep")
    if action not in ("keep", "drop"):
        raise ValueError(f"{where}.action: must be \"keep\" or \"drop\", not {action!r}")
    try:
        return HeaderRule(header, op, tuple(values), keep=action == "keep")
    except re.error as exc:
        raise ValueError(f"{where}.values: not a valid regular expression: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def rules_file(settings: dict) -> HeaderRules:
    unknown = sorted(set(settings) - {"path"})
    if unknown:
        raise ValueError(f"unknown rules_file setting(s): {', '.join(unknown)} (known: path)")
    path = settings.get("path")
    if not isinstance(path, str) or not path:
        raise ValueError("rules_file needs path: the TOML file holding [[rules]]")
    return load_rules(path)


@hookimpl
def kdaemon_header_filters():
    return {"rules_file": rules_file}
