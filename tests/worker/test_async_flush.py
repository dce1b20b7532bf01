"""The worker with a sink that flushes asynchronously (``flush_async``, as the Spark sink does):
it keeps consuming while a batch is made durable, commits a batch's positions only when that
batch is confirmed, keeps one flush in flight at most, and rewinds after a failed one.

The consumer and the sink are scripted so the test decides when a confirmation arrives; the
Spark sink's own handle is tested against a stand-in uploader in tests/sinks/spark, and the whole
path with real PySpark and a real broker in tests/sinks/spark/test_spark_sink_e2e.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kdaemon.config import parse
from kdaemon.worker.build import PipelineParts
from kdaemon.worker.pipeline import Worker
from testkit.pipeline import TOPIC, TP, ScriptedConsumer

BATCH = 30   # the sink wants a flush at this many buffered records


class Handle:
    def __init__(self, sink: "AsyncSink", offsets: list[int]) -> None:
        self.sink = sink
        self.offsets = offsets
        self.outcome: bool | Exception | None = None   # None: the confirmation has not come yet
        self.waited = 0
        self.retried = 0

    def retry(self) -> None:
        """Send the kept batch again (after SinkUnavailable): unconfirmed again, or refused at
        once while the sink is down (``ProbedSink.down``)."""
        from kdaemon.plugins.types import SinkUnavailable
        self.retried += 1
        if getattr(self.sink, "down", None):
            raise SinkUnavailable(self.sink.down)
        self.outcome = None

    def confirm(self) -> None:
        self.outcome = True
        self.sink.durable.update(self.offsets)

    def done(self) -> bool:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome is True

    def wait(self) -> None:
        self.waited += 1
        if self.outcome is None:
            self.confirm()   # the confirmation a blocking wait gets
        self.done()


class AsyncSink:
    def __init__(self, durable: set[int], handles: list[Handle]) -> None:
        self.durable = durable
        self.handles = handles
        self.buffer: list[int] = []
        self.closed = False

    def write(self, records):
        assert not self.closed
        self.buffer.extend(r.offset for r in records)

    def wants_flush(self) -> bool:
        return len(self.buffer) >= BATCH

    def flush_async(self) -> Handle:
        handle = Handle(self, self.buffer)
        self.buffer = []
        self.handles.append(handle)
        return handle

    def flush(self) -> None:
        self.flush_async().wait()

    def close(self) -> None:
        self.closed = True
        self.buffer = []


class ProbedSink(AsyncSink):
    """An AsyncSink with ``probe()``: ``down`` says why it cannot take records (None: up)."""

    down: str | None = None
    probes = 0

    def probe(self) -> str | None:
        ProbedSink.probes += 1
        return ProbedSink.down


@pytest.fixture
def setup():
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "flush_interval_ms": 3_600_000, "on_deserialize_error": "skip",
                               "sink_retry_backoff_ms": 1, "sink_retry_backoff_max_ms": 1},
                    "sink": {"type": "null"}})
    durable: set[int] = set()
    handles: list[Handle] = []
    sinks: list[AsyncSink] = []

    def make_sink():
        sinks.append(AsyncSink(durable, handles))
        return sinks[-1]

    def build(total: int):
        consumer = ScriptedConsumer(total, durable)
        identity = lambda t, h, b: b  # noqa: E731
        parts = PipelineParts(None, identity, identity, [], make_sink(), None, make_sink=make_sink)
        # A clock of its own, one second a step: the rewind's backoff passes between steps.
        ticks = iter(range(1, 10**9))
        return Worker(config, parts, consumer, lambda c, w: None, clock=lambda: float(next(ticks))), consumer

    return build, handles, sinks, durable


def test_consumes_while_a_batch_uploads_and_commits_it_on_confirmation(setup):
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    for _ in range(3):
        worker.step()
    assert len(handles) == 1 and handles[0].offsets == list(range(30))
    assert consumer.commits == []          # not confirmed: nothing committed
    worker.step()
    worker.step()
    assert consumer.position == 50         # consumption went on meanwhile
    assert consumer.commits == [] and handles[0].waited == 0
    handles[0].confirm()
    worker.step()
    assert consumer.commits == [30]        # the batch's own positions, not the 60 read by now


def test_a_caught_up_worker_polls_briefly_while_a_flush_is_in_flight(setup):
    """The confirmation comes on the sink's socket and does not end a poll: while one is owed,
    a caught-up worker polls for at most SINK_ANSWER_POLL_MS, so the commit follows the
    confirmation within that instead of a whole poll_timeout_ms."""
    from kdaemon.worker.pipeline import SINK_ANSWER_POLL_MS
    build, handles, sinks, durable = setup
    worker, consumer = build(30)
    for _ in range(3):
        worker.step()
    assert len(handles) == 1 and consumer.timeouts == [500, 500, 500]
    worker.step()
    worker.step()                          # caught up, the flush in flight
    assert consumer.timeouts[3:] == [SINK_ANSWER_POLL_MS] * 2 and consumer.commits == []
    handles[0].confirm()
    worker.step()                          # confirmed and committed in this step's hold()
    worker.step()
    assert consumer.commits == [30]
    assert consumer.timeouts[-1] == 500    # nothing owed any more: the configured poll again


def test_at_most_one_flush_in_flight_and_the_next_takes_what_gathered_meanwhile(setup):
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    for _ in range(6):
        worker.step()
    # The second batch was due while the first was unconfirmed: the worker went on consuming
    # into the sink instead of waiting, and sent nothing more.
    assert len(handles) == 1 and handles[0].waited == 0 and consumer.position == 60
    handles[0].confirm()
    worker.step()
    assert consumer.commits == [30]
    assert len(handles) == 2 and handles[1].offsets == list(range(30, 70))   # all gathered meanwhile


def test_a_worker_gathering_behind_a_slow_flush_stops_at_max_buffered_records(setup):
    """max_buffered_records still bounds what is read and not committed: then the worker stops
    reading until the flush in flight is confirmed (every partition paused), and flushes what it
    gathered at once.  It does not block on the upload meanwhile: it polls, so a rebalance is
    served during it (test_a_revocation_while_the_next_flush_waits_for_a_slow_upload...)."""
    from kdaemon.worker.pipeline import Mode, SINK_ANSWER_POLL_MS
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    worker.config = worker.delivery.config = replace(
        worker.config, daemon=replace(worker.config.daemon, max_buffered_records=50))
    for _ in range(7):
        worker.step()                      # 0..29 in flight; 30..69 gathered
    assert len(handles) == 1 and handles[0].waited == 0
    worker.step()                          # 50 records since that flush: stop reading
    assert worker.mode is Mode.FULL and consumer.paused and consumer.position == 80
    for _ in range(3):
        worker.step()                      # polling, reading nothing, not waiting on the handle
    assert consumer.position == 80 and consumer.timeouts[-3:] == [SINK_ANSWER_POLL_MS] * 3
    assert handles[0].waited == 0 and consumer.commits == [] and len(handles) == 1
    handles[0].confirm()
    worker.step()                          # confirmed: commit it, flush what gathered, read again
    assert consumer.commits == [30] and not consumer.paused and worker.mode is Mode.FLUSHING
    assert len(handles) == 2 and handles[1].offsets == list(range(30, 80))


def test_a_failed_upload_rewinds_and_loses_nothing(setup):
    build, handles, sinks, durable = setup
    worker, consumer = build(210)
    for _ in range(3):
        worker.step()
    handles[0].confirm()
    for _ in range(4):
        worker.step()                      # commits 30; batch 30..59 in flight; 60..69 buffered
    assert consumer.commits == [30] and len(handles) == 2
    handles[1].outcome = ConnectionError("the uploader went away")
    worker.step()
    assert sinks[0].closed and consumer.paused
    for _ in range(200):
        if consumer.commits and consumer.commits[-1] == 210:
            break
        worker.step()
        for h in handles:
            if h.outcome is None:
                h.confirm()
    assert consumer.commits[-1] == 210 and durable == set(range(210))
    assert len(sinks) == 2 and worker.stats.sink_errors == 1


def test_revocation_and_shutdown_wait_for_the_flush_in_flight(setup):
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    for _ in range(4):
        worker.step()                      # 0..29 in flight, 30..39 buffered
    worker.on_partitions_revoked({TP})
    assert handles[0].waited == 1 and consumer.commits == [30, 40]
    worker2, consumer2 = build(1000)
    for _ in range(4):
        worker2.step()
    worker2.shutdown()
    assert consumer2.commits == [30, 40]


def test_a_sink_that_deduplicates_by_offset_lets_revoked_partitions_go_at_once(setup):
    """``deduplicates_by_offset`` (the Spark sink): the revocation neither waits for the upload
    in flight nor commits; a confirmation arriving after it commits nothing of the partition
    the worker no longer owns; the next owner reads from the last commit."""
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    sinks[-1].deduplicates_by_offset = True
    for _ in range(4):
        worker.step()                      # 0..29 in flight, 30..39 buffered
    owned = {TP}
    consumer.assignment = lambda: set(owned)
    owned.clear()                          # the consumer drops the partition once the listener returns
    worker.on_partitions_revoked({TP})
    assert handles[0].waited == 0 and consumer.commits == []
    handles[0].confirm()
    worker.step()
    assert consumer.commits == []          # confirmed, but no longer this worker's to commit
    worker2, consumer2 = build(1000)
    for _ in range(4):
        worker2.step()
    worker2.shutdown()
    assert consumer2.commits == [30, 40]


def test_a_sink_that_deduplicates_by_offset_is_sent_what_was_gathered_when_partitions_are_revoked(setup):
    """Nothing in flight, records gathered: the revocation sends them to the sink without
    waiting (the next owner's question to the sink is answered after them, so it starts past
    them instead of reading them again), and commits nothing of the partition it gave up."""
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    sinks[-1].deduplicates_by_offset = True
    for _ in range(2):
        worker.step()                      # 0..19 buffered, below the batch: no flush yet
    assert handles == []
    owned = {TP}
    consumer.assignment = lambda: set(owned)
    owned.clear()
    worker.on_partitions_revoked({TP})
    assert len(handles) == 1 and handles[0].offsets == list(range(20)) and handles[0].waited == 0
    assert consumer.commits == []
    handles[0].confirm()
    worker.step()
    assert consumer.commits == [] and set(range(20)) <= durable


def test_a_stop_request_between_polls_does_not_cost_the_final_commit(setup):
    """SIGTERM lands after a poll returned: the wakeup it leaves behind is raised by the next
    blocking call, the shutdown's commit; the worker sends that commit again."""
    build, handles, sinks, durable = setup
    worker, consumer = build(1000)
    for _ in range(4):
        worker.step()
    worker.request_stop()
    worker.shutdown()
    assert consumer.commits == [30, 40] and worker.stats.commit_failures == 0


