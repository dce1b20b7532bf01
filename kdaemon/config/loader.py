"""The daemon's configuration: one TOML file, loaded into typed dataclasses, validated at once.

Validation collects *every* problem and reports each as ``file: section.key: problem`` so an
operator fixes a file in one pass (the CLI exits 2).  Secrets (``sasl_password``,
``ssl_password``) may be given inline, but also as ``<name>_env`` (an environment variable) or
``<name>_file`` (a file, e.g. a systemd credential under ``$CREDENTIALS_DIRECTORY``), so they
never have to live in the file.

Its place in the layers: above ``kdaemon.protocol`` and ``kdaemon.client`` (it checks consumer
options with ``ConsumerConfig`` and header rules with ``header_match``) and above the plugins and
sinks, below the worker, the supervisor and the CLI, which read it.  It names plugins, filters and
sinks by string and never imports them; plugins and sinks never import it either (a factory gets
its own ``settings`` table).  What only the loaded plugins can check about a configuration is the
worker's business: ``kdaemon.worker.build.check_against_plugins``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .client.config import ConsumerConfig
from .protocol.header_match import DEFAULTS as FILTER_DEFAULTS, rule_problems

DEFAULT_PLUGINS = ("header_rules", "ttl", "json")
ERROR_POLICIES_DESERIALIZE = ("dlq", "skip", "stop")
ERROR_POLICIES_SINK = ("retry", "dlq", "stop")
_SECRETS = ("sasl_password", "ssl_password")
_CONSUMER_FIELDS = {f.name for f in dataclasses.fields(ConsumerConfig)}
# Consumer options the daemon owns: configuring them would break delivery guarantees.
_DAEMON_OWNED = {"enable_auto_commit", "header_filter", "on_consume", "on_commit"}
# [kafka] group_protocol: the consumer's two (Java's group.protocol) and the daemon's "auto",
# which each worker resolves against the broker when it starts (kdaemon.client.features).
GROUP_PROTOCOLS = ("auto", "classic", "consumer")


class ConfigError(Exception):
    """Every problem found in a configuration file, one per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class FilterConfig:
    """One ``[[filters]]`` entry: a declarative rule, or ``plugin`` naming a filter factory."""

    header: str | None = None
    op: str | None = None
    values: tuple[str, ...] = ()
    action: str = "keep"
    plugin: str | None = None
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class InterceptorConfig:
    name: str
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DeserializerConfig:
    key: str = "bytes"
    value: str = "bytes"
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SinkConfig:
    type: str = "jsonl"
    settings: dict = field(default_factory=dict)  # the whole [sink] table, type included


@dataclass(frozen=True)
class DaemonSection:
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    workers: int = 0                  # 0: one per CPU
    assignment: str = "group"         # group | static
    daemon_id: str = ""               # static membership ids are "<daemon_id>-<index>"
    poll_timeout_ms: int = 500
    flush_interval_ms: int = 1000
    flush_max_records: int = 50_000
    max_buffered_records: int = 200_000
    on_deserialize_error: str = "dlq"
    on_sink_error: str = "retry"
    sink_retry_backoff_ms: int = 200
    sink_retry_backoff_max_ms: int = 30_000
    filter_default: str = "auto"      # keep | drop | auto (the opposite of the last rule's action)
    state_dir: str = "./var/kdaemon"
    metrics_addr: str = "127.0.0.1:9464"
    shutdown_timeout_s: float = 30.0
    heartbeat_timeout_s: float = 60.0
    metrics_interval_ms: int = 1000   # how often a worker publishes its /metrics counters
    max_worker_rss_mb: int = 0        # 0: never recycle
    log_level: str = "INFO"


@dataclass(frozen=True)
class DaemonConfig:
    path: str
    plugins: tuple[str, ...]
    kafka: dict
    daemon: DaemonSection
    filters: tuple[FilterConfig, ...]
    deserializer: DeserializerConfig
    interceptors: tuple[InterceptorConfig, ...]
    sink: SinkConfig
    dlq: SinkConfig | None
    raw: dict

    @property
    def group_protocol(self) -> str:
        """[kafka] group_protocol: "auto" (the default), "classic" or "consumer"."""
        return self.kafka.get("group_protocol", "auto")

    def consumer_options(self) -> dict:
        """Options for ``kdaemon.client.Consumer`` (secrets resolved).  ``group_protocol`` is
        left out while it is "auto", which no consumer takes: the worker resolves it
        (``kdaemon.worker.main.resolve_group_protocol``); tools that join no group ignore it."""
        opts = dict(self.kafka)
        if opts.get("group_protocol") == "auto":
            del opts["group_protocol"]
        return opts


