"""Write and read test data with confluent-kafka (librdkafka), the reference client.

Records go in as dicts or tuples and come back as ``ConsumedRecord``s, plain data for golden
comparisons against kdaemon's own decoder.  Every helper raises on the first error instead of
returning a partial result, and every wait is bounded.

``Writer`` is the one confluent producer with a delivery callback that the tests and the
benchmarks (bench/) use: a test that writes as it goes (numbered records between faults, at a
rate, inside a transaction) keeps a Writer; one that writes a list at once calls ``produce``.

Reading: Tansu reports a high watermark of last batch base offset + 1, so ``consume_all`` stops
on known offsets or a known count, never on the watermark.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_LOG_APPEND_TIME, TIMESTAMP_NOT_AVAILABLE
from confluent_kafka.admin import AdminClient, NewTopic

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
TIMEOUT = 30.0
# Large enough for the 1 MB records the tests write (librdkafka's default is 1,000,000 bytes).
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024

TIMESTAMP_TYPES = {TIMESTAMP_NOT_AVAILABLE: "not_available", TIMESTAMP_CREATE_TIME: "create_time",
                   TIMESTAMP_LOG_APPEND_TIME: "log_append_time"}

Header = tuple[str, "bytes | None"]


@dataclass(frozen=True)
class Record:
    """One record to produce.  ``timestamp`` is milliseconds since the epoch (None: now)."""

    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None

    @classmethod
    def of(cls, r: "Record | Mapping | Sequence") -> "Record":
        """Accept a Record, a dict with key/value/headers/timestamp, or a tuple in that order."""
        if isinstance(r, Record):
            return r
        if isinstance(r, Mapping):
            unknown = set(r) - {"key", "value", "headers", "timestamp"}
            if unknown:
                raise ValueError(f"unknown record fields {sorted(unknown)}; "
                                 "use key, value, headers, timestamp")
            r = (r.get("key"), r.get("value"), r.get("headers") or (), r.get("timestamp"))
        if not 1 <= len(r) <= 4:
            raise ValueError(f"a record tuple is (key, value[, headers[, timestamp]]), got {r!r}")
        key, value, headers, timestamp = (tuple(r) + (None, None, (), None)[len(r):])
        return cls(key, value, tuple((str(k), v) for k, v in headers or ()), timestamp)


@dataclass(frozen=True)
class Delivered:
    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class ConsumedRecord:
    """What librdkafka returned for one record.  ``headers`` is [] when the record has none."""

    offset: int
    timestamp_type: str  # one of TIMESTAMP_TYPES' values
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[Header]


class ProduceError(RuntimeError):
    pass


def create_topic(bootstrap: str, name: str, partitions: int = 1, *, replication: int = 1,
                 config: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> None:
    """Create a topic and wait until the broker's metadata shows all its partitions."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, num_partitions=partitions, replication_factor=replication,
                     config=dict(config or {}))
    admin.create_topics([topic], request_timeout=timeout)[name].result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(topic=name, timeout=timeout).topics.get(name)
        if md is not None and md.error is None and len(md.partitions) == partitions:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name!r} created but its metadata did not show "
                               f"{partitions} partition(s) within {timeout} s: {md}")
        time.sleep(0.1)


def producer_config(bootstrap: str, compression: str = "none", **conf) -> dict:
    if compression not in CODECS:
        raise ValueError(f"compression {compression!r} is not one of {CODECS}")
    return {"bootstrap.servers": bootstrap, "compression.type": compression,
            "message.max.bytes": _MAX_MESSAGE_BYTES, **conf}


