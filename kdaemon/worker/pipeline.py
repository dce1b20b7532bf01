"""One worker's loop: poll → (header filter inside decoding) → deserialize → on_consume
interceptors → sink → flush → commit → on_commit interceptors, and its rebalance listener.

The work is split three ways so each part can be read, and tested, alone:

* kdaemon/worker/stages.py — the pure record stages (``Pipeline``: deserialize, intercept,
  on_commit), shared with ``kdaemon tail`` and ``kdaemon.testing.run_plugin``;
* kdaemon/worker/delivery.py — write, flush, commit and sink-failure recovery, as a state
  machine whose modes and transitions are one table (kdaemon/worker/modes.py);
* this module — the loop that feeds one into the other, its lifecycle (run, stop, shutdown)
  and the rebalance listener the consumer calls inside ``poll``.

``Pipeline``, ``WorkerStats`` and ``WorkerStop`` are re-exported here: callers import them from
the module that has always offered them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..client.errors import FencedInstanceIdError, WakeupError
from ..client.types import ConsumerRecord, GroupMembershipOperation, TopicPartition
from ..config import DaemonConfig
from ..exit_codes import EXIT_FENCED, EXIT_OK, EXIT_SINK_REFUSED, EXIT_STOPPED_ON_ERROR
from ..plugins.types import SinkRefused
from .build import PipelineParts
from .delivery import Delivery
from .health import HealthWatch, observe
from .memory import MemoryWatch, relieve
from .modes import Mode
from .ownership import GroupCensus
from .resume import ResumeAtOutput
from .stages import Pipeline, StageObserver, WorkerStats, WorkerStop

__all__ = ["EXIT_OK", "EXIT_STOPPED_ON_ERROR", "Mode", "Pipeline", "StageObserver",
           "Worker", "WorkerStats", "WorkerStop"]

log = logging.getLogger(__name__)

# The longest poll while the worker waits for a sink's answer: a flush in flight (its commit
# follows the confirmation) or a partition waiting to resume (resume.py).  The answer arrives on
# the sink's own socket and does not end a poll: a caught-up worker blocked for the whole
# poll_timeout_ms (500 ms) before it committed what the uploader had confirmed.
SINK_ANSWER_POLL_MS = 50


class Worker:
    """Runs the pipeline against a consumer until stopped.

    ``subscribe_or_assign`` is called once with the consumer and the rebalance listener: group
    mode subscribes, static mode assigns a fixed partition subset.
    """

    def __init__(self, config: DaemonConfig, parts: PipelineParts, consumer,
                 subscribe_or_assign: Callable, *, clock: Callable[[], float] = time.monotonic,
                 on_tick: Callable[["Worker"], None] | None = None,
                 observer: StageObserver | None = None, memory: MemoryWatch | None = None) -> None:
        """``memory``: the worker process's budget watch (``make_worker`` passes one); a Worker
        run inside another process (a test, a tool) has none: that process's RSS is not its own."""
        self.config = config
        self.parts = parts
        self.consumer = consumer
        self.stats = WorkerStats()
        self.pipeline = Pipeline(config, parts, self.stats, observer)
        self.delivery = Delivery(config, parts, consumer, self.stats, self.pipeline.on_commit, clock=clock)
        self.resume = ResumeAtOutput(consumer, lambda: self.parts.sink, self.delivery.start_at, clock=clock)
        self._subscribe_or_assign = subscribe_or_assign
        self.memory = memory
        self.health = HealthWatch("worker", clock=clock)
        self._held = False   # the last step found delivery holding (the sink down)
        self._on_tick = on_tick
        self._stopping = False
        self._leave_for_good = False   # set by request_stop(leave_group=True)
        self._stop_reason: str | None = None   # set by request_stop(reason=...), said once
        self._reason_said = False
        self._assigned_once = False
        self._ownership = None   # worker 0's OwnershipCheck (worker/ownership.py), once watching
        self._census: GroupCensus | None = None   # made when first needed (_group_sizes)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Has its assignment: a group generation, or a manual assignment."""
        group = self.consumer.group_state()
        if group is not None:
            return group.stable
        return bool(self.consumer.assignment()) or self._assigned_once

    def request_stop(self, *, leave_group: bool = False, reason: str | None = None) -> None:
        """Stop after the current step.  ``leave_group``: this worker is not coming back (the
        pool shrank), so its static membership leaves for good and its partitions move to the
        others at once rather than after the session timeout (see
        ``GroupMembershipOperation``).  ``reason``: why, when it is not the caller's to say (the
        supervisor is gone): logged once, by ``run``, as the worker stops.  Thread- and
        signal-safe: it only sets flags."""
        self._leave_for_good = self._leave_for_good or leave_group
        if reason is not None and self._stop_reason is None:
            self._stop_reason = reason
        self._stopping = True
        try:
            self.consumer.wakeup()
        except Exception:
            pass

    def group_news(self) -> None:
        """Another worker of this daemon joined, took a new assignment or gave partitions up
        (the supervisor's ``siblings.SIBLING_SIGNAL``): heartbeat now, not at the broker's next
        interval, to hear what that means for this one.  Signal-safe (``heartbeat_soon`` takes
        no lock); nothing once stopping."""
        if not self._stopping:
            self.consumer.heartbeat_soon()

    def _group_sizes(self) -> tuple[int, int] | None:
        """The group's (members, partitions) for ``health.observe``, asked only while this
        worker is a member without partitions; None until the first look answers."""
        if self._census is None:
            self._census = GroupCensus(self.consumer.config, self.config.daemon.topics)
        return self._census.sizes(time.monotonic())

    @property
    def stop_reason(self) -> str | None:
        """The first ``reason`` given to ``request_stop``."""
        return self._stop_reason

    def _say_stop_reason(self) -> None:
        if self._stop_reason is not None and not self._reason_said:
            self._reason_said = True
            log.warning("%s", self._stop_reason)

    def watch_ownership(self, check) -> None:
        """Look out for partitions nobody consumes with ``check`` (an ``OwnershipCheck``), from
        now until shutdown."""
        self._ownership = check.start()

    def run(self) -> int:
        code = EXIT_OK
        try:
            # The sinks' targets first (the Kafka DLQ's topic): a refusal stops the worker
            # before it joins the group or reads a record.
            self.delivery.preflight(lambda: self._on_tick(self) if self._on_tick else None, lambda: self._stopping)
            if not self._stopping:
                self._start()
            while not self._stopping:
                try:
                    self.step()
                except WakeupError:
                    continue
        except (WorkerStop, SinkRefused) as exc:
            code = _stopped(exc)
        except FencedInstanceIdError as exc:
            log.error("worker stopping: fenced by Kafka (FENCED_INSTANCE_ID): %s. Another consumer joined with this "
                      "worker's static member id: a second daemon with the same [daemon] daemon_id (default: "
                      "the host name) and group? Give each daemon its own daemon_id (or [kafka] "
                      "group_instance_id)", exc)
            code = EXIT_FENCED
        finally:
            self._say_stop_reason()
            self.shutdown(fenced=code == EXIT_FENCED)
            self._say_stop_reason()   # given during the shutdown itself
        if code == EXIT_OK and self.delivery.stop_error is not None:
            code = _stopped(self.delivery.stop_error)   # refused in the final flush (a SIGTERM's)
        return code

    def _start(self) -> None:
        self._subscribe_or_assign(self.consumer, self)
        self._assigned_once = True
        if not self.consumer.subscription():
            # A fixed assignment: no listener call, but the same start where the output is.
            self.resume.assigned(self.consumer.assignment())
        if self.memory is not None:
            self.memory.started(f"the {self.config.sink.type} sink")

    def shutdown(self, *, fenced: bool = False) -> None:
        """Flush and commit what is durable, close the consumer (which runs
        on_partitions_revoked and leaves the group), then close the sinks.

        The sinks close last: the revocation listener flushes them, and a closed sink refuses.
        A fenced member's commit is refused: said in one line, not a traceback."""
        if self._ownership is not None:
            self._ownership.close()
        try:
            self.delivery.flush_and_commit()
        except Exception as exc:
            if fenced:
                log.warning("final commit refused after the fencing (%s); the records since the last commit "
                            "will be delivered again", exc)
            elif self.delivery.stop_error is None:
                log.exception("final flush/commit failed; uncommitted records will be delivered again")
            # else: refused for good (or kept nowhere) in this flush: run() says so, once
        try:
            self.consumer.close(group_membership=GroupMembershipOperation.LEAVE_GROUP if self._leave_for_good
                                else GroupMembershipOperation.DEFAULT)
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
        if self.memory is not None:
            self.memory.tick()
        if self.health.due():
            self.health.update(observe(self.consumer, self.config.daemon.topics,
                                       self._ownership.unowned() if self._ownership is not None else None,
                                       self._group_sizes))
        held = self.delivery.hold()
        full = self.delivery.mode is Mode.FULL
        if held and not self._held and not full and self.memory is not None:
            relieve()   # what the last batches used is not needed while the sink is down
        self._held = held
        if held:
            # The sink is down (a held batch, a held flush, a rewind to come), or the next flush
            # waits for the one in flight (FULL): every partition is paused; polling keeps the
            # group membership alive and serves a rebalance, and sleeps until the next retry or
            # probe is due, so a long stall costs next to no CPU; while FULL, briefly (the
            # confirmation arrives on the sink's own socket and does not end a poll).
            wait_ms = SINK_ANSWER_POLL_MS if full else \
                min(self.config.daemon.poll_timeout_ms, max(10, int(self.delivery.wait_hint() * 1000)))
            returned = self.consumer.poll(wait_ms)
            if returned:
                # A rebalance callback inside this poll can end the pause (a revocation's flush
                # confirms the held batch, and the mode resumes every partition): the poll then
                # returns records this step does not deliver.  They are read again; dropping
                # them would let the next commit cover them (seen on Apache Kafka: a whole
                # partition's records lost).
                for tp, records in returned.items():
                    self.consumer.seek(tp, records[0].offset)
                log.debug("records returned while delivery was held are read again: %s",
                          {f"{tp.topic}-{tp.partition}": records[0].offset for tp, records in returned.items()})
            if self._on_tick:
                self._on_tick(self)
            return
        self.resume.step()
        poll_ms = self.config.daemon.poll_timeout_ms
        if self.resume.waiting or self.delivery.mode is Mode.FLUSHING:
            poll_ms = min(poll_ms, SINK_ANSWER_POLL_MS)
        before = self.consumer.positions()
        polled = self.consumer.poll(poll_ms)
        positions = self.consumer.positions()
        raw: list[ConsumerRecord] = []
        fetched = self.stats.fetched
        for tp, records in polled.items():
            raw.extend(records)
            fetched[tp] += len(records)
        self.delivery.track(before, polled)
        if raw:
            try:
                records, dead = self.pipeline.deserialize(raw)
            except WorkerStop:
                self.delivery.flush_and_commit()
                raise
            records = self.pipeline.intercept(records)
            self.delivery.deliver(records, dead, positions)
        else:
            self.delivery.nothing_to_write(positions)
        self.delivery.flush_if_due()
        if self._on_tick:
            self._on_tick(self)

    def deliver(self, records, dead, positions: dict[TopicPartition, int]) -> None:
        """Hand a deserialized, intercepted batch ending at ``positions`` to delivery (what
        ``step`` does after a poll; tests feed batches this way)."""
        self.delivery.deliver(records, dead, positions)

    def flush_and_commit(self, only: set[TopicPartition] | None = None) -> None:
        """Make everything written durable, then commit the positions recorded with it."""
        self.delivery.flush_and_commit(only)

    @property
    def mode(self) -> Mode:
        return self.delivery.mode

    @property
    def problems(self) -> tuple[str, ...]:
        """Why this worker consumes nothing, if it cannot (``health.CONDITIONS`` names)."""
        return self.health.problems

    @property
    def sink_down_s(self) -> float:
        """How long the sink has been unable to take records (0: it takes them)."""
        return self.delivery.stall.down_for()

    # -- rebalance listener (the consumer calls these inside poll) -------------------------------
    #
    # Each ends the poll it runs in (``yield_poll``): the loop's next beat tells the supervisor at
    # once, which tells the other workers (supervisor/siblings.py), instead of after the rest of
    # a poll that may wait out poll_timeout_ms.

    def on_partitions_revoked(self, partitions: set[TopicPartition]) -> None:
        self.resume.forget(partitions)
        self.delivery.on_revoked(partitions)
        self.consumer.yield_poll()

    def on_partitions_assigned(self, partitions: set[TopicPartition]) -> None:
        self.consumer.yield_poll()
        self.delivery.on_assigned(partitions)
        self.resume.assigned(partitions)
        # A sink that keeps what it stored per partition (jsonl's dedupe) reads it again: the
        # partitions may have been written by another worker since this one last held them.
        for sink in (self.parts.sink, self.parts.dlq):
            hook = getattr(sink, "on_partitions_assigned", None)
            if hook is not None:
                hook(partitions)

    def on_partitions_lost(self, partitions: set[TopicPartition]) -> None:
        self.resume.forget(partitions)
        self.delivery.on_lost(partitions)
        self.consumer.yield_poll()


def _stopped(exc: BaseException) -> int:
    """The one line a worker stopping on ``exc`` logs, and its exit code: a stop policy's
    ``WorkerStop`` (``EXIT_STOPPED_ON_ERROR``), or the sink's or DLQ's ``SinkRefused``
    (``EXIT_SINK_REFUSED``), which names the topic or table and the fix."""
    if isinstance(exc, SinkRefused):
        log.error("worker stopping, refused for good: %s", exc.line())
        return EXIT_SINK_REFUSED
    log.error("worker stopping: %s", exc)
    return EXIT_STOPPED_ON_ERROR
