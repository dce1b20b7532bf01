"""What a share member holds and what it has said about it: pure bookkeeping, every call given ``now``.

A record the broker hands out is *held* (acquired) by this member until its acquisition lock
runs out, ``acquisition_lock_timeout_ms`` after the broker acquired it.  The lock deadline is
counted here from when the ShareFetch was *sent*: the broker acquired the records after it
received the request, so the real deadline is never earlier than that; the estimate may expire a
record the broker still held for a moment, never the other way round.  Each held record is in
one of two places:

* ``delivered``: returned by the last ``poll``, awaiting the application's verdict (explicit
  mode) or the next poll (implicit mode: all ACCEPT);
* ``acked``: a verdict (ACCEPT, RELEASE, REJECT, RENEW, or GAP/ACCEPT decided by the consumer
  itself for an offset without a record, or a record the header filter dropped) waiting to go
  out with the next request to the node the record came from (share sessions are per node).

``take(node, now)`` hands a node's verdicts over for sending, except those whose lock ran out:
a verdict on a record this member no longer holds is never sent as if it held it (the broker
has given it back to the group, maybe to another member, whose verdict counts).  They come
back as ``expired``, to be reported as Java reports the broker's refusal of one
(INVALID_RECORD_STATE: ``InvalidRecordStateError`` in ``commit_sync``'s result and the
acknowledgement commit callback).  Verdicts the consumer made itself (gaps, filtered records)
that expire are dropped without a report: the application never saw those records.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from ..types import TopicPartition
from .types import AcknowledgeType, ShareRecord


@dataclass(slots=True)
class Held:
    """One record this member holds: where it came from and until when."""

    node: int
    topic_id: uuid.UUID
    deadline: float            # monotonic seconds; the lock is gone after it
    record: ShareRecord | None  # None for an offset the consumer settles itself


@dataclass(slots=True)
class Verdict:
    kind: int                  # an AcknowledgeType value, or GAP
    held: Held
    shown: bool                # the application saw the record (it is reported back)


@dataclass(frozen=True)
class Taken:
    """A node's verdicts ready to send, per partition, and what they settle."""

    acks: dict[TopicPartition, list[tuple[int, int]]]     # (offset, type), for the request
    topic_ids: dict[str, uuid.UUID]
    shown: dict[TopicPartition, set[int]]                  # offsets the application saw, to report
    renewing: dict[TopicPartition, dict[int, Held]]        # RENEWs: given back on success
    expired: dict[TopicPartition, set[int]]                # shown records whose lock ran out

    @property
    def renew(self) -> bool:
        return bool(self.renewing)


class InFlight:
    """The member's held records and pending verdicts (see the module docstring)."""

    def __init__(self) -> None:
        self.delivered: dict[TopicPartition, dict[int, Held]] = {}
        self.acked: dict[TopicPartition, dict[int, Verdict]] = {}

    # -- what the consumer hands out --------------------------------------------------------------

    def deliver(self, tp: TopicPartition, records: list[ShareRecord], node: int, topic_id: uuid.UUID,
                deadline: float) -> None:
        """``records`` of ``tp`` go to the application now."""
        held = self.delivered.setdefault(tp, {})
        for r in records:
            held[r.offset] = Held(node, topic_id, deadline, r)

    def settle(self, tp: TopicPartition, offsets: list[tuple[int, int]], node: int, topic_id: uuid.UUID,
               deadline: float) -> None:
        """Verdicts the consumer makes itself, on offsets the application never sees: GAP for an
        acquired offset without a record, ACCEPT for a record the header filter dropped, REJECT
        for a corrupt batch, RELEASE for records it could not read."""
        pending = self.acked.setdefault(tp, {})
        for offset, kind in offsets:
            pending[offset] = Verdict(kind, Held(node, topic_id, deadline, None), shown=False)

    # -- what the application says ------------------------------------------------------------------

    def acknowledge(self, tp: TopicPartition, offset: int, kind: AcknowledgeType) -> bool:
        """Record the application's verdict on a delivered record (a second verdict before it
        is sent replaces the first, as in Java); False if the record is not awaiting one."""
        held = self.delivered.get(tp, {}).pop(offset, None)
        if held is None:
            pending = self.acked.get(tp, {}).get(offset)
            if pending is None or not pending.shown:
                return False
            pending.kind = int(kind)
            return True
        self.acked.setdefault(tp, {})[offset] = Verdict(int(kind), held, shown=True)
        return True

    def acknowledge_all(self, kind: AcknowledgeType) -> None:
        """Every delivered record not acknowledged yet gets ``kind`` (implicit mode: ACCEPT)."""
        for tp, held in self.delivered.items():
            pending = self.acked.setdefault(tp, {})
            for offset, h in held.items():
                pending[offset] = Verdict(int(kind), h, shown=True)
        self.delivered = {}

    def unacknowledged(self) -> int:
        return sum(len(h) for h in self.delivered.values())

    def forget_delivered(self) -> list[tuple[TopicPartition, int]]:
        """Drop the delivered records without a verdict (close: the session's end releases them)."""
        out = [(tp, o) for tp, held in self.delivered.items() for o in held]
        self.delivered = {}
        return out

    # -- what goes out --------------------------------------------------------------------------

    def nodes(self) -> set[int]:
        """The nodes with verdicts waiting."""
        return {v.held.node for pending in self.acked.values() for v in pending.values()}

    def pending(self, node: int) -> bool:
        return any(v.held.node == node for pending in self.acked.values() for v in pending.values())

    def renewing(self, node: int) -> bool:
        """A RENEW waits for ``node`` (it goes in a ShareAcknowledge of its own kind)."""
        return any(v.held.node == node and v.kind == AcknowledgeType.RENEW
                   for pending in self.acked.values() for v in pending.values())

    def take(self, node: int, now: float, *, renew: bool = True) -> Taken:
        """Hand ``node``'s verdicts over for one request (see the module docstring); RENEWs
        only when ``renew`` (a ShareFetch does not carry them: they stay pending)."""
        acks: dict[TopicPartition, list[tuple[int, int]]] = {}
        ids: dict[str, uuid.UUID] = {}
        shown: dict[TopicPartition, set[int]] = {}
        renewing: dict[TopicPartition, dict[int, Held]] = {}
        expired: dict[TopicPartition, set[int]] = {}
        for tp, pending in list(self.acked.items()):
            for offset, v in list(pending.items()):
                if v.held.node != node or (not renew and v.kind == AcknowledgeType.RENEW):
                    continue
                del pending[offset]
                if now >= v.held.deadline:
                    if v.shown:
                        expired.setdefault(tp, set()).add(offset)
                    continue
                acks.setdefault(tp, []).append((offset, v.kind))
                ids[tp.topic] = v.held.topic_id
                if v.shown:
                    shown.setdefault(tp, set()).add(offset)
                if v.kind == AcknowledgeType.RENEW:
                    renewing.setdefault(tp, {})[offset] = v.held
            if not pending:
                del self.acked[tp]
        return Taken(acks, ids, shown, renewing, expired)

    def expire_all(self, now: float) -> dict[TopicPartition, set[int]]:
        """Drop every verdict whose lock ran out, whatever its node (a node that left the
        cluster, or that will not be asked again before close); the shown ones are returned for
        reporting."""
        expired: dict[TopicPartition, set[int]] = {}
        for tp, pending in list(self.acked.items()):
            for offset, v in list(pending.items()):
                if now >= v.held.deadline:
                    del pending[offset]
                    if v.shown:
                        expired.setdefault(tp, set()).add(offset)
            if not pending:
                del self.acked[tp]
        return expired
