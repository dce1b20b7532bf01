"""Test a kdaemon plugin without a broker.

``run_plugin`` loads your plugin the way the daemon does (a ``PluginManager`` with no installed
plugins enabled, your plugin registered in-process), turns what you name into a daemon
configuration that goes through ``kdaemon.config.parse`` and ``build_pipeline_parts``, and runs
the records through the daemon's own ``Worker`` (kdaemon/worker/pipeline.py), with only the
broker replaced by your list of records:

    header filters → deserializers → interceptors (on_consume) → sink (write, flush)
    → commit → interceptors (on_commit)

There is no second implementation of these stages to drift from the daemon's, so a plugin that
passes here behaves the same in the daemon: a record is kept only if every filter keeps it; a deserializer
error takes that record out of the batch (the daemon would dead-letter or skip it); an
interceptor that raises (or returns None) is logged and counted and the chain continues with
the output of the last interceptor that succeeded; offsets are committed for *every* input
record, including those filtered or dropped on purpose.  ::

    import my_plugin
    from kdaemon.testing import make_record, run_plugin

    def test_keeps_acme():
        run = run_plugin(my_plugin, [make_record(b"x", headers={"tenant": "acme"})],
                         filters=[("tenant", {"tenants": ["acme"]})])
        assert len(run.kept) == 1 and not run.dropped

Names are given as ``"name"`` or ``("name", {settings})``.  Built-in deserializers (``bytes``,
``str``) and sinks (``jsonl``, ``stdout``, ``null``) are available unless
``include_builtin=False``; pass several plugins as a list (e.g. ``[my_plugin, kdaemon_json]``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .client.types import CREATE_TIME, ConsumerRecord, OffsetAndMetadata, TopicPartition
from .plugins import hookimpl
from .plugins.manager import PluginManager
from .plugins.types import Record, SinkRefused
from .worker.stages import StageObserver

__all__ = ["PluginRun", "make_record", "make_records", "run_plugin"]

Named = str | tuple[str, Mapping[str, Any]]


def make_record(value: Any = None, key: Any = None, *, topic: str = "test", partition: int = 0,
                offset: int = 0, timestamp: int | None = None, timestamp_type: int = CREATE_TIME,
                headers: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None) -> Record:
    """A ``Record`` as the decoder hands it on with the ``bytes`` deserializer.

    ``value``/``key``: bytes, or str (UTF-8 encoded), or None — stored as bytes in both
    ``value`` and ``raw_value``.  Any other object (a dict, a list, a number) is taken as an
    already deserialized value; ``raw_value`` then holds its JSON encoding, so the ``json``
    deserializer would produce it again.  ``headers``: a dict or ``(key, value)`` pairs; str
    values are UTF-8 encoded, None stays a null header.  ``timestamp`` defaults to now (ms).
    """
    key, raw_key = _data(key)
    value, raw_value = _data(value)
    pairs = headers.items() if isinstance(headers, Mapping) else (headers or ())
    hdrs = [(str(k), v.encode("utf-8") if isinstance(v, str) else v) for k, v in pairs]
    if timestamp is None:
        timestamp = int(time.time() * 1000)
    return Record(topic, partition, offset, timestamp, timestamp_type, key, value, hdrs,
                  raw_key, raw_value)


def make_records(values: Iterable[Any], *, offset: int = 0, **kwargs: Any) -> list[Record]:
    """``make_record`` for each value, with consecutive offsets starting at ``offset``."""
    return [make_record(v, offset=offset + i, **kwargs) for i, v in enumerate(values)]


def _data(v: Any) -> tuple[Any, bytes | None]:
    if v is None:
        return None, None
    if isinstance(v, str):
        v = v.encode("utf-8")
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        return b, b
    return v, json.dumps(v).encode("utf-8")


@dataclass
class PluginRun:
    """What happened to the records at each stage."""

    kept: list[Record] = field(default_factory=list)       # passed every header filter
    dropped: list[Record] = field(default_factory=list)    # dropped by a header filter
    deserialized: list[Record] = field(default_factory=list)
    deserialize_errors: list[tuple[Record, Exception]] = field(default_factory=list)
    # One entry per interceptor, in order: its output, or None when it raised.
    interceptor_outputs: list[tuple[str, list[Record] | None]] = field(default_factory=list)
    # (interceptor name, "on_consume" | "on_commit", exception)
    interceptor_errors: list[tuple[str, str, Exception]] = field(default_factory=list)
    output: list[Record] = field(default_factory=list)     # what reached the sink
    committed: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    sink: Any = None
    sink_error: Exception | None = None

    @property
    def values(self) -> list[Any]:
        return [r.value for r in self.output]

    @property
    def errors(self) -> list[Exception]:
        """Every exception a stage caught, in stage order."""
        out: list[Exception] = [e for _, e in self.deserialize_errors]
        out += [e for _, _, e in self.interceptor_errors]
        if self.sink_error is not None:
            out.append(self.sink_error)
        return out


def run_plugin(plugin: object | Sequence[object], records: Iterable[Record], *,
               filters: Sequence[Named] = (), deserializer: Named | None = None,
               key_deserializer: Named | None = None, interceptors: Sequence[Named] = (),
               sink: Named | None = None, include_builtin: bool = True) -> PluginRun:
    """Run ``records`` through what ``plugin`` offers; see the module docstring.

    What you name becomes a daemon configuration (``[[filters]]``, ``[deserializer]``,
    ``[[interceptors]]``, ``[sink]``) that goes through ``kdaemon.config.parse`` and
    ``build_pipeline_parts`` and is run by the daemon's own ``Worker``, fed from ``records``
    instead of a broker: one poll returns every record that the header filters keep.

    ``deserializer``/``key_deserializer`` receive each record's ``raw_value``/``raw_key``
    (falling back to ``value``/``key`` when the raw bytes are unset); without them values and
    keys pass through unchanged.  As in the daemon, key and value share one settings table:
    give settings to one of them, or the same to both.  A ``sink`` is built with ``type`` added
    to its settings, written, flushed and closed; its error (if any) is in ``sink_error`` and
    then nothing is committed, as in the worker under ``on_sink_error = "stop"``.  Unknown
    names and factories refusing their settings raise ``ValueError`` here, with the problems
    the daemon would report for the same configuration.
    """
    from .config import ConfigError
    from .worker.build import build_pipeline_parts
    from .worker.pipeline import Worker, WorkerStop

    manager = PluginManager(enabled=[], include_builtin=include_builtin)
    if include_builtin:
        from .sinks import builtin as builtin_sinks
        manager.register(builtin_sinks, "builtin-sinks")
    plugins = list(plugin) if isinstance(plugin, (list, tuple)) else [plugin]
    for i, p in enumerate(plugins):
        manager.register(p, _plugin_name(p, i))
    manager.register(_Helpers(), "kdaemon.testing")

    records = list(records)
    config = _config(records, filters, deserializer, key_deserializer, interceptors, sink, include_builtin)
    try:
        parts = build_pipeline_parts(config, manager)
    except ConfigError as exc:
        raise ValueError("\n".join(exc.problems)) from None

    run = PluginRun()
    source = _RecordSource(records, parts.header_filter, run, raw_keys=key_deserializer is not None,
                           raw_values=deserializer is not None)
    worker = Worker(config, parts, source, lambda consumer, listener: None, observer=_Recorder(run, records))
    if sink is not None:
        run.sink = parts.sink
    try:
        worker.step()              # one poll: the whole batch, as one batch reaches the daemon
        worker.flush_and_commit()  # what the worker does at shutdown
    except (WorkerStop, SinkRefused) as exc:   # a stop policy, or the sink refusing for good
        run.sink_error = exc.__cause__ or exc
    finally:
        for obj in (parts.sink, parts.dlq):
            if obj is not None:
                try:
                    obj.close()
                except Exception as exc:
                    run.sink_error = run.sink_error or exc
    return run


# Names of the helpers run_plugin registers (a pass-through deserializer for when none is named
# and the built-ins are left out, and a sink for when none is named).
_UNCHANGED = "kdaemon.testing.unchanged"
_NO_SINK = "kdaemon.testing.no-sink"


def _config(records: list[Record], filters: Sequence[Named], deserializer: Named | None,
            key_deserializer: Named | None, interceptors: Sequence[Named], sink: Named | None,
            include_builtin: bool):
    """The daemon configuration for what run_plugin was asked to run."""
    from .config import ConfigError, parse

    passthrough = "bytes" if include_builtin else _UNCHANGED
    chosen = [e for e in (deserializer, key_deserializer) if e is not None]
    settings = [_settings(e) for e in chosen if _settings(e)]
    if any(s != settings[0] for s in settings):
        raise ValueError("deserializer and key_deserializer are given different settings, but the daemon "
                         "has one [deserializer.settings] table for both: give the same settings, or "
                         "settings to one of them only")
    topics = sorted({r.topic for r in records}) or ["test"]
    raw = {
        "plugins": [],
        "kafka": {"bootstrap_servers": "run-plugin.invalid:9092", "group_id": "kdaemon-testing"},
        "daemon": {"topics": topics, "on_deserialize_error": "skip", "on_sink_error": "stop"},
        "filters": [{"plugin": _name(f), "settings": _settings(f)} for f in filters],
        "deserializer": {"key": _name(key_deserializer) if key_deserializer else passthrough,
                         "value": _name(deserializer) if deserializer else passthrough,
                         "settings": settings[0] if settings else {}},
        "interceptors": [{"name": _name(i), "settings": _settings(i)} for i in interceptors],
        "sink": {"type": _name(sink), **_settings(sink)} if sink is not None else {"type": _NO_SINK},
    }
    try:
        return parse(raw, "<run_plugin>")
    except ConfigError as exc:
        raise ValueError("\n".join(exc.problems)) from None


class _Helpers:
    """What run_plugin itself provides to the plugin manager."""

    @hookimpl
    def kdaemon_deserializers(self):
        def unchanged(settings):
            def deserialize(topic, headers, data):
                return data
            deserialize.returns_data_unchanged = True
            return deserialize
        return {_UNCHANGED: unchanged}

    @hookimpl
    def kdaemon_sinks(self):
        return {_NO_SINK: _NoSink}


class _NoSink:
    """Takes every record and keeps none: the batch is in ``PluginRun.output`` already."""

    def __init__(self, settings: dict) -> None:
        pass

    def write(self, records) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class _RecordSource:
    """Stands in for the consumer: serves ``records`` in one poll, applying the header filter
    where the consumer's decoder does (a dropped record is never seen by the worker, but the
    position moves past it), and keeps what the worker commits.  A deserializer gets the raw
    bytes; without one the record's key or value goes through as given."""

    def __init__(self, records: list[Record], header_filter, run: PluginRun, *, raw_keys: bool,
                 raw_values: bool) -> None:
        self._polled = False
        self._by_tp: dict[TopicPartition, list] = {}
        self._end: dict[TopicPartition, int] = {}
        self._run = run
        for r in records:
            tp = r.topic_partition
            self._end[tp] = max(self._end.get(tp, 0), r.offset + 1)
            if header_filter is None or header_filter(r.headers):
                run.kept.append(r)
                self._by_tp.setdefault(tp, []).append(ConsumerRecord(
                    r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                    _raw(r.raw_key, r.key) if raw_keys else r.key,
                    _raw(r.raw_value, r.value) if raw_values else r.value, r.headers, None))
            else:
                run.dropped.append(r)

    def poll(self, timeout_ms: int) -> dict:
        if self._polled:
            return {}
        self._polled = True
        return self._by_tp

    def positions(self) -> dict[TopicPartition, int]:
        return dict(self._end) if self._polled else {}

    def assignment(self) -> set[TopicPartition]:
        return set(self._end)

    def group_state(self):
        return None

    def reachability(self) -> tuple[bool, str | None]:
        return True, None

    def missing_topics(self) -> set[str]:
        return set()

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        self._run.committed.update(offsets)

    def committed(self, partitions, timeout_ms=None) -> dict:
        return {tp: self._run.committed.get(tp) for tp in partitions}

    def pause(self, *partitions) -> None:
        pass

    def resume(self, *partitions) -> None:
        pass

    def seek(self, tp: TopicPartition, offset: int) -> None:
        raise AssertionError("run_plugin runs with on_sink_error = 'stop': the worker never rewinds")

    def wakeup(self) -> None:
        pass

    def close(self, timeout_ms: int | None = None, group_membership=None) -> None:
        pass


