"""The group member's state machine.  Everything that moves a member between states is here.

Like h11's ``_state.py``: a table of (state, event) -> state and an error for anything not in
it, so an impossible transition is a loud bug rather than a silently odd group member.

States follow the Java consumer: UNJOINED (no generation), PREPARING_REBALANCE (JoinGroup in
flight), COMPLETING_REBALANCE (SyncGroup in flight), STABLE (heartbeating with an assignment),
and FATAL (fenced by another static member with the same instance id: never rejoins).
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
    RESET = "reset"                    # generation lost (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION,
                                       # session expiry, poll interval exceeded, leave)
    FENCED = "fenced"                  # FENCED_INSTANCE_ID


S, E = MemberState, MemberEvent

TRANSITIONS: dict[tuple[MemberState, MemberEvent], MemberState] = {
    (S.UNJOINED, E.JOIN_SENT): S.PREPARING_REBALANCE,
    (S.STABLE, E.JOIN_SENT): S.PREPARING_REBALANCE,       # a rejoin while keeping the generation
    (S.PREPARING_REBALANCE, E.JOINED): S.COMPLETING_REBALANCE,
    (S.PREPARING_REBALANCE, E.JOIN_FAILED): S.UNJOINED,
    (S.COMPLETING_REBALANCE, E.SYNCED): S.STABLE,
    (S.COMPLETING_REBALANCE, E.SYNC_FAILED): S.UNJOINED,
    (S.UNJOINED, E.RESET): S.UNJOINED,
    (S.PREPARING_REBALANCE, E.RESET): S.UNJOINED,
    (S.COMPLETING_REBALANCE, E.RESET): S.UNJOINED,
    (S.STABLE, E.RESET): S.UNJOINED,
    (S.UNJOINED, E.FENCED): S.FATAL,
    (S.PREPARING_REBALANCE, E.FENCED): S.FATAL,
    (S.COMPLETING_REBALANCE, E.FENCED): S.FATAL,
    (S.STABLE, E.FENCED): S.FATAL,
}


class IllegalTransition(RuntimeError):
    pass


class MemberStateMachine:
    __slots__ = ("state",)

    def __init__(self) -> None:
        self.state = MemberState.UNJOINED

    def apply(self, event: MemberEvent) -> MemberState:
        try:
            self.state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(f"group member cannot handle {event.value} in state {self.state.value}") from None
        return self.state

    def __repr__(self) -> str:
        return f"<MemberStateMachine {self.state.value}>"
