"""Position validation after a leader change (KIP-320): noticing that the log was truncated.

A position is an offset *and* the leader epoch of the batch it is in or after
(``PartitionState.position_epoch``).  When a partition's leader changes, the new leader's log may
not hold what we read from the old one: after an unclean election the new leader lacks the old
leader's tail, and the old leader truncates its log to match when it comes back.  Fetching on
would go wrong either way: fetch at an offset the new leader has not reached yet and the answer is
OFFSET_OUT_OF_RANGE (a reset: everything written meanwhile is skipped or re-read); or the log
grows past our position again with *other* records at the offsets we already consumed, which we
would silently never see.

So, as the Java consumer does (``SubscriptionState.maybeValidatePositionForCurrentLeader``,
``maybeCompleteValidation``, ``OffsetFetcher.validatePositionsIfNeeded``):

1. When the leader (id, epoch) from metadata differs from the one the position was last checked
   against, and the position has an epoch, the partition is *awaiting validation*: not fetched,
   and any data buffered for it is dropped.  Without an epoch (a plain ``seek``, a reset) there is
   nothing to check and fetching goes on.
2. An OffsetForLeaderEpoch request (v3+) asks the leader where our epoch ends in its log.
3. The answer decides, by ``DECISIONS`` below: the epoch ends at or past our position → valid;
   it ends before → truncated: seek to that end offset (the first offset known to diverge) with
   ``earliest``/``latest``, raise ``LogTruncationError`` with ``none``; no answer (-1) → reset by
   the policy, or raise with ``none``.  Java resets by the policy only in that last case: with a
   known end offset it goes to it whatever the policy says, and so do we.

Fetch requests send ``last_fetched_epoch`` = -1, as the Java consumer does, so the broker runs
no divergence check of its own and this validation is the one place truncation is found.  Should
a broker answer ``diverging_epoch`` all the same, the answer is decided by the same table, for
the offset and epoch it was asked about only.  A valid answer whose epoch is below ours (the
leader never had our epoch; an earlier one covers the position) gives the position the leader's
epoch, as Java does, so the next validation asks about an epoch the leader knows.

A truncation raised with ``none`` leaves the partition awaiting validation, retried after
``request_timeout_ms`` as Java does: it raises again until the application seeks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

from ..protocol.apis.offset_for_leader_epoch import CONSUMER_MIN_VERSION, OFFSET_FOR_LEADER_EPOCH
from ..protocol.errors import BrokerError, Errors, UnsupportedVersionError
from .config import ConsumerConfig
from .errors import LogTruncationError
from .metadata import ClusterMetadata
from .network import NetworkClient
from .subscription import PartitionState, SubscriptionState
from .types import OffsetAndMetadata, TopicPartition

log = logging.getLogger(__name__)

UNDEFINED = -1

# What an answer about where our epoch ends means for the position.
VALID, TRUNCATED, UNKNOWN = "valid", "truncated", "unknown"
# What to do about it.
COMPLETE = "complete"          # fetch on from the position
SEEK_TO_END = "seek_to_end"    # go to the end offset the leader gave, with its epoch
RESET = "reset"                # ListOffsets by the auto_offset_reset policy
RAISE = "raise"                # LogTruncationError (auto_offset_reset = none)

# (finding, has a reset policy) -> action.  Everything that decides an outcome is here.
DECISIONS: dict[tuple[str, bool], str] = {
    (VALID, True): COMPLETE,
    (VALID, False): COMPLETE,
    (TRUNCATED, True): SEEK_TO_END,
    (TRUNCATED, False): RAISE,
    (UNKNOWN, True): RESET,
    (UNKNOWN, False): RAISE,
}

# Partition errors after which the request is simply asked again (after a metadata refresh).
_RETRIABLE = {
    Errors.NOT_LEADER_OR_FOLLOWER, Errors.REPLICA_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR,
    Errors.OFFSET_NOT_AVAILABLE, Errors.LEADER_NOT_AVAILABLE, Errors.FENCED_LEADER_EPOCH,
    Errors.UNKNOWN_LEADER_EPOCH, Errors.UNKNOWN_TOPIC_OR_PARTITION,
}


@dataclass(frozen=True, slots=True)
class CheckedPosition:
    """The position a validation request was sent for; an answer for any other is stale."""

    offset: int
    epoch: int
    leader: tuple[int, int]

    @classmethod
    def of(cls, st: PartitionState) -> "CheckedPosition":
        assert st.position is not None and st.position_epoch is not None and st.position_leader is not None
        return cls(st.position, st.position_epoch, st.position_leader)


class Truncation(NamedTuple):
    """A truncation to report (``auto_offset_reset`` none): our position and the divergent offset
    with its epoch, or None when the leader could not say where our epoch ends."""

    position: int
    divergent: OffsetAndMetadata | None


def finding(position: int, epoch: int, end_offset: int) -> str:
    """Judge the leader's answer (``epoch``, ``end_offset``) for our epoch against ``position``."""
    if epoch == UNDEFINED or end_offset == UNDEFINED:
        return UNKNOWN
    return TRUNCATED if end_offset < position else VALID


