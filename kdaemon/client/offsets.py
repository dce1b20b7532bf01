"""ListOffsets: position resets (``auto_offset_reset``, seek_to_beginning/end) and offset look-ups.

Requests go to each partition's leader, grouped by leader.  Resets are asynchronous and
idempotent: a partition's reset is applied only if it is still wanted with the same strategy
when the answer arrives (a seek in between wins).  Look-ups for the public API are blocking
with a timeout and retry on leader movement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from ..protocol.apis import LIST_OFFSETS
from ..protocol.errors import BrokerError, Errors
from .config import ConsumerConfig
from .errors import KafkaTimeoutError
from .future import Future
from .metadata import ClusterMetadata
from .network import NetworkClient
from .subscription import EARLIEST, LATEST, SubscriptionState
from .types import OffsetAndTimestamp, TopicPartition

log = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
_STRATEGY_TIMESTAMP = {EARLIEST: EARLIEST_TIMESTAMP, LATEST: LATEST_TIMESTAMP}

_RETRIABLE = {Errors.NOT_LEADER_OR_FOLLOWER, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.LEADER_NOT_AVAILABLE,
              Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_LEADER_EPOCH, Errors.OFFSET_NOT_AVAILABLE,
              Errors.REPLICA_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR, Errors.REQUEST_TIMED_OUT}


class OffsetLookup:
    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState) -> None:
        self.config = config
        self.network = network
        self.metadata = metadata
        self.subscriptions = subscriptions
        # A permanent error from a reset (e.g. TOPIC_AUTHORIZATION_FAILED): raised once from the
        # next poll, as Java does; the reset itself is retried after that.
        self.reset_error: BrokerError | None = None

    def _request(self, node: int, timestamps: dict[TopicPartition, int]) -> Future:
        topics: dict[str, list] = {}
        for tp, ts in timestamps.items():
            topics.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "timestamp": ts,
                "current_leader_epoch": self.metadata.leader_epoch(tp)})
        body = {"replica_id": -1, "isolation_level": 1 if self.config.read_committed else 0,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
                "timeout_ms": self.config.request_timeout_ms}
        return self.network.send(node, LIST_OFFSETS, body)

    def _by_leader(self, partitions: Iterable[TopicPartition]) -> tuple[dict[int, list], list]:
        grouped: dict[int, list] = {}
        leaderless = []
        for tp in partitions:
            leader = self.metadata.leader_for(tp)
            if leader is None:
                leaderless.append(tp)
            else:
                grouped.setdefault(leader, []).append(tp)
        return grouped, leaderless

    @staticmethod
    def _parse(body: dict) -> tuple[dict[TopicPartition, tuple[int, int, int]], dict[TopicPartition, int]]:
        found, errors = {}, {}
        for t in body["topics"]:
            for p in t["partitions"]:
                tp = TopicPartition(t["name"], p["partition_index"])
                if p["error_code"]:
                    errors[tp] = p["error_code"]
                else:
                    found[tp] = (p["offset"], p["timestamp"], p["leader_epoch"])
        return found, errors

    # -- asynchronous resets driven by poll -----------------------------------------------------

    def reset_positions(self) -> None:
        error, self.reset_error = self.reset_error, None
        if error is not None:
            raise error
        now = time.monotonic()
        due = []
        for tp in self.subscriptions.needing_reset():
            st = self.subscriptions.state(tp)
            if st.reset_strategy == "none":
                continue
            if not st.reset_in_flight and now >= st.next_reset_attempt:
                due.append(tp)
        if not due:
            return
        grouped, leaderless = self._by_leader(due)
        if leaderless:
            self.metadata.request_update()
        for node, tps in grouped.items():
            if not self.network.ready(node):
                continue
            wanted = {tp: _STRATEGY_TIMESTAMP[self.subscriptions.state(tp).reset_strategy] for tp in tps}
            for tp in tps:
                self.subscriptions.state(tp).reset_in_flight = True
            fut = self._request(node, wanted)
            fut.add_callback(lambda value, wanted=wanted: self._on_reset(wanted, value[1]))
            fut.add_errback(lambda exc, wanted=wanted: self._on_reset_failed(wanted, exc))

    def _on_reset(self, wanted: dict[TopicPartition, int], body: dict) -> None:
        found, errors = self._parse(body)
        for tp, ts in wanted.items():
            if not self.subscriptions.is_assigned(tp):
                continue
            st = self.subscriptions.state(tp)
            if not st.reset_in_flight or _STRATEGY_TIMESTAMP.get(st.reset_strategy) != ts:
                continue  # a seek or another reset superseded this one
            st.reset_in_flight = False
            if tp in found:
                offset, _, epoch = found[tp]
                log.info("reset %s to %s offset %s", tp, st.reset_strategy, offset)
                # With the epoch the answer carries, as Java's resetPositionIfNeeded: the new
                # position is validated against its leader like any other (KIP-320), so a log
                # truncated right after the reset is noticed before a record is consumed.
                self.subscriptions.seek(tp, offset, epoch if epoch is not None and epoch >= 0 else None)
            else:
                code = errors.get(tp, Errors.UNKNOWN_SERVER_ERROR)
                error = BrokerError(code, f"ListOffsets {tp}")
                if tp in errors and code not in _RETRIABLE and self.reset_error is None:
                    self.reset_error = error
                self._backoff(tp, error)

    def _on_reset_failed(self, wanted: dict[TopicPartition, int], exc: BaseException) -> None:
        for tp in wanted:
            if self.subscriptions.is_assigned(tp):
                self.subscriptions.state(tp).reset_in_flight = False
                self._backoff(tp, exc)

    def _backoff(self, tp: TopicPartition, exc: BaseException) -> None:
        st = self.subscriptions.state(tp)
        st.next_reset_attempt = time.monotonic() + self.config.retry_backoff_ms / 1000
        self.metadata.request_update()
        log.debug("offset reset of %s failed: %s", tp, exc)

    # -- blocking look-ups ----------------------------------------------------------------------

    def lookup(self, timestamps: dict[TopicPartition, int], timeout_ms: int,
               drive: Callable[[float, Callable[[], bool]], None]) -> dict[TopicPartition, tuple[int, int, int] | None]:
        """Resolve ``{tp: timestamp}`` to ``{tp: (offset, timestamp, leader_epoch)}``.

        A partition the broker has no answer for (timestamp past the last record) maps to None.
        ``drive(timeout_s, until)`` runs the consumer's network loop.
        """
        deadline = time.monotonic() + timeout_ms / 1000
        result: dict[TopicPartition, tuple[int, int, int] | None] = {}
        remaining = dict(timestamps)
        self.metadata.want(tp.topic for tp in remaining)
        while remaining:
            now = time.monotonic()
            if now >= deadline:
                raise KafkaTimeoutError(f"offset look-up for {sorted(map(str, remaining))} timed out "
                                        f"after {timeout_ms} ms")
            grouped, leaderless = self._by_leader(remaining)
            if leaderless:
                self.metadata.request_update()
                self.metadata.maybe_update(self.network)
            futures = []
            for node, tps in grouped.items():
                if not self.network.ready(node):
                    continue
                futures.append(self._request(node, {tp: remaining[tp] for tp in tps}))
            if not futures:
                drive(min(0.1, deadline - now), lambda: False)
                continue
            drive(max(0.0, deadline - time.monotonic()), lambda: all(f.done for f in futures))
            retry = False
            for fut in futures:
                if not fut.done:
                    continue
                if fut.failed:
                    retry = True
                    continue
                found, errors = self._parse(fut.value()[1])
                for tp, value in found.items():
                    if tp in remaining:
                        result[tp] = None if value[0] < 0 else value
                        remaining.pop(tp)
                for tp, code in errors.items():
                    if code in _RETRIABLE:
                        retry = True
                    else:
                        raise BrokerError(code, f"ListOffsets {tp}")
            if retry:
                self.metadata.request_update()
                drive(min(self.config.retry_backoff_ms / 1000, max(0.0, deadline - time.monotonic())),
                      lambda: False)
        return result

    @staticmethod
    def as_offset_and_timestamp(value) -> OffsetAndTimestamp | None:
        if value is None:
            return None
        offset, ts, epoch = value
        return OffsetAndTimestamp(offset, ts, None if epoch < 0 else epoch)
