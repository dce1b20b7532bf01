"""Configuration from the environment, for containers: ``KDAEMON_<SECTION>_<KEY>=value`` sets
``key`` of ``[section]`` over the file.

Why over the file and before validation: an image ships one file and each deployment changes a
few values (brokers, group, sink path, a password) without writing another.  The values join
the file's mapping before the loader checks anything, so an environment value gets exactly the
file's checks and wording; only the start of a problem changes, from the file to the variable
(``environment KDAEMON_DAEMON_WORKERS: daemon.workers: expected an integer, found string
"four"``).

The rules (the README's "In a container" tells operators the same):

* Name: after ``KDAEMON_``, the longest top-level name of the file that still leaves a key
  (so a section whose name holds an underscore works), then the key; both lowercased.
  ``KDAEMON_KAFKA_SESSION_TIMEOUT_MS`` is ``kafka.session_timeout_ms``; ``KDAEMON_PLUGINS``
  sets the top-level ``plugins`` list whole.  An unknown section is a problem here (with a
  guess); an unknown key is the loader's, worded as for the file, and where the file takes any
  key (a sink's settings) so does the environment.
* Value: a TOML value when the text is one (``4``, ``true``, ``1.5``, ``["a", "b"]``,
  ``"x"``, ``{ a = 1 }``), else the text as a string (``/data/out``).  The one trap: a string
  that reads as a number or a boolean must be quoted (``KDAEMON_KAFKA_GROUP_ID='"1234"'``);
  the type problem says so.  Secrets (``kafka.sasl_password``...) are always the text as it
  is: a password is never reinterpreted, and a type problem would quote it.
* One level: ``__`` (``KDAEMON_SINK_CONF__X``) is refused.  A key whose value is a table takes
  a whole inline table, replacing the file's (``KDAEMON_SINK_CONF='{ "spark.driver.memory" =
  "2g" }'``): Spark's keys hold dots and capitals, which a variable name cannot spell.
* ``[[filters]]`` and ``[[interceptors]]`` (arrays of tables) cannot be set: refused.
* A file is still needed (``-c FILE``): the environment changes it, it does not replace it.
* Not overrides: kdaemon's own process variables (``NOT_CONFIGURATION``) and a variable the
  configuration names as a secret's source (``sasl_password_env = "KDAEMON_SASL_PASSWORD"``,
  as ``etc/kdaemon.toml`` suggests).

``kdaemon check-config`` lists the overrides in effect (``--show``: the whole effective
configuration, each value from the environment marked with its variable, secrets hidden).  A
SIGHUP reload goes through ``load`` as the start does, so the overrides apply again, with the
values the daemon's environment had at start (a process's environment cannot be changed
from outside).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..settings import did_you_mean, key_path, toml_key, toml_string, toml_type, toml_value

PREFIX = "KDAEMON_"
# kdaemon's own variables that are not configuration: where jars and test brokers are cached
# (kdaemon.sinks.spark.tables.jars, testkit/), the pure-Python record loop
# (kdaemon.protocol.record_loop), a companion's arguments (kdaemon.supervisor.companion_run); and
# those of the benchmark and fuzzing tools and of the test harness (testkit/shared.py sets
# KDAEMON_TEST_SERVERS_RUN for a whole run, so every daemon a test starts inherits it).  Their
# modules sit in layers that cannot import this one, so the names are repeated here;
# tests/config/test_env_overrides.py fails when kdaemon, bench/, fuzz/ or testkit/ use a
# KDAEMON_ variable this list does not cover.
NOT_CONFIGURATION = frozenset({"KDAEMON_CACHE", "KDAEMON_PURE_PYTHON", "KDAEMON_COMPANION"})
NOT_CONFIGURATION_PREFIXES = ("KDAEMON_BENCH_", "KDAEMON_FUZZ_", "KDAEMON_TEST_")
HIDDEN = "***"   # a secret's value, as check-config shows it


@dataclass(frozen=True)
class Layout:
    """The file's top level as the environment can set it.  The loader builds it from its own
    description of the file (``TOP_KINDS``), so the two cannot disagree."""

    tables: Mapping[str, frozenset[str]]   # [name] -> its known keys (for guesses only)
    table_arrays: frozenset[str]           # [[name]]: cannot be set from the environment
    values: frozenset[str]                 # top-level keys that are not tables (plugins)
    secrets: frozenset[str] = frozenset()  # "kafka.sasl_password": verbatim, shown hidden
    # "kafka.sasl_password_env": keys whose value names a variable the configuration reads.
    secret_sources: frozenset[str] = frozenset()

    def names(self) -> set[str]:
        return set(self.tables) | set(self.table_arrays) | set(self.values)

    def variables(self) -> set[str]:
        """Every variable name the known keys make, for guesses."""
        out = {PREFIX + name.upper() for name in self.values}
        for section, keys in self.tables.items():
            out |= {f"{PREFIX}{section.upper()}_{key.upper()}" for key in keys}
        return out


@dataclass(frozen=True)
class Override:
    """One configuration value from one environment variable."""

    variable: str          # KDAEMON_DAEMON_WORKERS
    section: str | None    # "daemon"; None for a top-level key (plugins)
    key: str               # "workers"
    value: Any             # what the loader checks: the parsed TOML value, or the text
    text: str              # the variable's text, as set
    secret: bool = False

    @property
    def where(self) -> str:
        """``daemon.workers``, as the loader's problems name the key."""
        return key_path(self.section or "", self.key)

    @property
    def shown(self) -> str:
        """The value as TOML text, a secret hidden."""
        return toml_string(HIDDEN) if self.secret else toml_value(self.value)