def load(path: str | os.PathLike, *, environ: dict | None = None) -> DaemonConfig:
    """Read and validate; raise ConfigError listing every problem."""
    path = str(path)
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError([f"{path}: file not found"]) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"{path}: not valid TOML: {exc}"]) from None
    return parse(raw, path, environ=environ)


def parse(raw: dict, path: str = "<config>", *, environ: dict | None = None) -> DaemonConfig:
    env = os.environ if environ is None else environ
    problems: list[str] = []

    def problem(where: str, text: str) -> None:
        problems.append(f"{path}: {where}: {text}")

    known_top = {"plugins", "kafka", "daemon", "filters", "deserializer", "interceptors", "sink", "dlq"}
    for key in raw:
        if key not in known_top:
            problem(key, f"unknown section or key (known: {', '.join(sorted(known_top))})")

    plugins = raw.get("plugins", list(DEFAULT_PLUGINS))
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        problem("plugins", "must be a list of plugin names")
        plugins = []

    kafka = _kafka_section(raw.get("kafka", {}), env, problem)
    daemon = _daemon_section(raw.get("daemon", {}), problem)
    filters = _filters(raw.get("filters", []), problem)
    deser = _deserializer(raw.get("deserializer", {}), problem)
    interceptors = _interceptors(raw.get("interceptors", []), problem)
    sink = _sink(raw.get("sink", {"type": "jsonl"}), "sink", problem)
    dlq = _sink(raw["dlq"], "dlq", problem) if "dlq" in raw else None
    if daemon.on_deserialize_error == "dlq" or daemon.on_sink_error == "dlq":
        if dlq is None:
            problem("dlq", "a [dlq] sink is required because an error policy is 'dlq'")
    if not daemon.topics and not daemon.topic_pattern:
        problem("daemon.topics", "give the topics to consume (or daemon.topic_pattern)")
    if daemon.topics and daemon.topic_pattern:
        problem("daemon.topic_pattern", "give either topics or topic_pattern, not both")
    if daemon.assignment == "static" and daemon.topic_pattern:
        problem("daemon.assignment", "static assignment needs explicit topics, not a pattern")
    if "group_id" not in kafka and (daemon.assignment == "group"):
        problem("kafka.group_id", "required: offsets are committed to the group")
    if problems:
        raise ConfigError(problems)
    return DaemonConfig(path, tuple(plugins), kafka, daemon, filters, deser, interceptors, sink, dlq, raw)


def _kafka_section(section: Any, env, problem) -> dict:
    if not isinstance(section, dict):
        problem("kafka", "must be a table")
        return {}
    out: dict = {}
    for key, value in section.items():
        base = key
        for suffix in ("_env", "_file"):
            if key.endswith(suffix) and key[: -len(suffix)] in _SECRETS:
                base = key[: -len(suffix)]
        if base in _SECRETS and base != key:
            resolved = _resolve_secret(key, value, env, problem)
            if resolved is not None:
                if base in out:
                    problem(f"kafka.{key}", f"{base} is given more than once")
                out[base] = resolved
            continue
        if key == "group_protocol":
            if value not in GROUP_PROTOCOLS:
                problem(f"kafka.{key}", f"{value!r} is not one of {', '.join(GROUP_PROTOCOLS)}")
            else:
                out[key] = value
            continue
        if key in _DAEMON_OWNED:
            problem(f"kafka.{key}", "is managed by the daemon (offsets are committed after the sink "
                                    "flushes; filters come from [[filters]])")
            continue
        if key not in _CONSUMER_FIELDS:
            problem(f"kafka.{key}", "unknown consumer option")
            continue
        if key in out:
            problem(f"kafka.{key}", "given more than once")
        out[key] = tuple(value) if isinstance(value, list) else value
    try:
        # "auto" is the daemon's, not the consumer's: check the rest as the worker will pass it.
        ConsumerConfig.from_options(**{k: v for k, v in out.items()
                                       if not (k == "group_protocol" and v == "auto")})
    except (TypeError, ValueError) as exc:
        for part in _consumer_problems(str(exc)):
            # The consumer's messages start with the option's name ("session_timeout_ms must
            # be positive", "auto_offset_reset='x' is not one of ..."): report them as
            # kafka.<option> like every other problem.
            name = re.match(r"[a-z_]+", part)
            if name and name.group(0) in _CONSUMER_FIELDS:
                problem(f"kafka.{name.group(0)}", part[name.end():].lstrip("= "))
            elif part.startswith("bootstrap server"):
                problem("kafka.bootstrap_servers", part)
            else:
                problem("kafka", part)
    return out