class Writer:
    """One confluent-kafka producer writing to ``topic``, and what its delivery reports said.

    ``send`` queues a record (waiting through a full local queue) and serves delivery reports
    now and then; ``flush`` waits for the rest.  Reports are kept as counts and end offsets per
    partition (cheap, for a million records), failures in ``errors`` (text) and ``failures``
    (the KafkaErrors); ``on_delivered(msg)``, for the writer or one ``send``, sees each record
    that arrived.  Reports are served by ``send``, ``poll`` and ``flush`` in the calling thread.
    ``producer`` is the confluent Producer itself (transactions, say).
    """

    POLL_EVERY = 1000   # sends between serving delivery reports

    def __init__(self, bootstrap: str, topic: str, compression: str = "none", *,
                 on_delivered: Callable | None = None, **conf) -> None:
        self.producer = Producer(producer_config(bootstrap, compression, **conf))
        self.topic = topic
        self.on_delivered = on_delivered
        self.sent = 0
        self.counts: dict[int, int] = {}   # records delivered, per partition
        self.ends: dict[int, int] = {}     # highest offset delivered + 1, per partition
        self.errors: list[str] = []
        self.failures: list[KafkaError] = []

    def send(self, value: bytes | None = None, key: bytes | None = None, *, partition: int | None = None,
             headers: Sequence[Header] | None = None, timestamp: int | None = None,
             on_delivered: Callable | None = None) -> None:
        kw = {}
        if partition is not None:
            kw["partition"] = partition
        if headers:
            kw["headers"] = list(headers)
        if timestamp is not None:
            kw["timestamp"] = timestamp
        report = self._report if on_delivered is None else (lambda err, msg: self._report(err, msg, on_delivered))
        while True:
            try:
                self.producer.produce(self.topic, value, key, on_delivery=report, **kw)
                break
            except BufferError:  # local queue full: let deliveries drain it
                self.producer.poll(0.1)
        self.sent += 1
        if self.sent % self.POLL_EVERY == 0:
            self.producer.poll(0)

    def _report(self, err, msg, then: Callable | None = None) -> None:
        if err is not None:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err}")
            self.failures.append(err)
            return
        p = msg.partition()
        self.counts[p] = self.counts.get(p, 0) + 1
        self.ends[p] = max(self.ends.get(p, 0), msg.offset() + 1)
        if self.on_delivered is not None:
            self.on_delivered(msg)
        if then is not None:
            then(msg)

    def poll(self, timeout: float = 0) -> None:
        """Serve the delivery reports that have arrived (waiting up to ``timeout`` for one)."""
        self.producer.poll(timeout)

    def flush(self, timeout: float = TIMEOUT) -> int:
        """Wait for every report; the number of records still queued after ``timeout``."""
        return self.producer.flush(timeout)

    def flush_checked(self, timeout: float = TIMEOUT) -> None:
        """Flush, then raise ProduceError unless every record sent was delivered."""
        left = self.flush(timeout)
        if left:
            raise ProduceError(f"{left} of {self.sent} record(s) to {self.topic!r} still queued after "
                               f"{timeout} s; is the broker at the bootstrap address up?")
        if self.errors:
            raise ProduceError(f"delivery to {self.topic!r} failed for {len(self.errors)} of {self.sent} "
                               f"record(s): " + "; ".join(self.errors[:5]))


def paced(items: Iterable, rate: float | None, every: int = 500) -> Iterator:
    """``items`` no faster than ``rate`` per second (checked every ``every`` items); all at once
    without a rate."""
    if rate is None:
        yield from items
        return
    started = time.monotonic()
    for n, item in enumerate(items):
        if n % every == 0:
            ahead = n / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        yield item


def produce(bootstrap: str, topic: str, records: Iterable, compression: str = "none",
            partition: int | None = None, **conf) -> list[Delivered]:
    """Produce ``records`` in order, flush, and return their delivery reports in the same order.

    Extra librdkafka settings go in ``conf`` (``**{"linger.ms": 100}``).  Raises ProduceError if
    any record was not delivered.
    """
    return write_all(Writer(bootstrap, topic, compression, **conf), records, partition)


def produce_transactions(bootstrap: str, topic: str, transactions: Iterable[tuple[Iterable, bool]],
                         compression: str = "none", partition: int | None = None,
                         transactional_id: str | None = None, **conf) -> list[list[Delivered]]:
    """Run one transaction per ``(records, commit)`` pair, in order, from one producer.

    Each transaction is flushed before it is committed or aborted: librdkafka drops what is
    still queued when a transaction aborts, and the test wants aborted records on the log.
    """
    writer = Writer(bootstrap, topic, compression,
                    **{"transactional.id": transactional_id or f"kdaemon-tests-{uuid.uuid4().hex}", **conf})
    producer = writer.producer
    producer.init_transactions(TIMEOUT)
    reports = []
    for records, commit in transactions:
        producer.begin_transaction()
        reports.append(write_all(writer, records, partition))
        if commit:
            producer.commit_transaction(TIMEOUT)
        else:
            producer.abort_transaction(TIMEOUT)
    return reports


def produce_transactional(bootstrap: str, topic: str, committed: Iterable = (),
                          aborted: Iterable = (), **kw) -> dict[str, list[Delivered]]:
    """An aborted transaction, then a committed one; their delivery reports by name."""
    aborted_reports, committed_reports = produce_transactions(
        bootstrap, topic, [(aborted, False), (committed, True)], **kw)
    return {"aborted": aborted_reports, "committed": committed_reports}


