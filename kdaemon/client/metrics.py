"""What ``Consumer.metrics()`` and ``ShareConsumer.metrics()`` report: typed, frozen snapshots.

Typed so that a caller that misspells a figure fails at once (an AttributeError, and a type
checker's complaint) instead of reading a ``KeyError`` or, with ``.get``, a silent zero; frozen
so that a snapshot handed to the worker's metrics or the supervisor's heartbeat cannot be
changed under whoever else holds it.  The names are those of the Java consumer's metrics where
one exists (``records-lag`` becomes ``records_lag``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .types import TopicPartition

__all__ = ["PartitionMetrics", "ConsumerMetrics", "ShareConsumerMetrics", "ShareCounters", "ACKNOWLEDGE_TYPES"]

# The names ``ShareConsumerMetrics.acknowledged`` counts by, lower case as Java's
# ``AcknowledgeType.toString()`` names them; indexed by the wire value (1 ACCEPT ... 4 RENEW).
ACKNOWLEDGE_TYPES = {1: "accept", 2: "release", 3: "reject", 4: "renew"}


@dataclass(frozen=True)
class PartitionMetrics:
    """One assigned partition, as of the snapshot."""

    position: int | None                # the offset of the next record poll returns
    high_watermark: int | None
    last_stable_offset: int | None
    log_start_offset: int | None
    records_lag: int | None             # to the high watermark (the LSO under read_committed)
    records_consumed: int               # returned by poll (after the header filter)
    records_filtered: int               # dropped by the header filter
    bytes_consumed: int                 # record-set bytes received, as stored (compressed)
    paused: bool
    preferred_read_replica: int | None  # the follower we fetch from (KIP-392), if any


@dataclass(frozen=True)
class ConsumerMetrics:
    """Counters since the consumer was created, and every assigned partition's figures."""

    records_consumed_total: int
    bytes_consumed_total: int
    records_filtered_total: int
    control_records_total: int
    aborted_records_total: int
    fetch_requests_total: int
    fetch_responses_total: int
    fetch_errors_total: int
    fetch_requests_per_node: dict[int, int]
    fetch_latency_avg_ms: float
    fetch_latency_ms_total: float
    fetch_latency_max_ms: float
    records_lag_max: int
    last_fetch_request: dict | None     # the body of the last Fetch sent (for tests and debugging)
    partitions: dict[TopicPartition, PartitionMetrics] = field(default_factory=dict)


@dataclass(frozen=True)
class ShareConsumerMetrics:
    """A share member's counters since the consumer was created (``ShareConsumer.metrics()``).

    Counted in records, never in requests or partitions:

    * ``records_acquired``: records the broker acquired for this member and the consumer kept
      for the application (header-filtered records and gaps excluded: the consumer ACCEPTs and
      settles those itself); ``records_redelivered``: those of them with ``delivery_count`` > 1
      (released, or their lock ran out at a member, before);
    * ``acknowledged``: {"accept", "release", "reject", "renew"} -> verdicts the broker
      confirmed (a partition answered without error), the consumer's own ACCEPTs of filtered
      records included; ``acknowledge_errors``: verdicts it refused (INVALID_RECORD_STATE ...)
      or that a failed request carried;
    * ``lock_expiries``: records whose acquisition lock ran out before their verdict was sent
      (it is never sent: the broker gives them to the group again), or before a poll could
      return them.
    """

    records_acquired: int
    records_redelivered: int
    acknowledged: Mapping[str, int]
    acknowledge_errors: int
    lock_expiries: int


class ShareCounters:
    """The mutable counters behind ``ShareConsumerMetrics``, bumped in the application thread
    only (where answers are applied), so no lock."""

    def __init__(self) -> None:
        self.records_acquired = 0
        self.records_redelivered = 0
        self.acknowledged = dict.fromkeys(ACKNOWLEDGE_TYPES.values(), 0)
        self.acknowledge_errors = 0
        self.lock_expiries = 0

    def acquired(self, delivery_counts: Iterable[int]) -> None:
        for count in delivery_counts:
            self.records_acquired += 1
            if count > 1:
                self.records_redelivered += 1

    def verdicts(self, kinds: Iterable[int], confirmed: bool) -> None:
        """Verdicts (wire acknowledge types) the broker answered for; gaps are not records."""
        for kind in kinds:
            name = ACKNOWLEDGE_TYPES.get(kind)
            if name is None:
                continue
            if confirmed:
                self.acknowledged[name] += 1
            else:
                self.acknowledge_errors += 1

    def snapshot(self) -> ShareConsumerMetrics:
        return ShareConsumerMetrics(self.records_acquired, self.records_redelivered,
                                    MappingProxyType(dict(self.acknowledged)), self.acknowledge_errors,
                                    self.lock_expiries)
