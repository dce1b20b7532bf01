"""The spans: ``process`` for what a sink (or the dead-letter queue) was given, ``settle`` for a
commit.  Shapes follow OpenTelemetry's messaging conventions for Kafka, semantic-conventions
1.44.0 (``version.SEMCONV_VERSION``; still "Development"):

* ``process <topic>``, kind CONSUMER, one per record handed to the sink, a child of the
  producer's span when the record's ``traceparent``/``tracestate`` headers carry one (W3C trace
  context, through the SDK's global propagator, so ``OTEL_PROPAGATORS`` applies), a new trace
  otherwise.  ``[otel] spans = "batch"``: one per partition and sink write instead, linked to
  each record's producer span (up to ``LINKS_PER_SPAN`` links; a longer run is cut into several
  spans), with ``messaging.batch.message_count``.  The span covers the sink's ``write`` call
  (a record's trip from the decoder to the sink is that call plus microseconds).
* A record that fails gets status ERROR and ``error.type``: every dead letter (a record the
  DLQ is given: its ``kdaemon.error`` header names the exception's type, its ``kdaemon.stage``
  header where it failed, as ``kdaemon.stage``), and every record of a sink write that raised
  (only the records named, for ``SinkWriteError(failed_indexes=...)``), with the exception's
  type.  Dead letters always get a span each, in batch mode too: they are few, and each
  deserves its own error.
* ``commit <topic>``, kind CLIENT, ``messaging.operation.type = "settle"``, one per
  topic-partition a commit covered, from the start of the sink flush the commit follows to the
  commit's success, linked to the last process span of that partition (the conventions make
  the commit a child of the one record it settles; a commit here settles many).
  ``messaging.kafka.offset`` is the committed offset, ``messaging.batch.message_count`` the
  records it settles (the offsets since the previous commit of this worker; before its first,
  since the first record it traced there) and ``kdaemon.records.untraced`` those of them no
  process span was made for: filtered by a
  header filter (they never become Python objects, so they are counted here and on
  ``/metrics`` as ``kdaemon_records_filtered_total``, not traced, unless ``[otel]
  trace_filtered``), dropped by an interceptor, skipped, or gaps in the offsets (compaction,
  transaction markers).
* ``filter <topic>`` (``[otel] trace_filtered = true``): a header-filtered record, handed over
  by the decoder (``kdaemon_filtered_observer``), gets a span shaped as a process span (per
  record or per batch), ``messaging.operation.name = "filter"``, made when it was dropped.

Attributes given at span creation, where a sampler can see them: ``messaging.system``,
``messaging.operation.name`` and ``.type``, ``messaging.destination.name``,
``messaging.destination.partition.id``, ``messaging.consumer.group.name``, ``messaging.client.id``
(when ``[kafka] client_id`` is set), ``messaging.kafka.offset`` (record mode and settle),
``messaging.kafka.message.tombstone`` (true only), ``messaging.batch.message_count`` (batch and
settle) and ``error.type``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from kdaemon.plugins.types import Record, SinkWriteError

from .provider import TracerSource

SYSTEM = "messaging.system"
OPERATION_NAME = "messaging.operation.name"
OPERATION_TYPE = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
PARTITION = "messaging.destination.partition.id"
GROUP = "messaging.consumer.group.name"
CLIENT_ID = "messaging.client.id"
OFFSET = "messaging.kafka.offset"
TOMBSTONE = "messaging.kafka.message.tombstone"
BATCH_COUNT = "messaging.batch.message_count"
ERROR_TYPE = "error.type"
STAGE = "kdaemon.stage"
UNTRACED = "kdaemon.records.untraced"

# The dead-letter headers the daemon adds (docs/PLUGINS.md, "Sinks"): "Type: message", and where.
ERROR_HEADER = "kdaemon.error"
STAGE_HEADER = "kdaemon.stage"
# error.type when nothing names the failure's type (the conventions' fallback value).
OTHER = "_OTHER"
# The SDK keeps at most OTEL_SPAN_LINK_COUNT_LIMIT (128) links per span: a batch span links no more.
LINKS_PER_SPAN = 128


class HeaderGetter:
    """The propagator's view of a record's headers, ``[(str, bytes | None)]``: the last value of
    a key counts, as Kafka's convention has it."""

    @staticmethod
    def get(carrier: Sequence[tuple[str, bytes | None]], key: str) -> list[str] | None:
        for name, value in reversed(carrier):
            if name == key:
                return None if value is None else [value.decode("latin-1")]
        return None

    @staticmethod
    def keys(carrier: Sequence[tuple[str, bytes | None]]) -> list[str]:
        return [name for name, _ in carrier]


