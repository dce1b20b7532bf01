"""One worker's pipeline: poll → (header filter inside decoding) → deserialize → on_consume
interceptors → sink → flush → commit → on_commit interceptors.

Delivery rule: a partition's offset is committed only up to positions whose records are all
durable — flushed by the sink, flushed to the dead-letter queue, or deliberately dropped (by the
header filter or an interceptor).  The worker remembers the consumer's positions right after
each batch was accepted by the sink (``_written``) and commits those after ``flush()``
returned.  Records still in a sink's memory are never committed.

Errors, by stage and policy (``[daemon]``):

* deserialization: ``dlq`` (raw record to the DLQ), ``skip`` (count, log without payload),
  ``stop`` (flush and commit what came before, then exit non-zero);
* interceptor: logged and counted per plugin; the chain continues (Java semantics);
* sink write/flush: ``retry`` (pause every partition, back off, try the same batch again:
  nothing is lost and memory stays bounded), ``dlq``, ``stop``.
"""

from __future__ import annotations

import logging
import time
from itertools import groupby, islice
from operator import attrgetter
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client.errors import WakeupError
from ..client.types import ConsumerRecord, OffsetAndMetadata, TopicPartition
from ..config import DaemonConfig
from ..plugins.types import Record, SinkWriteError
from ..sinks.encoding import dead_letter
from .build import PipelineParts

log = logging.getLogger(__name__)
_topic_partition = attrgetter("topic", "partition")

EXIT_OK = 0
EXIT_STOPPED_ON_ERROR = 3


@dataclass
class InFlightFlush:
    """A ``flush_async`` whose confirmation is outstanding, with the positions it will let the
    worker commit (noted when it started: records consumed afterwards are not in it)."""
    handle: Any
    positions: dict[TopicPartition, int]
    records: int
    started: float


class WorkerStop(Exception):
    """Raised inside the loop when a ``stop`` policy fires; the run ends with a non-zero code."""


@dataclass
class WorkerStats:
    fetched: Counter = field(default_factory=Counter)        # per TopicPartition, after filtering
    delivered: Counter = field(default_factory=Counter)      # accepted by the sink
    dropped_by_interceptors: int = 0
    dlq: Counter = field(default_factory=Counter)            # per (TopicPartition, stage)
    skipped: Counter = field(default_factory=Counter)        # per stage
    plugin_errors: Counter = field(default_factory=Counter)  # per plugin name
    sink_errors: int = 0
    flushes: int = 0
    commits: int = 0
    commit_failures: int = 0
    # Per event, for the histograms; the metrics publisher empties them, and they are bounded
    # (the oldest half goes past 1,000) where nothing publishes.
    flush_seconds: list = field(default_factory=list)
    commit_seconds: list = field(default_factory=list)
    batch_sizes: list = field(default_factory=list)

    @staticmethod
    def note(samples: list, value: float) -> None:
        samples.append(value)
        if len(samples) > 1000:
            del samples[:500]


