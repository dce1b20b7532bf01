"""What a group membership protocol provides: the seam where a second protocol plugs in.

Two protocols provide it: the *classic* one (``classic.py``: JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, with the assignment computed by the leader member) and KIP-848's
*consumer* protocol (``consumer_group.py``: one ConsumerGroupHeartbeat request, see
``kdaemon/protocol/apis/consumer_group_heartbeat.py``; the broker assigns, and a member's
epoch replaces the generation).  ``GroupCoordinator`` chooses one from the configuration
(``group_protocol``, Java's ``group.protocol``); nothing above ``GroupCoordinator`` changes.

What a membership must provide, and what it may rely on:

* It owns the member's identity and state: ``state`` (a ``MemberStateMachine``, whose table
  names every state and event; a second protocol maps its own onto them, e.g. KIP-848's
  "reconciling" onto COMPLETING_REBALANCE, FENCED_MEMBER_EPOCH onto RESET),
  ``member_id``, ``generation`` (the member epoch under KIP-848), ``leader_id`` (None where no
  member leads), ``protocol_name`` and ``rebalances``.
* ``ensure_active(deadline, drive, invoke_listener)`` is called on every ``poll()`` of a
  subscribed consumer, in the application thread: it joins or rejoins until STABLE or the
  deadline, runs the rebalance listener through ``invoke_listener(name, partitions)`` (names
  ``on_partitions_revoked``, ``on_partitions_assigned``, ``on_partitions_lost``) and moves the
  assignment into the ``SubscriptionState`` (``set_group_assignment``), marking newly assigned
  partitions ``awaiting_committed`` so the commits module fetches their offsets.  It returns
  True when the member holds a settled assignment.  It raises the fatal error once FATAL.
* ``coordinator_found(now)``: a coordinator was found (again); session clocks restart there.
* ``poll(now)``: the application polled (the max-poll-interval clock restarts; a member that
  left because it had not polled for too long rejoins).
* ``request_rejoin(reason)``, ``reset_generation(reason)`` and ``fail(error)``: what the commits
  module reports from OffsetCommit answers (REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID or
  ILLEGAL_GENERATION / FENCED_MEMBER_EPOCH, FENCED_INSTANCE_ID).
* ``leave(reason, partitions_lost=..., for_good=...)`` sends the protocol's leave (LeaveGroup; a
  ConsumerGroupHeartbeat with epoch -1 under KIP-848) and forgets the generation.  A static
  member sends none (classic) or epoch -2 (KIP-848) so that it can come back, unless
  ``for_good``: then it leaves as a dynamic member does, naming its instance id; ``close()``
  stops whatever background work it runs (the heartbeat thread).
* ``subscribed_topics()`` says what the member subscribes to (patterns resolved).
* ``commit_member()`` is the identity an OffsetCommit carries — (generation or member epoch,
  member id, instance id) — or raises ``RebalanceInProgressError``/``CommitFailedError`` when
  the member may not commit now; ``fetch_member()`` the (member id, member epoch) an
  OffsetFetch carries ((None, -1) under the classic protocol); ``committable(offsets)`` drops
  what the member must not commit (KIP-848: partitions it no longer owns).
* ``needs_attention``: the application's ``poll`` should come back to ``ensure_active`` now (a
  rebalance to join, a target assignment to reconcile, lost partitions to report).
* ``last_answer()``, ``heartbeat_interval()`` and ``heartbeat_now()``: when the coordinator
  last proved the membership, how often it should, and "ask it now".  With them the base class's
  ``confirm_before_commit`` keeps a member whose process was stopped (SIGSTOP, a VM pause, a
  long GC-like stall) from sending a commit the coordinator may have to refuse: it asks first.
* ``heartbeat_soon()`` (here, for both): the owner was told that the group changed (kdaemon's
  supervisor relays one worker's join or new assignment to the others); the next heartbeat goes
  out at once.  Each protocol's heartbeat turn takes the request (``_take_poke``).

It may rely on: the ``CoordinatorLookup`` it is given (``ensure``, ``send``, ``mark_unknown``), the
network client's lock being held while response callbacks run, and ``before_rebalance``, a
callback the owner gives it to run before the member gives partitions up (the auto-commit).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..future import Future
from ..types import TopicPartition
from .heartbeat import HeartbeatThread
from .state import MemberState, MemberStateMachine

if TYPE_CHECKING:
    from ..config import ConsumerConfig
    from ..metadata import ClusterMetadata
    from ..network import NetworkClient
    from ..subscription import SubscriptionState
    from .discovery import CoordinatorLookup

log = logging.getLogger("kdaemon.client.group.coordinator")

# Heartbeat intervals without an answer after which a member asks before committing.
STALE_AFTER_INTERVALS = 2

# invoke_listener(name, partitions): runs one rebalance-listener callback in the application thread.
InvokeListener = Callable[[str, set[TopicPartition]], None]


@dataclass
class RebalanceListener:
    """Callbacks run in the application thread during ``poll``, as in Java."""

    on_partitions_revoked: Callable[[set[TopicPartition]], None] | None = None
    on_partitions_assigned: Callable[[set[TopicPartition]], None] | None = None
    on_partitions_lost: Callable[[set[TopicPartition]], None] | None = None


class GroupMembership(ABC):
    """One group member under one membership protocol (see the module docstring)."""

    protocol_name: str                # "classic"; "consumer" for KIP-848
    state: MemberStateMachine
    member_id: str                    # "" before the first join
    generation: int                   # -1 when not a member (the member epoch under KIP-848)
    leader_id: str | None
    instance_id: str | None           # group.instance.id of a static member
    rebalances: int                   # completed rebalances
    # The states in which heartbeats go out (classic: only a STABLE member heartbeats; a
    # rejoining one waits for its JoinGroup/SyncGroup answers instead).
    heartbeat_states: frozenset[MemberState] = frozenset({MemberState.STABLE})

    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState, coordinator: CoordinatorLookup,
                 before_rebalance: Callable[[], None]) -> None:
        """What every protocol is given and keeps (see "It may rely on" above); the protocol
        sets its own identity (member id, generation or epoch) after calling this."""
        assert config.group_id is not None
        self.config = config
        self.group_id = config.group_id
        self.instance_id = config.group_instance_id
        self.network = network
        self.metadata = metadata
        self.subscriptions = subscriptions
        self.coordinator = coordinator
        self._before_rebalance = before_rebalance
        self._lock = network.lock
        self.state = MemberStateMachine()
        self.rebalances = 0
        # Partitions found lost (a fence) by the heartbeat thread, for the application thread
        # to hand to on_partitions_lost in its next poll.
        self._pending_lost: set[TopicPartition] | None = None
        # heartbeat_soon() was called and its heartbeat has not gone out yet (read and cleared
        # by the heartbeat turn under the lock; set without it, from a signal handler).
        self._poked = False
        self._heartbeat_thread: HeartbeatThread | None = None   # each protocol starts its own

    @property
    def member_state(self) -> MemberState:
        return self.state.state

    @property
    def need_rejoin(self) -> bool:
        return self.state.need_rejoin

    @property
    def stable(self) -> bool:
        """Joined, holding its assignment, and no rebalance pending."""
        return self.state.stable

    def raise_if_fatal(self) -> None:
        self.state.raise_if_fatal()

    @property
    def needs_attention(self) -> bool:
        return self.state.need_rejoin

    @abstractmethod
    def commit_member(self) -> tuple[int, str, str | None]: ...

    @abstractmethod
    def last_answer(self) -> float: ...

    @abstractmethod
    def heartbeat_interval(self) -> float: ...

    @abstractmethod
    def heartbeat_now(self) -> None: ...

    def heartbeat_soon(self) -> None:
        """Heartbeat now rather than at the next interval: something changed in the group that
        this member hears of only in a heartbeat's answer (under KIP-848 its new target, once
        another member joined or released partitions; under the classic protocol a rebalance).
        Java's consumer heartbeats at once only on its own news (a join, an acknowledgement);
        kdaemon's supervisor sees its other workers' news and relays it with this.

        Safe from a signal handler and from any thread: it sets a flag and wakes the heartbeat
        thread, taking no lock (a handler interrupting the thread that holds the group's lock
        would wait for itself).  The heartbeat thread sends the heartbeat at its next tick, or,
        when one is in flight (a join included), right after that one's answer, which may predate
        the change.  Any heartbeat sent after the request answers it (an acknowledgement, say); a
        member that is not one (before its join, after a fence or a leave) drops it: its join is
        newer."""
        self._poked = True
        thread = self._heartbeat_thread
        if thread is not None:
            thread.wake()

    def _take_poke(self) -> bool:
        """Under the lock, in the heartbeat turn: was a heartbeat asked for and none sent since?
        The protocol clears the flag when it sends one; here it is dropped for a member that is
        not one (its next join is newer than the request)."""
        if self.state.state in (MemberState.UNJOINED, MemberState.FATAL):
            self._poked = False
        return self._poked

    def confirm_before_commit(self, deadline: float, drive) -> None:
        """Before a commit: if no heartbeat answer came for ``STALE_AFTER_INTERVALS`` heartbeat
        intervals, the coordinator may have fenced this member meanwhile (the process was
        stopped past the session timeout and its partitions moved on).  Ask with a heartbeat
        and wait for the answer (at most ``request_timeout_ms``, within ``deadline``): if it
        fences the member, its partitions are lost and ``commit_member`` refuses, so the stale
        positions are never sent.  The broker would refuse that commit too, but a commit that
        goes out after the member's partitions moved is one that a broker bug, or a generation
        that happens to match, could let through; Java's classic consumer likewise takes an
        expired session as a lost coordinator before anything else."""
        now = time.monotonic()
        with self._lock:
            last = self.last_answer()
            if self.generation <= 0 or self.state.state not in self.heartbeat_states \
                    or now - last <= STALE_AFTER_INTERVALS * self.heartbeat_interval():
                return
            self.heartbeat_now()
        log.info("group %s: no heartbeat answer for %.1f s (was the process stopped?); asking the "
                 "coordinator before committing", self.group_id, now - last)
        wait = max(0.0, min(deadline - now, self.config.request_timeout_ms / 1000))
        drive(wait, lambda: self.last_answer() > last or self.generation <= 0 or self.state.fatal)

    def fetch_member(self) -> tuple[str | None, int]:
        return None, -1

    def committable(self, offsets: dict) -> dict:
        return offsets

    @abstractmethod
    def subscribed_topics(self) -> set[str]: ...

    @abstractmethod
    def ensure_active(self, deadline: float, drive, invoke_listener: InvokeListener) -> bool: ...

    @abstractmethod
    def coordinator_found(self, now: float) -> None: ...

    @abstractmethod
    def poll(self, now: float) -> None: ...

    @abstractmethod
    def request_rejoin(self, reason: str) -> None: ...

    @abstractmethod
    def reset_generation(self, reason: str) -> None: ...

    @abstractmethod
    def fail(self, error: BaseException) -> None: ...

    @abstractmethod
    def leave(self, reason: str, *, partitions_lost: bool = True, for_good: bool = False) -> Future | None: ...

    @abstractmethod
    def close(self) -> None: ...
