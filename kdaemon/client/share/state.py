"""A share group member's state machine.  Everything that moves a member between states is here.

A share member has less to do than a consumer-group member (``group/state.py``): the broker
hands records out, so there is nothing to revoke, commit before a rebalance or acknowledge in
a heartbeat; an assignment only says which partitions to ShareFetch from.  Its states:

* UNJOINED: not a member: before the first join, after a fence, after a leave.
* JOINING: the heartbeat with member epoch 0 is out.
* STABLE: a member with an epoch, heartbeating; its assignment may be empty.
* FATAL: refused for good (authorization, a group of another type, the group full, a broker
  without share groups); every later call raises the error that made it so.

As in ``group/state.py`` (and h11's ``_state.py``): a table of (state, event) -> state, and an
error for anything not in it.  Events are applied under the network client's lock by the thread
that learnt of them.
"""

from __future__ import annotations

from enum import Enum


class ShareMemberState(Enum):
    UNJOINED = "unjoined"
    JOINING = "joining"
    STABLE = "stable"
    FATAL = "fatal"


class ShareMemberEvent(Enum):
    JOIN_SENT = "join_sent"        # a heartbeat with epoch 0 went out
    JOINED = "joined"              # its answer: an epoch, maybe an assignment
    JOIN_FAILED = "join_failed"    # its answer was an error, or none came
    FENCED = "fenced"              # FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID: rejoin at epoch 0
    LEFT = "left"                  # a heartbeat with epoch -1 went out (close, unsubscribe,
                                   # max_poll_interval_ms without a poll)
    FATAL_ERROR = "fatal_error"    # an error no retry mends


S, E = ShareMemberState, ShareMemberEvent
_LIVE = (S.UNJOINED, S.JOINING, S.STABLE)

TRANSITIONS: dict[tuple[ShareMemberState, ShareMemberEvent], ShareMemberState] = {
    (S.UNJOINED, E.JOIN_SENT): S.JOINING,
    (S.JOINING, E.JOINED): S.STABLE,
    (S.JOINING, E.JOIN_FAILED): S.UNJOINED,
    (S.JOINING, E.FENCED): S.UNJOINED,
    (S.STABLE, E.FENCED): S.UNJOINED,
    **{(s, E.LEFT): S.UNJOINED for s in _LIVE},
    **{(s, E.FATAL_ERROR): S.FATAL for s in _LIVE},
    # A FATAL member stays so; what still arrives (answers to heartbeats sent before) is absorbed.
    **{(S.FATAL, e): S.FATAL for e in ShareMemberEvent},
}


class IllegalShareTransition(RuntimeError):
    pass


class ShareMemberStateMachine:
    __slots__ = ("state", "fatal")

    def __init__(self) -> None:
        self.state = ShareMemberState.UNJOINED
        self.fatal: BaseException | None = None

    def apply(self, event: ShareMemberEvent, error: BaseException | None = None) -> ShareMemberState:
        """Move on ``event``; FATAL_ERROR needs the ``error`` later calls will raise."""
        if (event is ShareMemberEvent.FATAL_ERROR) != (error is not None):
            raise ValueError(f"{event.value}: an error goes with fatal_error and with nothing else")
        try:
            state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalShareTransition(
                f"share group member cannot handle {event.value} in state {self.state.value}") from None
        if error is not None and self.fatal is None:
            self.fatal = error
        self.state = state
        return state

    def raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def __repr__(self) -> str:
        return f"<ShareMemberStateMachine {self.state.value}>"
