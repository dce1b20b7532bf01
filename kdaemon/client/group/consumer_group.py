"""The consumer group protocol (KIP-848): one ConsumerGroupHeartbeat request, the broker assigns.

Chosen by ``GroupCoordinator`` when ``group_protocol = "consumer"`` (Java's ``group.protocol``).
Follows the Java consumer's ``ConsumerMembershipManager``/``AbstractMembershipManager`` and
``ConsumerHeartbeatRequestManager``:

* **Joining**: a heartbeat with member epoch 0 and a member id the client generated (a UUID,
  as Java does since Kafka 4.0, KIP-1082), its subscription, ``rebalance_timeout_ms`` =
  ``max_poll_interval_ms`` (unless ``rebalance_timeout_ms`` is set), ``instance_id`` for a
  static member and ``rack_id`` from ``client_rack``.  The answer gives the member epoch, the
  heartbeat interval and the assignment.
* **Heartbeats** at the interval the broker returns, carrying only what changed since the last
  acknowledged one (``consumer_heartbeat.py``); sent by the heartbeat thread, and at once when
  there is news (an acknowledgement, a subscription change).
* **Reconciliation** (``reconcile.py``), in the application thread from ``poll``: the target
  comes by topic id and is resolved through metadata (an unknown id asks for a metadata update
  and waits); the partitions that go are committed (auto-commit), handed to
  ``on_partitions_revoked`` and dropped; the new ones are taken and handed to
  ``on_partitions_assigned``; then the next heartbeat reports what the member owns, which
  acknowledges the assignment.  Partitions in both keep fetching throughout.
* **Fencing**: FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID: the partitions are lost
  (``on_partitions_lost``, nothing committed) and the member rejoins at epoch 0 with the same
  member id, as Java.
* **Leaving**: a heartbeat with epoch -1, or -2 for a static member (``group_instance_id``),
  whose assignment the broker then keeps for it until its session times out.
* **Errors no retry mends** (UNRELEASED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED,
  UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION, ...) make the member FATAL with an error
  that says what to do.  NOT_COORDINATOR/COORDINATOR_NOT_AVAILABLE find the coordinator again;
  COORDINATOR_LOAD_IN_PROGRESS and other retriable errors retry after ``retry_backoff_ms``.

**Pattern subscriptions differ from the classic protocol.**  Under "classic" the client matches
its Python ``re`` pattern against the topic names in its metadata (whole-name match, internal
topics skipped) and joins with the resulting topic list.  Under "consumer" the pattern's *text*
goes to the broker (``subscribed_topic_regex``, ConsumerGroupHeartbeat v1+), which compiles it
with RE2J and matches it against whole topic names itself, including topics created later; the
client does no matching.  RE2J is not Python's ``re``: no backreferences or lookaround, and a
few escapes differ; a pattern the broker cannot compile fails with INVALID_REGULAR_EXPRESSION.
``subscribed_topics()`` then reports the topics of the current assignment (docs/GROUP_PROTOCOLS.md).

The member's states map onto ``state.py``'s table: UNJOINED (not a member: before the first
join, after a fence or a leave), PREPARING_REBALANCE (the joining heartbeat is out),
COMPLETING_REBALANCE (a target assignment is being reconciled), STABLE (owns its target).
"""

from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import Callable

from ...protocol.apis import CONSUMER_GROUP_HEARTBEAT
from ...protocol.errors import Errors, UnsupportedVersionError, error_code
from ..config import ConsumerConfig
from ..errors import (CommitFailedError, ConnectionFailedError, FencedInstanceIdError, GroupError,
                      RebalanceInProgressError)
from ..future import Future
from ..metadata import ClusterMetadata
from ..network import NetworkClient
from ..subscription import SubscriptionState
from .consumer_heartbeat import (JOIN_EPOCH, ConsumerHeartbeatTimer, HeartbeatRequestState, MemberFields,
                                 leave_request)
from .discovery import COORDINATOR_ERRORS, CoordinatorLookup
from .heartbeat import HeartbeatThread
from .membership import GroupMembership, InvokeListener
from .reconcile import owned_by_topic_id, plan, resolve_target
from .state import MemberEvent, MemberState