@dataclass(frozen=True)
class Overrides:
    """The overrides an environment holds, and the problems of the variables that are not."""

    applied: tuple[Override, ...] = ()
    problems: tuple[str, ...] = ()   # each "environment <VARIABLE>: text"

    def over(self, raw: Mapping) -> dict:
        """``raw`` (the file's mapping, left as it is) with the overrides set over it."""
        out = dict(raw)
        copied: set[str] = set()
        for o in self.applied:
            if o.section is None:
                out[o.key] = o.value
                continue
            table = out.get(o.section, {})
            if not isinstance(table, dict):
                continue   # the file's [section] is not a table: the loader reports that
            if o.section not in copied:
                table = dict(table)
                copied.add(o.section)
            table[o.key] = o.value
            out[o.section] = table
        return out

    def source_of(self, problem: str) -> Override | None:
        """The override a loader problem (``daemon.workers: ...``, ``daemon.topics[1]: ...``)
        is about, if its key came from the environment."""
        best = None
        for o in self.applied:
            where = o.where
            if problem.startswith(where) and problem[len(where):len(where) + 1] in (":", "[", ".") \
                    and (best is None or len(where) > len(best.where)):
                best = o
        return best

    def word(self, problem: str, path: str) -> str:
        """A loader problem as an operator reads it: from the variable that set the key (with
        how to write the value, when its type is what went wrong), else from the file."""
        o = self.source_of(problem)
        if o is None:
            return f"{path}: {problem}"
        return f"environment {o.variable}: {problem}{_how_to_write(o, problem)}"


def read_overrides(environ: Mapping[str, str], layout: Layout, file_raw: Mapping) -> Overrides:
    """The ``KDAEMON_*`` variables of ``environ`` as overrides of the file ``file_raw``, in
    the order of their names; a problem for each that names nothing the file can hold."""
    applied: list[Override] = []
    problems: list[tuple[str, str]] = []
    for variable in sorted(environ):
        if not variable.startswith(PREFIX) or _not_configuration(variable):
            continue
        found = _override(variable, environ[variable], layout)
        if isinstance(found, Override):
            applied.append(found)
        else:
            problems.append((variable, found))
    sources = _secret_source_variables(layout, [file_raw, Overrides(tuple(applied)).over(file_raw)])
    applied = [o for o in applied if o.variable not in sources]
    problems = [(v, text) for v, text in problems if v not in sources]
    seen: dict[str, str] = {}
    for o in list(applied):
        if o.where in seen:   # KDAEMON_daemon_workers beside KDAEMON_DAEMON_WORKERS
            problems.append((o.variable, f"sets {o.where}, as {seen[o.where]} does: keep one"))
            applied.remove(o)
        else:
            seen[o.where] = o.variable
    return Overrides(tuple(applied), tuple(f"environment {v}: {text}" for v, text in problems))


def _not_configuration(variable: str) -> bool:
    return variable in NOT_CONFIGURATION or variable.startswith(NOT_CONFIGURATION_PREFIXES)


