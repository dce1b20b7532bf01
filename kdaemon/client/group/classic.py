"""The classic group protocol: JoinGroup, SyncGroup, Heartbeat and LeaveGroup (seed 003).

Follows the Java ``AbstractCoordinator``/``ConsumerCoordinator`` membership.  Threads: the
application thread joins and runs the rebalance listener from ``poll``; the heartbeat thread
(``heartbeat.HeartbeatThread``) only heartbeats, and leaves the group when
``max_poll_interval_ms`` passes without a poll.  Shared state is guarded by the network client's
re-entrant lock, which is also held while response callbacks run, whichever thread completes
them.

Rebalance protocols: *eager* (range, roundrobin) revokes everything before rejoining;
*cooperative* (cooperative-sticky, KIP-429) keeps partitions across the rebalance, revokes only
those the new assignment moved away, and then rejoins once more so they can be handed on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...protocol.apis import HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, SYNC_GROUP
from ...protocol.apis.consumer_protocol import decode_assignment
from ...protocol.errors import BrokerError, DecodeError, Errors, error_code
from ..config import ConsumerConfig
from ..errors import (CommitFailedError, ConnectionFailedError, FencedInstanceIdError, GroupError,
                      RebalanceInProgressError)
from ..future import Future
from ..metadata import ClusterMetadata
from ..network import NetworkClient
from ..subscription import SubscriptionState
from ..types import TopicPartition
from .assignors import get_assignor
from .discovery import COORDINATOR_ERRORS, CoordinatorLookup
from .heartbeat import HeartbeatThread, HeartbeatTimer
from .leader import assign_as_leader, encode_member_subscription
from .membership import GroupMembership, InvokeListener
from .release import KIP345_LEAVE, leave_group_request
from .state import MemberEvent, MemberState

# The membership's log lines keep the name they had before the split into modules: operators'
# log filters (and testkit/daemon.py, which counts "joined generation" lines) match on it.
log = logging.getLogger("kdaemon.client.group.coordinator")

# JoinGroup errors no retry mends: the configuration must change.
_FATAL_JOIN = frozenset({Errors.INCONSISTENT_GROUP_PROTOCOL, Errors.INVALID_SESSION_TIMEOUT,
                         Errors.GROUP_AUTHORIZATION_FAILED, Errors.INVALID_GROUP_ID,
                         Errors.GROUP_MAX_SIZE_REACHED, Errors.UNSUPPORTED_ASSIGNOR})


class ClassicMembership(GroupMembership):
    protocol_name = "classic"

    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState, coordinator: CoordinatorLookup,
                 before_rebalance: Callable[[], None]) -> None:
        super().__init__(config, network, metadata, subscriptions, coordinator, before_rebalance)
        self.assignors = [get_assignor(name) for name in config.partition_assignment_strategy]
        # The protocol every configured assignor supports: cooperative only if all of them are.
        self.cooperative = all(a.rebalance_protocol == "cooperative" for a in self.assignors)
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self._join_future: Future | None = None
        self._joined_subscription: set[str] = set()
        self._leader_topics: dict[str, int | None] = {}
        self._assignment_snapshot: dict[str, int | None] = {}
        self._join_sent_at = 0.0
        self.timer = HeartbeatTimer(session_timeout_ms=config.session_timeout_ms,
                                    heartbeat_interval_ms=config.heartbeat_interval_ms,
                                    max_poll_interval_ms=config.max_poll_interval_ms, now=time.monotonic())
        self._poll_timeout_left = False
        self._heartbeat_thread = HeartbeatThread(self.heartbeat_tick, self.timer.interval,
                                                 name=f"kdaemon-heartbeat-{self.group_id}")

    # -- events from outside --------------------------------------------------------------------

    def coordinator_found(self, now: float) -> None:
        # A new session clock, as Java's resetSessionTimeout: otherwise a coordinator found
        # again after an outage longer than the session is dropped before the first
        # heartbeat can tell us whether we are still a member.
        self.timer.reset_session(now)

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self.state.apply(MemberEvent.FATAL_ERROR, error)

    def request_rejoin(self, reason: str) -> None:
        with self._lock:
            if not self.state.need_rejoin:
                log.info("group %s: rejoin requested: %s", self.group_id, reason)
            self.state.apply(MemberEvent.REJOIN_REQUESTED)
        # A poll() blocked on a long fetch should rejoin now, not when the fetch returns.
        self.network.interrupt()

    def reset_generation(self, reason: str) -> None:
        with self._lock:
            log.info("group %s: %s; partitions are lost, rejoining", self.group_id, reason)
            self._reset_generation()

    def poll(self, now: float) -> None:
        with self._lock:
            self.timer.polled(now)
            if self._poll_timeout_left:
                self._poll_timeout_left = False
                self.state.apply(MemberEvent.REJOIN_REQUESTED)

    def commit_member(self) -> tuple[int, str, str | None]:
        """Only a STABLE member commits (Java's generationIfStable): a commit sent with the old
        generation while a join is under way could answer ILLEGAL_GENERATION after the new
        generation arrived and reset it."""
        state = self.state.state
        if state != MemberState.STABLE:
            if state in (MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE):
                raise RebalanceInProgressError(
                    f"group {self.group_id}: cannot commit while rebalancing; poll() and retry")
            raise CommitFailedError(
                f"group {self.group_id}: not a member of the group (partitions were reassigned); the "
                "records since the last commit may be delivered again to another member")
        return self.generation, self.member_id, self.instance_id

    def last_answer(self) -> float:
        return self.timer.last_answer

    def heartbeat_interval(self) -> float:
        return self.timer.interval

    def heartbeat_now(self) -> None:
        self.timer.heartbeat_now()

    # -- joining --------------------------------------------------------------------------------

    def subscribed_topics(self) -> set[str]:
        """The topics this member subscribes to: the given ones, or every known topic a pattern
        matches.  A pattern matches a topic's *whole* name, as Java's
        ``Pattern.matcher(topic).matches()`` (``pat-a.*`` does not take ``xpat-abc``), and skips
        internal topics (``__consumer_offsets``) unless ``exclude_internal_topics`` is off:
        members of one group must agree on what a pattern means, or the leader assigns topics
        that another client's member does not fetch."""
        subs = self.subscriptions
        if subs.subscribed_pattern is not None:
            pattern, skip_internal = subs.subscribed_pattern, self.config.exclude_internal_topics
            return {name for name, t in self.metadata.topics.items()
                    if pattern.fullmatch(name) and not (skip_internal and t.is_internal)}
        return set(subs.subscribed_topics)

    def needs_rejoin(self) -> bool:
        if not self.state.stable:
            return True
        if self.subscribed_topics() != self._joined_subscription:
            return True
        # Partition count changes of subscribed topics also trigger a rebalance.
        for topic, count in self._assignment_snapshot.items():
            parts = self.metadata.partitions_for(topic)
            if parts is None:
                continue
            if count is None:  # a returning static leader's topic, first sized now
                self._assignment_snapshot[topic] = len(parts)
                log.info("group %s: watching %s (%d partitions) for the group", self.group_id, topic, len(parts))
            elif len(parts) != count:
                return True
        return False

    def _metadata_ready(self) -> bool:
        """Partition counts of our subscription are known (or the topics are known missing):
        joining earlier would make a leader assign nothing for them."""
        md = self.metadata
        return all(t in md.topics or t in md.missing_topics for t in self.subscribed_topics()) \
            and (self.subscriptions.subscribed_pattern is None or md.version > 0)

    def ensure_active(self, deadline: float, drive, invoke_listener: InvokeListener) -> bool:
        """Join (or rejoin) until STABLE or the deadline; rebalance callbacks run here."""
        self.raise_if_fatal()
        self._deliver_lost(invoke_listener)
        if not self.needs_rejoin():
            if not self.coordinator.known:
                # Heartbeats stop while the coordinator is unknown (NOT_COORDINATOR, a dropped
                # connection) and the heartbeat thread does not look for it: start the look-up
                # here, without holding up the fetches of the partitions we still own.
                with self._lock:
                    self.coordinator.lookup()
            return True
        if self.cooperative and self.subscriptions.assigned():
            # KIP-429: a member keeps fetching the partitions it owns while the group
            # rebalances, so do not wait for the join here (Java's poll joins with a zero
            # timer); poll comes back for its progress.
            deadline = min(deadline, time.monotonic())
        while True:
            self.raise_if_fatal()
            if not self.coordinator.ensure(deadline, drive):
                return False
            if self.subscriptions.subscribed_pattern is not None and not self.metadata.version:
                drive(min(0.1, max(0.0, deadline - time.monotonic())), lambda: False)
                if time.monotonic() >= deadline:
                    return False
                continue
            if self._join_future is None and not self._metadata_ready():
                self.metadata.want(self.subscribed_topics())
                self.metadata.maybe_update(self.network)
                drive(min(0.1, max(0.0, deadline - time.monotonic())), lambda: self._metadata_ready())
                if time.monotonic() >= deadline:
                    return False
                continue
            if self._join_future is None:
                self._prepare_join(invoke_listener)
                self._join_future = self._send_join()
            fut = self._join_future
            drive(max(0.0, deadline - time.monotonic()), lambda: fut.done)
            if not fut.done:
                return False
            self._join_future = None
            if fut.failed:
                exc = fut.exception
                if isinstance(exc, (FencedInstanceIdError, GroupError)):
                    raise exc
                if isinstance(exc, BrokerError) and exc.code == Errors.MEMBER_ID_REQUIRED:
                    continue  # KIP-394: the broker gave us an id; rejoin with it at once
                log.info("group %s: join failed (%s); retrying", self.group_id, exc)
                if time.monotonic() >= deadline:
                    return False
                drive(min(self.config.retry_backoff_ms / 1000, max(0.0, deadline - time.monotonic())),
                      lambda: False)
                continue
            assigned = fut.value()
            self._on_join_complete(assigned, invoke_listener)
            if not self.needs_rejoin():
                return True
            if time.monotonic() >= deadline:
                return False

    def _prepare_join(self, invoke_listener: InvokeListener) -> None:
        """Before a join: commit what was consumed (auto-commit), and under the eager protocol
        give every partition back."""
        if self.generation >= 0:
            try:
                self._before_rebalance()
            except Exception as exc:  # the rebalance goes on; the next owner may re-read
                log.warning("group %s: commit before rebalance failed: %s", self.group_id, exc)
        if not self.cooperative:
            owned = set(self.subscriptions.assigned())
            if owned:
                invoke_listener("on_partitions_revoked", owned)
                self.subscriptions.set_group_assignment([])
        self._joined_subscription = self.subscribed_topics()
        self.metadata.want(self._joined_subscription)

    def _subscription_bytes(self, assignor) -> bytes:
        return encode_member_subscription(assignor, self._joined_subscription, self.subscriptions.assigned(),
                                          self.generation, self.config.client_rack or None)

    def _send_join(self) -> Future:
        result = Future()
        body = {
            "group_id": self.group_id,
            "session_timeout_ms": self.config.session_timeout_ms,
            "rebalance_timeout_ms": self.config.rebalance_timeout_ms or self.config.max_poll_interval_ms,
            "member_id": self.member_id,
            "group_instance_id": self.instance_id,
            "protocol_type": "consumer",
            "protocols": [{"name": a.name, "metadata": self._subscription_bytes(a)} for a in self.assignors],
            "reason": None,
        }
        min_version = 5 if self.instance_id is not None else None
        with self._lock:
            self._join_sent_at = time.monotonic()
            self.state.apply(MemberEvent.JOIN_SENT)
            fut = self.coordinator.send(JOIN_GROUP, body, min_version=min_version,
                                        timeout_ms=body["rebalance_timeout_ms"] + 5000)
        fut.add_callback(lambda value: self._on_join_response(value, result))
        fut.add_errback(lambda exc: self._join_failed(result, exc))
        return result

    def _join_failed(self, result: Future, exc: BaseException) -> None:
        with self._lock:
            if self.state.state == MemberState.PREPARING_REBALANCE:
                self.state.apply(MemberEvent.JOIN_FAILED)
            elif self.state.state == MemberState.COMPLETING_REBALANCE:
                self.state.apply(MemberEvent.SYNC_FAILED)
            if isinstance(exc, ConnectionFailedError):
                self.coordinator.mark_unknown(str(exc))
        if not result.done:
            result.failure(exc)

    def _fenced_error(self) -> FencedInstanceIdError:
        return FencedInstanceIdError(
            f"group {self.group_id}: group_instance_id {self.instance_id!r} is in use by another member")

    def _on_join_response(self, value, result: Future) -> None:
        version, resp = value
        code = resp["error_code"]
        with self._lock:
            if code == Errors.NONE:
                self.state.apply(MemberEvent.JOINED)
                self.member_id = resp["member_id"]
                self.generation = resp["generation_id"]
                self.protocol = resp["protocol_name"]
                self.leader_id = resp["leader"]
                log.info("group %s: joined generation %s as %s (leader %s, protocol %s)", self.group_id,
                         self.generation, self.member_id, self.leader_id, self.protocol)
                try:
                    assignments = self._assign_as_leader(resp) if self.leader_id == self.member_id else {}
                except Exception as exc:
                    self._join_failed(result, exc)
                    return
                self._send_sync(assignments, result)
                return
            self.state.apply(MemberEvent.JOIN_FAILED)
            err = BrokerError(code, f"JoinGroup {self.group_id}")
            if code == Errors.MEMBER_ID_REQUIRED:
                self.member_id = resp["member_id"]  # KIP-394: rejoin at once with this id
            elif code == Errors.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                self.generation = -1
            elif code in COORDINATOR_ERRORS:
                self.coordinator.mark_unknown(err.name)
            elif code == Errors.FENCED_INSTANCE_ID:
                self.fail(self._fenced_error())
                result.failure(self.state.fatal)
                return
            elif code in _FATAL_JOIN:
                self.fail(GroupError(str(err)))
                result.failure(self.state.fatal)
                return
        result.failure(err)

    def _assign_as_leader(self, resp: dict) -> dict[str, bytes]:
        """The leader's part of a join (see ``leader.assign_as_leader``); it also takes over
        watching every member's topics for partition changes."""
        assignor = next(a for a in self.assignors if a.name == resp["protocol_name"])
        assignments, self._leader_topics = assign_as_leader(assignor, resp, self.metadata, self.group_id)
        return assignments

    def _send_sync(self, assignments: dict[str, bytes], result: Future) -> None:
        body = {
            "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
            "group_instance_id": self.instance_id, "protocol_type": "consumer",
            "protocol_name": self.protocol,
            "assignments": [{"member_id": m, "assignment": a} for m, a in assignments.items()],
        }
        fut = self.coordinator.send(SYNC_GROUP, body, timeout_ms=self.config.request_timeout_ms)

        def done(value) -> None:
            version, resp = value
            code = resp["error_code"]
            with self._lock:
                if code == Errors.NONE:
                    try:
                        _, assignment = decode_assignment(bytes(resp["assignment"] or b"\0\0\0\0\0\0"))
                    except DecodeError as exc:
                        self.state.apply(MemberEvent.SYNC_FAILED)
                        result.failure(exc)
                        return
                    self.state.apply(MemberEvent.SYNCED)
                    # Some brokers (Tansu) time the session from the JoinGroup, not from the
                    # SyncGroup: count the first heartbeat interval from the join.
                    self.timer.reset_session(time.monotonic(), first_beat_from=self._join_sent_at, joined=True)
                    result.success({TopicPartition(a["topic"], p) for a in assignment["assigned_partitions"]
                                    for p in a["partitions"]})
                    return
                self.state.apply(MemberEvent.SYNC_FAILED)
                err = BrokerError(code, f"SyncGroup {self.group_id}")
                if code in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                    self._reset_generation()
                elif code in COORDINATOR_ERRORS:
                    self.coordinator.mark_unknown(err.name)
                elif code == Errors.FENCED_INSTANCE_ID:
                    self.fail(FencedInstanceIdError(str(err)))
                    result.failure(self.state.fatal)
                    return
            result.failure(err)

        fut.add_callback(done)
        fut.add_errback(lambda exc: self._join_failed(result, exc))

    def _on_join_complete(self, assigned: set[TopicPartition], invoke_listener: InvokeListener) -> None:
        owned = set(self.subscriptions.assigned())
        subscribed = self._joined_subscription
        assigned = {tp for tp in assigned if tp.topic in subscribed}
        self.rebalances += 1
        with self._lock:
            self.state.apply(MemberEvent.ASSIGNMENT_TAKEN)
        for a in self.assignors:
            if a.name == self.protocol:
                a.on_assignment(sorted(assigned), self.generation)
        if self.cooperative:
            revoked = owned - assigned
            added = assigned - owned
            if revoked:
                invoke_listener("on_partitions_revoked", revoked)
                # KIP-429: give them up, then rejoin so the leader can hand them on.
                with self._lock:
                    self.state.apply(MemberEvent.REJOIN_REQUESTED)
            self.subscriptions.set_group_assignment(sorted(assigned))
        else:
            added = assigned
            self.subscriptions.set_group_assignment(sorted(assigned))
        for tp in added:
            self.subscriptions.state(tp).awaiting_committed = True
        self._assignment_snapshot = {t: len(self.metadata.partitions_for(t) or ())
                                     for t in subscribed if self.metadata.partitions_for(t) is not None}
        if self.leader_id == self.member_id:
            self._assignment_snapshot.update(self._leader_topics)
        invoke_listener("on_partitions_assigned", added)
        self._heartbeat_thread.start()

    def _reset_generation(self) -> None:
        """Forget the generation (and member id, unless static); partitions are lost."""
        self.generation = -1
        if self.instance_id is None:
            self.member_id = ""
        self.state.apply(MemberEvent.RESET)
        owned = set(self.subscriptions.assigned())
        if owned:
            self._pending_lost = (self._pending_lost or set()) | owned
        self.network.interrupt()

    def _deliver_lost(self, invoke_listener: InvokeListener) -> None:
        with self._lock:
            lost, self._pending_lost = self._pending_lost, None
        if lost:
            lost &= set(self.subscriptions.assigned())
            if lost:
                invoke_listener("on_partitions_lost", lost)
                self.subscriptions.set_group_assignment([])

    # -- heartbeats (the heartbeat thread) ------------------------------------------------------

    def heartbeat_tick(self) -> float | None:
        """One turn of the heartbeat thread: act on the timer, then run the network once;
        returns the seconds until the next heartbeat is due."""
        self._heartbeat_once(time.monotonic())
        with self._lock:
            self.network.poll(0)
            return self.timer.until_due(time.monotonic())

    def _heartbeat_once(self, now: float) -> None:
        with self._lock:
            poked = self._take_poke()
            if self.state.state != MemberState.STABLE or self.coordinator.connection is None:
                return
            if self.timer.poll_timeout_expired(now):
                if not self._poll_timeout_left:
                    self._poll_timeout_left = True
                    log.warning("group %s: no poll() for more than max_poll_interval_ms=%s; leaving the "
                                "group so its partitions can move (the next poll rejoins)", self.group_id,
                                self.config.max_poll_interval_ms)
                    self.leave("consumer poll timeout has expired")
                return
            if self.timer.session_expired(now):
                self.coordinator.mark_unknown("session timeout expired without a heartbeat answer")
                return
            if poked:
                self.timer.heartbeat_now()
            if not self.timer.should_heartbeat(now):
                return
            self._poked = False
            self.timer.sent(now)
            fut = self.coordinator.send(HEARTBEAT, {"group_id": self.group_id, "generation_id": self.generation,
                                                    "member_id": self.member_id,
                                                    "group_instance_id": self.instance_id},
                                        timeout_ms=self.config.request_timeout_ms)
            generation = self.generation
            fut.add_callback(lambda value: self._on_heartbeat(value[1], generation))
            fut.add_errback(self._on_heartbeat_failed)

    def _on_heartbeat(self, resp: dict, generation: int) -> None:
        with self._lock:
            code = resp["error_code"]
            if code == Errors.NONE:
                self.timer.received(time.monotonic())
                return
            self.timer.answered()
            if generation != self.generation:
                return  # an answer about a generation we already left
            if code == Errors.REBALANCE_IN_PROGRESS:
                self.timer.received(time.monotonic())
                self.request_rejoin("the group is rebalancing")
            elif code in (Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID):
                self.reset_generation(f"heartbeat says {error_code(code).name}")
            elif code == Errors.FENCED_INSTANCE_ID:
                self.fail(self._fenced_error())
            elif code in COORDINATOR_ERRORS:
                self.coordinator.mark_unknown(error_code(code).name)
            else:
                log.warning("group %s: heartbeat: %s", self.group_id, BrokerError(code))

    def _on_heartbeat_failed(self, exc: BaseException) -> None:
        with self._lock:
            self.timer.answered()
            if isinstance(exc, ConnectionFailedError):
                self.coordinator.mark_unknown(str(exc))

    # -- leaving --------------------------------------------------------------------------------

    def leave(self, reason: str, *, partitions_lost: bool = True, for_good: bool = False) -> Future | None:
        """Send LeaveGroup and forget the generation.  A static member sends none unless
        ``for_good`` (it keeps its place, so a restart within the session timeout gets its
        partitions back); for good, the LeaveGroup names its instance id (v3+, KIP-345), which
        is what removes a static member.  (A fenced member is always static, so it never gets
        here to send one.)"""
        with self._lock:
            fut = None
            leaves = self.instance_id is None or for_good
            if leaves and self.member_id and self.coordinator.connection is not None:
                fut = self.coordinator.send(
                    LEAVE_GROUP, leave_group_request(self.group_id, self.member_id, self.instance_id, reason),
                    min_version=KIP345_LEAVE if self.instance_id is not None else None)
                log.info("group %s: leaving%s (%s)", self.group_id,
                         " for good as static member " + self.instance_id if self.instance_id else "", reason)
            self._reset_generation()
            if not partitions_lost:
                self._pending_lost = None
            return fut

    def close(self) -> None:
        self._heartbeat_thread.stop(timeout=5)