def test_a_worker_retired_for_good_closes_its_consumer_leaving_the_group(setup):
    """request_stop(leave_group=True) (the supervisor's retire signal: the pool shrank) closes the
    consumer with LEAVE_GROUP after the final commit; a plain stop keeps the static membership."""
    from kdaemon.client import GroupMembershipOperation
    build, handles, sinks, durable = setup
    for leave, expected in ((True, GroupMembershipOperation.LEAVE_GROUP),
                            (False, GroupMembershipOperation.DEFAULT)):
        worker, consumer = build(1000)
        for _ in range(4):
            worker.step()
        worker.request_stop(leave_group=leave)
        worker.shutdown()
        assert consumer.commits[-1] == 40 and consumer.closed_with is expected


def test_an_unreachable_sink_keeps_its_batch_and_is_probed_not_read_again(setup, caplog):
    """SinkUnavailable from a flush handle: the worker pauses and neither rewinds nor reads
    anything again; it probes the sink, sends the same batch again once the probe passes (not
    at the end of the backoff), and delivers every record once."""
    import logging

    from kdaemon.plugins.types import SinkUnavailable
    from kdaemon.worker.modes import Mode
    build, handles, sinks, durable = setup
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "flush_interval_ms": 3_600_000, "on_deserialize_error": "skip",
                               "sink_retry_backoff_ms": 1000, "sink_retry_backoff_max_ms": 600_000,
                               "sink_probe_max_ms": 4000},
                    "sink": {"type": "null"}})
    ProbedSink.down, ProbedSink.probes = "the uploader is not reachable", 0
    made: list[ProbedSink] = []

    def make_sink():
        made.append(ProbedSink(durable, handles))
        return made[-1]

    consumer = ScriptedConsumer(120, durable)
    identity = lambda t, h, b: b  # noqa: E731
    parts = PipelineParts(None, identity, identity, [], make_sink(), None, make_sink=make_sink)
    now = [0.0]
    worker = Worker(config, parts, consumer, lambda c, w: None, clock=lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="kdaemon.worker.delivery")
    for _ in range(4):
        worker.step()                      # 0..29 in flight, 30..39 buffered
    handles[0].outcome = SinkUnavailable("the uploader went away")
    worker.step()
    assert worker.mode is Mode.STALLED and consumer.paused and consumer.position == 40
    for step in range(1, 600):             # ten minutes down, a second a step
        now[0] = float(step)
        worker.step()
    assert worker.mode is Mode.STALLED and consumer.position == 40      # nothing read again
    assert len(made) == 1 and handles[0].retried <= 10                 # no rebuild; retries back off
    assert 110 <= ProbedSink.probes <= 160                             # about every 4 s (sink_probe_max_ms)
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name == "kdaemon.worker.delivery"]
    assert warnings[0].startswith("sink unavailable (the uploader went away)")
    assert sum("sink still unavailable after" in w for w in warnings) == 9, warnings   # a summary a minute
    assert len(warnings) == 10
    assert worker.delivery.wait_hint() <= 4.0
    ProbedSink.down = None                 # back: retried at the next probe, not the next backoff
    tried = handles[0].retried
    now[0] = 600 + 4.0
    worker.step()
    # Sent again, and still paused until it is confirmed: a sink that fails again must not
    # have let the worker read a buffer's worth meanwhile.
    assert handles[0].retried == tried + 1 and worker.mode is Mode.RESENDING
    now[0] = 605.0
    worker.step()
    assert consumer.paused and consumer.position == 40
    handles[0].confirm()
    for step in range(605, 700):
        now[0] = float(step)
        worker.step()
        for h in handles:
            if h.outcome is None:
                h.confirm()
    worker.flush_and_commit()
    assert consumer.commits[-1] == 120 and durable == set(range(120))
    assert any(r.getMessage().startswith("sink available again after 10m0") for r in caplog.records)
    assert worker.delivery.stall.down_for() == 0


