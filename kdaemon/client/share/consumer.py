"""``ShareConsumer``: a member of a share group (KIP-932), after Java's ``KafkaShareConsumer``.

Records are not assigned by partition but handed out one by one: each ShareFetch *acquires*
records for this member under a time-limited lock, and the member settles each one with an
acknowledgement (``AcknowledgeType``): ACCEPT, RELEASE (deliver again), REJECT (never again),
RENEW (keep the lock; the record comes back from the next poll).  What follows Java:

* **Acknowledgement modes** (``share_acknowledgement_mode``): "implicit" (the default): the next
  ``poll``, ``commit_sync`` or ``commit_async`` accepts every record the last poll returned;
  "explicit": the application calls ``acknowledge`` for each, and a ``poll`` with records of the
  last one unacknowledged raises ``AcknowledgementError`` (they can still be acknowledged).
* **Where acknowledgements go**: with the next ShareFetch to the node the records came from, when
  ``poll`` fetches; alone in a ShareAcknowledge when ``poll`` returns records it already had,
  and always for ``commit_sync``/``commit_async`` and RENEW (a renewing ShareFetch may fetch
  nothing, KIP-1222).  No fetch is sent while records fetched earlier are still waiting to be
  returned: a record's lock starts when the broker acquires it.
* **Share sessions** (``session.py``): one per leader node, one request in flight on each.
  ``close`` ends each with a ShareAcknowledge at epoch -1 (carrying the last explicit
  acknowledgements; the broker releases whatever else this member holds), then leaves the group.
* **Results**: ``commit_sync`` returns ``{partition: None or the exception}`` for every
  partition it acknowledged; the acknowledgement commit callback
  (``set_acknowledgement_commit_callback``) gets ``({partition: offsets}, exception or None)``
  for every acknowledgement that completed, in the application thread, from the next ``poll``,
  ``commit_*`` or ``close``.  INVALID_RECORD_STATE is ``InvalidRecordStateError``.
* **Expired locks** (``acknowledgements.py``): the consumer keeps each record's lock deadline; a
  verdict on a record whose lock ran out is not sent and is reported as
  ``InvalidRecordStateError`` the same way; a fetched record whose lock ran out before a poll
  could return it is never returned.
* **Filter-first decoding** (``fetch.py``): the same reader, C loop and header rules as the
  ``Consumer``; a record the filter drops is ACCEPTed for the member and never becomes a Python
  object.

One thread uses a consumer at a time; ``wakeup()`` may be called from any thread.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...protocol.apis import SHARE_ACKNOWLEDGE, SHARE_FETCH
from ...protocol.apis.share_fetch import ACQUIRE_BATCH_OPTIMIZED, ACQUIRE_RECORD_LIMIT
from ...protocol.errors import BrokerError, Errors
from ..errors import (AcknowledgementError, ConnectionFailedError, ConsumerClosedError, InvalidRecordStateError,
                      KafkaClientError, KafkaTimeoutError, NoBrokersAvailableError, WakeupError)
from ..metadata import ClusterMetadata
from ..network import NetworkClient
from ..types import TopicPartition
from .acknowledgements import InFlight, Taken
from .config import ShareConsumerConfig
from .fetch import decode_partition
from .membership import ShareMembership
from .session import ShareRequest, ShareSession
from .types import AcknowledgementMode, AcknowledgeType, AcquireMode, ShareRecord

log = logging.getLogger(__name__)

# Partition errors of a ShareFetch that mean "the leader moved": refresh metadata, fetch again.
_REFRESH_METADATA = frozenset({
    Errors.NOT_LEADER_OR_FOLLOWER, Errors.REPLICA_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR,
    Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.UNKNOWN_TOPIC_ID,
    Errors.LEADER_NOT_AVAILABLE, Errors.UNKNOWN_LEADER_EPOCH,
})

AcknowledgementCommitCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], None]


@dataclass
class _Buffered:
    """Records of one partition fetched and not yet returned by ``poll``."""

    tp: TopicPartition
    node: int
    topic_id: uuid.UUID
    deadline: float
    records: list[ShareRecord]
    pos: int = 0


@dataclass
class _Sent:
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
class _Result:
    partition: TopicPartition
    offsets: set[int]
    error: Exception | None = field(default=None)


class ShareConsumer:
    def __init__(self, bootstrap_servers: str | Iterable[str] = "localhost:9092", **options) -> None:
        self.share_config = ShareConsumerConfig.from_options(bootstrap_servers=bootstrap_servers, **options)
        self.config = config = self.share_config.consumer
        self._explicit = self.share_config.acknowledgement_mode is AcknowledgementMode.EXPLICIT
        self._network = NetworkClient(config)
        self._metadata = ClusterMetadata(config.metadata_max_age_ms, config.retry_backoff_ms,
                                         config.allow_auto_create_topics)
        self._membership = ShareMembership(config, self._network, self._metadata)
        self._inflight = InFlight()
        self._sessions: dict[int, ShareSession] = {}
        self._busy: dict[int, _Sent] = {}          # node -> its session's request in flight
        self._answered: deque[_Sent] = deque()      # appended by whichever thread polled the network
        self._buffer: deque[_Buffered] = deque()
        self._results: list[_Result] = []           # for the acknowledgement commit callback
        self._callback: AcknowledgementCommitCallback | None = None
        self._in_callback = False
        self._pending_error: Exception | None = None
        self._lock_timeout_ms: int | None = None
        self._closed = False
        self._closing = False
        self._owner = threading.RLock()
        self._started = time.monotonic()
        self._warned_missing: set[str] = set()

    def __repr__(self) -> str:
        return f"<ShareConsumer group_id={self.config.group_id!r} member_id={self._membership.member_id!r}>"

    @contextmanager
    def _use(self):
        if self._closed:
            raise ConsumerClosedError("the share consumer is closed")
        if self._in_callback:
            raise AcknowledgementError("the share consumer's methods cannot be called from the "
                                       "acknowledgement commit callback")
        if not self._owner.acquire(blocking=False):
            raise RuntimeError("ShareConsumer is not safe for use by several threads at once "
                               "(only wakeup() may be called from another thread)")
        try:
            yield
        finally:
            self._owner.release()

    # -- subscription ---------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join the share group for ``topics`` (not incremental: replaces the subscription; an
        empty list unsubscribes, as Java)."""
        topics = list(topics)
        if not topics:
            self.unsubscribe()
            return
        if any(not isinstance(t, str) or not t.strip() for t in topics):
            raise ValueError(f"topics to subscribe to must be non-empty names, got {topics!r}")
        with self._use():
            self._membership.subscribe(tuple(topics))
            self._metadata.set_wanted(set(topics))

    def subscription(self) -> set[str]:
        return set(self._membership.subscription)

    def unsubscribe(self) -> None:
        with self._use():
            self._close_sessions(time.monotonic() + self.config.default_api_timeout_ms / 1000)
            fut = self._membership.leave("the consumer unsubscribed")
            if fut is not None:
                self._drive(5.0, lambda: fut.done)
            self._membership.subscription = ()
            self._metadata.set_wanted(set())
            self._buffer.clear()

    def assignment(self) -> set[TopicPartition]:
        """The partitions the broker assigned to this member (others may share them)."""
        return set(self._membership.assignment()[0])

    @property
    def member_id(self) -> str:
        return self._membership.member_id

    def acquisition_lock_timeout_ms(self) -> int | None:
        """The acquisition lock timeout of the last records fetched, None before any."""
        return self._lock_timeout_ms

    def set_acknowledgement_commit_callback(self, callback: AcknowledgementCommitCallback | None) -> None:
        """``callback({partition: offsets}, exception or None)`` once per partition of every
        acknowledgement that completed, in the application thread, during the next ``poll``,
        ``commit_sync``, ``commit_async`` or ``close``."""
        with self._use():
            self._callback = callback
            if callback is None:
                self._results.clear()

    # -- poll -----------------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, list[ShareRecord]]:
        """Records acquired for this member, at most ``max_poll_records``, each with its
        ``delivery_count``."""
        if timeout_ms < 0:
            raise ValueError("timeout_ms must not be negative")
        with self._use():
            if not self._membership.subscription:
                raise ValueError("poll() needs a subscription: call subscribe() first")
            self._read_answers()
            self._run_callbacks()
            if self._explicit:
                left = self._inflight.unacknowledged()
                if left:
                    raise AcknowledgementError(
                        f"{left} record(s) returned by the last poll are not acknowledged; with "
                        "share_acknowledgement_mode='explicit' every record must be acknowledged "
                        "before the next poll (they still can be)")
            else:
                self._inflight.acknowledge_all(AcknowledgeType.ACCEPT)
            now = time.monotonic()
            deadline = now + timeout_ms / 1000
            self._membership.poll(now)
            while True:
                self._check_wakeup()
                self._membership.ensure_active(deadline, self._drive)
                self._update_metadata()
                self._read_answers()
                records = self._collect(time.monotonic())
                self._send_requests(time.monotonic(), fetch=not records)
                if records:
                    self._network.poll(0)
                    self._run_callbacks()
                    return records
                self._raise_pending_error()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._run_callbacks()
                    return {}
                # With a request out, its answer (or a new assignment) ends the wait; with none,
                # something it waits for (metadata, a connection, a join, an assignment) does
                # not wake this select: look again after retry_backoff_ms.
                membership, version = self._membership, self._membership.target_version
                self._network.poll(remaining if self._busy else min(remaining, self.config.retry_backoff_ms / 1000),
                                   until=lambda: bool(self._answered) or membership.target_version != version)

    def acknowledge(self, record: ShareRecord, kind: AcknowledgeType | int = AcknowledgeType.ACCEPT) -> None:
        """Settle a record the last ``poll`` returned (explicit mode).  The verdict goes out with
        the next poll's ShareFetch, or ``commit_sync``/``commit_async``; until then a second call
        replaces it.  RENEW extends the record's lock and the record comes back from a later poll."""
        with self._use():
            if not self._explicit:
                raise AcknowledgementError("acknowledge() needs share_acknowledgement_mode='explicit'; "
                                           "in implicit mode the next poll or commit accepts every record")
            kind = AcknowledgeType(kind)
            tp = TopicPartition(record.topic, record.partition)
            if not self._inflight.acknowledge(tp, record.offset, kind):
                raise AcknowledgementError(f"record {tp} offset {record.offset} cannot be acknowledged: the "
                                           "last poll did not return it, or its verdict was sent already")

    # -- commits --------------------------------------------------------------------------------

    def commit_sync(self, timeout_ms: int | None = None) -> dict[TopicPartition, Exception | None]:
        """Send every pending acknowledgement now (implicit mode: accept the last poll's records
        first) and wait for the answers: ``{partition: None, or why it failed}`` for every
        partition acknowledged.  ``KafkaTimeoutError`` if the answers do not come in time."""
        with self._use():
            self._read_answers()
            self._run_callbacks()
            if not self._explicit:
                self._inflight.acknowledge_all(AcknowledgeType.ACCEPT)
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            deadline = time.monotonic() + timeout / 1000
            results: dict[TopicPartition, Exception | None] = {}
            sent: list[_Sent] = []
            for tp, offsets in self._inflight.expire_all(time.monotonic()).items():
                self._report(_Result(tp, offsets, _expired(tp, offsets)), results)
            for node in sorted(self._inflight.nodes()):
                self._drive(max(0.0, deadline - time.monotonic()), lambda n=node: self._free(n))
                if node in self._busy:
                    raise KafkaTimeoutError(f"commit_sync: the request in flight to node {node} was not "
                                            f"answered within {timeout} ms")
                s = self._send_acknowledgements(node, time.monotonic(), results)
                if s is not None:
                    sent.append(s)
            self._drive(max(0.0, deadline - time.monotonic()), lambda: all(s.done for s in sent))
            self._read_answers()
            if not all(s.done for s in sent):
                raise KafkaTimeoutError(f"commit_sync: acknowledgements not answered within {timeout} ms")
            self._run_callbacks()
            return results

    def commit_async(self) -> None:
        """Send every pending acknowledgement (implicit mode: accept the last poll's records
        first) without waiting; results reach the acknowledgement commit callback."""
        with self._use():
            self._read_answers()
            self._run_callbacks()
            if not self._explicit:
                self._inflight.acknowledge_all(AcknowledgeType.ACCEPT)
            for tp, offsets in self._inflight.expire_all(time.monotonic()).items():
                self._report(_Result(tp, offsets, _expired(tp, offsets)))
            for node in sorted(self._inflight.nodes()):
                if node not in self._busy:
                    self._send_acknowledgements(node, time.monotonic(), None)
            self._network.poll(0)

    # -- lifecycle ------------------------------------------------------------------------------

    def wakeup(self) -> None:
        """Thread-safe: make a blocked (or the next) poll or commit raise WakeupError."""
        self._network.wakeup()

    def close(self, timeout_ms: int | None = None) -> None:
        """Send the last explicit acknowledgements and close every share session (the broker
        releases what else this member holds: in implicit mode, the last poll's records), leave
        the group, disconnect.  Wakeups are ignored from here on."""
        if self._closed:
            return
        with self._owner:
            self._closing = True
            try:
                timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
                deadline = time.monotonic() + min(timeout, self.config.request_timeout_ms) / 1000
                self._membership.close()
                try:
                    self._read_answers()
                    self._close_sessions(deadline)
                except Exception as exc:   # the leave still goes out
                    log.warning("share group %s: closing the share sessions failed: %s", self.config.group_id, exc)
                fut = self._membership.leave("the consumer is being closed")
                if fut is not None:
                    self._drive(max(0.0, min(deadline - time.monotonic(), 5.0)), lambda: fut.done)
                try:
                    self._run_callbacks()
                except Exception:
                    log.exception("acknowledgement commit callback raised during close")
            finally:
                self._closed = True
                self._network.close()

    def __enter__(self) -> "ShareConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals: fetching ------------------------------------------------------------------

    def _wanted_by_node(self) -> dict[int, dict[TopicPartition, uuid.UUID]]:
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

    def _send_requests(self, now: float, *, fetch: bool) -> None:
        """Per node, at most one request on its session: a ShareFetch (carrying the node's
        pending acknowledgements) when ``fetch`` and nothing fetched from it waits to be
        returned, else a ShareAcknowledge when acknowledgements wait (RENEWs always go alone)."""
        wanted = self._wanted_by_node() if self._membership.joined else {}
        buffered = {b.node for b in self._buffer}
        for node in sorted(set(wanted) | self._inflight.nodes()):
            if node in self._busy or not self._network.ready(node):
                continue
            session = self._sessions.setdefault(node, ShareSession(node))
            pending = self._inflight.pending(node)
            renew = self._inflight.renewing(node)
            if pending and session.open and (renew or not fetch or node in buffered or node not in wanted):
                self._send_acknowledgements(node, now, None)
            elif fetch and node in wanted and node not in buffered:
                self._send_fetch(node, wanted[node], now, None)

    def _send_fetch(self, node: int, wanted: dict[TopicPartition, uuid.UUID], now: float,
                    results: dict | None, max_wait_ms: int | None = None) -> _Sent:
        taken = self._inflight.take(node, now, renew=False)
        self._report_expired(taken, results)
        session = self._sessions.setdefault(node, ShareSession(node))
        request = session.build_fetch(wanted, taken.acks, {**self._topic_ids(), **taken.topic_ids})
        record_limit = self.share_config.acquire_mode is AcquireMode.RECORD_LIMIT
        body = {"group_id": self.config.group_id, "member_id": self._membership.member_id,
                "share_session_epoch": request.epoch,
                "max_wait_ms": self.config.fetch_max_wait_ms if max_wait_ms is None else max_wait_ms,
                "min_bytes": self.config.fetch_min_bytes, "max_bytes": self.config.fetch_max_bytes,
                "max_records": self.config.max_poll_records, "batch_size": self.config.max_poll_records,
                "share_acquire_mode": ACQUIRE_RECORD_LIMIT if record_limit else ACQUIRE_BATCH_OPTIMIZED,
                "topics": request.topics, "forgotten_topics_data": request.forgotten}
        return self._send(SHARE_FETCH, node, request, taken, body, results, min_version=2 if record_limit else None)

    def _send_acknowledgements(self, node: int, now: float, results: dict | None) -> _Sent | None:
        """A ShareAcknowledge of ``node``'s pending verdicts; with no session open there, a
        ShareFetch that opens one (and may acquire records, returned by the next poll)."""
        session = self._sessions.setdefault(node, ShareSession(node))
        if not session.open:
            wanted = self._wanted_by_node().get(node, {})
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
              min_version: int | None) -> _Sent:
        sent = _Sent(api, node, request, taken, time.monotonic(), results)
        self._busy[node] = sent
        fut = self._network.send(node, api, body, min_version=min_version,
                                 timeout_ms=self.config.request_timeout_ms + self.config.fetch_max_wait_ms)

        def answered(value) -> None:
            sent.value = value
            self._answered.append(sent)

        def failed(exc) -> None:
            sent.error = exc
            self._answered.append(sent)

        fut.add_callback(answered)
        fut.add_errback(failed)
        return sent

    def _topic_ids(self) -> dict[str, uuid.UUID]:
        return {name: t.topic_id for name, t in self._metadata.topics.items()}

    def _free(self, node: int) -> bool:
        self._read_answers()
        return node not in self._busy

    # -- internals: answers ---------------------------------------------------------------------

    def _read_answers(self) -> None:
        """Apply every answer that came (in the order they came), in the application thread."""
        while self._answered:
            sent = self._answered.popleft()
            self._busy.pop(sent.node, None)
            try:
                self._apply(sent)
            finally:
                sent.done = True

    def _apply(self, sent: _Sent) -> None:
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
            self._lock_timeout_ms = lock_ms
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

    def _acknowledged(self, sent: _Sent, tp: TopicPartition, code: int, deadline: float) -> None:
        taken = sent.taken
        error = None
        if code == Errors.INVALID_RECORD_STATE:
            error = InvalidRecordStateError(
                f"{tp}: the broker refused the acknowledgement of offsets {_ranges(taken.shown.get(tp, ()))}: "
                "the records are no longer held by this member (their lock ran out)")
        elif code != Errors.NONE:
            error = BrokerError(code, f"acknowledging {tp}")
        renewing = taken.renewing.get(tp)
        if renewing:
            if error is None and deadline > sent.sent_at:
                # Renewed: the records come back from a later poll, under the new lock.
                records = [h.record for _, h in sorted(renewing.items())]
                held = next(iter(renewing.values()))
                self._buffer.appendleft(_Buffered(tp, held.node, held.topic_id, deadline, records))
        if tp in taken.shown:
            self._report(_Result(tp, set(taken.shown[tp]), error), sent.results)

    def _fetched(self, sent: _Sent, tp: TopicPartition, topic_id: uuid.UUID, p: dict, deadline: float) -> None:
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
                                   max_uncompressed=self.config.max_uncompressed_batch_bytes)
        if decoded.settled:
            self._inflight.settle(tp, decoded.settled, sent.node, topic_id, deadline)
        if decoded.records:
            self._buffer.append(_Buffered(tp, sent.node, topic_id, deadline, decoded.records))
        if decoded.error is not None and self._pending_error is None:
            self._pending_error = decoded.error

    def _fail_all(self, taken: Taken, results: dict | None, error: Exception) -> None:
        for tp, offsets in taken.shown.items():
            self._report(_Result(tp, set(offsets), error), results)

    def _report_expired(self, taken: Taken, results: dict | None) -> None:
        for tp, offsets in taken.expired.items():
            self._report(_Result(tp, offsets, _expired(tp, offsets)), results)

    def _report(self, result: _Result, results: dict | None = None) -> None:
        if results is not None and results.get(result.partition) is None:
            results[result.partition] = result.error
        if self._callback is not None:
            self._results.append(result)

    def _run_callbacks(self) -> None:
        """The acknowledgement commit callback, once per completed partition; the first error it
        raises is raised here once every result was handed over."""
        results, self._results = self._results, []
        callback = self._callback
        if callback is None:
            return
        first: BaseException | None = None
        self._in_callback = True
        try:
            for r in results:
                try:
                    callback({r.partition: r.offsets}, r.error)
                except Exception as exc:
                    log.exception("acknowledgement commit callback raised")
                    first = first or exc
        finally:
            self._in_callback = False
        if first is not None:
            raise first

    def _collect(self, now: float) -> dict[TopicPartition, list[ShareRecord]]:
        """Up to ``max_poll_records`` buffered records; records whose lock ran out are dropped
        (the broker has given them back to the group)."""
        out: dict[TopicPartition, list[ShareRecord]] = {}
        room = self.config.max_poll_records
        while self._buffer and room > 0:
            b = self._buffer[0]
            if now >= b.deadline:
                self._buffer.popleft()
                left = b.records[b.pos:]
                log.info("share group %s: %d record(s) of %s (offsets %s) were not returned: their lock ran "
                         "out before a poll could return them", self.config.group_id, len(left), b.tp,
                         _ranges(r.offset for r in left))
                continue
            chunk = b.records[b.pos:b.pos + room]
            b.pos += len(chunk)
            room -= len(chunk)
            out.setdefault(b.tp, []).extend(chunk)
            self._inflight.deliver(b.tp, chunk, b.node, b.topic_id, b.deadline)
            if b.pos >= len(b.records):
                self._buffer.popleft()
        return out

    def _raise_pending_error(self) -> None:
        error, self._pending_error = self._pending_error, None
        if error is not None:
            raise error

    # -- internals: the rest ------------------------------------------------------------------

    def _close_sessions(self, deadline: float) -> None:
        """The closing ShareAcknowledge (epoch -1) on every open session, with the explicit
        verdicts still to send; waits for the answers until ``deadline``."""
        self._inflight.forget_delivered()
        closing: list[_Sent] = []
        for node, session in sorted(self._sessions.items()):
            self._drive(max(0.0, deadline - time.monotonic()), lambda n=node: self._free(n))
            if node in self._busy or not session.open:
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
        self._drive(max(0.0, deadline - time.monotonic()), lambda: all(s.done for s in closing))
        self._read_answers()
        self._sessions.clear()
        self._buffer.clear()

    def _update_metadata(self) -> None:
        now = time.monotonic()
        auth = self._network.auth_error()
        if auth is not None:
            raise auth
        self._metadata.maybe_update(self._network, now)
        if not self._metadata.version and now - self._started > self.config.default_api_timeout_ms / 1000:
            self._started = now
            error = self._network.last_connection_error()
            raise NoBrokersAvailableError(
                f"no broker of {', '.join(self.config.bootstrap_servers)} answered within "
                f"default_api_timeout_ms={self.config.default_api_timeout_ms}"
                + (f"; last connection error: {error}" if error else ""))
        for topic in (set(self._membership.subscription) & self._metadata.missing_topics) - self._warned_missing:
            log.warning("topic %s does not exist (yet); waiting for it", topic)
            self._warned_missing.add(topic)

    def _check_wakeup(self) -> None:
        if self._network.clear_wakeup() and not self._closing:
            raise WakeupError("interrupted by wakeup()")

    def _drive(self, timeout_s: float, until) -> None:
        self._check_wakeup()
        self._metadata.maybe_update(self._network)
        def settled() -> bool:
            self._read_answers()   # what callers wait for is applied here, in this thread
            return until()
        self._network.poll(timeout_s, until=settled)
        self._read_answers()
        self._check_wakeup()


def _expired(tp: TopicPartition, offsets) -> InvalidRecordStateError:
    return InvalidRecordStateError(
        f"{tp}: the acquisition lock of offsets {_ranges(offsets)} ran out before the acknowledgement "
        "was sent; it was not sent (the broker gives the records to the group again, maybe to another member)")


def _as_error(exc: BaseException) -> Exception:
    return exc if isinstance(exc, Exception) else KafkaClientError(str(exc))


def _ranges(offsets) -> str:
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
