"""kdaemon/worker/modes.py and delivery.py: the delivery modes are one table, and the worker's
recovery from sink failures follows it.

The table is checked against the transitions written out here (a change to it must change this
test too), every pair outside it must raise, and a real ``Delivery`` is driven through the
retry and rewind paths with the scripted one-partition consumer of testkit/pipeline.py
(which checks every commit against what was durable) and a sink whose failures the test
switches on and off (the faults a real sink cannot be made to produce on
demand).
"""

from __future__ import annotations

import itertools

import pytest

from kdaemon.config import parse
from kdaemon.worker.build import PipelineParts
from kdaemon.worker.modes import (PAUSED_MODES, TRANSITIONS, DeliveryModes, Event,
                                     IllegalDeliveryTransition, Mode)
from kdaemon.worker.pipeline import Worker
from testkit.pipeline import TOPIC, TP, ScriptedConsumer

M, E = Mode, Event

EXPECTED = {
    (M.RUNNING, E.FLUSH_STARTED): M.FLUSHING,
    (M.FLUSHING, E.FLUSH_CONFIRMED): M.RUNNING,
    (M.RUNNING, E.FLUSH_FAILED): M.REWINDING,
    (M.FLUSHING, E.FLUSH_FAILED): M.REWINDING,
    (M.RUNNING, E.WRITE_FAILED): M.RETRYING,
    (M.RETRYING, E.WRITE_FAILED): M.RETRYING,
    (M.RETRYING, E.WRITE_RETRIED): M.RUNNING,
    (M.REWINDING, E.REBUILD_FAILED): M.REWINDING,
    (M.REWINDING, E.REWOUND): M.RUNNING,
    (M.FLUSHING, E.FLUSH_HELD): M.STALLED,
    (M.STALLED, E.FLUSH_RESENT): M.RESENDING,
    (M.RESENDING, E.FLUSH_CONFIRMED): M.RUNNING,
    (M.RESENDING, E.FLUSH_HELD): M.STALLED,
    (M.RESENDING, E.FLUSH_FAILED): M.REWINDING,
    (M.STALLED, E.FLUSH_FAILED): M.REWINDING,
    (M.FLUSHING, E.BUFFER_FULL): M.FULL,
    (M.FULL, E.FLUSH_CONFIRMED): M.RUNNING,
    (M.FULL, E.FLUSH_FAILED): M.REWINDING,
    (M.FULL, E.FLUSH_HELD): M.STALLED,
    # A permanent refusal ends delivery from anywhere, and nothing leaves STOPPED.
    **{(m, E.REFUSED): M.STOPPED for m in (M.RUNNING, M.FLUSHING, M.RETRYING, M.REWINDING, M.STALLED,
                                           M.RESENDING, M.FULL)},
}


def test_the_table_is_the_documented_one():
    assert TRANSITIONS == EXPECTED
    assert PAUSED_MODES == {M.RETRYING, M.REWINDING, M.STALLED, M.RESENDING, M.FULL, M.STOPPED}


@pytest.mark.parametrize(("mode", "event"), sorted(EXPECTED, key=lambda k: (k[0].value, k[1].value)),
                         ids=lambda v: v.value)
def test_every_legal_transition(mode, event):
    modes = DeliveryModes(mode)
    assert modes.apply(event) is EXPECTED[(mode, event)]
    assert modes.mode is EXPECTED[(mode, event)]


ILLEGAL = [(m, e) for m, e in itertools.product(Mode, Event) if (m, e) not in EXPECTED]


@pytest.mark.parametrize(("mode", "event"), ILLEGAL, ids=lambda v: v.value)
def test_every_other_pair_raises(mode, event):
    modes = DeliveryModes(mode)
    with pytest.raises(IllegalDeliveryTransition,
                       match=f"delivery cannot handle {event.value} in mode {mode.value}"):
        modes.apply(event)
    assert modes.mode is mode   # unchanged


