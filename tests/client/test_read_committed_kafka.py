"""read_committed for real: transactions of two producers interleaved on Apache Kafka.

A confluent-kafka transactional producer (in this process, so a transaction can stay open while
something else happens) and the Java transactional producer write committed and aborted
transactions over three partitions at the same time: an aborted transaction of one encloses
committed ones of the other and the other way round.  kdaemon's ``Consumer`` must then return,
under read_committed, exactly what the Java ``KafkaConsumer`` returns (record for record, field
for field), under read_uncommitted everything (again equal to Java), and stop where Java stops:
at the last stable offset, past the final commit marker once every transaction is done, and
before an open transaction until it commits.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kdaemon.client import Consumer, TopicPartition
from testkit.parity import by_partition, drain_until, first_difference, read_to_end
from testkit.java_peer import JavaProduceOps, java_consume, java_offsets_for_times, java_produce
from testkit.produce import TIMEOUT, Writer, create_topic, produce, produce_transactions

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def _topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class TxnProducer:
    """confluent-kafka's transactional producer, driven step by step (begin, send, commit/abort)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.writer = Writer(bootstrap, topic, **{"transactional.id": f"rd-{uuid.uuid4().hex}"})
        self.producer = self.writer.producer
        self.producer.init_transactions(TIMEOUT)
        self.errors = self.writer.errors

    def begin(self) -> None:
        self.producer.begin_transaction()

    def send(self, partition: int, value: bytes, key: bytes | None = None,
             timestamp: int | None = None) -> None:
        self.writer.send(value, key, partition=partition, timestamp=timestamp)

    def flush(self) -> None:
        """Everything sent is on the log (an abort then leaves aborted records behind)."""
        assert self.writer.flush(TIMEOUT) == 0, "records still queued after the flush timeout"
        assert not self.errors, self.errors

    def commit(self) -> None:
        self.producer.commit_transaction(TIMEOUT)

    def abort(self) -> None:
        self.flush()
        self.producer.abort_transaction(TIMEOUT)


def _java_in_background(bootstrap: str, topic: str, ops: JavaProduceOps) -> tuple[threading.Thread, list]:
    out: list = []

    def run():
        try:
            out.append(java_produce(bootstrap, topic, ops, transactional_id=f"java-{uuid.uuid4().hex}"))
        except BaseException as exc:  # re-raised by the test after join()
            out.append(exc)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _java_transactions(run: str, outcomes: list[bool]) -> JavaProduceOps:
    ops = JavaProduceOps()
    for k, commit in enumerate(outcomes):
        ops.begin()
        for p in range(PARTITIONS):
            for i in range(2):
                ops.record(b"j%d" % i, b"java:%s:%d:%s:%d:%d" % (run.encode(), k, b"commit" if commit else b"abort",
                                                                 p, i), partition=p)
        ops.commit() if commit else ops.abort()
    return ops


def _enclose_java_run(bootstrap: str, topic: str, rd: TxnProducer, name: bytes, commit: bool,
                      java_ops: JavaProduceOps) -> None:
    """One confluent-kafka transaction open from before the Java producer's run until after it;
    records go into it while the Java transactions happen."""
    outcome = b"commit" if commit else b"abort"
    rd.begin()
    n = 0

    def send_round():
        nonlocal n
        for p in range(PARTITIONS):
            rd.send(p, b"rd:%s:%s:%d:%d" % (name, outcome, p, n))
        n += 1
        rd.flush()
    send_round()
    thread, out = _java_in_background(bootstrap, topic, java_ops)
    while thread.is_alive():
        send_round()
        thread.join(0.3)
    if isinstance(out[0], BaseException):
        raise out[0]
    assert all(a.error is None for a in out[0]), out[0]
    send_round()
    rd.commit() if commit else rd.abort()


