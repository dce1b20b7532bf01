"""The idempotent producer's bookkeeping, pure: its id and epoch, each partition's next sequence
number, the batches not yet acknowledged, and the one table that moves the producer's state.

Everything that affects a transition lives in this file (h11's rule); ``producer.py`` does the
I/O and reports what came back.  The rules, and why:

* **One batch in flight per partition.**  A partition's batch is sent with the partition's next
  sequence number and stays at the head of its queue until a definitive answer; retries send
  the *same* records with the *same* producer id, epoch and base sequence, so a retry of a
  batch the broker already appended is recognised by the broker (answered as a duplicate:
  success with the first append's offset, or DUPLICATE_SEQUENCE_NUMBER) and never written
  twice.  With one in flight the next sequence advances only on success, so "the sequence to
  send with" is always the partition's next one; Java allows five in flight and has to
  re-sequence the others after a failure, which this avoids.
* **An attempt whose outcome is unknown leaves the batch *unresolved*.**  A dropped connection,
  a client-side timeout, REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND (the leader has
  appended; replication did not finish) may or may not have written it.  Only an answer about
  that very (id, epoch, sequence) resolves it: success, a duplicate, or the broker saying the
  sequence or the id is unknown to it (then it was not written).  A NOT_LEADER_OR_FOLLOWER
  answer to a later attempt does not: the earlier one may live on in the new leader's log.
* **OUT_OF_ORDER_SEQUENCE_NUMBER and UNKNOWN_PRODUCER_ID** (the broker lost our producer
  state, e.g. a truncated or expired log) mean the batch was *not* written; the sequences must
  start again at 0 under a new epoch (KIP-360).  The bump waits until nothing is in flight and
  no batch is unresolved anywhere (those are resent under the old epoch until they resolve):
  re-sending an unresolved batch under a new epoch could write it twice.  Java bumps an
  idempotent producer's epoch locally (Kafka hands a producer without a transactional id a
  new id whatever it sends, seen on 4.4), and asks for a new id once the epoch is exhausted;
  so do we.  INVALID_PRODUCER_EPOCH asks for a new id the same way.
* **A record a broker refuses for what it is** (larger than the topic takes, INVALID_RECORD:
  ``client/errors.REFUSALS`` says which codes) is split out of its batch, halving it until it
  is alone, and then dropped from the queue (``refuse``): it was not written, so it used no
  sequence number, and the partition's next batch goes out with the same one.  The producer
  goes on; its caller hears which records (``Producer.flush`` raises ``RecordsRefusedError``).
* **Anything else a broker refuses for good** (authorization, a missing topic, a setting)
  fails the producer: ``error`` says why, and every later flush raises it.  The records are not
  lost: the caller did not commit them and reads them again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .types import TopicPartition

NO_ID = "NO_ID"                 # no producer id: InitProducerId must be sent
INITIALIZING = "INITIALIZING"   # InitProducerId in flight
READY = "READY"                 # batches go out
BUMP_PENDING = "BUMP_PENDING"   # sequences lost: bump the epoch once nothing is in flight or unresolved
RESET_PENDING = "RESET_PENDING"  # the id is refused: a new one once nothing is in flight or unresolved
FAILED = "FAILED"               # a permanent error; ``error`` says which

INIT_SENT = "INIT_SENT"
INIT_DONE = "INIT_DONE"
INIT_RETRY = "INIT_RETRY"
SEQUENCE_LOST = "SEQUENCE_LOST"
ID_LOST = "ID_LOST"
BUMPED = "BUMPED"
RESET = "RESET"
FATAL = "FATAL"

_TRANSITIONS: dict[tuple[str, str], str] = {
    (NO_ID, INIT_SENT): INITIALIZING,
    (INITIALIZING, INIT_DONE): READY,
    (INITIALIZING, INIT_RETRY): NO_ID,
    (READY, SEQUENCE_LOST): BUMP_PENDING,
    (BUMP_PENDING, SEQUENCE_LOST): BUMP_PENDING,
    (RESET_PENDING, SEQUENCE_LOST): RESET_PENDING,
    (READY, ID_LOST): RESET_PENDING,
    (BUMP_PENDING, ID_LOST): RESET_PENDING,
    (RESET_PENDING, ID_LOST): RESET_PENDING,
    (BUMP_PENDING, BUMPED): READY,
    (BUMP_PENDING, RESET): NO_ID,     # the epoch is exhausted: a new id
    (RESET_PENDING, RESET): NO_ID,
    **{(state, FATAL): FAILED for state in (NO_ID, INITIALIZING, READY, BUMP_PENDING, RESET_PENDING, FAILED)},
}

MAX_EPOCH = 32767   # int16; the next bump needs a new producer id


class IllegalTransition(RuntimeError):
    """An event the producer's table has no entry for in its current state: a bug."""


