"""A sink or DLQ that refuses for good (``SinkRefused``, kdaemon/plugins/types.py) stops the
worker instead of being retried for ever, and commits nothing past what it could not deliver;
records refused for what they are follow ``on_sink_error``.

Driven with testkit/pipeline.py's scripted one-partition consumer, which checks every commit
against what the test's sinks made durable at that moment, and sinks scripted to refuse (the
Kafka DLQ's refusals on Apache Kafka are in tests/sinks/kafka_dlq/test_dlq_refusals_kafka.py).
"""

from __future__ import annotations

import logging

import pytest

from kdaemon.config import parse
from kdaemon.exit_codes import EXIT_SINK_REFUSED, EXIT_STOPPED_ON_ERROR
from kdaemon.plugins.types import SinkRefused
from kdaemon.worker.build import PipelineParts
from kdaemon.worker.modes import Mode
from kdaemon.worker.pipeline import Worker, WorkerStop
from testkit.pipeline import TOPIC, TP, ScriptedConsumer

FIX = "create it: kafka-topics --create --topic out"


class Consumer(ScriptedConsumer):
    """The scripted consumer, with what ``Worker.run`` asks of a consumer besides."""

    def subscription(self):
        return set()

    def group_member_id(self):
        return None


class Sink:
    """Takes records into a buffer, makes them durable on flush.  ``refuse`` scripts it:
    ``"all"`` refuses writes and flushes for good; a set of offsets is refused by the flush
    for what they are (the others made durable)."""

    def __init__(self, durable: set[int], name: str = "out") -> None:
        self.durable = durable
        self.name = name
        self.buffer: list = []
        self.refuse: str | set[int] | None = None
        self.closed = False
        self.flushes = 0

    def write(self, records):
        if self.refuse == "all":
            raise SinkRefused(f"topic {self.name} does not exist", target=self.name, fix=FIX)
        self.buffer.extend(records)

    def flush(self):
        self.flushes += 1
        if self.refuse == "all":
            raise SinkRefused(f"topic {self.name} does not exist", target=self.name, fix=FIX)
        refused = [r for r in self.buffer if isinstance(self.refuse, set) and r.offset in self.refuse]
        self.durable.update(r.offset for r in self.buffer if r not in refused)
        self.buffer = []
        if refused:
            raise SinkRefused(f"topic {self.name} refused {len(refused)} record(s): MESSAGE_TOO_LARGE",
                              target=self.name, fix="raise max.message.bytes", records=refused)

    def close(self):
        self.closed = True


def config(**daemon):
    return parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                  "daemon": {"topics": [TOPIC], "flush_interval_ms": 3_600_000, "flush_max_records": 20,
                             "on_deserialize_error": "dlq", "sink_retry_backoff_ms": 10,
                             "sink_retry_backoff_max_ms": 40, **daemon},
                  "sink": {"type": "null"}})


def bad_at(*offsets):
    """A value deserializer failing on these offsets (their records become dead letters)."""
    bad = {b"v%d" % o for o in offsets}

    def deserialize(topic, headers, data):
        if data in bad:
            raise ValueError("not what the deserializer reads")
        return data
    return deserialize


def rig(total=100, *, dlq=True, value=None, **daemon):
    durable: set[int] = set()
    sink = Sink(durable)
    dead = Sink(durable, "dlq") if dlq else None
    consumer = Consumer(total, durable)
    identity = lambda t, h, b: b  # noqa: E731
    parts = PipelineParts(None, identity, value or identity, [], sink, dead,
                          make_sink=lambda: sink, make_dlq=(lambda: dead) if dlq else None)
    worker = Worker(config(**daemon), parts, consumer, lambda c, w: None)
    return worker, consumer, sink, dead


# -- the whole target refuses: stop, commit nothing more ------------------------------------------

@pytest.mark.parametrize("where", ["sink write", "sink flush", "dlq flush"])
def test_a_refusal_of_the_target_stops_delivery_and_nothing_more_is_committed(where):
    worker, consumer, sink, dead = rig(value=bad_at(25))
    worker.step()
    worker.step()                                   # 0..19 written, flushed and committed
    assert consumer.commits == [20]
    target = {"sink write": sink, "sink flush": sink, "dlq flush": dead}[where]
    worker.step()                                   # 20..29 (25 a dead letter) written, not flushed
    target.refuse = "all"
    with pytest.raises(SinkRefused, match="does not exist"):
        for _ in range(3):
            worker.step()
    assert worker.mode is Mode.STOPPED and consumer.paused
    assert consumer.commits == [20]
    # Neither a revocation nor the shutdown commits anything more, and the loop stops again.
    worker.on_partitions_revoked({TP})
    worker.flush_and_commit()
    with pytest.raises(SinkRefused):
        worker.step()
    assert consumer.commits == [20]


