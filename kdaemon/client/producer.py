"""``Producer``: kdaemon's own idempotent producer (acks=all), for the Kafka dead-letter queue.

It speaks through the consumer's pieces: the same ``ConsumerConfig`` connection settings
(bootstrap, TLS, SASL, timeouts, backoffs), its own ``NetworkClient`` and ``ClusterMetadata``,
batches from ``protocol.builder.build_batch`` and the Produce / InitProducerId specs.  What
makes it idempotent is in ``producer_state.py`` (one batch in flight per partition, retries
with the same sequence, the epoch bump only when nothing is unresolved); this module does the
I/O and classifies the answers.

It is driven by its caller, like the consumer: ``send`` only queues; ``flush(timeout)`` sends
everything, retries, and returns once every record queued so far is acknowledged by all
in-sync replicas, or raises saying why not.  The caller commits its source offsets only after
``flush`` returned.  What a failure means is decided once, by ``client/errors.REFUSALS``:
``KafkaTimeoutError`` is transient (the records stay queued), ``RefusedError`` (a missing or
unauthorized topic, a setting the cluster refuses) is permanent and fails the producer, and
``RecordsRefusedError`` names the records refused for what they are (too large for the topic)
after every other one was acknowledged; the producer goes on without them.

Kafka remembers a producer's sequences by the timestamps of its records: a broker that
restarts drops the state of every producer whose newest record is older than
``producer.id.expiration.ms`` (1 day by default), and a retry of a batch it had appended is
then appended again.  Records stamped with old times are written twice across such a restart
(seen on Kafka 4.4); stamp them now (``timestamp=None``) where that matters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..backoff import Backoff
from ..protocol import compression
from ..protocol.apis import INIT_PRODUCER_ID, PRODUCE
from ..protocol.builder import RecordSpec, build_batch
from ..protocol.errors import BrokerError, Errors, error_code
from ..protocol.primitives import ZERO_UUID
from .config import ConsumerConfig
from .errors import (RECORD, KafkaClientError, KafkaTimeoutError, RecordsRefusedError, RefusedError,
                     RefusedRecord, missing_topic, refusal, refusal_fix, topic_refused)
from .metadata import ClusterMetadata
from .network import NetworkClient
from .partitioner import Partitioner
from .producer_state import (FAILED, NO_ID, IdempotenceState, OutgoingRecord, ProducerBatch)
from .types import TopicPartition

log = logging.getLogger(__name__)

ACKS_ALL = -1
# Retriable answers given before anything was appended (the leader moved, or too few in-sync
# replicas to start).  Every other retriable answer (REQUEST_TIMED_OUT and
# NOT_ENOUGH_REPLICAS_AFTER_APPEND above all: the leader has appended) may mean the batch is in
# the log: the next attempts must carry the same id, epoch and sequence until an answer says
# (producer_state: "unresolved").
_REFUSED_BEFORE_APPEND = {Errors.NOT_LEADER_OR_FOLLOWER, Errors.LEADER_NOT_AVAILABLE,
                          Errors.UNKNOWN_TOPIC_OR_PARTITION, Errors.FENCED_LEADER_EPOCH,
                          Errors.UNKNOWN_LEADER_EPOCH, Errors.UNKNOWN_TOPIC_ID, Errors.NOT_ENOUGH_REPLICAS}
_MAYBE_WRITTEN = {Errors.REQUEST_TIMED_OUT, Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND}
_SEQUENCE_LOST = {Errors.OUT_OF_ORDER_SEQUENCE_NUMBER, Errors.UNKNOWN_PRODUCER_ID}
# InitProducerId answers that only say "not yet" (a fresh broker loading its id block).
_CONCURRENT_TRANSACTIONS = 51
_INIT_NOT_YET = {Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.COORDINATOR_NOT_AVAILABLE, Errors.NOT_COORDINATOR,
                 _CONCURRENT_TRANSACTIONS}


# The ConsumerConfig options that say how to reach and talk to the cluster; a producer built
# from a consumer's options takes these and nothing of the group or fetch settings.
CONNECTION_OPTIONS = frozenset({
    "bootstrap_servers", "client_id", "request_timeout_ms", "socket_connection_setup_timeout_ms",
    "connections_max_idle_ms", "reconnect_backoff_ms", "reconnect_backoff_max_ms", "retry_backoff_ms",
    "retry_backoff_max_ms", "metadata_max_age_ms", "receive_buffer_bytes", "send_buffer_bytes",
    "max_frame_bytes", "security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
    "ssl_check_hostname", "ssl_certificate_verification", "sasl_mechanism", "sasl_username",
    "sasl_password"})


def connection_config(options, **overrides) -> ConsumerConfig:
    """The connection part of a consumer's options (``[kafka]``), with ``overrides`` on top."""
    return ConsumerConfig.from_options(**{k: v for k, v in dict(options, **overrides).items()
                                          if k in CONNECTION_OPTIONS})


