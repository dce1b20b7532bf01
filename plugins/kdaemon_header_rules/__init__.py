"""Bundled plugin ``header_rules``: header rules kept in their own TOML file.

For rule lists that are long, generated, or shared between daemons.  A ``[[filters]]`` entry
names the file::

    [[filters]]
    plugin = "rules_file"
    settings = { path = "/etc/kdaemon/tenants.toml" }

and the file holds the same rules as inline ``[[filters]]`` entries, plus an optional default::

    default = "drop"            # keep | drop | auto (the default: the opposite of the last rule's action)
    [[rules]]
    header = "tenant"
    op = "in"                   # equals | in | prefix | regex | exists | missing
    values = ["acme", "globex"]
    action = "keep"             # keep | drop (default keep)

The factory returns a ``kdaemon.protocol.header_match.HeaderRules``, so the C decoder evaluates
the rules natively (unless one is a regex).  The file is read once, at start-up; a relative path
is relative to the daemon's working directory, so prefer an absolute one.

The ``settings`` table is checked by the daemon's checker (``parse_settings``): a problem reads
``filters[0].settings.path: ...``.  A problem of the file's contents names the file and rule.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass

from kdaemon.plugins import hookimpl, parse_settings, setting
from kdaemon.protocol.header_match import DEFAULTS, HeaderRules, resolve_default, rule_from_table, rule_problems


@dataclass(frozen=True)
class RulesFileSettings:
    """The ``settings`` of a ``[[filters]]`` entry naming ``rules_file``."""

    path: str = setting(pattern=r"(?s).+", expected="a file name", needs="the TOML file holding [[rules]]")


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
    problems = [f"{path}: rules[{i}].{field}: {text}"
                for i, e in enumerate(entries) for field, text in rule_problems(e)]
    if problems:
        raise ValueError("; ".join(problems))
    rules = [rule_from_table(e) for e in entries]
    default = doc.get("default", "auto")
    if default not in DEFAULTS:
        raise ValueError(f"{path}: default must be one of {', '.join(DEFAULTS)}, not {default!r}")
    return HeaderRules(rules, default=resolve_default(default, rules))


def rules_file(settings: Mapping) -> HeaderRules:
    """The rules of the file ``settings`` names; ``SettingsError`` for a problem of ``settings``
    (``ignore=()``: no key is skipped), ``ValueError`` naming the file for one of the file."""
    return load_rules(parse_settings(RulesFileSettings, settings, "", ignore=()).path)


@hookimpl
def kdaemon_header_filters():
    return {"rules_file": rules_file}
