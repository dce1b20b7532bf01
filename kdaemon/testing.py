"""Test a kdaemon plugin without a broker.

``run_plugin`` loads your plugin the way the daemon does (a ``PluginManager`` with no installed
plugins enabled, your plugin registered in-process), builds what you name through its
factories, and pushes records through the worker's stages in the worker's order:

    header filters → deserializers → interceptors (on_consume) → sink (write, flush)
    → commit → interceptors (on_commit)

with the worker's semantics: a record is kept only if every filter keeps it; a deserializer
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
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .client.types import CREATE_TIME, OffsetAndMetadata, TopicPartition
from .plugins.manager import PluginManager
from .plugins.types import Record

__all__ = ["PluginRun", "make_record", "make_records", "run_plugin"]

log = logging.getLogger(__name__)

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

    ``deserializer``/``key_deserializer`` receive each record's ``raw_value``/``raw_key``
    (falling back to ``value``/``key`` when the raw bytes are unset); without them values and
    keys pass through unchanged.  A ``sink`` is built with ``type`` added to its settings,
    written, flushed and closed; its error (if any) is in ``sink_error`` and then nothing is
    committed, as in the worker.  Factories refusing their settings raise ``ValueError``
    here, like a configuration error would stop the daemon.
    """
    manager = PluginManager(enabled=[], include_builtin=include_builtin)
    if include_builtin:
        from .sinks import builtin as builtin_sinks
        manager.register(builtin_sinks, "builtin-sinks")
    plugins = list(plugin) if isinstance(plugin, (list, tuple)) else [plugin]
    for i, p in enumerate(plugins):
        manager.register(p, _plugin_name(p, i))

    records = list(records)
    run = PluginRun()

    predicates = [_build("header filter", manager.header_filters(), f) for f in filters]
    for r in records:
        if all(keep(r.headers) for keep in predicates):
            run.kept.append(r)
        else:
            run.dropped.append(r)

    key_d = _build("deserializer", manager.deserializers(), key_deserializer) if key_deserializer else None
    value_d = _build("deserializer", manager.deserializers(), deserializer) if deserializer else None
    for r in run.kept:
        try:
            k = key_d(r.topic, r.headers, _raw(r.raw_key, r.key)) if key_d else r.key
            v = value_d(r.topic, r.headers, _raw(r.raw_value, r.value)) if value_d else r.value
        except Exception as exc:
            run.deserialize_errors.append((r, exc))
            continue
        run.deserialized.append(Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                                       k, v, r.headers, r.raw_key, r.raw_value))

    chain = [(_name(n), _build("interceptor", manager.interceptors(), n)) for n in interceptors]
    out = run.deserialized
    for name, interceptor in chain:
        try:
            result = interceptor.on_consume(out)
            if result is None:
                raise TypeError("on_consume returned None instead of a list of records")
            result = list(result)
        except Exception as exc:
            log.warning("interceptor %r raised in on_consume; continuing with its input", name,
                        exc_info=True)
            run.interceptor_errors.append((name, "on_consume", exc))
            run.interceptor_outputs.append((name, None))
            continue
        run.interceptor_outputs.append((name, result))
        out = result
    run.output = out

    if sink is not None:
        sink_name = _name(sink)
        settings = {"type": sink_name, **_settings(sink)}
        run.sink = _build("sink", manager.sinks(), (sink_name, settings))
        try:
            if out:
                run.sink.write(out)
            run.sink.flush()
        except Exception as exc:
            run.sink_error = exc
        finally:
            try:
                run.sink.close()
            except Exception as exc:
                run.sink_error = run.sink_error or exc
        if run.sink_error is not None:
            return run

    # The worker commits the position after the batch: every input record counts, kept or not.
    for r in records:
        tp = r.topic_partition
        if tp not in run.committed or run.committed[tp].offset <= r.offset:
            run.committed[tp] = OffsetAndMetadata(r.offset + 1)
    if run.committed:
        for name, interceptor in chain:
            on_commit = getattr(interceptor, "on_commit", None)
            if on_commit is None:
                continue
            try:
                on_commit(dict(run.committed))
            except Exception as exc:
                log.warning("interceptor %r raised in on_commit", name, exc_info=True)
                run.interceptor_errors.append((name, "on_commit", exc))
    return run


def _raw(raw: Any, value: Any) -> Any:
    return raw if raw is not None else value


def _name(entry: Named) -> str:
    return entry if isinstance(entry, str) else entry[0]


def _settings(entry: Named) -> dict:
    return {} if isinstance(entry, str) else dict(entry[1])


def _build(kind: str, factories: Mapping[str, Any], entry: Named) -> Any:
    name = _name(entry)
    factory = factories.get(name)
    if factory is None:
        raise ValueError(f"no {kind} named {name!r} (available: {', '.join(sorted(factories)) or 'none'})")
    return factory(_settings(entry))


def _plugin_name(plugin: object, index: int) -> str:
    name = getattr(plugin, "__name__", None) or type(plugin).__name__
    return f"{name}#{index}" if index else name