def test_illegal_pairs_exist_for_every_mode():
    # e.g. a rewind cannot start while a batch is held: RETRYING has no FLUSH_FAILED.
    assert (M.RETRYING, E.FLUSH_FAILED) in ILLEGAL
    assert {m for m, _ in ILLEGAL} == set(Mode)


# -- a real Delivery through the recovery paths ----------------------------------------------------

class SwitchedSink:
    """Keeps what it was given; ``faults["write"]``/``faults["flush"]`` make the next calls
    raise.  A failed flush loses the buffer, as a sink whose process died would.  ``store``
    lists what was made durable, in order; ``durable`` is the set the consumer checks commits
    against."""

    def __init__(self, store: list[int], durable: set[int], faults: dict) -> None:
        self.durable = durable
        self.store = store
        self.faults = faults
        self.buffer: list[int] = []
        self.closed = False

    def write(self, records):
        assert not self.closed
        if self.faults.get("write"):
            raise ConnectionError("sink unreachable")
        self.buffer.extend(r.offset for r in records)

    def flush(self):
        if self.faults.get("flush"):
            self.buffer = []
            raise ConnectionError("flush failed")
        self.store.extend(self.buffer)
        self.durable.update(self.buffer)
        self.buffer = []

    def close(self):
        self.closed = True


@pytest.fixture
def rig():
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "flush_interval_ms": 3_600_000, "flush_max_records": 20,
                               "on_deserialize_error": "skip",
                               "sink_retry_backoff_ms": 1000, "sink_retry_backoff_max_ms": 4000},
                    "sink": {"type": "null"}})
    store: list[int] = []
    durable: set[int] = set()
    faults: dict = {}
    built: list[SwitchedSink] = []
    now = [0.0]

    def make_sink():
        if faults.get("build"):
            raise ConnectionError("cannot build the sink")
        built.append(SwitchedSink(store, durable, faults))
        return built[-1]

    def build(total: int):
        consumer = ScriptedConsumer(total, durable)
        identity = lambda t, h, b: b  # noqa: E731
        parts = PipelineParts(None, identity, identity, [], make_sink(), None, make_sink=make_sink)
        return Worker(config, parts, consumer, lambda c, w: None, clock=lambda: now[0]), consumer

    return build, store, faults, built, now


def test_a_failed_write_holds_the_batch_with_growing_backoff_then_delivers_it(rig):
    build, store, faults, built, now = rig
    worker, consumer = build(100)
    worker.step()
    worker.step()                             # 0..19 written, flushed (flush_max_records) and committed
    assert consumer.commits == [20] and store == list(range(20))
    faults["write"] = True
    worker.step()                             # 20..29 refused: held, partitions paused
    assert worker.mode is M.RETRYING and consumer.paused and consumer.position == 30
    assert worker.delivery.backoff.delay() == 1.0
    now[0] = 0.5
    worker.step()                             # before the backoff: not tried again
    assert worker.stats.sink_errors == 1
    now[0] = 1.0
    worker.step()                             # tried, failed again: the wait doubles
    assert worker.mode is M.RETRYING and worker.stats.sink_errors == 2
    assert worker.delivery.backoff.delay() == 2.0
    now[0] = 2.9
    worker.step()
    assert worker.stats.sink_errors == 2      # 1.0 + 2.0 not yet reached
    faults["write"] = False
    now[0] = 3.0
    worker.step()                             # the held batch goes through, is flushed and committed
    assert worker.mode is M.RUNNING and not consumer.paused
    assert worker.delivery.backoff.failures == 0
    assert consumer.commits == [20, 30] and store == list(range(30))
    # The same step went on consuming: the next batch is in the sink, not lost.
    assert consumer.position == 40
    for _ in range(10):
        worker.step()
    worker.flush_and_commit()
    assert store == list(range(100)) and consumer.commits[-1] == 100


