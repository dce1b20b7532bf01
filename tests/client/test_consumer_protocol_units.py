"""The consumer group protocol (KIP-848) without a broker: the pure reconciliation and heartbeat
request logic, and the membership driven through scripted coordinator answers (errors Kafka
will not produce on demand: UNRELEASED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED, a stale epoch on a
commit racing a heartbeat, a coordinator loading).  The Kafka suite is
tests/client/test_consumer_protocol_basic_kafka.py."""

from __future__ import annotations

import time
import uuid

import pytest

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.errors import CommitFailedError, GroupError, RebalanceInProgressError
from kdaemon.client.future import Future
from kdaemon.client.group.commits import OffsetCommits
from kdaemon.client.group.consumer_group import ConsumerMembership
from kdaemon.client.group.consumer_heartbeat import (ConsumerHeartbeatTimer, HeartbeatRequestState, MemberFields,
                                                     leave_request)
from kdaemon.client.group.reconcile import owned_by_topic_id, plan, resolve_target
from kdaemon.client.group.state import IllegalTransition, MemberEvent, MemberState, MemberStateMachine
from kdaemon.client.metadata import ClusterMetadata
from kdaemon.client.network import NetworkClient
from kdaemon.client.subscription import SubscriptionState
from kdaemon.client.types import OffsetAndMetadata, TopicPartition
from kdaemon.protocol.apis import CONSUMER_GROUP_HEARTBEAT, OFFSET_COMMIT
from kdaemon.protocol.errors import Errors

A, B = uuid.UUID(int=0xA), uuid.UUID(int=0xB)


def tp(topic: str, p: int) -> TopicPartition:
    return TopicPartition(topic, p)


# -- reconcile.py ---------------------------------------------------------------------------------


def test_resolving_a_target_names_what_metadata_knows_and_keeps_the_rest_pending():
    r = resolve_target({A: [0, 1], B: [2]}, {A: "a"})
    assert r.partitions == {tp("a", 0), tp("a", 1)}
    assert r.topic_ids == {"a": A}
    assert r.unresolved == {B: frozenset({2})}


def test_a_plan_revokes_what_goes_adds_what_comes_and_keeps_the_rest():
    change = plan({tp("a", 0), tp("a", 1)}, {tp("a", 1), tp("a", 2)})
    assert change.revoked == {tp("a", 0)}
    assert change.added == {tp("a", 2)}
    assert change.kept == {tp("a", 1)}
    assert change.owned_after == {tp("a", 1), tp("a", 2)}
    assert not plan({tp("a", 0)}, {tp("a", 0)}).changes


def test_owned_partitions_are_reported_by_topic_id_in_one_order():
    one = owned_by_topic_id([tp("b", 2), tp("a", 1), tp("a", 0)], {"a": A, "b": B})
    two = owned_by_topic_id([tp("a", 0), tp("b", 2), tp("a", 1)], {"a": A, "b": B})
    assert one == two == ((A, (0, 1)), (B, (2,)))
    with pytest.raises(ValueError, match="c-0 has no known topic id"):
        owned_by_topic_id([tp("c", 0)], {"a": A})


# -- consumer_heartbeat.py ------------------------------------------------------------------------


def fields(**kw) -> MemberFields:
    base = dict(instance_id=None, rack_id="r1", rebalance_timeout_ms=300_000, subscribed_topic_names=("a",),
                subscribed_topic_regex=None, server_assignor=None, owned=())
    base.update(kw)
    return MemberFields(**base)