# -- transitions on one partition's state (pure) --------------------------------------------------

def leader_changed(st: PartitionState, leader: int | None, leader_epoch: int) -> bool:
    """Record the partition's current leader; True if the position now awaits validation.

    Nothing changes while a reset is pending, without a position, or without a known leader
    (Java's ``maybeValidatePosition``).  A new leader also ends any preferred read replica.
    """
    if st.reset_strategy is not None or st.position is None or leader is None:
        return False
    current = (leader, leader_epoch)
    if st.position_leader != current:
        st.position_leader = current
        st.preferred_read_replica = None
        st.validation_in_flight = False
        st.next_validation_attempt = 0.0
        st.awaiting_validation = st.position_epoch is not None and leader_epoch >= 0
    return st.awaiting_validation


def skip_validation(st: PartitionState) -> None:
    """The leader cannot answer OffsetForLeaderEpoch v3+: fetch on unchecked, as Java does."""
    st.awaiting_validation = False
    st.validation_in_flight = False


def apply_answer(st: PartitionState, tp: TopicPartition, epoch: int, end_offset: int,
                 has_policy: bool, request_reset) -> Truncation | None:
    """Act on the leader's answer for the position ``st`` holds now; the truncation to raise,
    if any.  ``request_reset(tp)`` asks for a reset by the policy."""
    position = st.position
    assert position is not None
    found = finding(position, epoch, end_offset)
    action = DECISIONS[(found, has_policy)]
    st.validation_in_flight = False
    if action == COMPLETE:
        st.awaiting_validation = False
        if epoch != UNDEFINED and st.position_epoch is not None and epoch < st.position_epoch:
            # The leader never had our epoch; the one it has at our position is this.
            st.position_epoch = epoch
        return None
    if action == SEEK_TO_END:
        log.warning("log truncation detected for %s: position %s (epoch %s) is past the end %s of "
                    "that epoch in the leader's log; going on from %s (epoch %s)",
                    tp, position, st.position_epoch, end_offset, end_offset, epoch)
        leader = st.position_leader
        st.position = end_offset
        st.position_epoch = epoch
        st.position_leader = leader     # validated against this leader: no second check
        st.awaiting_validation = False
        return None
    if action == RESET:
        log.warning("log truncation detected for %s at position %s (epoch %s), and the leader does "
                    "not know that epoch; resetting by auto_offset_reset", tp, position, st.position_epoch)
        request_reset(tp)
        return None
    # RAISE: stay awaiting validation (not fetched); asked again after the retry delay.
    log.warning("log truncation detected for %s at position %s (epoch %s); leader's end offset "
                "for it: %s (epoch %s); auto_offset_reset is none", tp, position, st.position_epoch,
                end_offset, epoch)
    st.awaiting_validation = True
    return Truncation(position, None if found == UNKNOWN else OffsetAndMetadata(end_offset, "", epoch))


# -- the driver: requests, answers, the fetcher's diverging epochs -------------------------------