def test_a_failed_flush_rewinds_to_the_last_commit(rig):
    build, store, faults, built, now = rig
    worker, consumer = build(100)
    worker.step()
    worker.step()                             # 0..19 committed
    worker.step()                             # 20..29 in the sink, not flushed
    faults["flush"] = True
    worker.step()                             # 30..39 written; the flush fails and loses 20..39
    assert worker.mode is M.REWINDING and consumer.paused and built[0].closed
    assert consumer.commits == [20]
    worker.on_partitions_revoked({TP})        # nothing durable to commit while rewinding
    assert consumer.commits == [20]
    worker.on_partitions_assigned({TP})
    faults["flush"] = False
    faults["build"] = True
    now[0] = 1.0                              # the first wait (1 s) is over; the rebuild fails
    worker.step()
    assert worker.mode is M.REWINDING and len(built) == 1
    assert worker.delivery.backoff.delay() == 2.0
    faults["build"] = False
    now[0] = 2.9
    worker.step()
    assert worker.mode is M.REWINDING        # waiting the doubled delay
    now[0] = 3.0
    worker.step()                             # rebuilt, sought back to 20, consuming again
    assert worker.mode is M.RUNNING and len(built) == 2 and not consumer.paused
    for _ in range(20):
        worker.step()
    worker.flush_and_commit()
    assert store == list(range(100)) and consumer.commits[-1] == 100


class ProbedSwitchedSink(SwitchedSink):
    """A SwitchedSink with ``probe()``: the sink is back exactly when writes stop failing."""

    probes = 0

    def probe(self):
        ProbedSwitchedSink.probes += 1
        return "the directory is read-only" if self.faults.get("write") else None


def test_a_held_batch_goes_through_at_the_first_probe_after_the_sink_is_back(caplog):
    """A long backoff (here up to ten minutes) does not delay recovery: the probe (every 2 s at
    most) finds the sink back and the held batch is written at once.  While down, the write
    itself is tried only as the backoff allows, and the log says it once plus a minute's
    summary."""
    import logging
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": [TOPIC], "flush_interval_ms": 3_600_000, "flush_max_records": 20,
                               "on_deserialize_error": "skip", "sink_retry_backoff_ms": 1000,
                               "sink_retry_backoff_max_ms": 600_000, "sink_probe_max_ms": 2000},
                    "sink": {"type": "null"}})
    store: list[int] = []
    durable: set[int] = set()
    faults: dict = {}
    now = [0.0]
    ProbedSwitchedSink.probes = 0
    consumer = ScriptedConsumer(60, durable)
    identity = lambda t, h, b: b  # noqa: E731
    parts = PipelineParts(None, identity, identity, [], ProbedSwitchedSink(store, durable, faults), None,
                          make_sink=lambda: ProbedSwitchedSink(store, durable, faults))
    worker = Worker(config, parts, consumer, lambda c, w: None, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="kdaemon.worker.delivery")
    worker.step()
    worker.step()                             # 0..19 committed
    faults["write"] = True
    worker.step()                             # 20..29 refused: held
    for t in range(1, 181):                   # three minutes down
        now[0] = float(t)
        worker.step()
    assert worker.mode is M.RETRYING and consumer.position == 30
    assert worker.stats.sink_errors <= 9      # 1, 2, 4, ... 128 s: eight tries in three minutes
    assert 80 <= ProbedSwitchedSink.probes <= 100
    lines = [r.getMessage() for r in caplog.records if r.name == "kdaemon.worker.delivery"]
    assert lines[0].startswith("sink unavailable (write failed: ConnectionError: sink unreachable)")
    assert [line.split(" (")[0] for line in lines[1:]] == [
        f"sink still unavailable after {m}m00s" for m in (1, 2, 3)]   # the start, a summary a minute
    faults["write"] = False
    now[0] = 182.0
    worker.step()
    assert worker.mode is M.RUNNING and consumer.commits[-1] >= 30 and 29 in store
    for _ in range(10):
        worker.step()
    worker.flush_and_commit()
    assert store == list(range(60)) and consumer.commits[-1] == 60
