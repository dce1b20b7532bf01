"""Fetch sessions (KIP-227), one per broker, as a pure object: ``build`` then ``handle_response``.

A full fetch lists every partition and asks the broker to open a session (id 0, epoch 0).  Once
the broker answers with a session id, each later request is *incremental*: it carries only the
partitions whose fetch parameters changed (or that are new) and ``forgotten`` entries for those
no longer wanted, and the broker answers only for partitions with something to say.  That is
what keeps a steady-state request with a thousand assigned partitions a few dozen bytes.

Any session error (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH,
FETCH_SESSION_TOPIC_ID_ERROR), a failed request, or a change between topic names and topic ids
drops back to a full fetch.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from .types import TopicPartition

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1


@dataclass(frozen=True, slots=True)
class PartitionFetch:
    """What we ask for one partition.  Equality decides whether an incremental request resends it."""

    topic_id: uuid.UUID
    fetch_offset: int
    log_start_offset: int
    max_bytes: int
    current_leader_epoch: int
    last_fetched_epoch: int


@dataclass(slots=True)
class FetchRequestData:
    session_id: int
    epoch: int
    to_send: dict[TopicPartition, PartitionFetch]
    to_forget: list[TopicPartition]
    full: bool
    # Everything the session covers after this request: responses are matched against it.
    session_partitions: dict[TopicPartition, PartitionFetch]
    # The topic id the session knows each forgotten partition by: for a recreated topic that is
    # the old id, and forgetting it by the new one would drop the partition just re-added.
    forgotten_topic_ids: dict[TopicPartition, uuid.UUID] = field(default_factory=dict)


@dataclass
class FetchSessionHandler:
    node_id: int
    session_id: int = INVALID_SESSION_ID
    epoch: int = INITIAL_EPOCH
    uses_topic_ids: bool | None = None
    partitions: dict[TopicPartition, PartitionFetch] = field(default_factory=dict)

    def build(self, wanted: dict[TopicPartition, PartitionFetch], uses_topic_ids: bool) -> FetchRequestData:
        if self.uses_topic_ids is not None and uses_topic_ids != self.uses_topic_ids:
            self.reset()
        if self.session_id == INVALID_SESSION_ID or self.epoch == INITIAL_EPOCH:
            # Full request: opens (or reopens) a session.
            self.session_id = INVALID_SESSION_ID
            self.epoch = INITIAL_EPOCH
            self.uses_topic_ids = uses_topic_ids
            return FetchRequestData(INVALID_SESSION_ID, INITIAL_EPOCH, dict(wanted), [], True, dict(wanted))
        to_send = {}
        to_forget = []
        for tp, data in wanted.items():
            old = self.partitions.get(tp)
            if old is None or old != data:
                if old is not None and old.topic_id != data.topic_id and uses_topic_ids:
                    # The topic was recreated: replace, don't update.  Only a session keyed by
                    # topic id can tell the two apart; by name, forgetting would drop the update.
                    to_forget.append(tp)
                to_send[tp] = data
        for tp in self.partitions:
            if tp not in wanted:
                to_forget.append(tp)
        forgotten_ids = {tp: self.partitions[tp].topic_id for tp in to_forget}
        return FetchRequestData(self.session_id, self.epoch, to_send, to_forget, False, dict(wanted),
                                forgotten_ids)

    def handle_response(self, request: FetchRequestData, error_code: int, session_id: int) -> bool:
        """Apply a response's session fields.  Returns False when the session had to be reset
        (the caller then treats partitions not in the response as "no answer" and refetches)."""
        if error_code:
            self.reset()
            return False
        if request.full:
            if session_id == INVALID_SESSION_ID:
                # The broker declined a session (or sessions are off): stay on full fetches.
                self.reset()
            else:
                self.session_id = session_id
                self.epoch = 1
                self.partitions = dict(request.session_partitions)
            return True
        if session_id != self.session_id:
            self.reset()
            return False
        self.partitions = dict(request.session_partitions)
        self.epoch = 1 if self.epoch == 0x7FFFFFFF else self.epoch + 1
        return True

    def build_close(self) -> FetchRequestData | None:
        """The request that closes this session, or None if there is none to close.

        As the Java consumer does on close (``FetchSessionHandler.notifyClose``): the session's
        id with epoch FINAL_EPOCH (-1) and no partitions.  The broker removes the session and
        answers sessionless, so its cache slot is free at once instead of when it is evicted.
        The handler is reset: nothing is sent in this session afterwards.
        """
        if self.session_id == INVALID_SESSION_ID:
            return None
        req = FetchRequestData(self.session_id, FINAL_EPOCH, {}, [], True, {})
        self.reset()
        return req

    def handle_error(self) -> None:
        """A request failed (disconnect, timeout): the broker's epoch is now unknown."""
        self.reset()

    def reset(self) -> None:
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.uses_topic_ids = None
        self.partitions = {}