def _override(variable: str, text: str, layout: Layout) -> Override | str:
    """The override ``variable`` makes, or what is wrong with its name."""
    rest = variable[len(PREFIX):].lower()
    if rest in layout.values:
        return Override(variable, None, rest, parse_value(text), text)
    if "__" in rest:
        return ("nested keys cannot be set one by one ('__'): set the key's whole table as a TOML "
                "inline table, e.g. KDAEMON_SINK_CONF='{ \"spark.driver.memory\" = \"2g\" }'")
    # The longest known name that leaves a key: with both [sink] and [sink_retry],
    # KDAEMON_SINK_RETRY_MAX is sink_retry.max and KDAEMON_SINK_RETRY is sink.retry.
    bare = None
    for name in sorted(layout.names(), key=len, reverse=True):
        if rest != name and not rest.startswith(name + "_"):
            continue
        if name in layout.table_arrays:
            return (f"[[{name}]] is an array of tables, which environment variables cannot set: "
                    "write its entries in the configuration file")
        if name in layout.values:
            return f"{name} is a top-level key, not a table: set it whole, {PREFIX}{name.upper()}=<TOML value>"
        key = rest[len(name) + 1:]
        if not key:
            bare = bare or name
        elif key_path(name, key) in layout.secrets:
            return Override(variable, name, key, text, text, secret=True)
        else:
            return Override(variable, name, key, parse_value(text), text)
    if bare is not None:
        return f"names [{bare}] but no key: write {PREFIX}{bare.upper()}_<KEY>"
    # A known variable the name resembles, else the name with a known section for its first word.
    _, _, after = rest.partition("_")
    guess = did_you_mean(variable, layout.variables()) or did_you_mean(
        variable, {f"{PREFIX}{s.upper()}_{after.upper()}" for s in layout.tables if after})
    tops = ", ".join(PREFIX + v.upper() for v in sorted(layout.values))
    return (f"unknown section{guess}: {PREFIX}<SECTION>_<KEY> takes one of "
            f"the sections {', '.join(sorted(layout.tables))}" + (f"; or {tops}" if tops else ""))


def parse_value(text: str) -> Any:
    """``text`` as a TOML value when it is one, else ``text`` itself: ``4`` is an integer,
    ``"4"`` and ``/data/out`` are strings.  Only a value alone counts (``1\\nx = 2`` is text)."""
    try:
        doc = tomllib.loads(f"value = {text}")
    except tomllib.TOMLDecodeError:
        return text
    return doc["value"] if set(doc) == {"value"} else text


def _secret_source_variables(layout: Layout, raws: Sequence[Mapping]) -> set[str]:
    """The variables a configuration (the file's, or with the overrides) names as secrets'
    sources: kafka_section reads them, they override nothing."""
    out = set()
    for raw in raws:
        for where in layout.secret_sources:
            section, _, key = where.partition(".")
            table = raw.get(section)
            if isinstance(table, Mapping) and isinstance(table.get(key), str):
                out.add(table[key])
    return out


def _how_to_write(o: Override, problem: str) -> str:
    """The hint for the rule's trap: a value read as TOML where a string was expected, or a
    string where a list was."""
    if o.secret or not problem.startswith(f"{o.where}: expected "):
        return ""   # not the value's own type (an element's, say: daemon.topics[1])
    expected = problem.split(": expected ", 1)[1].split(", found ", 1)[0]
    if expected.startswith("a list") and isinstance(o.value, str):
        items = ", ".join(toml_string(item.strip()) for item in o.text.split(",") if item.strip())
        return f"; a list is written as a TOML array: {o.variable}='[{items}]'"
    if "string" in expected and not isinstance(o.value, str):
        return (f"; the value reads as a TOML {toml_type(o.value)}: quote it to give a string, "
                f"{o.variable}='{toml_string(o.text)}'")
    return ""


def effective_toml(raw: Mapping, overrides: Sequence[Override], layout: Layout) -> str:
    """The effective configuration (the file's mapping with the overrides over it) as TOML, each
    value that came from the environment marked with its variable, secrets hidden (the file's
    inline ones too).  For reading: tables in tables are written inline, as ``dump_toml`` does."""
    by_where = {o.where: o for o in overrides}

    def line(section: str, key: str, value: Any) -> str:
        o = by_where.get(key_path(section, key))
        text = toml_string(HIDDEN) if key_path(section, key) in layout.secrets else toml_value(value)
        return f"{toml_key(key)} = {text}" + (f"   # {o.variable}" if o is not None else "")

    lines = [line("", k, v) for k, v in raw.items()
             if not isinstance(v, Mapping) and not _is_table_array(v)]
    for name, value in raw.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{toml_key(name)}]"] + [line(name, k, v) for k, v in value.items()]
        elif _is_table_array(value):
            for entry in value:
                lines += ["", f"[[{toml_key(name)}]]"]
                lines += [f"{toml_key(k)} = {toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)
