"""Partitions nobody consumes: the configured topics' partitions that no consumer holds.

The commonest cause is a topic that grew.  A classic group takes new partitions on only when
its leader's metadata shows them (``metadata_max_age_ms``: 5 min by default, in Java too), and
a static assignment (``[daemon] assignment = "static"``) fixes each worker's partitions when it
starts; meanwhile records pile up in the new partitions with no consumer and no error.  Other
causes: members of the group subscribed to other topics, or a foreign member's assignor that
leaves partitions out.

Worker 0 of a daemon looks, in a thread every ``EVERY_S``, apart from its consumer: the
partitions the topics have now (``client.lookup``), against what the group's members hold
(``describe_group``, either protocol) or, for a static assignment, against the partitions the
workers divided among themselves at start.  A group in a rebalance is not judged: partitions
are in flight then, nor one whose members' assignments the answer does not show (Tansu
sends none).  ``health`` turns the answer into the ``partition_unowned`` condition.

``GroupCensus`` is the same kind of look for any worker left without partitions: how many
members the group has (``describe_group``) against how many partitions the configured topics
have (``client.lookup``), so that ``health`` says "more members than partitions" only when that
is so (a newcomer waits for partitions another member still holds, which is not it).
"""

from __future__ import annotations

import logging
import threading

from ..client.config import ConsumerConfig
from ..client.group.describe import describe_group
from ..client.lookup import topic_partitions
from ..client.types import TopicPartition

log = logging.getLogger(__name__)

EVERY_S = 3.0
CENSUS_EVERY_S = 10.0
SETTLED_STATES = ("Stable",)   # a group in another state is between assignments


class OwnershipCheck:
    """``unowned()`` is the last look's answer: the partitions nobody holds, with who was
    asked, or None when there is no judgement (a rebalance, a failed look)."""

    def __init__(self, config: ConsumerConfig, topics, *, static: set[TopicPartition] | None = None,
                 every_s: float = EVERY_S) -> None:
        self._config = config
        self._topics = sorted(topics)
        self._static = static
        self._every = every_s
        self._answer: tuple[frozenset[TopicPartition], str] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kdaemon-ownership", daemon=True)

    def start(self) -> "OwnershipCheck":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def unowned(self) -> tuple[frozenset[TopicPartition], str] | None:
        return self._answer

    def look(self) -> tuple[frozenset[TopicPartition], str] | None:
        timeout_ms = int(self._every * 1000)
        present = _present(self._config, self._topics, timeout_ms)
        if self._static is not None:
            return frozenset(present - self._static), "no worker of this daemon (static assignment)"
        group = describe_group(self._config, timeout_ms=timeout_ms)
        if (group.state not in SETTLED_STATES or not group.members
                or not all(m.assignment_known for m in group.members)):
            return None
        held = {tp for m in group.members for tp in m.partitions}
        return frozenset(present - held), f"no member of group {group.group_id}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._answer = self.look()
            except Exception as exc:   # the broker checks (health's broker_unreachable) say why
                log.debug("ownership check failed: %s", exc)
                self._answer = None
            self._stop.wait(self._every)


def _present(config: ConsumerConfig, topics, timeout_ms: int) -> set[TopicPartition]:
    """The partitions ``topics`` have now (a missing topic has none)."""
    present = set()
    for topic, parts in topic_partitions(config, topics, timeout_ms=timeout_ms).items():
        present |= {TopicPartition(topic, p) for p in parts or ()}
    return present


class GroupCensus:
    """How many members the group has and how many partitions they share, looked up in a thread
    when asked (``sizes()``), at once the first time, then at most every ``every_s`` (two
    short-lived connections a look: a worker left out for good must not keep the brokers
    busy): (members, partitions), or None before the first answer and after a failed look.
    Partitions are the configured ``topics``' (from a Metadata request); under a topic pattern
    (no topics), the ones the group's members hold, since the broker resolves the pattern
    (KIP-848), not this worker."""

    def __init__(self, config: ConsumerConfig, topics, *, every_s: float = CENSUS_EVERY_S) -> None:
        self._config = config
        self._topics = sorted(topics)
        self._every = every_s
        self._answer: tuple[int, int] | None = None
        self._next = 0.0
        self._running = threading.Lock()

    def sizes(self, now: float) -> tuple[int, int] | None:
        if now >= self._next and self._running.acquire(blocking=False):
            self._next = now + self._every
            threading.Thread(target=self._look, name="kdaemon-census", daemon=True).start()
        return self._answer

    def look(self) -> tuple[int, int]:
        timeout_ms = int(self._every * 1000)
        group = describe_group(self._config, timeout_ms=timeout_ms)
        if self._topics:
            partitions = len(_present(self._config, self._topics, timeout_ms))
        else:
            partitions = len({tp for m in group.members for tp in m.partitions})
        return len(group.members), partitions

    def _look(self) -> None:
        try:
            self._answer = self.look()
        except Exception as exc:   # the broker checks (health's broker_unreachable) say why
            log.debug("group census failed: %s", exc)
            self._answer = None
        finally:
            self._running.release()
