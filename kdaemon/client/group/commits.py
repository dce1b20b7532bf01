"""Committed offsets: OffsetCommit (sync, async, automatic) and OffsetFetch.

Follows the commit half of the Java ``ConsumerCoordinator``.  A commit carries the member's
identity when the consumer is a subscribed member, so the coordinator can refuse one from a
member the group moved on from; the membership says what that identity is
(``commit_member()``: the generation under the classic protocol, the member epoch under KIP-848
at OffsetCommit v9+; ``fetch_member()`` for OffsetFetch v9+), and what an answer says about the
membership (a rebalance, a lost generation, a fenced member) is handed to it.

KIP-848's STALE_MEMBER_EPOCH (the commit raced a heartbeat that moved the epoch on) is handled
as Java's ``CommitRequestManager``: a synchronous commit (``commit_sync``, the auto-commit before
a revocation) is retried with the epoch the member holds by then, until its deadline, while the
member still has an epoch; an asynchronous one fails to its callback.  A partition the member
no longer owns is never committed (``GroupMembership.committable``).

Threads: everything here runs in the application thread except response callbacks, which run
under the network client's lock in whichever thread completes them; async commit callbacks are
queued and run in the application thread by ``invoke_completed_commit_callbacks``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...backoff import Backoff
from ...protocol.apis import OFFSET_COMMIT, OFFSET_FETCH
from ...protocol.errors import BrokerError, Errors, error_code
from ..config import ConsumerConfig
from ..errors import (CommitFailedError, ConnectionFailedError, FencedInstanceIdError, KafkaTimeoutError,
                      NoOffsetForPartitionError, RebalanceInProgressError)
from ..future import Future
from ..network import NetworkClient
from ..subscription import SubscriptionState
from ..types import OffsetAndMetadata, TopicPartition
from .discovery import COORDINATOR_ERRORS, CoordinatorLookup
from .membership import GroupMembership

log = logging.getLogger(__name__)

_MAX_COMMIT_VERSION = 9   # v10 names topics by id; names work everywhere
_MAX_FETCH_VERSION = 9

Offsets = dict[TopicPartition, OffsetAndMetadata]

# OffsetFetch answers that mean "ask again on the next poll": the coordinator moved, or the
# KIP-848 member's epoch moved on (or it is rejoining) between sending and answering.
_ASK_AGAIN = COORDINATOR_ERRORS | {Errors.STALE_MEMBER_EPOCH, Errors.UNKNOWN_MEMBER_ID}


class OffsetCommits:
    def __init__(self, config: ConsumerConfig, network: NetworkClient, subscriptions: SubscriptionState,
                 coordinator: CoordinatorLookup, membership: GroupMembership,
                 on_commit: Callable | None = None) -> None:
        assert config.group_id is not None
        self.config = config
        self.group_id = config.group_id
        self.network = network
        self.subscriptions = subscriptions
        self.coordinator = coordinator
        self.membership = membership
        self._lock = network.lock
        self._on_commit = on_commit
        self._next_auto_commit = time.monotonic() + config.auto_commit_interval_ms / 1000
        self._committed_cache: Offsets = {}
        self._async_callbacks: list[tuple[Callable, dict, BaseException | None]] = []
        self._offset_fetch: Future | None = None
        self._offset_fetch_parts: frozenset = frozenset()

    def consumed_offsets(self) -> Offsets:
        """What a commit of "everything consumed" sends: each assigned partition's position."""
        return {tp: OffsetAndMetadata(position, "", epoch)
                for tp, (position, epoch) in self.subscriptions.all_consumed().items()}

    # -- OffsetFetch ----------------------------------------------------------------------------

    def fetch_committed_offsets(self, deadline: float, drive) -> None:
        """Set positions of partitions awaiting their committed offset (non-blocking past the
        deadline: whatever is still missing is asked again on the next poll)."""
        waiting = [tp for tp, st in self.subscriptions.items() if st.awaiting_committed]
        if not waiting:
            return
        if not self.coordinator.ensure(deadline, drive):
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
            if isinstance(exc, BrokerError) and not exc.retriable and exc.code not in _ASK_AGAIN:
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
        member_id, member_epoch = self.membership.fetch_member() if self.subscriptions.has_subscription \
            else (None, -1)
        body = {"group_id": self.group_id, "topics": topics,
                "groups": [{"group_id": self.group_id, "member_id": member_id, "member_epoch": member_epoch,
                            "topics": topics}],
                "require_stable": self.config.read_committed}
        fut = self.coordinator.send(OFFSET_FETCH, body, max_version=_MAX_FETCH_VERSION)

        def done(value) -> None:
            version, resp = value
            if version >= 8:
                group = resp["groups"][0] if resp["groups"] else {"error_code": Errors.NONE, "topics": []}
                top_error, topics_resp = group["error_code"], group["topics"]
            else:
                top_error, topics_resp = resp.get("error_code", Errors.NONE), resp["topics"]
            if top_error:
                if top_error in COORDINATOR_ERRORS:
                    self.coordinator.mark_unknown(error_code(top_error).name)
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
        fut.add_errback(lambda exc: (self.coordinator.mark_unknown(str(exc))
                                     if isinstance(exc, ConnectionFailedError) else None, result.failure(exc)))
        return result

    def committed(self, partitions, deadline: float, drive) -> dict[TopicPartition, OffsetAndMetadata | None]:
        while True:
            if not self.coordinator.ensure(deadline, drive):
                raise KafkaTimeoutError(f"group {self.group_id}: coordinator not found in time")
            fut = self._send_offset_fetch(list(partitions))
            drive(max(0.0, deadline - time.monotonic()), lambda: fut.done)
            if not fut.done:
                raise KafkaTimeoutError(f"group {self.group_id}: committed offsets not fetched in time")
            if not fut.failed:
                return fut.value()
            exc = fut.exception
            retriable = getattr(exc, "retriable", False) or isinstance(exc, ConnectionFailedError) or \
                (isinstance(exc, BrokerError) and exc.code in _ASK_AGAIN)
            if not retriable or time.monotonic() >= deadline:
                raise exc
            drive(self.config.retry_backoff_ms / 1000, lambda: False)

    # -- OffsetCommit ---------------------------------------------------------------------------

    def _commit_body(self, offsets: Offsets, member: tuple[int, str, str | None] | None) -> dict:
        by_topic: dict[str, list] = {}
        for tp, om in offsets.items():
            by_topic.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "committed_offset": om.offset,
                "committed_leader_epoch": -1 if om.leader_epoch is None else om.leader_epoch,
                "committed_metadata": om.metadata or ""})
        generation, member_id, instance_id = member if member is not None else (-1, "", None)
        return {"group_id": self.group_id,
                "generation_id_or_member_epoch": generation,
                "member_id": member_id,
                "group_instance_id": instance_id,
                "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

    def _send_commit(self, offsets: Offsets) -> Future:
        result = Future()
        member = None
        if self.subscriptions.has_subscription:
            try:
                with self._lock:
                    member = self.membership.commit_member()
                    offsets = self.membership.committable(offsets)
            except (RebalanceInProgressError, CommitFailedError) as exc:
                return result.failure(exc)
            if not offsets:
                return result.success({})
        fut = self.coordinator.send(OFFSET_COMMIT, self._commit_body(offsets, member),
                                    max_version=_MAX_COMMIT_VERSION)

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
                if code in COORDINATOR_ERRORS:
                    self.coordinator.mark_unknown(err.name)
                    result.failure(err)
                elif code == Errors.REBALANCE_IN_PROGRESS:
                    self.membership.request_rejoin("commit saw a rebalance")
                    result.failure(RebalanceInProgressError(str(err)))
                elif code == Errors.STALE_MEMBER_EPOCH:
                    # KIP-848 only: a heartbeat now brings the current epoch, and commit_sync
                    # retries with it (a consumer-protocol member's request_rejoin is exactly that).
                    self.membership.request_rejoin("commit saw a stale member epoch")
                    result.failure(err)
                elif code in (Errors.UNKNOWN_MEMBER_ID, Errors.ILLEGAL_GENERATION, Errors.FENCED_MEMBER_EPOCH):
                    self.membership.reset_generation(f"commit says {err.name}")
                    result.failure(CommitFailedError(
                        f"{err}: the group rebalanced and this member's partitions may belong to another "
                        "member; the records since the last commit may be delivered again"))
                elif code == Errors.FENCED_INSTANCE_ID:
                    fenced = FencedInstanceIdError(str(err))
                    self.membership.fail(fenced)
                    result.failure(fenced)
                else:
                    result.failure(err)

        def failed(exc) -> None:
            if isinstance(exc, ConnectionFailedError):
                self.coordinator.mark_unknown(str(exc))
            result.failure(exc)

        fut.add_callback(done)
        fut.add_errback(failed)
        return result

    def _run_on_commit(self, offsets) -> None:
        if self._on_commit is None or not offsets:
            return
        try:
            self._on_commit(offsets)
        except Exception:
            log.exception("on_commit interceptor raised; the commit itself succeeded")

    def commit_sync(self, offsets: Offsets, deadline: float, drive) -> None:
        if not offsets:
            return
        backoff = Backoff(self.config.retry_backoff_ms / 1000, self.config.retry_backoff_max_ms / 1000)
        while True:
            self.membership.raise_if_fatal()
            if not self.coordinator.ensure(deadline, drive):
                raise KafkaTimeoutError(f"group {self.group_id}: commit timed out finding the coordinator")
            self.membership.confirm_before_commit(deadline, drive)
            fut = self._send_commit(offsets)
            drive(max(0.0, deadline - time.monotonic()), lambda: fut.done)
            if not fut.done:
                raise KafkaTimeoutError(f"group {self.group_id}: commit not acknowledged in time")
            if not fut.failed:
                self._run_on_commit(fut.value())
                return
            exc = fut.exception
            retriable = isinstance(exc, ConnectionFailedError) or \
                (isinstance(exc, BrokerError) and (exc.retriable or exc.code in COORDINATOR_ERRORS)) or \
                (isinstance(exc, BrokerError) and exc.code == Errors.STALE_MEMBER_EPOCH
                 and self.membership.generation > 0)
            if not retriable:
                raise exc
            delay = backoff.failure()
            if time.monotonic() + delay >= deadline:
                raise KafkaTimeoutError(f"group {self.group_id}: commit kept failing: {exc}")
            drive(delay, lambda: False)

    def commit_before_rebalance(self) -> None:
        """With auto-commit, what was consumed is committed before the member gives its
        partitions up (the membership calls this before a rejoin)."""
        if not self.config.enable_auto_commit:
            return
        positions = self.consumed_offsets()
        if positions:
            self.commit_sync(positions, time.monotonic() + self.config.default_api_timeout_ms / 1000,
                             self._drive_plain)

    def _drive_plain(self, timeout: float, until) -> None:
        self.network.poll(timeout, until=until)

    def commit_async(self, offsets: Offsets, callback=None) -> Future:
        if not offsets:
            return Future().success({})
        if not self.coordinator.known:
            with self._lock:
                self.coordinator.lookup()
            exc = ConnectionFailedError(f"group {self.group_id}: coordinator unknown; commit not sent")
            self._queue_async(callback, offsets, exc)
            return Future().failure(exc)
        fut = self._send_commit(offsets)
        fut.add_callback(lambda value: (self._run_on_commit(value), self._queue_async(callback, offsets, None)))
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

    def maybe_auto_commit(self) -> None:
        if not self.config.enable_auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        offsets = self.consumed_offsets()
        if not offsets:
            return
        offsets = {tp: om for tp, om in offsets.items() if self._committed_cache.get(tp) != om}
        if offsets:
            self.commit_async(offsets)