def test_a_join_is_a_full_request_and_later_ones_carry_only_what_changed():
    state = HeartbeatRequestState()
    f = fields(instance_id="i-1", server_assignor="uniform")
    join = state.build("g", "m", 0, f)
    assert join == {"group_id": "g", "member_id": "m", "member_epoch": 0, "instance_id": "i-1", "rack_id": "r1",
                    "rebalance_timeout_ms": 300_000, "subscribed_topic_names": ["a"],
                    "subscribed_topic_regex": None, "server_assignor": "uniform", "topic_partitions": []}
    state.acknowledged(f)
    quiet = state.build("g", "m", 3, f)
    assert quiet == {"group_id": "g", "member_id": "m", "member_epoch": 3, "instance_id": "i-1", "rack_id": None,
                     "rebalance_timeout_ms": -1, "subscribed_topic_names": None, "subscribed_topic_regex": None,
                     "server_assignor": None, "topic_partitions": None}
    owned = f.__class__(**{**f.__dict__, "owned": ((A, (0, 1)),), "subscribed_topic_names": ("a", "b")})
    ack = state.build("g", "m", 3, owned)
    assert ack["topic_partitions"] == [{"topic_id": A, "partitions": [0, 1]}]
    assert ack["subscribed_topic_names"] == ["a", "b"]
    assert ack["rack_id"] is None and ack["rebalance_timeout_ms"] == -1
    # Not acknowledged yet: the same news goes out again.
    assert state.build("g", "m", 3, owned)["topic_partitions"] == [{"topic_id": A, "partitions": [0, 1]}]
    state.reset()   # an error or a new coordinator: everything again
    full = state.build("g", "m", 3, owned)
    assert full["instance_id"] == "i-1" and full["rebalance_timeout_ms"] == 300_000 and full["rack_id"] == "r1"
    assert full["topic_partitions"] == [{"topic_id": A, "partitions": [0, 1]}]


def test_switching_between_a_topic_list_and_a_regex_clears_the_other():
    state = HeartbeatRequestState()
    names = fields()
    state.acknowledged(names)
    regex = fields(subscribed_topic_names=None, subscribed_topic_regex="a.*")
    body = state.build("g", "m", 2, regex)
    assert (body["subscribed_topic_regex"], body["subscribed_topic_names"]) == ("a.*", [])
    state.acknowledged(regex)
    back = state.build("g", "m", 2, names)
    assert (back["subscribed_topic_regex"], back["subscribed_topic_names"]) == ("", ["a"])


def test_a_leave_is_epoch_minus_one_or_minus_two_for_a_static_member():
    assert leave_request("g", "m", None)["member_epoch"] == -1
    static = leave_request("g", "m", "i-1")
    assert (static["member_epoch"], static["instance_id"]) == (-2, "i-1")
    for_good = leave_request("g", "m", "i-1", for_good=True)     # a static member not coming back
    assert (for_good["member_epoch"], for_good["instance_id"]) == (-1, "i-1")


def test_the_heartbeat_timer_follows_the_broker_interval_and_backs_off_after_errors():
    t = ConsumerHeartbeatTimer(max_poll_interval_ms=10_000, now=100.0)
    assert t.due(100.0, urgent=False)
    t.sent(100.0)
    assert not t.due(200.0, urgent=True)        # one in flight at a time
    t.received(interval_ms=2000, now=100.5)
    assert t.last_answer == 100.5
    assert not t.due(101.0, urgent=False) and t.due(101.0, urgent=True) and t.due(102.0, urgent=False)
    t.sent(102.0)
    t.failed(102.5, 0.1)
    assert not t.due(102.55, urgent=True) and t.due(102.6, urgent=True)
    assert not t.poll_timeout_expired(110.0) and t.poll_timeout_expired(110.1)


# -- state.py: the consumer protocol's path through the table -----------------------------------


def test_the_consumer_protocol_moves_through_the_state_table_and_nothing_else():
    S, E = MemberState, MemberEvent
    m = MemberStateMachine()
    with pytest.raises(IllegalTransition, match="target_changed in state unjoined"):
        m.apply(E.TARGET_CHANGED)
    assert [m.apply(e) for e in (E.JOIN_SENT, E.JOINED, E.RECONCILED)] == \
        [S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE]
    assert m.stable
    assert m.apply(E.TARGET_CHANGED) is S.COMPLETING_REBALANCE and not m.stable
    assert m.apply(E.TARGET_CHANGED) is S.COMPLETING_REBALANCE
    with pytest.raises(IllegalTransition, match="reconciled in state unjoined"):
        m.apply(E.RESET)
        m.apply(E.RECONCILED)
    m.apply(E.FATAL_ERROR, GroupError("refused"))
    assert m.apply(E.TARGET_CHANGED) is S.FATAL and m.apply(E.RECONCILED) is S.FATAL


# -- config ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [("session_timeout_ms", 10_000), ("heartbeat_interval_ms", 1000),
                                           ("partition_assignment_strategy", ("range",))])