def test_run_exits_with_exit_sink_refused_and_one_line_naming_the_target_and_the_fix(caplog):
    worker, consumer, sink, dead = rig(value=bad_at(3))
    dead.refuse = "all"
    caplog.set_level(logging.WARNING)
    assert worker.run() == EXIT_SINK_REFUSED
    assert consumer.commits == [] and sink.closed and dead.closed
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in lines] == [
        f"worker stopping, refused for good: topic dlq does not exist (to fix: {FIX})"]


def test_a_refusal_in_the_flush_a_sigterm_asks_for_still_exits_with_it():
    worker, consumer, sink, dead = rig(value=bad_at(3))
    worker.step()                                   # 0..9 written (3 a dead letter), not flushed
    dead.refuse = "all"
    worker.request_stop()
    assert worker.run() == EXIT_SINK_REFUSED and consumer.commits == []


# -- preflight: before the first poll ------------------------------------------------------------

class Preflighted(Sink):
    def __init__(self, durable, answers):
        super().__init__(durable, "dlq")
        self.answers = list(answers)

    def preflight(self):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def test_a_refused_preflight_stops_the_worker_before_it_subscribes_or_polls():
    durable: set[int] = set()
    subscribed = []
    dead = Preflighted(durable, [SinkRefused("topic dlq does not exist", target="dlq", fix=FIX)])
    consumer = Consumer(10, durable)
    parts = PipelineParts(None, None, None, [], Sink(durable), dead)
    worker = Worker(config(), parts, consumer, lambda c, w: subscribed.append(c))
    assert worker.run() == EXIT_SINK_REFUSED
    assert not subscribed and consumer.timeouts == [] and consumer.commits == []


def test_a_preflight_nobody_answers_is_asked_again_said_once_then_consuming_starts(caplog):
    durable: set[int] = set()
    dead = Preflighted(durable, ["no broker answered", "no broker answered", None])
    consumer = Consumer(10, durable)
    parts = PipelineParts(None, lambda t, h, b: b, lambda t, h, b: b, [], Sink(durable), dead)
    ticks = []

    def tick(w):
        ticks.append(w.mode)
        if consumer.position >= 10:
            w.request_stop()

    worker = Worker(config(), parts, consumer, lambda c, w: None, on_tick=tick)
    caplog.set_level(logging.INFO, logger="kdaemon.worker.delivery")
    assert worker.run() == 0
    assert dead.answers == [] and ticks and consumer.commits == [10]
    said = [r.getMessage() for r in caplog.records if r.name == "kdaemon.worker.delivery"]
    assert len(said) == 2, said
    assert said[0].startswith("sink unavailable (the DLQ cannot be checked before consuming: no broker answered)")
    assert said[1].startswith("sink available again after")


# -- records refused for what they are --------------------------------------------------------------

def test_dead_letters_the_dlq_refuses_stop_the_worker_at_the_first_of_them():
    worker, consumer, sink, dead = rig(value=bad_at(5, 25, 27))
    worker.step()
    worker.step()                                   # 0..19 (5 a dead letter) written
    dead.refuse = {25, 27}                          # 25 and 27 too large for the DLQ topic
    with pytest.raises(WorkerStop, match=r"the DLQ refused 2 dead letter\(s\) for good \(t-0@25, t-0@27\)"):
        for _ in range(3):
            worker.step()
    # Everything before 25 is durable (flushed, or in the DLQ) and committed; nothing past it.
    assert consumer.commits == [25] and worker.mode is Mode.STOPPED
    worker.flush_and_commit()
    assert consumer.commits == [25]


@pytest.mark.parametrize("policy", ["dlq", "retry"])
def test_records_the_sinks_flush_refuses_go_to_the_dlq_and_the_partition_goes_on(policy):
    worker, consumer, sink, dead = rig(on_sink_error=policy)
    sink.refuse = {12, 33}
    for _ in range(10):
        worker.step()
    worker.flush_and_commit()
    assert worker.mode is Mode.RUNNING and consumer.commits[-1] == 100
    assert dead.durable >= set(range(100))
    assert worker.stats.dlq[(TP, "sink")] == 2


