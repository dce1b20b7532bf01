"""The chaos run's input, and the ledger of what it put where.

Two confluent-kafka producers write at the same time, each to its own topic, while the brokers
are killed under them:

* ``lz4``: idempotent, ``acks=all``, lz4-compressed, no transactions;
* ``zstd``: transactional, zstd-compressed, transactions of ``TXN_RECORDS`` records of which
  about one in ``1 / ABORT_SHARE`` is aborted on purpose (half the records are here, so about
  5 % of all records end up inside aborted transactions).

Every record carries a ``route`` header: ``drop`` (about ``DROP_SHARE`` of them) is what the
daemon's header rule filters out, ``keep`` or no ``route`` header at all is kept.  The ledger
holds each record's exact (topic, partition, offset) from its delivery report together with its
fate: ``kept``, ``filtered`` or ``aborted``.  A transaction's records are flushed (their offsets
known) before it is committed or aborted; one whose commit failed in a way that needs an abort
is aborted and its records count as aborted, since that is what the log then says.  A delivery
error outside a transaction, or a fatal error of the transactional producer, leaves the ledger
unable to say what is on the log: the run records it as an error and fails rather than guessing.

The idempotent producer alone may fail and be replaced (``MAX_RESTARTS``): librdkafka has been
seen to raise ``SystemError`` from ``poll`` after some 80 broker and worker kills.  The reports
of the records it had in flight are lost then, so once the producers are done ``reconcile``
reads that topic back to its high watermark with librdkafka (no transactions there: the high
watermark is its end) and adds each record the ledger lacks with the fate its headers give.
The log is the truth the daemon reads too; the reports are the cross-check, and the figures
say how many records came from the log instead.
"""

from __future__ import annotations

import random
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from confluent_kafka import KafkaException

from testkit.produce import Writer, consume_all, high_watermarks

KEPT, FILTERED, ABORTED = "kept", "filtered", "aborted"
DROP_SHARE = 0.10
ABORT_SHARE = 0.10
TXN_RECORDS = 50
ROUTE = "route"
TIMEOUT_S = 120.0          # one commit/abort/flush may wait out a broker restart
# librdkafka logs every refused connection while a broker is down: critical only.
LOG_LEVEL = 2
MAX_RESTARTS = 3           # of the idempotent producer (see the module doc)
HEADER_RULE = {"header": ROUTE, "op": "equals", "value": "drop", "action": "drop"}


@dataclass
class Ledger:
    """(topic, partition, offset) -> fate, filled from delivery reports by both producers."""

    fates: dict[tuple[str, int, int], str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, where: tuple[str, int, int], fate: str) -> None:
        with self.lock:
            if where in self.fates:
                self.errors.append(f"two delivery reports for {where}")
            self.fates[where] = fate

    def counts(self) -> Counter:
        with self.lock:
            return Counter(self.fates.values())


def _headers(rng: random.Random, i: int) -> list[tuple[str, bytes]]:
    route = rng.random()
    headers = [("seq", str(i).encode())]
    if route < DROP_SHARE:
        headers.append((ROUTE, b"drop"))
    elif route < 0.8:
        headers.append((ROUTE, b"keep"))
    return headers   # the rest: no route header, kept by the rule's "auto" default


def _fate(headers) -> str:
    return FILTERED if (ROUTE, b"drop") in headers else KEPT


class ProducerThread(threading.Thread):
    """Writes ``count`` records at ``rate`` per second over ``partitions`` partitions."""

    def __init__(self, name: str, bootstrap: str, topic: str, partitions: int, count: int,
                 rate: float, ledger: Ledger, *, seed: int) -> None:
        super().__init__(name=f"chaos-producer-{name}", daemon=True)
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.count, self.rate, self.ledger = count, rate, ledger
        self.rng = random.Random(seed)
        self.sent = 0
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.produce()
        except BaseException as exc:   # reported by the run, which fails
            self.error = exc
            self.ledger.errors.append(f"{self.name}: {exc!r}\n{traceback.format_exc()}")

    def _due(self, started: float) -> int:
        return min(self.count, int((time.monotonic() - started) * self.rate) + 1)

    def _send(self, writer: Writer, on_delivered) -> None:
        i = self.sent
        headers = _headers(self.rng, i)
        writer.send(f"{self.topic}#{i:08d}".encode(), str(i).encode(), partition=i % self.partitions,
                    headers=headers, on_delivered=lambda msg, h=headers: on_delivered(msg, h))
        self.sent += 1

    def produce(self) -> None:
        raise NotImplementedError


