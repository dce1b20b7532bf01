"""The ``kafka`` dead-letter queue: failed records into a Kafka topic, as Kafka Connect does.

``[dlq] type = "kafka"`` writes each dead letter with its original key, value and headers
(its timestamp in a header, see below), plus Kafka Connect's error-context headers (``errors.deadletterqueue.context.
headers.enable``), so tools written for Connect's DLQs read ours:

==========================================  =================================================
``__connect.errors.topic``                  the source topic
``__connect.errors.partition``              the source partition (decimal)
``__connect.errors.offset``                 the source offset (decimal)
``__connect.errors.stage``                  KEY_CONVERTER / VALUE_CONVERTER (deserialize),
                                            TRANSFORMATION (interceptor), TASK_PUT (sink)
``__connect.errors.class.name``             the plugin that raised (``json``, ``jsonl`` ...)
``__connect.errors.exception.class.name``   the exception's type
``__connect.errors.exception.message``      its message
==========================================  =================================================

kdaemon's own ``kdaemon.error``, ``kdaemon.stage`` and ``kdaemon.plugin`` headers
(``encoding.dead_letter``) stay as well: the daemon counts DLQ records by ``kdaemon.stage``.

The original timestamp goes into ``kdaemon.original.timestamp`` (milliseconds, decimal) and
the dead letter itself is stamped with the time it was written, unlike Connect, which keeps
the original.  Kafka keeps an idempotent producer's state by its records' timestamps: a broker
restarting drops every producer whose newest record is older than
``producer.id.expiration.ms`` (1 day), and the retry of a batch it had appended is then
written a second time (seen on Kafka 4.4: test_kafka_dlq_kafka.py); time retention would also
delete dead letters of old records at once.

Records go through kdaemon's own idempotent producer (``client/producer.py``: acks=all, one
batch in flight per partition, retries with the same sequence), keyed records to the
partition Java's partitioner would choose.  ``write`` only queues; ``flush`` returns once the
brokers acknowledged every record, or raises, and the worker commits the source offsets only
after it returned (invariant 12).  So a broker restart in the middle of a flush costs time,
never a record, and the retries write nothing twice.  What this cannot cover: a flush that
gives up (``timeout_ms``) or a worker that dies between the DLQ's flush and its commit reads
the records again with a new producer, whose dead letters the old producer may already have
written.

What fails for good is told apart from what passes, once (``client/errors.REFUSALS``), and
raised as the sinks' one permanent error, ``SinkRefused``: a topic that does not exist (asked
before the worker consumes anything, ``preflight``, and by ``kdaemon check-config``), an ACL
refusing the producer, a login refused, a setting the cluster refuses — the worker stops the
daemon (exit 6) naming the topic and the fix.  A dead letter refused for what it is (larger than
the topic's ``max.message.bytes``) is named after every other one was acknowledged, and the
worker stops at it (exit 3, everything before it committed).  Anything else (no broker
answers, a flush that times out) is transient: the worker retries, and ``probe`` tells it when
the cluster answers again.

Settings: ``topic`` (required; it must exist, unless ``create_topic``),
``create_topic`` (default false: the sink creates its topic before the worker consumes anything
if it does not exist, as Kafka Connect creates its DLQ topic; ``partitions`` and
``replication_factor`` for it, default the broker's ``num.partitions`` and
``default.replication.factor``; ``check-config`` asks the cluster to validate the creation
without creating), ``bootstrap_servers`` (default: the consumer's, with the consumer's TLS and SASL settings),
``compression`` (``none``, ``gzip``, ``snappy``, ``lz4``, ``zstd``; default ``none``),
``timeout_ms`` (how long a flush may wait for the acknowledgements, default 30000; below
``[daemon] heartbeat_timeout_s``, or the supervisor kills the waiting worker).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..client.admin import NewTopic, TopicCreateRefused, TopicCreateUnavailable, create_topics
from ..client.config import ConsumerConfig
from ..client.errors import (AuthenticationError, KafkaClientError, KafkaTimeoutError, RecordsRefusedError,
                             RefusedError, UnknownTopicError)
from ..client.lookup import refused_topics
from ..client.producer import Producer, ProducerSettings, connection_config
from ..plugins.companion import SinkContext
from ..plugins.types import Record, SinkRefused
from ..protocol.compression import CODEC_BY_NAME
from ..settings import found, parse_settings, setting
from .encoding import ERROR_HEADER, PLUGIN_HEADER, STAGE_HEADER, error_parts

DEFAULT_TIMEOUT_MS = 30_000
# How long one look at the topic (a Metadata request) may take: at start-up before consuming,
# and as the probe while the worker waits for the cluster (it blocks the worker's loop).
PREFLIGHT_TIMEOUT_MS = 5_000
PROBE_TIMEOUT_MS = 2_000
CONNECT = "__connect.errors."
ORIGINAL_TIMESTAMP_HEADER = "kdaemon.original.timestamp"
# kdaemon's stage → Kafka Connect's ErrorReporter.Stage.
_CONNECT_STAGES = {"interceptor": "TRANSFORMATION", "sink": "TASK_PUT", "delivery": "KAFKA_CONSUME"}


@dataclass(frozen=True)
class KafkaDlqSettings:
    """The table of ``type = "kafka"``, a sink meant for ``[dlq]`` (``kdaemon.settings.parse_settings``)."""

    topic: str = setting(pattern=r"(?s).*\S.*", expected="a topic name",
                         needs="the Kafka topic dead letters are written to")
    bootstrap_servers: str | tuple[str, ...] | None = setting(
        None, expected="a string or a list of strings (host:port)")
    compression: str = setting("none", choices=tuple(CODEC_BY_NAME))
    timeout_ms: int = setting(DEFAULT_TIMEOUT_MS, min=1, expected="a positive integer (milliseconds)")
    create_topic: bool = setting(False)
    partitions: int | None = setting(None, min=1, expected="a positive integer (the new topic's partitions)")
    replication_factor: int | None = setting(None, min=1,
                                             expected="a positive integer (the new topic's replicas per partition)")

    def new_topic(self) -> NewTopic | None:
        """The topic to create when it is missing (None: ``create_topic`` is off)."""
        if not self.create_topic:
            return None
        return NewTopic(self.topic.strip(), self.partitions or -1, self.replication_factor or -1)

    def servers(self) -> tuple[str, ...] | None:
        """``bootstrap_servers`` as the producer takes them: a comma-separated string split
        (empty parts dropped), a list's elements stripped (an empty one is a problem)."""
        if self.bootstrap_servers is None:
            return None
        if isinstance(self.bootstrap_servers, str):
            return tuple(s.strip() for s in self.bootstrap_servers.split(",") if s.strip())
        return tuple(s.strip() for s in self.bootstrap_servers)