class PositionValidator:
    """Sends OffsetForLeaderEpoch for partitions awaiting validation and applies the answers.

    Driven by the consumer's poll (``validate_positions``) and by the fetcher, which checks
    leaders before each send (``check_leaders``) and hands over diverging epochs
    (``on_diverging_epoch``).
    """

    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState) -> None:
        self.config = config
        self.network = network
        self.metadata = metadata
        self.subscriptions = subscriptions
        # Raised from the next validate_positions, as Java caches its validation exception.
        self.error: Exception | None = None
        self._checked: tuple[int, int] | None = None
        self.requests = 0

    @property
    def _has_policy(self) -> bool:
        return self.config.auto_offset_reset != "none"

    def check_leaders(self) -> None:
        """Compare every position's leader with metadata; only after metadata or a seek moved."""
        stamp = (self.metadata.version, self.subscriptions.positions_version)
        if stamp == self._checked:
            return
        self._checked = stamp
        for tp, st in self.subscriptions.items():
            if leader_changed(st, self.metadata.leader_for(tp), self.metadata.leader_epoch(tp)):
                log.debug("%s: leader is now %s; validating position %s (epoch %s)", tp,
                          st.position_leader, st.position, st.position_epoch)

    def validate_positions(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise error
        self.check_leaders()
        due = self.subscriptions.needing_validation(time.monotonic())
        if not due:
            return
        by_node: dict[int, list[TopicPartition]] = {}
        for tp in due:
            st = self.subscriptions.state(tp)
            node = st.position_leader[0] if st.position_leader else None
            if node is None or node not in self.metadata.brokers:
                self.metadata.request_update()
                continue
            by_node.setdefault(node, []).append(tp)
        for node, tps in by_node.items():
            if not self.network.ready(node):
                continue
            try:
                version = self.network.api_version(node, OFFSET_FOR_LEADER_EPOCH)
            except UnsupportedVersionError:
                version = -1
            if version < CONSUMER_MIN_VERSION:
                log.info("broker %s cannot validate positions (no OffsetForLeaderEpoch v%s+); "
                         "fetching %s unchecked", node, CONSUMER_MIN_VERSION, sorted(map(str, tps)))
                for tp in tps:
                    skip_validation(self.subscriptions.state(tp))
                continue
            self._send(node, version, tps)

    def _send(self, node: int, version: int, tps: list[TopicPartition]) -> None:
        requested: dict[TopicPartition, CheckedPosition] = {}
        topics: dict[str, list] = {}
        retry_at = time.monotonic() + self.config.request_timeout_ms / 1000
        for tp in tps:
            st = self.subscriptions.state(tp)
            checked = requested[tp] = CheckedPosition.of(st)
            st.validation_in_flight = True
            # Java's retry timer for an answered truncation with no policy: the request timeout.
            st.next_validation_attempt = retry_at
            topics.setdefault(tp.topic, []).append({
                "partition": tp.partition, "current_leader_epoch": checked.leader[1],
                "leader_epoch": checked.epoch})
        body = {"replica_id": -1,
                "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}
        self.requests += 1
        fut = self.network.send(node, OFFSET_FOR_LEADER_EPOCH, body, min_version=CONSUMER_MIN_VERSION,
                                max_version=version)
        fut.add_callback(lambda value: self.handle_answer(requested, value[1]))
        fut.add_errback(lambda exc: self.handle_failure(requested, exc))

    def _current(self, tp: TopicPartition, checked: CheckedPosition) -> PartitionState | None:
        """The partition's state if the answer for ``checked`` still applies to it."""
        if not self.subscriptions.is_assigned(tp):
            return None
        st = self.subscriptions.state(tp)
        if not st.awaiting_validation or st.position is None or st.position_epoch is None \
                or st.position_leader is None or CheckedPosition.of(st) != checked:
            return None   # a seek, a reset or another leader change since: stale
        return st

    def handle_answer(self, requested: dict[TopicPartition, CheckedPosition], body: dict) -> None:
        answers = {}
        for t in body["topics"]:
            for p in t["partitions"]:
                answers[TopicPartition(t["topic"], p["partition"])] = p
        truncations = {}
        unauthorized = set()
        retry = False
        for tp, checked in requested.items():
            st = self._current(tp, checked)
            if st is None:
                continue
            p = answers.get(tp)
            code = Errors.UNKNOWN_SERVER_ERROR if p is None else p["error_code"]
            if code == Errors.NONE:
                truncation = apply_answer(st, tp, p["leader_epoch"], p["end_offset"], self._has_policy,
                                          self.subscriptions.request_reset)
                if truncation is not None:
                    truncations[tp] = truncation
                continue
            st.validation_in_flight = False
            if code == Errors.TOPIC_AUTHORIZATION_FAILED:
                unauthorized.add(tp.topic)
            elif code not in _RETRIABLE:
                log.warning("validating the position of %s: %s; retrying", tp,
                            BrokerError(code, "OffsetForLeaderEpoch"))
            st.next_validation_attempt = time.monotonic() + self.config.retry_backoff_ms / 1000
            retry = True
        if retry:
            self.metadata.request_update()
        if unauthorized and self.error is None:
            self.error = BrokerError(Errors.TOPIC_AUTHORIZATION_FAILED,
                                     f"OffsetForLeaderEpoch {', '.join(sorted(unauthorized))}")
        if truncations and self.error is None:
            self.error = LogTruncationError(truncations)

    def handle_failure(self, requested: dict[TopicPartition, CheckedPosition], exc: BaseException) -> None:
        skip = isinstance(exc, UnsupportedVersionError)
        for tp, checked in requested.items():
            st = self._current(tp, checked)
            if st is None:
                continue
            if skip:
                skip_validation(st)
                continue
            st.validation_in_flight = False
            st.next_validation_attempt = time.monotonic() + self.config.retry_backoff_ms / 1000
        log.debug("OffsetForLeaderEpoch failed: %s", exc)
        self.metadata.request_update()

    def on_diverging_epoch(self, tp: TopicPartition, fetch_offset: int, fetched_epoch: int, epoch: int,
                           end_offset: int) -> None:
        """A Fetch at ``fetch_offset`` with ``last_fetched_epoch`` = ``fetched_epoch`` answered
        ``diverging_epoch`` (``epoch``, ``end_offset``): decide as for an OffsetForLeaderEpoch
        answer; raises LogTruncationError with ``none``.

        Only for the position as it is now, offset *and* epoch: an answer about another epoch
        (a fetch sent ahead before the position's epoch moved) says nothing about this position,
        and judging it would see a truncation that never happened.  It is dropped, and the next
        fetch asks with the current epoch.
        """
        st = self.subscriptions.state(tp)
        current = -1 if st.position_epoch is None else st.position_epoch
        if st.position != fetch_offset or current != fetched_epoch:
            log.debug("%s: diverging epoch for offset %s epoch %s, position is %s epoch %s: stale",
                      tp, fetch_offset, fetched_epoch, st.position, current)
            return
        truncation = apply_answer(st, tp, epoch, end_offset, self._has_policy,
                                  self.subscriptions.request_reset)
        if truncation is not None:
            st.next_validation_attempt = time.monotonic() + self.config.request_timeout_ms / 1000
            raise LogTruncationError({tp: truncation})