def test_classic_only_options_are_refused_under_the_consumer_protocol(option, value):
    with pytest.raises(ValueError, match=f"{option} cannot be set with group_protocol='consumer'"):
        ConsumerConfig(group_protocol="consumer", **{option: value})
    ConsumerConfig(group_protocol="classic", **{option: value})


def test_group_protocol_and_remote_assignor_are_checked():
    assert ConsumerConfig().group_protocol == "classic"
    ConsumerConfig(group_protocol="consumer", group_remote_assignor="range")
    with pytest.raises(ValueError, match="group_protocol='modern' is not one of classic, consumer"):
        ConsumerConfig(group_protocol="modern")
    with pytest.raises(ValueError, match="group_remote_assignor='sticky' is not one of uniform, range"):
        ConsumerConfig(group_protocol="consumer", group_remote_assignor="sticky")
    with pytest.raises(ValueError, match="group_remote_assignor is for group_protocol='consumer' only"):
        ConsumerConfig(group_remote_assignor="uniform")


# -- the membership on scripted answers -----------------------------------------------------------


class ScriptedCoordinator:
    """Stands for CoordinatorLookup: records what is sent, and the test answers it."""

    def __init__(self) -> None:
        self.connection: int | None = 1
        self.sent: list[tuple[str, dict, Future]] = []
        self.marked_unknown: list[str] = []

    @property
    def known(self) -> bool:
        return self.connection is not None

    def ensure(self, deadline, drive) -> bool:
        return self.known

    def lookup(self):
        return None

    def mark_unknown(self, why: str) -> None:
        self.marked_unknown.append(why)
        self.connection = None

    def send(self, api, body, **kw) -> Future:
        fut = Future()
        self.sent.append((api.name, body, fut))
        return fut

    def last(self, api=CONSUMER_GROUP_HEARTBEAT) -> tuple[dict, Future]:
        for name, body, fut in reversed(self.sent):
            if name == api.name:
                return body, fut
        raise AssertionError(f"no {api.name} sent")


def answer(fut: Future, *, epoch: int = 0, error: int = 0, assignment=None, interval: int = 3000,
           member_id: str | None = None, message: str | None = None) -> None:
    resp = {"throttle_time_ms": 0, "error_code": error, "error_message": message, "member_id": member_id,
            "member_epoch": epoch, "heartbeat_interval_ms": interval,
            "assignment": None if assignment is None else
            {"topic_partitions": [{"topic_id": t, "partitions": ps} for t, ps in assignment.items()]}}
    fut.success((1, resp))


class Member:
    """A ConsumerMembership on real metadata and subscription state; the network lock is held
    for the whole test so the heartbeat thread never ticks on its own."""

    def __init__(self, **options) -> None:
        self.config = ConsumerConfig(group_id="g", group_protocol="consumer", **options)
        self.network = NetworkClient(self.config)
        self.metadata = ClusterMetadata()
        self.metadata.set_wanted({"a", "b"})
        self.metadata.handle_response({"brokers": [], "topics": [
            {"name": "a", "error_code": 0, "topic_id": A, "partitions": []}]}, time.monotonic())
        self.subs = SubscriptionState("earliest")
        self.coordinator = ScriptedCoordinator()
        self.commits_before_revoke: list[set] = []
        self.m = ConsumerMembership(
            self.config, self.network, self.metadata, self.subs, self.coordinator,
            before_rebalance=lambda: self.commits_before_revoke.append(set(self.subs.assigned())))
        self.calls: list[tuple[str, set]] = []
        self.subs.subscribe(["a"])

    def listener(self, name: str, partitions: set) -> None:
        self.calls.append((name, set(partitions)))

    def ensure(self) -> bool:
        return self.m.ensure_active(time.monotonic(), lambda timeout, until: None, self.listener)

    def join(self, assignment=None, epoch=1) -> None:
        self.ensure()
        body, fut = self.coordinator.last()
        assert body["member_epoch"] == 0
        answer(fut, epoch=epoch, assignment={A: [0, 1]} if assignment is None else assignment,
               member_id=body["member_id"])
        self.ensure()

    def beat(self) -> tuple[dict, Future]:
        self.m.timer.last_sent = 0.0          # the interval has passed
        before = len(self.coordinator.sent)
        self.m.heartbeat_tick()
        assert len(self.coordinator.sent) == before + 1, "no heartbeat sent"
        return self.coordinator.last()