def test_records_a_rebalance_lets_through_a_held_poll_are_read_again(setup):
    """A held flush (STALLED, then sent again: RESENDING) keeps every partition paused, and the
    worker polls only to stay in the group.  A revocation inside that poll flushes: it waits
    for the held batch, whose confirmation resumes the partitions, and the same poll then
    returns records.  The worker does not deliver a held poll's records; they must be read
    again, not dropped (on Apache Kafka the next commit covered a whole partition's records
    that never reached the Spark uploader)."""
    from kdaemon.client.types import TopicPartition
    from kdaemon.plugins.types import SinkUnavailable
    build, handles, sinks, durable = setup
    worker, consumer = build(120)          # four batches of 30
    for _ in range(3):
        worker.step()                      # 0..29 in flight
    handles[0].outcome = SinkUnavailable("the uploader is not reachable")
    worker.step()                          # held: STALLED, paused
    assert consumer.paused and consumer.commits == []
    real_poll = consumer.poll

    def poll_with_a_revocation(timeout_ms):
        consumer.poll = real_poll
        worker.on_partitions_revoked({TopicPartition(TOPIC, 1)})   # another partition of the group
        return real_poll(timeout_ms)

    consumer.poll = poll_with_a_revocation
    worker.step()                          # resent (RESENDING); the poll's revocation confirms it
    assert consumer.commits == [30] and not consumer.paused
    for _ in range(50):
        worker.step()
        for h in handles:
            if h.outcome is None:
                h.confirm()
    assert consumer.commits[-1] == 120 and durable == set(range(120))
