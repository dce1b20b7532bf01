"""A worker that is a member of a share group (KIP-932, ``[kafka] group_type = "share"``).

The same pipeline as a consumer-group worker (header filter inside decoding, deserializers,
on_consume interceptors, the sink, the DLQ; ``stages.Pipeline``), fed by a
``kdaemon.client.ShareConsumer`` in explicit acknowledgement mode.  Where the consumer-group
worker commits an offset after the sink's flush, this one acknowledges each record:

* a record the header filter drops: ACCEPTed by the client at fetch, never a Python object;
* a record written to the sink, or dropped by an interceptor: ACCEPT, only after the sink's
  (and the DLQ's) durable flush confirmed the poll's batch; the verdicts ride on the next
  ShareFetch (``commit_async``), and ``close`` sends the last ones;
* a record that failed to deserialize: ``on_deserialize_error`` "dlq": to the DLQ, ACCEPTed
  after the DLQ's flush; "skip": REJECT (no member could process it; the broker archives it);
  "stop": the poll's records are RELEASEd and the worker stops (``EXIT_STOPPED_ON_ERROR``);
* a record on its last delivery (``delivery_count`` >= the group's
  ``share.delivery.count.limit``, ``share_group.delivery_count_limit``) when the daemon has a
  DLQ (the default one counts): to the DLQ with the reason, without plugins or sink, then
  ACCEPTed.  A record that crashes the worker would otherwise be archived by the broker
  without a trace.  Without a DLQ it is processed as any other;
* a sink failure (a write or a flush): every record of the poll is RELEASEd (another member
  may take it at once, with its delivery count one higher), the sink and the DLQ are closed
  and rebuilt with backoff and probes, and nothing is fetched meanwhile;
  ``SinkRefused``: RELEASE, then stop as a consumer-group worker does (``EXIT_SINK_REFUSED``).

Why a poll's batch is flushed before the next poll: a share consumer in explicit mode fetches
nothing new while records of the last poll are unsettled (Java's rule, and ours), and a verdict
may only be ACCEPT once the record is durable.  So ``flush_interval_ms`` and
``flush_max_records`` do not apply; ``[kafka] max_poll_records`` sizes a flush.

Delivery's modes are the consumer-group worker's table (``modes.py``), of which a share worker
uses RUNNING, REWINDING (released, waiting to rebuild the sink: the broker hands the records out
again, there is nothing to seek) and STOPPED; the backoff, the probes, the stall's log lines and
the sink's preflight are ``delivery.Delivery``'s (``ShareDelivery`` is one, with a batch path
of its own).

The guarantee (docs/GROUP_PROTOCOLS.md): at-least-once.  A record is redelivered after a
RELEASE (a sink failure), a lock that expired before the verdict reached the broker (a flush
slower than ``share.record.lock.duration.ms``), or a crash; only the last two can repeat a record
the sink already holds.  Records arrive out of order, across partitions and within one.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

from ..client.errors import NoBrokersAvailableError, WakeupError
from ..client.group_configs import GroupConfigRefused
from ..client.share import AcknowledgeType, ShareRecord
from ..client.types import ConsumerRecord, TopicPartition
from ..config import DaemonConfig
from ..exit_codes import EXIT_BOOT_FAILURE, EXIT_OK
from ..plugins.types import Record, SinkRefused, SinkWriteError
from ..sinks.encoding import dead_letter
from .build import PipelineParts
from .delivery import Delivery, _where
from .health import HealthWatch
from .memory import MemoryWatch
from .modes import PAUSED_MODES, Event, Mode
from .pipeline import _stopped
from .share_group import DEFAULT_DELIVERY_COUNT_LIMIT, apply_group_configs, delivery_count_limit
from .stages import Pipeline, WorkerStats, WorkerStop

log = logging.getLogger(__name__)

ACCEPT, RELEASE, REJECT = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT
_make_consumer_record = ConsumerRecord._make


def last_delivery_reason(record: ShareRecord) -> str:
    """The dead letter's error text for a record on its last delivery."""
    return f"delivery count limit reached: {record.delivery_count} deliveries"


