"""The share consumer's pure parts (KIP-932), without a broker: the member's state table, share
sessions, acknowledgement batches, held records and their lock deadlines, one partition's
ShareFetch answer decoded filter-first (with the C record loop and the pure-Python one), and
the settings.  The real broker's side is tests/client/test_share_consumer_kafka.py."""

from __future__ import annotations

import uuid

import pytest

from kdaemon.client.share.acknowledgements import InFlight
from kdaemon.client.share.config import ShareConsumerConfig
from kdaemon.client.share.fetch import decode_partition
from kdaemon.client.share.session import (FINAL_EPOCH, ShareSession, acknowledgement_batches)
from kdaemon.client.share.state import (IllegalShareTransition, ShareMemberEvent as E,
                                        ShareMemberState as S, ShareMemberStateMachine)
from kdaemon.client.share.types import GAP, AcknowledgeType, AcknowledgementMode, AcquireMode, ShareRecord
from kdaemon.client.types import TopicPartition
from kdaemon.protocol import record_loop, records
from kdaemon.protocol.builder import RecordSpec, build_batch, build_control_batch
from kdaemon.protocol.errors import CorruptRecordError, Errors
from kdaemon.protocol.header_match import HeaderRule, HeaderRules
from kdaemon.protocol.records import batch_record_offsets

ID_A = uuid.UUID(int=0xA)
ID_B = uuid.UUID(int=0xB)
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
ACCEPT, RELEASE, REJECT, RENEW = (int(t) for t in AcknowledgeType)


# -- the member's state table ---------------------------------------------------------------------

def test_a_member_joins_is_fenced_rejoins_and_leaves():
    m = ShareMemberStateMachine()
    assert m.state is S.UNJOINED
    for event, state in [(E.JOIN_SENT, S.JOINING), (E.JOINED, S.STABLE), (E.FENCED, S.UNJOINED),
                         (E.JOIN_SENT, S.JOINING), (E.JOIN_FAILED, S.UNJOINED), (E.JOIN_SENT, S.JOINING),
                         (E.JOINED, S.STABLE), (E.LEFT, S.UNJOINED)]:
        assert m.apply(event) is state


def test_anything_not_in_the_table_is_an_error_and_fatal_stays_fatal():
    m = ShareMemberStateMachine()
    with pytest.raises(IllegalShareTransition, match="joined in state unjoined"):
        m.apply(E.JOINED)
    with pytest.raises(ValueError):
        m.apply(E.FATAL_ERROR)            # needs its error
    boom = RuntimeError("group authorization failed")
    m.apply(E.FATAL_ERROR, boom)
    for event in (E.JOIN_SENT, E.JOINED, E.LEFT, E.FENCED):
        assert m.apply(event) is S.FATAL
    with pytest.raises(RuntimeError, match="authorization"):
        m.raise_if_fatal()


# -- share sessions ---------------------------------------------------------------------------------

def test_epoch_zero_lists_every_partition_later_requests_only_changes():
    s = ShareSession(1)
    first = s.build_fetch({A0: ID_A, A1: ID_A}, {}, {})
    assert (first.epoch, first.forgotten) == (0, [])
    assert first.topics == [{"topic_id": ID_A, "partitions": [
        {"partition_index": 0, "acknowledgement_batches": []},
        {"partition_index": 1, "acknowledgement_batches": []}]}]
    assert s.handled(Errors.NONE) and s.epoch == 1
    # Nothing new: an empty incremental request; acknowledgements list their partition.
    again = s.build_fetch({A0: ID_A, A1: ID_A}, {A1: [(3, ACCEPT)]}, {})
    assert again.epoch == 1 and again.topics == [{"topic_id": ID_A, "partitions": [
        {"partition_index": 1, "acknowledgement_batches": [
            {"first_offset": 3, "last_offset": 3, "acknowledge_types": [ACCEPT]}]}]}]
    s.handled(Errors.NONE)
    # A1 goes, B0 comes.
    moved = s.build_fetch({A0: ID_A, B0: ID_B}, {}, {})
    assert moved.forgotten == [{"topic_id": ID_A, "partitions": [1]}]
    assert moved.topics == [{"topic_id": ID_B, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}]
    assert set(s.partitions) == {A0, B0}


