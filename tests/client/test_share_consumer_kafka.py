"""``ShareConsumer`` against Apache Kafka 4.4's share groups (KIP-932).

Each test has its own topic and share group, whose ``share.auto.offset.reset`` is set to
earliest before anyone joins (a new share group otherwise starts at the end of each partition).
What the broker has left to settle is read back with DescribeShareGroupOffsets (``share_lag``):
lag 0 means every record was accepted, rejected or settled as a gap, nothing held or waiting.

* one member reads every record once; the share sessions' epochs (0, then +1 a request, -1 at
  close) and the acknowledgements riding on the next ShareFetch, as seen on the wire; a second
  member of the group shares one partition's records with it, each record to exactly one;
* RELEASE, REJECT and RENEW: what comes back, with which delivery count;
* implicit acknowledgement: the next poll accepts the last one's records (the callback says
  so, and not before);
* ``commit_sync``'s per-partition results;
* an acquisition lock that runs out: the record goes to another member with delivery count 2,
  and the late verdict of the first is not sent as if it still held it (InvalidRecordStateError
  in ``commit_sync``'s result and in the callback);
* the header filter: dropped records are accepted, never returned;
* a mixed group: Java's KafkaShareConsumer (testkit/java_peer.py) and ours share one partition,
  each record to exactly one of them.
"""

from __future__ import annotations

import time
import uuid

import pytest

from kdaemon.client import AcknowledgeType, ShareConsumer
from kdaemon.client.errors import AcknowledgementError, InvalidRecordStateError
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.apis import SHARE_ACKNOWLEDGE, SHARE_FETCH
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from testkit.produce import create_topic, produce
from testkit.java_peer import JavaShareConsumerProcess
from testkit.group_configs import set_group_configs
from testkit.share_groups import share_lag, share_members

pytestmark = pytest.mark.kafka

WAIT = 60.0   # bound of every wait for an event; never a duration the test relies on


def new_group(kafka, **configs) -> str:
    group = f"share-{uuid.uuid4().hex[:8]}"
    set_group_configs(kafka.bootstrap, group, {"share.auto.offset.reset": "earliest", **configs})
    return group


def new_topic(kafka, partitions: int, records_per_partition: int, headers=lambda p, i: []) -> str:
    topic = f"share-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, partitions)
    for p in range(partitions):
        produce(kafka.bootstrap, topic, [(b"k%d" % i, b"v%d-%d" % (p, i), headers(p, i))
                                         for i in range(records_per_partition)], partition=p)
    return topic


def consumer(kafka, group: str, **options) -> ShareConsumer:
    return ShareConsumer(kafka.bootstrap, group_id=group, client_id=f"share-test-{uuid.uuid4().hex[:6]}",
                         **options)


