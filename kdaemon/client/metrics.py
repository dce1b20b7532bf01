"""What ``Consumer.metrics()`` reports: typed, frozen snapshots.

Typed so that a caller that misspells a figure fails at once (an AttributeError, and a type
checker's complaint) instead of reading a ``KeyError`` or, with ``.get``, a silent zero; frozen
so that a snapshot handed to the worker's metrics or the supervisor's heartbeat cannot be
changed under whoever else holds it.  The names are those of the Java consumer's metrics where
one exists (``records-lag`` becomes ``records_lag``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .types import TopicPartition

__all__ = ["PartitionMetrics", "ConsumerMetrics"]


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
