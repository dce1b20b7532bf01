"""Cluster metadata: brokers, partition leaders with their epochs, topic ids.

Refreshed on age (``metadata_max_age_ms``), on demand (``request_update``), which the fetcher
and coordinator call on NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH
and failed requests, and after any broker connection failed or was dropped (a killed leader is
otherwise never asked again, so nothing would say its partitions moved).  A response whose
leader epoch for a partition is *older* than the one we hold is stale (it came from a broker
that has not seen the latest leader change) and is ignored for that partition, as the Java
client does.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field

from ..protocol.apis import METADATA
from ..protocol.errors import BrokerError, Errors
from ..protocol.primitives import ZERO_UUID
from .future import Future
from .types import TopicPartition

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline: tuple[int, ...]
    error_code: int = 0


@dataclass(slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: dict[int, PartitionMetadata]
    is_internal: bool = False


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None


@dataclass
class ClusterMetadata:
    metadata_max_age_ms: int = 300_000
    retry_backoff_ms: int = 100
    allow_auto_create_topics: bool = False
    brokers: dict[int, Broker] = field(default_factory=dict)
    topics: dict[str, TopicMetadata] = field(default_factory=dict)
    topic_names: dict[uuid.UUID, str] = field(default_factory=dict)
    missing_topics: set[str] = field(default_factory=set)
    unauthorized_topics: set[str] = field(default_factory=set)
    cluster_id: str | None = None
    controller_id: int = -1
    version: int = 0
    wanted: set[str] = field(default_factory=set)
    want_all_topics: bool = False
    _need_update: bool = True
    _last_refresh: float = 0.0
    _last_attempt: float = 0.0
    _in_flight: Future | None = None
    _failure_seen: float = 0.0

    # -- what to fetch --------------------------------------------------------------------------

    def want(self, topics) -> None:
        topics = set(topics)
        if not topics <= self.wanted:
            self._need_update = True
        self.wanted |= topics

    def set_wanted(self, topics, all_topics: bool = False) -> None:
        topics = set(topics)
        if topics != self.wanted or all_topics != self.want_all_topics:
            self._need_update = True
        self.wanted = topics
        self.want_all_topics = all_topics

    def request_update(self) -> None:
        self._need_update = True

    @property
    def updating(self) -> bool:
        return self._in_flight is not None

    def update_due(self, now: float) -> bool:
        if self._in_flight is not None:
            return False
        if now - self._last_attempt < self.retry_backoff_ms / 1000:
            return False
        return self._need_update or now - self._last_refresh >= self.metadata_max_age_ms / 1000

    def build_request(self) -> dict:
        if self.want_all_topics:
            topics = None
        else:
            topics = [{"name": t, "topic_id": ZERO_UUID} for t in sorted(self.wanted)]
        return {"topics": topics, "allow_auto_topic_creation": self.allow_auto_create_topics,
                "include_topic_authorized_operations": False}

    def maybe_update(self, network, now: float | None = None) -> Future | None:
        """Send a Metadata request to the least loaded node if one is due."""
        now = time.monotonic() if now is None else now
        failure = network.last_connection_failure_at()
        if failure > self._failure_seen:
            # A broker connection failed since the last look: its partitions may have moved.
            self._failure_seen = failure
            self._need_update = True
        if not self.update_due(now):
            return self._in_flight
        node = network.least_loaded_node()
        if node is None:
            return None
        if not network.ready(node):
            return None
        self._last_attempt = now
        fut = network.send(node, METADATA, self.build_request())
        self._in_flight = fut

        def done(value) -> None:
            self._in_flight = None
            version, body = value
            self.handle_response(body, time.monotonic())
            network.set_brokers({b.node_id: (b.host, b.port) for b in self.brokers.values()})

        def failed(exc) -> None:
            self._in_flight = None
            log.debug("metadata request to node %s failed: %s", node, exc)

        fut.add_callback(done)
        fut.add_errback(failed)
        return fut

    # -- applying a response --------------------------------------------------------------------

    def handle_response(self, body: dict, now: float) -> None:
        if body.get("error_code"):
            raise BrokerError(body["error_code"], "Metadata")
        self.brokers = {b["node_id"]: Broker(b["node_id"], b["host"], b["port"], b.get("rack"))
                        for b in body["brokers"]}
        self.cluster_id = body.get("cluster_id")
        self.controller_id = body.get("controller_id", -1)
        retry_soon = False
        seen = set()
        for t in body["topics"]:
            name = t["name"]
            code = t["error_code"]
            seen.add(name)
            if code == Errors.UNKNOWN_TOPIC_OR_PARTITION:
                self.missing_topics.add(name)
                self._forget(name)
                continue
            if code in (Errors.TOPIC_AUTHORIZATION_FAILED,):
                self.unauthorized_topics.add(name)
                self._forget(name)
                continue
            if code and code != Errors.LEADER_NOT_AVAILABLE:
                log.warning("metadata for topic %s: %s", name, BrokerError(code))
                retry_soon = True
                continue
            if code == Errors.LEADER_NOT_AVAILABLE:
                retry_soon = True
            self.missing_topics.discard(name)
            self.unauthorized_topics.discard(name)
            topic_id = t.get("topic_id") or ZERO_UUID
            old = self.topics.get(name)
            same_topic = old is not None and (old.topic_id == topic_id or topic_id == ZERO_UUID
                                              or old.topic_id == ZERO_UUID)
            partitions = {}
            for p in t["partitions"]:
                new = PartitionMetadata(p["leader_id"], p.get("leader_epoch", -1),
                                        tuple(p["replica_nodes"]), tuple(p["isr_nodes"]),
                                        tuple(p.get("offline_replicas") or ()), p["error_code"])
                prev = old.partitions.get(p["partition_index"]) if same_topic else None
                if prev is not None and new.leader_epoch >= 0 and prev.leader_epoch > new.leader_epoch:
                    new = prev  # stale answer from a broker behind on leadership
                if new.leader < 0 or p["error_code"] in (Errors.LEADER_NOT_AVAILABLE,):
                    retry_soon = True
                partitions[p["partition_index"]] = new
            if old is not None and old.topic_id != ZERO_UUID and old.topic_id != topic_id:
                self.topic_names.pop(old.topic_id, None)
            self.topics[name] = TopicMetadata(name, topic_id, partitions, t.get("is_internal", False))
            if topic_id != ZERO_UUID:
                self.topic_names[topic_id] = name
        if not self.want_all_topics:
            for name in list(self.topics):
                if name not in self.wanted:
                    self._forget(name)
        else:
            for name in list(self.topics):
                if name not in seen:
                    self._forget(name)
        self._last_refresh = now
        self._need_update = retry_soon
        self.version += 1

    def _forget(self, name: str) -> None:
        old = self.topics.pop(name, None)
        if old is not None:
            self.topic_names.pop(old.topic_id, None)

    # -- queries --------------------------------------------------------------------------------

    def partitions_for(self, topic: str) -> list[int] | None:
        t = self.topics.get(topic)
        return None if t is None else sorted(t.partitions)

    def partition(self, tp: TopicPartition) -> PartitionMetadata | None:
        t = self.topics.get(tp.topic)
        return None if t is None else t.partitions.get(tp.partition)

    def leader_for(self, tp: TopicPartition) -> int | None:
        p = self.partition(tp)
        if p is None or p.leader < 0 or p.leader not in self.brokers:
            return None
        return p.leader

    def leader_epoch(self, tp: TopicPartition) -> int:
        p = self.partition(tp)
        return -1 if p is None else p.leader_epoch

    def topic_id(self, topic: str) -> uuid.UUID:
        t = self.topics.get(topic)
        return ZERO_UUID if t is None else t.topic_id

    def update_leader(self, tp: TopicPartition, leader: int, epoch: int) -> None:
        """Apply a newer leader learned from a Fetch response's current_leader (KIP-951)."""
        t = self.topics.get(tp.topic)
        if t is None:
            return
        old = t.partitions.get(tp.partition)
        if old is None or epoch <= old.leader_epoch:
            return
        t.partitions[tp.partition] = PartitionMetadata(leader, epoch, old.replicas, old.isr, old.offline)
        self.version += 1
