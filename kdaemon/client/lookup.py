"""A one-shot look at the cluster, apart from any consumer's own metadata: the partitions the
topics have *now*.

A consumer refreshes its metadata every ``metadata_max_age_ms`` (5 min by default, as in
Java), so partitions added to a topic stay unknown to it — and unconsumed — for up to that long.
The daemon's health check (worker/ownership.py) asks here instead, every few seconds, without
disturbing the consumer: a short-lived network client, one Metadata request, the answer read by
the same ``ClusterMetadata`` the consumer uses.
"""

from __future__ import annotations

import time

from ..protocol.apis import METADATA
from ..protocol.errors import Errors
from .config import ConsumerConfig
from .errors import KafkaTimeoutError, RefusedError, missing_topic, topic_refused
from .metadata import ClusterMetadata
from .network import NetworkClient


def topic_partitions(config: ConsumerConfig, topics, *, timeout_ms: int) -> dict[str, set[int] | None]:
    """Each topic's partition numbers as a broker sees them now (None: no such topic).
    ``KafkaTimeoutError`` when no broker answers within ``timeout_ms``."""
    wanted = sorted(set(topics))
    metadata = _metadata_now(config, wanted, timeout_ms)
    return {t: (None if t in metadata.missing_topics else set(metadata.partitions_for(t) or ()))
            for t in wanted}


def refused_topics(config: ConsumerConfig, topics, *, timeout_ms: int) -> dict[str, RefusedError]:
    """The topics a producer could not write to, as a broker sees them now, each with the error
    its writes would end in (``UnknownTopicError`` for a missing one, ``RefusedError`` for one
    this principal may not see): the Kafka DLQ asks before its worker consumes anything, and
    ``check-config`` asks too.  ``KafkaTimeoutError`` when no broker answers within
    ``timeout_ms``; ``AuthenticationError`` when the login is refused."""
    wanted = sorted(set(topics))
    metadata = _metadata_now(config, wanted, timeout_ms)
    servers = config.bootstrap_servers
    out: dict[str, RefusedError] = {}
    for t in wanted:
        if t in metadata.missing_topics:
            out[t] = missing_topic(t, servers)
        elif t in metadata.unauthorized_topics:
            out[t] = topic_refused(t, Errors.TOPIC_AUTHORIZATION_FAILED, servers)
    return out


def _metadata_now(config: ConsumerConfig, wanted: list[str], timeout_ms: int) -> ClusterMetadata:
    """One Metadata answer about ``wanted`` from a short-lived client."""
    metadata = ClusterMetadata(allow_auto_create_topics=False)
    metadata.set_wanted(set(wanted))
    deadline = time.monotonic() + timeout_ms / 1000
    net = NetworkClient(config)
    try:
        while True:
            node = net.least_loaded_node()
            if node is not None:
                fut = net.send(node, METADATA, metadata.build_request())
                net.poll(max(0.0, deadline - time.monotonic()), until=lambda: fut.done)
                if fut.done and not fut.failed:
                    metadata.handle_response(fut.value()[1], time.monotonic())
                    return metadata
            error = net.auth_error()
            if error is not None:
                raise error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(f"no broker answered a Metadata request within {timeout_ms} ms "
                                        f"(last connection error: {net.last_connection_error() or 'none'})")
            net.poll(min(config.retry_backoff_ms / 1000, remaining))
    finally:
        net.close()