@pytest.fixture
def member():
    made = Member()
    made.network.lock.acquire()
    yield made
    made.network.lock.release()
    made.m.close()
    made.network.close()


def test_a_member_joins_with_epoch_0_and_its_own_id_then_takes_its_assignment_and_acknowledges(member):
    member.ensure()
    join, fut = member.coordinator.last()
    assert join["member_epoch"] == 0 and len(join["member_id"]) == 22   # a UUID, base64 as in Java
    assert join["rebalance_timeout_ms"] == member.config.max_poll_interval_ms
    assert join["subscribed_topic_names"] == ["a"] and join["topic_partitions"] == []
    assert member.m.member_state is MemberState.PREPARING_REBALANCE
    answer(fut, epoch=5, assignment={A: [0, 1]}, member_id=join["member_id"], interval=2500)
    assert member.ensure() is True
    assert member.calls == [("on_partitions_assigned", {tp("a", 0), tp("a", 1)})]
    assert set(member.subs.assigned()) == {tp("a", 0), tp("a", 1)}
    assert all(member.subs.state(p).awaiting_committed for p in member.subs.assigned())
    assert (member.m.generation, member.m.stable, member.m.timer.interval) == (5, True, 2.5)
    ack, fut = member.coordinator.last()   # sent at once, not after the interval
    assert ack["member_epoch"] == 5 and ack["topic_partitions"] == [{"topic_id": A, "partitions": [0, 1]}]
    assert ack["subscribed_topic_names"] is None and ack["rebalance_timeout_ms"] == -1
    answer(fut, epoch=5)
    quiet, _ = member.beat()
    assert quiet["topic_partitions"] is None and quiet["member_epoch"] == 5


def test_a_poke_sends_the_next_heartbeat_at_once_or_right_after_the_one_in_flight(member):
    """``heartbeat_soon`` (kdaemon's supervisor relays another worker's join or new assignment):
    the next heartbeat goes out at the heartbeat thread's next tick instead of after the
    interval; asked while one is in flight, right after that one's answer (which may predate
    the change); once per poke.  A poke to a member that is joining is answered by its
    acknowledgement, the first heartbeat sent after it; one to a member that is no member yet
    is dropped (its join is newer)."""
    def sent() -> int:
        return sum(1 for name, _, _ in member.coordinator.sent if name == CONSUMER_GROUP_HEARTBEAT.name)

    member.m.heartbeat_soon()                # before the join
    member.ensure()
    member.m.heartbeat_soon()                # while joining
    join, fut = member.coordinator.last()
    answer(fut, epoch=1, assignment={A: [0, 1]}, member_id=join["member_id"])
    member.ensure()
    _, fut = member.coordinator.last()       # the acknowledgement
    answer(fut, epoch=1)
    before = sent()
    member.m.heartbeat_tick()
    assert sent() == before                  # the acknowledgement answered the poke; the interval runs
    member.m.heartbeat_soon()
    member.m.heartbeat_tick()
    assert sent() == before + 1
    body, fut = member.coordinator.last()
    assert body["member_epoch"] == 1 and body["topic_partitions"] is None   # a plain heartbeat
    member.m.heartbeat_soon()                # while that one is in flight
    member.m.heartbeat_tick()
    assert sent() == before + 1
    answer(fut, epoch=1)
    member.m.heartbeat_tick()
    assert sent() == before + 2
    _, fut = member.coordinator.last()
    answer(fut, epoch=1)
    member.m.heartbeat_tick()
    assert sent() == before + 2              # each poke is one heartbeat


