"""A share group member (KIP-932): ShareGroupHeartbeat, the broker assigns, nothing to reconcile.

Follows Java's ``ShareMembershipManager``/``ShareHeartbeatRequestManager`` where a share member
differs from a consumer-group one (``group/consumer_group.py``):

* **Joining**: a heartbeat with member epoch 0 and a member id the client chose (a UUID, kept
  for the consumer's lifetime, fences included: the broker echoes it), the subscribed topic
  names and ``rack_id``.  Later heartbeats send the subscription and rack only when they changed
  since the coordinator last acknowledged them (null: unchanged), and after any error in full.
* **The assignment** comes by topic id, null when unchanged.  It names the partitions to
  ShareFetch from; many members may share one partition, so there is nothing to revoke, commit or
  acknowledge: the member uses the new set at once (``assignment()``, resolved through metadata).
* **Fencing** (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID): the member rejoins at epoch 0 with the
  same member id; its records stay held until their locks run out.
* **Leaving**: epoch -1 (close, unsubscribe, or no ``poll`` for ``max_poll_interval_ms``).
* **Errors**: NOT_COORDINATOR/COORDINATOR_NOT_AVAILABLE find the coordinator again;
  COORDINATOR_LOAD_IN_PROGRESS and other retriable ones retry after ``retry_backoff_ms``;
  the rest make the member FATAL with an error saying what to do (GROUP_ID_NOT_FOUND here means
  the group id belongs to a group of another type).

Heartbeats go out from a background thread (``group/heartbeat.py``'s ``HeartbeatThread``) at
the interval each answer names, and from ``ensure_active`` in the application thread.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from ...protocol.apis import SHARE_GROUP_HEARTBEAT
from ...protocol.errors import Errors, UnsupportedVersionError, error_code
from ..config import ConsumerConfig
from ..errors import ConnectionFailedError, GroupError
from ..future import Future
from ..group.consumer_heartbeat import ConsumerHeartbeatTimer
from ..group.discovery import COORDINATOR_ERRORS, CoordinatorLookup
from ..group.heartbeat import HeartbeatThread
from ..group.reconcile import resolve_target
from ..metadata import ClusterMetadata
from ..network import NetworkClient
from ..types import TopicPartition
from .state import ShareMemberEvent, ShareMemberState, ShareMemberStateMachine

log = logging.getLogger(__name__)

JOIN_EPOCH = 0
LEAVE_EPOCH = -1

S, E = ShareMemberState, ShareMemberEvent

# What to do about an error no retry mends, by code.
_FATAL_FIX = {
    Errors.GROUP_AUTHORIZATION_FAILED: "grant the principal READ on the group",
    Errors.GROUP_ID_NOT_FOUND: "the group id is taken by a group of another type (a consumer group?); "
                               "use another group_id for the share group",
    Errors.INCONSISTENT_GROUP_PROTOCOL: "the group id is taken by a group of another type; use another group_id",
    Errors.GROUP_MAX_SIZE_REACHED: "the share group is full (group.share.max.size); add no more members",
    Errors.INVALID_REQUEST: "the broker refused the request as malformed",
    Errors.UNSUPPORTED_VERSION: "the broker does not support share groups at this version",
}


def new_member_id() -> str:
    """A share member names itself (Kafka 4.1+): a random UUID, as Java's ``Uuid.randomUuid()``."""
    import base64
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class ShareMembership:
    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 on_change: Callable[[], None] | None = None) -> None:
        assert config.group_id is not None
        self.config = config
        self.group_id = config.group_id
        self.network = network
        self.metadata = metadata
        self._lock = network.lock
        self.state = ShareMemberStateMachine()
        self.member_id = new_member_id()
        self.epoch = -1
        self.joins = 0                       # completed joins (a rejoin after a fence counts)
        self.subscription: tuple[str, ...] = ()
        self._target: dict[uuid.UUID, frozenset[int]] = {}
        self.target_version = 0              # bumped by every assignment that changed
        self._acknowledged: tuple[tuple[str, ...], str | None] | None = None   # (subscription, rack) the coordinator has
        self._urgent = False
        self._may_join = False               # subscribed and not left
        self._on_change = on_change
        self.timer = ConsumerHeartbeatTimer(max_poll_interval_ms=config.max_poll_interval_ms, now=time.monotonic())
        self.coordinator = CoordinatorLookup(config, network, metadata,
                                             on_found=self._coordinator_found, on_fatal=self.fail,
                                             raise_if_fatal=self.state.raise_if_fatal)
        self._thread = HeartbeatThread(self.heartbeat_tick, 1.0, name=f"kdaemon-share-heartbeat-{self.group_id}")

    # -- what the application asks --------------------------------------------------------------

    def subscribe(self, topics: tuple[str, ...]) -> None:
        with self._lock:
            self.subscription = tuple(sorted(set(topics)))
            self._may_join = True
            self._urgent = True

    def poll(self, now: float) -> None:
        with self._lock:
            self.timer.polled(now)
            if self.subscription:
                self._may_join = True

    def assignment(self) -> tuple[frozenset[TopicPartition], bool]:
        """The assigned partitions the metadata can name, and whether some topic id is still
        unknown to it (the caller then asks for a metadata update)."""
        with self._lock:
            target = dict(self._target)
        resolved = resolve_target(target, self.metadata.topic_names)
        return resolved.partitions, bool(resolved.unresolved)

    @property
    def joined(self) -> bool:
        return self.state.state is S.STABLE

    def raise_if_fatal(self) -> None:
        self.state.raise_if_fatal()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            self.state.apply(E.FATAL_ERROR, error)
        self.network.interrupt()

    def ensure_active(self, deadline: float, drive) -> bool:
        """Find the coordinator and join if not a member (waiting until ``deadline`` at most);
        True when the member has an epoch."""
        self.raise_if_fatal()
        self._thread.start()
        if not self.coordinator.ensure(deadline, drive):
            return False
        with self._lock:
            if self._heartbeat_once(time.monotonic()):
                self.network.poll(0)
        if self.state.state in (S.UNJOINED, S.JOINING):
            drive(max(0.0, deadline - time.monotonic()),
                  lambda: self.state.state not in (S.UNJOINED, S.JOINING))
            self.raise_if_fatal()
        return self.joined

    def leave(self, reason: str) -> Future | None:
        """Leave with epoch -1 (if a member) and stay out until ``subscribe`` or ``poll``."""
        with self._lock:
            fut = None
            if self.epoch > 0 and self.coordinator.connection is not None:
                body = {"group_id": self.group_id, "member_id": self.member_id, "member_epoch": LEAVE_EPOCH}
                fut = self.coordinator.send(SHARE_GROUP_HEARTBEAT, body, timeout_ms=self.config.request_timeout_ms)
                log.info("share group %s: leaving (%s)", self.group_id, reason)
            self._may_join = False
            self._forget_membership()
            self.state.apply(E.LEFT)
            return fut

    def close(self) -> None:
        self._thread.stop(timeout=5)

    # -- heartbeats (either thread, under the lock) ---------------------------------------------

    def heartbeat_tick(self) -> float | None:
        with self._lock:
            self._heartbeat_once(time.monotonic())
            self.network.poll(0)
            return self.timer.until_due(time.monotonic())

    def _coordinator_found(self) -> None:
        self._acknowledged = None   # a new coordinator may not know what the old one was told

    def _heartbeat_once(self, now: float) -> bool:
        state = self.state.state
        if state is S.FATAL or not self.coordinator.known:
            return False
        if state is S.UNJOINED:
            if self._may_join and self.subscription and self.timer.due(now, urgent=True):
                self._send(now, JOIN_EPOCH)
                return True
            return False
        if state is S.JOINING:
            return False
        if self.timer.poll_timeout_expired(now):
            log.warning("share group %s: no poll() for more than max_poll_interval_ms=%s; leaving the "
                        "group (the next poll rejoins)", self.group_id, self.config.max_poll_interval_ms)
            self.leave("consumer poll timeout has expired")
            return False
        if self.timer.due(now, urgent=self._urgent):
            self._send(now, self.epoch)
            return True
        return False

    def _send(self, now: float, epoch: int) -> None:
        rack = self.config.client_rack or None
        fields = (self.subscription, rack)
        full = epoch == JOIN_EPOCH or self._acknowledged is None
        body = {"group_id": self.group_id, "member_id": self.member_id, "member_epoch": epoch,
                "rack_id": rack if full or self._acknowledged[1] != rack else None,
                "subscribed_topic_names": list(self.subscription)
                if full or self._acknowledged[0] != self.subscription else None}
        if epoch == JOIN_EPOCH:
            self.state.apply(E.JOIN_SENT)
        self._urgent = False
        self.timer.sent(now)
        fut = self.coordinator.send(SHARE_GROUP_HEARTBEAT, body, timeout_ms=self.config.request_timeout_ms)
        fut.add_callback(lambda value: self._on_answer(value[1], fields, epoch))
        fut.add_errback(self._on_failure)

    def _on_answer(self, resp: dict, fields, sent_epoch: int) -> None:
        with self._lock:
            now = time.monotonic()
            state = self.state.state
            if state in (S.UNJOINED, S.FATAL) or (state is S.STABLE and sent_epoch == JOIN_EPOCH):
                self.timer.failed(now, 0.0)   # for a membership given up meanwhile
                return
            code = resp["error_code"]
            if code != Errors.NONE:
                self.timer.failed(now, self.config.retry_backoff_ms / 1000)
                self._acknowledged = None
                if state is S.JOINING:
                    self.state.apply(E.JOIN_FAILED)
                self._on_error(code, resp.get("error_message"))
                return
            self.timer.received(resp["heartbeat_interval_ms"], now=now)
            self._acknowledged = fields
            self.epoch = resp["member_epoch"]
            if state is S.JOINING:
                self.state.apply(E.JOINED)
                self.joins += 1
                log.info("share group %s: joined with member epoch %s as %s (heartbeat every %s ms)",
                         self.group_id, self.epoch, self.member_id, resp["heartbeat_interval_ms"])
            assignment = resp["assignment"]
            if assignment is not None:
                target = {t["topic_id"]: frozenset(t["partitions"]) for t in assignment["topic_partitions"]}
                if target != self._target:
                    self._target = target
                    self.target_version += 1
                    log.info("share group %s: epoch %s: assigned %s", self.group_id, self.epoch,
                             {str(k): sorted(v) for k, v in target.items()} or "nothing")
                    self.network.interrupt()
                    if self._on_change is not None:
                        self._on_change()

    def _on_error(self, code: int, message: str | None) -> None:
        name = error_code(code).name
        said = f"{name}{': ' + message if message else ''}"
        if code in (Errors.FENCED_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID):
            log.info("share group %s: fenced (%s); rejoining at epoch 0", self.group_id, said)
            self._forget_membership()
            if self.state.state is S.STABLE:
                self.state.apply(E.FENCED)
            self._urgent = True
        elif code in COORDINATOR_ERRORS:
            self.coordinator.mark_unknown(name)
        elif code in _FATAL_FIX or not error_code(code).retriable:
            fix = _FATAL_FIX.get(code, "see the broker's log")
            self.fail(GroupError(f"share group {self.group_id}: ShareGroupHeartbeat refused ({said}): {fix}"))
        else:
            log.info("share group %s: heartbeat: %s; retrying", self.group_id, said)

    def _on_failure(self, exc: BaseException) -> None:
        with self._lock:
            self.timer.failed(time.monotonic(), self.config.retry_backoff_ms / 1000)
            self._acknowledged = None
            if self.state.state is S.JOINING:
                self.state.apply(E.JOIN_FAILED)
            if isinstance(exc, UnsupportedVersionError):
                self.fail(GroupError(f"share group {self.group_id}: {exc}: the broker does not speak the share "
                                     "group protocol (KIP-932, ShareGroupHeartbeat v1: Apache Kafka 4.1+ with "
                                     "share groups on)"))
            elif isinstance(exc, ConnectionFailedError):
                self.coordinator.mark_unknown(str(exc))
            else:
                log.warning("share group %s: heartbeat failed: %s", self.group_id, exc)

    def _forget_membership(self) -> None:
        self.epoch = -1
        self._acknowledged = None
        if self._target:
            self._target = {}
            self.target_version += 1
