"""The Fetcher, after the Java consumer's (seeds 000 and 001).

``send_fetches`` builds one Fetch request per node for every fetchable partition whose node has
no fetch in flight and no undrained data buffered here; responses land, per partition, as
``CompletedFetch`` objects in a queue; ``fetched_records`` drains that queue up to
``max_poll_records``, checking first that each completed fetch still matches the partition's
position (a seek, pause or reassignment since the request makes it stale, and it is dropped).

Positions advance as records are handed out, past records the header filter dropped, past
control batches and aborted transactions: after a batch is fully drained the position is the
batch's last offset + 1 even if none of its records was returned (seed 004).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field

from ..protocol.apis import FETCH
from ..protocol.errors import BrokerError, CorruptRecordError, Errors
from ..protocol.primitives import ZERO_UUID
from ..protocol.records import ConsumerRecord, RecordSetReader, record_set_end_offset
from .config import ConsumerConfig
from .errors import OffsetOutOfRangeError, RecordTooLargeError
from .fetch_session import FetchRequestData, FetchSessionHandler, PartitionFetch
from .metadata import ClusterMetadata
from .network import NetworkClient
from .subscription import SubscriptionState
from .types import TopicPartition
from .validation import PositionValidator

NO_FETCHED_EPOCH = -1   # the last_fetched_epoch of every Fetch (see send_fetches)

log = logging.getLogger(__name__)

# Partition errors that mean "our idea of the leader is out of date": refresh metadata, retry.
_REFRESH_METADATA = {
    Errors.NOT_LEADER_OR_FOLLOWER, Errors.REPLICA_NOT_AVAILABLE, Errors.KAFKA_STORAGE_ERROR,
    Errors.FENCED_LEADER_EPOCH, Errors.OFFSET_NOT_AVAILABLE, Errors.UNKNOWN_TOPIC_OR_PARTITION,
    Errors.UNKNOWN_TOPIC_ID, Errors.INCONSISTENT_TOPIC_ID, Errors.LEADER_NOT_AVAILABLE,
}
_SESSION_ERRORS = {Errors.FETCH_SESSION_ID_NOT_FOUND, Errors.INVALID_FETCH_SESSION_EPOCH,
                   Errors.FETCH_SESSION_TOPIC_ID_ERROR}


@dataclass
class FetchStats:
    """Counters the consumer exposes through ``metrics()``."""

    records: int = 0
    bytes: int = 0
    filtered: int = 0
    control: int = 0
    aborted: int = 0
    requests: int = 0
    responses: int = 0
    errors: int = 0
    latency_ms_total: float = 0.0
    latency_ms_max: float = 0.0
    per_partition_records: dict = field(default_factory=dict)
    per_partition_filtered: dict = field(default_factory=dict)
    per_partition_bytes: dict = field(default_factory=dict)
    requests_per_node: dict = field(default_factory=dict)


class CompletedFetch:
    """One partition's answer from one Fetch response, drained lazily, batch by batch."""

    __slots__ = ("tp", "fetch_offset", "data", "reader", "_buffered", "_batch_next", "initialized",
                 "consumed", "error_code", "size", "_pending_error", "_end", "last_epoch", "fetched_epoch")

    def __init__(self, tp: TopicPartition, fetch_offset: int, data: dict, size: int,
                 fetched_epoch: int = -1) -> None:
        self.tp = tp
        self.fetch_offset = fetch_offset
        self.data = data
        self.reader: RecordSetReader | None = None
        self._buffered: list[ConsumerRecord] = []
        self._batch_next = fetch_offset
        self.initialized = False
        self.consumed = False
        self.error_code = data["error_code"]
        self.size = size
        self._pending_error: CorruptRecordError | None = None
        self._end: int | None | bool = False  # False: not computed yet
        # Leader epoch of the batch the position is in or after once take() returned (Java's
        # lastEpoch): taken from every batch read, filtered, control or aborted ones included.
        self.last_epoch: int | None = None
        # The last_fetched_epoch the request carried: a diverging_epoch answer is about that one.
        self.fetched_epoch = fetched_epoch

    def end_offset(self) -> int | None:
        """Where the position will be after this answer is drained, if it can be known now."""
        if self.error_code or self.size == 0 or self._pending_error is not None:
            return None
        if self._end is False:
            end = record_set_end_offset(self.data["records"])
            self._end = end if end is not None and end > self.fetch_offset else None
        return self._end

    def take(self, max_records: int) -> tuple[list[ConsumerRecord], int]:
        """Up to ``max_records`` records and the position after them.

        A corrupt batch raises only once the good records before it were handed out: they are
        returned first and the error comes with the next call, as the Java consumer does.
        """
        if self._pending_error is not None:
            raise self._pending_error
        out: list[ConsumerRecord] = []
        reader = self.reader
        position = self.fetch_offset
        while len(out) < max_records:
            if not self._buffered:
                if reader is None:
                    self.consumed = True
                    break
                try:
                    batch = reader.read_batch()
                except CorruptRecordError as exc:
                    if not out:
                        raise
                    self._pending_error = exc
                    break
                if batch is None:
                    self.consumed = True
                    position = max(position, reader.next_offset)
                    break
                self._buffered = batch
                self._batch_next = reader.next_offset
                info = reader.last_batch
                if info is not None and info.leader_epoch >= 0:
                    self.last_epoch = info.leader_epoch
                if not batch:
                    position = max(position, self._batch_next)
                    continue
            room = max_records - len(out)
            if len(self._buffered) <= room:
                out += self._buffered
                self._buffered = []
                position = max(position, self._batch_next)
            else:
                out += self._buffered[:room]
                self._buffered = self._buffered[room:]
                position = out[-1].offset + 1
        self.fetch_offset = position
        return out, position


