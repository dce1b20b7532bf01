"""Turn a validated configuration and the loaded plugins into the objects a worker runs.

Done once per worker (after fork).  Unknown names and factories that refuse their settings are
reported as configuration problems in the same ``file: section.key: problem`` form.  A factory
that checks its table with ``kdaemon.settings.parse_settings`` raises a ``SettingsError``: its
problems are listed one per line, each under the table the factory was given (``table_of``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from ..config import ConfigError, DaemonConfig, FilterConfig
from ..plugins.companion import SinkContext
from ..plugins.types import Record, SinkRefused
from ..protocol.header_match import HeaderRule, HeaderRules, resolve_default
from ..settings import SettingsError
from .memory import MemoryShares

log = logging.getLogger(__name__)


@dataclass
class PipelineParts:
    header_filter: Callable | None
    key_deserializer: Callable
    value_deserializer: Callable
    interceptors: list[tuple[str, Any]]
    sink: Any
    dlq: Any | None
    # Rebuild a sink after a failed flush (its unflushed records are gone; the worker rewinds).
    make_sink: Callable[[], Any] | None = None
    make_dlq: Callable[[], Any] | None = None
    # The client's ``on_filtered``: plugins that asked to see the header-filtered records.
    on_filtered: "FilteredObservers | None" = None


class FilterChain:
    """Several header filters; a record is kept only if every one keeps it.

    Consecutive declarative rules were already compiled into one ``HeaderRules``; when that is
    the whole chain, the chain *is* that object (so the C decoder evaluates it natively).
    """

    __slots__ = ("filters",)

    def __init__(self, filters: list[Callable]) -> None:
        self.filters = tuple(filters)

    def __call__(self, headers) -> bool:
        for f in self.filters:
            if not f(headers):
                return False
        return True

    def __repr__(self) -> str:
        return f"FilterChain({list(self.filters)!r})"


class FilteredObservers:
    """The plugins' ``kdaemon_filtered_observer`` callables as the client's ``on_filtered``:
    each batch's dropped records, as plugin ``Record``s whose key and value are the broker's
    bytes (no deserializer ran), to every observer.  One that raises is counted in ``errors``
    (the worker's ``stats.plugin_errors``, once it runs) and logged when its exception type
    changes; the records stay filtered either way."""

    def __init__(self, observers: list[tuple[str, Callable]]) -> None:
        self.observers = observers
        self.errors: Counter = Counter()
        self._failing: dict[str, type] = {}

    def __call__(self, dropped) -> None:
        records = [Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers,
                          r.key, r.value) for r in dropped]
        for name, observe in self.observers:
            try:
                observe(records)
            except Exception as exc:
                self.errors[name] += 1
                if self._failing.get(name) is not type(exc):
                    self._failing[name] = type(exc)
                    log.exception("plugin %r: its filtered-record observer raised; the %d record(s) stay filtered "
                                  "(said again when its error changes)", name, len(records))


def _rule_group(rules: list[FilterConfig], default_setting: str) -> HeaderRules:
    compiled = [HeaderRule(r.header, r.op, tuple(r.values), keep=r.action == "keep") for r in rules]
    return HeaderRules(compiled, default=resolve_default(default_setting, compiled))


def sink_context(config: DaemonConfig) -> SinkContext:
    """What sink factories and companion factories learn about the daemon (one place for it)."""
    d = config.daemon
    return SinkContext(state_dir=os.path.abspath(d.state_dir), daemon_id=d.daemon_id or socket.gethostname(),
                       heartbeat_timeout_s=d.heartbeat_timeout_s, log_level=d.log_level,
                       memory_budget_bytes=MemoryShares.of(d.memory_budget_mb).sink_bytes,
                       kafka=config.consumer_options(), on_sink_error=d.on_sink_error,
                       group_type=config.group_type)


def table_of(kind: str, table: str, exc: SettingsError) -> str:
    """Where ``exc``'s problems are in the file.  A sink's settings are its whole table, which it
    calls ``sink`` (its first name part): the daemon says ``dlq`` where it is the DLQ.  Another
    factory's settings are the ``settings`` table of the entry naming it, and its problems'
    ``where`` is a path inside that table (``schema_registry`` for
    ``[deserializer.settings.schema_registry]``; empty for the table itself)."""
    if kind == "sink":
        first, dot, rest = exc.where.partition(".")
        return table + dot + rest
    return f"{table}.{exc.where}" if exc.where else table


def check_against_plugins(config: DaemonConfig, plugins) -> list[str]:
    """Problems only the loaded plugins can find: unknown names, factories refusing settings.

    Returns the problems (same format as ConfigError) so ``check-config`` can list them with
    the file's own problems.  It lives here, not in ``kdaemon.config``, because it builds what a
    worker builds: the configuration layer sits below the worker and never imports it.
    """
    try:
        build_pipeline_parts(config, plugins, dry_run=True)
    except ConfigError as exc:
        return exc.problems
    return []


def unchecked_sinks(config: DaemonConfig, plugins) -> list[str]:
    """The configured sinks whose factory offers no ``validate(settings)``: check-config cannot
    check their settings without building them (which may create files), so it says so."""
    factories = plugins.sinks(sink_context(config))
    used = [("sink.type", config.sink.type)] + ([("dlq.type", config.dlq.type)] if config.dlq is not None else [])
    return [f"{config.path}: {where}: sink {name!r} offers no validate(settings); its settings are checked "
            "only when a worker builds it"
            for where, name in used if name in factories and getattr(factories[name], "validate", None) is None]


def preflight_sinks(config: DaemonConfig, plugins) -> tuple[list[str], list[str]]:
    """What the configured sinks' targets say now, through each factory's ``preflight(settings)``
    (the Kafka DLQ: one Metadata request for its topic): (problems, notes).  A target refused for
    good (a topic that does not exist, an ACL) is a problem; one that cannot be asked now (no
    broker answers) a note, since the cluster may well be up when the daemon runs.

    ``check-config`` only: a worker asks its built sinks the same before its first poll
    (``Delivery.preflight``), which also covers a start, a restart and a reload; the supervisor's
    own check (``supervisor.configs.validate_in_child``) must not wait for a broker, and a broker
    that is down there is a reason to wait, not to refuse."""
    problems: list[str] = []
    notes: list[str] = []
    factories = plugins.sinks(sink_context(config))
    used = [("sink", config.sink.type, config.sink.settings)]
    if config.dlq is not None:
        used.append(("dlq", config.dlq.type, config.dlq.settings))
    for where, name, settings in used:
        preflight = getattr(factories.get(name), "preflight", None)
        if preflight is None:
            continue
        try:
            reason = preflight(settings)
        except SinkRefused as exc:
            problems.append(f"{config.path}: {where}: {exc.line()}")
        except (ValueError, TypeError, KeyError):
            continue   # settings validate() refused: already a problem
        except Exception as exc:   # a plugin's bug: named, never a traceback
            notes.append(f"{config.path}: {where}: sink {name!r}: preflight(settings) failed with "
                         f"{type(exc).__name__}: {exc}")
        else:
            if reason is not None:
                notes.append(f"{config.path}: {where}: could not check sink {name!r}'s target now ({reason}); "
                             "each worker checks again before it consumes anything")
    return problems, notes


def build_pipeline_parts(config: DaemonConfig, plugins, *, dry_run: bool = False) -> PipelineParts:
    problems: list[str] = []
    path = config.path

    def problem(where: str, text: str) -> None:
        line = f"{path}: {where}: {text}"
        if line not in problems:   # the key and value deserializers share one settings table
            problems.append(line)

    def refused(kind: str, where: str, table: str, name: str, exc: Exception) -> None:
        if isinstance(exc, SettingsError):
            for at, text in exc.located(table_of(kind, table, exc)):
                problem(at, text)
        else:
            problem(where, f"{kind} {name!r} refused its settings: {exc}")

    def make(kind: str, where: str, table: str, factories: dict, name: str, settings: dict):
        """``table``: where ``settings`` are in the file, for the problems a factory names."""
        factory = factories.get(name)
        if factory is None:
            problem(where, f"no {kind} named {name!r} (available: {', '.join(sorted(factories)) or 'none'}; "
                           "is the plugin providing it listed in `plugins`?)")
            return None
        if dry_run and kind == "sink":
            # Building a sink may create files: check its settings only, if it can say
            # (``unchecked_sinks`` names those that cannot, for check-config to say so).
            validate = getattr(factory, "validate", None)
            if validate is not None:
                try:
                    validate(settings)
                except (ValueError, TypeError, KeyError) as exc:
                    refused(kind, where, table, name, exc)
                except Exception as exc:   # a plugin's bug: named, never a traceback
                    problem(where, f"{kind} {name!r}: validate(settings) failed with {type(exc).__name__}: {exc}")
            return None
        try:
            return factory(settings)
        except (ValueError, TypeError, KeyError) as exc:
            refused(kind, where, table, name, exc)
        except Exception as exc:
            problem(where, f"{kind} {name!r} could not be built: {type(exc).__name__}: {exc}")
        return None

    filter_factories = plugins.header_filters()
    chain: list[Callable] = []
    pending_rules: list[FilterConfig] = []
    for i, f in enumerate(config.filters):
        if f.plugin is None:
            pending_rules.append(f)
            continue
        if pending_rules:
            chain.append(_rule_group(pending_rules, config.daemon.filter_default))
            pending_rules = []
        built = make("header filter", f"filters[{i}].plugin", f"filters[{i}].settings", filter_factories, f.plugin,
                     f.settings)
        if built is not None:
            if not callable(built):
                problem(f"filters[{i}].plugin", f"filter {f.plugin!r} did not return a callable")
            else:
                chain.append(built)
    if pending_rules:
        chain.append(_rule_group(pending_rules, config.daemon.filter_default))
    header_filter = None if not chain else chain[0] if len(chain) == 1 else FilterChain(chain)

    deserializers = plugins.deserializers()
    key_d = make("deserializer", "deserializer.key", "deserializer.settings", deserializers, config.deserializer.key,
                 config.deserializer.settings)
    value_d = make("deserializer", "deserializer.value", "deserializer.settings", deserializers,
                   config.deserializer.value, config.deserializer.settings)

    interceptor_factories = plugins.interceptors()
    interceptors = []
    for i, ic in enumerate(config.interceptors):
        built = make("interceptor", f"interceptors[{i}].name", f"interceptors[{i}].settings", interceptor_factories,
                     ic.name, ic.settings)
        if built is not None:
            interceptors.append((ic.name, built))

    sink_factories = plugins.sinks(sink_context(config))
    sink = make("sink", "sink.type", "sink", sink_factories, config.sink.type, config.sink.settings)
    dlq = None
    if config.dlq is not None:
        dlq = make("sink", "dlq.type", "dlq", sink_factories, config.dlq.type, config.dlq.settings)
    if problems:
        for obj in (sink, dlq):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    pass
        raise ConfigError(problems)
    sink_factory = sink_factories.get(config.sink.type)
    dlq_factory = sink_factories.get(config.dlq.type) if config.dlq is not None else None
    observers = plugins.filtered_observers() if header_filter is not None and not dry_run else []
    return PipelineParts(
        header_filter, key_d, value_d, interceptors, sink, dlq,
        make_sink=(lambda: sink_factory(config.sink.settings)) if sink_factory else None,
        make_dlq=(lambda: dlq_factory(config.dlq.settings)) if dlq_factory else None,
        on_filtered=FilteredObservers(observers) if observers else None)