def test_interleaved_transactions_match_java_in_both_isolation_levels(kafka):
    topic = _topic("rc")
    create_topic(kafka.bootstrap, topic, PARTITIONS)
    rd = TxnProducer(kafka.bootstrap, topic)
    # An aborted confluent-kafka transaction around committed and aborted Java ones, then a
    # committed one around more of both.
    _enclose_java_run(kafka.bootstrap, topic, rd, b"A", False, _java_transactions("1", [True, False, True, False, True]))
    _enclose_java_run(kafka.bootstrap, topic, rd, b"B", True, _java_transactions("2", [False, True, False, True]))
    # And produce_transactions' own producer: keyed records spread by the partitioner.
    produce_transactions(kafka.bootstrap, topic, [
        ([(b"k%d" % i, b"pt:%d:%s:%d" % (t, b"commit" if c else b"abort", i)) for i in range(9)], c)
        for t, c in enumerate([True, False, True])])

    parts = [(topic, p) for p in range(PARTITIONS)]
    rc = read_to_end(kafka.bootstrap, parts, isolation="read_committed")
    rc_java = java_consume(kafka.bootstrap, assign=parts, until_end=True, isolation="read_committed")
    assert first_difference(rc.records, rc_java.records) is None, first_difference(rc.records, rc_java.records)
    # Small fetches (an abort marker often in a later response than its transaction's records)
    # and few records per poll (positions inside batches) change nothing.
    rc_small = read_to_end(kafka.bootstrap, parts, isolation="read_committed", max_partition_fetch_bytes=300,
                           max_poll_records=5)
    assert first_difference(rc_small.records, rc_java.records) is None, first_difference(rc_small.records,
                                                                                         rc_java.records)
    assert rc_small.positions == rc.positions
    ru = read_to_end(kafka.bootstrap, parts, isolation="read_uncommitted")
    ru_java = java_consume(kafka.bootstrap, assign=parts, until_end=True, isolation="read_uncommitted")
    assert first_difference(ru.records, ru_java.records) is None, first_difference(ru.records, ru_java.records)

    # What each should be, from the values alone: read_committed is every committed record and
    # nothing else; read_uncommitted every record written (aborts were flushed first).
    assert rc.records and all(b":commit:" in r.value for r in rc.records)
    assert sorted(r.value for r in rc.records) == sorted(r.value for r in ru.records if b":commit:" in r.value)
    assert any(b":abort:" in r.value for r in ru.records)
    # The aborted range of one producer really encloses committed records of the other.
    assert _encloses(ru.records, b"rd:A:", b"java:1:", b":commit:")
    assert _encloses(ru.records, b"java:2:", b"rd:B:", b":commit:") or _encloses(
        ru.records, b"rd:B:", b"java:2:", b":abort:")

    # Positions: after the last commit marker, where the Java consumer stands too; the LSO has
    # caught up with the high watermark, and the lag is 0.
    for run, java in ((rc, rc_java), (ru, ru_java)):
        assert run.positions == java.positions() == run.end_offsets
        assert run.lags() == java.lags() == {tp: 0 for tp in parts}
    assert rc.end_offsets == ru.end_offsets
    for tp, m in rc.metrics.partitions.items():
        assert m.last_stable_offset == m.high_watermark == rc.end_offsets[tuple(tp)]
        assert m.records_lag == 0
    assert rc.metrics.control_records_total > 0 and rc.metrics.aborted_records_total > 0


def _encloses(records, outer: bytes, inner: bytes, inner_kind: bytes) -> bool:
    """Some partition has a record ``inner``...``inner_kind`` between two records of ``outer``."""
    for recs in by_partition(records).values():
        outer_offsets = [r.offset for r in recs if r.value.startswith(outer)]
        if not outer_offsets:
            continue
        lo, hi = min(outer_offsets), max(outer_offsets)
        if any(lo < r.offset < hi and r.value.startswith(inner) and inner_kind in r.value for r in recs):
            return True
    return False


