"""The idempotent producer's bookkeeping without a broker: which sequence each attempt carries,
when the epoch may be bumped, and the state table (kdaemon/client/producer_state.py)."""

from __future__ import annotations

import pytest

from kdaemon.client.producer_state import (BUMP_PENDING, FAILED, MAX_EPOCH, NO_ID, READY, RESET_PENDING,
                                           IdempotenceState, IllegalTransition, OutgoingRecord)
from kdaemon.client.types import TopicPartition

A, B = TopicPartition("dlq", 0), TopicPartition("dlq", 1)


def rec(i: int, size: int = 10) -> OutgoingRecord:
    return OutgoingRecord(b"k%d" % i, b"v" * size, (("h", b"x"),), 1_700_000_000_000 + i)


def ready(pid: int = 7, epoch: int = 0, **kw) -> IdempotenceState:
    s = IdempotenceState(**kw)
    s.init_sent()
    s.initialized(pid, epoch)
    assert s.state == READY
    return s


def send(s: IdempotenceState, now: float = 0.0):
    out = s.sendable(now)
    for b in out:
        s.mark_sent(b)
    return out


def test_nothing_goes_out_without_a_producer_id():
    s = IdempotenceState()
    s.append(A, rec(0))
    assert s.state == NO_ID and s.sendable(0) == []
    s.init_sent()
    assert s.sendable(0) == []
    s.init_retry()
    assert s.state == NO_ID


def test_sequences_advance_per_partition_only_on_success():
    s = ready()
    for i in range(3):
        s.append(A, rec(i))
    s.append(B, rec(9))
    (a, b) = sorted(send(s), key=lambda x: x.tp.partition)
    assert (a.base_sequence, len(a.records), b.base_sequence) == (0, 3, 0)
    s.append(A, rec(3))   # a sent batch takes no more records: a new one waits behind it
    assert send(s) == []  # one batch in flight per partition
    s.acknowledged(a, 100)
    (a2,) = send(s)
    assert (a2.tp, a2.base_sequence, len(a2.records)) == (A, 3, 1)
    assert s.next_sequence(B) == 0
    s.acknowledged(b, 5)
    assert s.next_sequence(B) == 1


def test_a_retry_carries_the_same_sequence_and_records():
    s = ready()
    for i in range(4):
        s.append(A, rec(i))
    (first,) = send(s)
    s.retry(first, at=5.0, outcome_unknown=True)
    assert s.sendable(4.9) == []          # backoff
    s.append(A, rec(4))                   # never joins a batch already sent
    (again,) = send(s, 5.0)
    assert again is first and (again.base_sequence, len(again.records), again.attempts) == (0, 4, 2)
    s.acknowledged(again, 0)
    (nxt,) = send(s, 5.0)
    assert (nxt.base_sequence, len(nxt.records)) == (4, 1)


def test_lost_sequences_bump_the_epoch_once_nothing_is_unresolved():
    s = ready(epoch=3)
    s.append(A, rec(0))
    s.append(B, rec(1))
    a, b = sorted(send(s), key=lambda x: x.tp.partition)
    s.retry(b, at=0.0, outcome_unknown=True)     # B may be in the log
    s.sequence_lost(a)                            # A was refused: OUT_OF_ORDER_SEQUENCE_NUMBER
    assert s.state == BUMP_PENDING
    assert not s.maybe_bump()                     # B unresolved: no bump yet
    (only,) = send(s)                             # only the unresolved batch goes, with its old epoch
    assert only is b and (only.producer_epoch, only.base_sequence) == (3, 0)
    assert not s.maybe_bump()                     # in flight
    s.acknowledged(b, 10)
    assert s.maybe_bump() and s.state == READY and s.producer_epoch == 4
    (a2,) = send(s)
    assert a2 is a and (a2.producer_epoch, a2.base_sequence) == (4, 0)
    assert s.next_sequence(B) == 0                # every partition starts again under the new epoch


def test_a_refusal_before_append_does_not_resolve_an_unknown_outcome():
    s = ready()
    s.append(A, rec(0))
    (a,) = send(s)
    s.retry(a, at=0.0, outcome_unknown=True)      # connection lost
    (a,) = send(s)
    s.retry(a, at=0.0, outcome_unknown=False)     # NOT_LEADER_OR_FOLLOWER from the new leader
    assert a.unresolved
    s.append(B, rec(1))
    (b,) = [x for x in send(s) if x.tp == B]
    s.sequence_lost(b)
    assert not s.maybe_bump()                     # A's first attempt may still be in the log


def test_an_exhausted_epoch_or_a_refused_id_asks_for_a_new_id():
    s = ready(epoch=MAX_EPOCH)
    s.append(A, rec(0))
    (a,) = send(s)
    s.sequence_lost(a)
    assert s.maybe_bump() and s.state == NO_ID and s.producer_id == -1
    s.init_sent()
    s.initialized(8, 0)
    (a,) = send(s)
    s.id_lost(a)                                   # INVALID_PRODUCER_EPOCH
    assert s.state == RESET_PENDING
    assert s.maybe_bump() and s.state == NO_ID


def test_a_batch_too_large_is_split_unless_unresolved_or_single():
    s = ready()
    for i in range(5):
        s.append(A, rec(i))
    (a,) = send(s)
    assert s.split(a)
    (h1,) = send(s)
    assert (len(h1.records), h1.base_sequence) == (2, 0)
    s.acknowledged(h1, 0)
    (h2,) = send(s)
    assert (len(h2.records), h2.base_sequence) == (3, 2)
    s.retry(h2, at=0.0, outcome_unknown=True)
    (h2,) = send(s)
    assert not s.split(h2)                         # maybe written: its records must not move
    s.acknowledged(h2, 2)
    s.append(B, rec(9))
    (b,) = send(s)
    assert not s.split(b)


def test_batches_stay_under_the_size_bound():
    s = ready(batch_max_bytes=1024)
    for i in range(10):
        s.append(A, rec(i, size=400))
    sizes = []
    while s.unacknowledged():
        (b,) = send(s)
        sizes.append(len(b.records))
        s.acknowledged(b, 0)
    assert sum(sizes) == 10 and max(sizes) == 2   # 2 × (400 + overhead) ≤ 1024 < 3 × ...


def test_a_failure_is_final_and_transitions_outside_the_table_raise():
    s = ready()
    s.append(A, rec(0))
    (a,) = send(s)
    s.fail(RuntimeError("TOPIC_AUTHORIZATION_FAILED"), a)
    assert s.state == FAILED and s.sendable(0) == [] and s.unacknowledged() == 1
    with pytest.raises(IllegalTransition, match="INIT_DONE in state FAILED"):
        s.initialized(1, 0)
    with pytest.raises(IllegalTransition):
        IdempotenceState().apply("BUMPED")
