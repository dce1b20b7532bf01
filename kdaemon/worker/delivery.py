"""Delivery: from the sink's ``write`` to the commit, as a state machine.

Delivery rule: a partition's offset is committed only up to positions whose records are all
durable — flushed by the sink, flushed to the dead-letter queue, or deliberately dropped (by the
header filter or an interceptor).  ``Delivery`` remembers the consumer's positions right after
each batch was accepted by the sink (``_written``) and commits those after ``flush()``
returned.  Records still in a sink's memory are never committed.

What the worker may do next depends on one mode (RUNNING, FLUSHING, FULL, RETRYING, STALLED,
RESENDING, REWINDING), moved only by the table in kdaemon/worker/modes.py, which says what each mode means.

Partitions are paused exactly in FULL, RETRYING, STALLED, RESENDING and REWINDING.  The loop never
blocks on an upload in flight but at shutdown and in a synchronous flush (a revocation with a sink
that does not deduplicate by offset): while one is owed it polls, so a rebalance is served.  Every wait before trying
again is one ``kdaemon.backoff.Backoff`` (``sink_retry_backoff_ms`` ..
``sink_retry_backoff_max_ms``): each failure (write, retry, flush, rebuild) counts one more, and
a success resets it — a retried write that goes through, or a flush that made records durable.
A rebuilt sink does not reset it: a sink that can be rebuilt but still cannot flush must see
growing pauses.  A sink with ``probe()`` is also probed on a second, shorter backoff (up to
``sink_probe_max_ms``), and the worker tries again as soon as the probe passes: a sink back
after an hour is used within seconds, not at the end of a 30 s pause; so is the DLQ's
``probe()`` when it has one (the Kafka DLQ asks whether its cluster answers): both must pass.
Waiting is quiet (kdaemon/worker/stall.py says what is logged).

Every failure is transient but one: ``SinkRefused`` (kdaemon/plugins/types.py), the sinks' one
permanent error, from the sink or the DLQ, wherever it comes (a write, a flush, a flush handle,
a probe, a rebuild, the ``preflight`` before the first poll).  For the whole target (a topic
that does not exist, an ACL, a schema) delivery moves to STOPPED: nothing more is written,
flushed or committed, and the refusal reaches ``Worker.run``, which exits with
``EXIT_SINK_REFUSED``.  For records refused for what they are (``records``: too large for the
topic, a row the table refuses), everything else having been taken, ``on_sink_error`` applies
to them as to records a write refused by index: dead letters with a DLQ under "dlq" and
"retry", else a stop at them (``EXIT_STOPPED_ON_ERROR``) after committing everything before
them.  Dead letters the DLQ itself refuses can be kept nowhere: the same stop at them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from typing import Any

from ..backoff import Backoff
from ..client.errors import WakeupError
from ..client.types import ConsumerRecord, OffsetAndMetadata, TopicPartition
from ..config import DaemonConfig
from ..plugins.types import Record, SinkRefused, SinkUnavailable, SinkWriteError
from ..sinks.encoding import dead_letter
from .build import PipelineParts
from .modes import PAUSED_MODES, DeliveryModes, Event, Mode
from .stages import WorkerStats, WorkerStop
from .stall import StallWatch

log = logging.getLogger(__name__)
_topic_partition = attrgetter("topic", "partition")


@dataclass
class InFlightFlush:
    """A ``flush_async`` whose confirmation is outstanding, with the positions it will let the
    worker commit (noted when it started: records consumed afterwards are not in it)."""
    handle: Any
    positions: dict[TopicPartition, int]
    records: int
    started: float


@dataclass
class HeldBatch:
    """A batch the sink refused under the ``retry`` policy, with the positions it ends at."""
    records: list[Record]
    dead: list[Record]
    positions: dict[TopicPartition, int]


class Delivery:
    """Writes batches to the sink, flushes, commits, and recovers from sink failures.

    The worker's loop calls ``hold`` (then polls only to stay in the group if it says so),
    ``deliver`` for each batch, ``flush_if_due``, and the rebalance methods; the consumer is used
    for positions, pause/resume, seek and commit.
    """

    def __init__(self, config: DaemonConfig, parts: PipelineParts, consumer, stats: WorkerStats,
                 on_commit: Callable[[dict], None], *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.parts = parts
        self.consumer = consumer
        self.stats = stats
        self._on_commit = on_commit
        self._clock = clock
        d = config.daemon
        self.backoff = Backoff(d.sink_retry_backoff_ms / 1000, d.sink_retry_backoff_max_ms / 1000)
        self.probe_backoff = Backoff(d.sink_retry_backoff_ms / 1000, d.sink_probe_max_ms / 1000)
        self.stall = StallWatch(clock)
        self._modes = DeliveryModes()
        self._written: dict[TopicPartition, int] = {}     # positions whose records are in the sink
        self._committed: dict[TopicPartition, int] = {}
        self._origin: dict[TopicPartition, int] = {}      # first position seen, for rewinds
        self._unflushed = 0
        self._last_flush = clock()
        self._held: HeldBatch | None = None               # RETRYING only
        self._in_flight: InFlightFlush | None = None      # FLUSHING, STALLED and RESENDING
        self._next_try = 0.0                              # RETRYING, STALLED and REWINDING
        self._next_probe = 0.0                            # likewise, for a sink with probe()
        self.stop_error: BaseException | None = None      # STOPPED only: why (raised again by hold)

    # -- the table ------------------------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._modes.mode

    def _apply(self, event: Event) -> Mode:
        old = self._modes.mode
        new = self._modes.apply(event)
        # Pausing follows the mode, so it cannot disagree with it.
        if new in PAUSED_MODES and old not in PAUSED_MODES:
            self._set_paused(True)
            self._next_probe = self._clock() + self.probe_backoff.failure()
        elif old in PAUSED_MODES and new not in PAUSED_MODES:
            self._set_paused(False)
        return new

    def _may_try(self) -> bool:
        """In a paused mode: is it time to try again?  When the backoff has run out, or earlier
        once the sink's ``probe()`` (checked on its own shorter schedule) says it answers."""
        now = self._clock()
        if now >= self._next_try:
            return True
        if not self._has_probe() or now < self._next_probe:
            self.stall.summarize(now)
            return False
        reason = self._probe()
        if reason is None:
            return True
        self._next_probe = now + self.probe_backoff.failure()
        log.debug("sink probe: %s", reason)
        self.stall.summarize(now)
        return False

    def _ok_again(self) -> None:
        """Records were made durable: the stall (if any) is over."""
        self.backoff.reset()
        self.probe_backoff.reset()
        self.stall.ended()

    def wait_hint(self) -> float:
        """Seconds until the next thing due in a paused mode (a retry or a probe): the loop
        may sleep that long in its poll."""
        due = self._next_try
        if self._has_probe():
            due = min(due, self._next_probe)
        return max(0.0, due - self._clock())

    def _set_paused(self, paused: bool) -> None:
        parts = list(self.consumer.assignment())
        if parts:
            (self.consumer.pause if paused else self.consumer.resume)(*parts)

    def _stop(self, error: BaseException) -> BaseException:
        """Move to STOPPED (nothing more is written, flushed or committed) and return ``error``
        for the caller to raise.  A rebalance callback that swallows it does not lose it: the
        loop's next ``hold`` raises it again."""
        if self.mode is not Mode.STOPPED:
            self.stop_error = error
            self._apply(Event.REFUSED)
        return error

    # -- before the first poll ------------------------------------------------------------------

    def preflight(self, tick: Callable[[], None], stopping: Callable[[], bool]) -> None:
        """Before anything is consumed: the sink and the DLQ that have ``preflight()`` say their
        target is there (the Kafka DLQ: its topic exists).  ``SinkRefused`` propagates — the
        worker stops before its first poll, never having joined the group.  A target that
        cannot be asked now (no broker answers) is asked again with the sink retry's backoff,
        said once when it starts and once when it is over (``StallWatch``), ``tick`` called
        meanwhile (the worker's heartbeat), until ``stopping()``."""
        backoff = Backoff(self.backoff.initial, self.backoff.maximum)
        for what, obj in (("the sink", self.parts.sink), ("the DLQ", self.parts.dlq)):
            check = getattr(obj, "preflight", None) if obj is not None else None
            while check is not None and not stopping():
                try:
                    reason = check()
                except SinkRefused as exc:
                    raise self._stop(exc) from None
                if reason is None:
                    break
                delay = backoff.failure()
                self.stall.failed(f"{what} cannot be checked before consuming: {reason}",
                                  "nothing is consumed until it can", delay)
                until = time.monotonic() + delay
                while not stopping() and time.monotonic() < until:
                    tick()
                    time.sleep(min(0.1, max(0.0, until - time.monotonic())))
        if not stopping():
            self.stall.ended()

    # -- called by the loop ---------------------------------------------------------------------

    def hold(self) -> bool:
        """Do what is due in the current mode (a retry, a rebuild, a confirmation); return True
        while the worker must not consume (its partitions are paused then).  Raises the
        refusal that stopped delivery (STOPPED)."""
        if self.mode is Mode.STOPPED:
            raise self.stop_error
        if self.mode is Mode.REWINDING:
            self._try_rewind()
        elif self.mode is Mode.RETRYING:
            self._retry_held()
        elif self.mode is Mode.STALLED:
            self._resend_held_flush()
        elif self.mode in (Mode.FLUSHING, Mode.RESENDING):
            self._finish_in_flight(block=False)
        elif self.mode is Mode.FULL:
            self._finish_in_flight(block=False)
            if self.mode is Mode.RUNNING:
                self._start_flush()   # the one that was due
        return self.mode in PAUSED_MODES

    def track(self, before: dict[TopicPartition, int], polled: dict[TopicPartition, list[ConsumerRecord]]) -> None:
        """Note where this worker started reading each partition, for a rewind of a partition
        that was never committed."""
        origin = self._origin
        for tp, records in polled.items():
            if tp not in origin:
                origin[tp] = before.get(tp, records[0].offset)
        for tp, pos in before.items():
            origin.setdefault(tp, pos)

    def nothing_to_write(self, positions: dict[TopicPartition, int]) -> None:
        """A poll returned only filtered records (or none): those positions are "delivered"."""
        self._written.update(positions)

    def deliver(self, records: list[Record], dead: list[Record], positions: dict[TopicPartition, int]) -> None:
        """Write a batch (and its dead letters) ending at ``positions``; apply the sink error
        policy if the sink refuses it."""
        try:
            self._write(records, dead)
        except WorkerStop:
            raise
        except SinkRefused as exc:
            if exc.records is None:
                raise self._stop(exc) from None
            self._on_sink_error(records, dead, positions, _by_index(exc, records))
            return
        except Exception as exc:
            self._on_sink_error(records, dead, positions, exc)
            return
        self._accepted(records, positions)

    def flush_if_due(self) -> None:
        if self.mode not in PAUSED_MODES and self._flush_due():
            self._flush()

    def flush_and_commit(self, only: set[TopicPartition] | None = None) -> None:
        """Make everything written durable, then commit the positions recorded with it.

        Nothing to do while RETRYING: what was written before the held batch was flushed and
        committed on the way in, and nothing was written since (the held batch never was; at
        shutdown or on a revocation the next owner reads it again).  Nor once STOPPED."""
        if self.mode in (Mode.RETRYING, Mode.STOPPED):
            return
        if self.mode in (Mode.REWINDING, Mode.STALLED):
            # A flush failed (or is held by an unreachable sink) and the records written since
            # the last commit are not durable; ``_written`` still counts them.  Committing now
            # (on a revocation or at shutdown) would lose them.
            return
        if self.mode in (Mode.FLUSHING, Mode.RESENDING, Mode.FULL):
            self._finish_in_flight(block=True)
            if self.mode in (Mode.REWINDING, Mode.STALLED):
                return
        started = time.monotonic()
        if not self._flush_sinks(asynchronously=False)[0]:
            return
        unflushed, self._unflushed = self._unflushed, 0
        self._last_flush = self._clock()
        self._flushed(started, unflushed, self._written, only)

    # -- rebalance (the worker's listener forwards these) ---------------------------------------

    def on_revoked(self, partitions: set[TopicPartition]) -> None:
        if self.mode is Mode.RETRYING:
            # The held batch may contain revoked partitions; they were never committed, so the
            # next owner delivers them.  Keep only the rest.
            held = self._held
            self._held = HeldBatch([r for r in held.records if r.topic_partition not in partitions],
                                   [r for r in held.dead if r.topic_partition not in partitions],
                                   {tp: p for tp, p in held.positions.items() if tp not in partitions})
        elif getattr(self.parts.sink, "deduplicates_by_offset", False):
            # The sink keeps each record once by its offset whoever sends it (the Spark sink:
            # manifests and the table's recorded offsets), so the revoked partitions are let go
            # at once, uncommitted: the next owner reads them again from the last commit and the
            # sink drops what it already has.  A confirmation that arrives later commits only
            # partitions still assigned (``_commit``).  Waiting here for the upload in flight
            # held the whole group's rebalance (at start-up, for the uploader's cold first job).
            # What is gathered and not yet sent is sent now, without waiting for it: the next
            # owner's question to the sink (where does the output end?) is answered after it, so
            # the next owner starts past what this worker read instead of reading it again (a
            # worker rejoining a moment after another, as in a rolling restart, used to read
            # every record the first had gathered of its partitions a second time).
            if self._in_flight is None and self._unflushed and self.mode not in PAUSED_MODES:
                try:
                    self._start_flush()
                except Exception as exc:
                    if self.mode is Mode.STOPPED:   # the loop's next step raises it
                        log.debug("delivery stopped during a revocation: %s", exc)
                    else:
                        log.exception("the flush started on revocation failed; the next owner reads again "
                                      "from the last commit")
                else:
                    log.info("%d partition(s) revoked: what was read of them is sent to the sink without waiting "
                             "for it; the next owner starts where the sink's output ends", len(partitions))
            elif self._in_flight is not None or self._unflushed:
                log.info("%d partition(s) revoked without waiting for the sink: the next owner reads from the last "
                         "commit, and the sink drops by offset what it already has", len(partitions))
        else:
            try:
                self.flush_and_commit(only=set(partitions))
            except Exception as exc:
                if self.mode is Mode.STOPPED:   # the loop's next step raises it
                    log.debug("delivery stopped during a revocation: %s", exc)
                else:
                    log.exception("flush/commit on revocation failed; the next owner may re-deliver")
        self._forget(partitions)

    def on_assigned(self, partitions: set[TopicPartition]) -> None:
        if self.mode in PAUSED_MODES and partitions:
            self.consumer.pause(*partitions)

    def start_at(self, tp: TopicPartition, offset: int) -> None:
        """A partition just given to this worker starts at ``offset`` instead, where the sink
        says its output already is (``resume.ResumeAtOutput``): seek, and commit it, since
        every record before it is in the output or was filtered."""
        self.consumer.seek(tp, offset)
        self._written[tp] = self._origin[tp] = offset
        self._commit({tp: offset}, only={tp})

    def on_lost(self, partitions: set[TopicPartition]) -> None:
        self._forget(partitions)

    def _forget(self, partitions) -> None:
        for tp in partitions:
            self._written.pop(tp, None)
            self._committed.pop(tp, None)
            self._origin.pop(tp, None)

    # -- writing --------------------------------------------------------------------------------

    def _write(self, records: list[Record], dead: list[Record]) -> None:
        if records:
            self.parts.sink.write(records)
        if dead:
            self._write_dlq(dead)

    def _write_dlq(self, dead: list[Record]) -> None:
        dlq = self.parts.dlq
        if dlq is None:
            raise WorkerStop(f"{len(dead)} record(s) failed and no [dlq] is configured: add a [dlq] section, "
                             "or change daemon.on_deserialize_error to \"skip\"")
        try:
            dlq.write(dead)
        except SinkRefused as exc:
            if exc.records is None:
                raise self._stop(exc) from None
            raise WorkerStop(f"the DLQ refused {len(exc.records)} dead letter(s) for good ({_where(exc.records)}): "
                             f"{exc.line()}") from None
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

    def _dead_letter_refused(self, records, dead, positions, exc: BaseException, failed_idx: set[int]) -> None:
        """The sink took the batch except ``failed_idx``: those go to the DLQ, the rest count
        as accepted."""
        failed = [r for i, r in enumerate(records) if i in failed_idx]
        plugin = f"sink.type={self.config.sink.type}"
        self._write_dlq([dead_letter(r, "sink", exc, plugin=plugin) for r in failed] + dead)
        self._accepted([r for i, r in enumerate(records) if i not in failed_idx], positions)

    def _on_sink_error(self, records, dead, positions, exc: BaseException) -> None:
        self.stats.sink_errors += 1
        policy = self.config.daemon.on_sink_error
        if policy == "stop":
            raise WorkerStop(f"sink write failed: {type(exc).__name__}: {exc}") from exc
        refused = exc.failed_indexes if isinstance(exc, SinkWriteError) else None
        if policy == "dlq":
            failed_idx = set(range(len(records))) if refused is None else set(refused)
            log.warning("sink write failed (%s); %d record(s) to the DLQ", type(exc).__name__, len(failed_idx))
            self._dead_letter_refused(records, dead, positions, exc, failed_idx)
            return
        if refused is not None:
            # The sink took the others; retrying these records cannot help (they are bad, not
            # the sink): dead-letter them if there is a DLQ, else stop.
            if self.parts.dlq is None:
                raise WorkerStop(f"the sink rejected {len(set(refused))} record(s) and no [dlq] is configured ({exc}): "
                                 "add a [dlq] section, or set daemon.on_sink_error to \"dlq\" (its default DLQ)")
            self._dead_letter_refused(records, dead, positions, exc, set(refused))
            return
        # retry: first make durable (and commit) what earlier writes accepted.  A failed write
        # may have taken those records along (the jsonl sink then refuses any further use):
        # then this flush fails too, and only a rebuilt sink and a rewind to the last commit
        # help; the rewind consumes this batch again.  Retrying on such a sink would never end.
        self.flush_and_commit()
        if self.mode is Mode.REWINDING:
            return
        # Then hold the batch, stop fetching, and try again with backoff.
        delay = self.backoff.failure()
        self.stall.failed(f"write failed: {type(exc).__name__}: {exc}",
                          f"the batch of {len(records)} record(s) is held and every partition paused", delay)
        self._held = HeldBatch(records, dead, positions)
        self._next_try = self._clock() + delay
        self._apply(Event.WRITE_FAILED)

    def _retry_held(self) -> None:
        if not self._may_try():
            return
        held = self._held
        try:
            self._write(held.records, held.dead)
        except WorkerStop:
            raise
        except Exception as exc:
            if isinstance(exc, SinkRefused):
                if exc.records is None:
                    raise self._stop(exc) from None
                exc = _by_index(exc, held.records)
            if isinstance(exc, SinkWriteError) and exc.failed_indexes is not None:
                # The sink is back and took the batch except records it refuses: retrying
                # cannot help those (and would write the others again); dead-letter them.
                self._recovered()
                self._on_sink_error(held.records, held.dead, held.positions, exc)
                self.flush_and_commit()
                return
            self.stats.sink_errors += 1
            delay = self.backoff.failure()
            self._next_try = self._clock() + delay
            self._next_probe = self._clock() + self.probe_backoff.failure()
            self.stall.failed(f"write failed: {type(exc).__name__}: {exc}", "the batch stays held", delay)
            self._apply(Event.WRITE_FAILED)
            return
        self._recovered()
        self._accepted(held.records, held.positions)
        # A failed flush here rewinds to the last commit like any other (retrying the write
        # on a sink whose flush failed would duplicate the batch, or never succeed).
        self.flush_and_commit()

    def _recovered(self) -> None:
        self._held = None
        self._ok_again()
        self._apply(Event.WRITE_RETRIED)

    # -- flushing -------------------------------------------------------------------------------

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

    def _flush(self) -> None:
        if getattr(self.parts.sink, "flush_async", None) is not None:
            self._start_flush()
        else:
            self.flush_and_commit()

    def _start_flush(self) -> None:
        """Flush without waiting (sinks with ``flush_async``, e.g. Spark): the worker consumes
        the next batch while this one is made durable, and commits the positions noted now when
        the confirmation arrives.  One flush in flight at most."""
        if self.mode is Mode.FLUSHING:
            self._finish_in_flight(block=False)
        if self.mode is Mode.FLUSHING:
            if getattr(self.parts.sink, "wants_flush", None) is not None \
                    and self._unflushed < self.config.daemon.max_buffered_records:
                # A sink that sizes its own batches (and bounds its own memory: the Spark sink
                # stages what passes its share to disk) keeps gathering while the flush in
                # flight is made durable, and the next flush, once that one is confirmed, takes
                # everything gathered: the longer an upload takes, the bigger the next one, so a
                # job's fixed cost is paid for more rows exactly when the uploader is the
                # bottleneck.  Only max_buffered_records records written since the flush in
                # flight began make the worker wait.
                return
            # Wait for it without blocking: partitions paused until its confirmation (hold()
            # then starts this flush), polling meanwhile, so a rebalance goes on during the
            # upload (modes.FULL).
            self._apply(Event.BUFFER_FULL)
            return
        if self.mode in PAUSED_MODES:   # FULL, or a failure on the way here
            return
        started = time.monotonic()
        ok, handle = self._flush_sinks(asynchronously=True)
        if not ok:
            return
        self._in_flight = InFlightFlush(handle, dict(self._written), self._unflushed, started)
        self._apply(Event.FLUSH_STARTED)
        self._unflushed = 0
        self._last_flush = self._clock()

    def _flush_sinks(self, asynchronously: bool) -> tuple[bool, Any]:
        """Flush the DLQ, then flush the sink (or start its ``flush_async``).  Returns (True,
        the sink's result), or (False, None) after a failure, with the rewind scheduled.
        Records refused for good are handled here (see the module docstring); a refusal of the
        whole target stops delivery."""
        try:
            if self.parts.dlq is not None:
                try:
                    self.parts.dlq.flush()
                except SinkRefused as exc:
                    if exc.records is None:
                        raise
                    self._dead_letters_refused(exc)
            sink = self.parts.sink
            if asynchronously:
                return True, sink.flush_async()
            try:
                return True, sink.flush()
            except SinkRefused as exc:
                if exc.records is None:
                    raise
                self._sink_records_refused(exc)
                return True, None
        except WorkerStop as exc:
            raise self._stop(exc)
        except SinkRefused as exc:
            raise self._stop(exc) from None
        except Exception as exc:
            self._on_flush_failure(exc)
            return False, None

    def _dead_letters_refused(self, exc: SinkRefused) -> None:
        """The DLQ refused these dead letters for what they are, every other one acknowledged.
        They can be kept nowhere: flush the sink, commit everything before them, and stop at
        them (``WorkerStop``: ``EXIT_STOPPED_ON_ERROR``), naming the records and the fix."""
        records = exc.records or []
        committed = ""
        try:
            self.parts.sink.flush()
        except Exception as flush_exc:
            log.warning("flushing the sink before stopping failed (%s: %s); nothing more is committed",
                        type(flush_exc).__name__, flush_exc)
        else:
            self._commit(_capped(self._written, records))
            committed = "; everything before them is committed"
        raise self._stop(WorkerStop(
            f"the DLQ refused {len(records)} dead letter(s) for good ({_where(records)}), so they cannot be kept: "
            f"{exc.line()}{committed}"))

    def _sink_records_refused(self, exc: SinkRefused) -> None:
        """The sink's flush refused these records for what they are, everything else taken.
        ``on_sink_error`` decides, as for records a write refused by index: with a DLQ ("dlq",
        "retry") they become dead letters, made durable before the commit; otherwise ("stop",
        or no DLQ) the worker commits everything before them and stops at them."""
        records = exc.records or []
        self.stats.sink_errors += 1
        policy = self.config.daemon.on_sink_error
        if policy == "stop" or self.parts.dlq is None:
            self._commit(_capped(self._written, records))
            why = 'on_sink_error = "stop"' if policy == "stop" else \
                'and no [dlq] is configured: add a [dlq] section, or set daemon.on_sink_error to "dlq"'
            raise self._stop(WorkerStop(
                f"the sink refused {len(records)} record(s) for good ({_where(records)}): {exc.line()}; {why}; "
                "everything before them is committed"))
        log.warning("the sink refused %d record(s) for good (%s): %s; they go to the DLQ", len(records),
                    _where(records), exc.line())
        plugin = f"sink.type={self.config.sink.type}"
        self._write_dlq([dead_letter(r, "sink", exc, plugin=plugin) for r in records])
        try:
            self.parts.dlq.flush()
        except SinkRefused as again:
            if again.records is None:
                raise
            self._dead_letters_refused(again)

    def _finish_in_flight(self, block: bool) -> None:
        """Commit the flush in flight if it is confirmed (or, with ``block``, once it is)."""
        flight = self._in_flight
        try:
            if block:
                flight.handle.wait()
            elif not flight.handle.done():
                return
        except SinkRefused as exc:
            self._in_flight = None
            raise self._stop(exc) from None
        except SinkUnavailable as exc:
            # The sink keeps the batch: pause, probe, and send the same batch again.
            self.stats.sink_errors += 1
            delay = self.backoff.failure()
            self._next_try = self._clock() + delay
            self.stall.failed(str(exc), f"its batch of {flight.records} record(s) is kept for another "
                              "try and every partition paused", delay)
            self._apply(Event.FLUSH_HELD)
            return
        except Exception as exc:
            # Its records and everything written after it are dropped with the sink; the
            # rewind to the last commit reads them all again.
            self._in_flight = None
            self._on_flush_failure(exc)
            return
        self._in_flight = None
        self._apply(Event.FLUSH_CONFIRMED)
        self._flushed(flight.started, flight.records, flight.positions)

    def _flushed(self, started: float, records: int, positions: dict[TopicPartition, int],
                 only: set[TopicPartition] | None = None) -> None:
        """A flush (sync or async) succeeded: count it, end the failure backoff if it carried
        records, and commit the positions noted with it."""
        self.stats.flushes += 1
        WorkerStats.note(self.stats.flush_seconds, time.monotonic() - started)
        if records:
            self._ok_again()
        elif self.stall.active and self._has_probe() and self._probe() is None:
            # Nothing new to write after a rewind (every record was stored before the failure,
            # or none has come since): the sink is back when its probe says so.  Without a
            # probe only a flush that carried records says so; an empty flush succeeds even on
            # a sink that cannot take records (a Spark sink whose uploader is down).
            self._ok_again()
        self._commit(positions, only)

    def _has_probe(self) -> bool:
        return getattr(self.parts.sink, "probe", None) is not None

    def _probe(self) -> str | None:
        """The sink's ``probe()`` (call only if ``_has_probe``), then the DLQ's if it has one:
        None if both answer, else why not; a probe that raises is a failed probe, unless it
        raises ``SinkRefused`` (the topic went away meanwhile, say), which stops delivery."""
        for what, obj in (("", self.parts.sink), ("the DLQ: ", self.parts.dlq)):
            probe = getattr(obj, "probe", None) if obj is not None else None
            if probe is None:
                continue
            try:
                reason = probe()
            except SinkRefused as exc:
                raise self._stop(exc) from None
            except Exception as exc:
                return f"{what}the probe raised {type(exc).__name__}: {exc}"
            if reason is not None:
                return what + reason
        return None

    def _resend_held_flush(self) -> None:
        """STALLED: once the sink answers (or the backoff ran out), send the held batch again."""
        if not self._may_try():
            return
        flight = self._in_flight
        try:
            flight.handle.retry()
        except SinkRefused as exc:
            self._in_flight = None
            raise self._stop(exc) from None
        except SinkUnavailable as exc:
            self.stats.sink_errors += 1
            delay = self.backoff.failure()
            self._next_try = self._clock() + delay
            self._next_probe = self._clock() + self.probe_backoff.failure()
            self.stall.failed(str(exc), "the batch stays kept", delay)
            return
        except Exception as exc:
            self._in_flight = None
            self._on_flush_failure(exc)
            return
        self._apply(Event.FLUSH_RESENT)

    # -- rewinding ------------------------------------------------------------------------------

    def _on_flush_failure(self, exc: BaseException) -> None:
        """A flush failed: what was written since the last flush may not be durable.

        Nothing of it was committed.  Close the sink and the DLQ and wait to rebuild them;
        then every partition goes back to its last committed position."""
        self.stats.sink_errors += 1
        if self.config.daemon.on_sink_error == "stop" or self.parts.make_sink is None:
            raise WorkerStop(f"sink flush failed: {type(exc).__name__}: {exc}") from exc
        self._close_sinks(f"flush failed: {type(exc).__name__}: {exc}",
                          "what was written since the last commit is read again once the sink is "
                          "rebuilt (rewinding to the last commit); every partition is paused")

    def _close_sinks(self, reason: str, meanwhile: str) -> None:
        """A failure that may have lost what the sink held: close the sink and the DLQ, said
        with ``meanwhile`` (what happens until they are rebuilt), and wait the backoff before
        ``_rebuild_sinks`` tries."""
        delay = self.backoff.failure()
        self.stall.failed(reason, meanwhile, delay)
        for obj in (self.parts.sink, self.parts.dlq):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    log.debug("closing %r after a failure failed too", obj, exc_info=True)
        self._next_try = self._clock() + delay
        self._apply(Event.FLUSH_FAILED)

    def _rebuild_sinks(self, meanwhile: str) -> bool:
        """A new sink and DLQ once the backoff allows: True when rebuilt; a failure waits the
        next backoff (said with ``meanwhile``), a ``SinkRefused`` stops the worker."""
        if not self._may_try():
            return False
        try:
            sink = self.parts.make_sink()  # type: ignore[misc]
            dlq = self.parts.make_dlq() if self.parts.make_dlq is not None else None
        except SinkRefused as exc:
            raise self._stop(exc) from None
        except Exception as exc:
            delay = self.backoff.failure()
            self._next_try = self._clock() + delay
            self._next_probe = self._clock() + self.probe_backoff.failure()
            self.stall.failed(f"cannot rebuild the sink: {type(exc).__name__}: {exc}", meanwhile, delay)
            self._apply(Event.REBUILD_FAILED)
            return False
        self.parts.sink, self.parts.dlq = sink, dlq
        return True

    def _try_rewind(self) -> None:
        if not self._rebuild_sinks("still paused"):
            return
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
        # Said once a stall; the stall's own lines say the rest (StallWatch).
        log.log(logging.INFO if self.stall.attempts <= 1 else logging.DEBUG,
                "sink rebuilt; consuming again from the last committed offsets")
        self._apply(Event.REWOUND)

    # -- committing -----------------------------------------------------------------------------

    def _commit(self, positions: dict[TopicPartition, int], only: set[TopicPartition] | None = None) -> None:
        if self.mode is Mode.STOPPED:
            return
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
        log.debug("committed %s", ", ".join(f"{tp.topic}-{tp.partition}@{om.offset}" for tp, om in offsets.items()))
        now = time.time()
        for tp, om in offsets.items():
            self._committed[tp] = om.offset
            self.stats.committed[tp] = (om.offset, now)
        self._on_commit(offsets)


def _by_index(exc: SinkRefused, records: list[Record]) -> SinkWriteError:
    """A write's ``SinkRefused`` naming records, as the ``SinkWriteError`` by index the sink
    error policy takes."""
    refused = {(r.topic, r.partition, r.offset) for r in exc.records or ()}
    failed = [i for i, r in enumerate(records) if (r.topic, r.partition, r.offset) in refused]
    return SinkWriteError(exc.line(), failed)


def _capped(positions: dict[TopicPartition, int], records) -> dict[TopicPartition, int]:
    """``positions`` with each partition of ``records`` held back to its first one: what may be
    committed when those records are delivered nowhere and everything else is durable."""
    caps: dict[TopicPartition, int] = {}
    for r in records:
        tp = TopicPartition(r.topic, r.partition)
        caps[tp] = min(caps.get(tp, r.offset), r.offset)
    return {tp: min(pos, caps[tp]) if tp in caps else pos for tp, pos in positions.items()}


def _where(records) -> str:
    """Records by topic-partition@offset, for a log line (the first few)."""
    names = [f"{r.topic}-{r.partition}@{r.offset}" for r in records[:5]]
    return ", ".join(names) + (f" and {len(records) - 5} more" if len(records) > 5 else "")