def _parse(settings: Mapping, context: SinkContext | None) -> tuple[str, dict, str, int, NewTopic | None]:
    """(topic, the connection's overrides, codec, timeout_ms, the topic to create if missing);
    ``SettingsError`` naming every problem, those that need the daemon's context (``[kafka]``,
    the heartbeat timeout) too."""
    s = parse_settings(KafkaDlqSettings, settings, "sink", check=lambda s: _context_problems(s, context))
    servers = s.servers()
    return s.topic.strip(), ({"bootstrap_servers": servers} if servers is not None else {}), s.compression, \
        s.timeout_ms, s.new_topic()


def _context_problems(s: KafkaDlqSettings, context: SinkContext | None) -> Iterator[tuple[str, str]]:
    if not s.create_topic:
        for key in ("partitions", "replication_factor"):
            if getattr(s, key) is not None:
                yield key, "only with create_topic = true (it is for the topic the sink creates)"
    servers = s.servers()
    if servers is not None and (not servers or not all(servers)):
        yield "bootstrap_servers", f"expected a host:port string or a non-empty list of them, " \
                                   f"found {found(s.bootstrap_servers)}"
        return
    if context is not None and context.heartbeat_timeout_s and s.timeout_ms >= context.heartbeat_timeout_s * 1000:
        yield "timeout_ms", (f"expected an integer below [daemon] heartbeat_timeout_s "
                             f"({context.heartbeat_timeout_s:g} s, after which the supervisor kills a worker "
                             f"blocked that long), found {found(s.timeout_ms)}")
    kafka: Mapping[str, Any] = context.kafka if context is not None else {}
    if "bootstrap_servers" not in kafka and servers is None:
        yield "bootstrap_servers", "required when [kafka] has none"
        return
    try:
        connection_config(kafka, **({"bootstrap_servers": servers} if servers is not None else {}))
    except (TypeError, ValueError) as exc:
        text = str(exc).replace("invalid consumer configuration: ", "")
        yield ("bootstrap_servers" if servers is not None and text.startswith("bootstrap server") else ""), \
            f"connection settings: {text}"