class _Recorder(StageObserver):
    """Records what each stage of the worker's pipeline did into a PluginRun."""

    def __init__(self, run: PluginRun, records: list[Record]) -> None:
        self.run = run
        self.inputs = {(r.topic, r.partition, r.offset): r for r in records}

    def deserialized(self, records: list[Record]) -> None:
        self.run.deserialized.extend(records)

    def deserialize_failed(self, record, exc: Exception) -> None:
        original = self.inputs.get((record.topic, record.partition, record.offset), record)
        self.run.deserialize_errors.append((original, exc))

    def interceptor_ran(self, name: str, output: list[Record] | None, exc: Exception | None) -> None:
        self.run.interceptor_outputs.append((name, output))
        if exc is not None:
            self.run.interceptor_errors.append((name, "on_consume", exc))

    def intercepted(self, records: list[Record]) -> None:
        self.run.output.extend(records)

    def on_commit_failed(self, name: str, exc: Exception) -> None:
        self.run.interceptor_errors.append((name, "on_commit", exc))


def _raw(raw: Any, value: Any) -> Any:
    return raw if raw is not None else value


def _name(entry: Named) -> str:
    return entry if isinstance(entry, str) else entry[0]


def _settings(entry: Named) -> dict:
    return {} if isinstance(entry, str) else dict(entry[1])


def _plugin_name(plugin: object, index: int) -> str:
    name = getattr(plugin, "__name__", None) or type(plugin).__name__
    return f"{name}#{index}" if index else name