def _consumer_problems(message: str) -> list[str]:
    """The consumer's one-line error as its problems: they are joined with "; ", which a
    problem's own text may contain too ("...: the broker decides it; leave it unset, ..."),
    so a part that does not start with an option's name continues the one before."""
    problems: list[str] = []
    for part in message.replace("invalid consumer configuration: ", "").split("; "):
        name = re.match(r"[a-z_]+", part)
        starts = (name is not None and name.group(0) in _CONSUMER_FIELDS) or part.startswith(
            ("bootstrap server", "unknown consumer option"))
        if problems and not starts:
            problems[-1] += "; " + part
        else:
            problems.append(part)
    return problems


def _resolve_secret(key: str, value: Any, env, problem) -> str | None:
    if not isinstance(value, str) or not value:
        problem(f"kafka.{key}", "must be a non-empty string")
        return None
    if key.endswith("_env"):
        if value not in env:
            problem(f"kafka.{key}", f"environment variable {value} is not set")
            return None
        return env[value]
    p = Path(value)
    if not p.is_absolute() and "CREDENTIALS_DIRECTORY" in env:
        p = Path(env["CREDENTIALS_DIRECTORY"]) / p
    try:
        return p.read_text().rstrip("\n")
    except OSError as exc:
        problem(f"kafka.{key}", f"cannot read {p}: {exc.strerror}")
        return None


def _daemon_section(section: Any, problem) -> DaemonSection:
    if not isinstance(section, dict):
        problem("daemon", "must be a table")
        return DaemonSection()
    fields = {f.name: f for f in dataclasses.fields(DaemonSection)}
    values: dict = {}
    for key, value in section.items():
        f = fields.get(key)
        if f is None:
            problem(f"daemon.{key}", "unknown option")
            continue
        default = f.default
        if isinstance(default, tuple):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                problem(f"daemon.{key}", "must be a list of strings")
                continue
            value = tuple(value)
        elif isinstance(default, bool) or default is None:
            pass
        elif isinstance(default, float):
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                problem(f"daemon.{key}", "must be a number")
                continue
            value = float(value)
        elif isinstance(default, int):
            if not isinstance(value, int) or isinstance(value, bool):
                problem(f"daemon.{key}", "must be an integer")
                continue
            if value < 0:
                problem(f"daemon.{key}", "must not be negative")
                continue
        elif isinstance(default, str) and not isinstance(value, str):
            problem(f"daemon.{key}", "must be a string")
            continue
        values[key] = value
    d = DaemonSection(**values)
    choices = {"assignment": ("group", "static"), "on_deserialize_error": ERROR_POLICIES_DESERIALIZE,
               "on_sink_error": ERROR_POLICIES_SINK, "filter_default": FILTER_DEFAULTS,
               "log_level": ("DEBUG", "INFO", "WARNING", "ERROR")}
    for key, allowed in choices.items():
        if getattr(d, key) not in allowed:
            problem(f"daemon.{key}", f"{getattr(d, key)!r} is not one of {', '.join(allowed)}")
    for key in ("poll_timeout_ms", "flush_interval_ms", "flush_max_records", "max_buffered_records",
                "metrics_interval_ms"):
        if getattr(d, key) <= 0:
            problem(f"daemon.{key}", "must be positive")
    if d.topic_pattern is not None and not isinstance(d.topic_pattern, str):
        problem("daemon.topic_pattern", "must be a string (a regular expression)")
    elif d.topic_pattern is not None:
        import re
        try:
            re.compile(d.topic_pattern)
        except re.error as exc:
            problem("daemon.topic_pattern", f"not a valid regular expression: {exc}")
    host, sep, port = d.metrics_addr.rpartition(":")
    if not sep or not port.isdigit():
        problem("daemon.metrics_addr", "must be host:port")
    return d


