"""Position validation after a leader change (KIP-320).

Pure, no broker, no sockets: the state machine of ``kdaemon/client/validation.py`` on real
``SubscriptionState`` and ``ClusterMetadata`` objects, answers given as the decoded bodies a broker
sends, and the epoch a position carries after draining real record batches.  Last, one test on
librdkafka's mock cluster, which has no OffsetForLeaderEpoch: validation is skipped there, not
waited for.  The Kafka side (an unclean election that truncates a log under a consumer) is
tests/client/test_truncation_kafka.py.
"""

from __future__ import annotations

import struct
import time
import uuid

import pytest

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.errors import LogTruncationError, OffsetOutOfRangeError
from kdaemon.client.fetcher import CompletedFetch
from kdaemon.client.metadata import ClusterMetadata
from kdaemon.client.subscription import EARLIEST, LATEST, SubscriptionState
from kdaemon.client.types import OffsetAndMetadata, TopicPartition
from kdaemon.client.validation import (COMPLETE, DECISIONS, RAISE, RESET, SEEK_TO_END, TRUNCATED, UNKNOWN,
                                       VALID, CheckedPosition, PositionValidator, Truncation, apply_answer,
                                       finding, leader_changed, skip_validation)
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.errors import Errors, UnsupportedVersionError
from kdaemon.protocol.records import RecordSetReader

TP = TopicPartition("orders", 0)
TP1 = TopicPartition("orders", 1)
TOPIC_ID = uuid.UUID(int=0x5EED)


# -- the decision table ---------------------------------------------------------------------------

def test_decision_table_covers_every_case_as_java_does():
    assert DECISIONS == {
        (VALID, True): COMPLETE, (VALID, False): COMPLETE,
        # A known end offset is where Java goes whatever the policy (not a reset by the policy).
        (TRUNCATED, True): SEEK_TO_END, (TRUNCATED, False): RAISE,
        (UNKNOWN, True): RESET, (UNKNOWN, False): RAISE,
    }


@pytest.mark.parametrize("position, epoch, end, expected", [
    (100, 4, 100, VALID),        # the epoch ends exactly at our position: nothing lost
    (100, 4, 250, VALID),        # and past it
    (100, 4, 99, TRUNCATED),
    (100, 3, 0, TRUNCATED),
    (100, -1, 80, UNKNOWN),      # the leader does not know the epoch
    (100, 4, -1, UNKNOWN),
    (100, -1, -1, UNKNOWN),
])
def test_finding(position, epoch, end, expected):
    assert finding(position, epoch, end) == expected


# -- entering validation --------------------------------------------------------------------------

def _subs(policy: str = EARLIEST, *partitions: TopicPartition) -> SubscriptionState:
    subs = SubscriptionState(policy)
    subs.assign(partitions or [TP])
    return subs


def test_a_position_with_an_epoch_awaits_validation_when_the_leader_changes():
    subs = _subs()
    st = subs.state(TP)
    subs.seek(TP, 100, 3)
    # The first check after a seek records the leader and validates (Java's seekUnvalidated).
    assert leader_changed(st, 1, 5) is True
    assert st.position_leader == (1, 5)
    assert not st.has_valid_position and subs.fetchable() == []
    assert subs.needing_validation(0.0) == [TP]
    # The same leader again changes nothing: still waiting, still due.
    assert leader_changed(st, 1, 5) is True
    st.awaiting_validation = False   # validated
    assert leader_changed(st, 1, 5) is False and subs.fetchable() == [TP]
    # A new epoch of the same leader (it was re-elected) validates again; so does a new node.
    assert leader_changed(st, 1, 6) is True
    st.awaiting_validation = False
    assert leader_changed(st, 2, 6) is True


def test_no_validation_without_an_epoch_to_check():
    subs = _subs()
    st = subs.state(TP)
    subs.seek(TP, 100)                     # a plain seek: no epoch (Java's seekValidated)
    assert leader_changed(st, 1, 5) is False
    assert st.position_leader == (1, 5) and st.has_valid_position
    subs.seek(TP, 100, 3)
    assert leader_changed(st, 1, -1) is False   # a broker that reports no leader epochs


def test_nothing_happens_without_position_leader_or_during_a_reset():
    subs = _subs()
    st = subs.state(TP)
    assert leader_changed(st, 1, 5) is False and st.position_leader is None   # no position yet
    subs.seek(TP, 100, 3)
    assert leader_changed(st, None, 5) is False and st.position_leader is None  # leader unknown
    subs.request_reset(TP)
    assert leader_changed(st, 1, 5) is False and st.position_leader is None