class ProduceError(RefusedError):
    """The producer failed for good earlier (``RefusedError`` said why) and takes nothing more.
    Nothing was acknowledged that was not written."""


@dataclass(frozen=True)
class ProducerSettings:
    """What a producer adds to the connection settings.

    :param compression: ``none``, ``gzip``, ``snappy``, ``lz4`` or ``zstd`` (the batch codec).
    :param batch_max_bytes: records per batch up to about this size (Kafka's default
        ``max.message.bytes`` is 1 MiB; a batch the broker refuses as too large is split).
    :param client_id_suffix: added to the connection's ``client_id`` so the broker's logs
        and quotas tell the producer from the consumer.
    """

    compression: str = "none"
    batch_max_bytes: int = 512 * 1024
    client_id_suffix: str = "-producer"

    def __post_init__(self) -> None:
        if self.compression not in compression.CODEC_BY_NAME:
            raise ValueError(f"compression {self.compression!r} is not one of "
                             f"{', '.join(compression.CODEC_BY_NAME)}")
        if self.batch_max_bytes < 1024:
            raise ValueError(f"batch_max_bytes must be at least 1024, not {self.batch_max_bytes}")


class Producer:
    def __init__(self, config: ConsumerConfig, settings: ProducerSettings | None = None) -> None:
        self.settings = settings or ProducerSettings()
        self.config = config.replace(client_id=config.client_id + self.settings.client_id_suffix)
        self._codec = compression.CODEC_BY_NAME[self.settings.compression]
        self._net = NetworkClient(self.config)
        self._metadata = ClusterMetadata(metadata_max_age_ms=config.metadata_max_age_ms,
                                         retry_backoff_ms=config.retry_backoff_ms,
                                         allow_auto_create_topics=False)
        self._state = IdempotenceState(batch_max_bytes=self.settings.batch_max_bytes)
        self._partitioner = Partitioner()
        self._unpartitioned: list[tuple[str, OutgoingRecord]] = []
        self._init_in_flight = False
        self._init_retry_at = 0.0
        self._backoff = Backoff(config.retry_backoff_ms / 1000, config.retry_backoff_max_ms / 1000, jitter=0.2)
        self._last_problem: str | None = None
        self._refused: list[tuple[RefusedRecord, int, str]] = []   # (record, code, problem), for flush
        self._closed = False
        # Produce attempts sent, and answers by error name: for tests and the log.
        self.attempts = 0
        self.answers: dict[str, int] = {}

    # -- the public API -------------------------------------------------------------------------

    def send(self, topic: str, key: bytes | None, value: bytes | None,
             headers: Iterable[tuple[str, bytes | None]] = (), timestamp: int | None = None, *,
             tag=None) -> None:
        """Queue one record; nothing is sent before ``flush``.  The partition is chosen once the
        topic's partitions are known (``partitioner.py``).  ``tag`` comes back with the record
        if a broker refuses it (``RecordsRefusedError``)."""
        if self._closed:
            raise KafkaClientError("the producer is closed")
        if self._state.state == FAILED:
            error = self._state.error
            raise ProduceError(f"the producer failed earlier and takes no records: {error}",
                               topic=getattr(error, "topic", None), code=getattr(error, "code", None),
                               fix=getattr(error, "fix", ""))
        for what, data in (("key", key), ("value", value)):
            if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
                raise TypeError(f"a record's {what} must be bytes or None, not {type(data).__name__}")
        hdrs = tuple((str(k), None if v is None else bytes(v)) for k, v in headers)
        ts = int(time.time() * 1000) if timestamp is None or timestamp < 0 else int(timestamp)
        self._metadata.want({topic})
        self._unpartitioned.append((topic, OutgoingRecord(None if key is None else bytes(key),
                                                          None if value is None else bytes(value), hdrs, ts, tag)))

    def flush(self, timeout: float) -> None:
        """Return once every record sent so far is acknowledged by all in-sync replicas.

        Raises ``KafkaTimeoutError`` (naming what was waited for, the records stay queued),
        ``UnknownTopicError`` for a topic the cluster does not have, ``RefusedError`` for any
        other permanent refusal, ``AuthenticationError`` for refused credentials, and
        ``RecordsRefusedError`` once every record but the refused ones is acknowledged."""
        deadline = time.monotonic() + timeout
        while True:
            self._raise_if_failed()
            now = time.monotonic()
            self._step(now)
            self._raise_if_failed()
            if not self._unpartitioned and self._state.unacknowledged() == 0:
                self._raise_refused()
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KafkaTimeoutError(
                    f"{self.unacknowledged()} record(s) not acknowledged within {timeout:g} s "
                    f"(producer {self._state.describe()}; last problem: {self._last_problem or 'none'}; "
                    f"last connection error: {self._net.last_connection_error() or 'none'})")
            self._wait(min(remaining, self._next_wake(now)))

    def unacknowledged(self) -> int:
        return len(self._unpartitioned) + self._state.unacknowledged()

    @property
    def producer_id(self) -> int:
        return self._state.producer_id

    @property
    def producer_epoch(self) -> int:
        return self._state.producer_epoch

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        left = self.unacknowledged()
        if left:
            # Its caller knows (a flush raised) and says what becomes of them, once.
            log.debug("producer closed with %d record(s) not acknowledged (they were not committed)", left)
        self._net.close()

    # -- one round ------------------------------------------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._state.state == FAILED:
            raise self._state.error if isinstance(self._state.error, KafkaClientError) else \
                ProduceError(str(self._state.error))
        err = self._net.auth_error()
        if err is not None:
            raise err

    def _raise_refused(self) -> None:
        """The records refused since the last flush, now that all the others are acknowledged."""
        if not self._refused:
            return
        refused, self._refused = self._refused, []
        first, code, problem = refused[0]
        more = f" and {len(refused) - 1} more" if len(refused) > 1 else ""
        raise RecordsRefusedError(f"{problem}{more}", [r for r, _, _ in refused], topic=first.topic, code=code,
                                  fix=refusal_fix(code, first.topic, self.config.bootstrap_servers))

    def _step(self, now: float) -> None:
        self._metadata.maybe_update(self._net, now)
        self._partition_waiting()
        state = self._state
        if state.maybe_bump():
            log.info("idempotent producer: sequences restarted under producer id %s epoch %s",
                     state.producer_id, state.producer_epoch)
        if state.state == NO_ID:
            self._init_producer_id(now)
        by_leader: dict[int, list[ProducerBatch]] = {}
        for batch in state.sendable(now):
            if batch.tp.topic in self._metadata.missing_topics:
                # The topic went away under queued batches (deleted): no retry brings it back.
                state.fail(missing_topic(batch.tp.topic, self.config.bootstrap_servers))
                return
            leader = self._metadata.leader_for(batch.tp)
            if leader is None:
                self._metadata.request_update()
                continue
            if not self._net.ready(leader):
                continue
            by_leader.setdefault(leader, []).append(batch)
        for leader, batches in by_leader.items():
            self._send(leader, batches)

    def _partition_waiting(self) -> None:
        if not self._unpartitioned:
            return
        servers = self.config.bootstrap_servers
        missing = sorted(t for t, _ in self._unpartitioned if t in self._metadata.missing_topics)
        if missing:
            raise missing_topic(missing[0], servers)   # the records stay queued: nothing is lost
        unauthorized = sorted(t for t, _ in self._unpartitioned if t in self._metadata.unauthorized_topics)
        if unauthorized:
            raise topic_refused(unauthorized[0], Errors.TOPIC_AUTHORIZATION_FAILED, servers)
        waiting = []
        for topic, record in self._unpartitioned:
            partitions = self._metadata.partitions_for(topic)
            if not partitions:
                waiting.append((topic, record))
                continue
            p = self._partitioner.partition(topic, record.key, len(partitions))
            self._state.append(TopicPartition(topic, p), record)
        self._unpartitioned = waiting

    def _init_producer_id(self, now: float) -> None:
        if self._init_in_flight or now < self._init_retry_at:
            return
        node = self._net.least_loaded_node()
        if node is None or not self._net.ready(node):
            return
        self._state.init_sent()
        self._init_in_flight = True
        fut = self._net.send(node, INIT_PRODUCER_ID, {"transactional_id": None,
                                                      "transaction_timeout_ms": 60_000})

        def done(value) -> None:
            self._init_in_flight = False
            body = value[1]
            code = body["error_code"]
            if code == Errors.NONE:
                self._backoff.reset()
                self._state.initialized(body["producer_id"], body["producer_epoch"])
                log.debug("idempotent producer id %s epoch %s", body["producer_id"], body["producer_epoch"])
            elif code in _INIT_NOT_YET or error_code(code).retriable:
                self._retry_init(str(BrokerError(code, "InitProducerId")))
            else:
                topics = ", ".join(sorted(self._metadata.wanted)) or "(none yet)"
                self._state.fail(RefusedError(f"InitProducerId refused: {BrokerError(code)}", code=code,
                                              fix=refusal_fix(code, topics, self.config.bootstrap_servers)))

        def failed(exc) -> None:
            self._init_in_flight = False
            self._retry_init(f"InitProducerId to node {node}: {exc}")

        fut.add_callback(done)
        fut.add_errback(failed)

    def _retry_init(self, problem: str) -> None:
        self._last_problem = problem
        self._init_retry_at = time.monotonic() + self._backoff.failure()
        self._state.init_retry()

    def _send(self, leader: int, batches: list[ProducerBatch]) -> None:
        state = self._state
        topics: dict[str, list[dict]] = {}
        for batch in batches:
            pid, epoch, seq = state.sequence_for(batch)
            first_ts = batch.records[0].timestamp
            raw = build_batch([RecordSpec(r.key, r.value, list(r.headers), r.timestamp - first_ts)
                               for r in batch.records],
                              codec=self._codec, base_timestamp=first_ts, leader_epoch=-1,
                              producer_id=pid, producer_epoch=epoch, base_sequence=seq)
            state.mark_sent(batch)
            topics.setdefault(batch.tp.topic, []).append({"index": batch.tp.partition, "records": raw})
        # Produce v13 names topics by id; without ids in metadata, stay at v12.
        max_version = None if all(self._metadata.topic_id(t) != ZERO_UUID for t in topics) else 12
        body = {"transactional_id": None, "acks": ACKS_ALL, "timeout_ms": self.config.request_timeout_ms,
                "topic_data": [{"name": t, "topic_id": self._metadata.topic_id(t), "partition_data": parts}
                               for t, parts in topics.items()]}
        self.attempts += len(batches)
        fut = self._net.send(leader, PRODUCE, body, max_version=max_version,
                             timeout_ms=self.config.request_timeout_ms + 1_000)
        fut.add_callback(lambda value: self._on_response(leader, batches, value[1]))
        fut.add_errback(lambda exc: self._on_failure(leader, batches, exc))

    # -- answers --------------------------------------------------------------------------------

    def _on_failure(self, leader: int, batches: list[ProducerBatch], exc: BaseException) -> None:
        """No answer (connection lost, timed out): each batch may or may not be written."""
        self._last_problem = f"Produce to node {leader}: {exc}"
        self._count("NO_ANSWER")
        log.warning("Produce to node %s got no answer (%s): %d batch(es) go again with the same sequence",
                    leader, exc, len(batches))
        self._metadata.request_update()
        at = time.monotonic() + self._backoff.failure()
        for batch in batches:
            self._state.retry(batch, at, outcome_unknown=True)

    def _on_response(self, leader: int, batches: list[ProducerBatch], body: dict) -> None:
        answers = {}
        for t in body["responses"]:
            name = t.get("name") or self._metadata.topic_names.get(t.get("topic_id"), "")
            for p in t["partition_responses"]:
                answers[TopicPartition(name, p["index"])] = p
        for batch in batches:
            p = answers.get(batch.tp)
            if p is None:   # not answered for: as good as no answer
                self._on_failure(leader, [batch], KafkaClientError(f"no answer for {batch.tp} in a Produce response"))
                continue
            self._on_partition(batch, p)

    def _on_partition(self, batch: ProducerBatch, p: dict) -> None:
        state, code = self._state, p["error_code"]
        self._count(error_code(code).name)
        if code in (Errors.NONE, Errors.DUPLICATE_SEQUENCE_NUMBER):
            # A duplicate: this very sequence was written before (an earlier attempt whose
            # answer was lost).  Kafka answers the ones it still caches with success and the
            # first append's offset; DUPLICATE_SEQUENCE_NUMBER for older ones.
            self._backoff.reset()
            state.acknowledged(batch, p["base_offset"])
            return
        where = f"{batch.tp} (producer id {batch.producer_id}, epoch {batch.producer_epoch}, " \
                f"sequence {batch.base_sequence})"
        problem = f"{where}: {BrokerError(code, 'Produce', p.get('error_message'))}"
        self._last_problem = problem
        if code in _SEQUENCE_LOST:
            log.warning("%s: the broker lost this producer's state; restarting sequences under a new epoch",
                        problem)
            state.sequence_lost(batch)
        elif code == Errors.INVALID_PRODUCER_EPOCH:
            log.warning("%s: asking for a new producer id", problem)
            state.id_lost(batch)
        elif code in _REFUSED_BEFORE_APPEND or code in _MAYBE_WRITTEN or error_code(code).retriable:
            leader = p.get("current_leader") or {}
            if leader.get("leader_id", -1) >= 0:   # KIP-951: the new leader comes with the answer
                self._metadata.update_leader(batch.tp, leader["leader_id"], leader["leader_epoch"])
            self._metadata.request_update()
            log.info("%s: retrying with the same sequence", problem)
            state.retry(batch, time.monotonic() + self._backoff.failure(),
                        outcome_unknown=code not in _REFUSED_BEFORE_APPEND)
        elif refusal(code).refuses == RECORD:
            # Which record: halve the batch until the refused one is alone (an earlier attempt
            # that may be in the log keeps its records together: then the producer fails).
            n = len(batch.records)
            if state.split(batch):
                log.info("%s: batch of %d records split in two", problem, n)
            elif batch.unresolved:
                state.fail(RefusedError(f"{problem} (a batch that may have been written already)",
                                        topic=batch.tp.topic, code=code,
                                        fix=refusal_fix(code, batch.tp.topic, self.config.bootstrap_servers)))
            else:
                (record,) = state.refuse(batch)
                self._refused.append((RefusedRecord(record.tag, batch.tp.topic, record.size()), code,
                                      f"{problem}: a record of about {record.size()} bytes"))
        else:
            state.fail(topic_refused(batch.tp.topic, code, self.config.bootstrap_servers,
                                     p.get("error_message") or ""), batch)

    def _count(self, name: str) -> None:
        self.answers[name] = self.answers.get(name, 0) + 1

    # -- waiting --------------------------------------------------------------------------------

    def _next_wake(self, now: float) -> float:
        """How long nothing can happen unless the network brings something."""
        wake = 0.2   # connection set-up and request deadlines are checked between selects
        retry = self._state.next_retry()
        if retry is not None:
            wake = min(wake, max(0.0, retry - now))
        if self._state.state == NO_ID and not self._init_in_flight:
            wake = min(wake, max(0.0, self._init_retry_at - now))
        return max(wake, 0.001)

    def _wait(self, timeout: float) -> None:
        progress = self._net.progress
        self._net.poll(timeout, until=lambda: self._net.progress != progress)