def _filters(entries: Any, problem) -> tuple[FilterConfig, ...]:
    if not isinstance(entries, list):
        problem("filters", "must be an array of tables ([[filters]])")
        return ()
    out = []
    for i, e in enumerate(entries):
        where = f"filters[{i}]"
        if not isinstance(e, dict):
            problem(where, "must be a table")
            continue
        if "plugin" in e:
            for k in sorted(set(e) - {"plugin", "settings"}):
                problem(f"{where}.{k}", "unknown key beside plugin (plugin, settings)")
            if not isinstance(e["plugin"], str):
                problem(f"{where}.plugin", "must be a string")
                continue
            settings = e.get("settings", {})
            if not isinstance(settings, dict):
                problem(f"{where}.settings", "must be a table")
                settings = {}
            out.append(FilterConfig(plugin=e["plugin"], settings=settings))
            continue
        rule = {k: v for k, v in e.items() if k not in ("plugin", "settings")}
        problems = rule_problems(rule)
        for field_name, text in problems:
            problem(f"{where}.{field_name}", text)
        if problems:
            continue
        header, op, action = e["header"], e.get("op", "equals"), e.get("action", "keep")
        values = e.get("values", [e["value"]] if "value" in e else [])
        out.append(FilterConfig(header=header, op=op, values=tuple(values), action=action))
    return tuple(out)


def _deserializer(section: Any, problem) -> DeserializerConfig:
    if not isinstance(section, dict):
        problem("deserializer", "must be a table")
        return DeserializerConfig()
    for k in set(section) - {"key", "value", "settings"}:
        problem(f"deserializer.{k}", "unknown key (key, value, settings)")
    d = DeserializerConfig(section.get("key", "bytes"), section.get("value", "bytes"), section.get("settings", {}))
    for k in ("key", "value"):
        if not isinstance(getattr(d, k), str):
            problem(f"deserializer.{k}", "must be a deserializer name")
    if not isinstance(d.settings, dict):
        problem("deserializer.settings", "must be a table")
    return d


def _interceptors(entries: Any, problem) -> tuple[InterceptorConfig, ...]:
    if not isinstance(entries, list):
        problem("interceptors", "must be an array of tables ([[interceptors]])")
        return ()
    out = []
    for i, e in enumerate(entries):
        where = f"interceptors[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("name"), str):
            problem(f"{where}.name", "required: the interceptor's name")
            continue
        for k in set(e) - {"name", "settings"}:
            problem(f"{where}.{k}", "unknown key (name, settings)")
        settings = e.get("settings", {})
        if not isinstance(settings, dict):
            problem(f"{where}.settings", "must be a table")
            settings = {}
        out.append(InterceptorConfig(e["name"], settings))
    return tuple(out)


def _sink(section: Any, name: str, problem) -> SinkConfig:
    if not isinstance(section, dict):
        problem(name, "must be a table")
        return SinkConfig()
    t = section.get("type")
    if not isinstance(t, str):
        problem(f"{name}.type", "required: the sink type (e.g. jsonl, stdout, null)")
        t = "null"
    return SinkConfig(t, dict(section))


# -- writing a configuration ------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)   # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} ({type(value).__name__}) as TOML")


def _is_table_array(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, Mapping) for v in value)


def dump_toml(raw: Mapping[str, Any]) -> str:
    """A configuration mapping (what ``tomllib`` gives for our files) as TOML text that ``load``
    reads back to the same mapping: top-level keys first, then ``[tables]``, then
    ``[[arrays of tables]]``; deeper levels become inline tables.  For files kdaemon generates
    (``kdaemon demo``, tests, benchmarks), which must not need a TOML writer dependency."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in raw.items()
             if not isinstance(v, Mapping) and not _is_table_array(v)]
    for key, value in raw.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{_toml_key(key)}]"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()]
        elif _is_table_array(value):
            for entry in value:
                lines += ["", f"[[{_toml_key(key)}]]"]
                lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in entry.items()]
    return "\n".join(lines) + "\n"
