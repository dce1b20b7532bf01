"""Finding the group's coordinator (FindCoordinator) and sending requests to it.

Shared by the membership (join, sync, heartbeat, leave) and the commits (OffsetCommit,
OffsetFetch): both learn of a coordinator that went away (NOT_COORDINATOR, a dropped
connection) and call ``mark_unknown``; the next ``ensure`` finds it again.  The coordinator gets
a connection of its own, as in Java (see ``coordinator_connection_id``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ...backoff import Backoff
from ...protocol.apis import FIND_COORDINATOR
from ...protocol.errors import BrokerError, Errors
from ..config import ConsumerConfig
from ..errors import ConnectionFailedError, GroupError
from ..future import Future
from ..metadata import ClusterMetadata
from ..network import NetworkClient

log = logging.getLogger(__name__)

# The errors that mean "ask someone else": the answer came from a broker that is not (or no
# longer) the group's coordinator.
COORDINATOR_ERRORS = frozenset({Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE})


def coordinator_connection_id(node_id: int) -> int:
    # Java uses Integer.MAX_VALUE - nodeId: a separate connection to the same broker.
    return 0x7FFFFFFF - node_id


class CoordinatorLookup:
    """The coordinator of one group: who it is, how to find it again, how to reach it.

    ``on_found`` runs (under the network lock) when a coordinator is found: the membership
    starts a new session clock there.  ``on_fatal`` gets an error no retry mends (the group is
    not ours to use: GROUP_AUTHORIZATION_FAILED).
    """

    def __init__(self, config: ConsumerConfig, network: NetworkClient, metadata: ClusterMetadata, *,
                 on_found: Callable[[], None], on_fatal: Callable[[BaseException], None],
                 raise_if_fatal: Callable[[], None]) -> None:
        assert config.group_id is not None
        self.config = config
        self.group_id = config.group_id
        self.network = network
        self.metadata = metadata
        self._on_found = on_found
        self._on_fatal = on_fatal
        self._raise_if_fatal = raise_if_fatal
        self.connection: int | None = None   # the coordinator's own connection id
        self.broker: int | None = None       # its broker id
        self._find_future: Future | None = None
        # Rediscoveries in a row without a request answered in between back off (Java's
        # retry.backoff.ms up to retry.backoff.max.ms, KIP-580): a coordinator that is alive but
        # unreachable from here is found again at once, and nothing must spin on it.
        self._backoff = Backoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000, jitter=0.2)
        self._lookup_after = 0.0

    @property
    def known(self) -> bool:
        """A coordinator was found and not marked unusable since.  Its connection may be down
        for now: the next request reconnects (with the connection's own backoff), and a request
        that fails on it marks the coordinator unknown, as Java's ``markCoordinatorUnknown``.
        (Counting a failed connection as "unknown" here made every lookup that found the same
        broker again useless: the failed connection was kept, nothing reconnected it, and the
        workers spun on FindCoordinator while the coordinator was alive.)"""
        return self.connection is not None

    def mark_unknown(self, why: str) -> None:
        with self.network.lock:
            if self.connection is not None:
                log.info("group %s: coordinator %s unusable (%s); rediscovering", self.group_id,
                         self.broker, why)
                self.network.unpin_node(self.connection)
                self._lookup_after = time.monotonic() + self._backoff.failure()
            self.connection = None
            self.broker = None

    def lookup(self) -> Future | None:
        """Start a FindCoordinator unless one is in flight (call under the network lock);
        None when no broker is known to ask yet."""
        if self._find_future is not None:
            return self._find_future
        node = self.network.least_loaded_node()
        if node is None:
            return None
        # No waiting for the connection: the network client holds the request until it is up.
        body = {"key": self.group_id, "key_type": 0, "coordinator_keys": [self.group_id]}
        fut = self.network.send(node, FIND_COORDINATOR, body)
        self._find_future = fut

        def done(value) -> None:
            self._find_future = None
            version, resp = value
            if version >= 4:
                entry = resp["coordinators"][0] if resp["coordinators"] else {"error_code": Errors.COORDINATOR_NOT_AVAILABLE}
            else:
                entry = resp
            if entry["error_code"]:
                if entry["error_code"] == Errors.GROUP_AUTHORIZATION_FAILED:
                    self._on_fatal(GroupError(str(BrokerError(entry["error_code"], f"group {self.group_id}"))))
                log.debug("FindCoordinator for %s: %s", self.group_id, BrokerError(entry["error_code"]))
                return
            conn_id = coordinator_connection_id(entry["node_id"])
            self.network.pin_node(conn_id, entry["host"], entry["port"])
            self.connection = conn_id
            self.broker = entry["node_id"]
            self._on_found()
            log.info("group %s: coordinator is broker %s (%s:%s)", self.group_id, entry["node_id"],
                     entry["host"], entry["port"])

        def failed(exc) -> None:
            self._find_future = None

        fut.add_callback(done)
        fut.add_errback(failed)
        return fut

    def ensure(self, deadline: float, drive) -> bool:
        """Find the coordinator, driving the network until ``deadline``; False if not in time."""
        while not self.known:
            self._raise_if_fatal()
            now = time.monotonic()
            if now < self._lookup_after:    # backing off after a coordinator that failed
                if now >= deadline:
                    return False
                drive(min(self._lookup_after, deadline) - now, lambda: False)
                continue
            # The look-up starts even past the deadline, so a caller that does not wait (a
            # cooperative member fetching during a rebalance) still gets it going.
            with self.network.lock:
                fut = self.lookup()
            now = time.monotonic()
            if now >= deadline:
                return False
            if fut is None:
                self.metadata.maybe_update(self.network)
                drive(min(0.1, deadline - now), lambda: False)
                continue
            drive(max(0.0, deadline - now), lambda: fut.done)
            if fut.done and not self.known:
                drive(min(self.config.retry_backoff_ms / 1000, max(0.0, deadline - time.monotonic())),
                      lambda: False)
        return True

    def send(self, api, body, **kw) -> Future:
        if self.connection is None:
            return Future().failure(ConnectionFailedError("coordinator unknown"))
        fut = self.network.send(self.connection, api, body, **kw)
        fut.add_callback(lambda _: self._backoff.reset())   # it answered: reachable again
        return fut
