"""Bundled plugin ``otel``: OpenTelemetry traces through the daemon.

Trace context travels in record headers (W3C ``traceparent``/``tracestate``); a consumer that
drops it breaks every trace at Kafka.  With this plugin each record a worker hands to its sink
continues its producer's trace with a ``process`` span, a record that fails (a dead letter, a
sink refusing it) gets status ERROR with ``error.type``, and each commit a ``settle`` span,
following OpenTelemetry's messaging conventions for Kafka, semantic-conventions 1.44.0 (still
in development; kdaemon_otel/spans.py has the shapes).  Spans go out over OTLP through the
OpenTelemetry SDK::

    plugins = ["header_rules", "ttl", "json", "otel"]   # pip install 'kdaemon[otel]'

    [otel]                                   # every key optional; OTEL_* variables otherwise
    endpoint = "http://collector:4318"       # base URL; grpc: "http://collector:4317" (https: TLS)
    protocol = "http/protobuf"               # or "grpc"
    sampling = 0.1                           # parent-based ratio for new traces
    spans = "record"                         # or "batch": one span per partition and write, linked
    trace_filtered = true                    # header-filtered records get "filter" spans (costs CPU)

    [[interceptors]]                         # for the settle spans (commits)
    name = "otel"

How it hooks in, and why so:

* ``kdaemon_sinks`` as a ``wrapper=True`` implementation wraps every sink factory
  (kdaemon_otel/sink.py): whatever the sink and the DLQ are, what they are given is what gets a
  span, failures included; nothing to configure.
* The ``otel`` interceptor's ``on_commit`` is the one place a plugin hears of a commit: list it
  in ``[[interceptors]]`` to get ``settle`` spans (its ``on_consume`` passes the batch on).
* The SDK, its exporter and their threads are built on first use in each worker, after fork
  (kdaemon_otel/provider.py), never in the supervisor, which only imports this module (and this
  module imports nothing of OpenTelemetry).  ``kdaemon_worker_exit`` shuts the provider down
  (a forked worker leaves with ``os._exit``: no ``atexit``), and a sink's ``close`` at the
  worker's drain exports the spans still queued first.
* ``[otel]`` is a section of the daemon's file, parsed by the configuration with the one
  settings checker (``kdaemon.config.OtelSection``); this plugin reads it in
  ``kdaemon_configure``.  Off (not in ``plugins``), the plugin is never imported: it costs
  nothing.

Header-filtered records never become Python objects (the filter runs inside the decoder):
they are counted, not traced, in each settle span's ``kdaemon.records.untraced`` (with the
records interceptors dropped and offset gaps) and exactly on ``/metrics``
(``kdaemon_records_filtered_total``).  Unless asked: with ``[otel] trace_filtered = true`` the
plugin answers ``kdaemon_filtered_observer``, the worker's decoder builds the records its
filters drop and hands them over, and each gets a ``filter`` span shaped as a ``process`` one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kdaemon.plugins import hookimpl, parse_settings

from .provider import TracerSource
from .sink import traced_factory

log = logging.getLogger(__name__)


class _Plugin:
    """This process's state: the configuration's ``[otel]`` and the worker's ``Tracing``."""

    def __init__(self) -> None:
        self.source: TracerSource | None = None
        self.tracing = None
        self.dlq_settings: Any = None
        self.settles = False   # the otel interceptor is configured
        self.otel: Any = None  # the configuration's [otel]

    def configure(self, config: Any) -> None:
        import os

        from .provider import parent_based
        from .spans import Tracing
        kafka = getattr(config, "kafka", {}) or {}
        otel = self.otel = getattr(config, "otel", None)
        if self.source is not None:
            self.source.shutdown()   # a configuration loaded again in this process
        self.source = TracerSource(otel)
        self.tracing = Tracing(self.source, group=kafka.get("group_id"), client_id=kafka.get("client_id"),
                               per=getattr(otel, "spans", "batch"), parent_based=parent_based(otel, os.environ))
        dlq = getattr(config, "dlq", None)
        self.dlq_settings = dlq.settings if dlq is not None else None
        self.settles = any(getattr(ic, "name", None) == "otel" for ic in getattr(config, "interceptors", ()))

    def started(self, settings: dict) -> None:
        """Said once per sink a worker builds (the DLQ's too), as the SDK starts with it."""
        if self.is_dlq(settings):
            return
        log.info("otel: a process span per %s%s", "record" if self.tracing.per == "record" else
                 "partition and sink write", "" if self.settles else
                 '; no settle spans (commits): add [[interceptors]] name = "otel" for them')

    def is_dlq(self, settings: dict) -> bool:
        """The DLQ's factory is called with the configuration's own ``[dlq]`` table object."""
        return self.dlq_settings is not None and settings is self.dlq_settings

    def flush(self) -> None:
        if self.source is not None:
            self.source.flush()


_plugin = _Plugin()


@dataclass(frozen=True)
class SettleSettings:
    """The ``otel`` interceptor takes no settings (``[otel]`` has them all)."""


class SettleInterceptor:
    """``settle`` spans from ``on_commit``; ``on_consume`` passes the batch on unchanged."""

    def __init__(self, tracing) -> None:
        self._tracing = tracing

    @classmethod
    def from_settings(cls, settings: Mapping) -> SettleInterceptor:
        parse_settings(SettleSettings, settings, "", ignore=())
        return cls(_plugin.tracing)

    def on_consume(self, records: list) -> list:
        return records

    def on_commit(self, offsets: Mapping) -> None:
        if self._tracing is not None:
            self._tracing.settled(offsets)


@hookimpl
def kdaemon_configure(config):
    _plugin.configure(config)


@hookimpl(wrapper=True)
def kdaemon_sinks(context):
    offered = yield
    if not offered:   # nothing offered (or called outside pluggy, without a result to wrap)
        return offered
    return [{name: traced_factory(factory, lambda: _plugin.tracing, _plugin.is_dlq, _plugin.flush, _plugin.started)
             for name, factory in m.items()} if isinstance(m, Mapping) else m
            for m in offered]


@hookimpl
def kdaemon_filtered_observer():
    """``[otel] trace_filtered = true``: the header-filtered records get ``filter`` spans."""
    otel = _plugin.otel
    if _plugin.tracing is None or not getattr(otel, "trace_filtered", False):
        return None
    return _plugin.tracing.filtered


@hookimpl
def kdaemon_interceptors():
    return {"otel": SettleInterceptor.from_settings}


@hookimpl
def kdaemon_worker_exit(index, exit_code):
    if _plugin.source is not None:
        _plugin.source.shutdown()
