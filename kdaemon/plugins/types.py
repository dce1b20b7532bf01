"""What plugins receive and return: records, offsets and the small protocols of plugin objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..client.types import OffsetAndMetadata, TopicPartition

Headers = list[tuple[str, "bytes | None"]]


@dataclass(slots=True)
class Record:
    """A consumed record after deserialization.

    ``key``/``value`` are what the configured deserializers produced; ``raw_key``/``raw_value``
    keep the bytes from the broker so a failed record can go to the dead-letter queue as it was.
    Interceptors may return new or modified ``Record`` objects.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Any
    value: Any
    headers: Headers
    raw_key: bytes | None = None
    raw_value: bytes | None = None

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@runtime_checkable
class Deserializer(Protocol):
    """``(topic, headers, data) -> object``.  ``data`` is None for a null key or value."""

    def __call__(self, topic: str, headers: Headers, data: bytes | None) -> Any: ...


@runtime_checkable
class Interceptor(Protocol):
    """Java ConsumerInterceptor semantics.

    ``on_consume`` runs once per poll batch, before the sink; it may drop, modify or add
    records and returns the list to pass on.  A dropped record counts as deliberately
    filtered: its offset is still committed.  ``on_commit`` runs after offsets were committed.
    """

    def on_consume(self, records: list[Record]) -> list[Record]: ...

    def on_commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None: ...


@runtime_checkable
class Sink(Protocol):
    """Where records go.  ``flush`` returns only once everything written is durable: offsets
    are committed right after it, so a sink that acknowledges early loses data on a crash.

    Optional: ``wants_flush()`` (the sink sizes its own batches), ``flush_async()``, which
    returns a handle with ``done()`` (non-blocking) and ``wait()``, both raising if the flush
    failed (the worker then consumes while the flush is under way and commits when it is done),
    and ``on_partitions_assigned(partitions)``, called when the worker gets partitions (again):
    a sink that remembers what it stored per partition (jsonl's ``dedupe``) reads it afresh
    (docs/PLUGINS.md, "Sinks").  A class attribute ``deduplicates_by_offset = True`` (a sink
    that stores each topic-partition-offset once, whoever sends it) lets a revocation release
    partitions without waiting for the flush in flight; such a sink may also offer
    ``ask_resume(positions)`` and ``resume_answers()`` (non-blocking: {partition: offset or
    None}), and a partition given to the worker then starts where the output already is
    (kdaemon/worker/resume.py).

    While the sink cannot take records (a write or flush failed), the worker pauses every
    partition and tries again with backoff; ``probe()``, if the sink has it, is a cheap check
    (no records) returning None when the sink looks able to take records again, else a short
    reason: the worker calls it every few seconds and tries again as soon as it passes, rather
    than at the end of a long backoff.  A flush handle whose ``done()``/``wait()`` raises
    ``SinkUnavailable`` still holds its batch: the worker then calls ``retry()`` on it once the
    probe passes, instead of reading those records again."""

    def write(self, records: Sequence[Record]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class SinkUnavailable(Exception):
    """A flush could not be confirmed because the sink is unreachable (the Spark uploader down,
    say), and the sink still holds the batch: ``retry()`` on the handle sends it again.  Any
    other exception from a flush means the batch is gone with the sink, which the worker then
    rebuilds before reading those records again."""


class SinkRefused(Exception):
    """The one way a sink (or the dead-letter queue) says a failure is **permanent**: retrying
    cannot help until an operator changes something.  Anything else a sink raises is transient
    (the worker retries with backoff, and ``SinkUnavailable`` says the sink still holds a flush).

    Permanent: a topic or table that does not exist, a refused authorization or login, a
    setting the target refuses, a schema that does not take the rows, a job that fails the same
    way every time.  Transient: an unreachable broker or service, a leader that moved, an I/O
    error, a timeout.  A sink translates its library's errors into this once (the Kafka DLQ
    from the client's table of Kafka error codes, the Spark sink from the uploader's classifier).

    ``target`` names what refused (the topic, the table) and ``fix`` what to change, for the
    one line the worker logs.  ``records``: None when the target refuses everything — the worker
    commits nothing past the records it could not deliver and stops the daemon
    (``EXIT_SINK_REFUSED``); else the records refused for what they are (too large for the
    topic, a row the table refuses), everything else written or flushed with them having been
    taken: ``on_sink_error`` applies to those records (dead letters, or stop at them) and the
    partition goes on.  Raised from ``write()`` or a synchronous ``flush()``; from a
    ``flush_async()`` handle it always stops the daemon."""

    def __init__(self, message: str, *, target: str, fix: str, records: Sequence["Record"] | None = None) -> None:
        super().__init__(message)
        self.target = target
        self.fix = fix
        self.records = list(records) if records is not None else None

    def line(self) -> str:
        """The one line an operator reads: what refused, why, and what to change."""
        return f"{self} (to fix: {self.fix})" if self.fix else str(self)


class SinkWriteError(Exception):
    """A sink may raise this to say which records failed (by index into the batch) so only
    those go to the dead-letter queue; any other exception fails the whole batch."""

    def __init__(self, message: str, failed_indexes: Sequence[int] | None = None) -> None:
        super().__init__(message)
        self.failed_indexes = list(failed_indexes) if failed_indexes is not None else None
