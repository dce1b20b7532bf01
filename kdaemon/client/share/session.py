"""Share sessions (KIP-932), one per leader node, as a pure object: ``build_*`` then ``handled``.

A share session is like a fetch session (KIP-227) keyed by group and member instead of a session
id.  Its epoch is the whole protocol:

* **0 opens it**, with a ShareFetch that lists every partition to fetch (a ShareAcknowledge
  cannot open one: INVALID_SHARE_SESSION_EPOCH);
* **each later request** carries the next epoch, and only what changed: partitions added (or
  carrying acknowledgements) in ``topics``, partitions dropped in ``forgotten_topics_data``;
* **-1 closes it**, in a ShareAcknowledge that may carry the last acknowledgements; the broker
  then releases whatever this member still holds on that node.

As Java's ``ShareSessionHandler``, the epoch moves on when an answer comes, not when a request
goes: one request per session is in flight at a time, so they cannot overtake each other.  A
session error (SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH) or a lost connection
starts a new session at epoch 0 with the whole partition list; any other answer, error or not,
moves the epoch on by one.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from ...protocol.errors import Errors
from ..types import TopicPartition

INITIAL_EPOCH = 0
FINAL_EPOCH = -1
SESSION_ERRORS = frozenset({Errors.SHARE_SESSION_NOT_FOUND, Errors.INVALID_SHARE_SESSION_EPOCH})
MAX_EPOCH = 0x7FFFFFFF


@dataclass
class ShareRequest:
    """One request's session part: its epoch and the ``topics``/``forgotten_topics_data`` lists
    ready for the body; ``acknowledged`` is what its acknowledgements settle, per partition
    ((offset, type) pairs), for reading the answer."""

    epoch: int
    topics: list[dict]
    forgotten: list[dict]
    acknowledged: dict[TopicPartition, list[tuple[int, int]]] = field(default_factory=dict)


def acknowledgement_batches(acks: list[tuple[int, int]]) -> list[dict]:
    """(offset, type) pairs as AcknowledgementBatch entries: one per run of consecutive offsets,
    with one type for the run when every offset has the same, else one type per offset (the
    two forms the protocol allows)."""
    batches: list[dict] = []
    run: list[tuple[int, int]] = []
    for item in sorted(acks):
        if run and item[0] != run[-1][0] + 1:
            batches.append(_batch(run))
            run = []
        run.append(item)
    if run:
        batches.append(_batch(run))
    return batches


def _batch(run: list[tuple[int, int]]) -> dict:
    types = [t for _, t in run]
    return {"first_offset": run[0][0], "last_offset": run[-1][0],
            "acknowledge_types": types[:1] if len(set(types)) == 1 else types}


class ShareSession:
    """The share session with one node: its epoch and the partitions the broker has in it."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.epoch = INITIAL_EPOCH
        self.partitions: dict[TopicPartition, uuid.UUID] = {}

    @property
    def open(self) -> bool:
        return self.epoch > INITIAL_EPOCH

    def build_fetch(self, wanted: Mapping[TopicPartition, uuid.UUID],
                    acks: Mapping[TopicPartition, list[tuple[int, int]]], topic_ids: Mapping[str, uuid.UUID]
                    ) -> ShareRequest:
        """A ShareFetch of ``wanted`` (partition -> topic id) carrying ``acks``.  At epoch 0 every
        wanted partition is listed; later, only the new ones (a recreated topic counts as new,
        its old id forgotten) and those with acknowledgements."""
        added: set[TopicPartition] = set()
        forgotten: dict[TopicPartition, uuid.UUID] = {}
        if self.epoch == INITIAL_EPOCH:
            self.partitions = dict(wanted)
            added = set(wanted)
        else:
            for tp, tid in list(self.partitions.items()):
                if wanted.get(tp) != tid:
                    forgotten[tp] = tid
                    del self.partitions[tp]
            for tp, tid in wanted.items():
                if tp not in self.partitions:
                    self.partitions[tp] = tid
                    added.add(tp)
        listed = added | set(acks)
        ids = {**topic_ids, **{tp.topic: tid for tp, tid in self.partitions.items()}}
        return ShareRequest(self.epoch, _topics(listed, acks, ids), _forgotten(forgotten), dict(acks))

    def build_acknowledge(self, acks: Mapping[TopicPartition, list[tuple[int, int]]],
                          topic_ids: Mapping[str, uuid.UUID]) -> ShareRequest | None:
        """A ShareAcknowledge in the open session; None when none is open (it cannot open one:
        the acknowledgements wait for the next ShareFetch)."""
        if not self.open:
            return None
        ids = {**topic_ids, **{tp.topic: tid for tp, tid in self.partitions.items()}}
        return ShareRequest(self.epoch, _topics(set(acks), acks, ids), [], dict(acks))

    def build_close(self, acks: Mapping[TopicPartition, list[tuple[int, int]]],
                    topic_ids: Mapping[str, uuid.UUID]) -> ShareRequest | None:
        """The closing ShareAcknowledge (epoch -1) with the last acknowledgements; None when no
        session is open.  The session is forgotten here: nothing follows it."""
        if not self.open:
            return None
        ids = {**topic_ids, **{tp.topic: tid for tp, tid in self.partitions.items()}}
        request = ShareRequest(FINAL_EPOCH, _topics(set(acks), acks, ids), [], dict(acks))
        self.epoch = INITIAL_EPOCH
        self.partitions = {}
        return request

    def handled(self, error_code: int) -> bool:
        """The answer to the session's request came with this top-level error code.  False when
        the session is gone (a new one opens at epoch 0 with every partition)."""
        if error_code in SESSION_ERRORS:
            self.reset()
            return False
        self.epoch = self.epoch + 1 if self.epoch < MAX_EPOCH else 1
        return True

    def reset(self) -> None:
        """No answer (the connection dropped, the request timed out) or a session error: the
        broker may or may not have moved on, so the next request opens a new session."""
        self.epoch = INITIAL_EPOCH


def _topics(listed: set[TopicPartition], acks: Mapping[TopicPartition, list[tuple[int, int]]],
            ids: Mapping[str, uuid.UUID]) -> list[dict]:
    by_topic: dict[uuid.UUID, list[dict]] = {}
    for tp in sorted(listed):
        by_topic.setdefault(ids[tp.topic], []).append(
            {"partition_index": tp.partition, "acknowledgement_batches": acknowledgement_batches(acks.get(tp, []))})
    return [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()]


def _forgotten(forgotten: Mapping[TopicPartition, uuid.UUID]) -> list[dict]:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for tp, tid in sorted(forgotten.items()):
        by_topic.setdefault(tid, []).append(tp.partition)
    return [{"topic_id": tid, "partitions": ps} for tid, ps in by_topic.items()]