class Fetcher:
    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata,
                 subscriptions: SubscriptionState, validator: PositionValidator | None = None) -> None:
        self.config = config
        self.network = network
        self.metadata = metadata
        self.subscriptions = subscriptions
        self.validator = validator or PositionValidator(config, network, metadata, subscriptions)
        self.completed: deque[CompletedFetch] = deque()
        self._next_in_line: CompletedFetch | None = None
        self._sessions: dict[int, FetchSessionHandler] = {}
        # When a leader last named each partition's preferred read replica (KIP-392).
        self._replica_named_at: dict[TopicPartition, float] = {}
        self._pending_nodes: set[int] = set()
        self._partition_max_bytes: dict[TopicPartition, int] = {}
        self.stats = FetchStats()
        self.last_fetch_request_size = 0
        self.waiting_for_nodes = False
        self._isolation = 1 if config.read_committed else 0

    # -- sending --------------------------------------------------------------------------------

    def _undrained(self) -> list[CompletedFetch]:
        """The answers not yet drained, oldest first, copied under the client's lock.

        A copy, because the heartbeat thread's network poll may complete a fetch, appending to
        ``completed``, between two steps of a look at it: iterating the deque itself then
        failed with "deque mutated during iteration" (seen in a leader-kill test)."""
        with self.network.lock:
            pending = list(self.completed)
        if self._next_in_line is not None and not self._next_in_line.consumed:
            pending.insert(0, self._next_in_line)
        return pending

    def _buffered_partitions(self) -> dict[TopicPartition, int | None]:
        """Partitions with undrained data → the offset a fetch-ahead may start from (None: no
        fetch-ahead for it: an error, an empty answer, or already one answer queued behind)."""
        out: dict[TopicPartition, int | None] = {}
        for cf in self._undrained():
            if cf.tp in out:
                out[cf.tp] = None  # at most one answer fetched ahead per partition
                continue
            out[cf.tp] = cf.end_offset()
        return out

    def _buffered_bytes(self) -> int:
        return sum(cf.size for cf in self._undrained())

    def _fetch_node(self, tp: TopicPartition, st, now: float) -> int | None:
        """The partition's preferred read replica while it serves, else its leader (Java's
        selectReadReplica).  A replica is dropped when it is missing from metadata (which is then
        refreshed), when its time is up, and when a connection to it failed after the leader
        named it (Java's handleFetchFailure): the leader decides again, and may name it again
        once it is back in the ISR.  While its reconnect backoff runs the fetch waits for it
        (the leader would only redirect again); a failure from before the naming is no reason to
        avoid it, or a follower that once went down would never be read from again."""
        replica = st.preferred_read_replica
        if replica is not None:
            known = replica in self.metadata.brokers
            failed = self.network.connection_failed_at(replica) > self._replica_named_at.get(tp, 0.0)
            if now < st.preferred_read_replica_expiry and known and not failed:
                return replica
            if not known:
                self.metadata.request_update()
            st.preferred_read_replica = None
        return self.metadata.leader_for(tp)

    def send_fetches(self) -> int:
        """Send a Fetch to every node that has fetchable partitions and none in flight.

        ``waiting_for_nodes`` tells the caller that some partition could not be fetched only
        because its leader is unknown or not connected yet: it should not wait long for data.

        Runs under the client's lock, which the heartbeat thread holds while its network poll
        completes fetches: an answer is handled (its session updated, its data queued) either
        wholly before or wholly after the requests are built, as Java's synchronized Fetcher.
        """
        with self.network.lock:
            return self._send_fetches()

    def _send_fetches(self) -> int:
        # A leader change since the last check puts positions with an epoch into validation
        # (KIP-320): they are not fetched until the new leader confirmed them.
        self.validator.check_leaders()
        now = time.monotonic()
        buffered = self._buffered_partitions()
        # Fetch-ahead (what librdkafka's prefetching does, where the Java consumer idles): a
        # partition whose buffered answer is still being drained is asked for the data after
        # it, from that answer's last complete batch, so a node is never left with only
        # caught-up partitions to long-poll on while others have more.  One answer ahead per
        # partition at most, and not past fetch_buffer_bytes buffered in all.
        ahead_allowed = self._buffered_bytes() < self.config.fetch_buffer_bytes
        per_node: dict[int, dict[TopicPartition, PartitionFetch]] = {}
        held_back: set[int] = set()
        self.waiting_for_nodes = False
        for tp in self.subscriptions.fetchable():
            st = self.subscriptions.state(tp)
            fetch_offset = st.position
            if tp in buffered:
                fetch_offset = buffered[tp] if ahead_allowed else None
                if fetch_offset is None:
                    node = self._fetch_node(tp, st, now)
                    if node is not None:
                        held_back.add(node)
                    continue
            node = self._fetch_node(tp, st, now)
            if node is None:
                self.metadata.request_update()
                self.waiting_for_nodes = True
                continue
            if node in self._pending_nodes:
                continue
            # last_fetched_epoch -1, as the Java consumer sends (AbstractFetch: Optional.empty()):
            # truncation is found by validating positions with OffsetForLeaderEpoch after a
            # leader change (validation.py).  Sent, it makes the broker check divergence on every
            # fetch, and a fetch-ahead carrying an epoch older than its offset's got a
            # diverging_epoch for a truncation that never happened.
            per_node.setdefault(node, {})[tp] = PartitionFetch(
                self.metadata.topic_id(tp.topic), fetch_offset, -1,
                self._partition_max_bytes.get(tp, self.config.max_partition_fetch_bytes),
                self.metadata.leader_epoch(tp), NO_FETCHED_EPOCH)
        sent = 0
        for node, wanted in per_node.items():
            if node in held_back:
                # Some of this node's partitions have data waiting to be drained and may not
                # fetch further yet.  A Fetch of the others now would be one of caught-up
                # partitions, which the broker holds for fetch_max_wait_ms, and the held-back
                # partitions could not be fetched until it returns: a stall at the end of
                # every partition.  Fetch them all together once the buffer has drained.
                continue
            if not self.network.ready(node):
                self.waiting_for_nodes = True
                continue
            self._send_to(node, wanted, now)
            sent += 1
        return sent

    def _send_to(self, node: int, wanted: dict[TopicPartition, PartitionFetch], now: float) -> None:
        uses_ids = all(pf.topic_id != ZERO_UUID for pf in wanted.values())
        max_version = None if uses_ids else 12
        try:
            version = self.network.api_version(node, FETCH, max_version=max_version)
        except Exception as exc:  # no usable Fetch version: permanent for this broker
            log.error("cannot fetch from node %s: %s", node, exc)
            return
        uses_ids = version >= 13
        session = self._sessions.setdefault(node, FetchSessionHandler(node))
        req = session.build(wanted, uses_ids)
        body = self._request_body(req, uses_ids)
        self._pending_nodes.add(node)
        self.stats.requests += 1
        self.stats.requests_per_node[node] = self.stats.requests_per_node.get(node, 0) + 1
        fut = self.network.send(node, FETCH, body, min_version=version, max_version=version,
                                timeout_ms=self.config.request_timeout_ms + self.config.fetch_max_wait_ms)
        fut.add_callback(lambda value: self._on_response(node, req, now, value))
        fut.add_errback(lambda exc: self._on_failure(node, req, exc))

    def _request_body(self, req: FetchRequestData, uses_ids: bool) -> dict:
        topics: dict[str, list] = {}
        for tp, pf in req.to_send.items():
            topics.setdefault(tp.topic, []).append({
                "partition": tp.partition, "current_leader_epoch": pf.current_leader_epoch,
                "fetch_offset": pf.fetch_offset, "last_fetched_epoch": pf.last_fetched_epoch,
                "log_start_offset": pf.log_start_offset, "partition_max_bytes": pf.max_bytes})
        forgotten: dict[tuple, list] = {}
        for tp in req.to_forget:
            topic_id = req.forgotten_topic_ids.get(tp, ZERO_UUID) if uses_ids else ZERO_UUID
            forgotten.setdefault((tp.topic, topic_id), []).append(tp.partition)
        tid = self.metadata.topic_id
        session_ids = {tp.topic: pf.topic_id for tp, pf in req.session_partitions.items()}
        known_id = lambda t: session_ids.get(t) or tid(t)  # noqa: E731
        body = self.last_request_body = {
            "replica_id": -1,
            "max_wait_ms": self.config.fetch_max_wait_ms,
            "min_bytes": self.config.fetch_min_bytes,
            "max_bytes": self.config.fetch_max_bytes,
            "isolation_level": self._isolation,
            "session_id": req.session_id,
            "session_epoch": req.epoch,
            "topics": [{"topic": t, "topic_id": known_id(t) if uses_ids else ZERO_UUID, "partitions": ps}
                       for t, ps in topics.items()],
            "forgotten_topics_data": [{"topic": t, "topic_id": topic_id, "partitions": ps}
                                      for (t, topic_id), ps in forgotten.items()],
            "rack_id": self.config.client_rack,
        }
        return body

    def _on_failure(self, node: int, req: FetchRequestData, exc: BaseException) -> None:
        self._pending_nodes.discard(node)
        self.stats.errors += 1
        session = self._sessions.get(node)
        if session is not None:
            session.handle_error()
        log.debug("fetch from node %s failed: %s", node, exc)
        self.metadata.request_update()

    def _on_response(self, node: int, req: FetchRequestData, sent_at: float, value) -> None:
        self._pending_nodes.discard(node)
        version, body = value
        latency = (time.monotonic() - sent_at) * 1000
        self.stats.responses += 1
        self.stats.latency_ms_total += latency
        self.stats.latency_ms_max = max(self.stats.latency_ms_max, latency)
        session = self._sessions.setdefault(node, FetchSessionHandler(node))
        top_error = body["error_code"]
        if top_error:
            self.stats.errors += 1
        if not session.handle_response(req, top_error, body["session_id"]):
            if top_error and top_error not in _SESSION_ERRORS:
                log.warning("fetch from node %s: %s", node, BrokerError(top_error, "Fetch"))
                self.metadata.request_update()
            return
        names = self.metadata.topic_names
        for topic in body["responses"]:
            name = topic["topic"] if version < 13 else names.get(topic["topic_id"])
            if name is None:
                self.metadata.request_update()
                continue
            for p in topic["partitions"]:
                tp = TopicPartition(name, p["partition_index"])
                pf = req.session_partitions.get(tp)
                if pf is None:
                    continue
                records = p["records"]
                size = 0 if records is None else len(records)
                self.stats.bytes += size
                self.stats.per_partition_bytes[tp] = self.stats.per_partition_bytes.get(tp, 0) + size
                self.completed.append(CompletedFetch(tp, pf.fetch_offset, p, size, pf.last_fetched_epoch))
                leader = p.get("current_leader") or {}
                if leader.get("leader_id", -1) >= 0:
                    self.metadata.update_leader(tp, leader["leader_id"], leader["leader_epoch"])
        for endpoint in body.get("node_endpoints") or ():
            if endpoint["node_id"] not in self.metadata.brokers:
                self.metadata.request_update()

    # -- draining -------------------------------------------------------------------------------

    def has_completed(self) -> bool:
        return bool(self.completed) or (self._next_in_line is not None and not self._next_in_line.consumed)

    def fetched_records(self, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Drain buffered fetches into at most ``max_records`` records, advancing positions.

        An error (out of range, corrupt batch, ...) is raised only when no records were collected
        yet: otherwise the records go out first and the erroring fetch raises on the next call,
        as in Java, because their positions have already advanced.
        """
        remaining = self.config.max_poll_records if max_records is None else max_records
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        paused: list[CompletedFetch] = []
        try:
            while remaining > 0:
                cf = self._next_in_line
                if cf is None or cf.consumed:
                    if not self.completed:
                        break
                    cf = self.completed.popleft()
                    if not cf.initialized:
                        try:
                            usable = self._initialize(cf)
                        except Exception:
                            if out:
                                self.completed.appendleft(cf)
                                break
                            raise
                        if not usable:
                            self._next_in_line = None
                            continue
                        # Once only: a fetch parked while its partition was paused resumes where it
                        # stopped; a fresh reader would hand its undrained batch out twice.
                        cf.initialized = True
                    self._next_in_line = cf
                tp = cf.tp
                if not self.subscriptions.is_assigned(tp):
                    cf.consumed = True
                    continue
                st = self.subscriptions.state(tp)
                if st.paused:
                    # Keep it for when the partition resumes (Java parks it the same way) and go on
                    # with the other partitions, whose fetches may sit behind it.
                    self._next_in_line = None
                    paused.append(cf)
                    continue
                if st.position != cf.fetch_offset:
                    cf.consumed = True  # a seek happened while this was buffered
                    continue
                if st.awaiting_validation:
                    # Fetched before a leader change: dropped (as Java drains it), fetched again
                    # once the new leader confirmed the position.
                    cf.consumed = True
                    continue
                before_filtered = cf.reader.filtered if cf.reader else 0
                try:
                    records, position = cf.take(remaining)
                except CorruptRecordError as exc:
                    if out:
                        cf._pending_error = exc
                        break
                    # The position stays at the corrupt batch: nothing past it is skipped silently,
                    # and the next poll fetches and raises again until the operator seeks past it.
                    cf.consumed = True
                    raise exc.located(tp.topic, tp.partition) if exc.topic is None else exc
                st.position = position
                if cf.last_epoch is not None:
                    st.position_epoch = cf.last_epoch
                if records:
                    out.setdefault(tp, []).extend(records)
                    remaining -= len(records)
                    n = len(records)
                    self.stats.records += n
                    self.stats.per_partition_records[tp] = self.stats.per_partition_records.get(tp, 0) + n
                if cf.reader is not None:
                    dropped = cf.reader.filtered - before_filtered
                    if dropped:
                        self.stats.filtered += dropped
                        self.stats.per_partition_filtered[tp] = self.stats.per_partition_filtered.get(tp, 0) + dropped
                if cf.consumed and cf.reader is not None:
                    self.stats.control += cf.reader.control
                    self.stats.aborted += cf.reader.aborted
        finally:
            self.completed.extend(paused)
        return out

    def _initialize(self, cf: CompletedFetch) -> bool:
        """Check a completed fetch against the partition's state; False means discard it."""
        tp = cf.tp
        if not self.subscriptions.is_assigned(tp):
            return False
        st = self.subscriptions.state(tp)
        if st.position is None or st.position != cf.fetch_offset or st.awaiting_validation:
            log.debug("discarding stale fetch of %s at %s (position %s)", tp, cf.fetch_offset, st.position)
            return False
        p = cf.data
        code = cf.error_code
        if code == Errors.NONE:
            if p["high_watermark"] >= 0:
                st.high_watermark = p["high_watermark"]
            if p.get("last_stable_offset", -1) >= 0:
                st.last_stable_offset = p["last_stable_offset"]
            if p.get("log_start_offset", -1) >= 0:
                st.log_start_offset = p["log_start_offset"]
            diverging = p.get("diverging_epoch")
            if diverging is not None and (diverging["epoch"] >= 0 or diverging["end_offset"] >= 0):
                # The leader's log does not hold the epoch the request named up to its offset
                # (we send -1, so a broker should not say this): decided as a validation answer.
                self.validator.on_diverging_epoch(tp, cf.fetch_offset, cf.fetched_epoch,
                                                  diverging["epoch"], diverging["end_offset"])
                return False
            replica = p.get("preferred_read_replica", -1)
            if replica >= 0 and replica != st.preferred_read_replica:
                st.preferred_read_replica = replica
                now = self._replica_named_at[tp] = time.monotonic()
                st.preferred_read_replica_expiry = now + self.config.metadata_max_age_ms / 1000
                return False  # the records come from the replica; this answer has none
            aborted = None
            if self.config.read_committed:
                aborted = [(a["producer_id"], a["first_offset"]) for a in (p.get("aborted_transactions") or ())]
            cf.reader = RecordSetReader(
                p["records"], topic=tp.topic, partition=tp.partition, fetch_offset=cf.fetch_offset,
                header_filter=self.config.header_filter, check_crcs=self.config.check_crcs,
                aborted_transactions=aborted, on_filtered=self.config.on_filtered,
                max_uncompressed_batch_bytes=self.config.max_uncompressed_batch_bytes)
            self._check_progress(cf)
            return True
        self.stats.errors += 1
        if code in _REFRESH_METADATA:
            log.debug("fetch of %s: %s; refreshing metadata", tp, BrokerError(code))
            st.preferred_read_replica = None
            self.metadata.request_update()
            return False
        if code == Errors.OFFSET_OUT_OF_RANGE:
            st.preferred_read_replica = None
            if self.config.auto_offset_reset == "none":
                raise OffsetOutOfRangeError({tp: cf.fetch_offset})
            log.info("fetch offset %s of %s is out of range; resetting to %s", cf.fetch_offset, tp,
                     self.config.auto_offset_reset)
            self.subscriptions.request_reset(tp)
            return False
        if code == Errors.TOPIC_AUTHORIZATION_FAILED:
            raise BrokerError(code, f"Fetch {tp}")
        if code == Errors.UNKNOWN_LEADER_EPOCH:
            return False  # our metadata is ahead of the broker: retry as is
        if code == Errors.CORRUPT_MESSAGE:
            raise CorruptRecordError("broker reported CORRUPT_MESSAGE", topic=tp.topic,
                                     partition=tp.partition, offset=cf.fetch_offset)
        log.warning("fetch of %s: %s", tp, BrokerError(code))
        return False

    def _check_progress(self, cf: CompletedFetch) -> None:
        """A response that holds bytes but not one complete batch: the batch is bigger than
        what we asked for.  Grow the per-partition limit (up to fetch_max_bytes) rather than
        ask the same question forever."""
        reader = cf.reader
        if reader is None or cf.size == 0:
            return
        data = cf.data["records"]
        if len(data) < 12:
            return
        import struct
        length = struct.unpack_from(">i", data, 8)[0]
        if 12 + length <= len(data):
            return
        tp = cf.tp
        current = self._partition_max_bytes.get(tp, self.config.max_partition_fetch_bytes)
        if current >= self.config.fetch_max_bytes and 12 + length > self.config.fetch_max_bytes:
            raise RecordTooLargeError(
                f"{tp} at offset {cf.fetch_offset} holds a {12 + length}-byte batch, larger than "
                f"fetch_max_bytes={self.config.fetch_max_bytes}; raise fetch_max_bytes")
        self._partition_max_bytes[tp] = min(self.config.fetch_max_bytes, max(current * 2, 12 + length))

    def clear_buffered(self, partitions=None) -> None:
        """Forget buffered data (after a seek or revocation), for all or some partitions."""
        if partitions is None:
            self.completed.clear()
            self._next_in_line = None
            return
        parts = set(partitions)
        with self.network.lock:  # an answer completed meanwhile by the heartbeat thread stays
            self.completed = deque(cf for cf in self.completed if cf.tp not in parts)
        if self._next_in_line is not None and self._next_in_line.tp in parts:
            self._next_in_line = None

    def close_sessions(self) -> list:
        """Send every open fetch session its closing request (see
        ``FetchSessionHandler.build_close``) and forget the sessions; return the futures so
        the caller can wait for the answers before it disconnects.  A node that is not
        connected is skipped, as in Java: a broker that lost the connection may still hold the
        session until it evicts it, which costs it a cache slot, not us a record.
        """
        futures = []
        for node, session in self._sessions.items():
            uses_ids = session.uses_topic_ids
            req = session.build_close()
            if req is None or not self.network.is_ready(node):
                continue
            try:
                version = self.network.api_version(node, FETCH, max_version=None if uses_ids else 12)
            except Exception as exc:  # no usable Fetch version: there was no session either
                log.debug("not closing the fetch session on node %s: %s", node, exc)
                continue
            body = self._request_body(req, uses_ids=version >= 13)
            futures.append(self.network.send(node, FETCH, body, min_version=version, max_version=version))
        self._sessions.clear()
        return futures