def test_a_leader_change_drops_the_preferred_read_replica_and_retries_at_once():
    subs = _subs()
    st = subs.state(TP)
    subs.seek(TP, 10, 1)
    leader_changed(st, 1, 1)
    st.preferred_read_replica = 3
    st.validation_in_flight = True
    st.next_validation_attempt = 1e12
    assert leader_changed(st, 2, 2) is True
    assert st.preferred_read_replica is None
    assert not st.validation_in_flight and st.next_validation_attempt == 0.0


def test_seek_and_reset_end_a_validation():
    subs = _subs()
    st = subs.state(TP)
    subs.seek(TP, 100, 3)
    leader_changed(st, 1, 5)
    version = subs.positions_version
    subs.seek(TP, 40)
    assert not st.awaiting_validation and st.position_leader is None
    assert subs.positions_version == version + 1
    subs.seek(TP, 100, 3)
    leader_changed(st, 1, 5)
    subs.request_reset(TP)
    assert not st.awaiting_validation and st.reset_strategy == EARLIEST


def test_skip_validation_when_the_leader_cannot_answer():
    subs = _subs()
    st = subs.state(TP)
    subs.seek(TP, 100, 3)
    leader_changed(st, 1, 5)
    skip_validation(st)
    assert st.has_valid_position and st.position == 100


# -- applying an answer ---------------------------------------------------------------------------

def _awaiting(policy: str = EARLIEST, position: int = 100, epoch: int = 3):
    subs = _subs(policy)
    subs.seek(TP, position, epoch)
    st = subs.state(TP)
    leader_changed(st, 1, 5)
    return subs, st


def test_valid_answer_resumes_fetching():
    subs, st = _awaiting()
    assert apply_answer(st, TP, 3, 100, True, subs.request_reset) is None
    assert st.has_valid_position and (st.position, st.position_epoch) == (100, 3)


def test_valid_answer_for_an_epoch_the_leader_never_had_takes_its_epoch():
    # The leader answers with the largest epoch <= ours it knows: the position takes that one,
    # as Java's, so a later validation asks about an epoch the leader has.
    subs, st = _awaiting()
    assert apply_answer(st, TP, 2, 150, True, subs.request_reset) is None
    assert (st.position, st.position_epoch, st.has_valid_position) == (100, 2, True)


@pytest.mark.parametrize("policy", [EARLIEST, LATEST])
def test_truncation_with_a_policy_goes_to_the_divergent_offset(policy):
    subs, st = _awaiting(policy)
    assert apply_answer(st, TP, 4, 70, True, subs.request_reset) is None
    assert (st.position, st.position_epoch) == (70, 4)
    assert st.position_leader == (1, 5)              # validated: no second round
    assert st.has_valid_position and st.reset_strategy is None


def test_truncation_without_a_policy_reports_the_divergent_offset_and_stays_unfetched():
    subs, st = _awaiting("none")
    assert apply_answer(st, TP, 4, 70, False, subs.request_reset) == Truncation(100, OffsetAndMetadata(70, "", 4))
    assert st.awaiting_validation and not st.validation_in_flight
    assert (st.position, st.position_epoch) == (100, 3)   # untouched until the application seeks
    assert subs.fetchable() == []


def test_unknown_epoch_resets_by_the_policy_or_raises_without_one():
    subs, st = _awaiting(LATEST)
    assert apply_answer(st, TP, -1, -1, True, subs.request_reset) is None
    assert st.reset_strategy == LATEST and not st.awaiting_validation
    subs, st = _awaiting("none")
    assert apply_answer(st, TP, -1, -1, False, subs.request_reset) == Truncation(100, None)
    assert st.awaiting_validation and st.reset_strategy is None


def test_log_truncation_error_names_partition_offsets_and_epochs():
    exc = LogTruncationError({TP: (100, OffsetAndMetadata(70, "", 4)), TP1: (9, None)})
    assert isinstance(exc, OffsetOutOfRangeError)
    assert exc.offsets == {TP: 100, TP1: 9}
    assert exc.divergent_offsets == {TP: OffsetAndMetadata(70, "", 4), TP1: None}
    text = str(exc)
    assert "orders-0 at offset 100, divergent offset 70 (leader epoch 4)" in text
    assert "orders-1 at offset 9" in text and "divergent offset is unknown" in text
    assert "auto_offset_reset='none'" in text


