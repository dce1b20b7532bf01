"""The chaos run's idempotent producer survives a librdkafka failure, and ``reconcile`` recovers
from the log the records whose delivery reports went with the abandoned producer.

The failure is made on purpose (the first producer's ``poll`` raises the ``SystemError`` seen
in a full run) because a real one needs a long run of broker kills to happen; the records and
the log are real (Apache Kafka).
"""

from __future__ import annotations

import uuid

import pytest

from testkit.chaos import produce as _chaos_produce
from testkit.chaos.produce import KEPT, Ledger, PlainProducer, reconcile
from testkit.daemon import wait_for
from testkit.produce import create_topic, high_watermarks

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def test_a_replaced_producer_loses_no_record_of_the_ledger(kafka, monkeypatch):
    topic = f"chaos-producer-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    real_writer = _chaos_produce.Writer
    made = []

    def writer(*args, **kw):
        w = real_writer(*args, **kw)
        made.append(w)
        if len(made) == 1:   # the first producer fails once it has records in flight
            real_poll = w.poll

            def poll(timeout=0):
                if w.sent >= 300:
                    raise SystemError("_PyErr_SetObject: exception <class 'str'> is not a BaseException subclass")
                real_poll(timeout)

            def flush(timeout=0):   # as broken as poll: its reports never arrive
                raise SystemError("_PyErr_SetObject: exception <class 'str'> is not a BaseException subclass")
            w.poll, w.flush = poll, flush
        return w

    monkeypatch.setattr(_chaos_produce, "Writer", writer)
    ledger = Ledger()
    p = PlainProducer("t", kafka.bootstrap, topic, PARTITIONS, 1000, 2000.0, ledger, seed=1)
    p.start()
    p.join(120)
    assert not p.is_alive() and p.error is None, ledger.errors
    assert p.restarts == 1 and "SystemError" in p.incidents[0] and "flush failed too" in p.incidents[0]
    reported = len(ledger.fates)
    # The abandoned producer's records reach the log from its background thread, unreported.
    wait_for(lambda: sum(high_watermarks(kafka.bootstrap, topic, PARTITIONS).values()) >= 1000, 60,
             "every record on the log")
    added = reconcile(kafka.bootstrap, topic, PARTITIONS, ledger)
    # The first producer's unreported records are on the log: the ledger now has every record
    # there is, each once (Ledger.add reports a second report for the same place as an error).
    assert not ledger.errors
    assert added >= 1 and reported + added == len(ledger.fates) >= 1000
    assert len(ledger.fates) == sum(high_watermarks(kafka.bootstrap, topic, PARTITIONS).values())
    assert sum(1 for f in ledger.fates.values() if f == KEPT) > 0
