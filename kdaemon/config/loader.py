"""Reading a configuration file into ``DaemonConfig``: every problem at once, one line each.

Each section is checked against the TOML types of the dataclass it fills
(``kdaemon.settings.kinds_of``) before anything looks at its values, so a wrong type is reported as ``section.key: expected
..., found ...`` and a follow-up check never trips over it (no "give the topics" after
``daemon.topics[1]: expected a string``: the topics were given, wrongly).

``load`` sets the environment's ``KDAEMON_<SECTION>_<KEY>`` overrides (``env``) over the file
before any of this, so they get the same checks; ``parse`` alone reads no environment variable
but the secrets' sources.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from collections.abc import Mapping

from ..protocol.header_match import DEFAULTS as FILTER_DEFAULTS, rule_problems
from ..settings import (NUMBER, STRING, TABLE, Kind, SettingsError, check_table, did_you_mean, key_path, kinds_of,
                        list_of, parse_settings)
from .env import Layout, Override, Overrides, read_overrides
from .kafka import KAFKA_KINDS, SECRET_SOURCES, SECRETS, kafka_section
from .model import (DEFAULT_DLQ_DIR, DEFAULT_PLUGINS, ERROR_POLICIES_DESERIALIZE, ERROR_POLICIES_SINK, ON_STOP,
                    OTEL_PROTOCOLS, SHARE_ISOLATION_LEVELS, SHARE_OFFSET_RESETS, ConfigError, DaemonConfig,
                    DaemonSection, DeserializerConfig, FilterConfig, InterceptorConfig, OtelSection, ShareSection,
                    SinkConfig)
from .schema import section_kind, table_array_kind


DAEMON_KINDS = kinds_of(DaemonSection)
RULE_KINDS = {**{k: v for k, v in kinds_of(FilterConfig).items() if k not in ("plugin", "settings")},
              "value": STRING}
PLUGIN_FILTER_KINDS = {k: v for k, v in kinds_of(FilterConfig).items() if k in ("plugin", "settings")}
INTERCEPTOR_KINDS = kinds_of(InterceptorConfig)
DESERIALIZER_KINDS = kinds_of(DeserializerConfig)
SINK_KINDS = {"type": STRING}   # the rest of [sink] is the sink's own (it checks its settings)
SHARE_KINDS = kinds_of(ShareSection)
OTEL_KINDS = kinds_of(OtelSection)

# The file's top level: its tables (with the keys the loader knows in each), its arrays of
# tables, and its one plain key.
TABLES: dict[str, dict[str, Kind]] = {"kafka": KAFKA_KINDS, "daemon": DAEMON_KINDS,
                                      "deserializer": DESERIALIZER_KINDS, "sink": SINK_KINDS, "dlq": SINK_KINDS,
                                      "share": SHARE_KINDS, "otel": OTEL_KINDS}
TABLE_ARRAYS = ("filters", "interceptors")
TOP_KINDS: dict[str, Kind] = {
    "plugins": list_of(STRING, "a list of plugin names"),
    **{name: section_kind(name) for name in TABLES},
    **{name: table_array_kind(name) for name in TABLE_ARRAYS},
}
# What KDAEMON_<SECTION>_<KEY> variables can set (kdaemon.config.env).
ENV_LAYOUT = Layout(
    tables={name: frozenset(kinds) for name, kinds in TABLES.items()},
    table_arrays=frozenset(TABLE_ARRAYS),
    values=frozenset(TOP_KINDS) - set(TABLES) - set(TABLE_ARRAYS),
    secrets=frozenset(f"kafka.{name}" for name in SECRETS),
    secret_sources=frozenset(f"kafka.{key}" for key in SECRET_SOURCES if key.endswith("_env")),
)
_CHOICES = {"assignment": ("group", "static"), "on_deserialize_error": ERROR_POLICIES_DESERIALIZE,
            "on_sink_error": ERROR_POLICIES_SINK, "filter_default": FILTER_DEFAULTS,
            "log_level": ("DEBUG", "INFO", "WARNING", "ERROR"), "on_stop": ON_STOP}
_POSITIVE = ("poll_timeout_ms", "flush_interval_ms", "flush_max_records", "max_buffered_records",
             "metrics_interval_ms", "sink_probe_max_ms", "endpoint_request_timeout_s", "endpoint_max_clients")


def load(path: str | os.PathLike, *, environ: Mapping[str, str] | None = None) -> DaemonConfig:
    """Read the file, set the environment's overrides over it, validate; raise ConfigError
    listing every problem.  ``environ`` (default ``os.environ``) also holds the secrets'
    sources (``sasl_password_env``)."""
    env = os.environ if environ is None else environ
    raw = _read(str(path))
    return parse(raw, str(path), environ=env, overrides=read_overrides(env, ENV_LAYOUT, raw))


def load_for_check(path: str | os.PathLike, problems: list[str], *, environ: Mapping[str, str] | None = None,
                   overrides: list[Override] | None = None) -> DaemonConfig | None:
    """For ``check-config``, which lists every problem in one run: the file's problems (and the
    environment's) go to ``problems`` and the configuration is returned all the same (what was
    wrong left at its default) so the plugins can check the rest; None if the file cannot be
    read as TOML.  The overrides set over the file are added to ``overrides``, to show them."""
    env = os.environ if environ is None else environ
    try:
        raw = _read(str(path))
    except ConfigError as exc:
        problems += exc.problems
        return None
    found = read_overrides(env, ENV_LAYOUT, raw)
    if overrides is not None:
        overrides += found.applied
    return parse(raw, str(path), environ=env, problems=problems, overrides=found)


def _read(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    except UnicodeDecodeError as exc:   # tomllib decodes the file as UTF-8 before parsing it
        raise ConfigError([f"{path}: not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"]) \
            from None
    except OSError as exc:               # a directory, no permission, ...
        raise ConfigError([f"{path}: cannot read it: {exc.strerror or exc}"]) from None
    return raw


def parse(raw: dict, path: str = "<config>", *, environ: Mapping[str, str] | None = None,
          problems: list[str] | None = None, overrides: Overrides | None = None) -> DaemonConfig:
    """Validate a parsed TOML mapping; raise ConfigError listing every problem as
    ``path: section.key: text`` — or, given a ``problems`` list, add them to it and return the
    configuration with what was wrong left at its defaults (``load_for_check``).  With
    ``overrides`` (``load``), they are set over ``raw`` first, and a problem of a key one of
    them set starts ``environment <VARIABLE>:`` instead of ``path:``."""
    env = os.environ if environ is None else environ
    overrides = overrides if overrides is not None else Overrides()
    raw = overrides.over(raw)
    collect, problems = problems, []

    def problem(where: str, text: str) -> None:
        problems.append(f"{where}: {text}")

    for key in raw:
        if key not in TOP_KINDS:
            problem(key_path("", key), f"unknown section or key{did_you_mean(key, TOP_KINDS)} "
                                       f"(known: {', '.join(sorted(TOP_KINDS))})")
    top = check_table("", raw, TOP_KINDS, problems)
    mistyped = set(raw) - set(top)   # given, with the wrong type (already reported)

    plugins = top.get("plugins", list(DEFAULT_PLUGINS))
    kafka_raw = top.get("kafka", {})
    kafka = kafka_section(kafka_raw, env, problems)
    daemon, daemon_mistyped = _daemon_section(top.get("daemon", {}), problems)
    filters = _filters(top.get("filters", []), problems)
    deser = _deserializer(top.get("deserializer", {}), problems)
    interceptors = _interceptors(top.get("interceptors", []), problems)
    sink = _sink(top.get("sink", {"type": "jsonl"}), "sink", problems)
    if "dlq" in top:
        dlq = _sink(top["dlq"], "dlq", problems)
    elif "dlq" not in mistyped and "dlq" in (daemon.on_deserialize_error, daemon.on_sink_error):
        dlq = default_dlq(daemon)
    else:
        dlq = None
    if "daemon" not in mistyped and not daemon_mistyped & {"topics", "topic_pattern"}:
        if not daemon.topics and not daemon.topic_pattern:
            problem("daemon.topics", "give the topics to consume (or daemon.topic_pattern)")
    if daemon.topics and daemon.topic_pattern:
        problem("daemon.topic_pattern", "give either topics or topic_pattern, not both")
    if daemon.assignment == "static" and daemon.topic_pattern:
        problem("daemon.assignment", "static assignment needs explicit topics, not a pattern")
    if "kafka" not in mistyped and "group_id" not in kafka_raw and daemon.assignment == "group":
        problem("kafka.group_id", "required: offsets are committed to the group")
    share = _share_section(top.get("share", {}), problems)
    group_type = kafka.get("group_type", "consumer")
    if "share" in top and group_type != "share":
        problem("share", f"a [share] table sets a share group's configs, but [kafka] group_type is "
                         f"{group_type!r}: set kafka.group_type = \"share\", or remove [share]")
    if group_type == "share" and daemon.topic_pattern:
        problem("daemon.topic_pattern", "a share group subscribes to topics by name (a share consumer has no pattern "
                                        "subscription, as Java's KafkaShareConsumer): list them in daemon.topics")
    if group_type == "share" and "daemon" not in mistyped and daemon.assignment != "group":
        problem("daemon.assignment", f"{daemon.assignment!r} cannot be used with kafka.group_type = \"share\": "
                                     "the broker hands a share group's records out to its members; remove it")
    otel = _otel_section(top["otel"], plugins, env, problems) if "otel" in top else None
    worded = [*overrides.problems, *(overrides.word(p, path) for p in problems)]
    if worded and collect is None:
        raise ConfigError(worded)
    if collect is not None:
        collect += worded
    return DaemonConfig(path, tuple(plugins), kafka, daemon, filters, deser, interceptors, sink, dlq, raw, share, otel)


def default_dlq(daemon: DaemonSection) -> SinkConfig:
    """The DLQ of a file without ``[dlq]``: JSON lines under ``<state_dir>/dlq`` (the ``jsonl``
    sink, durable before offsets are committed), so the default policy keeps failed records."""
    settings = {"type": "jsonl", "path": os.path.join(daemon.state_dir, DEFAULT_DLQ_DIR)}
    return SinkConfig("jsonl", settings, implicit=True)


def _daemon_section(section: dict, problems: list[str]) -> tuple[DaemonSection, set[str]]:
    """The section, and the keys whose values had the wrong type (left at their defaults)."""
    def problem(where: str, text: str) -> None:
        problems.append(f"{where}: {text}")

    values: dict = {}
    mistyped: set[str] = set()
    for key, value in section.items():
        kind = DAEMON_KINDS.get(key)
        if kind is None:
            problem(key_path("daemon", key), f"unknown option{did_you_mean(key, DAEMON_KINDS)}")
            continue
        wrong = kind.problems(f"daemon.{key}", value)
        if wrong:
            problems += wrong
            mistyped.add(key)
            continue
        if kind is NUMBER:
            if not math.isfinite(value) or value < 0:
                problem(f"daemon.{key}", f"must be a finite number, not negative (found {value})")
                continue
            value = float(value)
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, int) and value < 0:
            problem(f"daemon.{key}", "must not be negative")
            continue
        values[key] = value
    d = DaemonSection(**values)
    for key, allowed in _CHOICES.items():
        if getattr(d, key) not in allowed:
            problem(f"daemon.{key}", f"{getattr(d, key)!r} is not one of {', '.join(allowed)}")
    for key in _POSITIVE:
        if getattr(d, key) <= 0:
            problem(f"daemon.{key}", "must be positive")
    if d.topic_pattern is not None:
        try:
            re.compile(d.topic_pattern)
        except re.error as exc:
            problem("daemon.topic_pattern", f"not a valid regular expression: {exc}")
    host, sep, port = d.metrics_addr.rpartition(":")
    if not sep or not port.isdigit():
        problem("daemon.metrics_addr", "must be host:port")
    return d, mistyped


# ISO-8601 durations as Java's Duration.parse takes them for share.auto.offset.reset's
# by_duration (days, hours, minutes, seconds; not negative).
_ISO_DURATION = re.compile(r"P(?=\d|T\d)(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+(\.\d+)?S)?)?", re.IGNORECASE)


def _share_section(section: dict, problems: list[str]) -> ShareSection:
    """``[share]``: each setting typed and checked here; what only the broker knows (its
    bounds, group.share.min/max.record.lock.duration.ms and the delivery count limit's) it says
    when worker 0 sets them (``kdaemon.worker.share_group``)."""
    def problem(where: str, text: str) -> None:
        problems.append(f"{where}: {text}")

    for k in sorted(set(section) - set(SHARE_KINDS)):
        problem(key_path("share", k), f"unknown option{did_you_mean(k, SHARE_KINDS)} "
                                      f"({', '.join(SHARE_KINDS)})")
    typed = check_table("share", {k: v for k, v in section.items() if k in SHARE_KINDS}, SHARE_KINDS, problems)
    reset = typed.get("auto_offset_reset")
    if reset is not None and reset not in SHARE_OFFSET_RESETS:
        by, _, iso = reset.partition(":")
        if by != "by_duration" or not _ISO_DURATION.fullmatch(iso):
            problem("share.auto_offset_reset", f"{reset!r} is not one of {', '.join(SHARE_OFFSET_RESETS)} or "
                                               "by_duration:<ISO-8601 duration> (e.g. by_duration:PT1H)")
            typed.pop("auto_offset_reset")
    level = typed.get("isolation_level")
    if level is not None and level not in SHARE_ISOLATION_LEVELS:
        problem("share.isolation_level", f"{level!r} is not one of {', '.join(SHARE_ISOLATION_LEVELS)}")
        typed.pop("isolation_level")
    for key in ("record_lock_duration_ms", "delivery_count_limit"):
        if typed.get(key) is not None and typed[key] <= 0:
            problem(f"share.{key}", f"must be positive (found {typed[key]})")
            typed.pop(key)
    return ShareSection(**typed)


# The plugins = [...] entries that enable the bundled otel plugin: its entry point, or its module
# by Python path (a tree whose entry points were not installed again).
OTEL_PLUGIN_NAMES = ("otel", "kdaemon_otel:")
# The standard variables naming the OTLP protocol, the more specific first (the SDK's order).
OTEL_PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def _otel_section(section: dict, plugins: list, environ: Mapping[str, str], problems: list[str]) -> OtelSection | None:
    """``[otel]``, parsed by the one settings checker.  Also refused: an ``[otel]`` whose plugin
    is not enabled (the table would do nothing, silently), and, when the file leaves the
    protocol to the environment, a protocol variable naming one the exporters do not speak (the
    SDK would fall back to http/protobuf without a word)."""
    try:
        otel = parse_settings(OtelSection, section, "otel", ignore=())
    except SettingsError as exc:
        problems += exc.lines()
        otel = None
    if not any(name in plugins for name in OTEL_PLUGIN_NAMES):
        problems.append('otel: an [otel] table configures the otel plugin, which is not enabled: add "otel" to '
                        "plugins (pip install 'kdaemon[otel]'), or remove [otel]")
    if otel is not None and otel.protocol is None:
        variable = next((v for v in OTEL_PROTOCOL_VARIABLES if environ.get(v)), None)
        if variable is not None and environ[variable] not in OTEL_PROTOCOLS:
            problems.append(f"otel.protocol: the environment's {variable}={environ[variable]!r} is not a protocol the "
                            f"otel plugin speaks ({', '.join(OTEL_PROTOCOLS)}): change it, or set otel.protocol")
    return otel


def _entries(entries: list, name: str, problems: list[str]):
    """(where, table) for each ``[[name]]`` entry that is a table; a problem for the others."""
    for i, e in enumerate(entries):
        wrong = TABLE.problems(f"{name}[{i}]", e)
        if wrong:
            problems += wrong
        else:
            yield f"{name}[{i}]", e


def _filters(entries: list, problems: list[str]) -> tuple[FilterConfig, ...]:
    out = []
    for where, e in _entries(entries, "filters", problems):
        if "plugin" in e:
            for k in sorted(set(e) - set(PLUGIN_FILTER_KINDS)):
                problems.append(f"{key_path(where, k)}: unknown key beside plugin{did_you_mean(k, PLUGIN_FILTER_KINDS)} "
                                "(plugin, settings)")
            before = len(problems)
            typed = check_table(where, e, PLUGIN_FILTER_KINDS, problems)
            if len(problems) == before:
                out.append(FilterConfig(plugin=typed["plugin"], settings=typed.get("settings", {})))
            continue
        rule = {k: v for k, v in e.items() if k not in ("plugin", "settings")}
        before = len(problems)
        check_table(where, rule, RULE_KINDS, problems)
        if len(problems) > before:
            continue   # wrong types: the rule's own checks would only repeat them
        found = rule_problems(rule)
        problems += [f"{key_path(where, field_name)}: {text}" for field_name, text in found]
        if found:
            continue
        header, op, action = e["header"], e.get("op", "equals"), e.get("action", "keep")
        values = e.get("values", [e["value"]] if "value" in e else [])
        out.append(FilterConfig(header=header, op=op, values=tuple(values), action=action))
    return tuple(out)


def _deserializer(section: dict, problems: list[str]) -> DeserializerConfig:
    for k in sorted(set(section) - set(DESERIALIZER_KINDS)):
        problems.append(f"{key_path('deserializer', k)}: unknown key{did_you_mean(k, DESERIALIZER_KINDS)} "
                        "(key, value, settings)")
    typed = check_table("deserializer", section, DESERIALIZER_KINDS, problems)
    return DeserializerConfig(typed.get("key", "bytes"), typed.get("value", "bytes"), typed.get("settings", {}))


def _interceptors(entries: list, problems: list[str]) -> tuple[InterceptorConfig, ...]:
    out = []
    for where, e in _entries(entries, "interceptors", problems):
        for k in sorted(set(e) - set(INTERCEPTOR_KINDS)):
            problems.append(f"{key_path(where, k)}: unknown key{did_you_mean(k, INTERCEPTOR_KINDS)} (name, settings)")
        before = len(problems)
        typed = check_table(where, e, INTERCEPTOR_KINDS, problems)
        if "name" not in e:
            problems.append(f"{where}.name: required: the interceptor's name")
        elif len(problems) == before:
            out.append(InterceptorConfig(typed["name"], typed.get("settings", {})))
    return tuple(out)


def _sink(section: dict, name: str, problems: list[str]) -> SinkConfig:
    before = len(problems)
    typed = check_table(name, section, SINK_KINDS, problems)
    if "type" not in section:
        problems.append(f"{name}.type: required: the sink type (e.g. jsonl, stdout, null)")
    if len(problems) > before:
        return SinkConfig("null", dict(section))
    return SinkConfig(typed["type"], dict(section))