def test_an_incremental_move_commits_then_revokes_only_what_goes_and_keeps_the_rest_fetching(member):
    member.join()
    kept_state = member.subs.state(tp("a", 1))
    member.subs.seek(tp("a", 1), 42)
    body, fut = member.coordinator.last()
    answer(fut, epoch=1)
    member.calls.clear()
    _, fut = member.beat()
    answer(fut, epoch=2, assignment={A: [1]})
    assert member.m.needs_attention and member.m.member_state is MemberState.COMPLETING_REBALANCE
    # Still a member with an epoch while reconciling: the commit before the revocation may go.
    assert member.m.commit_member() == (2, member.m.member_id, None)
    member.ensure()
    assert member.commits_before_revoke == [{tp("a", 0), tp("a", 1)}]
    assert member.calls == [("on_partitions_revoked", {tp("a", 0)}), ("on_partitions_assigned", set())]
    assert member.subs.assigned() == [tp("a", 1)]
    assert member.subs.state(tp("a", 1)) is kept_state and kept_state.position == 42
    ack, _ = member.coordinator.last()
    assert ack["member_epoch"] == 2 and ack["topic_partitions"] == [{"topic_id": A, "partitions": [1]}]
    assert member.m.stable and member.m.rebalances == 2
    # A revoked partition is never committed afterwards.
    assert member.m.committable({tp("a", 0): OffsetAndMetadata(5), tp("a", 1): OffsetAndMetadata(42)}) == \
        {tp("a", 1): OffsetAndMetadata(42)}


def test_an_assignment_naming_an_unknown_topic_id_waits_for_metadata(member):
    member.join(assignment={A: [0], B: [0]})
    assert member.subs.assigned() == [tp("a", 0)]        # the resolvable part now
    assert member.m.member_state is MemberState.COMPLETING_REBALANCE and not member.m.stable
    assert member.metadata.update_due(time.monotonic() + 1)
    member.metadata.handle_response({"brokers": [], "topics": [
        {"name": "a", "error_code": 0, "topic_id": A, "partitions": []},
        {"name": "b", "error_code": 0, "topic_id": B, "partitions": []}]}, time.monotonic())
    assert member.ensure() is True
    assert set(member.subs.assigned()) == {tp("a", 0), tp("b", 0)}
    assert member.calls[-1] == ("on_partitions_assigned", {tp("b", 0)})


@pytest.mark.parametrize("error", [Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID])
def test_a_fenced_member_loses_its_partitions_without_committing_and_rejoins_at_epoch_0_with_its_id(member, error):
    member.join()
    member_id = member.m.member_id
    _, fut = member.coordinator.last()
    answer(fut, epoch=1)
    member.calls.clear()
    _, fut = member.beat()
    answer(fut, error=error)
    assert member.m.member_state is MemberState.UNJOINED and member.m.generation == -1
    with pytest.raises(CommitFailedError, match="not a member"):
        member.m.commit_member()
    member.m.timer.retry_at = 0.0
    member.ensure()
    assert member.calls[0] == ("on_partitions_lost", {tp("a", 0), tp("a", 1)})
    assert member.commits_before_revoke == []
    rejoin, _ = member.coordinator.last()
    assert (rejoin["member_epoch"], rejoin["member_id"], rejoin["topic_partitions"]) == (0, member_id, [])
    assert rejoin["subscribed_topic_names"] == ["a"]    # a full request


@pytest.mark.parametrize("error, advice", [
    (Errors.UNRELEASED_INSTANCE_ID, "group_instance_id 'w-0' is still held by another member"),
    (Errors.GROUP_MAX_SIZE_REACHED, "group.consumer.max.size"),
    (Errors.UNSUPPORTED_ASSIGNOR, "group_remote_assignor=None"),
    (128, "cannot compile the subscription pattern"),
])
def test_errors_no_retry_mends_are_fatal_and_say_what_to_do(error, advice):
    made = Member(group_instance_id="w-0")
    with made.network.lock:
        made.ensure()
        _, fut = made.coordinator.last()
        answer(fut, error=error, message="refused")
        with pytest.raises(GroupError, match=advice):
            made.ensure()
        assert made.m.member_state is MemberState.FATAL
        with pytest.raises(GroupError):
            made.ensure()
    made.m.close()
    made.network.close()


def test_a_moved_coordinator_is_looked_up_again_and_then_told_everything(member):
    member.join()
    _, fut = member.coordinator.last()
    answer(fut, epoch=1)
    _, fut = member.beat()
    answer(fut, error=Errors.NOT_COORDINATOR)
    assert member.coordinator.marked_unknown == ["NOT_COORDINATOR"]
    assert member.m.stable     # still a member: only the coordinator moved
    member.coordinator.connection = 2
    member.m.coordinator_found(time.monotonic())
    member.m.timer.retry_at = 0.0
    full, _ = member.beat()
    assert full["rebalance_timeout_ms"] > 0 and full["topic_partitions"] == [{"topic_id": A, "partitions": [0, 1]}]


