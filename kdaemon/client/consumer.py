"""``Consumer``: the public client, kafka-python-like names with the Java consumer's semantics.

One thread uses a consumer at a time (a second thread calling in gets a clear error, as Java's
ConcurrentModificationException); ``wakeup()`` is the exception and may be called from anywhere.

``poll`` follows ``KafkaConsumer.poll``: update metadata and positions, return buffered records
if any, otherwise send fetches and wait for answers; before returning records it sends the next
fetches so the broker works while the caller processes (pipelining).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager

from ..protocol.records import ConsumerRecord
from .config import ConsumerConfig
from .errors import (ConsumerClosedError, KafkaTimeoutError, NoBrokersAvailableError,
                     NoOffsetForPartitionError, UnknownTopicError, WakeupError)
from .fetcher import Fetcher
from .metadata import ClusterMetadata
from .metrics import ConsumerMetrics, PartitionMetrics
from .network import NetworkClient
from .owner import owned
from .offsets import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, OffsetLookup
from .subscription import EARLIEST, LATEST, SubscriptionState
from .types import GroupMembershipOperation, GroupState, OffsetAndMetadata, OffsetAndTimestamp, TopicPartition
from .validation import PositionValidator

log = logging.getLogger(__name__)


class Consumer:
    def __init__(self, bootstrap_servers: str | Iterable[str] = "localhost:9092", **options) -> None:
        self.config = config = ConsumerConfig.from_options(bootstrap_servers=bootstrap_servers, **options)
        self._network = NetworkClient(config)
        self._metadata = ClusterMetadata(config.metadata_max_age_ms, config.retry_backoff_ms,
                                         config.allow_auto_create_topics)
        self._subscriptions = SubscriptionState(config.auto_offset_reset)
        self._validator = PositionValidator(config, self._network, self._metadata, self._subscriptions)
        self._fetcher = Fetcher(config, self._network, self._metadata, self._subscriptions, self._validator)
        self._offsets = OffsetLookup(config, self._network, self._metadata, self._subscriptions)
        self._group = None
        if config.group_id is not None:
            from .group.coordinator import GroupCoordinator
            self._group = GroupCoordinator(config, self._network, self._metadata, self._subscriptions,
                                           on_commit=config.on_commit)
        self._telemetry = None
        if config.enable_metrics_push:
            from .telemetry import ClientTelemetry
            self._telemetry = ClientTelemetry(self._network, self._telemetry_points, self._telemetry_resource)
        self._closed = False
        self._closing = False   # close() under way: wakeup() no longer interrupts (_check_wakeup)
        self._yield = False   # yield_poll(): the running poll returns after the listener
        self._owner = threading.RLock()
        self._owner_thread: int | None = None
        self._listener_error: BaseException | None = None
        self._started = time.monotonic()
        self._metadata_received = False
        self._warned_missing: set[str] = set()

    def __repr__(self) -> str:
        return f"<Consumer client_id={self.config.client_id!r} bootstrap={','.join(self.config.bootstrap_servers)}>"

    @contextmanager
    def _use(self):
        # Re-entrant for the owning thread: a rebalance listener may call commit() from inside
        # poll(), as the Java consumer allows.
        if self._closed:
            raise ConsumerClosedError("the consumer is closed")
        with owned(self._owner, "Consumer"):
            yield

    # -- assignment -----------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        with self._use():
            partitions = [TopicPartition(*tp) for tp in partitions]
            removed = set(self._subscriptions.assigned()) - set(partitions)
            self._subscriptions.assign(partitions)
            self._fetcher.clear_buffered(removed)
            self._metadata.set_wanted({tp.topic for tp in partitions})

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscriptions.assigned())

    def subscribe(self, topics: Iterable[str] | None = None, pattern: str | None = None,
                  listener=None) -> None:
        """Join the group for ``topics`` (or every topic matching ``pattern``).

        ``listener`` may have ``on_partitions_revoked``, ``on_partitions_assigned`` and
        ``on_partitions_lost`` methods (or be a ``RebalanceListener``); they run inside poll.
        """
        with self._use():
            if self._group is None:
                raise ValueError("subscribe() needs group_id; use assign() without a group")
            self._subscriptions.subscribe(topics, pattern)
            if pattern is not None:
                self._metadata.set_wanted(set(), all_topics=True)
            else:
                self._metadata.set_wanted(self._subscriptions.subscribed_topics)
            self._group.listener = listener
            self._group.membership.request_rejoin("subscription changed")

    def subscription(self) -> set[str]:
        """The subscribed topics; under a pattern, the known topics it matches (as Java)."""
        if self._group is not None and self._subscriptions.subscribed_pattern is not None:
            return self._group.membership.subscribed_topics()
        return set(self._subscriptions.subscribed_topics)

    def unsubscribe(self) -> None:
        with self._use():
            if self._group is not None and self._subscriptions.has_subscription:
                owned = set(self._subscriptions.assigned())
                if owned:
                    self._invoke_listener("on_partitions_revoked", owned)
                fut = self._group.membership.leave("the consumer unsubscribed", partitions_lost=False)
                if fut is not None:
                    self._drive(5.0, lambda: fut.done)
            self._subscriptions.unsubscribe()
            self._fetcher.clear_buffered()
            self._metadata.set_wanted(set())
            self._raise_listener_error()

    def _invoke_listener(self, name: str, partitions: set[TopicPartition]) -> None:
        if self._group is None:
            return
        if name in ("on_partitions_revoked", "on_partitions_lost"):
            self._fetcher.clear_buffered(partitions)
        listener = self._group.listener
        fn = getattr(listener, name, None) if listener is not None else None
        if fn is None and name == "on_partitions_lost":
            fn = getattr(listener, "on_partitions_revoked", None) if listener is not None else None
        if fn is None:
            return
        try:
            fn(set(partitions))
        except Exception as exc:
            # The rebalance step completes; the error surfaces from this poll afterwards.
            log.exception("rebalance listener %s raised", name)
            if self._listener_error is None:
                self._listener_error = exc

    def _raise_listener_error(self) -> None:
        exc, self._listener_error = self._listener_error, None
        if exc is not None:
            raise exc

    # -- the poll loop --------------------------------------------------------------------------

    def poll(self, timeout_ms: int = 0) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, at most ``max_poll_records`` in all."""
        if timeout_ms < 0:
            raise ValueError("timeout_ms must not be negative")
        with self._use():
            if not self._subscriptions.assigned() and not self._subscriptions.has_subscription:
                raise ValueError("poll() needs assigned partitions or a subscription")
            deadline = time.monotonic() + timeout_ms / 1000
            self._yield = False
            group = self._group
            if group is not None:
                group.membership.poll(time.monotonic())
            telemetry = self._telemetry
            while True:
                self._check_wakeup()
                if telemetry is not None:
                    telemetry.maybe_send()
                if group is not None:
                    group.commits.invoke_completed_commit_callbacks()
                    if self._subscriptions.has_subscription:
                        joined = group.membership.ensure_active(deadline, self._drive, self._invoke_listener)
                        self._raise_listener_error()
                        if self._yield:
                            return {}
                        if not joined and not self._subscriptions.assigned():
                            return {}
                        # Not joined yet but still owning partitions (a cooperative rebalance,
                        # or the coordinator is being looked up): keep fetching them.
                    group.commits.fetch_committed_offsets(deadline, self._drive)
                    group.commits.maybe_auto_commit()
                self._update_assignment_metadata()
                records = self._fetcher.fetched_records()
                if not records:
                    self._fetcher.send_fetches()
                    remaining = deadline - time.monotonic()
                    wait = max(0.0, remaining)
                    until = self._fetcher.has_completed
                    if group is not None and self._subscriptions.has_subscription:
                        # A rebalance (or, under KIP-848, a new target assignment) noticed by the
                        # heartbeat thread ends the wait.
                        membership = group.membership
                        until = lambda: self._fetcher.has_completed() or membership.needs_attention  # noqa: E731
                    if not self._subscriptions.fetchable() or self._fetcher.waiting_for_nodes:
                        # Metadata, resets and connections move on between these waits: wake as
                        # soon as a response arrives or a connection is ready, not after a sleep.
                        wait = min(wait, self.config.retry_backoff_ms / 1000)
                        network, seen = self._network, self._network.progress
                        until = lambda: self._fetcher.has_completed() or network.progress != seen  # noqa: E731
                    self._network.poll(wait, until=until)
                    self._check_wakeup()
                    records = self._fetcher.fetched_records()
                if records:
                    # Pipelining: the next fetches go out before the caller gets the records.
                    self._fetcher.send_fetches()
                    self._network.poll(0)
                    return self._on_consume(records)
                if time.monotonic() >= deadline:
                    return {}

    def _on_consume(self, records):
        hook = self.config.on_consume
        if hook is None:
            return records
        try:
            out = hook(records)
        except Exception:
            log.exception("on_consume interceptor raised; returning the records unchanged")
            return records
        return records if out is None else out

    def _check_wakeup(self) -> None:
        if self._network.clear_wakeup() and not self._closing:
            raise WakeupError("poll interrupted by wakeup()")

    def _update_assignment_metadata(self) -> None:
        now = time.monotonic()
        auth = self._network.auth_error()
        if auth is not None:
            raise auth
        wanted = self._subscriptions.topics()
        if wanted - set(self._metadata.topics) and not self._metadata.updating:
            self._metadata.want(wanted)
        self._metadata.maybe_update(self._network, now)
        if self._metadata.version:
            self._metadata_received = True
        elif now - self._started > self.config.default_api_timeout_ms / 1000:
            # A new window for the next poll: raising at once every time would leave no poll to
            # do the I/O that lets the consumer recover when a broker comes back.
            self._started = now
            raise NoBrokersAvailableError(
                f"no broker of {', '.join(self.config.bootstrap_servers)} answered within "
                f"default_api_timeout_ms={self.config.default_api_timeout_ms}{self._unreachable_hint()}")
        self._check_missing_topics(wanted)
        self._update_positions()

    def _unreachable_hint(self) -> str:
        error = self._network.last_connection_error()
        return f"; last connection error: {error}" if error else ""

    def _check_missing_topics(self, wanted: set[str]) -> None:
        missing = wanted & self._metadata.missing_topics
        if not missing:
            return
        if self.config.unknown_topic == "error":
            raise UnknownTopicError(f"topic(s) do not exist: {', '.join(sorted(missing))}")
        for topic in missing - self._warned_missing:
            log.warning("topic %s does not exist (yet); waiting for it", topic)
        self._warned_missing |= missing

    def _update_positions(self) -> None:
        needing = self._subscriptions.needing_position()
        if needing and self._group is not None:
            # With a group, the committed offset comes first (OffsetFetch); resets only when
            # there is none.
            for tp in needing:
                self._subscriptions.state(tp).awaiting_committed = True
            needing = []
        if needing:
            if self.config.auto_offset_reset == "none":
                raise NoOffsetForPartitionError(needing)
            for tp in needing:
                self._subscriptions.request_reset(tp)
        self._offsets.reset_positions()
        # After a leader change, positions are checked against the new leader's log (KIP-320);
        # raises LogTruncationError when it was truncated under us and auto_offset_reset is none.
        self._validator.validate_positions()

    def _drive(self, timeout_s: float, until) -> None:
        """Run the network loop (with metadata upkeep) for blocking calls."""
        self._check_wakeup()
        self._metadata.maybe_update(self._network)
        auth = self._network.auth_error()
        if auth is not None:
            raise auth
        self._network.poll(timeout_s, until=until)
        self._check_wakeup()

    # -- positions ------------------------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        with self._use():
            tp = TopicPartition(*partition)
            self._subscriptions.seek(tp, offset)
            self._fetcher.clear_buffered([tp])

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, EARLIEST)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_to(partitions, LATEST)

    def _seek_to(self, partitions, strategy: str) -> None:
        with self._use():
            tps = [TopicPartition(*tp) for tp in partitions] or self._subscriptions.assigned()
            for tp in tps:
                self._subscriptions.request_reset(tp, strategy)
            self._fetcher.clear_buffered(tps)

    def position(self, partition: TopicPartition, timeout_ms: int | None = None) -> int:
        """The offset of the next record poll would return, resolving a pending reset if needed."""
        with self._use():
            tp = TopicPartition(*partition)
            st = self._subscriptions.state(tp)
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            deadline = time.monotonic() + timeout / 1000
            while not st.has_valid_position:
                if time.monotonic() >= deadline:
                    raise KafkaTimeoutError(f"position of {tp} not known within {timeout} ms")
                self._update_positions()
                if self._group is not None:
                    self._group.commits.fetch_committed_offsets(min(deadline, time.monotonic() + 1), self._drive)
                self._drive(min(0.1, max(0.0, deadline - time.monotonic())), lambda: st.has_valid_position)
            return st.position  # type: ignore[return-value]

    def positions(self) -> dict[TopicPartition, int]:
        """Current positions of assigned partitions that have one (non-blocking).

        Taken right after ``poll``, this is what a pipeline commits once the records from that
        poll are durable: it includes the offsets of records the header filter dropped.
        """
        return {tp: position for tp, (position, _) in self._subscriptions.all_consumed().items()}

    def pause(self, *partitions: TopicPartition) -> None:
        with self._use():
            for tp in partitions:
                self._subscriptions.pause(TopicPartition(*tp))

    def resume(self, *partitions: TopicPartition) -> None:
        with self._use():
            for tp in partitions:
                self._subscriptions.resume(TopicPartition(*tp))

    def paused(self) -> set[TopicPartition]:
        return self._subscriptions.paused()

    # -- look-ups -------------------------------------------------------------------------------

    def offsets_for_times(self, timestamps: dict[TopicPartition, int], timeout_ms: int | None = None
                          ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Earliest offset whose timestamp is >= the given one, per partition (None if none)."""
        for ts in timestamps.values():
            if ts < 0:
                raise ValueError(f"timestamps must be >= 0, got {ts}")
        found = self._lookup({TopicPartition(*tp): ts for tp, ts in timestamps.items()}, timeout_ms)
        return {tp: OffsetLookup.as_offset_and_timestamp(v) for tp, v in found.items()}

    def beginning_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
                          ) -> dict[TopicPartition, int]:
        found = self._lookup({TopicPartition(*tp): EARLIEST_TIMESTAMP for tp in partitions}, timeout_ms)
        return {tp: v[0] for tp, v in found.items() if v is not None}

    def end_offsets(self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
                    ) -> dict[TopicPartition, int]:
        """The high watermark (read_uncommitted) or last stable offset (read_committed)."""
        found = self._lookup({TopicPartition(*tp): LATEST_TIMESTAMP for tp in partitions}, timeout_ms)
        return {tp: v[0] for tp, v in found.items() if v is not None}

    def _lookup(self, timestamps, timeout_ms):
        with self._use():
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            return self._offsets.lookup(timestamps, timeout, self._drive)

    def partitions_for(self, topic: str, timeout_ms: int | None = None) -> set[int] | None:
        with self._use():
            self._metadata.want([topic])
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            deadline = time.monotonic() + timeout / 1000
            while True:
                parts = self._metadata.partitions_for(topic)
                if parts is not None:
                    return set(parts)
                if topic in self._metadata.missing_topics:
                    return None
                if time.monotonic() >= deadline:
                    hint = "" if self._metadata.version else self._unreachable_hint()
                    raise KafkaTimeoutError(f"metadata for {topic} not received within {timeout} ms{hint}")
                self._metadata.request_update()
                self._drive(min(0.1, max(0.0, deadline - time.monotonic())), lambda: False)

    # -- commits --------------------------------------------------------------------------------

    def _offsets_to_commit(self, offsets) -> dict[TopicPartition, OffsetAndMetadata]:
        if offsets is None:
            return self._group.commits.consumed_offsets()  # type: ignore[union-attr]
        out = {}
        for tp, om in offsets.items():
            tp = TopicPartition(*tp)
            out[tp] = om if isinstance(om, OffsetAndMetadata) else OffsetAndMetadata(int(om))
        return out

    def commit(self, offsets: dict | None = None, timeout_ms: int | None = None) -> None:
        """Commit ``offsets`` (next offsets to read), or the current positions, synchronously."""
        with self._use():
            if self._group is None:
                raise ValueError("commit() needs group_id")
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            self._group.commits.commit_sync(self._offsets_to_commit(offsets),
                                            time.monotonic() + timeout / 1000, self._drive)

    def commit_async(self, offsets: dict | None = None, callback=None):
        """Send a commit and return at once; ``callback(offsets, exception)`` runs in a later
        poll() or commit() on this thread."""
        with self._use():
            if self._group is None:
                raise ValueError("commit_async() needs group_id")
            fut = self._group.commits.commit_async(self._offsets_to_commit(offsets), callback)
            self._network.poll(0)
            return fut

    def committed(self, partitions: Iterable[TopicPartition], timeout_ms: int | None = None
                  ) -> dict[TopicPartition, OffsetAndMetadata | None]:
        with self._use():
            if self._group is None:
                raise ValueError("committed() needs group_id")
            timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
            parts = [TopicPartition(*tp) for tp in partitions]
            found = self._group.commits.committed(parts, time.monotonic() + timeout / 1000, self._drive)
            return {tp: found.get(tp) for tp in parts}

    def group_stable(self) -> bool:
        """True once this member completed a rebalance (JoinGroup and SyncGroup; under the
        consumer protocol, reconciled its target assignment) and holds its assignment, until the
        next rebalance starts."""
        return self._group is not None and self._group.membership.stable

    def group_state(self) -> GroupState | None:
        """A snapshot of this member's group, or None when the consumer is not subscribed as
        a group member (no group_id, or partitions assigned by hand).  Under
        ``group_protocol="consumer"`` (KIP-848) ``protocol`` is "consumer", ``generation`` the
        member epoch and ``leader_id`` None (the broker assigns)."""
        if self._group is None or not self._subscriptions.has_subscription:
            return None
        m = self._group.membership
        return GroupState(group_id=self._group.group_id, protocol=m.protocol_name, member_id=m.member_id,
                          generation=m.generation, leader_id=m.leader_id, stable=m.stable,
                          rebalances=m.rebalances)

    def group_member_id(self) -> str | None:
        """The member id this consumer has, or will join with, in its group; None without a
        group_id.  Under ``group_protocol="consumer"`` (KIP-848) the client chooses it when the
        consumer is built, so it is known before the first join (a supervisor that records it
        then can release a static membership even of a worker killed while joining); under
        "classic" the broker gives it at the first JoinGroup ("" before)."""
        return None if self._group is None else self._group.membership.member_id

    def heartbeat_soon(self) -> None:
        """Heartbeat to the group coordinator now rather than at the next interval: something
        changed in the group that this member hears of only in a heartbeat's answer (under
        KIP-848 its new target assignment, once another member joined or released partitions;
        under the classic protocol a rebalance).  kdaemon's supervisor asks its other workers
        to when one of them joins or takes a new assignment.  Safe from a signal handler and
        any thread (it takes no lock); nothing without a group, or while joining."""
        if self._group is not None:
            self._group.membership.heartbeat_soon()

    def group_generation(self) -> tuple[int, str] | None:
        """(generation, member id) while a group member, else None."""
        m = None if self._group is None else self._group.membership
        if m is None or m.generation < 0:
            return None
        return m.generation, m.member_id

    def group_leader(self) -> str | None:
        """The member id of the group's leader (the member that computed the assignment) as of
        this member's last JoinGroup, or None before the first one."""
        return None if self._group is None else self._group.membership.leader_id

    # -- observability --------------------------------------------------------------------------

    def reachability(self) -> tuple[bool, str | None]:
        """(a broker connection is up, the latest failure to connect to one): for a caller that
        tells its operator why nothing is consumed."""
        return self._network.any_ready(), self._network.last_connection_error()

    def missing_topics(self) -> set[str]:
        """Subscribed or assigned topics the brokers said do not exist (UNKNOWN_TOPIC_OR_PARTITION)."""
        return set(self._metadata.missing_topics)

    def metrics(self) -> ConsumerMetrics:
        """A snapshot of the fetch counters and of every assigned partition's figures."""
        s = self._fetcher.stats
        read_committed = self.config.read_committed
        partitions = {}
        lag_max = 0
        for tp, st in self._subscriptions.items():
            lag = st.lag(read_committed)
            if lag is not None:
                lag_max = max(lag_max, lag)
            partitions[tp] = PartitionMetrics(
                position=st.position, high_watermark=st.high_watermark,
                last_stable_offset=st.last_stable_offset, log_start_offset=st.log_start_offset,
                records_lag=lag, records_consumed=s.per_partition_records.get(tp, 0),
                records_filtered=s.per_partition_filtered.get(tp, 0),
                bytes_consumed=s.per_partition_bytes.get(tp, 0), paused=st.paused,
                preferred_read_replica=st.preferred_read_replica)
        return ConsumerMetrics(
            records_consumed_total=s.records, bytes_consumed_total=s.bytes,
            records_filtered_total=s.filtered, control_records_total=s.control,
            aborted_records_total=s.aborted, fetch_requests_total=s.requests,
            fetch_responses_total=s.responses, fetch_errors_total=s.errors,
            fetch_requests_per_node=dict(s.requests_per_node),
            fetch_latency_avg_ms=s.latency_ms_total / s.responses if s.responses else 0.0,
            fetch_latency_ms_total=s.latency_ms_total,
            fetch_latency_max_ms=s.latency_ms_max, records_lag_max=lag_max,
            last_fetch_request=getattr(self._fetcher, "last_request_body", None),
            partitions=partitions)

    def client_instance_id(self):
        """The id a broker gave this client for its telemetry (KIP-714; Java's
        ``clientInstanceId``), or None while it has none (``enable_metrics_push`` off, a broker
        without a ClientTelemetry plugin, or before the first subscription)."""
        t = self._telemetry
        if t is None or t.client_instance_id.int == 0:
            return None
        return t.client_instance_id

    def _telemetry_points(self, wire):
        from .telemetry_metrics import consumer_points
        state = self.group_state()
        return consumer_points(self.metrics(), wire, group=self._group is not None,
                               rebalances=None if state is None else state.rebalances)

    def _telemetry_resource(self) -> dict[str, str]:
        """The client as a whole, as Java's consumer describes it in its pushes."""
        c = self.config
        out = {}
        if c.group_id is not None:
            out["group_id"] = c.group_id
        if c.group_instance_id is not None:
            out["group_instance_id"] = c.group_instance_id
        member = self.group_member_id()
        if member:
            out["group_member_id"] = member
        if c.client_rack:
            out["client_rack"] = c.client_rack
        return out

    # -- lifecycle ------------------------------------------------------------------------------

    def yield_poll(self) -> None:
        """From a rebalance listener: the poll that runs it returns, with no records, as soon as
        the listener is done (librdkafka's ``rd_kafka_yield``).  For a listener that pauses what
        it was just given: that poll would otherwise wait out its whole timeout with nothing it
        may return.  Unlike ``wakeup()`` nothing is raised and nothing is left pending: the
        request ends with the poll it was made in."""
        self._yield = True

    def wakeup(self) -> None:
        """Thread-safe: make a blocked (or the next) poll raise WakeupError."""
        self._network.wakeup()

    def close(self, timeout_ms: int | None = None,
              group_membership: GroupMembershipOperation | str = GroupMembershipOperation.DEFAULT) -> None:
        """Commit (with auto-commit), run on_partitions_revoked, leave the group, disconnect.

        ``group_membership`` (Java's ``CloseOptions.groupMembershipOperation``): "default" (a
        static member stays in the group for its successor), "leave" (leave for good, static
        members too: their partitions move at once) or "remain" (send no leave)."""
        operation = GroupMembershipOperation(group_membership)
        if self._closed:
            return
        with self._owner:
            # Wakeups are off from here on, as Java's coordinator disables them in close(): a
            # stop is what ends a poll with wakeup(), and one pending (a second signal, or one
            # that came outside a poll) cut the leave short: a KIP-848 static member sent no -2,
            # and its successor was refused its instance id (UNRELEASED_INSTANCE_ID).
            self._closing = True
            try:
                timeout = self.config.default_api_timeout_ms if timeout_ms is None else timeout_ms
                deadline = time.monotonic() + min(timeout, 30_000) / 1000
                if self._group is not None:
                    self._group.close(deadline, self._drive, self._invoke_listener, operation)
                    self._group.commits.invoke_completed_commit_callbacks()
                self._close_fetch_sessions(deadline)
                if self._telemetry is not None:
                    # The last push, marked terminating (KIP-714), after the group and sessions
                    # closed so it carries the final figures.
                    self._telemetry.close(deadline, self._close_drive)
            finally:
                self._closed = True
                self._network.close()

    def _close_drive(self, timeout_s: float, until) -> None:
        self._network.clear_wakeup()   # a pending wakeup() must not cut a close's wait short
        self._network.poll(timeout_s, until=until)

    def _close_fetch_sessions(self, deadline: float) -> None:
        """Close the fetch sessions (KIP-227, as Java's ``Fetcher.close``) and wait for the
        answers until ``deadline``: disconnecting first would leave each broker holding a
        session slot for nothing until it evicts it."""
        futures = self._fetcher.close_sessions()
        done = lambda: all(f.done for f in futures)  # noqa: E731
        while not done() and time.monotonic() < deadline:
            self._network.clear_wakeup()   # a pending wakeup() must not cut the wait short
            self._network.poll(deadline - time.monotonic(), until=done)

    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
