"""The OpenTelemetry SDK of one worker process: its tracer provider, sampler and OTLP exporter.

Built when a worker builds its sink (kdaemon_otel/sink.py), after fork: the SDK's
``BatchSpanProcessor`` starts a thread and the exporters open connections (gRPC starts threads
of its own), and none of that may exist in the supervisor every worker is forked from.  A
provider found in a process other than the one that built it (a fork after the start, which the
daemon never does) is dropped, never used: its thread did not survive the fork.

What ``[otel]`` sets wins over the standard variables, and what it leaves out leaves them in
charge, as the SDK's own constructor arguments do: ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``,
``..._PROTOCOL``, ``..._HEADERS``, ``..._TIMEOUT``, ``..._CERTIFICATE``, ``OTEL_TRACES_SAMPLER``
(and ``_ARG``), ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` and
``OTEL_SPAN_*_LIMIT`` are read by the SDK itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

PROTOCOLS = ("http/protobuf", "grpc")
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
DEFAULT_SERVICE_NAME = "kdaemon"
# How long closing a sink (a worker's drain) waits for the spans still queued to be exported:
# past it the worker goes on stopping, rather than be killed at shutdown_timeout_s with its
# last commit unsaid.
FLUSH_TIMEOUT_MS = 5_000


def protocol_of(otel: Any, environ: Mapping[str, str]) -> str:
    """``[otel] protocol``, else the first protocol variable set, else http/protobuf."""
    chosen = getattr(otel, "protocol", None)
    if chosen:
        return chosen
    for variable in PROTOCOL_VARIABLES:
        if environ.get(variable):
            return environ[variable]
    return "http/protobuf"


def parent_based(otel: Any, environ: Mapping[str, str]) -> bool:
    """Does the sampler follow the parent's decision?  ``[otel] sampling`` is always parent-based;
    without it the SDK reads ``OTEL_TRACES_SAMPLER``, whose default (parentbased_always_on) and
    every ``parentbased_*`` value are."""
    if getattr(otel, "sampling", None) is not None:
        return True
    return (environ.get("OTEL_TRACES_SAMPLER") or "parentbased_always_on").strip().lower().startswith("parentbased_")


def build_provider(otel: Any, environ: Mapping[str, str] | None = None):
    """A ``TracerProvider`` exporting through OTLP with a ``BatchSpanProcessor``, for ``otel``
    (the configuration's ``OtelSection``, or None: everything from the environment)."""
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    env = os.environ if environ is None else environ
    protocol = protocol_of(otel, env)
    if protocol not in PROTOCOLS:
        # The configuration's check refuses this before any worker starts; a worker reached
        # without it (a variable changed since) says the same.
        raise ValueError(f"OTLP protocol {protocol!r} is not one the otel plugin speaks ({', '.join(PROTOCOLS)})")
    endpoint = getattr(otel, "endpoint", None)
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
        exporter = GrpcExporter(endpoint=endpoint)
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
        exporter = HttpExporter(endpoint=endpoint.rstrip("/") + "/v1/traces" if endpoint else None)
    attributes: dict[str, str] = {}
    service = getattr(otel, "service_name", None)
    if service:
        attributes[SERVICE_NAME] = service
    elif not env.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = DEFAULT_SERVICE_NAME
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; ours win.
    resource = Resource.create(attributes)
    ratio = getattr(otel, "sampling", None)
    sampler = ParentBased(TraceIdRatioBased(ratio)) if ratio is not None else None   # None: OTEL_TRACES_SAMPLER
    # shutdown_on_exit: an in-process daemon (no fork) flushes at interpreter exit; a forked worker
    # leaves with os._exit, so kdaemon_worker_exit shuts the provider down instead.
    provider = TracerProvider(resource=resource, sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info("otel: exporting traces over OTLP %s to %s (pid %d)", protocol,
             endpoint or "the OTEL_EXPORTER_OTLP_* endpoint (or the SDK's default)", os.getpid())
    return provider


class TracerSource:
    """One provider per process, built on first use (``tracer``), flushed when a sink closes,
    shut down when the worker exits."""

    def __init__(self, otel: Any = None, environ: Mapping[str, str] | None = None) -> None:
        self.otel = otel
        self.environ = environ
        self._provider = None
        self._tracer = None
        self._pid: int | None = None

    @property
    def started(self) -> bool:
        return self._provider is not None and self._pid == os.getpid()

    def tracer(self):
        """The tracer, building the provider the first time in this process."""
        if self._tracer is None or self._pid != os.getpid():
            from . import __name__ as scope
            from .version import SCHEMA_URL, VERSION
            self._provider = build_provider(self.otel, self.environ)
            self._pid = os.getpid()
            self._tracer = self._provider.get_tracer(scope, VERSION, schema_url=SCHEMA_URL)
        return self._tracer

    def flush(self, timeout_ms: int = FLUSH_TIMEOUT_MS) -> None:
        """Export what is queued, waiting at most ``timeout_ms``; nothing when never started."""
        if self.started and not self._provider.force_flush(timeout_ms):
            log.warning("otel: spans still queued after %d ms were not exported (is the collector reachable?)",
                        timeout_ms)

    def shutdown(self) -> None:
        """Flush and stop the exporter's thread; the next use in this process starts afresh."""
        if self.started:
            self._provider.shutdown()
        self._provider = self._tracer = self._pid = None
