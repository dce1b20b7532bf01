"""A rebalance during an upload, on Apache Kafka (the shared ``kafka`` node, consumer protocol):
the worker whose partitions move does not wait for the upload, and commits nothing its sink has
not accepted.

The sink stands for the Spark sink (``flush_async``, ``wants_flush``, ``deduplicates_by_offset``)
but its uploads are confirmed only when the test releases them.  Worker A (a real ``Worker`` and
``Consumer``, in a thread) reads both partitions of a topic, starts an upload, and reads on until
``max_buffered_records`` more are written: then its next flush is due and it must wait for the
one in flight.  Then B joins.  A gives one partition up while the upload is still unconfirmed:
its loop polls while it waits (``modes.FULL``) rather than blocking in the upload's ``wait()``,
which held the revocation, and so the newcomer, for the whole job (the reason the sibling pokes
were reverted in da2f8a0: with them a worker joined in the middle of a Spark burst).  Nothing is
committed before the upload is confirmed; its confirmation commits the partition A kept, not the
one it gave up (its next owner starts from the last commit, and the sink drops by offset what it
already has).
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from kdaemon.client import Consumer, TopicPartition
from kdaemon.config import parse
from kdaemon.worker.build import PipelineParts
from kdaemon.worker.pipeline import Worker
from testkit.daemon import wait_for
from testkit.group_members import set_group_session
from testkit.produce import Writer, create_topic

pytestmark = pytest.mark.kafka

WAIT = 60.0
BATCH = 50          # the sink wants a flush at this many buffered records
BUFFERED = 100      # max_buffered_records: written since the upload began, the next flush waits
PER_PARTITION = 400


class Upload:
    def __init__(self, offsets: dict[TopicPartition, int]) -> None:
        self.offsets = offsets
        self.released = threading.Event()
        self.waited = 0

    def done(self) -> bool:
        return self.released.is_set()

    def wait(self) -> None:
        self.waited += 1
        if not self.released.wait(WAIT):
            raise AssertionError("an upload waited on was never released")

    def retry(self) -> None:
        pass


class SlowSink:
    """Keeps each topic-partition-offset once (``deduplicates_by_offset``); an upload counts as
    accepted (``accepted``) only once the test released it."""

    deduplicates_by_offset = True

    def __init__(self) -> None:
        self.buffer: dict[TopicPartition, int] = {}   # partition -> highest offset + 1 buffered
        self.buffered = 0
        self.uploads: list[Upload] = []

    def write(self, records) -> None:
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            self.buffer[tp] = max(self.buffer.get(tp, 0), r.offset + 1)
        self.buffered += len(records)

    def wants_flush(self) -> bool:
        return self.buffered >= BATCH

    def flush_async(self) -> Upload:
        upload = Upload(dict(self.buffer))
        self.buffer, self.buffered = {}, 0
        self.uploads.append(upload)
        return upload

    def flush(self) -> None:
        upload = self.flush_async()
        upload.released.set()

    def accepted(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for u in self.uploads:
            if u.released.is_set():
                for tp, end in u.offsets.items():
                    out[tp] = max(out.get(tp, 0), end)
        return out

    def close(self) -> None:
        pass


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets, from a consumer that does not join."""
    c = Consumer(bootstrap_servers=bootstrap, group_id=group)
    try:
        parts = [TopicPartition(topic, p) for p in (0, 1)]
        return {tp.partition: om.offset for tp, om in c.committed(parts, timeout_ms=10_000).items() if om is not None}
    finally:
        c.close(group_membership="remain")


def test_a_revocation_while_the_next_flush_waits_for_a_slow_upload_neither_waits_nor_commits(kafka):
    tag = uuid.uuid4().hex[:8]
    topic = group = f"upload-{tag}"
    create_topic(kafka.bootstrap, topic, 2)
    writer = Writer(kafka.bootstrap, topic)
    for i in range(2 * PER_PARTITION):
        writer.send(b"v%d" % i, partition=i % 2)
    writer.flush_checked()
    # The group's own heartbeat interval: members hear of the rebalance soon, whatever the
    # shared broker's default (nothing here pokes them).
    set_group_session(kafka.bootstrap, group, 30_000, heartbeat_ms=500)

    config = parse({"kafka": {"bootstrap_servers": kafka.bootstrap, "group_id": group},
                    "daemon": {"topics": [topic], "flush_interval_ms": 3_600_000, "poll_timeout_ms": 100,
                               "max_buffered_records": BUFFERED, "on_deserialize_error": "skip"},
                    "sink": {"type": "null"}})
    sink = SlowSink()
    identity = lambda t, h, b: b  # noqa: E731
    parts = PipelineParts(None, identity, identity, [], sink, None)
    consumer_a = Consumer(bootstrap_servers=kafka.bootstrap, group_id=group, group_protocol="consumer",
                          enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=20,
                          client_id="a")
    worker = Worker(config, parts, consumer_a, lambda c, w: c.subscribe([topic], listener=w))
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:   # noqa: BLE001 - the test reports it
            failure.append(exc)

    thread = threading.Thread(target=run, name="worker-a", daemon=True)
    thread.start()
    b = None
    try:
        # A holds both partitions, an upload is in flight, and the next flush is due.
        wait_for(lambda: failure or (len(sink.uploads) == 1 and sink.buffered >= BUFFERED), WAIT,
                 "worker A with an upload in flight and the next flush due")
        assert not failure, failure
        assert len(sink.uploads) == 1 and not sink.uploads[0].done()
        assert set(consumer_a.assignment()) == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        assert committed(kafka.bootstrap, group, topic) == {}

        b = Consumer(bootstrap_servers=kafka.bootstrap, group_id=group, group_protocol="consumer",
                     enable_auto_commit=False, auto_offset_reset="earliest", client_id="b")
        b.subscribe([topic])

        def b_holds() -> set:
            b.poll(100)
            return set(b.assignment())
        given = wait_for(b_holds, WAIT, "B given a partition A gave up")
        # A let it go while its upload is still unconfirmed, without waiting on it ...
        assert not sink.uploads[0].done() and sink.uploads[0].waited == 0, "the revocation waited for the upload"
        kept = set(consumer_a.assignment())
        assert len(given) == 1 and len(kept) == 1 and not given & kept
        # ... and nothing was committed, for either partition: the sink has accepted nothing.
        assert committed(kafka.bootstrap, group, topic) == {}

        sink.uploads[0].released.set()
        (mine,) = kept
        accepted = sink.uploads[0].offsets

        def committed_now():
            b.poll(100)   # B stays in the group meanwhile
            return committed(kafka.bootstrap, group, topic)
        final = wait_for(lambda: (c := committed_now()) and c, WAIT, "the confirmed upload's commit")
        # The partition A kept, at the upload's position; nothing for the one it gave up.
        assert final == {mine.partition: accepted[mine]}, (final, accepted)
    finally:
        worker.request_stop()
        deadline = time.monotonic() + WAIT
        while thread.is_alive() and time.monotonic() < deadline:   # its shutdown waits for its uploads
            for u in list(sink.uploads):
                u.released.set()
            thread.join(0.1)
        if b is not None:
            b.close()
    assert not failure, failure
