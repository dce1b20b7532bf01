"""Consumer configuration: the Java consumer's settings, snake_cased, as one typed dataclass.

Defaults follow the Java consumer so operators can carry their tuning over.  Unknown options are
a ``TypeError`` naming the option (a typo must never silently fall back to a default), and values
are checked here once rather than where they are used.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from ..protocol.compression import DEFAULT_MAX_UNCOMPRESSED
from ..protocol.records import HeaderFilter

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
GROUP_PROTOCOLS = ("classic", "consumer")
# The options Java refuses with group.protocol=consumer (CLASSIC_PROTOCOL_UNSUPPORTED_CONFIGS), and why.
CLASSIC_ONLY_OPTIONS = {
    "partition_assignment_strategy": "the broker assigns partitions; choose its assignor with group_remote_assignor",
    "session_timeout_ms": "the broker decides it (group.consumer.session.timeout.ms)",
    "heartbeat_interval_ms": "the broker decides it (group.consumer.heartbeat.interval.ms)",
}
REMOTE_ASSIGNORS = ("uniform", "range")   # the assignors Apache Kafka's coordinator ships

# What each annotation of ConsumerConfig accepts, and how a problem names it.
_CHECKED_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,), "int | None": (int,), "str": (str,), "str | None": (str,), "bool": (bool,),
    "tuple[str, ...]": (tuple,)}
_TYPE_WORDS = {"int": "an integer", "int | None": "an integer or None", "str": "a string",
               "str | None": "a string or None", "bool": "true or false",
               "tuple[str, ...]": "a list of strings (or one comma-separated string)"}


@dataclass(frozen=True)
class ConsumerConfig:
    bootstrap_servers: tuple[str, ...] = ("localhost:9092",)
    client_id: str = "kdaemon"
    group_id: str | None = None
    group_instance_id: str | None = None
    client_rack: str = ""

    # fetching
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    max_poll_records: int = 500
    isolation_level: str = "read_uncommitted"
    check_crcs: bool = True
    auto_offset_reset: str = "latest"
    header_filter: HeaderFilter | None = None
    # Given the records header_filter dropped (protocol/records.py ``on_filtered``); None: they
    # are dropped inside the record loop, never built.
    on_filtered: Callable[[list], None] | None = None
    max_uncompressed_batch_bytes: int = DEFAULT_MAX_UNCOMPRESSED
    # Fetch-ahead stops while this many fetched bytes are still undrained (librdkafka's
    # queued.max.messages.kbytes): it bounds a worker's memory, not a single response.
    fetch_buffer_bytes: int = 16 * 1024 * 1024
    unknown_topic: str = "wait"  # "wait" for it to appear, or "error" once metadata says it is missing

    # groups and commits (used from the group issue on)
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5000
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300_000
    rebalance_timeout_ms: int | None = None
    partition_assignment_strategy: tuple[str, ...] = ("range", "cooperative-sticky")
    # Java's group.protocol: "classic" (JoinGroup/SyncGroup, the leader member assigns) or
    # "consumer" (KIP-848: ConsumerGroupHeartbeat, the broker assigns, incremental rebalances).
    # Under "consumer" the broker decides the session timeout and the heartbeat interval
    # (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms) and assigns
    # with its own assignor: session_timeout_ms, heartbeat_interval_ms and
    # partition_assignment_strategy cannot be set, as Java refuses them.
    group_protocol: str = "classic"
    # Java's group.remote.assignor: the broker-side assignor ("uniform", "range"); None lets
    # the broker choose (its first group.consumer.assignors).  "consumer" protocol only.
    group_remote_assignor: str | None = None
    on_consume: Callable | None = None
    on_commit: Callable | None = None

    # network
    request_timeout_ms: int = 30_000
    default_api_timeout_ms: int = 60_000
    socket_connection_setup_timeout_ms: int = 10_000
    connections_max_idle_ms: int = 540_000
    reconnect_backoff_ms: int = 50
    reconnect_backoff_max_ms: int = 1000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    metadata_max_age_ms: int = 300_000
    max_in_flight_requests_per_connection: int = 5
    receive_buffer_bytes: int = 65_536
    send_buffer_bytes: int = 131_072
    max_frame_bytes: int = 104_857_600
    allow_auto_create_topics: bool = False
    exclude_internal_topics: bool = True
    # Java's enable.metrics.push (KIP-714): push this client's metrics to a broker that
    # subscribes it (a cluster with a ClientTelemetry plugin); a broker without one is never
    # asked twice.  What is pushed: client/telemetry_metrics.py.
    enable_metrics_push: bool = True

    # security
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = field(default=None, repr=False)
    # The broker's certificate is always verified: against ssl_cafile, or the system's trust
    # store when that is unset.  ssl_check_hostname=False skips only the name check (Java's
    # ssl.endpoint.identification.algorithm=""); the chain is still verified.
    ssl_check_hostname: bool = True
    # False turns server certificate verification off altogether (chain and name): anyone on
    # the path can then pose as the broker.  Only ever by this name, never implied by another
    # setting; logged as a warning when a consumer starts with it (librdkafka's
    # enable.ssl.certificate.verification; Java has no switch and needs a trust-all truststore).
    ssl_certificate_verification: bool = True
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        problems = []
        for name in ("bootstrap_servers", "partition_assignment_strategy"):   # "a,b" or a list
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, tuple(s.strip() for s in value.split(",") if s.strip()))
            elif isinstance(value, (list, tuple)):
                object.__setattr__(self, name, tuple(value))
        mistyped = self._type_problems()
        problems += mistyped.values()   # every problem at once; the checks below skip these options
        if "bootstrap_servers" not in mistyped:
            if not self.bootstrap_servers:
                problems.append("bootstrap_servers is empty")
            for s in self.bootstrap_servers:
                try:
                    parse_address(s)
                except ValueError as exc:
                    problems.append(str(exc))
        choices = {
            "isolation_level": ("read_uncommitted", "read_committed"),
            "auto_offset_reset": ("earliest", "latest", "none"),
            "security_protocol": SECURITY_PROTOCOLS,
            "sasl_mechanism": SASL_MECHANISMS,
            "unknown_topic": ("wait", "error"),
        }
        for name, allowed in choices.items():
            if name not in mistyped and getattr(self, name) not in allowed:
                problems.append(f"{name}={getattr(self, name)!r} is not one of {', '.join(allowed)}")
        positive = ("fetch_max_bytes", "max_partition_fetch_bytes", "max_poll_records",
                    "request_timeout_ms", "max_in_flight_requests_per_connection", "max_frame_bytes",
                    "session_timeout_ms", "heartbeat_interval_ms", "max_poll_interval_ms",
                    "auto_commit_interval_ms", "max_uncompressed_batch_bytes", "fetch_buffer_bytes")
        for name in positive:
            v = getattr(self, name)
            if isinstance(v, int) and v <= 0:
                problems.append(f"{name} must be positive, got {v}")
        for name in ("fetch_min_bytes", "fetch_max_wait_ms", "reconnect_backoff_ms", "retry_backoff_ms"):
            v = getattr(self, name)
            if isinstance(v, int) and v < 0:
                problems.append(f"{name} must not be negative, got {v}")
        if self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL") and \
                (not self.sasl_username or self.sasl_password is None):
            problems.append(f"security_protocol={self.security_protocol} needs sasl_username and sasl_password")
        problems += self._group_protocol_problems()
        if problems:
            raise ValueError("invalid consumer configuration: " + "; ".join(problems))

    def _type_problems(self) -> dict[str, str]:
        """Each option against its annotation, by option name: a bool is not an integer here
        (True would be 1), and a string is not a bool ("false" would be true)."""
        problems = {}
        for f in fields(self):
            kinds = _CHECKED_TYPES.get(f.type)
            if kinds is None:
                continue                      # callables, the header filter: checked where used
            value = getattr(self, f.name)
            if f.type == "tuple[str, ...]":
                ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
            else:
                ok = value is None and "None" in f.type or \
                    isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
            if not ok:
                problems[f.name] = f"{f.name} must be {_TYPE_WORDS[f.type]}, got {value!r}"
        return problems

    def _group_protocol_problems(self) -> list[str]:
        """Java's ConsumerConfig refuses the classic-only options with group.protocol=consumer
        (CLASSIC_PROTOCOL_UNSUPPORTED_CONFIGS) and group.remote.assignor with classic.  A
        dataclass cannot tell "set" from "left at the default", so an option counts as set
        when it differs from its default."""
        problems = []
        if self.group_protocol not in GROUP_PROTOCOLS:
            return [f"group_protocol={self.group_protocol!r} is not one of {', '.join(GROUP_PROTOCOLS)}"]
        if self.group_protocol == "consumer":
            defaults = {f.name: f.default for f in fields(self)}
            for name, why in CLASSIC_ONLY_OPTIONS.items():
                if getattr(self, name) != defaults[name]:
                    problems.append(f"{name} cannot be set with group_protocol='consumer': {why}; "
                                    "leave it unset, or use group_protocol='classic'")
            if self.group_remote_assignor is not None and self.group_remote_assignor not in REMOTE_ASSIGNORS:
                problems.append(f"group_remote_assignor={self.group_remote_assignor!r} is not one of "
                                f"{', '.join(REMOTE_ASSIGNORS)} (or unset for the broker's default)")
        elif self.group_remote_assignor is not None:
            problems.append("group_remote_assignor is for group_protocol='consumer' only (the classic "
                            "protocol assigns in the client: see partition_assignment_strategy)")
        return problems

    @classmethod
    def from_options(cls, **options: Any) -> "ConsumerConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise TypeError(f"unknown consumer option(s): {', '.join(unknown)}")
        return cls(**options)

    def replace(self, **changes: Any) -> "ConsumerConfig":
        return dataclasses.replace(self, **changes)

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"


def parse_address(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    text = text.strip()
    for prefix in ("PLAINTEXT://", "SSL://", "SASL_PLAINTEXT://", "SASL_SSL://", "tcp://"):
        if text.startswith(prefix):
            text = text[len(prefix):]
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]:")
        port = rest if sep else ""
    else:
        host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"bootstrap server {text!r} is not host:port")
    return host, int(port)