@pytest.mark.parametrize("policy,dlq", [("stop", True), ("retry", False)])
def test_records_the_sinks_flush_refuses_stop_the_worker_at_them_without_a_dlq_or_under_stop(policy, dlq):
    worker, consumer, sink, dead = rig(on_sink_error=policy, dlq=dlq)
    sink.refuse = {13}
    with pytest.raises(WorkerStop, match=r"the sink refused 1 record\(s\) for good \(t-0@13\)"):
        for _ in range(3):
            worker.step()
    assert consumer.commits == [13] and worker.mode is Mode.STOPPED


def test_records_a_write_refuses_follow_the_policy_as_records_refused_by_index():
    worker, consumer, sink, dead = rig(on_sink_error="dlq")
    real_write = sink.write

    def write(records):
        refused = [r for r in records if r.offset == 4]
        real_write([r for r in records if r.offset != 4])
        if refused:
            raise SinkRefused("a row the table refuses", target="out", fix="alter the table", records=refused)
    sink.write = write
    worker.step()
    worker.flush_and_commit()
    assert consumer.commits == [10] and worker.stats.dlq[(TP, "sink")] == 1


# -- the DLQ's probe -----------------------------------------------------------------------------------

class Probed(Sink):
    def __init__(self, durable, name="out"):
        super().__init__(durable, name)
        self.down: str | Exception | None = None

    def probe(self):
        if isinstance(self.down, Exception):
            raise self.down
        return self.down


class FlakyDlq(Probed):
    """A DLQ whose flush fails (and loses its buffer) while ``down`` says why."""

    def flush(self):
        if self.down is not None:
            self.buffer = []
            raise TimeoutError("no broker answered")
        super().flush()


def probed_rig():
    durable: set[int] = set()
    sink, dead = Probed(durable), FlakyDlq(durable, "dlq")
    built = []
    now = [0.0]
    consumer = Consumer(100, durable)
    identity = lambda t, h, b: b  # noqa: E731

    def make_sink():
        built.append(1)
        return sink
    parts = PipelineParts(None, identity, bad_at(25), [], sink, dead, make_sink=make_sink, make_dlq=lambda: dead)
    worker = Worker(config(sink_retry_backoff_ms=1000, sink_retry_backoff_max_ms=600_000, sink_probe_max_ms=2000),
                    parts, consumer, lambda c, w: None, clock=lambda: now[0])
    return worker, consumer, dead, built, now


def test_the_dlqs_probe_must_pass_too_before_an_early_retry():
    """The sink's probe passes at once (its directory is fine); the DLQ's says its cluster does
    not answer.  No early retry until both pass; then the next probe brings the retry, long
    before the backoff (here about 8 minutes) runs out."""
    worker, consumer, dead, built, now = probed_rig()
    worker.step()
    worker.step()
    worker.step()                                   # 0..29, a dead letter among them
    dead.down = "no broker answered"
    worker.delivery.backoff.failures = 9            # a stall that has lasted: the next wait is long
    worker.flush_and_commit()                       # the DLQ's flush fails: rewinding
    assert worker.mode is Mode.REWINDING and consumer.commits == [20]
    for t in range(2, 60, 2):
        now[0] = float(t)
        worker.step()
    assert worker.mode is Mode.REWINDING and not built
    dead.down = None
    now[0] = 62.0
    worker.step()                                   # both probes pass: rebuilt, read again, delivered
    assert worker.mode is Mode.RUNNING and built
    for _ in range(10):
        worker.step()
    worker.flush_and_commit()
    assert consumer.commits[-1] == 100


def test_a_probe_that_finds_the_dlq_topic_gone_stops_delivery():
    worker, consumer, dead, built, now = probed_rig()
    worker.step()
    worker.step()
    worker.step()
    dead.down = "no broker answered"
    worker.delivery.backoff.failures = 9
    worker.flush_and_commit()
    assert worker.mode is Mode.REWINDING
    dead.down = SinkRefused("topic dlq does not exist", target="dlq", fix=FIX)
    now[0] = 2.0                                    # the probe is due long before the retry
    with pytest.raises(SinkRefused):
        worker.step()
    assert worker.mode is Mode.STOPPED and consumer.commits == [20] and not built


def test_stop_codes():
    """WorkerStop and SinkRefused are the two ways a worker stops on its own."""
    from kdaemon.worker.pipeline import _stopped
    assert _stopped(WorkerStop("x")) == EXIT_STOPPED_ON_ERROR
    assert _stopped(SinkRefused("x", target="t", fix="f")) == EXIT_SINK_REFUSED