class ShareDelivery(Delivery):
    """Writes one poll's records to the sink and the DLQ, flushes, and acknowledges each record
    (see the module docstring); a sink failure releases them and rebuilds the sink."""

    def __init__(self, config: DaemonConfig, parts: PipelineParts, consumer, stats: WorkerStats,
                 pipeline: Pipeline, *, delivery_count_limit: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(config, parts, consumer, stats, pipeline.on_commit, clock=clock)
        self.pipeline = pipeline
        self.delivery_count_limit = delivery_count_limit
        self.acknowledged: Counter = Counter()      # verdict name -> records, as sent
        self.acknowledge_failures: Counter = Counter()   # error type name -> records
        self.last_deliveries = 0                    # records sent to the DLQ on their last delivery
        self._failure_said: str | None = None

    # -- the table ------------------------------------------------------------------------------

    def _set_paused(self, paused: bool) -> None:
        """A share member holds no partitions to pause: while paused the loop does not poll."""

    def hold(self) -> bool:
        if self.mode is Mode.STOPPED:
            raise self.stop_error
        if self.mode is Mode.REWINDING:
            self._try_rebuild()
        return self.mode in PAUSED_MODES

    # -- one poll -------------------------------------------------------------------------------

    def settle(self, batch: list[ShareRecord]) -> None:
        """Process, write, flush and acknowledge the records one poll returned."""
        try:
            verdicts = self._process(batch)
        except (WorkerStop, SinkRefused) as exc:
            self._release(batch, f"stopping: {exc}", sync=True)
            if isinstance(exc, SinkRefused):
                raise self._stop(exc) from None
            raise
        if verdicts is None:
            return   # released; REWINDING
        for r, kind in zip(batch, verdicts):
            self.consumer.acknowledge(r, kind)
        self.acknowledged["accept"] += verdicts.count(ACCEPT)
        self.acknowledged["reject"] += verdicts.count(REJECT)
        self.consumer.commit_async()

    def _process(self, batch: list[ShareRecord]) -> list[AcknowledgeType] | None:
        """The verdict of each record of ``batch`` once it is all durable; None when a sink
        failure released it (delivery is REWINDING then)."""
        limit, dlq = self.delivery_count_limit, self.parts.dlq
        last: list[Record] = []
        raw: list[ConsumerRecord] = []
        for r in batch:
            if dlq is not None and r.delivery_count > 1 and r.delivery_count >= limit:
                last.append(dead_letter(Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                                               r.key, r.value, r.headers, r.key, r.value),
                                        "delivery", last_delivery_reason(r)))
            else:
                raw.append(_make_consumer_record(r[:9]))
        if last:
            log.warning("%d record(s) on their last delivery (share.delivery.count.limit = %d) go to the DLQ "
                        "unprocessed: %s", len(last), limit, _where(last))
        records, dead = self.pipeline.deserialize(raw)   # "stop": WorkerStop
        rejected: set[tuple[str, int, int]] = set()
        if len(records) + len(dead) < len(raw):
            # on_deserialize_error = "skip": no member can process them; REJECT archives them.
            kept = {(r.topic, r.partition, r.offset) for r in records} | {(r.topic, r.partition, r.offset) for r in dead}
            rejected = {(r.topic, r.partition, r.offset) for r in raw} - kept
        records = self.pipeline.intercept(records)
        dead = last + dead
        if records and not self._write_sink(records, dead):
            self._release(batch, "the sink failed")
            return None
        if dead:
            self._write_dlq(dead)   # a DLQ that fails: WorkerStop
        if not self._flush_all():
            self._release(batch, "the flush failed")
            return None
        self.last_deliveries += len(last)
        self._note_delivered(records)
        if records:
            self._ok_again()
        return [REJECT if (r.topic, r.partition, r.offset) in rejected else ACCEPT for r in batch]

    def _write_sink(self, records: list[Record], dead: list[Record]) -> bool:
        """Write ``records``; records the sink refuses for what they are join ``dead`` (with a
        DLQ, unless ``on_sink_error = "stop"``).  False after a transient failure (delivery is
        REWINDING then)."""
        policy = self.config.daemon.on_sink_error
        try:
            self.parts.sink.write(records)
            return True
        except (WorkerStop, SinkRefused) as exc:
            if not isinstance(exc, SinkRefused) or exc.records is None:
                raise
            failed = _refused_indexes(exc, records)
            error: BaseException = exc
        except SinkWriteError as exc:
            failed = None if exc.failed_indexes is None else set(exc.failed_indexes)
            error = exc
        except Exception as exc:
            failed, error = None, exc
        self.stats.sink_errors += 1
        if policy == "stop":
            raise WorkerStop(f"sink write failed: {type(error).__name__}: {error}") from error
        if failed is None and policy == "retry":
            self._fail_over(f"write failed: {type(error).__name__}: {error}")
            return False
        if self.parts.dlq is None:
            raise WorkerStop(f"the sink rejected {len(failed or records)} record(s) and no [dlq] is configured "
                             f"({error}): add a [dlq] section, or set daemon.on_sink_error to \"dlq\"")
        failed = set(range(len(records))) if failed is None else failed
        log.warning("sink write failed (%s); %d record(s) to the DLQ", type(error).__name__, len(failed))
        plugin = f"sink.type={self.config.sink.type}"
        dead += [dead_letter(records[i], "sink", error, plugin=plugin) for i in sorted(failed)]
        records[:] = [r for i, r in enumerate(records) if i not in failed]
        return True

    def _flush_all(self) -> bool:
        """The DLQ's flush, then the sink's: True when both made everything durable."""
        try:
            if self.parts.dlq is not None:
                self.parts.dlq.flush()
            self.parts.sink.flush()
        except SinkRefused as exc:
            if exc.records is None:
                raise
            raise WorkerStop(f"the sink or the DLQ refused {len(exc.records)} record(s) for good in its flush "
                             f"({_where(exc.records)}): {exc.line()}") from None
        except WorkerStop:
            raise
        except Exception as exc:
            self.stats.sink_errors += 1
            if self.config.daemon.on_sink_error == "stop":
                raise WorkerStop(f"sink flush failed: {type(exc).__name__}: {exc}") from exc
            self._fail_over(f"flush failed: {type(exc).__name__}: {exc}")
            return False
        self.stats.flushes += 1
        return True

    def _note_delivered(self, records: list[Record]) -> None:
        delivered = self.stats.delivered
        for r in records:
            delivered[TopicPartition(r.topic, r.partition)] += 1
        WorkerStats.note(self.stats.batch_sizes, len(records))

    # -- failures -------------------------------------------------------------------------------

    def _release(self, batch: list[ShareRecord], why: str, *, sync: bool = False) -> None:
        """RELEASE every record of ``batch``: the broker hands each out again (to any member),
        its delivery count one higher."""
        for r in batch:
            try:
                self.consumer.acknowledge(r, RELEASE)
            except Exception as exc:   # its verdict already went out, or its lock expired
                log.debug("could not release %s-%d@%d: %s", r.topic, r.partition, r.offset, exc)
        self.acknowledged["release"] += len(batch)
        log.debug("released %d record(s): %s", len(batch), why)
        try:
            if sync:
                self.consumer.commit_sync()
            else:
                self.consumer.commit_async()
        except Exception as exc:
            log.warning("sending the release of %d record(s) failed (%s: %s); their locks expire instead, "
                        "and the broker hands them out again then", len(batch), type(exc).__name__, exc)

    def _fail_over(self, reason: str) -> None:
        """A write or flush failed: the poll's records are released (the caller), the sink and
        the DLQ closed; rebuilt with backoff (``hold``), fetching nothing meanwhile."""
        if self.parts.make_sink is None:
            raise WorkerStop(f"sink {reason}, and it cannot be rebuilt")
        self._close_sinks(reason, "the poll's records are released for another member (or this one, once the "
                          "sink is rebuilt) and nothing is fetched meanwhile")

    def _try_rebuild(self) -> None:
        if not self._rebuild_sinks("still fetching nothing"):
            return
        log.log(logging.INFO if self.stall.attempts <= 1 else logging.DEBUG, "sink rebuilt; fetching again")
        self._apply(Event.REWOUND)

    def acknowledgement_done(self, offsets: dict[TopicPartition, set[int]], error: Exception | None) -> None:
        """The client's acknowledgement commit callback: a verdict the broker did not take (the
        record's lock expired first: ``InvalidRecordStateError``) means the record is handed
        out again, a duplicate if it was written.  Counted; logged once per kind of failure."""
        if error is None:
            return
        n = sum(len(o) for o in offsets.values())
        name = type(error).__name__
        self.acknowledge_failures[name] += n
        if name != self._failure_said:
            self._failure_said = name
            log.warning("the broker did not take the verdicts on %d record(s) (%s: %s); they are handed out "
                        "again (a record the sink holds is then written twice: raise "
                        "share.record.lock.duration.ms above the time a poll's batch takes)", n, name, error)

    # Consumer-group paths a share member never takes.
    def flush_and_commit(self, only=None) -> None:
        """Nothing is held between polls: each poll's batch was flushed and settled in ``settle``."""