# -- the validator on real metadata and subscription objects --------------------------------------

def _metadata(leader: int = 1, epoch: int = 5) -> ClusterMetadata:
    md = ClusterMetadata()
    md.set_wanted({"orders"})
    _set_leader(md, leader, epoch)
    return md


def _set_leader(md: ClusterMetadata, leader: int, epoch: int) -> None:
    md.handle_response({
        "brokers": [{"node_id": n, "host": "127.0.0.1", "port": 9000 + n, "rack": None} for n in (1, 2)],
        "cluster_id": "c", "controller_id": 1,
        "topics": [{"name": "orders", "error_code": 0, "topic_id": TOPIC_ID, "is_internal": False,
                    "partitions": [{"error_code": 0, "partition_index": p, "leader_id": leader,
                                    "leader_epoch": epoch, "replica_nodes": [1, 2], "isr_nodes": [leader],
                                    "offline_replicas": []} for p in (0, 1)]}],
    }, 0.0)


def _validator(policy: str = EARLIEST, *partitions: TopicPartition):
    config = ConsumerConfig(auto_offset_reset=policy)
    md = _metadata()
    subs = _subs(policy, *partitions)
    # No network: these tests never get as far as sending (nothing is due, or answers are given).
    return PositionValidator(config, None, md, subs), md, subs


def _answer(*partitions: tuple[int, int, int, int]) -> dict:
    return {"throttle_time_ms": 0, "topics": [{"topic": "orders", "partitions": [
        {"error_code": code, "partition": p, "leader_epoch": epoch, "end_offset": end}
        for p, code, epoch, end in partitions]}]}


def test_check_leaders_runs_only_when_metadata_or_positions_moved():
    v, md, subs = _validator(EARLIEST, TP, TP1)
    subs.seek(TP, 100, 3)
    subs.seek(TP1, 7)
    v.check_leaders()
    assert subs.state(TP).awaiting_validation and not subs.state(TP1).awaiting_validation
    assert subs.state(TP1).position_leader == (1, 5)
    # Validated; a check with nothing moved does not look again.
    subs.state(TP).awaiting_validation = False
    subs.state(TP).position_leader = (9, 9)
    v.check_leaders()
    assert not subs.state(TP).awaiting_validation
    # A metadata update with a new leader epoch: both partitions are looked at; only the one
    # with an epoch is validated.
    _set_leader(md, 2, 6)
    v.check_leaders()
    assert subs.state(TP).awaiting_validation and subs.state(TP).position_leader == (2, 6)
    assert not subs.state(TP1).awaiting_validation and subs.state(TP1).position_leader == (2, 6)


def _in_flight(v: PositionValidator, subs: SubscriptionState, *tps: TopicPartition) -> dict:
    v.check_leaders()
    requested = {}
    for tp in tps:
        st = subs.state(tp)
        st.validation_in_flight = True
        requested[tp] = CheckedPosition.of(st)
    return requested


def test_answers_complete_seek_and_ignore_stale_positions():
    v, md, subs = _validator(EARLIEST, TP, TP1)
    subs.seek(TP, 100, 3)
    subs.seek(TP1, 50, 3)
    requested = _in_flight(v, subs, TP, TP1)
    subs.seek(TP1, 10)             # the application moved on meanwhile: that answer is stale
    v.handle_answer(requested, _answer((0, 0, 4, 60), (1, 0, 4, 5)))
    assert (subs.state(TP).position, subs.state(TP).position_epoch) == (60, 4)
    assert subs.state(TP).has_valid_position
    assert (subs.state(TP1).position, subs.state(TP1).awaiting_validation) == (10, False)
    v.validate_positions()         # nothing cached to raise, nothing due


def test_truncation_without_policy_is_raised_once_from_the_next_validate():
    v, md, subs = _validator("none")
    subs.seek(TP, 100, 3)
    requested = _in_flight(v, subs, TP)
    subs.state(TP).next_validation_attempt = 1e18   # as _send sets it (request timeout)
    v.handle_answer(requested, _answer((0, 0, 4, 60)))
    with pytest.raises(LogTruncationError) as info:
        v.validate_positions()
    assert info.value.offsets == {TP: 100}
    assert info.value.divergent_offsets == {TP: OffsetAndMetadata(60, "", 4)}
    assert subs.fetchable() == []
    v.validate_positions()         # raised once; the retry waits for its timer (not due yet)
    subs.seek(TP, 60)              # the application's answer: fetching resumes, unvalidated
    v.check_leaders()
    assert subs.fetchable() == [TP]