class Pipeline:
    """The per-batch processing, independent of where records come from (tests drive it
    directly; the worker feeds it from a consumer)."""

    def __init__(self, config: DaemonConfig, parts: PipelineParts, stats: WorkerStats | None = None) -> None:
        self.config = config
        self.parts = parts
        self.stats = stats or WorkerStats()
        self._key = parts.key_deserializer
        self._value = parts.value_deserializer

    def deserialize(self, raw: Sequence[ConsumerRecord]) -> tuple[list[Record], list[Record]]:
        """Return (records, dead letters).

        The hot loop unpacks each record tuple once and calls the key deserializer only when it
        is not the identity (``bytes``); a failure leaves it for ``_deserialize_failed`` and
        the loop goes on with the next record."""
        ok: list[Record] = []
        dead: list[Record] = []
        append = ok.append
        key_d, value_d = self._key, self._value
        key_is_identity = getattr(key_d, "returns_data_unchanged", False)
        start, n = 0, len(raw)
        while start < n:
            done = len(ok)
            try:
                if key_is_identity:
                    for topic, partition, offset, ts, ts_type, key, value, headers, _ in islice(raw, start, None):
                        append(Record(topic, partition, offset, ts, ts_type, key,
                                      value_d(topic, headers, value), headers, key, value))
                else:
                    for topic, partition, offset, ts, ts_type, key, value, headers, _ in islice(raw, start, None):
                        append(Record(topic, partition, offset, ts, ts_type, key_d(topic, headers, key),
                                      value_d(topic, headers, value), headers, key, value))
                break
            except Exception as exc:
                failed = start + len(ok) - done
                self._deserialize_failed(raw[failed], exc, dead)
                start = failed + 1
        return ok, dead

    def _deserialize_failed(self, r: ConsumerRecord, exc: Exception, dead: list[Record]) -> None:
        where = f"{r.topic}-{r.partition}@{r.offset}"
        policy = self.config.daemon.on_deserialize_error
        if policy == "stop":
            raise WorkerStop(f"deserialization failed at {where}: {type(exc).__name__}: {exc}") from exc
        if policy == "skip":
            self.stats.skipped["deserialize"] += 1
            log.warning("skipping %s: deserialization failed: %s", where, type(exc).__name__)
            return
        dead.append(dead_letter(Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                                       r.key, r.value, r.headers, r.key, r.value), "deserialize", exc))

    def intercept(self, records: list[Record]) -> list[Record]:
        out = records
        for name, interceptor in self.parts.interceptors:
            try:
                result = interceptor.on_consume(out)
                if result is None:
                    raise TypeError("on_consume returned None instead of a list of records")
                result = list(result)
            except Exception:
                self.stats.plugin_errors[name] += 1
                log.exception("interceptor %r raised in on_consume; continuing with its input", name)
                continue
            out = result
        dropped = len(records) - len(out)
        if dropped > 0:
            self.stats.dropped_by_interceptors += dropped
        return out

    def on_commit(self, offsets) -> None:
        for name, interceptor in self.parts.interceptors:
            fn = getattr(interceptor, "on_commit", None)
            if fn is None:
                continue
            try:
                fn(offsets)
            except Exception:
                self.stats.plugin_errors[name] += 1
                log.exception("interceptor %r raised in on_commit", name)


