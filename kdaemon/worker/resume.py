"""A partition given to this worker starts where the sink's output already is, when the sink
can say (Kafka Connect's ``SinkTask.open`` and ``SinkTaskContext.offset``).

A sink that keeps each topic-partition-offset once (``deduplicates_by_offset``: the Spark sink)
lets a revoked partition go without waiting for the upload in flight
(``delivery.Delivery.on_revoked``), so its next owner starts at the last commit, which may be
behind what is already in the output.  Reading from there costs a read and an upload of rows
the sink then drops, and the batch waits ``max_age_s`` first.

A sink with ``ask_resume(positions)`` and ``resume_answers()`` is asked instead: each
partition given to the worker stays paused until its position is known (the group's commit,
resolved by the consumer while the partition is paused), the question is sent, and the answer
arrives (the Spark uploader answers between jobs, after the batches sent before the question).
Then the worker seeks past what the output has and commits there
(``delivery.Delivery.start_at``), or, with no answer (the sink could not say, or
``WAIT_S`` passed), reads from its position as it would have without asking.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..client.types import TopicPartition

log = logging.getLogger("kdaemon.worker")

# How long a partition waits for the sink's answer before it is read from its position anyway
# (an uploader busy with a long first job, say): reading it again is safe, only slower.
WAIT_S = 30.0


@dataclass
class _Waiting:
    since: float
    asked_at: int | None = None   # the position sent with the question


class ResumeAtOutput:
    """Holds newly assigned partitions paused until the sink says where they start.
    ``sink_of`` returns the current sink (a rewind replaces it, and its questions with it);
    ``start_at`` seeks and commits (``Delivery.start_at``)."""

    def __init__(self, consumer, sink_of: Callable[[], object], start_at: Callable[[TopicPartition, int], None],
                 *, clock: Callable[[], float] = time.monotonic, wait_s: float = WAIT_S) -> None:
        self.consumer = consumer
        self._sink_of = sink_of
        self._start_at = start_at
        self._clock = clock
        self._wait_s = wait_s
        self._waiting: dict[TopicPartition, _Waiting] = {}
        self._asked_sink: object = None

    def _sink(self):
        sink = self._sink_of()
        return sink if hasattr(sink, "ask_resume") and hasattr(sink, "resume_answers") else None

    @property
    def waiting(self) -> bool:
        return bool(self._waiting)

    def assigned(self, partitions) -> None:
        if not partitions or self._sink() is None:
            return
        now = self._clock()
        for tp in partitions:
            self._waiting[tp] = _Waiting(now)
        self.consumer.pause(*partitions)
        # Called from the poll that got them: back to the loop now, which asks the sink (step)
        # and polls briefly while it waits; that poll would have waited out poll_timeout_ms
        # with them paused, the question not even sent (0.46 s of every warm reload measured).
        self.consumer.yield_poll()

    def forget(self, partitions) -> None:
        """Revoked or lost: a late answer for them is ignored."""
        for tp in partitions:
            self._waiting.pop(tp, None)

    def step(self) -> None:
        """Ask, apply the answers that arrived, give up on the ones overdue.  Called by the loop
        before each poll while delivery is not held (a paused mode pauses every partition, and
        leaving it resumes every partition: those still waiting are paused again here)."""
        if not self._waiting:
            return
        sink = self._sink()
        if sink is None:
            self._release(list(self._waiting), "the sink cannot say where they start")
            return
        if sink is not self._asked_sink:
            # A new sink (after a rewind): the old one's questions went with it.
            self._asked_sink = sink
            for w in self._waiting.values():
                w.asked_at = None
        self.consumer.pause(*self._waiting)
        self._ask(sink)
        try:
            answers = sink.resume_answers()
        except Exception as exc:
            self._release([tp for tp, w in self._waiting.items() if w.asked_at is not None],
                          f"the sink's answer failed ({type(exc).__name__}: {exc})")
            answers = {}
        for tp, offset in answers.items():
            w = self._waiting.get(tp)
            if w is None or w.asked_at is None:
                # Revoked meanwhile; or revoked and given again, not yet asked: its own
                # question is still to come, and this answer is not the one it waits for.
                continue
            del self._waiting[tp]
            if offset is not None and offset > w.asked_at and self.consumer.positions().get(tp) == w.asked_at:
                log.info("%s-%d starts at offset %d, where the sink's output already is (the group's commit "
                         "was %d): %d record(s) not read again", tp.topic, tp.partition, offset, w.asked_at,
                         offset - w.asked_at)
                self._start_at(tp, offset)
            self.consumer.resume(tp)
        now = self._clock()
        overdue = [tp for tp, w in self._waiting.items() if now - w.since >= self._wait_s]
        if overdue:
            self._release(overdue, f"no answer from the sink within {self._wait_s:.0f} s")

    def _ask(self, sink) -> None:
        positions = self.consumer.positions()
        ask = {tp: positions[tp] for tp, w in self._waiting.items() if w.asked_at is None and tp in positions}
        if not ask:
            return
        try:
            sink.ask_resume(ask)
        except Exception as exc:
            self._release(list(ask), f"the sink cannot be asked ({type(exc).__name__}: {exc})")
            return
        for tp, position in ask.items():
            self._waiting[tp].asked_at = position

    def _release(self, partitions: list[TopicPartition], why: str) -> None:
        """Read these from their positions, as without asking."""
        for tp in partitions:
            self._waiting.pop(tp, None)
        if partitions:
            log.info("%d partition(s) read from the group's commit: %s", len(partitions), why)
            self.consumer.resume(*partitions)
