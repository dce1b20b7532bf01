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

One thread uses a consumer at a time; ``wakeup()`` may be called from any thread.  The requests
on the share sessions and what their answers do are ``exchange.py``'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import contextmanager

from ..errors import AcknowledgementError, ConsumerClosedError, KafkaTimeoutError, NoBrokersAvailableError, WakeupError
from ..metadata import ClusterMetadata
from ..metrics import ShareConsumerMetrics
from ..network import NetworkClient
from ..owner import owned
from ..types import TopicPartition
from .acknowledgements import InFlight
from .config import ShareConsumerConfig
from .exchange import Result, Sent, ShareExchange
from .membership import ShareMembership
from .types import AcknowledgementMode, AcknowledgeType, ShareRecord

log = logging.getLogger(__name__)

AcknowledgementCommitCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], None]


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
        self._exchange = ShareExchange(config, self.share_config.acquire_mode, self._network, self._metadata,
                                       self._membership, self._inflight, self._report)
        self._results: list[Result] = []            # for the acknowledgement commit callback
        self._callback: AcknowledgementCommitCallback | None = None
        self._in_callback = False
        self._telemetry = None
        if config.enable_metrics_push:
            from ..telemetry import ClientTelemetry
            self._telemetry = ClientTelemetry(self._network, self._telemetry_points, self._telemetry_resource)
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
        with owned(self._owner, "ShareConsumer"):
            yield

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
            self._exchange.close_sessions(time.monotonic() + self.config.default_api_timeout_ms / 1000, self._drive)
            fut = self._membership.leave("the consumer unsubscribed")
            if fut is not None:
                self._drive(5.0, lambda: fut.done)
            self._membership.subscription = ()
            self._metadata.set_wanted(set())
            self._exchange.buffer.clear()

    def assignment(self) -> set[TopicPartition]:
        """The partitions the broker assigned to this member (others may share them)."""
        return set(self._membership.assignment()[0])

    @property
    def member_id(self) -> str:
        return self._membership.member_id

    def acquisition_lock_timeout_ms(self) -> int | None:
        """The acquisition lock timeout of the last records fetched, None before any."""
        return self._exchange.lock_timeout_ms

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
            self._exchange.read_answers()
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
                if self._telemetry is not None:
                    self._telemetry.maybe_send()
                self._membership.ensure_active(deadline, self._drive)
                self._update_metadata()
                self._exchange.read_answers()
                records = self._exchange.collect(time.monotonic())
                self._exchange.send_requests(time.monotonic(), fetch=not records)
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
                self._network.poll(remaining if self._exchange.busy else min(remaining, self.config.retry_backoff_ms / 1000),
                                   until=lambda: bool(self._exchange.answered) or membership.target_version != version)

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
            self._exchange.read_answers()
            self._run_callbacks()
            if not self._explicit:
                self._inflight.acknowledge_all(AcknowledgeType.ACCEPT)
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            deadline = time.monotonic() + timeout / 1000
            results: dict[TopicPartition, Exception | None] = {}
            sent: list[Sent] = []
            self._exchange.report_expired(self._inflight.expire_all(time.monotonic()), results)
            for node in sorted(self._inflight.nodes()):
                self._drive(max(0.0, deadline - time.monotonic()), lambda n=node: self._exchange.free(n))
                if node in self._exchange.busy:
                    raise KafkaTimeoutError(f"commit_sync: the request in flight to node {node} was not "
                                            f"answered within {timeout} ms")
                s = self._exchange.send_acknowledgements(node, time.monotonic(), results)
                if s is not None:
                    sent.append(s)
            self._drive(max(0.0, deadline - time.monotonic()), lambda: all(s.done for s in sent))
            self._exchange.read_answers()
            if not all(s.done for s in sent):
                raise KafkaTimeoutError(f"commit_sync: acknowledgements not answered within {timeout} ms")
            self._run_callbacks()
            return results

    def commit_async(self) -> None:
        """Send every pending acknowledgement (implicit mode: accept the last poll's records
        first) without waiting; results reach the acknowledgement commit callback."""
        with self._use():
            self._exchange.read_answers()
            self._run_callbacks()
            if not self._explicit:
                self._inflight.acknowledge_all(AcknowledgeType.ACCEPT)
            self._exchange.report_expired(self._inflight.expire_all(time.monotonic()), None)
            for node in sorted(self._inflight.nodes()):
                if node not in self._exchange.busy:
                    self._exchange.send_acknowledgements(node, time.monotonic(), None)
            self._network.poll(0)

    # -- metrics --------------------------------------------------------------------------------

    def metrics(self) -> ShareConsumerMetrics:
        """A frozen snapshot of the member's counters (``ShareConsumerMetrics`` says what each
        counts).  Any thread; the figures are as of the last answer applied."""
        return self._exchange.counters.snapshot()

    def _telemetry_points(self, wire):
        from ..telemetry_metrics import share_points
        return share_points(self.metrics(), wire)

    def _telemetry_resource(self) -> dict[str, str]:
        out = {"group_id": self.config.group_id}
        if self.member_id:
            out["group_member_id"] = self.member_id
        if self.config.client_rack:
            out["client_rack"] = self.config.client_rack
        return out

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
                    self._exchange.read_answers()
                    self._exchange.close_sessions(deadline, self._drive)
                except Exception as exc:   # the leave still goes out
                    log.warning("share group %s: closing the share sessions failed: %s", self.config.group_id, exc)
                fut = self._membership.leave("the consumer is being closed")
                if fut is not None:
                    self._drive(max(0.0, min(deadline - time.monotonic(), 5.0)), lambda: fut.done)
                try:
                    self._run_callbacks()
                except Exception:
                    log.exception("acknowledgement commit callback raised during close")
                if self._telemetry is not None:   # the terminating push (KIP-714)
                    self._telemetry.close(deadline, self._drive)
            finally:
                self._closed = True
                self._network.close()

    def __enter__(self) -> "ShareConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _report(self, result: Result, results: dict | None = None) -> None:
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

    def _raise_pending_error(self) -> None:
        error, self._exchange.pending_error = self._exchange.pending_error, None
        if error is not None:
            raise error

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
            self._exchange.read_answers()   # what callers wait for is applied here, in this thread
            return until()
        self._network.poll(timeout_s, until=settled)
        self._exchange.read_answers()
        self._check_wakeup()