def test_a_recreated_topic_is_forgotten_by_its_old_id_and_added_by_the_new():
    s = ShareSession(1)
    s.build_fetch({A0: ID_A}, {}, {})
    s.handled(Errors.NONE)
    new_id = uuid.UUID(int=0xA2)
    r = s.build_fetch({A0: new_id}, {}, {})
    assert r.forgotten == [{"topic_id": ID_A, "partitions": [0]}]
    assert r.topics == [{"topic_id": new_id, "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]}]


def test_a_share_acknowledge_never_opens_a_session_and_close_ends_it():
    s = ShareSession(1)
    assert s.build_acknowledge({A0: [(0, ACCEPT)]}, {"a": ID_A}) is None
    assert s.build_close({}, {}) is None
    s.build_fetch({A0: ID_A}, {}, {})
    s.handled(Errors.NONE)
    ack = s.build_acknowledge({A0: [(0, ACCEPT)]}, {})
    assert ack.epoch == 1 and ack.acknowledged == {A0: [(0, ACCEPT)]}
    s.handled(Errors.NONE)
    close = s.build_close({A0: [(1, RELEASE)]}, {})
    assert close.epoch == FINAL_EPOCH and close.topics[0]["partitions"][0]["acknowledgement_batches"] == \
        [{"first_offset": 1, "last_offset": 1, "acknowledge_types": [RELEASE]}]
    assert not s.open and s.partitions == {}


@pytest.mark.parametrize("code", [Errors.SHARE_SESSION_NOT_FOUND, Errors.INVALID_SHARE_SESSION_EPOCH])
def test_a_session_error_opens_a_new_session_with_every_partition(code):
    s = ShareSession(1)
    s.build_fetch({A0: ID_A, A1: ID_A}, {}, {})
    s.handled(Errors.NONE)
    s.build_fetch({A0: ID_A, A1: ID_A}, {}, {})
    assert not s.handled(code) and s.epoch == 0
    again = s.build_fetch({A0: ID_A, A1: ID_A}, {}, {})
    assert again.epoch == 0 and len(again.topics[0]["partitions"]) == 2


def test_other_errors_move_the_epoch_on_and_a_lost_answer_resets_it():
    s = ShareSession(1)
    s.build_fetch({A0: ID_A}, {}, {})
    assert s.handled(Errors.NONE) and s.handled(Errors.UNKNOWN_TOPIC_ID) and s.epoch == 2
    s.reset()
    assert s.epoch == 0


def test_acknowledgement_batches_are_runs_of_consecutive_offsets():
    assert acknowledgement_batches([(5, ACCEPT), (3, ACCEPT), (4, ACCEPT), (9, GAP)]) == [
        {"first_offset": 3, "last_offset": 5, "acknowledge_types": [ACCEPT]},
        {"first_offset": 9, "last_offset": 9, "acknowledge_types": [GAP]}]
    # Mixed types in one run: one type per offset.
    assert acknowledgement_batches([(0, ACCEPT), (1, RELEASE), (2, ACCEPT)]) == [
        {"first_offset": 0, "last_offset": 2, "acknowledge_types": [ACCEPT, RELEASE, ACCEPT]}]
    assert acknowledgement_batches([]) == []


# -- held records, verdicts, lock deadlines ----------------------------------------------------------

def rec(tp: TopicPartition, offset: int, count: int = 1) -> ShareRecord:
    return ShareRecord(tp.topic, tp.partition, offset, 0, 0, b"k", b"v", [], None, count)


def test_explicit_verdicts_go_to_the_node_the_record_came_from():
    f = InFlight()
    f.deliver(A0, [rec(A0, 0), rec(A0, 1)], node=1, topic_id=ID_A, deadline=100.0)
    f.deliver(B0, [rec(B0, 7)], node=2, topic_id=ID_B, deadline=100.0)
    assert f.unacknowledged() == 3
    assert f.acknowledge(A0, 0, AcknowledgeType.REJECT)
    assert f.acknowledge(A0, 0, AcknowledgeType.ACCEPT)        # a second verdict replaces the first
    assert f.acknowledge(B0, 7, AcknowledgeType.RELEASE)
    assert not f.acknowledge(A0, 5, AcknowledgeType.ACCEPT)    # never delivered
    assert f.unacknowledged() == 1 and f.nodes() == {1, 2}
    taken = f.take(1, now=10.0)
    assert taken.acks == {A0: [(0, ACCEPT)]} and taken.shown == {A0: {0}} and taken.topic_ids == {"a": ID_A}
    assert not f.acknowledge(A0, 0, AcknowledgeType.RELEASE)   # sent already
    assert f.take(2, now=10.0).acks == {B0: [(7, RELEASE)]}
    assert f.nodes() == set()


def test_implicit_mode_accepts_everything_delivered():
    f = InFlight()
    f.deliver(A0, [rec(A0, 0), rec(A0, 1)], node=1, topic_id=ID_A, deadline=100.0)
    f.acknowledge_all(AcknowledgeType.ACCEPT)
    assert f.unacknowledged() == 0
    assert f.take(1, now=0.0).acks == {A0: [(0, ACCEPT), (1, ACCEPT)]}


def test_a_verdict_whose_lock_ran_out_is_not_sent_but_reported():
    f = InFlight()
    f.deliver(A0, [rec(A0, 0)], node=1, topic_id=ID_A, deadline=10.0)
    f.deliver(A0, [rec(A0, 1)], node=1, topic_id=ID_A, deadline=30.0)
    f.settle(A0, [(2, GAP)], node=1, topic_id=ID_A, deadline=10.0)   # the consumer's own: not reported
    f.acknowledge_all(AcknowledgeType.ACCEPT)
    taken = f.take(1, now=20.0)
    assert taken.acks == {A0: [(1, ACCEPT)]}
    assert taken.expired == {A0: {0}} and taken.shown == {A0: {1}}


def test_expire_all_drops_every_expired_verdict_whatever_its_node():
    f = InFlight()
    f.deliver(A0, [rec(A0, 0)], node=1, topic_id=ID_A, deadline=10.0)
    f.deliver(B0, [rec(B0, 0)], node=2, topic_id=ID_B, deadline=50.0)
    f.acknowledge_all(AcknowledgeType.ACCEPT)
    assert f.expire_all(20.0) == {A0: {0}}
    assert f.nodes() == {2}


def test_renewals_stay_out_of_a_fetch_and_go_in_an_acknowledge():
    f = InFlight()
    f.deliver(A0, [rec(A0, 0), rec(A0, 1)], node=1, topic_id=ID_A, deadline=100.0)
    f.acknowledge(A0, 0, AcknowledgeType.RENEW)
    f.acknowledge(A0, 1, AcknowledgeType.ACCEPT)
    assert f.renewing(1)
    fetch = f.take(1, now=0.0, renew=False)
    assert fetch.acks == {A0: [(1, ACCEPT)]} and not fetch.renew
    ack = f.take(1, now=0.0)
    assert ack.acks == {A0: [(0, RENEW)]} and ack.renew and set(ack.renewing[A0]) == {0}
    assert ack.renewing[A0][0].record.offset == 0


# -- one partition's ShareFetch answer --------------------------------------------------------------

@pytest.fixture(params=["c-loop", "pure-python"])
def decoder(request, monkeypatch) -> str:
    if request.param == "c-loop":
        if not records.ACCELERATED:
            pytest.skip("the C record loop is not built (or KDAEMON_PURE_PYTHON is set)")
    else:
        monkeypatch.setattr(records, "_decode_v2_records", record_loop.python_loop)
        monkeypatch.setattr(records, "ACCELERATED", False)
    return request.param


def answer(record_set: bytes, acquired: list[tuple[int, int, int]]) -> dict:
    return {"partition_index": 0, "error_code": 0, "records": record_set,
            "acquired_records": [{"first_offset": f, "last_offset": la, "delivery_count": c} for f, la, c in acquired]}


def decode(data: dict, header_filter=None):
    return decode_partition(A0, data, header_filter=header_filter, check_crcs=True, max_uncompressed=1 << 20)


def specs(n: int, dropped: set[int] = frozenset()) -> list[RecordSpec]:
    return [RecordSpec(key=b"k%d" % i, value=b"v%d" % i, headers=[("drop", b"1")] if i in dropped else [("kind", b"x")])
            for i in range(n)]


DROP = HeaderRules([HeaderRule("drop", "exists", keep=False)])


def test_only_acquired_records_are_returned_with_their_delivery_counts(decoder):
    data = build_batch(specs(5), base_offset=10) + build_batch(specs(3), base_offset=15)
    out = decode(answer(data, [(11, 12, 1), (15, 16, 3)]))
    assert [(r.offset, r.value, r.delivery_count) for r in out.records] == \
        [(11, b"v1", 1), (12, b"v2", 1), (15, b"v0", 3), (16, b"v1", 3)]
    assert out.settled == [] and out.error is None
    assert out.records[0]._fields[-1] == "delivery_count" and out.records[0].topic == "a"


def test_acquired_offsets_without_a_record_are_gaps(decoder):
    # A control batch at 3 and acquired offsets past the record set's end.
    data = build_batch(specs(3), base_offset=0) + build_control_batch(base_offset=3, producer_id=7, commit=True)
    out = decode(answer(data, [(0, 5, 1)]))
    assert [r.offset for r in out.records] == [0, 1, 2]
    assert sorted(out.settled) == [(3, GAP), (4, GAP), (5, GAP)]


def test_a_record_the_header_filter_drops_is_accepted_not_returned(decoder):
    data = build_batch(specs(6, dropped={1, 4}), base_offset=20)
    out = decode(answer(data, [(20, 25, 2)]), header_filter=DROP)
    assert [r.offset for r in out.records] == [20, 22, 23, 25]
    assert sorted(out.settled) == [(21, ACCEPT), (24, ACCEPT)] and out.filtered == 2


def test_a_member_told_of_what_it_filters_hears_of_its_own_acquired_records_only(decoder):
    data = build_batch(specs(8, dropped={1, 4, 6}), base_offset=20)
    told: list = []
    out = decode_partition(A0, answer(data, [(20, 25, 2)]), header_filter=DROP, check_crcs=True,
                           max_uncompressed=1 << 20, on_filtered=told.extend)
    assert [r.offset for r in told] == [21, 24]   # 26 is dropped too, but not acquired by this member
    assert [r.offset for r in out.records] == [20, 22, 23, 25]
    assert sorted(out.settled) == [(21, ACCEPT), (24, ACCEPT)]


def test_the_c_loop_drops_without_calling_python():
    if not records.ACCELERATED:
        pytest.skip("the C record loop is not built")

    class Counting(HeaderRules):
        calls = 0

        def __call__(self, headers):
            Counting.calls += 1
            return super().__call__(headers)

    rules = Counting([HeaderRule("drop", "exists", keep=False)])
    out = decode(answer(build_batch(specs(4, dropped={0, 2}), base_offset=0), [(0, 3, 1)]), header_filter=rules)
    assert [r.offset for r in out.records] == [1, 3] and sorted(out.settled) == [(0, ACCEPT), (2, ACCEPT)]
    assert Counting.calls == 0


def test_in_a_batch_with_holes_a_dropped_record_is_accepted_and_a_hole_is_a_gap(decoder):
    # Compaction left offsets 30, 32, 33, 35 of 30..35; the filter drops 33.
    kept = [RecordSpec(key=b"k", value=b"v%d" % d, headers=[("drop", b"1")] if d == 3 else [], offset_delta=d)
            for d in (0, 2, 3, 5)]
    data = build_batch(kept, base_offset=30, last_offset_delta=5)
    assert batch_record_offsets(data, 0, len(data)) == [30, 32, 33, 35]
    out = decode(answer(data, [(30, 35, 1)]), header_filter=DROP)
    assert [r.offset for r in out.records] == [30, 32, 35]
    assert sorted(out.settled) == [(31, GAP), (33, ACCEPT), (34, GAP)]
    # Nothing dropped: the holes are gaps, no second look needed.
    out = decode(answer(data, [(30, 35, 1)]))
    assert sorted(out.settled) == [(31, GAP), (34, GAP)]


def test_a_corrupt_batch_rejects_the_rest_after_the_good_records(decoder):
    good = build_batch(specs(2), base_offset=0)
    bad = bytearray(build_batch(specs(2), base_offset=2))
    bad[-1] ^= 0xFF
    out = decode(answer(good + bytes(bad), [(0, 3, 1)]))
    assert [r.offset for r in out.records] == [0, 1]
    assert sorted(out.settled) == [(2, REJECT), (3, REJECT)]
    assert isinstance(out.error, CorruptRecordError) and out.error.topic == "a"


def test_nothing_acquired_nothing_decoded():
    out = decode(answer(build_batch(specs(2)), []))
    assert (out.records, out.settled) == ([], [])


# -- settings ------------------------------------------------------------------------------------------

def test_share_settings_are_typed_and_what_a_share_group_decides_is_refused():
    c = ShareConsumerConfig.from_options(bootstrap_servers="h:1", group_id="g", share_acknowledgement_mode="explicit",
                                         share_acquire_mode="record_limit", max_poll_records=7)
    assert (c.acknowledgement_mode, c.acquire_mode, c.consumer.max_poll_records) == \
        (AcknowledgementMode.EXPLICIT, AcquireMode.RECORD_LIMIT, 7)
    assert not c.consumer.enable_auto_commit
    with pytest.raises(ValueError) as err:
        ShareConsumerConfig.from_options(bootstrap_servers="h:1", share_acknowledgement_mode="auto",
                                         auto_offset_reset="earliest", group_instance_id="i")
    text = str(err.value)
    for said in ("share_acknowledgement_mode='auto' is not one of implicit, explicit",
                 "auto_offset_reset cannot be set on a share consumer", "group_instance_id cannot be set",
                 "group_id is required"):
        assert said in text, text


# -- the consumer's answers, without a broker --------------------------------------------------------
# A ShareConsumer that never connects (nothing listens on port 1): answers are handed to it as
# the network would, to see what it makes of them.

import time  # noqa: E402

from kdaemon.client.errors import InvalidRecordStateError  # noqa: E402
from kdaemon.client.share.consumer import ShareConsumer  # noqa: E402
from kdaemon.client.share.exchange import Buffered, Sent  # noqa: E402
from kdaemon.protocol.apis import SHARE_ACKNOWLEDGE, SHARE_FETCH  # noqa: E402
from kdaemon.protocol.errors import BrokerError  # noqa: E402


@pytest.fixture
def offline():
    c = ShareConsumer("127.0.0.1:1", group_id="g", share_acknowledgement_mode="explicit")
    seen = []
    c.set_acknowledgement_commit_callback(lambda offsets, error: seen.append((offsets, error)))
    yield c, seen
    c._closed = True
    c._network.close()


def acknowledged(c: ShareConsumer, kind, offsets=(0,), deadline=None) -> Sent:
    """Offsets of A0 delivered from node 1, given ``kind``, taken into a ShareAcknowledge."""
    now = time.monotonic()
    c._inflight.deliver(A0, [rec(A0, o) for o in offsets], 1, ID_A, now + 30 if deadline is None else deadline)
    for o in offsets:
        c._inflight.acknowledge(A0, o, kind)
    session = c._exchange._sessions.setdefault(1, ShareSession(1))
    session.build_fetch({A0: ID_A}, {}, {})
    session.handled(Errors.NONE)
    taken = c._inflight.take(1, now)
    return Sent(SHARE_ACKNOWLEDGE, 1, session.build_acknowledge(taken.acks, taken.topic_ids), taken, now, {})


def ack_answer(code: int = 0, top: int = 0, lock_ms: int = 0) -> tuple[int, dict]:
    return 2, {"throttle_time_ms": 0, "error_code": top, "error_message": None,
               "acquisition_lock_timeout_ms": lock_ms, "node_endpoints": [],
               "responses": [{"topic_id": ID_A, "partitions": [{"partition_index": 0, "error_code": code,
                                                                 "error_message": None,
                                                                 "current_leader": {"leader_id": -1, "leader_epoch": -1}}]}]}


def test_a_fetched_record_whose_lock_ran_out_is_never_returned(offline):
    c, _ = offline
    now = time.monotonic()
    c._exchange.buffer.append(Buffered(A0, 1, ID_A, now - 0.001, [rec(A0, 0), rec(A0, 1)]))
    c._exchange.buffer.append(Buffered(B0, 1, ID_B, now + 30, [rec(B0, 5)]))
    assert {tp: [r.offset for r in rs] for tp, rs in c._exchange.collect(now).items()} == {B0: [5]}
    assert set(c._inflight.delivered) == {B0}


def test_a_renewed_record_comes_back_from_the_next_poll_under_its_new_lock(offline):
    c, seen = offline
    sent = acknowledged(c, AcknowledgeType.RENEW)
    assert sent.taken.renew
    sent.value = ack_answer(lock_ms=5000)
    c._exchange.apply(sent)
    assert seen == []                   # callbacks run in the application's next call
    c._run_callbacks()
    assert sent.results == {A0: None} and seen == [({A0: {0}}, None)]
    (b,) = c._exchange.buffer
    assert [r.offset for r in b.records] == [0] and b.deadline == pytest.approx(sent.sent_at + 5)
    assert [r.offset for r in c._exchange.collect(time.monotonic())[A0]] == [0]


def test_invalid_record_state_is_reported_per_partition(offline):
    c, seen = offline
    sent = acknowledged(c, AcknowledgeType.ACCEPT, offsets=(3, 4))
    sent.value = ack_answer(code=Errors.INVALID_RECORD_STATE)
    c._exchange.apply(sent)
    c._run_callbacks()
    assert isinstance(sent.results[A0], InvalidRecordStateError) and "3-4" in str(sent.results[A0])
    assert seen[0][0] == {A0: {3, 4}} and seen[0][1] is sent.results[A0]
    assert c._exchange._sessions[1].epoch == 2


def test_a_session_error_fails_the_acknowledgements_and_opens_a_new_session(offline):
    c, seen = offline
    sent = acknowledged(c, AcknowledgeType.ACCEPT)
    sent.value = ack_answer(top=Errors.INVALID_SHARE_SESSION_EPOCH)
    c._exchange.apply(sent)
    assert isinstance(sent.results[A0], BrokerError) and c._exchange._sessions[1].epoch == 0


def test_a_fetch_answer_buffers_the_members_records_and_settles_the_rest(offline):
    c, _ = offline
    c._metadata.topic_names[ID_A] = "a"
    now = time.monotonic()
    session = c._exchange._sessions.setdefault(1, ShareSession(1))
    request = session.build_fetch({A0: ID_A}, {}, {})
    sent = Sent(SHARE_FETCH, 1, request, c._inflight.take(1, now), now, None)
    data = build_batch(specs(4, dropped={2}), base_offset=0)
    sent.value = (2, {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                      "acquisition_lock_timeout_ms": 15000, "node_endpoints": [],
                      "responses": [{"topic_id": ID_A, "partitions": [dict(
                          answer(data, [(1, 3, 2)]), acknowledge_error_code=0, acknowledge_error_message=None,
                          error_message=None, current_leader={"leader_id": -1, "leader_epoch": -1})]}]})
    c._exchange.config = c.config.replace(header_filter=DROP)
    c._exchange.apply(sent)
    assert c.acquisition_lock_timeout_ms() == 15000 and session.epoch == 1
    (b,) = c._exchange.buffer
    assert [(r.offset, r.delivery_count) for r in b.records] == [(1, 2), (3, 2)]
    taken = c._inflight.take(1, now)
    assert taken.acks == {A0: [(2, ACCEPT)]} and taken.shown == {}   # dropped: accepted, unreported


def test_poll_needs_a_subscription_and_wakeup_interrupts_it(offline):
    from kdaemon.client.errors import AcknowledgementError, WakeupError
    c, _ = offline
    with pytest.raises(ValueError, match="subscribe"):
        c.poll(0)
    c.subscribe(["a"])
    c.wakeup()
    with pytest.raises(WakeupError):
        c.poll(10_000)
    with pytest.raises(AcknowledgementError, match="cannot be acknowledged"):
        c.acknowledge(rec(A0, 0), AcknowledgeType.ACCEPT)
    with pytest.raises(ValueError, match="non-empty"):
        c.subscribe(["a", ""])