def poll_until(c: ShareConsumer, done, *, on_records=None, timeout: float = WAIT) -> list:
    """Poll until ``done(got)``; returns every record polled.  ``on_records(records)`` runs after
    each poll that returned some (explicit mode acknowledges there)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while not done(got):
        assert time.monotonic() < deadline, f"not done after {timeout} s; got {[(r.partition, r.offset) for r in got]}"
        polled = [r for rs in c.poll(200).values() for r in rs]
        got += polled
        if polled and on_records is not None:
            on_records(polled)
    return got


def wait_lag(kafka, group: str, topic: str, partitions: int, lag: int = 0) -> dict:
    deadline = time.monotonic() + WAIT
    while True:
        seen = share_lag(kafka.host, kafka.port, group)
        mine = {p: seen.get((topic, p)) for p in range(partitions)}
        if all(v is not None and v[1] == lag for v in mine.values()):
            return mine
        assert time.monotonic() < deadline, f"lag never {lag}: {mine}"
        time.sleep(0.2)


def keys(records) -> list[tuple[int, int]]:
    return sorted((r.partition, r.offset) for r in records)


class Wire:
    """The share requests one consumer wrote, in order, per node."""

    def __init__(self, c: ShareConsumer) -> None:
        self.requests: list[tuple[int, str, dict]] = []
        c._network.observers.append(self.observe)

    def observe(self, node, api, version, body, response) -> None:
        if not response and api in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
            self.requests.append((node, api.name, body))


# -- 1. one member, then two --------------------------------------------------------------------

def test_one_member_reads_every_record_once_in_share_sessions(kafka):
    topic = new_topic(kafka, 3, 10)
    group = new_group(kafka)
    c = consumer(kafka, group)
    wire = Wire(c)
    c.subscribe([topic])
    got = poll_until(c, lambda got: len(got) >= 30)
    assert keys(got) == [(p, i) for p in range(3) for i in range(10)], keys(got)
    assert {r.delivery_count for r in got} == {1}
    assert {(r.partition, r.offset, r.value) for r in got} == {(p, i, b"v%d-%d" % (p, i)) for p in range(3) for i in range(10)}
    c.poll(200)   # implicit: accepts them all, on the ShareFetch this poll sends
    wait_lag(kafka, group, topic, 3)
    assert set(share_members(kafka.host, kafka.port, group)) == {c.member_id}
    c.close()
    assert share_members(kafka.host, kafka.port, group) == {}   # it left

    # The share session: epoch 0 opens it (listing the partitions), +1 a request, -1 closes it;
    # the acceptances rode on a ShareFetch.
    (node,) = {n for n, _, _ in wire.requests}
    epochs = [(api, body["share_session_epoch"]) for _, api, body in wire.requests]
    assert epochs[0] == ("ShareFetch", 0) and epochs[-1] == ("ShareAcknowledge", -1), epochs
    assert [e for _, e in epochs[:-1]] == list(range(len(epochs) - 1)), epochs
    first = wire.requests[0][2]
    assert sorted(p["partition_index"] for t in first["topics"] for p in t["partitions"]) == [0, 1, 2]
    accepted = {(p["partition_index"], o) for _, api, body in wire.requests if api == "ShareFetch"
                for t in body["topics"] for p in t["partitions"] for b in p["acknowledgement_batches"]
                for o in range(b["first_offset"], b["last_offset"] + 1) if b["acknowledge_types"] == [1]}
    assert accepted == {(p, i) for p in range(3) for i in range(10)}, sorted(accepted)


def test_two_members_share_one_partition_each_record_to_exactly_one(kafka):
    topic = f"share-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1)
    group = new_group(kafka)
    # record_limit: each ShareFetch acquires at most max_poll_records, so turns alternate.
    members = [consumer(kafka, group, share_acquire_mode="record_limit", max_poll_records=5) for _ in range(2)]
    for c in members:
        c.subscribe([topic])
    deadline = time.monotonic() + WAIT
    while not all(c.assignment() for c in members):   # both members hold the partition
        assert time.monotonic() < deadline, [c.assignment() for c in members]
        for c in members:
            c.poll(100)
    produce(kafka.bootstrap, topic, [(None, b"r%d" % i, []) for i in range(40)], partition=0)
    got: dict[int, list] = {0: [], 1: []}
    deadline = time.monotonic() + WAIT
    while len(got[0]) + len(got[1]) < 40:
        assert time.monotonic() < deadline, {i: keys(g) for i, g in got.items()}
        for i, c in enumerate(members):
            records = [r for rs in c.poll(200).values() for r in rs]
            assert len(records) <= 5
            got[i] += records
    a, b = set(keys(got[0])), set(keys(got[1]))
    assert a and b, (a, b)                      # both took part
    assert not a & b, sorted(a & b)             # no record to both (no lock ran out: 30 s)
    assert a | b == {(0, i) for i in range(40)}
    assert {r.delivery_count for g in got.values() for r in g} == {1}
    for c in members:
        c.commit_sync()
    wait_lag(kafka, group, topic, 1)
    for c in members:
        c.close()


# -- 2. RELEASE, REJECT, RENEW ------------------------------------------------------------------

def test_release_comes_back_counted_twice_reject_never_renew_comes_back_held(kafka):
    topic = new_topic(kafka, 1, 3)
    group = new_group(kafka)
    c = consumer(kafka, group, share_acknowledgement_mode="explicit")
    c.subscribe([topic])
    first = poll_until(c, lambda got: len(got) >= 3)   # one batch: one poll
    assert keys(first) == [(0, 0), (0, 1), (0, 2)] and {r.delivery_count for r in first} == {1}
    by_offset = {r.offset: r for r in first}
    with pytest.raises(AcknowledgementError, match="3 record"):
        c.poll(0)                                # explicit: nothing acknowledged yet
    c.acknowledge(by_offset[0], AcknowledgeType.RELEASE)
    c.acknowledge(by_offset[1], AcknowledgeType.REJECT)
    c.acknowledge(by_offset[2], AcknowledgeType.RENEW)
    tp = TopicPartition(topic, 0)
    assert c.commit_sync() == {tp: None}
    assert c.acquisition_lock_timeout_ms() and c.acquisition_lock_timeout_ms() > 0

    # Renewed: back from the next poll, still held, same delivery.  Released: delivered again,
    # counted twice.  Rejected: never again.
    again: list = []

    def accept(records):
        for r in records:
            again.append((r.offset, r.delivery_count))
            c.acknowledge(r, AcknowledgeType.ACCEPT)

    poll_until(c, lambda got: len(got) >= 2, on_records=accept)
    assert sorted(again) == [(0, 2), (2, 1)], again
    assert c.commit_sync() == {tp: None}
    wait_lag(kafka, group, topic, 1)            # offset 1 settled too: rejected, archived
    # Counted in records, once the broker confirmed: 3 acquired, then offset 0 again (delivered
    # before) and offset 2 renewed (given back, not acquired anew).
    m = c.metrics()
    assert (m.records_acquired, m.records_redelivered, dict(m.acknowledged), m.acknowledge_errors,
            m.lock_expiries) == (4, 1, {"accept": 2, "release": 1, "reject": 1, "renew": 1}, 0, 0), m
    c.close()


# -- 3. implicit acknowledgement ----------------------------------------------------------------

def test_implicit_mode_accepts_the_last_polls_records_on_the_next_poll(kafka):
    topic = new_topic(kafka, 1, 5)
    group = new_group(kafka)
    c = consumer(kafka, group)
    done: list = []
    c.set_acknowledgement_commit_callback(lambda offsets, error: done.append((offsets, error)))
    c.subscribe([topic])
    got = poll_until(c, lambda got: len(got) >= 5)
    assert keys(got) == [(0, i) for i in range(5)]
    # Held, not settled: lag 5, or -1 (unknown) while Kafka has not written the partition's state yet.
    assert share_lag(kafka.host, kafka.port, group)[(topic, 0)][1] in (5, -1)
    with pytest.raises(AcknowledgementError, match="explicit"):
        c.acknowledge(got[0], AcknowledgeType.ACCEPT)
    assert done == []
    deadline = time.monotonic() + WAIT
    while not done:                              # the next poll accepts them
        assert time.monotonic() < deadline
        c.poll(200)
    assert done == [({TopicPartition(topic, 0): {0, 1, 2, 3, 4}}, None)], done
    wait_lag(kafka, group, topic, 1)
    assert c.commit_sync() == {}                 # nothing left to acknowledge
    c.close()


# -- 4. commit_sync per partition ---------------------------------------------------------------

def test_commit_sync_answers_for_every_partition_it_acknowledged(kafka):
    topic = new_topic(kafka, 2, 4)
    group = new_group(kafka)
    c = consumer(kafka, group, share_acknowledgement_mode="explicit")
    c.subscribe([topic])
    answers = []

    def accept_and_commit(records):
        for r in records:
            c.acknowledge(r, AcknowledgeType.ACCEPT)
        results = c.commit_sync()
        answers.append(results)
        assert results == {TopicPartition(topic, p): None for p in {r.partition for r in records}}, results

    got = poll_until(c, lambda got: len(got) >= 8, on_records=accept_and_commit)
    assert keys(got) == [(p, i) for p in range(2) for i in range(4)]
    assert {tp for a in answers for tp in a} == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
    assert c.commit_sync() == {}                # nothing pending
    wait_lag(kafka, group, topic, 2)
    c.unsubscribe()                              # closes its share session and leaves
    assert share_members(kafka.host, kafka.port, group) == {}
    with pytest.raises(ValueError, match="subscription"):
        c.poll(0)
    c.close()


# -- 5. an expired lock -------------------------------------------------------------------------

def test_a_record_held_past_its_lock_goes_to_another_member_and_the_late_verdict_is_not_sent(kafka):
    topic = new_topic(kafka, 1, 1)
    group = new_group(kafka, **{"share.record.lock.duration.ms": "2000"})
    slow = consumer(kafka, group, share_acknowledgement_mode="explicit")
    late: list = []
    slow.set_acknowledgement_commit_callback(lambda offsets, error: late.append((offsets, error)))
    slow.subscribe([topic])
    (held,) = poll_until(slow, lambda got: len(got) >= 1)
    assert (held.offset, held.delivery_count) == (0, 1)
    assert slow.acquisition_lock_timeout_ms() == 2000

    other = consumer(kafka, group, share_acknowledgement_mode="explicit")
    other.subscribe([topic])
    (again,) = poll_until(other, lambda got: len(got) >= 1)   # the lock ran out: delivered again
    assert (again.offset, again.delivery_count) == (0, 2)

    slow.acknowledge(held, AcknowledgeType.ACCEPT)
    wire = Wire(slow)
    (result,) = slow.commit_sync().values()
    assert isinstance(result, InvalidRecordStateError) and "ran out" in str(result), result
    assert not [b for _, _, b in wire.requests if b["topics"]], wire.requests   # nothing sent
    assert len(late) == 1 and isinstance(late[0][1], InvalidRecordStateError) and \
        late[0][0] == {TopicPartition(topic, 0): {0}}, late

    other.acknowledge(again, AcknowledgeType.ACCEPT)     # the holder's verdict counts
    assert other.commit_sync() == {TopicPartition(topic, 0): None}
    wait_lag(kafka, group, topic, 1)
    late_m, other_m = slow.metrics(), other.metrics()
    assert (late_m.records_acquired, late_m.lock_expiries, late_m.acknowledged["accept"], late_m.acknowledge_errors) \
        == (1, 1, 0, 0), late_m                       # the verdict never sent is an expiry, not an error
    assert (other_m.records_acquired, other_m.records_redelivered, other_m.acknowledged["accept"],
            other_m.lock_expiries) == (1, 1, 1, 0), other_m
    for c in (slow, other):
        c.close()


# -- 6. the header filter -----------------------------------------------------------------------

def test_records_the_header_filter_drops_are_accepted_and_never_returned(kafka):
    dropped = {(p, i) for p in range(2) for i in range(12) if i % 3 == 1}
    topic = new_topic(kafka, 2, 12, headers=lambda p, i: [("drop", b"1")] if (p, i) in dropped else [("kind", b"x")])
    group = new_group(kafka)
    c = consumer(kafka, group, header_filter=HeaderRules([HeaderRule("drop", "exists", keep=False)]))
    c.subscribe([topic])
    kept = {(p, i) for p in range(2) for i in range(12)} - dropped
    got = poll_until(c, lambda got: len(got) >= len(kept))
    assert set(keys(got)) == kept and len(got) == len(kept)
    c.poll(200)                                   # accepts what the last poll returned
    wait_lag(kafka, group, topic, 2)              # and the dropped ones were accepted with the first fetch
    # The filter's ACCEPTs count as the broker confirmed them, once the answer carrying the last
    # ones is read (the ShareFetch they rode on waits at the broker for records first).
    deadline = time.monotonic() + WAIT
    while c.metrics().acknowledged["accept"] < len(kept) + len(dropped) and time.monotonic() < deadline:
        c.poll(200)
    m = c.metrics()
    assert (m.records_acquired, m.records_redelivered, m.acknowledged["accept"], m.acknowledge_errors) == \
        (len(kept), 0, len(kept) + len(dropped), 0), m
    c.close()


# -- 7. a mixed group with Java's KafkaShareConsumer -------------------------------------------

def test_a_share_group_of_java_and_kdaemon_members_splits_the_records(kafka):
    topic = f"share-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1)
    group = new_group(kafka)
    limit = {"share.acquire.mode": "record_limit", "max.poll.records": "5"}
    java = JavaShareConsumerProcess(kafka.bootstrap, group, [topic], mode="explicit", sets=limit)
    try:
        ours = consumer(kafka, group, share_acknowledgement_mode="explicit", share_acquire_mode="record_limit",
                        max_poll_records=5)
        ours.subscribe([topic])
        deadline = time.monotonic() + WAIT
        while True:   # both members hold the partition
            members = share_members(kafka.host, kafka.port, group)
            if len(members) == 2 and all(parts == {(topic, 0)} for _, parts in members.values()):
                break
            assert time.monotonic() < deadline and java.proc.poll() is None, (members, java.stderr[-2000:])
            ours.poll(100)
        assert ours.member_id in members
        produce(kafka.bootstrap, topic, [(None, b"r%d" % i, []) for i in range(200)], partition=0)
        mine = poll_until(ours, lambda got: len(got) + len(java.records) >= 200,
                          on_records=lambda rs: [ours.acknowledge(r, AcknowledgeType.ACCEPT) for r in rs])
        ours.commit_sync()
        end = java.stop()
    finally:
        java.kill()
    theirs = {(r.partition, r.offset) for r in java.records}
    assert mine and theirs, (len(mine), len(theirs))
    assert not set(keys(mine)) & theirs, sorted(set(keys(mine)) & theirs)
    assert set(keys(mine)) | theirs == {(0, i) for i in range(200)}
    assert {r.delivery_count for r in mine} == {1} and {r.delivery_count for r in java.records} == {1}
    assert end["count"] == len(java.records)
    wait_lag(kafka, group, topic, 1)
    ours.close()
