"""Every sink, traced: the plugin wraps each sink factory (``kdaemon_sinks``, ``wrapper=True``),
so the records a sink or the dead-letter queue is given get their ``process`` spans without a
line of configuration, whatever the sink.

``TracedSink`` times ``write`` and hands the records to ``Tracing``; everything else a sink may
offer (``flush_async``, ``wants_flush``, ``probe``, ``deduplicates_by_offset``, ...) is the
wrapped sink's own, reached through ``__getattr__``, so the worker's ``getattr(sink, name,
None)`` checks see exactly what the sink has.  ``flush``/``flush_async`` also mark where a
commit's ``settle`` span starts; ``close`` (a worker's drain, or a sink rebuilt after a failure)
exports the spans still queued.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

from kdaemon.plugins.types import Record


class TracedSink:
    __slots__ = ("_sink", "_tracing", "_dead_letters", "_flush")

    def __init__(self, sink: Any, tracing, *, dead_letters: bool, flush: Callable[[], None]) -> None:
        self._sink = sink
        self._tracing = tracing
        self._dead_letters = dead_letters
        self._flush = flush

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def __repr__(self) -> str:
        return f"TracedSink({self._sink!r})"

    def write(self, records: Sequence[Record]) -> None:
        start = time.time_ns()
        try:
            self._sink.write(records)
        except Exception as exc:
            self._tracing.processed(records, start, time.time_ns(), dead_letters=self._dead_letters, error=exc)
            raise
        self._tracing.processed(records, start, time.time_ns(), dead_letters=self._dead_letters)

    def flush(self) -> None:
        self._tracing.flush_started()
        self._sink.flush()

    def close(self) -> None:
        try:
            self._sink.close()
        finally:
            self._flush()


class TracedAsyncSink(TracedSink):
    """A ``TracedSink`` for a sink with ``flush_async``: a class of its own, since the worker
    tells an asynchronous sink by ``getattr(sink, "flush_async", None)``, which a method on
    every proxy would answer for sinks without one."""

    __slots__ = ()

    def flush_async(self):
        self._tracing.flush_started()
        return self._sink.flush_async()


def traced_factory(factory: Callable[[dict], Any], tracing_for: Callable[[], Any],
                   is_dlq: Callable[[dict], bool], flush: Callable[[], None],
                   started: Callable[[dict], None] = lambda settings: None) -> Callable[[dict], Any]:
    """``factory`` building ``TracedSink``s, with its attributes (``validate``, ``preflight``)
    kept; ``is_dlq(settings)`` tells the dead-letter queue's table from the sink's, ``started``
    is told of each sink built."""
    def build(settings: dict):
        sink = factory(settings)
        tracing = tracing_for()
        if tracing is None:
            return sink
        # The SDK starts here, with the sink: in a worker (or an in-process run), after fork, and
        # before the first poll rather than inside it (its imports and exporter take ~0.3 s).
        # check-config never builds a sink, the supervisor no sink at all.
        try:
            tracing.source.tracer()
        except Exception as exc:
            # Not the sink's settings: the SDK refused its own (an OTEL_* variable, say).  A
            # RuntimeError, which the worker reports as "could not be built", with the reason.
            sink.close()
            raise RuntimeError(f"the otel plugin could not start the OpenTelemetry SDK: {type(exc).__name__}: "
                               f"{exc}") from exc
        started(settings)
        cls = TracedAsyncSink if getattr(sink, "flush_async", None) is not None else TracedSink
        return cls(sink, tracing, dead_letters=is_dlq(settings), flush=flush)
    try:
        functools.update_wrapper(build, factory)
    except (AttributeError, TypeError):
        pass
    return build