@dataclass(frozen=True, slots=True)
class OutgoingRecord:
    """One record as the producer will write it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int
    tag: Any = field(default=None, compare=False)   # the caller's, handed back if it is refused

    def size(self) -> int:
        """An upper bound of its encoded size in a v2 batch (varints counted as 5 bytes)."""
        return 21 + len(self.key or b"") + len(self.value or b"") + sum(
            10 + len(k.encode("utf-8")) + len(v or b"") for k, v in self.headers)


@dataclass(eq=False)
class ProducerBatch:
    """Records for one partition, sent and retried as one unit."""

    tp: TopicPartition
    records: list[OutgoingRecord]
    size: int = 0                # sum of the records' size() bounds
    attempts: int = 0
    unresolved: bool = False     # an attempt may have been written: see the module docstring
    retry_at: float = 0.0
    base_offset: int = -1
    # What the last attempt was sent with.
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1


@dataclass
class IdempotenceState:
    batch_max_bytes: int = 512 * 1024
    state: str = NO_ID
    producer_id: int = -1
    producer_epoch: int = -1
    error: BaseException | None = None
    _next_seq: dict[TopicPartition, int] = field(default_factory=dict)
    _queues: dict[TopicPartition, deque[ProducerBatch]] = field(default_factory=dict)
    _in_flight: dict[TopicPartition, ProducerBatch] = field(default_factory=dict)

    # -- the table ------------------------------------------------------------------------------

    def apply(self, event: str) -> str:
        new = _TRANSITIONS.get((self.state, event))
        if new is None:
            raise IllegalTransition(f"idempotent producer: no transition for {event} in state {self.state}")
        self.state = new
        return new

    # -- records in -----------------------------------------------------------------------------

    def append(self, tp: TopicPartition, record: OutgoingRecord) -> None:
        """Queue a record; it joins the partition's last batch if that was never sent and has room."""
        queue = self._queues.setdefault(tp, deque())
        last = queue[-1] if queue else None
        size = record.size()
        if last is not None and last.attempts == 0 and last is not self._in_flight.get(tp) and \
                last.size + size <= self.batch_max_bytes:
            last.records.append(record)
            last.size += size
        else:
            queue.append(ProducerBatch(tp, [record], size))

    # -- what goes out --------------------------------------------------------------------------

    def sendable(self, now: float) -> list[ProducerBatch]:
        """The head batch of every partition that may be sent now.  While READY, any; while a
        bump or a new id waits, only unresolved batches (to learn whether they were written)."""
        if self.state not in (READY, BUMP_PENDING, RESET_PENDING):
            return []
        out = []
        for tp, queue in self._queues.items():
            if not queue or tp in self._in_flight:
                continue
            head = queue[0]
            if head.retry_at > now:
                continue
            if self.state != READY and not head.unresolved:
                continue
            out.append(head)
        return out

    def sequence_for(self, batch: ProducerBatch) -> tuple[int, int, int]:
        """(producer id, epoch, base sequence) to send ``batch`` with: an unresolved batch
        keeps what its earlier attempts carried."""
        if batch.unresolved:
            return batch.producer_id, batch.producer_epoch, batch.base_sequence
        return self.producer_id, self.producer_epoch, self._next_seq.get(batch.tp, 0)

    def mark_sent(self, batch: ProducerBatch) -> None:
        batch.producer_id, batch.producer_epoch, batch.base_sequence = self.sequence_for(batch)
        batch.attempts += 1
        self._in_flight[batch.tp] = batch

    # -- answers --------------------------------------------------------------------------------

    def acknowledged(self, batch: ProducerBatch, base_offset: int) -> None:
        """Written (or recognised as a duplicate of what was written)."""
        self._take_back(batch)
        queue = self._queues[batch.tp]
        assert queue[0] is batch
        queue.popleft()
        if not queue:
            del self._queues[batch.tp]
        batch.base_offset = base_offset
        batch.unresolved = False
        if batch.producer_id == self.producer_id and batch.producer_epoch == self.producer_epoch:
            self._next_seq[batch.tp] = batch.base_sequence + len(batch.records)

    def retry(self, batch: ProducerBatch, at: float, *, outcome_unknown: bool) -> None:
        """Not written this time (or maybe written: ``outcome_unknown``); send it again at ``at``."""
        self._take_back(batch)
        batch.unresolved = batch.unresolved or outcome_unknown
        batch.retry_at = at

    def sequence_lost(self, batch: ProducerBatch) -> None:
        """OUT_OF_ORDER_SEQUENCE_NUMBER / UNKNOWN_PRODUCER_ID: not written; bump the epoch."""
        self._take_back(batch)
        batch.unresolved = False
        if self.state != FAILED:
            self.apply(SEQUENCE_LOST)

    def id_lost(self, batch: ProducerBatch) -> None:
        """INVALID_PRODUCER_EPOCH: not written; get a new producer id."""
        self._take_back(batch)
        batch.unresolved = False
        if self.state != FAILED:
            self.apply(ID_LOST)

    def split(self, batch: ProducerBatch) -> bool:
        """MESSAGE_TOO_LARGE / RECORD_LIST_TOO_LARGE: the batch was refused whole (not written);
        send its halves instead.  False for a single record, which cannot be split."""
        self._take_back(batch)
        if len(batch.records) < 2 or batch.unresolved:
            return False   # an earlier attempt may be in the log: its records must not move
        queue = self._queues[batch.tp]
        assert queue[0] is batch
        half = len(batch.records) // 2
        queue.popleft()
        for part in (batch.records[half:], batch.records[:half]):
            queue.appendleft(ProducerBatch(batch.tp, part, sum(r.size() for r in part)))
        return True

    def refuse(self, batch: ProducerBatch) -> list[OutgoingRecord]:
        """The broker refused ``batch`` (one record, never possibly written) for what it is: drop
        it.  Its sequence numbers were not used, so the partition's next batch takes them."""
        self._take_back(batch)
        queue = self._queues[batch.tp]
        assert queue[0] is batch and not batch.unresolved
        queue.popleft()
        if not queue:
            del self._queues[batch.tp]
        return batch.records

    def fail(self, error: BaseException, batch: ProducerBatch | None = None) -> None:
        if batch is not None:
            self._take_back(batch)
        if self.error is None:
            self.error = error
        self.apply(FATAL)

    def _take_back(self, batch: ProducerBatch) -> None:
        if self._in_flight.get(batch.tp) is batch:
            del self._in_flight[batch.tp]

    # -- the producer id ------------------------------------------------------------------------

    def init_sent(self) -> None:
        self.apply(INIT_SENT)

    def init_retry(self) -> None:
        self.apply(INIT_RETRY)

    def initialized(self, producer_id: int, producer_epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self._restart_sequences()
        self.apply(INIT_DONE)

    def maybe_bump(self) -> bool:
        """Bump the epoch (or drop the id) if one is due and nothing is in flight or unresolved.
        True if the producer changed its epoch or needs a new id now."""
        if self.state not in (BUMP_PENDING, RESET_PENDING) or self._in_flight or any(
                q[0].unresolved for q in self._queues.values() if q):
            return False
        if self.state == RESET_PENDING or self.producer_epoch >= MAX_EPOCH:
            self.producer_id, self.producer_epoch = -1, -1
            self._restart_sequences()
            self.apply(RESET)
        else:
            self.producer_epoch += 1
            self._restart_sequences()
            self.apply(BUMPED)
        return True

    def _restart_sequences(self) -> None:
        self._next_seq.clear()

    # -- questions ------------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def unacknowledged(self) -> int:
        """Records written to the producer and not yet acknowledged by a broker."""
        return sum(len(b.records) for q in self._queues.values() for b in q)

    def next_retry(self) -> float | None:
        """The earliest time a waiting batch may be sent again (None: none waits)."""
        times = [q[0].retry_at for tp, q in self._queues.items() if q and tp not in self._in_flight]
        return min(times) if times else None

    def next_sequence(self, tp: TopicPartition) -> int:
        return self._next_seq.get(tp, 0)

    def describe(self) -> dict[str, Any]:
        return {"state": self.state, "producer_id": self.producer_id, "epoch": self.producer_epoch,
                "unacknowledged": self.unacknowledged(), "in_flight": self.in_flight}