def test_open_transaction_holds_read_committed_at_the_lso(kafka):
    """Partition 0 has an open transaction followed by plain records; partition 1 only plain ones.
    read_committed stops partition 0 at the LSO (the open transaction's first offset) with lag 0
    as kdaemon computes it, partition 1 reads to its end; the commit releases the rest."""
    topic = _topic("rc-open")
    create_topic(kafka.bootstrap, topic, 2)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    t0 = int(time.time() * 1000) - 60_000  # recent: Kafka refuses timestamps far in the future
    for p in (0, 1):
        produce(kafka.bootstrap, topic, [(None, b"before:%d:%d" % (p, i), (), t0 + i) for i in range(5)], partition=p)
    rd = TxnProducer(kafka.bootstrap, topic)
    rd.begin()
    for i in range(4):
        rd.send(0, b"open:%d" % i, timestamp=t0 + 100 + i)
    rd.flush()
    produce(kafka.bootstrap, topic, [(None, b"after:0:%d" % i, (), t0 + 200 + i) for i in range(3)], partition=0)
    produce(kafka.bootstrap, topic, [(None, b"after:1:%d" % i) for i in range(2)], partition=1)

    with Consumer(kafka.bootstrap, auto_offset_reset="earliest", isolation_level="read_committed",
                  fetch_max_wait_ms=100) as c, \
            Consumer(kafka.bootstrap, isolation_level="read_uncommitted") as ru:
        c.assign([tp0, tp1])
        lso = c.end_offsets([tp0, tp1])
        assert lso == {tp0: 5, tp1: 7}
        assert ru.end_offsets([tp0, tp1]) == {tp0: 12, tp1: 7}
        # A reset to the end lands on the LSO under read_committed, on the high watermark otherwise.
        ru.assign([tp0])
        ru.seek_to_end(tp0)
        assert ru.position(tp0) == 12
        with Consumer(kafka.bootstrap, auto_offset_reset="latest", isolation_level="read_committed") as latest:
            latest.assign([tp0])
            assert latest.position(tp0) == 5
        # Timestamp look-ups under read_committed only see offsets below the LSO, too.
        queries = [(topic, 0, ts) for ts in (0, t0 + 4, t0 + 101, t0 + 201)] + [(topic, 1, t0 + 4)]
        java_times, java_bounds = java_offsets_for_times(kafka.bootstrap, queries, isolation="read_committed")
        assert {(t, p): o for t, p, o in java_bounds["end"]} == {tuple(tp): o for tp, o in lso.items()}
        ours_times = []
        for t, p, ts in queries:
            a = c.offsets_for_times({TopicPartition(t, p): ts})[TopicPartition(t, p)]
            ours_times.append(None if a is None else (a.offset, a.timestamp))
        assert ours_times == [None if a["offset"] is None else (a["offset"], a["found_timestamp"])
                              for a in java_times]
        assert ours_times == [(0, t0), (4, t0 + 4), None, None, (4, t0 + 4)]

        held = drain_until(c, lambda: c.position(tp0) >= 5 and c.position(tp1) >= 7, what="the LSO")
        java_held = java_consume(kafka.bootstrap, assign=[(topic, 0), (topic, 1)], until_end=True,
                                 isolation="read_committed")
        assert first_difference(held, java_held.records) is None, first_difference(held, java_held.records)
        assert java_held.positions() == {(topic, 0): 5, (topic, 1): 7}
        assert java_held.lags() == {(topic, 0): 0, (topic, 1): 0}, "Java's lag counts to the LSO"
        # Held: more fetches come back and nothing past the LSO is returned.
        seen = c.metrics().fetch_responses_total
        more = drain_until(c, lambda: c.metrics().fetch_responses_total >= seen + 3, what="3 more fetches")
        assert more == []
        assert (c.position(tp0), c.position(tp1)) == (5, 7)
        m = c.metrics().partitions[tp0]
        assert (m.last_stable_offset, m.high_watermark, m.records_lag) == (5, 12, 0)
        assert c.metrics().partitions[tp1].records_lag == 0

        rd.commit()
        released = drain_until(c, lambda: c.position(tp0) >= 13, what="the commit marker")
        assert [r.value for r in released] == [b"open:%d" % i for i in range(4)] + [b"after:0:%d" % i for i in range(3)]
        assert c.end_offsets([tp0]) == {tp0: 13}
        assert c.offsets_for_times({tp0: t0 + 201})[tp0][:2] == (10, t0 + 201)
        m = c.metrics().partitions[tp0]
        assert (m.last_stable_offset, m.high_watermark, m.records_lag) == (13, 13, 0)
    java_all = java_consume(kafka.bootstrap, assign=[(topic, 0), (topic, 1)], until_end=True,
                            isolation="read_committed")
    assert first_difference(held + released, java_all.records) is None, first_difference(held + released,
                                                                                         java_all.records)
    assert java_all.positions() == {(topic, 0): 13, (topic, 1): 7}