def _refused_indexes(exc: SinkRefused, records: list[Record]) -> set[int]:
    refused = {(r.topic, r.partition, r.offset) for r in exc.records or ()}
    return {i for i, r in enumerate(records) if (r.topic, r.partition, r.offset) in refused}


class _NoPartitions:
    """``WorkerMetrics.update`` reads a worker's consumer for per-partition figures (positions,
    lag, bytes) and rebalances, which a share member has none of: this view answers "none", so
    the rest of ``update`` (the worker's own counters) serves a share worker unchanged."""

    partitions: dict = {}
    fetch_responses_total = 0
    fetch_latency_ms_total = 0

    def metrics(self) -> "_NoPartitions":
        return self

    def group_state(self) -> None:
        return None


class _StatsOnly:
    """A share worker as ``WorkerMetrics.update`` reads a worker (see ``_NoPartitions``)."""

    consumer = _NoPartitions()

    def __init__(self, worker: "ShareWorker") -> None:
        self.stats = worker.stats
        self.problems = worker.problems
        self.sink_down_s = worker.sink_down_s


class ShareWorker:
    """Runs the pipeline against a ``ShareConsumer`` until stopped (the share group's
    counterpart of ``pipeline.Worker``, with the attributes the supervisor's child reads:
    ``stats``, ``ready``, ``problems``, ``sink_down_s``, ``request_stop``, ``run``)."""

    share = True   # the supervisor's heartbeat and metrics tell a share member by this

    def __init__(self, config: DaemonConfig, parts: PipelineParts, consumer, *, index: int = 0,
                 delivery_count_limit: int | None = None, clock: Callable[[], float] = time.monotonic,
                 on_tick: Callable[["ShareWorker"], None] | None = None,
                 memory: MemoryWatch | None = None) -> None:
        self.config = config
        self.parts = parts
        self.consumer = consumer
        self.index = index
        self.stats = WorkerStats()
        self.pipeline = Pipeline(config, parts, self.stats)
        # None: read from the group when the worker runs (share_group.delivery_count_limit).
        self._limit = delivery_count_limit
        self.delivery = ShareDelivery(config, parts, consumer, self.stats, self.pipeline,
                                      delivery_count_limit=delivery_count_limit or DEFAULT_DELIVERY_COUNT_LIMIT,
                                      clock=clock)
        consumer.set_acknowledgement_commit_callback(self.delivery.acknowledgement_done)
        self.memory = memory
        self.health = HealthWatch("worker", clock=clock)
        self._on_tick = on_tick
        self._stopping = False
        self._stop_reason: str | None = None
        self._polled = False

    # -- what the supervisor's child reads --------------------------------------------------------

    @property
    def ready(self) -> bool:
        """A member with an assignment (a share group assigns partitions too, shared by members)."""
        return self._polled and bool(self.consumer.assignment())

    @property
    def problems(self) -> tuple[str, ...]:
        return self.health.problems

    @property
    def sink_down_s(self) -> float:
        return self.delivery.stall.down_for()

    @property
    def mode(self) -> Mode:
        return self.delivery.mode

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def request_stop(self, *, leave_group: bool = False, reason: str | None = None) -> None:
        """Stop after the current step (a share member always leaves its group when it closes:
        there is no static membership to keep).  Thread- and signal-safe: flags only."""
        if reason is not None and self._stop_reason is None:
            self._stop_reason = reason
        self._stopping = True
        try:
            self.consumer.wakeup()
        except Exception:
            pass

    def share_figures(self) -> dict[str, int]:
        """What ``kdaemon status`` shows of this member instead of positions and lags: the
        records polls returned (filtered ones are accepted at fetch and not among them), their
        verdicts, and those held now without one."""
        acquired = sum(self.stats.fetched.values())
        done = self.delivery.acknowledged
        settled = done["accept"] + done["release"] + done["reject"]
        return {"acquired": acquired, "accepted": done["accept"], "released": done["release"],
                "rejected": done["reject"], "in_flight": max(0, acquired - settled)}

    def update_metrics(self, metrics, force: bool = False) -> None:
        """This member's counters to /metrics (``WorkerMetrics``, kdaemon/worker/metrics.py): the
        worker's own (``WorkerStats``: delivered, dead letters, sink errors, flushes...) as a
        consumer-group worker's, and the client's share counters (``update_share`` with
        ``ShareConsumer.metrics()``: acquired, acknowledged by type, redelivered, lock expiries)."""
        metrics.update(_StatsOnly(self), force=force)
        metrics.update_share(self.consumer.metrics())

    def group_news(self) -> None:
        """Another worker's news (siblings.SIBLING_SIGNAL): nothing to do, a share member's
        records do not move between members by assignment."""

    # -- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        code = EXIT_OK
        tick = (lambda: self._on_tick(self)) if self._on_tick else (lambda: None)
        try:
            self.delivery.preflight(tick, lambda: self._stopping)
            stopping = lambda: self._stopping   # noqa: E731
            apply_group_configs(self.config, index=self.index, tick=tick, stopping=stopping)
            if self._limit is None and not self._stopping:
                self.delivery.delivery_count_limit = delivery_count_limit(self.config, tick=tick, stopping=stopping)
                log.info("worker %d: a record's last delivery is its delivery number %d (share.delivery.count.limit); "
                         "it goes to the %s", self.index, self.delivery.delivery_count_limit,
                         "DLQ unprocessed" if self.parts.dlq is not None else "plugins and the sink as any other "
                         "(no DLQ)")
            if not self._stopping:
                self.consumer.subscribe(list(self.config.daemon.topics))
                if self.memory is not None:
                    self.memory.started(f"the {self.config.sink.type} sink")
            while not self._stopping:
                try:
                    self.step()
                except WakeupError:
                    continue
        except (WorkerStop, SinkRefused) as exc:
            code = _stopped(exc)
        except GroupConfigRefused as exc:
            log.error("worker %d cannot start: the [share] settings: %s; %s (or remove the setting from [share] "
                      "to keep the group's own)", self.index, exc, exc.fix)
            code = EXIT_BOOT_FAILURE
        finally:
            if self._stop_reason is not None:
                log.warning("%s", self._stop_reason)
            self.shutdown()
        return code

    def step(self) -> None:
        if self.memory is not None:
            self.memory.tick()
        if self.delivery.hold():
            # The sink is down: fetch nothing (what would be fetched would only be released);
            # the membership is the heartbeat thread's.  Sleep until the next retry or probe.
            until = time.monotonic() + min(self.config.daemon.poll_timeout_ms / 1000,
                                           max(0.01, self.delivery.wait_hint()))
            while not self._stopping and time.monotonic() < until:
                time.sleep(min(0.1, max(0.0, until - time.monotonic())))
            if self._on_tick:
                self._on_tick(self)
            return
        try:
            polled = self.consumer.poll(self.config.daemon.poll_timeout_ms)
        except NoBrokersAvailableError as exc:
            # Waited out as a consumer-group worker waits (worker/health.py says it, once, and
            # the heartbeat carries it): the share consumer keeps trying on the next poll.
            self.health.update({"broker_unreachable": f"no broker reachable ({exc})"})
            if self._on_tick:
                self._on_tick(self)
            return
        self.health.update({})   # it answered: any condition is over
        self._polled = True
        batch: list[ShareRecord] = []
        fetched = self.stats.fetched
        for tp, records in polled.items():
            batch.extend(records)
            fetched[tp] += len(records)
        if batch:
            self.delivery.settle(batch)
        if self._on_tick:
            self._on_tick(self)

    def shutdown(self) -> None:
        """Close the share consumer (its last verdicts go out; the broker releases whatever else
        this member holds, and it leaves the group), then the sinks."""
        try:
            self.consumer.close()
        except Exception:
            log.exception("closing the share consumer failed")
        for obj in (self.parts.sink, self.parts.dlq):
            if obj is not None:
                try:
                    obj.close()
                except Exception:
                    log.exception("closing %r failed", obj)