def test_retriable_errors_and_missing_answers_back_off_and_refresh_metadata():
    v, md, subs = _validator(EARLIEST, TP, TP1)
    subs.seek(TP, 100, 3)
    subs.seek(TP1, 100, 3)
    requested = _in_flight(v, subs, TP, TP1)
    md._need_update = False
    v.handle_answer(requested, _answer((0, Errors.FENCED_LEADER_EPOCH, -1, -1)))   # and no answer for 1
    for tp in (TP, TP1):
        st = subs.state(tp)
        assert st.awaiting_validation and not st.validation_in_flight
        assert st.next_validation_attempt > 0
    assert md.update_due(1e12)
    v.validate_positions()          # retriable: nothing raised


def test_authorization_failure_is_raised():
    v, md, subs = _validator()
    subs.seek(TP, 100, 3)
    requested = _in_flight(v, subs, TP)
    v.handle_answer(requested, _answer((0, Errors.TOPIC_AUTHORIZATION_FAILED, -1, -1)))
    with pytest.raises(Exception, match="OffsetForLeaderEpoch orders"):
        v.validate_positions()


def test_a_broker_without_a_usable_version_is_not_asked_again():
    v, md, subs = _validator()
    subs.seek(TP, 100, 3)
    requested = _in_flight(v, subs, TP)
    v.handle_failure(requested, UnsupportedVersionError("OffsetForLeaderEpoch: need v3-v4"))
    assert subs.fetchable() == [TP]


# -- diverging epochs from Fetch ------------------------------------------------------------------

def test_diverging_epoch_below_the_position_seeks_with_a_policy():
    v, md, subs = _validator(LATEST)
    subs.seek(TP, 100, 3)
    v.check_leaders()
    subs.state(TP).awaiting_validation = False
    v.on_diverging_epoch(TP, 100, 3, 4, 70)
    st = subs.state(TP)
    assert (st.position, st.position_epoch, st.has_valid_position) == (70, 4, True)


def test_diverging_epoch_without_policy_raises_and_stops_fetching():
    v, md, subs = _validator("none")
    subs.seek(TP, 100, 3)
    v.check_leaders()
    subs.state(TP).awaiting_validation = False
    with pytest.raises(LogTruncationError, match="orders-0 at offset 100, divergent offset 70"):
        v.on_diverging_epoch(TP, 100, 3, 4, 70)
    assert subs.fetchable() == []
    assert subs.needing_validation(0.0) == []     # asked again only after request_timeout_ms


def test_diverging_epoch_at_or_past_the_position_only_adopts_the_leaders_epoch():
    v, md, subs = _validator("none")
    subs.seek(TP, 100, 3)
    v.check_leaders()
    subs.state(TP).awaiting_validation = False
    v.on_diverging_epoch(TP, 100, 3, 2, 120)
    st = subs.state(TP)
    assert (st.position, st.position_epoch, st.has_valid_position) == (100, 2, True)


def test_diverging_epoch_for_an_old_fetch_offset_is_ignored():
    v, md, subs = _validator("none")
    subs.seek(TP, 100, 3)
    v.on_diverging_epoch(TP, 90, 3, 4, 70)
    assert subs.state(TP).position == 100


def test_diverging_epoch_about_another_epoch_than_the_positions_is_ignored():
    # A fetch sent ahead at 100 with epoch 3; meanwhile the buffered answer before it was drained
    # and moved the position to 100 in epoch 5.  The leader's "epoch 3 ends at 80" is true and
    # says nothing about where epoch 5 ends: no truncation, nothing raised, nothing moved.
    v, md, subs = _validator("none")
    subs.seek(TP, 100, 5)
    v.check_leaders()
    subs.state(TP).awaiting_validation = False
    v.on_diverging_epoch(TP, 100, 3, 3, 80)
    st = subs.state(TP)
    assert (st.position, st.position_epoch, st.has_valid_position) == (100, 5, True)


# -- the epoch a position carries after draining batches ------------------------------------------

def _take_all(data: bytes, fetch_offset: int, header_filter=None) -> CompletedFetch:
    cf = CompletedFetch(TP, fetch_offset, {"error_code": 0, "records": data}, len(data))
    cf.reader = RecordSetReader(data, topic=TP.topic, partition=TP.partition, fetch_offset=fetch_offset,
                                header_filter=header_filter)
    return cf