class PlainProducer(ProducerThread):
    """Idempotent, acks=all, lz4: every delivery report is final.  If librdkafka fails under it,
    a new producer goes on (``restarts``, ``incidents``) and the topic needs ``reconcile``."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.restarts = 0
        self.incidents: list[str] = []

    def _writer(self) -> Writer:
        return Writer(self.bootstrap, self.topic, "lz4",
                      **{"acks": "all", "enable.idempotence": True, "linger.ms": 20,
                         "message.timeout.ms": 300_000, "log_level": LOG_LEVEL})

    def produce(self) -> None:
        writer = self._writer()

        def delivered(msg, headers) -> None:
            self.ledger.add((msg.topic(), msg.partition(), msg.offset()), _fate(headers))

        started = time.monotonic()
        while self.sent < self.count and not self.halt.is_set():
            try:
                due = self._due(started)
                while self.sent < due:
                    self._send(writer, delivered)
                writer.poll(0.05)
            except Exception as exc:
                if self.restarts >= MAX_RESTARTS:
                    raise
                self.restarts += 1
                self.incidents.append(f"{type(exc).__name__}: {exc} (after {self.sent} sends)\n"
                                      f"{traceback.format_exc()}")
                # Let the old producer finish what it has in flight (so that it is on the log,
                # or not, before ``reconcile`` reads it); its reports are not trusted any more.
                try:
                    left = writer.flush(TIMEOUT_S)
                    self.incidents[-1] += f"\nthe abandoned producer's flush left {left} record(s)"
                except Exception as again:
                    self.incidents[-1] += f"\nthe abandoned producer's flush failed too: {again!r}"
                writer = self._writer()
        left = writer.flush(TIMEOUT_S * 2)
        if left or writer.errors:
            raise RuntimeError(f"{left} record(s) undelivered, delivery errors {writer.errors[:5]}: "
                               "what is on the log is unknown")


class TransactionalProducer(ProducerThread):
    """Transactional, zstd: committed transactions and, about ABORT_SHARE of them, aborted ones."""

    def __init__(self, *args, transactional_id: str, **kw) -> None:
        super().__init__(*args, **kw)
        self.transactional_id = transactional_id
        self.aborted_on_purpose = 0
        self.aborted_by_error = 0
        self.commit_retries = 0

    def produce(self) -> None:
        writer = Writer(self.bootstrap, self.topic, "zstd",
                        **{"transactional.id": self.transactional_id, "linger.ms": 20,
                           "transaction.timeout.ms": 180_000, "message.timeout.ms": 170_000,
                           "log_level": LOG_LEVEL})
        producer = writer.producer
        producer.init_transactions(TIMEOUT_S)
        started = time.monotonic()
        while self.sent < self.count and not self.halt.is_set():
            while self.sent >= self._due(started) and not self.halt.is_set():
                time.sleep(0.02)
            n = min(TXN_RECORDS, self.count - self.sent)
            self.transaction(writer, n, commit=self.rng.random() >= ABORT_SHARE)

    def transaction(self, writer: Writer, n: int, commit: bool) -> None:
        producer = writer.producer
        reports: list[tuple[tuple[str, int, int], str]] = []
        failed: list[str] = []

        def delivered(msg, headers) -> None:
            reports.append(((msg.topic(), msg.partition(), msg.offset()), _fate(headers)))

        before = len(writer.errors)
        producer.begin_transaction()
        for _ in range(n):
            self._send(writer, delivered)
        left = producer.flush(TIMEOUT_S)
        failed = writer.errors[before:]
        if left or failed:
            commit = False    # a record of it was not written: the transaction must go
            self.aborted_by_error += 1
        elif not commit:
            self.aborted_on_purpose += 1
        if commit:
            commit = self._commit(producer)
        if not commit:
            self._abort(producer)
        for where, fate in reports:
            self.ledger.add(where, fate if commit else ABORTED)

    def _commit(self, producer) -> bool:
        """True once committed; False when the transaction has to be aborted instead."""
        while True:
            try:
                producer.commit_transaction(TIMEOUT_S)
                return True
            except KafkaException as exc:
                err = exc.args[0]
                if err.retriable():
                    self.commit_retries += 1
                    continue
                if err.txn_requires_abort():
                    self.aborted_by_error += 1
                    return False
                raise

    def _abort(self, producer) -> None:
        while True:
            try:
                producer.abort_transaction(TIMEOUT_S)
                return
            except KafkaException as exc:
                if exc.args[0].retriable():
                    continue
                raise


def reconcile(bootstrap: str, topic: str, partitions: int, ledger: Ledger) -> int:
    """Add to the ledger every record of ``topic`` (a topic without transactions) it lacks,
    read back to the high watermark; return how many were added."""
    ends = high_watermarks(bootstrap, topic, partitions)
    added = 0
    for p in range(partitions):
        for r in consume_all(bootstrap, topic, p, 0, ends[p], timeout=600):
            where = (topic, p, r.offset)
            if where not in ledger.fates:
                ledger.add(where, _fate([(k, v) for k, v in r.headers]))
                added += 1
    return added
