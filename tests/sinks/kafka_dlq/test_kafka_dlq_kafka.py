"""The Kafka dead-letter queue on Apache Kafka 4.4 (a cluster of this module's own: its broker
is killed and restarted).

* What kdaemon's producer writes, confluent-kafka reads as written: keys (and none), null
  values, headers (a null one too), timestamps, under every codec.
* An append whose answer never reaches the producer (a proxy closes the connection instead of
  passing the answer on): the retry carries the same producer id, epoch and sequence, and Kafka
  takes it as the duplicate it is.  The records are in the topic once.
* ``kdaemon run`` with ``[dlq] type = "kafka"`` and the json deserializer, on a topic where
  every tenth value is not JSON: the broker is killed and restarted while records keep coming
  and while a DLQ flush waits for the answer to a batch the broker appended (a proxy in front
  of the DLQ's producer holds that answer back, then drops it).
  Then every bad record is in the DLQ topic exactly once, with its key, value, headers and
  timestamp and Kafka Connect's error headers; every good one reached the jsonl output once; the
  group committed the end of every partition.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.producer import Producer, ProducerSettings
from kdaemon.protocol.apis import PRODUCE
from testkit.daemon import Daemon, daemon_config, wait_for
from tests.client.readback import read_topic
from testkit.apache_kafka import KafkaCluster, start_or_fail
from testkit.kafka_capture import KafkaCapture
from testkit.produce import Writer, committed_offsets, create_topic, produce

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

BASE_TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> KafkaCluster:
    c = start_or_fail(tmp_path_factory, "dlq-kafka")
    yield c
    c.stop()


def new_topic(cluster: KafkaCluster, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.bootstrap, name, partitions, config={"retention.ms": "-1"})
    return name


# -- the producer's bytes ------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_reads_what_the_producer_wrote(cluster, codec):
    topic = new_topic(cluster, f"bytes-{codec}", 3)
    sent = [(None if i % 4 == 0 else f"key-{i}".encode(), None if i % 5 == 1 else f"vålue-{i}".encode() * (i % 7),
             [("seq", str(i).encode()), ("null", None), ("ünï", b"\x00\xff")]) for i in range(300)]
    p = Producer(ConsumerConfig.from_options(bootstrap_servers=cluster.bootstrap), ProducerSettings(compression=codec))
    try:
        for i, (k, v, h) in enumerate(sent):
            p.send(topic, k, v, h, timestamp=BASE_TS + 1000 * i)
        p.flush(60)
        assert p.producer_id >= 0 and p.unacknowledged() == 0   # (a fresh topic may answer NOT_LEADER first)
    finally:
        p.close()
    got = read_topic(cluster.bootstrap, topic, 3)
    seen = []
    for part, rs in got.items():
        for r in rs:
            i = int(dict(r.headers)["seq"])
            seen.append(i)
            key, value, headers = sent[i]
            assert (r.key, r.value, r.headers, r.timestamp, r.timestamp_type) == \
                (key, value, headers, BASE_TS + 1000 * i, "create_time")
    assert sorted(seen) == list(range(len(sent)))


# -- an answer lost after the append -------------------------------------------------------------

class ProduceAnswers(KafkaCapture):
    """A capture that knows which answers are Produce answers (``produce_answer``)."""

    def __init__(self, upstreams) -> None:
        self._produce: set[tuple[int, int]] = set()
        super().__init__(upstreams)

    def _on_request(self, conn: int, frame: bytes) -> bytes:
        out = super()._on_request(conn, frame)
        ex = self.exchanges()[-1]
        if ex.api_key == PRODUCE.key:
            self._produce.add((conn, ex.correlation_id))
        return out

    def produce_answer(self, conn: int, frame: bytes) -> bool:
        return (conn, int.from_bytes(frame[:4], "big", signed=True)) in self._produce


class LosesProduceAnswers(ProduceAnswers):
    """Closes the client's connection instead of passing on the first ``lose`` Produce answers:
    the broker has appended, the client never hears of it."""

    def __init__(self, upstreams, lose: int) -> None:
        self.lose = lose
        self.lost = 0
        super().__init__(upstreams)

    def _on_response(self, conn: int, frame: bytes) -> bytes:
        out = super()._on_response(conn, frame)
        if self.produce_answer(conn, frame) and self.lost < self.lose:
            self.lost += 1
            raise OSError("Produce answer dropped by the test")   # the pump closes both sides
        return out


def test_a_lost_answer_is_retried_with_the_same_sequence_and_written_once(cluster):
    topic = new_topic(cluster, "lost-answer", 1)
    proxy = LosesProduceAnswers([(cluster.host, cluster.port)], lose=2)
    p = Producer(ConsumerConfig.from_options(bootstrap_servers=proxy.bootstrap, retry_backoff_ms=50))
    try:
        for i in range(50):
            p.send(topic, b"k%d" % i, b"v%d" % i, [("seq", str(i).encode())], timestamp=BASE_TS + i)
        p.flush(60)
        assert proxy.lost == 2 and p.answers.get("NO_ANSWER", 0) == 2, p.answers
        sent = [ex.request for ex in proxy.exchanges(PRODUCE.key)]
    finally:
        p.close()
        proxy.close()
    assert not proxy.errors, proxy.errors
    # Every attempt carried the very same batch bytes: id, epoch and sequence included.
    batches = {bytes(t["partition_data"][0]["records"]) for body in sent for t in body["topic_data"]}
    assert len(sent) == 3 and len(batches) == 1
    (rs,) = read_topic(cluster.bootstrap, topic, 1).values()
    assert [int(dict(r.headers)["seq"]) for r in rs] == list(range(50))


# -- a restart while an answer is outstanding ----------------------------------------------------

class HoldsFirstProduceAnswer(ProduceAnswers):
    """Holds back the first Produce answer (the broker has appended the batch) until
    ``release`` is set, then closes that connection instead of passing it on: the broker can be
    restarted while a DLQ flush waits for it."""

    def __init__(self, upstreams) -> None:
        self.held = threading.Event()
        self.release = threading.Event()
        super().__init__(upstreams)

    def _on_response(self, conn: int, frame: bytes) -> bytes:
        out = super()._on_response(conn, frame)
        if self.produce_answer(conn, frame) and not self.held.is_set():
            self.held.set()
            self.release.wait()
            raise OSError("Produce answer dropped by the test")
        return out


@pytest.mark.parametrize("age", ["current", "two years old"])
def test_a_batch_appended_before_a_restart_is_recognised_after_it_unless_its_records_are_old(cluster, age):
    """The answer to an appended batch is held back, the broker is killed and restarted, and
    the producer sends the batch again with the same sequence.  Kafka rebuilds its producer
    state from the log, but drops producers whose newest record is older than
    producer.id.expiration.ms (1 day): with old timestamps the retry is written a second time.
    Hence the Kafka DLQ stamps dead letters with the current time (kafka_dlq.py)."""
    topic = new_topic(cluster, "restart-retry", 1)
    base = int(time.time() * 1000) if age == "current" else BASE_TS
    proxy = HoldsFirstProduceAnswer([(cluster.host, cluster.port)])
    p = Producer(ConsumerConfig.from_options(bootstrap_servers=proxy.bootstrap, retry_backoff_ms=100))
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            p.flush(120)
        except BaseException as exc:
            errors.append(exc)

    try:
        for i in range(20):
            p.send(topic, b"k", b"v%d" % i, [("seq", str(i).encode())], timestamp=base + i)
        flushing = threading.Thread(target=flush, daemon=True)
        flushing.start()
        assert proxy.held.wait(60), "the Produce answer never came"
        cluster.nodes[1].kill()
        proxy.release.set()
        cluster.restart(1)
        flushing.join(150)
        assert not flushing.is_alive() and not errors, errors
        assert p.answers == {"NO_ANSWER": 1, "NONE": 1}, p.answers
    finally:
        p.close()
        proxy.close()
    (rs,) = read_topic(cluster.bootstrap, topic, 1).values()
    seqs = [int(dict(r.headers)["seq"]) for r in rs]
    assert seqs == (list(range(20)) if age == "current" else list(range(20)) * 2)


# -- the daemon through a broker restart ---------------------------------------------------------

SOURCE_PARTITIONS, DLQ_PARTITIONS = 3, 2
BEFORE, DURING = 3_000, 3_000


def source_record(i: int) -> tuple:
    """Every tenth value is not JSON: those go to the DLQ."""
    value = f"not json {i} {{".encode() if i % 10 == 3 else json.dumps({"id": i}).encode()
    return (f"k-{i}".encode(), value, (("seq", str(i).encode()), ("origin", b"test")), BASE_TS + i)


def is_bad(i: int) -> bool:
    return i % 10 == 3


def test_daemon_dead_letters_go_to_kafka_once_through_a_broker_restart(cluster, tmp_path: Path):
    source = new_topic(cluster, "dlq-source", SOURCE_PARTITIONS)
    dlq = new_topic(cluster, "dlq-dead", DLQ_PARTITIONS)
    group = f"dlq-group-{uuid.uuid4().hex[:8]}"
    written: dict[tuple[int, int], int] = {}   # (partition, offset) -> record index
    produce(cluster.bootstrap, source, [source_record(i) for i in range(BEFORE)])
    config = daemon_config(tmp_path, cluster.bootstrap, source, group, workers=2,
                           on_deserialize_error="dlq", heartbeat_timeout_s=60.0)
    config["plugins"] = ["json"]
    config["deserializer"] = {"key": "str", "value": "json"}
    # The DLQ's producer goes through the proxy (its own bootstrap_servers), the consumer not.
    proxy = HoldsFirstProduceAnswer([(cluster.host, cluster.port)])
    config["dlq"] = {"type": "kafka", "topic": dlq, "timeout_ms": 45_000, "bootstrap_servers": proxy.bootstrap}

    keep_writing = threading.Event()
    keep_writing.set()
    during_reports: list = []   # the chunks written (their first record's index)
    failures: list[BaseException] = []

    def writer() -> None:
        """Records keep coming, through the restart (acks=all; librdkafka retries meanwhile)."""
        try:
            w = Writer(cluster.bootstrap, source, acks="all", **{"enable.idempotence": True})
            start = BEFORE
            while start < BEFORE + DURING:
                chunk = [source_record(i) for i in range(start, min(start + 100, BEFORE + DURING))]
                for k, v, h, ts in chunk:
                    w.send(v, k, headers=h, timestamp=ts)
                assert w.flush(120) == 0 and not w.errors, w.errors
                during_reports.append(start)
                start += len(chunk)
                if start >= BEFORE + DURING // 2:
                    keep_writing.wait()   # the second half once the broker is back
        except BaseException as exc:   # seen by the test, not lost in the thread
            failures.append(exc)

    with proxy, Daemon(tmp_path, config) as d:
        d.wait_all_ready(timeout=90)
        # A DLQ flush is waiting for the broker's answer to a batch it appended.
        wait_for(proxy.held.is_set, 90, "the first dead letters' Produce answer", d.log_tail)
        keep_writing.clear()
        thread = threading.Thread(target=writer, name="source-writer", daemon=True)
        thread.start()
        wait_for(lambda: during_reports or failures, 60, "the writer's first records during the run", d.log_tail)
        cluster.nodes[1].kill()           # mid-flush: the answer never comes
        proxy.release.set()
        cluster.restart(1)
        keep_writing.set()
        thread.join(300)
        assert not thread.is_alive() and not failures, failures
        # What the source topic holds, read back: librdkafka's idempotent producer may have
        # written some records twice across the kill (it bumps its epoch after a timeout), and
        # each copy is a record of its own at its own offset for the daemon.
        written.clear()
        for p, rs in read_topic(cluster.bootstrap, source, SOURCE_PARTITIONS).items():
            for r in rs:
                written[(p, r.offset)] = int(dict(r.headers)["seq"])
        assert set(written.values()) == set(range(BEFORE + DURING))
        source_copies = len(written) - (BEFORE + DURING)

        ends = {p: 0 for p in range(SOURCE_PARTITIONS)}
        for p, off in written:
            ends[p] = max(ends[p], off + 1)
        seen: dict[int, int] = {}

        def all_committed() -> bool:
            if not d.alive():
                raise AssertionError(f"kdaemon exited with {d.proc.returncode}\n{d.log_tail()}")
            seen.update(committed_offsets(cluster.bootstrap, group, source, SOURCE_PARTITIONS))
            return seen == ends

        wait_for(all_committed, 180, f"the group committing the ends {ends}",
                 lambda: f"committed {seen}\n{d.log_tail()}\n{cluster.log_tail(20)}", interval=0.5)
        assert d.stop(timeout=60) == 0, d.log_tail()
        lines = d.output()
        log = d.log()

    bad = {where: i for where, i in written.items() if is_bad(i)}
    good = {where: i for where, i in written.items() if not is_bad(i)}
    assert len(set(bad.values())) == (BEFORE + DURING) // 10

    # Every good record in the output once.
    out = Counter((o["partition"], o["offset"]) for o in lines)
    assert set(out) == set(good) and max(out.values()) == 1, (
        f"{len(set(good) - set(out))} good records missing, {sum(n > 1 for n in out.values())} repeated")

    # Every bad record in the DLQ topic exactly once, as it was, with the error context.
    dead = [r for rs in read_topic(cluster.bootstrap, dlq, DLQ_PARTITIONS).values() for r in rs]
    where = Counter()
    for r in dead:
        h = dict(r.headers)
        src = (int(h["__connect.errors.partition"]), int(h["__connect.errors.offset"]))
        where[src] += 1
        i = bad.get(src)
        assert i is not None, f"{src} is in the DLQ but was not a bad record"
        key, value, headers, ts = source_record(i)
        assert (r.key, r.value) == (key, value)
        assert r.headers[:2] == list(headers)   # the original headers first, as they were
        assert h["kdaemon.original.timestamp"] == str(ts).encode() and r.timestamp > ts
        assert h["__connect.errors.topic"] == source.encode()
        assert (h["__connect.errors.stage"], h["__connect.errors.class.name"],
                h["__connect.errors.exception.class.name"]) == (b"VALUE_CONVERTER", b"json", b"ValueError")
        assert h["__connect.errors.exception.message"].startswith(b"not valid JSON"), h
        assert (h["kdaemon.stage"], h["kdaemon.plugin"]) == (b"deserialize", b"deserializer.value=json")
    # The held batch was sent again after the restart, with its sequence (and found written).
    assert "got no answer" in log and "go again with the same sequence" in log, log[-3000:]
    repeated = {k: n for k, n in where.items() if n > 1}
    missing = set(bad) - set(where)
    assert not repeated and not missing, f"{len(missing)} dead letters lost, {len(repeated)} repeated: {repeated}"
    print(f"\n{len(written)} records, {len(bad)} dead letters in {dlq} once each; "
          f"DLQ Produce attempts without an answer: {log.count('got no answer')}; "
          f"source records librdkafka wrote twice: {source_copies}")