class Worker:
    """Runs the pipeline against a consumer until stopped.

    ``subscribe_or_assign`` is called once with the consumer and the rebalance listener: group
    mode subscribes, static mode assigns a fixed partition subset.
    """

    def __init__(self, config: DaemonConfig, parts: PipelineParts, consumer,
                 subscribe_or_assign: Callable, *, clock: Callable[[], float] = time.monotonic,
                 on_tick: Callable[["Worker"], None] | None = None) -> None:
        self.config = config
        self.parts = parts
        self.consumer = consumer
        self.stats = WorkerStats()
        self.pipeline = Pipeline(config, parts, self.stats)
        self._subscribe_or_assign = subscribe_or_assign
        self._clock = clock
        self._on_tick = on_tick
        self._stopping = False
        self._written: dict[TopicPartition, int] = {}     # positions whose records are in the sink
        self._committed: dict[TopicPartition, int] = {}
        self._unflushed = 0
        self._last_flush = clock()
        self._pending_batch: tuple[list[Record], list[Record], dict] | None = None
        self._retry_at = 0.0
        self._backoff = config.daemon.sink_retry_backoff_ms / 1000
        self._paused_for_sink = False
        self._assigned_once = False
        self._rewind_at: float | None = None
        self._origin: dict[TopicPartition, int] = {}  # first position seen, for rewinds
        self._in_flight: InFlightFlush | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Has its assignment: a group generation, or a manual assignment."""
        group = self.consumer.group_state()
        if group is not None:
            return group.stable
        return bool(self.consumer.assignment()) or self._assigned_once

    def request_stop(self) -> None:
        self._stopping = True
        try:
            self.consumer.wakeup()
        except Exception:
            pass

    def run(self) -> int:
        self._subscribe_or_assign(self.consumer, self)
        self._assigned_once = True
        code = EXIT_OK
        try:
            while not self._stopping:
                try:
                    self.step()
                except WakeupError:
                    continue
        except WorkerStop as exc:
            log.error("worker stopping: %s", exc)
            code = EXIT_STOPPED_ON_ERROR
        finally:
            self.shutdown()
        return code

    def shutdown(self) -> None:
        """Flush and commit what is durable, close the consumer (which runs
        on_partitions_revoked and leaves the group), then close the sinks.

        The sinks close last: the revocation listener flushes them, and a closed sink refuses."""
        try:
            if self._pending_batch is None:
                self.flush_and_commit()
        except Exception:
            log.exception("final flush/commit failed; uncommitted records will be delivered again")
        try:
            self.consumer.close()
        except Exception:
            log.exception("closing the consumer failed")
        for obj in (self.parts.sink, self.parts.dlq):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    log.exception("closing %r failed", obj)

    # -- the loop -------------------------------------------------------------------------------

    def step(self) -> None:
        if self._rewind_at is not None:
            self._try_rewind()
            if self._rewind_at is not None:
                self.consumer.poll(min(100, self.config.daemon.poll_timeout_ms))  # keeps the group alive
                if self._on_tick:
                    self._on_tick(self)
                return
        if self._pending_batch is not None:
            self._retry_pending()
            self.consumer.poll(min(100, self.config.daemon.poll_timeout_ms))  # keeps the group alive
            if self._on_tick:
                self._on_tick(self)
            return
        if self._in_flight is not None:
            self._finish_in_flight(block=False)
            if self._rewind_at is not None:
                return   # it failed: the sink is closed until the rewind
        before = self.consumer.positions()
        polled = self.consumer.poll(self.config.daemon.poll_timeout_ms)
        positions = self.consumer.positions()
        raw: list[ConsumerRecord] = []
        origin = self._origin
        for tp, records in polled.items():
            raw.extend(records)
            self.stats.fetched[tp] += len(records)
            if tp not in origin:
                origin[tp] = before.get(tp, records[0].offset)
        for tp, pos in before.items():
            origin.setdefault(tp, pos)
        if raw:
            try:
                records, dead = self.pipeline.deserialize(raw)
            except WorkerStop:
                self.flush_and_commit()
                raise
            records = self.pipeline.intercept(records)
            self._deliver(records, dead, positions)
        else:
            self._written.update(positions)  # only filtered records (or none): already "delivered"
        if self._flush_due():
            self._flush()
        if self._on_tick:
            self._on_tick(self)

    def _deliver(self, records: list[Record], dead: list[Record], positions: dict) -> None:
        try:
            self._write(records, dead)
        except WorkerStop:
            raise
        except Exception as exc:
            self._on_sink_error(records, dead, positions, exc)
            return
        self._accepted(records, positions)

    def _write(self, records: list[Record], dead: list[Record]) -> None:
        if records:
            self.parts.sink.write(records)
        if dead:
            self._write_dlq(dead)

    def _write_dlq(self, dead: list[Record]) -> None:
        dlq = self.parts.dlq
        if dlq is None:
            raise WorkerStop(f"{len(dead)} record(s) failed and no [dlq] is configured")
        try:
            dlq.write(dead)
        except Exception as exc:
            # The DLQ is the last resort: if it fails we must not commit past these records.
            raise WorkerStop(f"writing {len(dead)} record(s) to the DLQ failed: {exc}") from exc
        for r in dead:
            stage = next((v.decode() for k, v in reversed(r.headers) if k == "kdaemon.stage" and v), "?")
            self.stats.dlq[(TopicPartition(r.topic, r.partition), stage)] += 1

    def _accepted(self, records: list[Record], positions: dict) -> None:
        delivered = self.stats.delivered
        for (topic, partition), run in groupby(records, key=_topic_partition):
            delivered[TopicPartition(topic, partition)] += sum(1 for _ in run)
        WorkerStats.note(self.stats.batch_sizes, len(records))
        self._written.update(positions)
        self._unflushed += len(records)
        if self._unflushed >= self.config.daemon.max_buffered_records:
            self._flush()

    def _flush(self) -> None:
        if getattr(self.parts.sink, "flush_async", None) is not None:
            self._start_flush()
        else:
            self.flush_and_commit()

    def _on_sink_error(self, records, dead, positions, exc: BaseException) -> None:
        self.stats.sink_errors += 1
        policy = self.config.daemon.on_sink_error
        if policy == "stop":
            raise WorkerStop(f"sink write failed: {type(exc).__name__}: {exc}") from exc
        if policy == "dlq":
            failed_idx = set(range(len(records)))
            if isinstance(exc, SinkWriteError) and exc.failed_indexes is not None:
                failed_idx = set(exc.failed_indexes)  # the sink accepted the rest
            failed = [r for i, r in enumerate(records) if i in failed_idx]
            log.warning("sink write failed (%s); %d record(s) to the DLQ", type(exc).__name__, len(failed))
            self._write_dlq([dead_letter(r, "sink", exc) for r in failed] + dead)
            self._accepted([r for i, r in enumerate(records) if i not in failed_idx], positions)
            return
        if isinstance(exc, SinkWriteError) and exc.failed_indexes is not None:
            # The sink took the others; retrying these records cannot help (they are bad, not
            # the sink): dead-letter them if there is a DLQ, else stop.
            failed_idx = set(exc.failed_indexes)
            failed = [r for i, r in enumerate(records) if i in failed_idx]
            if self.parts.dlq is None:
                raise WorkerStop(f"the sink rejected {len(failed)} record(s) and no [dlq] is configured: {exc}")
            self._write_dlq([dead_letter(r, "sink", exc) for r in failed] + dead)
            self._accepted([r for i, r in enumerate(records) if i not in failed_idx], positions)
            return
        # retry: first make durable (and commit) what earlier writes accepted.  A failed write
        # may have taken those records along (the jsonl sink then refuses any further use):
        # then this flush fails too, and only a rebuilt sink and a rewind to the last commit
        # help; the rewind consumes this batch again.  Retrying on such a sink would never end.
        self.flush_and_commit()
        if self._rewind_at is not None:
            return
        # Then hold the batch, stop fetching, and try again with backoff.
        log.warning("sink write failed (%s: %s); pausing consumption and retrying in %.1fs",
                    type(exc).__name__, exc, self._backoff)
        self._pending_batch = (records, dead, positions)
        self._retry_at = self._clock() + self._backoff
        self._pause_all()

    def _retry_pending(self) -> None:
        if self._clock() < self._retry_at:
            return
        records, dead, positions = self._pending_batch  # type: ignore[misc]
        try:
            self._write(records, dead)
        except WorkerStop:
            raise
        except Exception as exc:
            if isinstance(exc, SinkWriteError) and exc.failed_indexes is not None:
                # The sink is back and took the batch except records it refuses: retrying
                # cannot help those (and would write the others again); dead-letter them.
                log.info("sink recovered; resuming consumption")
                self._pending_batch = None
                self._backoff = self.config.daemon.sink_retry_backoff_ms / 1000
                self._resume_all()
                self._on_sink_error(records, dead, positions, exc)
                self.flush_and_commit()
                return
            self.stats.sink_errors += 1
            self._backoff = min(self._backoff * 2, self.config.daemon.sink_retry_backoff_max_ms / 1000)
            self._retry_at = self._clock() + self._backoff
            log.warning("sink still failing (%s: %s); next retry in %.1fs", type(exc).__name__, exc, self._backoff)
            return
        log.info("sink recovered; resuming consumption")
        self._pending_batch = None
        self._backoff = self.config.daemon.sink_retry_backoff_ms / 1000
        self._accepted(records, positions)
        self._resume_all()
        # A failed flush here rewinds to the last commit like any other (retrying the write
        # on a sink whose flush failed would duplicate the batch, or never succeed).
        self.flush_and_commit()

    def _on_flush_failure(self, exc: BaseException) -> None:
        """A flush failed: what was written since the last flush may not be durable.

        Nothing of it was committed.  Rebuild the sink and rewind every partition to its last
        committed position, so those records are consumed and written again once the sink is
        back (duplicates in the sink are possible, losses are not).
        """
        self.stats.sink_errors += 1
        if self.config.daemon.on_sink_error == "stop" or self.parts.make_sink is None:
            raise WorkerStop(f"sink flush failed: {type(exc).__name__}: {exc}") from exc
        log.warning("sink flush failed (%s: %s); rewinding to the last commit and retrying in %.1fs",
                    type(exc).__name__, exc, self._backoff)
        for obj in (self.parts.sink, self.parts.dlq):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    pass
        self._rewind_at = self._clock() + self._backoff
        self._backoff = min(self._backoff * 2, self.config.daemon.sink_retry_backoff_max_ms / 1000)
        self._pause_all()

    def _try_rewind(self) -> None:
        if self._clock() < self._rewind_at:
            return
        try:
            sink = self.parts.make_sink()  # type: ignore[misc]
            dlq = self.parts.make_dlq() if self.parts.make_dlq is not None else None
        except Exception as exc:
            self._rewind_at = self._clock() + self._backoff
            self._backoff = min(self._backoff * 2, self.config.daemon.sink_retry_backoff_max_ms / 1000)
            log.warning("sink still unavailable (%s: %s); next try in %.1fs", type(exc).__name__, exc, self._backoff)
            return
        self.parts.sink, self.parts.dlq = sink, dlq
        assigned = list(self.consumer.assignment())
        unknown = [tp for tp in assigned if tp not in self._committed]
        committed = dict(self._committed)
        if unknown:
            for tp, om in self.consumer.committed(unknown).items():
                if om is not None:
                    committed[tp] = om.offset
        for tp in assigned:
            # Never committed: back to where this worker started reading it.
            target = committed.get(tp, self._origin.get(tp))
            if target is not None:
                self.consumer.seek(tp, target)
        self._written = {tp: off for tp, off in committed.items() if tp in assigned}
        self._unflushed = 0
        self._rewind_at = None
        # The backoff is reset by the next flush that succeeds, not here: a sink that can be
        # rebuilt but still cannot flush (the Spark uploader down) must see growing pauses.
        log.info("sink rebuilt; consuming again from the last committed offsets")
        self._resume_all()

    def _pause_all(self) -> None:
        parts = list(self.consumer.assignment())
        if parts:
            self.consumer.pause(*parts)
        self._paused_for_sink = True

    def _resume_all(self) -> None:
        if self._paused_for_sink:
            parts = list(self.consumer.assignment())
            if parts:
                self.consumer.resume(*parts)
            self._paused_for_sink = False

    # -- flushing and committing ----------------------------------------------------------------

    def _flush_due(self) -> bool:
        d = self.config.daemon
        wants = getattr(self.parts.sink, "wants_flush", None)
        if wants is not None:
            # Batch-oriented sinks (Spark) size their own batches; the interval still bounds how
            # long filtered-only progress waits to be committed.
            return wants() or (not self._unflushed and
                               (self._clock() - self._last_flush) * 1000 >= d.flush_interval_ms)
        if self._unflushed >= d.flush_max_records:
            return True
        return (self._clock() - self._last_flush) * 1000 >= d.flush_interval_ms

    def _start_flush(self) -> None:
        """Flush without waiting (sinks with ``flush_async``, e.g. Spark): the worker consumes
        the next batch while this one is made durable, and commits the positions noted now when
        the confirmation arrives.  One flush in flight at most."""
        if self._in_flight is not None:
            self._finish_in_flight(block=False)
        if self._in_flight is not None:
            wants = getattr(self.parts.sink, "wants_flush", None)
            if wants is not None and not wants() and self._unflushed < self.config.daemon.max_buffered_records:
                # Only the interval is due (filtered-only progress): the flush in flight will
                # commit soon anyway; do not stop consuming to wait for it.
                return
            self._finish_in_flight(block=True)
        if self._rewind_at is not None:
            return
        started = time.monotonic()
        ok, handle = self._flush_sinks(asynchronously=True)
        if not ok:
            return
        self._in_flight = InFlightFlush(handle, dict(self._written), self._unflushed, started)
        self._unflushed = 0
        self._last_flush = self._clock()

    def _flush_sinks(self, asynchronously: bool) -> tuple[bool, Any]:
        """Flush the DLQ, then flush the sink (or start its ``flush_async``).  Returns (True,
        the sink's result), or (False, None) after a failure, with the rewind scheduled."""
        try:
            if self.parts.dlq is not None:
                self.parts.dlq.flush()
            sink = self.parts.sink
            return True, (sink.flush_async() if asynchronously else sink.flush())
        except Exception as exc:
            self._on_flush_failure(exc)
            return False, None

    def _finish_in_flight(self, block: bool) -> None:
        """Commit the flush in flight if it is confirmed (or, with ``block``, once it is)."""
        flight = self._in_flight
        if flight is None:
            return
        try:
            if block:
                flight.handle.wait()
            elif not flight.handle.done():
                return
        except Exception as exc:
            # Its records and everything written after it are dropped with the sink; the
            # rewind to the last commit reads them all again.
            self._in_flight = None
            self._on_flush_failure(exc)
            return
        self._in_flight = None
        self._flushed(flight.started, flight.records, flight.positions)

    def flush_and_commit(self, only: set[TopicPartition] | None = None) -> None:
        """Make everything written durable, then commit the positions recorded with it."""
        if self._rewind_at is not None:
            # A flush failed and the rewind has not happened yet: the sink was closed with
            # records in it and ``_written`` still counts them.  Nothing is durable beyond the
            # last commit; committing now (on a revocation or at shutdown) would lose them.
            return
        if self._in_flight is not None:
            self._finish_in_flight(block=True)
            if self._rewind_at is not None:
                return
        started = time.monotonic()
        if not self._flush_sinks(asynchronously=False)[0]:
            return
        unflushed, self._unflushed = self._unflushed, 0
        self._last_flush = self._clock()
        self._flushed(started, unflushed, self._written, only)

    def _flushed(self, started: float, records: int, positions: dict[TopicPartition, int],
                 only: set[TopicPartition] | None = None) -> None:
        """A flush (sync or async) succeeded: count it, end the failure backoff if it carried
        records, and commit the positions noted with it."""
        self.stats.flushes += 1
        WorkerStats.note(self.stats.flush_seconds, time.monotonic() - started)
        if records:
            self._backoff = self.config.daemon.sink_retry_backoff_ms / 1000
        self._commit(positions, only)

    def _commit(self, positions: dict[TopicPartition, int], only: set[TopicPartition] | None = None) -> None:
        assigned = self.consumer.assignment()
        metadata = getattr(self.parts.sink, "commit_metadata", None)
        offsets = {tp: OffsetAndMetadata(pos, metadata(tp.topic, tp.partition) if metadata else "")
                   for tp, pos in positions.items()
                   if tp in assigned and self._committed.get(tp) != pos and (only is None or tp in only)}
        if not offsets:
            return
        started = time.monotonic()
        try:
            try:
                self.consumer.commit(offsets)
            except WakeupError:
                # A stop request (request_stop → wakeup) arrived after the last poll and was
                # raised here instead; raising consumed it.  The commit was not sent: send it
                # now, or the final commit at shutdown would be lost.
                self.consumer.commit(offsets)
        except Exception as exc:
            # Not fatal: the records are durable; the worst case is delivering them again.
            self.stats.commit_failures += 1
            log.warning("commit failed (%s: %s); the next flush commits again", type(exc).__name__, exc)
            return
        self.stats.commits += 1
        WorkerStats.note(self.stats.commit_seconds, time.monotonic() - started)
        for tp, om in offsets.items():
            self._committed[tp] = om.offset
        self.pipeline.on_commit(offsets)

    # -- rebalance listener (the consumer calls these inside poll) -------------------------------

    def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        if self._pending_batch is not None:
            # The held batch may contain revoked partitions; they were never committed, so the
            # next owner delivers them.  Keep only the rest.
            records, dead, positions = self._pending_batch
            self._pending_batch = ([r for r in records if r.topic_partition not in partitions],
                                   [r for r in dead if r.topic_partition not in partitions],
                                   {tp: p for tp, p in positions.items() if tp not in partitions})
        else:
            try:
                self.flush_and_commit(only=set(partitions))
            except Exception:
                log.exception("flush/commit on revocation failed; the next owner may re-deliver")
        for tp in partitions:
            self._written.pop(tp, None)
            self._committed.pop(tp, None)
            self._origin.pop(tp, None)

    def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        if self._paused_for_sink and partitions:
            self.consumer.pause(*partitions)

    def on_partitions_lost(self, partitions: set[TopicPartition]) -> None:
        for tp in partitions:
            self._written.pop(tp, None)
            self._committed.pop(tp, None)
            self._origin.pop(tp, None)
