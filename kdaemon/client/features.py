"""What a broker supports, as its ApiVersions answer says: API version ranges and the cluster's
finalized features — and, from that, which consumer group protocol a member can speak there.

KIP-848's consumer group protocol needs two things from the cluster: the broker offers
ConsumerGroupHeartbeat (API 68), and the feature ``group.version`` is finalized at level 1 or
more (KIP-1022: the controller finalizes it; a cluster upgraded from 3.x keeps level 0 until an
operator raises it, and then still offers API 68 on some versions).  Either alone is not enough:
checking only the API would send heartbeats a 3.7/3.8 preview broker answers with
UNSUPPORTED_VERSION or GROUP_ID_NOT_FOUND.  Finalized features are cluster-wide (the broker
reports what the controller finalized), so one broker's answer speaks for the cluster.

``probe`` opens its own short-lived ``NetworkClient`` and reads the answer through the client's
public wire observer, so a caller learns it before building a ``Consumer`` (whose group protocol
is fixed at construction).  ``choose_group_protocol`` is pure: the daemon's ``group_protocol =
"auto"`` is this function applied to a probe, and tests apply it to hand-written answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..protocol.apis import API_VERSIONS, CONSUMER_GROUP_HEARTBEAT
from ..protocol.versions import broker_ranges
from .config import ConsumerConfig
from .errors import NoBrokersAvailableError
from .network import NetworkClient

GROUP_VERSION = "group.version"
CLASSIC, CONSUMER = "classic", "consumer"


@dataclass(frozen=True)
class BrokerFeatures:
    """One broker's ApiVersions answer, reduced to what protocol choices depend on."""

    api_versions: Mapping[int, tuple[int, int]]
    finalized: Mapping[str, int] = field(default_factory=dict)   # feature -> finalized max level
    finalized_epoch: int = -1
    api_versions_version: int = 3   # the version of the answer: features come with v3+
    broker: str = ""                # "host:port" that answered, for log lines

    @classmethod
    def from_api_versions(cls, body: Mapping, version: int, broker: str = "") -> "BrokerFeatures":
        """From a decoded ApiVersions response body (``error_code`` 0)."""
        if body.get("error_code"):
            raise ValueError(f"an ApiVersions answer with error code {body['error_code']} carries no features")
        finalized = {f["name"]: f["max_version_level"] for f in body.get("finalized_features") or ()}
        return cls(broker_ranges(body), finalized, body.get("finalized_features_epoch", -1), version, broker)

    def offered(self, api_key: int) -> tuple[int, int] | None:
        return self.api_versions.get(api_key)

    def level(self, feature: str) -> int:
        """The finalized level of ``feature``; 0 when the cluster has not finalized it."""
        return self.finalized.get(feature, 0)


@dataclass(frozen=True)
class GroupProtocolChoice:
    """``protocol`` ("classic" or "consumer") and why, in words for a log line."""

    protocol: str
    reason: str


def choose_group_protocol(features: BrokerFeatures) -> GroupProtocolChoice:
    """"consumer" when the broker offers ConsumerGroupHeartbeat at a version this client speaks
    and ``group.version`` >= 1 is finalized; else "classic", saying which condition failed."""
    api = CONSUMER_GROUP_HEARTBEAT
    offered = features.offered(api.key)
    if offered is None:
        return GroupProtocolChoice(CLASSIC, f"broker does not offer {api.name} (API {api.key})")
    lo, hi = max(api.min_version, offered[0]), min(api.max_version, offered[1])
    offers = f"broker offers {api.name} v{offered[0]}-{offered[1]}"
    if lo > hi:
        return GroupProtocolChoice(CLASSIC, f"{offers}; this client speaks v{api.min_version}-{api.max_version}")
    if features.api_versions_version < 3:
        return GroupProtocolChoice(CLASSIC, f"{offers} but answered ApiVersions v{features.api_versions_version}, "
                                            f"which carries no finalized features")
    level = features.level(GROUP_VERSION)
    if level < 1:
        return GroupProtocolChoice(CLASSIC, f"{offers} but {GROUP_VERSION}={level} "
                                            f"(not finalized at 1 or more)")
    return GroupProtocolChoice(CONSUMER, f"{offers} and {GROUP_VERSION}={level}")


def probe(config: ConsumerConfig, *, timeout_ms: int | None = None,
          on_wait: Callable[[], None] | None = None) -> BrokerFeatures:
    """Connect to a bootstrap broker and return its ApiVersions answer.

    Tries the bootstrap servers in turn (with the client's reconnect backoff) until one answers
    or ``timeout_ms`` (default ``default_api_timeout_ms``) passes: then ``NoBrokersAvailableError``
    naming the last connection error.  ``on_wait`` is called about every 200 ms while waiting
    (a forked worker keeps telling its supervisor it is alive).  A TLS or SASL refusal raises
    ``AuthenticationError`` as the consumer would.
    """
    timeout = (config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000
    deadline = time.monotonic() + timeout
    net = NetworkClient(config)
    answers: list[BrokerFeatures] = []
    nodes = dict(zip(net.bootstrap_ids, config.bootstrap_servers))

    def observe(node_id, api, version, body, response) -> None:
        if response and api.key == API_VERSIONS.key and not body.get("error_code") and not answers:
            answers.append(BrokerFeatures.from_api_versions(body, version, nodes.get(node_id, str(node_id))))

    net.observers.append(observe)
    try:
        while not answers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoBrokersAvailableError(
                    f"no broker of {', '.join(config.bootstrap_servers)} answered ApiVersions within "
                    f"{timeout:.0f} s (last error: {net.last_connection_error() or 'none'})")
            node = net.least_loaded_node()
            if node is not None:
                net.ready(node)   # starts connecting; raises a permanent authentication error
            net.poll(min(remaining, 0.2), until=lambda: bool(answers))
            if on_wait is not None and not answers:
                on_wait()
        return answers[0]
    finally:
        net.close()
