"""A share member's requests on its share sessions, and what their answers do.

``ShareExchange`` is ``ShareConsumer``'s I/O half (the consumer keeps the public API, the
acknowledgement modes and the callback): per leader node one ``ShareSession`` with at most one
request in flight, a ShareFetch (carrying the node's pending verdicts) or a ShareAcknowledge;
answers are queued by whichever thread polled the network (the heartbeat thread too) and applied
in the application thread, in the order they came (``read_answers``): acknowledgement results
per partition (``report``), renewed records given back, fetched records decoded
(``fetch.decode_partition``) into ``buffer`` and the offsets the consumer settles itself into
``InFlight``.  ``collect`` hands buffered records out, never one whose lock ran out.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ...protocol.apis import SHARE_ACKNOWLEDGE, SHARE_FETCH
from ...protocol.apis.share_fetch import ACQUIRE_BATCH_OPTIMIZED, ACQUIRE_RECORD_LIMIT
from ...protocol.errors import BrokerError, Errors
from ..config import ConsumerConfig
from ..errors import ConnectionFailedError, InvalidRecordStateError, KafkaClientError
from ..metadata import ClusterMetadata
from ..metrics import ShareCounters
from ..network import NetworkClient
from ..types import TopicPartition
from .acknowledgements import InFlight, Taken
from .fetch import decode_partition
from .membership import ShareMembership
from .session import ShareRequest, ShareSession
from .types import AcquireMode, ShareRecord

log = logging.getLogger("kdaemon.client.share.consumer")

# Partition errors of a ShareFetch that mean "the leader moved": refresh metadata, fetch again.
_REFRESH_METADATA = frozenset({
    Errors.NOT_LEADER_OR_FOLLOWER, Errors.REPLICA_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR,
    Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.UNKNOWN_TOPIC_ID,
    Errors.LEADER_NOT_AVAILABLE, Errors.UNKNOWN_LEADER_EPOCH,
})


@dataclass
class Buffered:
    """Records of one partition fetched and not yet returned by ``poll``."""

    tp: TopicPartition
    node: int
    topic_id: uuid.UUID
    deadline: float
    records: list[ShareRecord]
    pos: int = 0


@dataclass
class Sent:
    """A request on a share session, until its answer is read."""

    api: object
    node: int
    request: ShareRequest
    taken: Taken
    sent_at: float
    results: dict | None = None        # commit_sync's collector, when it sent it
    value: object = None
    error: BaseException | None = None
    done: bool = False


@dataclass
class Result:
    """One partition's acknowledgements completed: the offsets the application saw, and why
    they failed (None: applied)."""

    partition: TopicPartition
    offsets: set[int]
    error: Exception | None = field(default=None)


Report = Callable[[Result, "dict | None"], None]


class ShareExchange:
    def __init__(self, config: ConsumerConfig, acquire_mode: AcquireMode, network: NetworkClient,
                 metadata: ClusterMetadata, membership: ShareMembership, inflight: InFlight, report: Report) -> None:
        self.config = config
        self._acquire_mode = acquire_mode
        self._network = network
        self._metadata = metadata
        self._membership = membership
        self._inflight = inflight
        self._report = report
        self._sessions: dict[int, ShareSession] = {}
        self.busy: dict[int, Sent] = {}          # node -> its session's request in flight
        self.answered: deque[Sent] = deque()      # appended by whichever thread polled the network
        self.buffer: deque[Buffered] = deque()
        self.pending_error: Exception | None = None   # a batch that could not be read, raised by poll
        self.lock_timeout_ms: int | None = None
        self.counters = ShareCounters()

    def wanted_by_node(self) -> dict[int, dict[TopicPartition, uuid.UUID]]:
        assigned, unresolved = self._membership.assignment()
        if unresolved:
            self._metadata.request_update()
        out: dict[int, dict[TopicPartition, uuid.UUID]] = {}
        for tp in assigned:
            leader = self._metadata.leader_for(tp)
            if leader is None:
                self._metadata.request_update()
                continue
            out.setdefault(leader, {})[tp] = self._metadata.topic_id(tp.topic)
        return out

    def send_requests(self, now: float, *, fetch: bool) -> None:
        """Per node, at most one request on its session: a ShareFetch (carrying the node's
        pending acknowledgements) when ``fetch`` and nothing fetched from it waits to be
        returned, else a ShareAcknowledge when acknowledgements wait (RENEWs always go alone)."""
        wanted = self.wanted_by_node() if self._membership.joined else {}
        buffered = {b.node for b in self.buffer}
        for node in sorted(set(wanted) | self._inflight.nodes()):
            if node in self.busy or not self._network.ready(node):
                continue
            session = self._sessions.setdefault(node, ShareSession(node))
            pending = self._inflight.pending(node)
            renew = self._inflight.renewing(node)
            if pending and session.open and (renew or not fetch or node in buffered or node not in wanted):
                self.send_acknowledgements(node, now, None)
            elif fetch and node in wanted and node not in buffered:
                self._send_fetch(node, wanted[node], now, None)

    def _send_fetch(self, node: int, wanted: dict[TopicPartition, uuid.UUID], now: float,
                    results: dict | None, max_wait_ms: int | None = None) -> Sent:
        taken = self._inflight.take(node, now, renew=False)
        self._report_expired(taken, results)
        session = self._sessions.setdefault(node, ShareSession(node))
        request = session.build_fetch(wanted, taken.acks, {**self._topic_ids(), **taken.topic_ids})
        record_limit = self._acquire_mode is AcquireMode.RECORD_LIMIT
        body = {"group_id": self.config.group_id, "member_id": self._membership.member_id,
                "share_session_epoch": request.epoch,
                "max_wait_ms": self.config.fetch_max_wait_ms if max_wait_ms is None else max_wait_ms,
                "min_bytes": self.config.fetch_min_bytes, "max_bytes": self.config.fetch_max_bytes,
                "max_records": self.config.max_poll_records, "batch_size": self.config.max_poll_records,
                "share_acquire_mode": ACQUIRE_RECORD_LIMIT if record_limit else ACQUIRE_BATCH_OPTIMIZED,
                "topics": request.topics, "forgotten_topics_data": request.forgotten}
        return self._send(SHARE_FETCH, node, request, taken, body, results, min_version=2 if record_limit else None)

    def send_acknowledgements(self, node: int, now: float, results: dict | None) -> Sent | None:
        """A ShareAcknowledge of ``node``'s pending verdicts; with no session open there, a
        ShareFetch that opens one (and may acquire records, returned by the next poll)."""
        session = self._sessions.setdefault(node, ShareSession(node))
        if not session.open:
            wanted = self.wanted_by_node().get(node, {})
            return self._send_fetch(node, wanted, now, results, max_wait_ms=0)
        taken = self._inflight.take(node, now, renew=True)
        self._report_expired(taken, results)
        if not taken.acks:
            return None
        request = session.build_acknowledge(taken.acks, {**self._topic_ids(), **taken.topic_ids})
        body = {"group_id": self.config.group_id, "member_id": self._membership.member_id,
                "share_session_epoch": request.epoch, "is_renew_ack": taken.renew, "topics": request.topics}
        return self._send(SHARE_ACKNOWLEDGE, node, request, taken, body, results,
                          min_version=2 if taken.renew else None)

    def _send(self, api, node: int, request: ShareRequest, taken: Taken, body: dict, results: dict | None,
              min_version: int | None) -> Sent:
        sent = Sent(api, node, request, taken, time.monotonic(), results)
        self.busy[node] = sent
        fut = self._network.send(node, api, body, min_version=min_version,
                                 timeout_ms=self.config.request_timeout_ms + self.config.fetch_max_wait_ms)

        def answered(value) -> None:
            sent.value = value
            self.answered.append(sent)

        def failed(exc) -> None:
            sent.error = exc
            self.answered.append(sent)

        fut.add_callback(answered)
        fut.add_errback(failed)
        return sent

    def _topic_ids(self) -> dict[str, uuid.UUID]:
        return {name: t.topic_id for name, t in self._metadata.topics.items()}

    def free(self, node: int) -> bool:
        self.read_answers()
        return node not in self.busy

    def read_answers(self) -> None:
        """Apply every answer that came (in the order they came), in the application thread."""
        while self.answered:
            sent = self.answered.popleft()
            self.busy.pop(sent.node, None)
            try:
                self.apply(sent)
            finally:
                sent.done = True

    def apply(self, sent: Sent) -> None:
        session = self._sessions.setdefault(sent.node, ShareSession(sent.node))
        taken = sent.taken
        if sent.error is not None:
            session.reset()
            log.info("share group %s: %s to node %s failed: %s", self.config.group_id, sent.api.name,
                     sent.node, sent.error)
            if isinstance(sent.error, ConnectionFailedError):
                self._metadata.request_update()
            self._fail_all(taken, sent.results, _as_error(sent.error))
            return
        version, body = sent.value
        top = body["error_code"]
        session.handled(top)
        if top != Errors.NONE:
            error = BrokerError(top, f"{sent.api.name} to node {sent.node}")
            log.info("share group %s: %s", self.config.group_id, error)
            self._fail_all(taken, sent.results, error)
            return
        lock_ms = body.get("acquisition_lock_timeout_ms", 0) or 0
        is_fetch = sent.api is SHARE_FETCH
        if is_fetch and lock_ms > 0:
            self.lock_timeout_ms = lock_ms
        deadline = sent.sent_at + lock_ms / 1000
        names = self._metadata.topic_names
        by_id = {tid: name for name, tid in taken.topic_ids.items()}
        answered: set[TopicPartition] = set()
        for topic in body["responses"]:
            name = names.get(topic["topic_id"]) or by_id.get(topic["topic_id"])
            if name is None:
                self._metadata.request_update()
                continue
            for p in topic["partitions"]:
                tp = TopicPartition(name, p["partition_index"])
                if tp in taken.acks:
                    answered.add(tp)
                    code = p["acknowledge_error_code"] if is_fetch else p["error_code"]
                    self._acknowledged(sent, tp, code, deadline)
                if is_fetch:
                    self._fetched(sent, tp, topic["topic_id"], p, deadline)
        for tp in set(taken.acks) - answered:   # not in the answer: nothing refused
            self._acknowledged(sent, tp, Errors.NONE, deadline)

    def _acknowledged(self, sent: Sent, tp: TopicPartition, code: int, deadline: float) -> None:
        taken = sent.taken
        error = None
        if code == Errors.INVALID_RECORD_STATE:
            error = InvalidRecordStateError(
                f"{tp}: the broker refused the acknowledgement of offsets {ranges(taken.shown.get(tp, ()))}: "
                "the records are no longer held by this member (their lock ran out)")
        elif code != Errors.NONE:
            error = BrokerError(code, f"acknowledging {tp}")
        self.counters.verdicts((kind for _, kind in taken.acks[tp]), confirmed=error is None)
        renewing = taken.renewing.get(tp)
        if renewing:
            if error is None and deadline > sent.sent_at:
                # Renewed: the records come back from a later poll, under the new lock.
                records = [h.record for _, h in sorted(renewing.items())]
                held = next(iter(renewing.values()))
                self.buffer.appendleft(Buffered(tp, held.node, held.topic_id, deadline, records))
        if tp in taken.shown:
            self._report(Result(tp, set(taken.shown[tp]), error), sent.results)

    def _fetched(self, sent: Sent, tp: TopicPartition, topic_id: uuid.UUID, p: dict, deadline: float) -> None:
        code = p["error_code"]
        if code != Errors.NONE:
            leader = p["current_leader"]
            if leader["leader_id"] >= 0:
                self._metadata.update_leader(tp, leader["leader_id"], leader["leader_epoch"])
            if code in _REFRESH_METADATA:
                self._metadata.request_update()
                log.debug("share fetch of %s: %s; refreshing metadata", tp, BrokerError(code))
            else:
                log.warning("share fetch of %s: %s", tp, BrokerError(code))
            return
        if not p["acquired_records"]:
            return
        decoded = decode_partition(tp, p, header_filter=self.config.header_filter, check_crcs=self.config.check_crcs,
                                   max_uncompressed=self.config.max_uncompressed_batch_bytes,
                                   on_filtered=self.config.on_filtered)
        if decoded.settled:
            self._inflight.settle(tp, decoded.settled, sent.node, topic_id, deadline)
        if decoded.records:
            self.counters.acquired(r.delivery_count for r in decoded.records)
            self.buffer.append(Buffered(tp, sent.node, topic_id, deadline, decoded.records))
        if decoded.error is not None and self.pending_error is None:
            self.pending_error = decoded.error

    def _fail_all(self, taken: Taken, results: dict | None, error: Exception) -> None:
        self.counters.verdicts((kind for acks in taken.acks.values() for _, kind in acks), confirmed=False)
        for tp, offsets in taken.shown.items():
            self._report(Result(tp, set(offsets), error), results)

    def _report_expired(self, taken: Taken, results: dict | None) -> None:
        self.report_expired(taken.expired, results)

    def report_expired(self, expired: dict[TopicPartition, set[int]], results: dict | None) -> None:
        """Records the application saw whose lock ran out before their verdict went out."""
        for tp, offsets in expired.items():
            self.counters.lock_expiries += len(offsets)
            self._report(Result(tp, offsets, expired_error(tp, offsets)), results)

    def collect(self, now: float) -> dict[TopicPartition, list[ShareRecord]]:
        """Up to ``max_poll_records`` buffered records; records whose lock ran out are dropped
        (the broker has given them back to the group)."""
        out: dict[TopicPartition, list[ShareRecord]] = {}
        room = self.config.max_poll_records
        while self.buffer and room > 0:
            b = self.buffer[0]
            if now >= b.deadline:
                self.buffer.popleft()
                left = b.records[b.pos:]
                self.counters.lock_expiries += len(left)
                log.info("share group %s: %d record(s) of %s (offsets %s) were not returned: their lock ran "
                         "out before a poll could return them", self.config.group_id, len(left), b.tp,
                         ranges(r.offset for r in left))
                continue
            chunk = b.records[b.pos:b.pos + room]
            b.pos += len(chunk)
            room -= len(chunk)
            out.setdefault(b.tp, []).extend(chunk)
            self._inflight.deliver(b.tp, chunk, b.node, b.topic_id, b.deadline)
            if b.pos >= len(b.records):
                self.buffer.popleft()
        return out

    def close_sessions(self, deadline: float, drive) -> None:
        """The closing ShareAcknowledge (epoch -1) on every open session, with the explicit
        verdicts still to send; waits for the answers until ``deadline``."""
        self._inflight.forget_delivered()
        closing: list[Sent] = []
        for node, session in sorted(self._sessions.items()):
            drive(max(0.0, deadline - time.monotonic()), lambda n=node: self.free(n))
            if node in self.busy or not session.open:
                continue
            taken = self._inflight.take(node, time.monotonic(), renew=False)
            self._report_expired(taken, None)
            request = session.build_close(taken.acks, {**self._topic_ids(), **taken.topic_ids})
            if request is None or not self._network.is_ready(node):
                self._fail_all(taken, None, KafkaClientError(f"not sent: node {node} is not connected"))
                continue
            body = {"group_id": self.config.group_id, "member_id": self._membership.member_id,
                    "share_session_epoch": request.epoch, "topics": request.topics}
            closing.append(self._send(SHARE_ACKNOWLEDGE, node, request, taken, body, None, None))
        drive(max(0.0, deadline - time.monotonic()), lambda: all(s.done for s in closing))
        self.read_answers()
        self._sessions.clear()
        self.buffer.clear()


def expired_error(tp: TopicPartition, offsets) -> InvalidRecordStateError:
    return InvalidRecordStateError(
        f"{tp}: the acquisition lock of offsets {ranges(offsets)} ran out before the acknowledgement "
        "was sent; it was not sent (the broker gives the records to the group again, maybe to another member)")


def _as_error(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else KafkaClientError(str(exc))


def ranges(offsets) -> str:
    """1,2,3,7 -> '1-3, 7': offsets as an operator reads them."""
    out, run = [], []
    for o in sorted(offsets):
        if run and o != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(o)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)
