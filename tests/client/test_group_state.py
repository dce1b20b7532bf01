"""The group member's state table (kdaemon/client/group/state.py): the transitions a member
goes through, need_rejoin and the fatal error moving with them, and anything else raising."""

from __future__ import annotations

import pytest

from kdaemon.client.errors import FencedInstanceIdError, GroupError
from kdaemon.client.group.state import (TRANSITIONS, IllegalTransition, MemberEvent, MemberState,
                                        MemberStateMachine)

S, E = MemberState, MemberEvent


def machine_in(state: MemberState) -> MemberStateMachine:
    """A machine brought to ``state`` through legal events only."""
    m = MemberStateMachine()
    path = {S.UNJOINED: [], S.PREPARING_REBALANCE: [E.JOIN_SENT],
            S.COMPLETING_REBALANCE: [E.JOIN_SENT, E.JOINED],
            S.STABLE: [E.JOIN_SENT, E.JOINED, E.SYNCED, E.ASSIGNMENT_TAKEN]}
    if state is S.FATAL:
        m.apply(E.FATAL_ERROR, GroupError("refused"))
    else:
        for event in path[state]:
            m.apply(event)
    assert m.state is state
    return m


def test_a_join_makes_a_new_member_stable_and_clears_need_rejoin_only_when_the_assignment_is_taken():
    m = MemberStateMachine()
    assert (m.state, m.need_rejoin, m.stable) == (S.UNJOINED, True, False)
    assert m.apply(E.JOIN_SENT) is S.PREPARING_REBALANCE
    assert m.apply(E.JOINED) is S.COMPLETING_REBALANCE
    assert m.apply(E.SYNCED) is S.STABLE
    # Synced but the application has not run its listener yet: not settled.
    assert (m.need_rejoin, m.stable) == (True, False)
    m.apply(E.ASSIGNMENT_TAKEN)
    assert (m.state, m.need_rejoin, m.stable) == (S.STABLE, False, True)


def test_a_rejoin_request_keeps_a_stable_member_stable_but_no_longer_settled():
    m = machine_in(S.STABLE)
    assert m.apply(E.REJOIN_REQUESTED) is S.STABLE
    assert (m.need_rejoin, m.stable) == (True, False)
    assert m.apply(E.JOIN_SENT) is S.PREPARING_REBALANCE   # rejoining with the generation kept
    assert m.need_rejoin


@pytest.mark.parametrize("state", [S.UNJOINED, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE])
def test_reset_from_every_live_state_leaves_an_unjoined_member_due_to_rejoin(state):
    m = machine_in(state)
    assert m.apply(E.RESET) is S.UNJOINED
    assert m.need_rejoin and not m.stable


@pytest.mark.parametrize("state", [S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE])
def test_failed_join_or_sync_returns_to_unjoined(state):
    m = machine_in(state)
    event = E.JOIN_FAILED if state is S.PREPARING_REBALANCE else E.SYNC_FAILED
    assert m.apply(event) is S.UNJOINED
    assert m.need_rejoin


@pytest.mark.parametrize("state", [S.UNJOINED, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.STABLE])
def test_a_fatal_error_is_kept_and_raised_and_nothing_brings_the_member_back(state):
    m = machine_in(state)
    fenced = FencedInstanceIdError("instance id in use")
    assert m.apply(E.FATAL_ERROR, fenced) is S.FATAL
    with pytest.raises(FencedInstanceIdError):
        m.raise_if_fatal()
    # Late news is absorbed, and the member stays FATAL.
    for event in (E.REJOIN_REQUESTED, E.RESET, E.JOINED, E.SYNCED, E.JOIN_FAILED, E.SYNC_FAILED,
                  E.ASSIGNMENT_TAKEN):
        assert m.apply(event) is S.FATAL
    assert not m.stable
    with pytest.raises(IllegalTransition, match="join_sent in state fatal"):
        m.apply(E.JOIN_SENT)


def test_a_live_member_raises_nothing():
    machine_in(S.STABLE).raise_if_fatal()


@pytest.mark.parametrize("state, event", [
    (S.UNJOINED, E.JOINED), (S.UNJOINED, E.SYNCED), (S.UNJOINED, E.JOIN_FAILED),
    (S.PREPARING_REBALANCE, E.JOIN_SENT), (S.PREPARING_REBALANCE, E.SYNCED),
    (S.PREPARING_REBALANCE, E.ASSIGNMENT_TAKEN),
    (S.COMPLETING_REBALANCE, E.JOINED), (S.COMPLETING_REBALANCE, E.JOIN_SENT),
    (S.STABLE, E.SYNCED), (S.STABLE, E.JOINED), (S.STABLE, E.SYNC_FAILED),
])
def test_an_event_not_in_the_table_raises_and_changes_nothing(state, event):
    m = machine_in(state)
    before = (m.state, m.need_rejoin, m.fatal)
    assert (state, event) not in TRANSITIONS
    with pytest.raises(IllegalTransition, match=f"{event.value} in state {state.value}"):
        m.apply(event)
    assert (m.state, m.need_rejoin, m.fatal) == before


def test_the_error_goes_with_fatal_error_and_nothing_else():
    with pytest.raises(ValueError, match="fatal_error"):
        MemberStateMachine().apply(E.FATAL_ERROR)
    with pytest.raises(ValueError, match="reset"):
        MemberStateMachine().apply(E.RESET, GroupError("x"))
