"""The loaded configuration as typed dataclasses, and the one error every problem is reported in.

The annotations here are also the configuration's type schema: ``kdaemon.settings`` reads
them to check a file's values and to word each problem, so a field's type is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..settings import setting

DEFAULT_PLUGINS = ("header_rules", "ttl", "json")
ERROR_POLICIES_DESERIALIZE = ("dlq", "skip", "stop")
ERROR_POLICIES_SINK = ("retry", "dlq", "stop")
# [kafka] group_protocol: the consumer's two (Java's group.protocol) and the daemon's "auto",
# which each worker resolves against the broker when it starts (kdaemon.client.features).
GROUP_PROTOCOLS = ("auto", "classic", "consumer")
# [kafka] group_type: "consumer" (a consumer group: partitions assigned to workers, offsets
# committed after the sink) or "share" (a share group, KIP-932: records handed out one by one
# under a lock, acknowledged after the sink; any number of workers per partition).
GROUP_TYPES = ("consumer", "share")
# [share] auto_offset_reset: the group's share.auto.offset.reset; "by_duration:<ISO-8601>" too.
SHARE_OFFSET_RESETS = ("earliest", "latest")
SHARE_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
# Without a [dlq] table, records an error policy sends to the DLQ are kept as JSON lines here,
# under daemon.state_dir: a policy of "dlq" (the default for deserialize errors) must never
# need a section the operator did not write, and must never drop a record instead.
DEFAULT_DLQ_DIR = "dlq"
# [daemon] on_stop: what a stop of the daemon (SIGTERM, systemctl stop) does with the workers'
# static group memberships.  "keep_membership": each worker stays a member for its successor (a
# restart gets every partition back with nothing moved; until the session times out the group
# keeps members and a reset of its offsets is refused).  "leave_group": each leaves for good,
# as Java's close(CloseOptions.groupMembershipOperation(LEAVE_GROUP)), and the group empties at
# once.  ``kdaemon stop --leave-group`` (LEAVE_SIGNAL) does the latter for one stop.
ON_STOP = ("keep_membership", "leave_group")


class ConfigError(Exception):
    """Every problem found in a configuration file, one per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class FilterConfig:
    """One ``[[filters]]`` entry: a declarative rule, or ``plugin`` naming a filter factory."""

    header: str | None = None
    op: str | None = None
    values: tuple[str, ...] = ()
    action: str = "keep"
    plugin: str | None = None
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class InterceptorConfig:
    name: str
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DeserializerConfig:
    key: str = "bytes"
    value: str = "bytes"
    settings: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SinkConfig:
    type: str = "jsonl"
    settings: dict = field(default_factory=dict)  # the whole [sink] table, type included
    # True for the DLQ the daemon chose because the file has no [dlq] (see DEFAULT_DLQ_DIR).
    implicit: bool = False


@dataclass(frozen=True)
class DaemonSection:
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    workers: int = 0                  # 0: one per CPU
    assignment: str = "group"         # group | static
    daemon_id: str = ""               # static membership ids are "<daemon_id>-<index>"
    poll_timeout_ms: int = 500
    flush_interval_ms: int = 1000
    flush_max_records: int = 50_000
    max_buffered_records: int = 200_000
    on_deserialize_error: str = "dlq"
    on_sink_error: str = "retry"
    sink_retry_backoff_ms: int = 200
    sink_retry_backoff_max_ms: int = 30_000
    sink_probe_max_ms: int = 5_000    # a paused worker probes its sink at least this often
    filter_default: str = "auto"      # keep | drop | auto (the opposite of the last rule's action)
    state_dir: str = "./var/kdaemon"
    metrics_addr: str = "127.0.0.1:9464"
    # The supervisor's endpoints (/metrics, the control socket), each: a client's whole request
    # within this long of connecting, and this many clients at once (supervisor/connections.py).
    endpoint_request_timeout_s: float = 5.0
    endpoint_max_clients: int = 64
    shutdown_timeout_s: float = 30.0
    on_stop: str = "keep_membership"  # keep_membership | leave_group (ON_STOP)
    heartbeat_timeout_s: float = 60.0
    metrics_interval_ms: int = 1000   # how often a worker publishes its /metrics counters
    max_worker_rss_mb: int = 0        # 0: never recycle
    memory_budget_mb: int = 80        # per worker; 0: no budget (kdaemon/worker/memory.py)
    log_level: str = "INFO"