def test_position_epoch_is_the_last_batch_read_even_when_all_of_it_was_filtered():
    keep = RecordSpec(value=b"k", headers=[("type", b"keep")])
    drop = RecordSpec(value=b"d", headers=[("type", b"drop")])
    data = (build_batch([keep, keep], base_offset=0, leader_epoch=3)
            + build_batch([drop, drop, drop], base_offset=2, leader_epoch=7))
    cf = _take_all(data, 0, header_filter=lambda headers: headers == [("type", b"keep")])
    records, position = cf.take(100)
    assert [r.offset for r in records] == [0, 1] and records[-1].leader_epoch == 3
    # The position is past the filtered batch, so its epoch is that batch's: epoch 3 would end
    # (at offset 2) before the position and look like a truncation to the leader.
    assert (position, cf.last_epoch) == (5, 7)


def _commit_marker(base_offset: int, leader_epoch: int) -> bytes:
    key = struct.pack(">hh", 0, 1)          # control record v0, type 1 = COMMIT
    value = struct.pack(">hi", 0, 0)        # version, coordinator epoch
    return build_batch([RecordSpec(key=key, value=value)], base_offset=base_offset, producer_id=9,
                       producer_epoch=0, transactional=True, control=True, leader_epoch=leader_epoch)


def test_position_epoch_follows_a_control_batch_and_a_partial_take():
    data = (build_batch([RecordSpec(value=b"a"), RecordSpec(value=b"b")], base_offset=10, leader_epoch=2)
            + _commit_marker(base_offset=12, leader_epoch=4))
    cf = _take_all(data, 10)
    records, position = cf.take(1)
    assert (position, cf.last_epoch) == (11, 2)
    records, position = cf.take(10)
    assert (position, cf.last_epoch) == (13, 4)


# -- a broker that cannot answer: librdkafka's mock cluster has no OffsetForLeaderEpoch -----------

def test_a_leader_change_on_a_broker_without_the_api_is_not_waited_for(mock_cluster, caplog):
    """Java skips validation when the leader cannot answer OffsetForLeaderEpoch v3+; so do we,
    and the partition is fetched on at once instead of stalling."""
    from kdaemon.client import Consumer
    from testkit.produce import Record, produce

    topic = f"validation-{uuid.uuid4().hex[:8]}"
    tp = TopicPartition(topic, 0)
    mock_cluster.topic_create(topic, 1, replication=3)
    mock_cluster.partition_set_leader(topic, 0, 1)
    produce(mock_cluster.bootstrap, topic, [Record(value=b"a%d" % i) for i in range(3)], partition=0)
    sent = []
    caplog.set_level("INFO", logger="kdaemon.client.validation")
    with Consumer(mock_cluster.bootstrap, auto_offset_reset="earliest", metadata_max_age_ms=500) as c:
        c._network.observers.append(lambda node, api, version, body, response: sent.append(api.name))
        c.assign([tp])
        got = []

        def read(n: int) -> None:
            deadline = time.monotonic() + 30
            while len(got) < n and time.monotonic() < deadline:
                got.extend(r for rs in c.poll(200).values() for r in rs)

        read(3)
        state = c._subscriptions.state(tp)
        before = state.position_leader
        assert state.position_epoch is not None and before is not None and before[0] == 1
        mock_cluster.partition_set_leader(topic, 0, 2)
        produce(mock_cluster.bootstrap, topic, [Record(value=b"b%d" % i) for i in range(3)], partition=0)
        read(6)
        assert [r.offset for r in got] == list(range(6))
        assert state.position_leader[0] == 2 and state.position_leader[1] >= 0
        assert not state.awaiting_validation
    assert "OffsetForLeaderEpoch" not in sent
    # It did enter validation (an epoch on both sides), and skipped it.
    assert "broker 2 cannot validate positions" in caplog.text


def test_a_position_awaiting_validation_is_not_committed():
    """Java's allConsumed leaves AWAIT_VALIDATION out: the position may lie past a truncated end."""
    other = TopicPartition(TP.topic, TP.partition + 1)
    subs = _subs(EARLIEST, TP, other)
    subs.seek(TP, 100, 3)
    subs.seek(other, 7, 3)
    assert subs.all_consumed() == {TP: (100, 3), other: (7, 3)}
    assert leader_changed(subs.state(TP), 1, 5) is True
    assert subs.all_consumed() == {other: (7, 3)}