def connect_headers(record: Record) -> list[tuple[str, bytes | None]]:
    """The record's headers plus Kafka Connect's error context, read from the headers
    ``encoding.dead_letter`` added (the last of each name counts: an original record may carry
    its own ``kdaemon.*`` headers from an earlier trip through a DLQ)."""
    ours = {k: v for k, v in record.headers if k in (ERROR_HEADER, STAGE_HEADER, PLUGIN_HEADER)}
    stage = (ours.get(STAGE_HEADER) or b"").decode("utf-8", "replace")
    setting, _, plugin = (ours.get(PLUGIN_HEADER) or b"").decode("utf-8", "replace").partition("=")
    if stage == "deserialize":
        connect_stage = "KEY_CONVERTER" if setting == "deserializer.key" else "VALUE_CONVERTER"
    else:
        connect_stage = _CONNECT_STAGES.get(stage, stage.upper() or "UNKNOWN")
    exc_class, message = error_parts((ours.get(ERROR_HEADER) or b"").decode("utf-8", "replace"))
    context = [("topic", record.topic), ("partition", str(record.partition)), ("offset", str(record.offset)),
               ("stage", connect_stage)]
    if plugin:
        context.append(("class.name", plugin))
    if exc_class is not None:
        context.append(("exception.class.name", exc_class))
    context.append(("exception.message", message))
    return list(record.headers) + [(CONNECT + name, value.encode("utf-8")) for name, value in context]


def check_topic(config: ConsumerConfig, topic: str, timeout_ms: int, create: NewTopic | None = None, *,
                validate_only: bool = False) -> str | None:
    """None when the cluster has ``topic`` and lets this principal see it; why it cannot tell
    when no broker answers within ``timeout_ms`` (transient: ask again); ``SinkRefused`` when
    the topic is missing or refused, or the login is.  A missing topic is created first when
    ``create`` says how (``validate_only``: the cluster only says whether it would be, for
    check-config); another worker creating it at the same time is no refusal (``exist_ok``)."""
    try:
        refused = refused_topics(config, [topic], timeout_ms=timeout_ms).get(topic)
        if isinstance(refused, UnknownTopicError) and create is not None:
            create_topics(config, [create], exist_ok=True, validate_only=validate_only, timeout_ms=timeout_ms)
            refused = None
    except (KafkaTimeoutError, TopicCreateUnavailable) as exc:
        return str(exc)
    except TopicCreateRefused as exc:
        raise SinkRefused(f"dead-letter topic {topic} does not exist and cannot be created (create_topic = true): "
                          f"{exc}", target=topic, fix=exc.fix) from None
    except AuthenticationError as exc:
        raise refused_for_good(topic, exc) from None
    if isinstance(refused, UnknownTopicError):   # and create_topic is off
        raise SinkRefused(f"dead-letter topic {topic}: {refused}", target=topic,
                          fix=f"{refused.fix}; or let the sink create it: create_topic = true in [dlq]")
    if refused is not None:
        raise refused_for_good(topic, refused)
    return None


