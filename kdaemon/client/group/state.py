"""The group member's state machine.  Everything that moves a member between states is here.

Like h11's ``_state.py``: a table of (state, event) -> (state, rejoin) and an error for anything
not in it, so an impossible transition is a loud bug rather than a silently odd group member.

States follow the Java consumer's classic protocol; the consumer protocol of KIP-848 maps its
own onto them (UNJOINED also after a fence or a leave; PREPARING_REBALANCE while the joining
heartbeat is out; COMPLETING_REBALANCE while reconciling a target assignment).  Classic states: UNJOINED (no generation), PREPARING_REBALANCE (JoinGroup in
flight), COMPLETING_REBALANCE (SyncGroup in flight), STABLE (heartbeating with an assignment),
and FATAL (fenced by another static member with the same instance id, or refused for good:
never rejoins; every later poll and commit raises the error that made it so).

Two more facts move with the state and so live in the same table rather than beside it:

* ``need_rejoin``: a rebalance was asked for (the subscription changed, the coordinator said
  REBALANCE_IN_PROGRESS, a cooperative member gave partitions up) but the member may still be
  STABLE and keep fetching until it rejoins.  Each table entry says what the event does to it:
  set it, clear it, or leave it (``None``).
* ``fatal``: the error a FATAL member raises.  FATAL_ERROR is the only way in and carries it.

Events are applied under the network client's lock by whichever thread learnt of them (the
application thread for joins and commits, the heartbeat thread for heartbeat answers).
"""

from __future__ import annotations

from enum import Enum


class MemberState(Enum):
    UNJOINED = "unjoined"
    PREPARING_REBALANCE = "preparing_rebalance"
    COMPLETING_REBALANCE = "completing_rebalance"
    STABLE = "stable"
    FATAL = "fatal"


class MemberEvent(Enum):
    JOIN_SENT = "join_sent"            # a JoinGroup request went out
    JOIN_FAILED = "join_failed"        # JoinGroup error or disconnect
    JOINED = "joined"                  # JoinGroup answered: generation, leader, protocol
    SYNC_FAILED = "sync_failed"        # SyncGroup error or disconnect
    SYNCED = "synced"                  # SyncGroup answered with our assignment
    ASSIGNMENT_TAKEN = "assignment_taken"  # the application took the new assignment (listener run)
    REJOIN_REQUESTED = "rejoin_requested"  # a rebalance is wanted; the member rejoins on its next poll
    RESET = "reset"                    # generation lost (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
                                       # session expiry, poll interval exceeded, leave)
    FATAL_ERROR = "fatal_error"        # FENCED_INSTANCE_ID, or an error no retry mends (group
                                       # authorization, invalid group id or session timeout, ...)
    # KIP-848 (consumer_group.py): JOIN_SENT is the heartbeat with epoch 0, JOINED its answer;
    # the member then reconciles in COMPLETING_REBALANCE, fetching the partitions it keeps.
    TARGET_CHANGED = "target_changed"  # a heartbeat answer brought a new target assignment
    RECONCILED = "reconciled"          # the member owns its target and the listener ran


S, E = MemberState, MemberEvent
_LIVE = (S.UNJOINED, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE)

# (state, event) -> (next state, need_rejoin afterwards: True, False, or None for unchanged)
TRANSITIONS: dict[tuple[MemberState, MemberEvent], tuple[MemberState, bool | None]] = {
    (S.UNJOINED, E.JOIN_SENT): (S.PREPARING_REBALANCE, None),
    (S.STABLE, E.JOIN_SENT): (S.PREPARING_REBALANCE, None),   # a rejoin while keeping the generation
    (S.PREPARING_REBALANCE, E.JOINED): (S.COMPLETING_REBALANCE, None),
    (S.PREPARING_REBALANCE, E.JOIN_FAILED): (S.UNJOINED, None),
    (S.COMPLETING_REBALANCE, E.SYNCED): (S.STABLE, None),
    (S.COMPLETING_REBALANCE, E.SYNC_FAILED): (S.UNJOINED, None),
    # The rejoin is done once the application has the assignment, not at SyncGroup: until
    # then a poll must not think the member settled.
    (S.STABLE, E.ASSIGNMENT_TAKEN): (S.STABLE, False),
    # The generation was lost between SyncGroup and the application taking the assignment
    # (the heartbeat thread saw ILLEGAL_GENERATION): the member stays due to rejoin.
    (S.UNJOINED, E.ASSIGNMENT_TAKEN): (S.UNJOINED, None),
    # KIP-848: reconciling a new target; done when the member owns it (the listener ran).
    (S.STABLE, E.TARGET_CHANGED): (S.COMPLETING_REBALANCE, None),
    (S.COMPLETING_REBALANCE, E.TARGET_CHANGED): (S.COMPLETING_REBALANCE, None),
    (S.COMPLETING_REBALANCE, E.RECONCILED): (S.STABLE, False),
    **{(s, E.REJOIN_REQUESTED): (s, True) for s in _LIVE},
    **{(s, E.RESET): (S.UNJOINED, True) for s in _LIVE},
    **{(s, E.FATAL_ERROR): (S.FATAL, None) for s in _LIVE},
    # A FATAL member never rejoins.  What still arrives is absorbed: a second fatal answer (the
    # heartbeat's FENCED_INSTANCE_ID after the commit's), a rejoin request or a generation reset,
    # and answers to a join or sync sent before it became fatal.
    (S.FATAL, E.FATAL_ERROR): (S.FATAL, None),
    (S.FATAL, E.REJOIN_REQUESTED): (S.FATAL, None),
    (S.FATAL, E.RESET): (S.FATAL, None),
    (S.FATAL, E.ASSIGNMENT_TAKEN): (S.FATAL, None),
    (S.FATAL, E.JOINED): (S.FATAL, None),
    (S.FATAL, E.JOIN_FAILED): (S.FATAL, None),
    (S.FATAL, E.SYNCED): (S.FATAL, None),
    (S.FATAL, E.SYNC_FAILED): (S.FATAL, None),
    (S.FATAL, E.TARGET_CHANGED): (S.FATAL, None),
    (S.FATAL, E.RECONCILED): (S.FATAL, None),
}


class IllegalTransition(RuntimeError):
    pass


class MemberStateMachine:
    __slots__ = ("state", "need_rejoin", "fatal")

    def __init__(self) -> None:
        self.state = MemberState.UNJOINED
        self.need_rejoin = True          # a new member has yet to join
        self.fatal: BaseException | None = None

    def apply(self, event: MemberEvent, error: BaseException | None = None) -> MemberState:
        """Move on ``event``; FATAL_ERROR needs the ``error`` later calls will raise."""
        if (event is MemberEvent.FATAL_ERROR) != (error is not None):
            raise ValueError(f"{event.value}: an error goes with fatal_error and with nothing else")
        try:
            state, rejoin = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(f"group member cannot handle {event.value} in state {self.state.value}") from None
        self.state = state
        if rejoin is not None:
            self.need_rejoin = rejoin
        if error is not None:
            self.fatal = error
        return self.state

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    @property
    def stable(self) -> bool:
        """Joined and synced, holding its assignment, and no rebalance asked for."""
        return self.state is MemberState.STABLE and not self.need_rejoin

    def __repr__(self) -> str:
        flags = " need_rejoin" if self.need_rejoin else ""
        return f"<MemberStateMachine {self.state.value}{flags}>"