def write_all(writer: Writer, records: Iterable, partition: int | None = None) -> list[Delivered]:
    """``produce`` through a Writer the caller keeps (in its open transaction, say): the delivery
    reports of ``records`` in order once flushed; ProduceError if any was not delivered."""
    records = [Record.of(r) for r in records]
    reports: list[Delivered | None] = [None] * len(records)
    errors_before = len(writer.errors)

    def at(i):
        def delivered(msg):
            reports[i] = Delivered(msg.topic(), msg.partition(), msg.offset())
        return delivered

    for i, r in enumerate(records):
        writer.send(r.value, r.key, partition=partition, headers=r.headers, timestamp=r.timestamp,
                    on_delivered=at(i))
    left = writer.flush(TIMEOUT)
    if left:
        raise ProduceError(f"{left} of {len(records)} record(s) to {writer.topic!r} still queued after "
                           f"{TIMEOUT} s; is the broker at the bootstrap address up?")
    errors = writer.errors[errors_before:]
    if errors or None in reports:
        raise ProduceError(f"delivery to {writer.topic!r} failed: " + "; ".join(errors))
    return reports


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int,
                      timeout: float = 15) -> dict[int, int]:
    """The group's committed offsets as librdkafka reads them (OffsetFetch; it never joins the
    group): partition -> offset, negative (librdkafka's OFFSET_INVALID) where nothing is committed."""
    from confluent_kafka import KafkaError, KafkaException
    # Right after a broker starts, the group's coordinator may not be ready yet: librdkafka then
    # raises NOT_COORDINATOR (or COORDINATOR_LOAD_IN_PROGRESS) at once instead of waiting.
    transient = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                 KafkaError.COORDINATOR_NOT_AVAILABLE}
    deadline = time.monotonic() + timeout
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        while True:
            try:
                got = consumer.committed([TopicPartition(topic, p) for p in range(partitions)],
                                         timeout=max(0.1, deadline - time.monotonic()))
                break
            except KafkaException as exc:
                if exc.args[0].code() not in transient or time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got}


def high_watermarks(bootstrap: str, topic: str, partitions: int, timeout: float = TIMEOUT) -> dict[int, int]:
    """Each partition's high watermark as librdkafka reads it (ListOffsets): the end of a
    topic nobody writes to any more and that holds no open transaction."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kdaemon-tests-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                for p in range(partitions)}
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, partition: int = 0, start: int = 0,
                end: int | None = None, *, count: int | None = None,
                isolation_level: str = "read_committed", timeout: float = TIMEOUT,
                **conf) -> list[ConsumedRecord]:
    """Read records from ``start``; stop at ``end`` (exclusive offset) or after ``count`` records.

    At least one of ``end`` and ``count`` is required: the broker's high watermark is not a
    reliable end (see the module doc).  With ``end``, reading stops once the consumer's position
    reaches it, so an end that falls on a control record or an aborted record is fine.
    ``isolation_level`` defaults to librdkafka's own default, read_committed.
    Raises TimeoutError if the records are not all there within ``timeout`` seconds.
    """
    if end is None and count is None:
        raise ValueError("give end or count: the high watermark cannot say when to stop")
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"kdaemon-tests-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.auto.offset.store": False,
        "isolation.level": isolation_level, "check.crcs": True,
        **conf})
    tp = TopicPartition(topic, partition, start)
    out: list[ConsumedRecord] = []
    try:
        consumer.assign([tp])
        deadline = time.monotonic() + timeout
        while not _done(consumer, tp, out, end, count):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"read {len(out)} record(s) of {topic}[{partition}] from offset {start} in "
                    f"{timeout} s, wanted end={end} count={count}; last offset "
                    f"{out[-1].offset if out else None}")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            if end is not None and msg.offset() >= end:
                continue
            ts_type, ts = msg.timestamp()
            out.append(ConsumedRecord(msg.offset(), TIMESTAMP_TYPES[ts_type], ts, msg.key(),
                                      msg.value(), list(msg.headers() or [])))
    finally:
        consumer.close()
    return out


def _done(consumer: Consumer, tp: TopicPartition, out: list, end: int | None,
          count: int | None) -> bool:
    if count is not None and len(out) >= count:
        return True
    if end is not None:
        if out and out[-1].offset >= end - 1:
            return True
        position = consumer.position([TopicPartition(tp.topic, tp.partition)])[0].offset
        return position >= end
    return False