def test_a_loading_coordinator_is_asked_again_after_the_backoff(member):
    member.join()
    _, fut = member.coordinator.last()
    answer(fut, epoch=1)
    _, fut = member.beat()
    answer(fut, error=Errors.COORDINATOR_LOAD_IN_PROGRESS)
    assert member.m.stable and not member.coordinator.marked_unknown
    sent = len(member.coordinator.sent)
    member.m.timer.last_sent = 0.0
    member.m.heartbeat_tick()
    assert len(member.coordinator.sent) == sent     # within retry_backoff_ms
    member.m.timer.retry_at = 0.0
    again, _ = member.beat()
    assert again["subscribed_topic_names"] == ["a"]   # full after an error


def test_leaving_sends_epoch_minus_one_and_a_static_member_minus_two():
    for instance, epoch in ((None, -1), ("w-1", -2)):
        made = Member(group_instance_id=instance)
        with made.network.lock:
            made.join()
            made.m.leave("closing", partitions_lost=False)
            body, _ = made.coordinator.last()
            assert (body["member_epoch"], body["instance_id"], body["member_id"]) == (epoch, instance, made.m.member_id)
            assert made.m.generation == -1 and made.m.member_state is MemberState.UNJOINED
            sent = len(made.coordinator.sent)
            made.m.heartbeat_tick()
            assert len(made.coordinator.sent) == sent   # no rejoin until the next poll
        made.m.close()
        made.network.close()


def test_a_commit_on_a_stale_epoch_is_retried_with_the_epoch_the_heartbeat_brought(member):
    member.join()
    _, fut = member.coordinator.last()
    answer(fut, epoch=1)
    commits = OffsetCommits(member.config, member.network, member.subs, member.coordinator, member.m)
    member.subs.seek(tp("a", 0), 10)
    script = iter(["stale", "ok"])

    def drive(timeout, until):
        for name, body, fut in member.coordinator.sent:
            if name == OFFSET_COMMIT.name and not fut.done:
                step = next(script)
                code = Errors.STALE_MEMBER_EPOCH if step == "stale" else 0
                partition = {"partition_index": 0, "error_code": code}
                fut.success((9, {"topics": [{"name": "a", "partitions": [partition]}]}))
                if step == "stale":       # the heartbeat that moved the epoch on answers meanwhile
                    _, hb = member.beat()
                    answer(hb, epoch=7)

    commits.commit_sync({tp("a", 0): OffsetAndMetadata(10)}, time.monotonic() + 5, drive)
    epochs = [body["generation_id_or_member_epoch"] for name, body, _ in member.coordinator.sent
              if name == OFFSET_COMMIT.name]
    assert epochs == [1, 7]
    assert all(body["member_id"] == member.m.member_id for name, body, _ in member.coordinator.sent
               if name == OFFSET_COMMIT.name)


def test_commits_wait_for_the_join_and_offset_fetch_carries_the_member(member):
    member.ensure()
    with pytest.raises(RebalanceInProgressError):
        member.m.commit_member()
    assert member.m.fetch_member() == (None, -1)
    _, fut = member.coordinator.last()
    answer(fut, epoch=3, assignment={A: [0]})
    member.ensure()
    assert member.m.fetch_member() == (member.m.member_id, 3)


def test_a_member_not_polled_for_max_poll_interval_leaves_and_rejoins_on_the_next_poll(member):
    member.join()
    _, fut = member.coordinator.last()
    answer(fut, epoch=1)
    member.calls.clear()
    member.m.timer.last_poll = time.monotonic() - member.config.max_poll_interval_ms / 1000 - 1
    member.m.heartbeat_tick()
    leave, _ = member.coordinator.last()
    assert leave["member_epoch"] == -1 and member.m.member_state is MemberState.UNJOINED
    sent = len(member.coordinator.sent)
    member.m.heartbeat_tick()
    assert len(member.coordinator.sent) == sent          # no rejoin before the application polls
    member.m.poll(time.monotonic())
    member.ensure()
    assert member.calls[0] == ("on_partitions_lost", {tp("a", 0), tp("a", 1)})
    rejoin, _ = member.coordinator.last()
    assert rejoin["member_epoch"] == 0 and rejoin["member_id"] == member.m.member_id
