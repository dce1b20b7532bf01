"""The consumer group member: coordinator discovery, join/sync, heartbeats, commits.

Follows the Java ``ConsumerCoordinator`` (seed 003).  Threads: the application thread drives
joins, rebalance callbacks, OffsetFetch and commits from ``poll``/``commit``; a background
thread only heartbeats (and leaves the group when ``max_poll_interval_ms`` passes without a
poll).  Shared state is guarded by the network client's re-entrant lock, which is also held
while response callbacks run, whichever thread completes them.

Rebalance protocols: *eager* (range, roundrobin) revokes everything before rejoining;
*cooperative* (cooperative-sticky, KIP-429) keeps partitions across the rebalance, revokes only
those the new assignment moved away, and then rejoins once more so they can be handed on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...protocol.apis import (FIND_COORDINATOR, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, OFFSET_COMMIT,
                              OFFSET_FETCH, SYNC_GROUP)
from ...protocol.apis.consumer_protocol import (decode_assignment, decode_subscription, encode_assignment,
                                                encode_subscription)
from ...protocol.errors import BrokerError, DecodeError, Errors, error_code
from ..config import ConsumerConfig
from ..errors import (CommitFailedError, ConnectionFailedError, FencedInstanceIdError, GroupError,
                      KafkaTimeoutError, RebalanceInProgressError)
from ..future import Future
from ..metadata import ClusterMetadata
from ..network import NetworkClient
from ..subscription import SubscriptionState
from ..types import OffsetAndMetadata, TopicPartition
from .assignors import MemberSubscription, get_assignor
from .state import MemberEvent, MemberState, MemberStateMachine

log = logging.getLogger(__name__)

_COORDINATOR_ERRORS = {Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE}
_FATAL_JOIN = {Errors.INCONSISTENT_GROUP_PROTOCOL, 26, Errors.GROUP_AUTHORIZATION_FAILED,
               24, 81, 112}  # 26 INVALID_SESSION_TIMEOUT, 24 INVALID_GROUP_ID, 81 GROUP_MAX_SIZE_REACHED
_MAX_COMMIT_VERSION = 9   # v10 names topics by id; names work everywhere
_MAX_FETCH_VERSION = 9


def _coordinator_connection_id(node_id: int) -> int:
    # Java uses Integer.MAX_VALUE - nodeId: a separate connection to the same broker.
    return 0x7FFFFFFF - node_id


@dataclass
class RebalanceListener:
    """Callbacks run in the application thread during ``poll``, as in Java."""

    on_partitions_revoked: Callable[[set[TopicPartition]], None] | None = None
    on_partitions_assigned: Callable[[set[TopicPartition]], None] | None = None
    on_partitions_lost: Callable[[set[TopicPartition]], None] | None = None


class GroupCoordinator:
    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState, on_commit: Callable | None = None) -> None:
        assert config.group_id is not None
        self.config = config
        self.group_id = config.group_id
        self.instance_id = config.group_instance_id
        self.network = network
        self.metadata = metadata
        self.subscriptions = subscriptions
        self._lock = network.lock
        self.assignors = [get_assignor(name) for name in config.partition_assignment_strategy]
        # The protocol every configured assignor supports: cooperative only if all of them are.
        self.cooperative = all(a.rebalance_protocol == "cooperative" for a in self.assignors)
        self.member = MemberStateMachine()
        self.member_id = ""
        self.generation = -1
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self.need_rejoin = True
        self.listener = RebalanceListener()
        self.rebalances = 0
        self._coordinator: int | None = None
        self._coordinator_broker: int | None = None
        self._find_future: Future | None = None
        self._join_future: Future | None = None
        self._pending_lost: set[TopicPartition] | None = None
        self._fatal: BaseException | None = None
        self._joined_subscription: set[str] = set()
        self._leader_topics: dict[str, int | None] = {}
        self._assignment_snapshot: dict[str, int | None] = {}
        self._last_heartbeat_sent = 0.0
        self._join_sent_at = 0.0
        # A heartbeat interval above a third of the session timeout leaves no room for one late
        # heartbeat; Java documents the third, we enforce it.
        self._heartbeat_interval = min(config.heartbeat_interval_ms, config.session_timeout_ms // 3) / 1000
        self._last_heartbeat_ok = time.monotonic()
        self._heartbeat_in_flight = False
        self.last_poll = time.monotonic()
        self._poll_timeout_left = False
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._committed_cache: dict[TopicPartition, OffsetAndMetadata] = {}
        self._async_callbacks: list[tuple[Callable, dict, BaseException | None]] = []
        self._on_commit = on_commit
        self._offset_fetch: Future | None = None
        self._offset_fetch_parts: frozenset = frozenset()
        self._heartbeat_thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._wake_heartbeat = threading.Event()

    # -- coordinator discovery ------------------------------------------------------------------

    @property
    def coordinator_known(self) -> bool:
        return self._coordinator is not None and not self.network.connection_failed(self._coordinator)

    def mark_coordinator_unknown(self, why: str) -> None:
        with self._lock:
            if self._coordinator is not None:
                log.info("group %s: coordinator %s unusable (%s); rediscovering", self.group_id,
                         self._coordinator_broker, why)
                self.network.unpin_node(self._coordinator)
            self._coordinator = None
            self._coordinator_broker = None

    def _lookup_coordinator(self) -> Future | None:
        if self._find_future is not None:
            return self._find_future
        node = self.network.least_loaded_node()
        if node is None:
            return None
        # No waiting for the connection: the network client holds the request until it is up.
        body = {"key": self.group_id, "key_type": 0, "coordinator_keys": [self.group_id]}
        fut = self.network.send(node, FIND_COORDINATOR, body)
        self._find_future = fut

        def done(value) -> None:
            self._find_future = None
            version, resp = value
            if version >= 4:
                entry = resp["coordinators"][0] if resp["coordinators"] else {"error_code": Errors.COORDINATOR_NOT_AVAILABLE}
            else:
                entry = resp
            if entry["error_code"]:
                if entry["error_code"] == Errors.GROUP_AUTHORIZATION_FAILED:
                    self._fatal = GroupError(str(BrokerError(entry["error_code"], f"group {self.group_id}")))
                log.debug("FindCoordinator for %s: %s", self.group_id, BrokerError(entry["error_code"]))
                return
            conn_id = _coordinator_connection_id(entry["node_id"])
            self.network.pin_node(conn_id, entry["host"], entry["port"])
            self._coordinator = conn_id
            self._coordinator_broker = entry["node_id"]
            # A new session clock, as Java's resetSessionTimeout: otherwise a coordinator found
            # again after an outage longer than the session is dropped before the first
            # heartbeat can tell us whether we are still a member.
            self._last_heartbeat_ok = time.monotonic()
            log.info("group %s: coordinator is broker %s (%s:%s)", self.group_id, entry["node_id"],
                     entry["host"], entry["port"])

        def failed(exc) -> None:
            self._find_future = None

        fut.add_callback(done)
        fut.add_errback(failed)
        return fut

    def ensure_coordinator(self, deadline: float, drive) -> bool:
        while not self.coordinator_known:
            self._raise_fatal()
            # The look-up starts even past the deadline, so a caller that does not wait (a
            # cooperative member fetching during a rebalance) still gets it going.
            with self._lock:
                fut = self._lookup_coordinator()
            now = time.monotonic()
            if now >= deadline:
                return False
            if fut is None:
                self.metadata.maybe_update(self.network)
                drive(min(0.1, deadline - now), lambda: False)
                continue
            drive(max(0.0, deadline - now), lambda: fut.done)
            if fut.done and not self.coordinator_known:
                drive(min(self.config.retry_backoff_ms / 1000, max(0.0, deadline - time.monotonic())),
                      lambda: False)
        return True

    def _raise_fatal(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def _send(self, api, body, **kw) -> Future:
        if self._coordinator is None:
            return Future().failure(ConnectionFailedError("coordinator unknown"))
        return self.network.send(self._coordinator, api, body, **kw)

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
        if self.need_rejoin or self.member.state != MemberState.STABLE:
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

    def ensure_active_group(self, deadline: float, drive, invoke_listener) -> bool:
        """Join (or rejoin) until STABLE or the deadline; rebalance callbacks run here."""
        self._raise_fatal()
        self._deliver_lost(invoke_listener)
        if not self.needs_rejoin():
            if not self.coordinator_known:
                # Heartbeats stop while the coordinator is unknown (NOT_COORDINATOR, a dropped
                # connection) and the heartbeat thread does not look for it: start the look-up
                # here, without holding up the fetches of the partitions we still own.
                with self._lock:
                    self._lookup_coordinator()
            return True
        if self.cooperative and self.subscriptions.assigned():
            # KIP-429: a member keeps fetching the partitions it owns while the group
            # rebalances, so do not wait for the join here (Java's poll joins with a zero
            # timer); poll comes back for its progress.
            deadline = min(deadline, time.monotonic())
        while True:
            self._raise_fatal()
            if not self.ensure_coordinator(deadline, drive):
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

    def _prepare_join(self, invoke_listener) -> None:
        """Before a join: commit what was consumed (auto-commit), and under the eager protocol
        give every partition back."""
        if self.config.enable_auto_commit and self.generation >= 0:
            try:
                self._commit_sync_quietly()
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
        owned: dict[str, list[int]] = {}
        for tp in self.subscriptions.assigned():
            owned.setdefault(tp.topic, []).append(tp.partition)
        topics = sorted(self._joined_subscription)
        version = min(getattr(assignor, "version", 3), 3)
        return encode_subscription(version, {
            "topics": topics,
            "user_data": assignor.subscription_user_data(topics, self.subscriptions.assigned()),
            "owned_partitions": [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(owned.items())],
            "generation_id": self.generation,
            "rack_id": self.config.client_rack or None,
        })

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
            self.member.apply(MemberEvent.JOIN_SENT)
            fut = self._send(JOIN_GROUP, body, min_version=min_version,
                             timeout_ms=body["rebalance_timeout_ms"] + 5000)
        fut.add_callback(lambda value: self._on_join_response(value, result))
        fut.add_errback(lambda exc: self._join_failed(result, exc))
        return result

    def _join_failed(self, result: Future, exc: BaseException) -> None:
        with self._lock:
            if self.member.state == MemberState.PREPARING_REBALANCE:
                self.member.apply(MemberEvent.JOIN_FAILED)
            elif self.member.state == MemberState.COMPLETING_REBALANCE:
                self.member.apply(MemberEvent.SYNC_FAILED)
            if isinstance(exc, ConnectionFailedError):
                self.mark_coordinator_unknown(str(exc))
        if not result.done:
            result.failure(exc)

    def _on_join_response(self, value, result: Future) -> None:
        version, resp = value
        code = resp["error_code"]
        with self._lock:
            if code == Errors.NONE:
                self.member.apply(MemberEvent.JOINED)
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
            self.member.apply(MemberEvent.JOIN_FAILED)
            err = BrokerError(code, f"JoinGroup {self.group_id}")
            if code == Errors.MEMBER_ID_REQUIRED:
                self.member_id = resp["member_id"]  # KIP-394: rejoin at once with this id
            elif code == Errors.UNKNOWN_MEMBER_ID:
                self.member_id = ""
                self.generation = -1
            elif code in _COORDINATOR_ERRORS:
                self.mark_coordinator_unknown(err.name)
            elif code == Errors.FENCED_INSTANCE_ID:
                self.member.apply(MemberEvent.FENCED)
                self._fatal = FencedInstanceIdError(
                    f"group {self.group_id}: group_instance_id {self.instance_id!r} is in use by another member")
                result.failure(self._fatal)
                return
            elif code in _FATAL_JOIN:
                self._fatal = GroupError(str(err))
                result.failure(self._fatal)
                return
        result.failure(err)

    def _assign_as_leader(self, resp: dict) -> dict[str, bytes]:
        """The leader's part of a join: read every member's subscription, watch their topics for
        partition changes, and compute the assignment unless the broker says to skip it."""
        assignor = next(a for a in self.assignors if a.name == resp["protocol_name"])
        members: dict[str, MemberSubscription] = {}
        for m in resp["members"]:
            _, sub = decode_subscription(bytes(m["metadata"]))
            owned = [TopicPartition(o["topic"], p) for o in sub.get("owned_partitions") or () for p in o["partitions"]]
            members[m["member_id"]] = MemberSubscription(
                member_id=m["member_id"], group_instance_id=m.get("group_instance_id"),
                topics=list(sub["topics"]), owned_partitions=owned,
                generation_id=sub.get("generation_id", -1), rack_id=sub.get("rack_id"),
                user_data=bytes(sub["user_data"]) if sub.get("user_data") is not None else None)
        all_topics = {t for m in members.values() for t in m.topics}
        missing = all_topics - set(self.metadata.topics)
        if missing:
            # The leader needs partition counts for every member's topics.
            self.metadata.want(all_topics)
            self.metadata.request_update()
        partitions = {t: len(self.metadata.partitions_for(t) or ()) for t in all_topics
                      if self.metadata.partitions_for(t) is not None}
        if resp.get("skip_assignment"):
            # KIP-814: a static leader that came back keeps the group's current assignment (the
            # broker has it); it only takes over watching every member's topics for partition
            # changes, as Java's onLeaderElected does.  A topic not sized yet is noted without a
            # count (None) and sized when metadata names it: counting it as 0 would rebalance the
            # group for nothing as soon as its metadata arrives.
            self._leader_topics = {t: partitions.get(t) for t in all_topics}
            log.info("group %s: returning static leader, keeping the current assignment; watching %s",
                     self.group_id, self._leader_topics)
            return {}
        # Topics we could not size yet count as 0: when metadata shows them, the snapshot check
        # in needs_rejoin triggers another round.
        self._leader_topics = {t: partitions.get(t, 0) for t in all_topics}
        assignment = assignor.assign(partitions, members)
        log.info("group %s: leader assigned %s", self.group_id,
                 {mid: len(tps) for mid, tps in assignment.items()})
        out = {}
        for member_id in members:
            tps = assignment.get(member_id, [])
            by_topic: dict[str, list[int]] = {}
            for tp in tps:
                by_topic.setdefault(tp.topic, []).append(tp.partition)
            out[member_id] = encode_assignment(0, {
                "assigned_partitions": [{"topic": t, "partitions": sorted(ps)} for t, ps in sorted(by_topic.items())],
                "user_data": None})
        return out

    def _send_sync(self, assignments: dict[str, bytes], result: Future) -> None:
        body = {
            "group_id": self.group_id, "generation_id": self.generation, "member_id": self.member_id,
            "group_instance_id": self.instance_id, "protocol_type": "consumer",
            "protocol_name": self.protocol,
            "assignments": [{"member_id": m, "assignment": a} for m, a in assignments.items()],
        }
        fut = self._send(SYNC_GROUP, body, timeout_ms=self.config.request_timeout_ms)

        def done(value) -> None:
            version, resp = value
            code = resp["error_code"]
            with self._lock:
                if code == Errors.NONE:
                    try:
                        _, assignment = decode_assignment(bytes(resp["assignment"] or b"\0\0\0\0\0\0"))
                    except DecodeError as exc:
                        self.member.apply(MemberEvent.SYNC_FAILED)
                        result.failure(exc)
                        return
                    self.member.apply(MemberEvent.SYNCED)
                    self._last_heartbeat_ok = time.monotonic()
                    # Some brokers (Tansu) time the session from the JoinGroup, not from the
                    # SyncGroup: count the first heartbeat interval from the join.
                    self._last_heartbeat_sent = self._join_sent_at
                    result.success({TopicPartition(a["topic"], p) for a in assignment["assigned_partitions"]
                                    for p in a["partitions"]})
                    return
                self.member.apply(MemberEvent.SYNC_FAILED)
                err = BrokerError(code, f"SyncGroup {self.group_id}")
                if code in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                    self._reset_generation()
                elif code in _COORDINATOR_ERRORS:
                    self.mark_coordinator_unknown(err.name)
                elif code == Errors.FENCED_INSTANCE_ID:
                    self._fatal = FencedInstanceIdError(str(err))
                    result.failure(self._fatal)
                    return
            result.failure(err)

        fut.add_callback(done)
        fut.add_errback(lambda exc: self._join_failed(result, exc))

    def _on_join_complete(self, assigned: set[TopicPartition], invoke_listener) -> None:
        owned = set(self.subscriptions.assigned())
        subscribed = self._joined_subscription
        assigned = {tp for tp in assigned if tp.topic in subscribed}
        self.rebalances += 1
        self.need_rejoin = False
        for a in self.assignors:
            if a.name == self.protocol:
                a.on_assignment(sorted(assigned), self.generation)
        if self.cooperative:
            revoked = owned - assigned
            added = assigned - owned
            if revoked:
                invoke_listener("on_partitions_revoked", revoked)
                # KIP-429: give them up, then rejoin so the leader can hand them on.
                self.need_rejoin = True
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
        self._start_heartbeat_thread()

    def _reset_generation(self) -> None:
        """Forget the generation (and member id, unless static); partitions are lost."""
        self.generation = -1
        if self.instance_id is None:
            self.member_id = ""
        self.need_rejoin = True
        if self.member.state not in (MemberState.UNJOINED, MemberState.FATAL):
            self.member.apply(MemberEvent.RESET)
        owned = set(self.subscriptions.assigned())
        if owned:
            self._pending_lost = (self._pending_lost or set()) | owned
        self.network.interrupt()

    def _deliver_lost(self, invoke_listener) -> None:
        with self._lock:
            lost, self._pending_lost = self._pending_lost, None
        if lost:
            lost &= set(self.subscriptions.assigned())
            if lost:
                invoke_listener("on_partitions_lost", lost)
                self.subscriptions.set_group_assignment([])

    def request_rejoin(self, reason: str) -> None:
        with self._lock:
            if not self.need_rejoin:
                log.info("group %s: rejoin requested: %s", self.group_id, reason)
            self.need_rejoin = True
        # A poll() blocked on a long fetch should rejoin now, not when the fetch returns.
        self.network.interrupt()

    # -- heartbeats -----------------------------------------------------------------------------

    def _start_heartbeat_thread(self) -> None:
        if self._heartbeat_thread is None or not self._heartbeat_thread.is_alive():
            self._stop.clear()
            t = threading.Thread(target=self._heartbeat_loop, name=f"kdaemon-heartbeat-{self.group_id}",
                                 daemon=True)
            self._heartbeat_thread = t
            t.start()

    def _heartbeat_loop(self) -> None:
        interval = self._heartbeat_interval
        while not self._stop.is_set():
            try:
                self._heartbeat_tick()
                with self._lock:
                    self.network.poll(0)
            except Exception:
                log.exception("group %s: heartbeat thread error", self.group_id)
            self._wake_heartbeat.wait(min(0.1, interval / 2))
            self._wake_heartbeat.clear()

    def _heartbeat_tick(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self.member.state != MemberState.STABLE or self._coordinator is None:
                return
            if now - self.last_poll > self.config.max_poll_interval_ms / 1000:
                if not self._poll_timeout_left:
                    self._poll_timeout_left = True
                    log.warning("group %s: no poll() for more than max_poll_interval_ms=%s; leaving the "
                                "group so its partitions can move (the next poll rejoins)", self.group_id,
                                self.config.max_poll_interval_ms)
                    self.maybe_leave("consumer poll timeout has expired")
                return
            if now - self._last_heartbeat_ok > self.config.session_timeout_ms / 1000:
                self.mark_coordinator_unknown("session timeout expired without a heartbeat answer")
                return
            if self._heartbeat_in_flight or now - self._last_heartbeat_sent < self._heartbeat_interval:
                return
            self._heartbeat_in_flight = True
            self._last_heartbeat_sent = now
            fut = self._send(HEARTBEAT, {"group_id": self.group_id, "generation_id": self.generation,
                                         "member_id": self.member_id, "group_instance_id": self.instance_id},
                             timeout_ms=self.config.request_timeout_ms)
            generation = self.generation
            fut.add_callback(lambda value: self._on_heartbeat(value[1], generation))
            fut.add_errback(self._on_heartbeat_failed)

    def _on_heartbeat(self, resp: dict, generation: int) -> None:
        with self._lock:
            self._heartbeat_in_flight = False
            code = resp["error_code"]
            if code == Errors.NONE:
                self._last_heartbeat_ok = time.monotonic()
                return
            if generation != self.generation:
                return  # an answer about a generation we already left
            if code == Errors.REBALANCE_IN_PROGRESS:
                self._last_heartbeat_ok = time.monotonic()
                self.request_rejoin("the group is rebalancing")
            elif code in (Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID):
                log.info("group %s: heartbeat says %s; partitions are lost, rejoining", self.group_id,
                         error_code(code).name)
                self._reset_generation()
            elif code == Errors.FENCED_INSTANCE_ID:
                self._fatal = FencedInstanceIdError(
                    f"group {self.group_id}: group_instance_id {self.instance_id!r} is in use by another member")
                self.member.apply(MemberEvent.FENCED)
            elif code in _COORDINATOR_ERRORS:
                self.mark_coordinator_unknown(error_code(code).name)
            else:
                log.warning("group %s: heartbeat: %s", self.group_id, BrokerError(code))

    def _on_heartbeat_failed(self, exc: BaseException) -> None:
        with self._lock:
            self._heartbeat_in_flight = False
            if isinstance(exc, ConnectionFailedError):
                self.mark_coordinator_unknown(str(exc))

    def record_poll(self) -> None:
        now = time.monotonic()
        with self._lock:
            self.last_poll = now
            if self._poll_timeout_left:
                self._poll_timeout_left = False
                self.need_rejoin = True

    # -- leaving --------------------------------------------------------------------------------

    def maybe_leave(self, reason: str, *, partitions_lost: bool = True) -> Future | None:
        """Send LeaveGroup (dynamic members only: a static member keeps its place so a restart
        within the session timeout gets its partitions back) and forget the generation."""
        with self._lock:
            fut = None
            if self.instance_id is None and self.member_id and self._coordinator is not None \
                    and self.member.state != MemberState.FATAL:
                fut = self._send(LEAVE_GROUP, {"group_id": self.group_id, "member_id": self.member_id,
                                               "members": [{"member_id": self.member_id,
                                                            "group_instance_id": None, "reason": reason}]})
                log.info("group %s: leaving (%s)", self.group_id, reason)
            self._reset_generation()
            if not partitions_lost:
                self._pending_lost = None
            return fut

    def close(self, deadline: float, drive, invoke_listener) -> None:
        self._stop.set()
        self._wake_heartbeat.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=5)
        try:
            if self.config.enable_auto_commit and self.generation >= 0 and self.coordinator_known:
                self.commit_sync(self._consumed_offsets(), deadline, drive)
        except Exception as exc:
            log.warning("group %s: final commit failed: %s", self.group_id, exc)
        owned = set(self.subscriptions.assigned())
        if owned and self.subscriptions.has_subscription:
            try:
                invoke_listener("on_partitions_revoked", owned)
            except Exception:
                log.exception("on_partitions_revoked raised during close")
        fut = self.maybe_leave("the consumer is being closed", partitions_lost=False)
        if fut is not None:
            drive(max(0.0, min(deadline - time.monotonic(), 5.0)), lambda: fut.done)

    # -- committed offsets ----------------------------------------------------------------------

    def fetch_committed_offsets(self, deadline: float, drive) -> None:
        """Set positions of partitions awaiting their committed offset (non-blocking past the
        deadline: whatever is still missing is asked again on the next poll)."""
        waiting = [tp for tp, st in self.subscriptions.items() if st.awaiting_committed]
        if not waiting:
            return
        if not self.ensure_coordinator(deadline, drive):
            return
        if self._offset_fetch is None or self._offset_fetch_parts != frozenset(waiting):
            self._offset_fetch = self._send_offset_fetch(waiting)
            self._offset_fetch_parts = frozenset(waiting)
        fut = self._offset_fetch
        drive(max(0.0, deadline - time.monotonic()), lambda: fut.done)
        if not fut.done:
            return
        self._offset_fetch = None
        if fut.failed:
            exc = fut.exception
            if isinstance(exc, BrokerError) and not exc.retriable and exc.code not in _COORDINATOR_ERRORS:
                raise exc
            return
        for tp, om in fut.value().items():
            if not self.subscriptions.is_assigned(tp):
                continue
            st = self.subscriptions.state(tp)
            if not st.awaiting_committed:
                continue
            st.awaiting_committed = False
            if om is None:
                if self.config.auto_offset_reset == "none":
                    from ..errors import NoOffsetForPartitionError
                    raise NoOffsetForPartitionError([tp])
                self.subscriptions.request_reset(tp)
            else:
                self.subscriptions.seek(tp, om.offset, om.leader_epoch)

    def _send_offset_fetch(self, partitions) -> Future:
        result = Future()
        by_topic: dict[str, list[int]] = {}
        for tp in partitions:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        topics = [{"name": t, "partition_indexes": sorted(ps)} for t, ps in sorted(by_topic.items())]
        body = {"group_id": self.group_id, "topics": topics,
                "groups": [{"group_id": self.group_id, "member_id": None, "member_epoch": -1,
                            "topics": topics}],
                "require_stable": self.config.read_committed}
        fut = self._send(OFFSET_FETCH, body, max_version=_MAX_FETCH_VERSION)

        def done(value) -> None:
            version, resp = value
            if version >= 8:
                group = resp["groups"][0] if resp["groups"] else {"error_code": 0, "topics": []}
                top_error, topics_resp = group["error_code"], group["topics"]
            else:
                top_error, topics_resp = resp.get("error_code", 0), resp["topics"]
            if top_error:
                if top_error in _COORDINATOR_ERRORS:
                    self.mark_coordinator_unknown(error_code(top_error).name)
                result.failure(BrokerError(top_error, f"OffsetFetch {self.group_id}"))
                return
            out: dict[TopicPartition, OffsetAndMetadata | None] = {}
            for t in topics_resp:
                for p in t["partitions"]:
                    tp = TopicPartition(t["name"], p["partition_index"])
                    if p["error_code"]:
                        if p["error_code"] == Errors.UNSTABLE_OFFSET_COMMIT or error_code(p["error_code"]).retriable:
                            continue  # asked again on the next poll
                        result.failure(BrokerError(p["error_code"], f"OffsetFetch {tp}"))
                        return
                    off = p["committed_offset"]
                    epoch = p.get("committed_leader_epoch", -1)
                    out[tp] = None if off < 0 else OffsetAndMetadata(off, p.get("metadata") or "",
                                                                      None if epoch < 0 else epoch)
            result.success(out)

        fut.add_callback(done)
        fut.add_errback(lambda exc: (self.mark_coordinator_unknown(str(exc))
                                     if isinstance(exc, ConnectionFailedError) else None, result.failure(exc)))
        return result

    def committed(self, partitions, deadline: float, drive) -> dict[TopicPartition, OffsetAndMetadata | None]:
        while True:
            if not self.ensure_coordinator(deadline, drive):
                raise KafkaTimeoutError(f"group {self.group_id}: coordinator not found in time")
            fut = self._send_offset_fetch(list(partitions))
            drive(max(0.0, deadline - time.monotonic()), lambda: fut.done)
            if not fut.done:
                raise KafkaTimeoutError(f"group {self.group_id}: committed offsets not fetched in time")
            if not fut.failed:
                return fut.value()
            exc = fut.exception
            retriable = getattr(exc, "retriable", False) or isinstance(exc, ConnectionFailedError)
            if not retriable or time.monotonic() >= deadline:
                raise exc
            drive(self.config.retry_backoff_ms / 1000, lambda: False)

    # -- commits --------------------------------------------------------------------------------

    def _commit_body(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> dict:
        by_topic: dict[str, list] = {}
        for tp, om in offsets.items():
            by_topic.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": om.offset,
                "committed_leader_epoch": -1 if om.leader_epoch is None else om.leader_epoch,
                "committed_metadata": om.metadata or ""})
        member = self.subscriptions.has_subscription and self.generation >= 0
        return {"group_id": self.group_id,
                "generation_id_or_member_epoch": self.generation if member else -1,
                "member_id": self.member_id if member else "",
                "group_instance_id": self.instance_id if member else None,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

    def _send_commit(self, offsets: dict[TopicPartition, OffsetAndMetadata]) -> Future:
        result = Future()
        # Only a STABLE member commits (Java's generationIfStable): a commit sent with the old
        # generation while a join is under way could answer ILLEGAL_GENERATION after the new
        # generation arrived and reset it.
        if self.subscriptions.has_subscription and self.member.state != MemberState.STABLE:
            if self.member.state in (MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE):
                return result.failure(RebalanceInProgressError(
                    f"group {self.group_id}: cannot commit while rebalancing; poll() and retry"))
            return result.failure(CommitFailedError(
                f"group {self.group_id}: not a member of the group (partitions were reassigned); the "
                "records since the last commit may be delivered again to another member"))
        fut = self._send(OFFSET_COMMIT, self._commit_body(offsets), max_version=_MAX_COMMIT_VERSION)

        def done(value) -> None:
            version, resp = value
            first_error = None
            for t in resp["topics"]:
                for p in t["partitions"]:
                    if p["error_code"] and first_error is None:
                        first_error = (TopicPartition(t["name"], p["partition_index"]), p["error_code"])
            if first_error is None:
                with self._lock:
                    self._committed_cache.update(offsets)
                result.success(offsets)
                return
            tp, code = first_error
            err = BrokerError(code, f"OffsetCommit {tp}")
            with self._lock:
                if code in _COORDINATOR_ERRORS:
                    self.mark_coordinator_unknown(err.name)
                    result.failure(err)
                elif code == Errors.REBALANCE_IN_PROGRESS:
                    self.request_rejoin("commit saw a rebalance")
                    result.failure(RebalanceInProgressError(str(err)))
                elif code in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION):
                    self._reset_generation()
                    result.failure(CommitFailedError(
                        f"{err}: the group rebalanced and this member's partitions may belong to another "
                        "member; the records since the last commit may be delivered again"))
                elif code == Errors.FENCED_INSTANCE_ID:
                    self._fatal = FencedInstanceIdError(str(err))
                    result.failure(self._fatal)
                else:
                    result.failure(err)

        def failed(exc) -> None:
            if isinstance(exc, ConnectionFailedError):
                self.mark_coordinator_unknown(str(exc))
            result.failure(exc)

        fut.add_callback(done)
        fut.add_errback(failed)
        return result

    def _run_on_commit(self, offsets) -> None:
        if self._on_commit is None:
            return
        try:
            self._on_commit(offsets)
        except Exception:
            log.exception("on_commit interceptor raised; the commit itself succeeded")

    def commit_sync(self, offsets: dict[TopicPartition, OffsetAndMetadata], deadline: float, drive) -> None:
        if not offsets:
            return
        backoff = self.config.retry_backoff_ms / 1000
        while True:
            self._raise_fatal()
            if not self.ensure_coordinator(deadline, drive):
                raise KafkaTimeoutError(f"group {self.group_id}: commit timed out finding the coordinator")
            fut = self._send_commit(offsets)
            drive(max(0.0, deadline - time.monotonic()), lambda: fut.done)
            if not fut.done:
                raise KafkaTimeoutError(f"group {self.group_id}: commit not acknowledged in time")
            if not fut.failed:
                self._run_on_commit(offsets)
                return
            exc = fut.exception
            retriable = isinstance(exc, ConnectionFailedError) or \
                (isinstance(exc, BrokerError) and (exc.retriable or exc.code in _COORDINATOR_ERRORS))
            if not retriable:
                raise exc
            if time.monotonic() + backoff >= deadline:
                raise KafkaTimeoutError(f"group {self.group_id}: commit kept failing: {exc}")
            drive(backoff, lambda: False)
            backoff = min(backoff * 2, self.config.retry_backoff_max_ms / 1000)

    def _commit_sync_quietly(self) -> None:
        positions = self._consumed_offsets()
        if positions:
            self.commit_sync(positions, time.monotonic() + self.config.default_api_timeout_ms / 1000,
                             self._drive_plain)

    def _drive_plain(self, timeout: float, until) -> None:
        self.network.poll(timeout, until=until)

    def commit_async(self, offsets: dict[TopicPartition, OffsetAndMetadata], callback=None) -> Future:
        if not offsets:
            return Future().success({})
        if not self.coordinator_known:
            with self._lock:
                self._lookup_coordinator()
            exc = ConnectionFailedError(f"group {self.group_id}: coordinator unknown; commit not sent")
            self._queue_async(callback, offsets, exc)
            return Future().failure(exc)
        fut = self._send_commit(offsets)
        fut.add_callback(lambda value: (self._run_on_commit(offsets), self._queue_async(callback, offsets, None)))
        fut.add_errback(lambda exc: self._queue_async(callback, offsets, exc))
        return fut

    def _queue_async(self, callback, offsets, exc) -> None:
        if exc is not None:
            log.debug("group %s: async commit failed: %s", self.group_id, exc)
        if callback is not None:
            with self._lock:
                self._async_callbacks.append((callback, offsets, exc))

    def invoke_completed_commit_callbacks(self) -> None:
        with self._lock:
            pending, self._async_callbacks = self._async_callbacks, []
        for callback, offsets, exc in pending:
            try:
                callback(offsets, exc)
            except Exception:
                log.exception("commit callback raised")

    def _consumed_offsets(self) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: OffsetAndMetadata(position, "", epoch)
                for tp, (position, epoch) in self.subscriptions.all_consumed().items()}

    def maybe_auto_commit(self) -> None:
        if not self.config.enable_auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        offsets = self._consumed_offsets()
        if not offsets:
            return
        offsets = {tp: om for tp, om in offsets.items() if self._committed_cache.get(tp) != om}
        if offsets:
            self.commit_async(offsets)