@dataclass(frozen=True)
class ShareSection:
    """``[share]``: the share group's own settings, which the daemon sets on the GROUP resource
    (IncrementalAlterConfigs) when worker 0 starts.  None: not set by the daemon, the group's
    (or the broker's default) value stays as it is."""

    auto_offset_reset: str | None = None        # share.auto.offset.reset
    record_lock_duration_ms: int | None = None  # share.record.lock.duration.ms
    delivery_count_limit: int | None = None     # share.delivery.count.limit
    isolation_level: str | None = None          # share.isolation.level

    # Each setting and the group config it sets, in the order check-config names them.
    GROUP_CONFIGS = (("auto_offset_reset", "share.auto.offset.reset"),
                     ("record_lock_duration_ms", "share.record.lock.duration.ms"),
                     ("delivery_count_limit", "share.delivery.count.limit"),
                     ("isolation_level", "share.isolation.level"))

    def group_configs(self) -> dict[str, str]:
        """{group config name: value as the broker takes it} of the settings given."""
        return {name: str(getattr(self, key)) for key, name in self.GROUP_CONFIGS
                if getattr(self, key) is not None}


# [otel]: the OTLP protocols the bundled otel plugin's exporters speak (OTel's names, as in
# OTEL_EXPORTER_OTLP_PROTOCOL); http/json has no exporter in the Python SDK.
OTEL_PROTOCOLS = ("http/protobuf", "grpc")


@dataclass(frozen=True)
class OtelSection:
    """``[otel]``: where the bundled ``otel`` plugin sends its traces (plugins/kdaemon_otel/).

    Every key is optional: one left out leaves the standard ``OTEL_*`` variable (then the
    SDK's default) in charge, and a key given wins over its variable, as the SDK's own
    constructor arguments do.  Parsed by ``kdaemon.settings.parse_settings``, so a bad key
    reads ``otel.<key>: ...`` like any other problem of the file."""

    # The collector's base URL (http/protobuf: "/v1/traces" is added, as to
    # OTEL_EXPORTER_OTLP_ENDPOINT; grpc: "http://host:4317" plaintext, "https://..." or a bare
    # host:port TLS).  Default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT,
    # then the SDK's localhost:4318 (4317 for grpc).
    endpoint: str | None = setting(None, pattern=r"\S+", expected="a URL (http://collector:4318)")
    # Default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, then http/protobuf.
    protocol: Literal["http/protobuf", "grpc"] | None = None
    # The share of new traces kept, 0..1, parent-based (a record whose producer's span was sampled
    # is traced, one whose was not is not).  Default: OTEL_TRACES_SAMPLER(_ARG), then every trace.
    sampling: float | None = setting(None, min=0, max=1)
    # "batch": one process span per partition and sink write, linked to each record's producer
    # span; "record": one per record, a child of the producer's span, about four times the CPU
    # (docs/PERFORMANCE.md, "otel plugin").
    spans: Literal["record", "batch"] = "batch"
    # The resource's service.name.  Default: OTEL_SERVICE_NAME, then "kdaemon".
    service_name: str | None = None
    # Header-filtered records get "filter" spans too (the same shape as "process" spans), instead
    # of being only counted: the decoder then builds the records it drops to hand them over,
    # most of the header filter's early drop given up (docs/PERFORMANCE.md, "otel plugin").
    trace_filtered: bool = False


@dataclass(frozen=True)
class DaemonConfig:
    path: str
    plugins: tuple[str, ...]
    kafka: dict
    daemon: DaemonSection
    filters: tuple[FilterConfig, ...]
    deserializer: DeserializerConfig
    interceptors: tuple[InterceptorConfig, ...]
    sink: SinkConfig
    dlq: SinkConfig | None
    raw: dict
    share: ShareSection = field(default_factory=ShareSection)   # [share]; only with group_type "share"
    otel: OtelSection | None = None   # [otel]; only with the otel plugin enabled

    @property
    def group_protocol(self) -> str:
        """[kafka] group_protocol: "auto" (the default), "classic" or "consumer"."""
        return self.kafka.get("group_protocol", "auto")

    @property
    def group_type(self) -> str:
        """[kafka] group_type: "consumer" (the default) or "share" (GROUP_TYPES)."""
        return self.kafka.get("group_type", "consumer")

    def consumer_options(self) -> dict:
        """Options for ``kdaemon.client.Consumer`` (secrets resolved).  ``group_protocol`` is
        left out while it is "auto", which no consumer takes: the worker resolves it
        (``kdaemon.worker.main.resolve_group_protocol``); tools that join no group ignore it."""
        opts = dict(self.kafka)
        opts.pop("group_type", None)   # the daemon's: which client the workers build
        if opts.get("group_protocol") == "auto":
            del opts["group_protocol"]
        return opts
