"""The consumer's group: the owner that wires membership, commits and coordinator discovery.

Each responsibility has its own module (as kafka-python splits ``coordinator/base.py``,
``coordinator/consumer.py`` and ``heartbeat.py``):

* ``discovery.py``  — FindCoordinator, the coordinator's connection;
* ``membership.py`` — what a membership protocol provides (the seam for KIP-848);
* ``classic.py``    — the classic protocol: JoinGroup/SyncGroup/Heartbeat/LeaveGroup;
* ``consumer_group.py`` — the consumer protocol of KIP-848 (ConsumerGroupHeartbeat), with its
  pure parts ``consumer_heartbeat.py`` (requests, timer) and ``reconcile.py``;
* ``heartbeat.py``  — the pure heartbeat timer and the thread that drives it;
* ``state.py``      — the member's state table (state, need_rejoin, fatal error);
* ``commits.py``    — OffsetCommit (sync, async, auto-commit) and OffsetFetch.

``GroupCoordinator`` builds them, connects their callbacks, and orders what involves several
(closing: stop heartbeats, final commit, revoke, leave).  The consumer calls ``membership`` and
``commits`` directly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..config import ConsumerConfig
from ..metadata import ClusterMetadata
from ..network import NetworkClient
from ..subscription import SubscriptionState
from ..types import GroupMembershipOperation
from .classic import ClassicMembership
from .commits import OffsetCommits
from .consumer_group import ConsumerMembership
from .discovery import CoordinatorLookup
from .membership import GroupMembership, InvokeListener, RebalanceListener

log = logging.getLogger(__name__)

__all__ = ["GroupCoordinator", "RebalanceListener"]


class GroupCoordinator:
    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState, on_commit: Callable | None = None) -> None:
        assert config.group_id is not None
        self.config = config
        self.group_id = config.group_id
        self.subscriptions = subscriptions
        self.listener = None   # the application's rebalance listener, set by subscribe()
        self.coordinator = CoordinatorLookup(
            config, network, metadata,
            on_found=lambda: self.membership.coordinator_found(time.monotonic()),
            on_fatal=lambda error: self.membership.fail(error),
            raise_if_fatal=lambda: self.membership.raise_if_fatal())
        # The one place the membership protocol is chosen (Java's group.protocol).
        protocol = ConsumerMembership if config.group_protocol == "consumer" else ClassicMembership
        self.membership: GroupMembership = protocol(
            config, network, metadata, subscriptions, self.coordinator,
            before_rebalance=lambda: self.commits.commit_before_rebalance())
        self.commits = OffsetCommits(config, network, subscriptions, self.coordinator, self.membership,
                                     on_commit)

    def close(self, deadline: float, drive, invoke_listener: InvokeListener,
              operation: GroupMembershipOperation = GroupMembershipOperation.DEFAULT) -> None:
        """Stop heartbeating, commit what was consumed (auto-commit), run
        ``on_partitions_revoked`` and leave the group as ``operation`` says, waiting for the
        leave's answer until ``deadline`` (5 s at most)."""
        membership = self.membership
        membership.close()
        try:
            if self.config.enable_auto_commit and membership.generation >= 0 and self.coordinator.known:
                self.commits.commit_sync(self.commits.consumed_offsets(), deadline, drive)
        except Exception as exc:
            log.warning("group %s: final commit failed: %s", self.group_id, exc)
        owned = set(self.subscriptions.assigned())
        if owned and self.subscriptions.has_subscription:
            try:
                invoke_listener("on_partitions_revoked", owned)
            except Exception:
                log.exception("on_partitions_revoked raised during close")
        if operation is GroupMembershipOperation.REMAIN_IN_GROUP:
            log.info("group %s: closing without leaving; the coordinator drops this member when its "
                     "session times out", self.group_id)
            return
        fut = membership.leave("the consumer is being closed", partitions_lost=False,
                               for_good=operation is GroupMembershipOperation.LEAVE_GROUP)
        if fut is not None:
            drive(max(0.0, min(deadline - time.monotonic(), 5.0)), lambda: fut.done)