def refused_for_good(topic: str, exc: KafkaClientError) -> SinkRefused:
    """The client's permanent errors as the sinks' one permanent error."""
    if isinstance(exc, RecordsRefusedError):
        return SinkRefused(f"dead-letter topic {topic} refused {len(exc.records)} dead letter(s): {exc}",
                           target=topic, fix=exc.fix, records=[r.tag for r in exc.records])
    if isinstance(exc, AuthenticationError):
        return SinkRefused(f"dead-letter topic {topic}: the cluster refused the DLQ producer's login: {exc}",
                           target=topic, fix="check the connection settings the DLQ uses ([dlq] bootstrap_servers, "
                                             "[kafka] security_protocol, sasl_* and ssl_*)")
    return SinkRefused(f"dead-letter topic {topic}: {exc}", target=topic, fix=getattr(exc, "fix", ""))


def preflight_settings(settings: Mapping, context: SinkContext | None,
                       timeout_ms: int = PREFLIGHT_TIMEOUT_MS) -> str | None:
    """``check_topic`` for a ``[dlq]`` table, without building the sink (``kdaemon
    check-config``)."""
    topic, overrides, _, _, create = _parse(settings, context)
    return check_topic(connection_config(context.kafka if context is not None else {}, **overrides), topic,
                       timeout_ms, create, validate_only=True)


class KafkaDeadLetterSink:
    """Dead letters into ``topic`` through an idempotent producer (see the module docstring)."""

    def __init__(self, topic: str, producer: Producer, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 create: NewTopic | None = None) -> None:
        self.topic = topic
        self.producer = producer
        self.timeout_ms = timeout_ms
        self.create = create

    @classmethod
    def validate_settings(cls, settings: Mapping, context: SinkContext | None = None) -> None:
        """The checks of ``from_settings`` without connecting (for check-config)."""
        _parse(settings, context)

    @classmethod
    def from_settings(cls, settings: Mapping, context: SinkContext | None = None) -> "KafkaDeadLetterSink":
        topic, overrides, codec, timeout_ms, create = _parse(settings, context)
        config = connection_config(context.kafka if context is not None else {}, **overrides)
        producer = Producer(config, ProducerSettings(compression=codec, client_id_suffix="-dlq"))
        return cls(topic, producer, timeout_ms, create)

    def write(self, records: Sequence[Record]) -> None:
        """Queue the dead letters (raw key and value, as ``dead_letter`` made them)."""
        send = self.producer.send
        try:
            for r in records:
                headers = connect_headers(r)
                headers.append((ORIGINAL_TIMESTAMP_HEADER, str(r.timestamp).encode("ascii")))
                send(self.topic, _raw(r.raw_key, r.key), _raw(r.raw_value, r.value), headers, tag=r)  # stamped now
        except RefusedError as exc:   # the producer failed for good earlier
            raise refused_for_good(self.topic, exc) from None

    def flush(self) -> None:
        """Block until the brokers acknowledged every record written.  Raise ``SinkRefused``
        for a refusal no retry changes (with ``records`` when only those dead letters are
        refused, every other one acknowledged), anything else (the worker then commits nothing
        and tries again) when they were not acknowledged within ``timeout_ms``."""
        try:
            self.producer.flush(self.timeout_ms / 1000)
        except (RefusedError, AuthenticationError) as exc:
            raise refused_for_good(self.topic, exc) from None

    def preflight(self) -> str | None:
        """Before the worker consumes anything: does the topic exist (``check_topic``; created
        here when it does not and ``create_topic`` is on)?"""
        return check_topic(self.producer.config, self.topic, min(self.timeout_ms, PREFLIGHT_TIMEOUT_MS), self.create)

    def probe(self) -> str | None:
        """While the worker waits after a failed flush: does the cluster answer, and is the topic
        still there?  (A short-lived client: the producer may be closed.)"""
        return check_topic(self.producer.config, self.topic, min(self.timeout_ms, PROBE_TIMEOUT_MS))

    def close(self) -> None:
        self.producer.close()


def _raw(raw: bytes | None, data: Any) -> bytes | None:
    if raw is not None:
        return raw
    if data is None or isinstance(data, (bytes, bytearray, memoryview)):
        return None if data is None else bytes(data)
    raise TypeError(f"a dead letter's key and value must be bytes or None, not {type(data).__name__} "
                    "(encoding.dead_letter keeps the broker's bytes)")