GETTER = HeaderGetter()


def dead_letter_error(record: Record) -> tuple[str, str, str]:
    """(error.type, the message, the stage) from a dead letter's own headers."""
    text, stage = "", "?"
    for name, value in reversed(record.headers):
        if name == ERROR_HEADER and not text and value is not None:
            text = value.decode("utf-8", "replace")
        elif name == STAGE_HEADER and stage == "?" and value is not None:
            stage = value.decode("ascii", "replace")
    kind, sep, rest = text.partition(": ")
    if sep and kind and all(part.isidentifier() for part in kind.split(".")):
        return kind, rest, stage
    return OTHER, text, stage


class Tracing:
    """A worker's spans: ``processed`` for each sink write, ``settled`` for each commit.

    :param source: the process's tracer provider, built on first use.
    :param group: ``[kafka] group_id``; ``client_id``: ``[kafka] client_id`` (None: unset).
    :param per: "record" or "batch" (``[otel] spans``).
    :param parent_based: the sampler follows the parent's decision (``provider.parent_based``):
        a record whose producer's span was not sampled then gets no span, without asking the
        SDK (which would make a non-recording one: 12 µs a record, measured with SDK 1.45.1),
        and a batch span no link to it (it points at a span no backend has).
    """

    def __init__(self, source: TracerSource, *, group: str | None = None, client_id: str | None = None,
                 per: str = "batch", parent_based: bool = True) -> None:
        from opentelemetry import propagate, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode
        self.source = source
        self.per = per
        self.parent_based = parent_based
        self._common = {SYSTEM: "kafka"}
        if group:
            self._common[GROUP] = group
        if client_id:
            self._common[CLIENT_ID] = client_id
        self._extract = propagate.extract
        self._span_of = trace.get_current_span
        self._Link, self._Status, self._ERROR = Link, Status, StatusCode.ERROR
        self._CONSUMER, self._CLIENT = SpanKind.CONSUMER, SpanKind.CLIENT
        self._bases: dict[tuple[str, str, int], dict] = {}
        self._names: dict[tuple[str, str], str] = {}
        # Since the last commit, per (topic, partition): records given a process span, the last
        # sampled span's context (the commit's link); the last committed offset, else the first
        # offset traced (where the settled range starts).
        self._traced: Counter = Counter()
        self._last: dict[tuple[str, int], Any] = {}
        self._committed: dict[tuple[str, int], int] = {}
        self._flush_started: int | None = None

    # -- process ----------------------------------------------------------------------------------

    def _base(self, op: str, topic: str, partition: int) -> dict:
        """The attributes every ``op`` span ("process" or "filter") of the partition starts with."""
        base = self._bases.get((op, topic, partition))
        if base is None:
            base = self._bases[(op, topic, partition)] = {
                **self._common, OPERATION_NAME: op, OPERATION_TYPE: "process",
                DESTINATION: topic, PARTITION: str(partition)}
            self._names.setdefault((op, topic), f"{op} {topic}")
        return base

    def _context(self, record: Record):
        return self._extract(record.headers, getter=GETTER) if record.headers else None

    def processed(self, records: Sequence[Record], start_ns: int, end_ns: int, *, dead_letters: bool = False,
                  error: BaseException | None = None) -> None:
        """Spans for ``records``, handed to a sink between ``start_ns`` and ``end_ns``.
        ``dead_letters``: the DLQ's records (each an error); ``error``: what the write raised
        (a ``SinkWriteError`` with indexes fails those records only, anything else all)."""
        if not records:
            return
        failed: set[int] | None = None
        if error is not None:
            indexes = error.failed_indexes if isinstance(error, SinkWriteError) else None
            failed = set(indexes) if indexes is not None else set(range(len(records)))
        if dead_letters or self.per == "record":
            self._per_record(records, start_ns, end_ns, dead_letters, failed, error)
        else:
            self._per_batch(records, start_ns, end_ns, failed, error)

    def filtered(self, records: Sequence[Record]) -> None:
        """``filter <topic>`` spans for records a header filter dropped (``[otel]
        trace_filtered``), shaped as process spans (per record, or per partition with links),
        at the moment the decoder dropped them; they count as traced in the settle span."""
        if not records:
            return
        now = time.time_ns()
        if self.per == "record":
            self._per_record(records, now, now, False, None, None, op="filter")
        else:
            self._per_batch(records, now, now, None, None, op="filter")

    def _per_record(self, records, start_ns, end_ns, dead_letters, failed, error, op: str = "process") -> None:
        tracer = self.source.tracer()
        start_span, context, base_of, names = tracer.start_span, self._context, self._base, self._names
        traced, last = self._traced, self._last
        consumer, span_of, skip_unsampled = self._CONSUMER, self._span_of, self.parent_based
        for i, r in enumerate(records):
            key = (r.topic, r.partition)
            parent = context(r)
            if skip_unsampled and parent is not None:
                producer = span_of(parent).get_span_context()
                if producer.is_valid and not producer.trace_flags.sampled:
                    if key not in traced:
                        self._committed.setdefault(key, r.offset)
                    traced[key] += 1   # the sampler's decision, taken: not "untraced"
                    continue
            attributes = {**base_of(op, r.topic, r.partition), OFFSET: r.offset}
            if r.raw_value is None and r.value is None:
                attributes[TOMBSTONE] = True
            description = None
            if dead_letters:
                attributes[ERROR_TYPE], description, attributes[STAGE] = dead_letter_error(r)
            elif failed is not None and i in failed:
                attributes[ERROR_TYPE] = type(error).__qualname__
                description = str(error)
            span = start_span(names[(op, r.topic)], context=parent, kind=consumer, attributes=attributes,
                              start_time=start_ns)
            if description is not None:
                span.set_status(self._Status(self._ERROR, description))
            span.end(end_ns)
            if key not in traced:
                self._committed.setdefault(key, r.offset)
            traced[key] += 1
            ctx = span.get_span_context()
            if ctx.trace_flags.sampled:
                last[key] = ctx

    def _per_batch(self, records, start_ns, end_ns, failed, error, op: str = "process") -> None:
        tracer = self.source.tracer()
        runs: dict[tuple[str, int], list[int]] = {}
        for i, r in enumerate(records):
            runs.setdefault((r.topic, r.partition), []).append(i)
        for key, indexes in runs.items():
            for at in range(0, len(indexes), LINKS_PER_SPAN):
                chunk = indexes[at:at + LINKS_PER_SPAN]
                links = []
                for i in chunk:
                    r = records[i]
                    if r.headers:
                        linked = self._span_of(self._extract(r.headers, getter=GETTER)).get_span_context()
                        if linked.is_valid and (linked.trace_flags.sampled or not self.parent_based):
                            links.append(self._Link(linked))
                attributes = {**self._base(op, *key), BATCH_COUNT: len(chunk)}
                bad = failed is not None and any(i in failed for i in chunk)
                if bad:
                    attributes[ERROR_TYPE] = type(error).__qualname__
                span = tracer.start_span(self._names[(op, key[0])], kind=self._CONSUMER, attributes=attributes,
                                         links=links, start_time=start_ns)
                if bad:
                    span.set_status(self._Status(self._ERROR, str(error)))
                span.end(end_ns)
                if key not in self._traced:
                    self._committed.setdefault(key, records[chunk[0]].offset)
                self._traced[key] += len(chunk)
                ctx = span.get_span_context()
                if ctx.trace_flags.sampled:
                    self._last[key] = ctx

    # -- settle -----------------------------------------------------------------------------------

    def flush_started(self) -> None:
        """A sink flush began: the commit that follows it settles what it made durable."""
        if self._flush_started is None:
            self._flush_started = time.time_ns()

    def settled(self, offsets: Mapping[Any, Any]) -> None:
        """``commit <topic>`` spans for the committed ``{TopicPartition: OffsetAndMetadata}``."""
        if not offsets:
            return
        end = time.time_ns()
        start = self._flush_started if self._flush_started is not None else end
        self._flush_started = None
        tracer = self.source.tracer()
        for tp, om in offsets.items():
            key = (tp[0], tp[1])
            traced = self._traced.pop(key, 0)
            previous = self._committed.get(key)   # None: nothing traced nor committed here yet
            attributes = {**self._common, OPERATION_NAME: "commit", OPERATION_TYPE: "settle",
                          DESTINATION: key[0], PARTITION: str(key[1]), OFFSET: om.offset}
            if previous is not None and om.offset >= previous:
                attributes[BATCH_COUNT] = om.offset - previous
                attributes[UNTRACED] = max(0, om.offset - previous - traced)
            else:
                attributes[BATCH_COUNT] = traced
            last = self._last.pop(key, None)
            span = tracer.start_span(f"commit {key[0]}", kind=self._CLIENT, attributes=attributes,
                                     links=[self._Link(last)] if last is not None else None, start_time=start)
            span.end(end)
            self._committed[key] = om.offset
