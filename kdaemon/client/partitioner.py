"""Which partition a produced record goes to, as Java's default partitioner decides for a key.

A keyed record goes to ``toPositive(murmur2(key)) % partitions``, with kafka-clients'
``Utils.murmur2`` (seed 0x9747b28c) and ``Utils.toPositive`` (``n & 0x7fffffff``), so a key
lands where a Java producer (or librdkafka's ``murmur2_random``) would put it, and records of
one key stay in order in one partition.  A record without a key goes round-robin over the
topic's partitions (Java's ``RoundRobinPartitioner``; Java's default sticks to one partition
per batch, which matters for throughput, not for a dead-letter queue).
"""

from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """kafka-clients' ``Utils.murmur2``: a signed 32-bit int, as Java returns it."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    end4 = length & ~3
    for i in range(0, end4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length & 3
    if rest == 3:
        h ^= data[end4 + 2] << 16
    if rest >= 2:
        h ^= data[end4 + 1] << 8
    if rest >= 1:
        h ^= data[end4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    """kafka-clients' ``Utils.toPositive``: clears the sign bit (not ``abs``)."""
    return n & 0x7FFFFFFF


class Partitioner:
    """Keyed: murmur2 as Java; no key: round-robin per topic."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def partition(self, topic: str, key: bytes | None, partitions: int) -> int:
        if partitions <= 0:
            raise ValueError(f"topic {topic!r} has no partitions")
        if key is not None:
            return to_positive(murmur2(key)) % partitions
        n = self._next.get(topic, 0)
        self._next[topic] = n + 1
        return n % partitions