# The logger and the join line are the classic membership's ("group <g>: joined generation <n>"),
# the generation being the member epoch: operators' log filters and testkit/daemon.py count
# joins by them whichever protocol the daemon chose.
log = logging.getLogger("kdaemon.client.group.coordinator")

# Codes kdaemon.protocol.errors.Errors does not name (its table does)
GROUP_ID_NOT_FOUND = 69
INVALID_REGULAR_EXPRESSION = 128   # KIP-848, ConsumerGroupHeartbeat v1+

S = MemberState


def new_member_id() -> str:
    """A member id as the Java client makes it (``Uuid.randomUuid().toString()``: a random UUID
    in URL-safe base64 without padding)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class ConsumerMembership(GroupMembership):
    protocol_name = "consumer"
    heartbeat_states = frozenset({S.STABLE, S.COMPLETING_REBALANCE})   # reconciling members heartbeat too

    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState, coordinator: CoordinatorLookup,
                 before_rebalance: Callable[[], None]) -> None:
        super().__init__(config, network, metadata, subscriptions, coordinator, before_rebalance)
        self.member_id = new_member_id()   # kept for the consumer's lifetime, fences included
        self.generation = -1               # the member epoch; -1 while not a member
        self.leader_id = None              # the broker assigns: no member leads
        self.timer = ConsumerHeartbeatTimer(max_poll_interval_ms=config.max_poll_interval_ms, now=time.monotonic())
        self._request = HeartbeatRequestState()
        self._target: dict[uuid.UUID, frozenset[int]] | None = None  # the last target from the broker
        self._target_version = 0                   # bumped by every new target
        self._reconciled: tuple | None = None     # (target version, metadata version) last reconciled
        self._topic_ids: dict[str, uuid.UUID] = {}  # name -> id of the topics in the target
        self._owned: tuple = ()                    # owned partitions by topic id, as reported
        self._urgent = False                       # news to tell the coordinator at once
        self._may_join = True                      # False after a leave until the next poll/subscribe
        self._heartbeat_thread = HeartbeatThread(self.heartbeat_tick, 1.0, name=f"kdaemon-heartbeat-{self.group_id}")

    # -- what the member tells the coordinator --------------------------------------------------

    def _fields(self) -> MemberFields:
        subs = self.subscriptions
        pattern = subs.subscribed_pattern
        return MemberFields(
            instance_id=self.instance_id, rack_id=self.config.client_rack or None,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms or self.config.max_poll_interval_ms,
            subscribed_topic_names=None if pattern is not None else tuple(sorted(subs.subscribed_topics)),
            subscribed_topic_regex=None if pattern is None else pattern.pattern,
            server_assignor=self.config.group_remote_assignor, owned=self._owned)

    def subscribed_topics(self) -> set[str]:
        """The subscribed topics; under a pattern, the topics of the current assignment: the
        broker matches the pattern, and the client does not know what else it matched."""
        subs = self.subscriptions
        if subs.subscribed_pattern is not None:
            return {tp.topic for tp in subs.assigned()}
        return set(subs.subscribed_topics)

    # -- events from outside --------------------------------------------------------------------

    def coordinator_found(self, now: float) -> None:
        # A new coordinator may not know what the old one was told: the next request is full.
        self._request.reset()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self.state.apply(MemberEvent.FATAL_ERROR, error)
        self.network.interrupt()

    def request_rejoin(self, reason: str) -> None:
        """There is no rejoining under this protocol: a changed subscription goes out in the next
        heartbeat, at once, and the broker answers with a new target if it moves anything."""
        with self._lock:
            log.debug("group %s: telling the coordinator at once: %s", self.group_id, reason)
            self._may_join = True
            self._urgent = True

    def reset_generation(self, reason: str) -> None:
        """A commit was refused as from an unknown member: ask the coordinator at once with a
        full heartbeat; if the member was fenced, that answer says so and the partitions are
        given up there (Java does not fence itself on a commit's answer either)."""
        with self._lock:
            log.info("group %s: %s; checking the membership with a heartbeat", self.group_id, reason)
            self._request.reset()
            self._urgent = True

    def poll(self, now: float) -> None:
        with self._lock:
            self.timer.polled(now)
            self._may_join = True

    @property
    def needs_attention(self) -> bool:
        return self.state.need_rejoin or self.state.state is S.COMPLETING_REBALANCE or bool(self._pending_lost)

    # -- commits --------------------------------------------------------------------------------

    def commit_member(self) -> tuple[int, str, str | None]:
        """A member with an epoch commits, also while reconciling (the auto-commit of what it is
        giving up happens then); the coordinator checks the epoch (STALE_MEMBER_EPOCH)."""
        state = self.state.state
        if self.generation > 0 and state in (S.COMPLETING_REBALANCE, S.STABLE):
            return self.generation, self.member_id, self.instance_id
        if state is S.PREPARING_REBALANCE:
            raise RebalanceInProgressError(f"group {self.group_id}: cannot commit while joining; poll() and retry")
        raise CommitFailedError(
            f"group {self.group_id}: not a member of the group (fenced, or left); the records since the "
            "last commit may be delivered again to another member")

    def last_answer(self) -> float:
        return self.timer.last_answer

    def heartbeat_interval(self) -> float:
        return self.timer.interval

    def heartbeat_now(self) -> None:
        self._request.reset()   # a full request: the answer then says all the coordinator knows
        self._urgent = True

    def fetch_member(self) -> tuple[str | None, int]:
        if self.generation > 0:
            return self.member_id, self.generation
        return None, -1

    def committable(self, offsets: dict) -> dict:
        """Never commit a partition the member no longer owns: once it is revoked another member
        may own it and commit, and this commit would move that member's position."""
        kept = {tp: om for tp, om in offsets.items() if self.subscriptions.is_assigned(tp)}
        if len(kept) != len(offsets):
            log.info("group %s: not committing %s: no longer owned", self.group_id,
                     ", ".join(sorted(str(tp) for tp in offsets if tp not in kept)))
        return kept

    # -- the application thread -----------------------------------------------------------------

    def ensure_active(self, deadline: float, drive, invoke_listener: InvokeListener) -> bool:
        """Join if not a member, reconcile a new target; True when the member owns its target.
        It waits (until ``deadline``) only while it owns nothing: a member with partitions
        keeps fetching them while it joins, reconciles or looks for its coordinator."""
        self.raise_if_fatal()
        self._deliver_lost(invoke_listener)
        self._heartbeat_thread.start()
        owns = bool(self.subscriptions.assigned())
        if not self.coordinator.ensure(time.monotonic() if owns else deadline, drive):
            return False
        with self._lock:
            self._heartbeat_once(time.monotonic())
        if not owns and self.state.state in (S.UNJOINED, S.PREPARING_REBALANCE):
            drive(max(0.0, deadline - time.monotonic()),
                  lambda: self.state.state not in (S.UNJOINED, S.PREPARING_REBALANCE))
            self.raise_if_fatal()
        for _ in range(3):   # a target that changed while reconciling is reconciled again at once
            if not self._reconcile(invoke_listener):
                break
        self._deliver_lost(invoke_listener)
        with self._lock:
            # The acknowledgement goes out now, onto the wire before this poll returns (as
            # Java's): the owner may tell others at once that partitions were given up (kdaemon's
            # supervisor pokes the worker waiting for them), and their heartbeats must not reach
            # the coordinator before it.
            if self._heartbeat_once(time.monotonic()):
                self.network.poll(0)
        if not self.state.stable and not self.subscriptions.assigned():
            # Nothing to fetch meanwhile (topic ids waiting for metadata, a join being retried):
            # wait a little for news rather than send poll() back at once, spinning.
            seen = (self.metadata.version, self._target_version, self.state.state)
            drive(max(0.0, min(deadline - time.monotonic(), self.config.retry_backoff_ms / 1000)),
                  lambda: (self.metadata.version, self._target_version, self.state.state) != seen)
        return self.state.stable

    def _reconcile(self, invoke_listener: InvokeListener) -> bool:
        """One reconciliation of the current target; True if the target changed meanwhile."""
        with self._lock:
            if self.state.state is not S.COMPLETING_REBALANCE or self._target is None:
                return False
            target, epoch, version = self._target, self.generation, self._target_version
            key = (version, self.metadata.version)
        if key == self._reconciled:
            return False   # nothing new since the last try (ids still unresolved)
        new_target = self._reconciled is None or self._reconciled[0] != version
        self._reconciled = key
        resolved = resolve_target(target, self.metadata.topic_names)
        if resolved.unresolved:
            log.info("group %s: topic ids %s of the assignment are not in metadata yet; updating it",
                     self.group_id, ", ".join(str(t) for t in resolved.unresolved))
            self.metadata.request_update()
            self.metadata.maybe_update(self.network)
        owned = set(self.subscriptions.assigned())
        change = plan(owned, resolved.partitions)
        if change.revoked:
            try:
                self._before_rebalance()   # the auto-commit, while the member still owns them
            except Exception as exc:       # the rebalance goes on; the next owner may re-read
                log.warning("group %s: commit before revoking failed: %s", self.group_id, exc)
            invoke_listener("on_partitions_revoked", set(change.revoked))
            self.subscriptions.set_group_assignment(sorted(owned - change.revoked))
        with self._lock:
            self._topic_ids.update(resolved.topic_ids)
        if change.added:
            self.subscriptions.set_group_assignment(sorted(change.owned_after))
            for tp in change.added:
                self.subscriptions.state(tp).awaiting_committed = True
        if change.changes or self.rebalances == 0:
            log.info("group %s: epoch %s: revoked %s, assigned %s, kept %d", self.group_id, epoch,
                     sorted(map(str, change.revoked)) or "nothing", sorted(map(str, change.added)) or "nothing",
                     len(change.kept))
        if change.added or new_target:   # once per target, as a classic rebalance does
            invoke_listener("on_partitions_assigned", set(change.added))
        with self._lock:
            self._owned = owned_by_topic_id(self.subscriptions.assigned(), self._topic_ids)
            self._urgent = True
            if self.state.state is not S.COMPLETING_REBALANCE:
                return False     # fenced or left meanwhile: the lost partitions are reported next
            if self._target_version != version:
                return True
            if not resolved.unresolved:
                self.state.apply(MemberEvent.RECONCILED)
                self.rebalances += 1
        return False

    def _deliver_lost(self, invoke_listener: InvokeListener) -> None:
        with self._lock:
            lost, self._pending_lost = self._pending_lost, None
        if lost:
            lost &= set(self.subscriptions.assigned())
            if lost:
                invoke_listener("on_partitions_lost", lost)
            self.subscriptions.set_group_assignment([])
            with self._lock:
                self._owned = ()
                self._urgent = True

    def _give_up_partitions(self) -> None:
        """Under the lock: the member stopped being one (fenced, left); what it owns is lost,
        reported by the application thread before the member joins again."""
        self.generation = -1
        self._target = None
        self._reconciled = None
        self._owned = ()
        self._request.reset()
        owned = set(self.subscriptions.assigned())
        if owned:
            self._pending_lost = (self._pending_lost or set()) | owned
        self.state.apply(MemberEvent.RESET)
        self.network.interrupt()

    # -- heartbeats (either thread, under the lock) ---------------------------------------------

    def heartbeat_tick(self) -> float | None:
        """One turn of the heartbeat thread; returns the seconds until the next one is due."""
        with self._lock:
            self._heartbeat_once(time.monotonic())
            self.network.poll(0)
            return self.timer.until_due(time.monotonic())

    def _heartbeat_once(self, now: float) -> bool:
        """Send the heartbeat that is due, if one is; True if one went out (queued)."""
        state = self.state.state
        poked = self._take_poke()
        if state is S.FATAL or not self.coordinator.known:
            return False
        if state is S.UNJOINED:
            # Join only once the lost partitions were reported (Java waits for
            # onPartitionsLost too) and while the application wants to be a member.
            if (self._may_join and self.subscriptions.has_subscription and not self._pending_lost
                    and self.timer.due(now, urgent=True)):
                self._send_heartbeat(now, JOIN_EPOCH)
                return True
            return False
        if state is S.PREPARING_REBALANCE:
            return False
        if self.timer.poll_timeout_expired(now):
            log.warning("group %s: no poll() for more than max_poll_interval_ms=%s; leaving the group so "
                        "its partitions can move (the next poll rejoins)", self.group_id,
                        self.config.max_poll_interval_ms)
            self.leave("consumer poll timeout has expired")
            return False
        # A reconciling member's acknowledgement is on its way (urgent): it answers the poke too.
        if self.timer.due(now, urgent=self._urgent or (poked and state is S.STABLE)):
            self._send_heartbeat(now, self.generation)
            return True
        return False

    def _send_heartbeat(self, now: float, epoch: int) -> None:
        fields = self._fields()
        body = self._request.build(self.group_id, self.member_id, epoch, fields)
        if epoch == JOIN_EPOCH:
            self.state.apply(MemberEvent.JOIN_SENT)
        self._urgent = self._poked = False
        self.timer.sent(now)
        min_version = 1 if fields.subscribed_topic_regex is not None else None
        fut = self.coordinator.send(CONSUMER_GROUP_HEARTBEAT, body, min_version=min_version,
                                    timeout_ms=self.config.request_timeout_ms)
        fut.add_callback(lambda value: self._on_heartbeat(value[1], fields, epoch))
        fut.add_errback(lambda exc: self._on_heartbeat_failed(exc, epoch))

    def _on_heartbeat(self, resp: dict, fields: MemberFields, sent_epoch: int) -> None:
        with self._lock:
            now = time.monotonic()
            code = resp["error_code"]
            state = self.state.state
            if state in (S.UNJOINED, S.FATAL):
                self.timer.failed(now, 0.0)   # an answer for a membership already given up
                return
            if code == Errors.NONE:
                self._on_heartbeat_ok(resp, fields, state)
                return
            self.timer.failed(now, self.config.retry_backoff_ms / 1000)
            self._request.reset()
            if state is S.PREPARING_REBALANCE:
                self.state.apply(MemberEvent.JOIN_FAILED)
            self._on_heartbeat_error(code, resp.get("error_message"), fields)

    def _on_heartbeat_ok(self, resp: dict, fields: MemberFields, state: MemberState) -> None:
        self.timer.received(resp["heartbeat_interval_ms"], now=time.monotonic())
        self._request.acknowledged(fields)
        if resp["member_id"]:
            self.member_id = resp["member_id"]
        epoch = resp["member_epoch"]
        if state is S.PREPARING_REBALANCE:
            self.state.apply(MemberEvent.JOINED)
            log.info("group %s: joined generation %s as %s (consumer protocol: the member epoch; heartbeat "
                     "every %s ms)", self.group_id, epoch, self.member_id, resp["heartbeat_interval_ms"])
            if resp["assignment"] is None:
                self._target = {}
                self._target_version += 1
        elif epoch != self.generation:
            log.debug("group %s: member epoch %s -> %s", self.group_id, self.generation, epoch)
        self.generation = epoch
        assignment = resp["assignment"]
        if assignment is not None:
            target = {t["topic_id"]: frozenset(t["partitions"]) for t in assignment["topic_partitions"]}
            if target == self._target and self.state.state is S.STABLE:
                return   # the same assignment again (a full request's answer): nothing to do
            self._target = target
            self._target_version += 1
            self.state.apply(MemberEvent.TARGET_CHANGED)   # STABLE or COMPLETING -> COMPLETING
            self.network.interrupt()   # a poll waiting on fetches comes back to reconcile

    def _on_heartbeat_error(self, code: int, message: str | None, fields: MemberFields) -> None:
        name = error_code(code).name
        said = f"{name}{': ' + message if message else ''}"
        if code in (Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID):
            log.info("group %s: fenced (%s); its partitions are lost, rejoining at epoch 0", self.group_id, said)
            self._give_up_partitions()
        elif code in COORDINATOR_ERRORS:
            self.coordinator.mark_unknown(name)
        elif code == Errors.FENCED_INSTANCE_ID:
            self.fail(FencedInstanceIdError(
                f"group {self.group_id}: group_instance_id {self.instance_id!r} is in use by another member"))
        elif code in _FATAL or not error_code(code).retriable:
            self.fail(GroupError(f"group {self.group_id}: ConsumerGroupHeartbeat refused ({said}): "
                                 f"{_what_to_do(code, self.config, fields)}"))
        else:   # COORDINATOR_LOAD_IN_PROGRESS and other retriable errors: again after the backoff
            log.info("group %s: heartbeat: %s; retrying", self.group_id, said)

    def _on_heartbeat_failed(self, exc: BaseException, sent_epoch: int) -> None:
        with self._lock:
            self.timer.failed(time.monotonic(), self.config.retry_backoff_ms / 1000)
            self._request.reset()
            if self.state.state is S.PREPARING_REBALANCE:
                self.state.apply(MemberEvent.JOIN_FAILED)
            if isinstance(exc, UnsupportedVersionError):
                self.fail(GroupError(f"group {self.group_id}: {exc}: the broker does not speak the consumer "
                                     "group protocol (KIP-848) at the version needed; use group_protocol='classic', "
                                     "or a broker with the group.version feature enabled (Apache Kafka 4.0+; a "
                                     "regex subscription needs ConsumerGroupHeartbeat v1)"))
            elif isinstance(exc, ConnectionFailedError):
                self.coordinator.mark_unknown(str(exc))
            else:
                log.warning("group %s: heartbeat failed: %s", self.group_id, exc)

    # -- leaving --------------------------------------------------------------------------------

    def leave(self, reason: str, *, partitions_lost: bool = True, for_good: bool = False) -> Future | None:
        """Leave with epoch -1, or -2 as a static member (the broker keeps its assignment for it
        until the session times out, so a restart gets the same partitions back) unless
        ``for_good``, and forget the epoch.  No rejoin until the next ``poll`` (or ``subscribe``)."""
        with self._lock:
            fut = None
            if self.generation > 0 and self.coordinator.connection is not None:
                body = leave_request(self.group_id, self.member_id, self.instance_id, for_good=for_good)
                fut = self.coordinator.send(CONSUMER_GROUP_HEARTBEAT, body, timeout_ms=self.config.request_timeout_ms)
                log.info("group %s: leaving with epoch %s (%s)", self.group_id, body["member_epoch"], reason)
            self._may_join = False
            self._give_up_partitions()
            if not partitions_lost:
                self._pending_lost = None
            return fut

    def close(self) -> None:
        self._heartbeat_thread.stop(timeout=5)


# Errors no retry mends: the member stops, and says what to change.
_FATAL = frozenset({Errors.UNRELEASED_INSTANCE_ID, Errors.GROUP_MAX_SIZE_REACHED, Errors.UNSUPPORTED_ASSIGNOR,
                    INVALID_REGULAR_EXPRESSION, Errors.GROUP_AUTHORIZATION_FAILED, Errors.INVALID_GROUP_ID,
                    Errors.UNSUPPORTED_VERSION, GROUP_ID_NOT_FOUND})


def _what_to_do(code: int, config: ConsumerConfig, fields: MemberFields) -> str:
    if code == Errors.UNRELEASED_INSTANCE_ID:
        return (f"group_instance_id {config.group_instance_id!r} is still held by another member; that member "
                "must leave first (stop it, or wait for its session to time out), or give this consumer "
                "another group_instance_id")
    if code == Errors.GROUP_MAX_SIZE_REACHED:
        return "the group is full (the broker's group.consumer.max.size); stop a member or raise that limit"
    if code == Errors.UNSUPPORTED_ASSIGNOR:
        return (f"the broker does not offer group_remote_assignor={config.group_remote_assignor!r} "
                "(see its group.consumer.assignors); choose one it offers, or leave it unset")
    if code == INVALID_REGULAR_EXPRESSION:
        return (f"the broker cannot compile the subscription pattern {fields.subscribed_topic_regex!r} as an "
                "RE2J regular expression; fix the pattern (RE2 syntax: no backreferences or lookaround)")
    if code == Errors.GROUP_AUTHORIZATION_FAILED:
        return "this client may not use the group; grant it READ on the group"
    if code == Errors.UNSUPPORTED_VERSION:
        return ("the broker does not support the consumer group protocol at this version; use "
                "group_protocol='classic' or enable the group.version feature")
    if code == GROUP_ID_NOT_FOUND:
        return ("the group exists under the classic protocol and the broker will not convert it "
                "(group.consumer.migration.policy); use group_protocol='classic' or another group_id")
    return "retrying will not help; check the group's configuration"
