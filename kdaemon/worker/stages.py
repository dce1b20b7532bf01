"""The pure record stages of a worker: deserialize, intercept (on_consume), and on_commit.

They take records and return records; they do not know where records come from or where they
go.  That is why they live apart from delivery (kdaemon/worker/delivery.py) and from the loop
(kdaemon/worker/pipeline.py): the daemon's worker, ``kdaemon tail`` and
``kdaemon.testing.run_plugin`` all call these same methods, so a plugin is tested against
exactly the code the daemon runs.

Errors, by stage and policy (``[daemon]``):

* deserialization: ``dlq`` (raw record to the DLQ), ``skip`` (count, log without payload),
  ``stop`` (the worker flushes and commits what came before, then exits non-zero);
* interceptor: logged and counted per plugin; the chain continues with the output of the
  last interceptor that succeeded (the Java client's ``ConsumerInterceptors`` semantics).

A ``StageObserver`` sees each of these outcomes as it happens (``run_plugin`` records them);
the worker passes none.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice

from ..client.types import ConsumerRecord
from ..config import DaemonConfig
from ..plugins.types import Record
from ..sinks.encoding import dead_letter
from .build import PipelineParts

log = logging.getLogger(__name__)


class WorkerStop(Exception):
    """Raised inside the loop when a ``stop`` policy fires; the run ends with a non-zero code."""


@dataclass
class WorkerStats:
    fetched: Counter = field(default_factory=Counter)        # per TopicPartition, after filtering
    delivered: Counter = field(default_factory=Counter)      # accepted by the sink
    dropped_by_interceptors: Counter = field(default_factory=Counter)   # per interceptor plugin name
    # per TopicPartition: (the offset last committed, when: time.time()), for the metrics
    committed: dict = field(default_factory=dict)
    dlq: Counter = field(default_factory=Counter)            # per (TopicPartition, stage)
    skipped: Counter = field(default_factory=Counter)        # per stage
    plugin_errors: Counter = field(default_factory=Counter)  # per plugin name
    sink_errors: int = 0
    flushes: int = 0
    commits: int = 0
    commit_failures: int = 0
    # Per event, for the histograms; the metrics publisher empties them, and they are bounded
    # (the oldest half goes past 1,000) where nothing publishes.
    flush_seconds: list = field(default_factory=list)
    commit_seconds: list = field(default_factory=list)
    batch_sizes: list = field(default_factory=list)

    @staticmethod
    def note(samples: list, value: float) -> None:
        samples.append(value)
        if len(samples) > 1000:
            del samples[:500]


class StageObserver:
    """Told what each stage did, beside the counters in ``WorkerStats``.  The defaults do
    nothing; ``kdaemon.testing`` overrides them to record a plugin run."""

    def deserialized(self, records: list[Record]) -> None:
        """A batch came out of the deserializers (those that failed are not in it)."""

    def deserialize_failed(self, record: ConsumerRecord, exc: Exception) -> None:
        """``record`` failed to deserialize; the policy has been applied (unless ``stop``)."""

    def intercepted(self, records: list[Record]) -> None:
        """The on_consume chain's result: what goes to the sink."""

    def interceptor_ran(self, name: str, output: list[Record] | None, exc: Exception | None) -> None:
        """``on_consume`` of ``name`` returned ``output``, or raised ``exc`` (output None)."""

    def on_commit_failed(self, name: str, exc: Exception) -> None:
        """``on_commit`` of ``name`` raised ``exc``."""


_NO_OBSERVER = StageObserver()


class Pipeline:
    """The per-batch processing, independent of where records come from (tests and ``tail``
    drive it directly; the worker feeds it from a consumer)."""

    def __init__(self, config: DaemonConfig, parts: PipelineParts, stats: WorkerStats | None = None,
                 observer: StageObserver | None = None) -> None:
        self.config = config
        self.parts = parts
        self.stats = stats or WorkerStats()
        if parts.on_filtered is not None:   # its errors count among the plugins' (kdaemon_plugin_errors_total)
            parts.on_filtered.errors = self.stats.plugin_errors
        self.observer = observer or _NO_OBSERVER
        self._key = parts.key_deserializer
        self._value = parts.value_deserializer

    def deserialize(self, raw: Sequence[ConsumerRecord]) -> tuple[list[Record], list[Record]]:
        """Return (records, dead letters).

        The hot loop unpacks each record tuple once and calls the key deserializer only when it
        is not the identity (``bytes``); a failure leaves it for ``_deserialize_failed`` and
        the loop goes on with the next record."""
        ok: list[Record] = []
        dead: list[Record] = []
        append = ok.append
        key_d, value_d = self._key, self._value
        key_is_identity = getattr(key_d, "returns_data_unchanged", False)
        start, n = 0, len(raw)
        while start < n:
            done = len(ok)
            try:
                if key_is_identity:
                    for topic, partition, offset, ts, ts_type, key, value, headers, _ in islice(raw, start, None):
                        append(Record(topic, partition, offset, ts, ts_type, key,
                                      value_d(topic, headers, value), headers, key, value))
                else:
                    for topic, partition, offset, ts, ts_type, key, value, headers, _ in islice(raw, start, None):
                        append(Record(topic, partition, offset, ts, ts_type, key_d(topic, headers, key),
                                      value_d(topic, headers, value), headers, key, value))
                break
            except Exception as exc:
                failed = start + len(ok) - done
                self._deserialize_failed(raw[failed], exc, dead)
                start = failed + 1
        self.observer.deserialized(ok)
        return ok, dead

    def _deserialize_failed(self, r: ConsumerRecord, exc: Exception, dead: list[Record]) -> None:
        where = f"{r.topic}-{r.partition}@{r.offset}"
        policy = self.config.daemon.on_deserialize_error
        if policy == "stop":
            raise WorkerStop(f"deserialization failed at {where}: {type(exc).__name__}: {exc}") from exc
        self.observer.deserialize_failed(r, exc)
        if policy == "skip":
            self.stats.skipped["deserialize"] += 1
            log.warning("skipping %s: deserialization failed: %s", where, type(exc).__name__)
            return
        dead.append(dead_letter(Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                                       r.key, r.value, r.headers, r.key, r.value), "deserialize", exc,
                                plugin=self._failed_deserializer(r)))

    def _failed_deserializer(self, r: ConsumerRecord) -> str:
        """Which deserializer raised, as ``deserializer.key=<name>`` or ``deserializer.value=<name>``
        (the dead letter says so): the loop calls both in one expression, so the key's is tried
        again alone, on the error path only."""
        d = self.config.deserializer
        if not getattr(self._key, "returns_data_unchanged", False):
            try:
                self._key(r.topic, r.headers, r.key)
            except Exception:
                return f"deserializer.key={d.key}"
        return f"deserializer.value={d.value}"

    def intercept(self, records: list[Record]) -> list[Record]:
        """Run the on_consume chain.  An interceptor that raises, or returns None, is logged
        and counted, and the next one gets the output of the last one that succeeded (so a
        buggy plugin cannot stop the daemon, nor silently drop the batch)."""
        out = records
        observer = self.observer
        for name, interceptor in self.parts.interceptors:
            try:
                result = interceptor.on_consume(out)
                if result is None:
                    raise TypeError("on_consume returned None instead of a list of records")
                result = list(result)
            except Exception as exc:
                self.stats.plugin_errors[name] += 1
                log.exception("interceptor %r raised in on_consume; continuing with its input", name)
                observer.interceptor_ran(name, None, exc)
                continue
            observer.interceptor_ran(name, result, None)
            if len(result) < len(out):
                self.stats.dropped_by_interceptors[name] += len(out) - len(result)
            out = result
        observer.intercepted(out)
        return out

    def on_commit(self, offsets) -> None:
        """Tell every interceptor what was committed; one that raises is logged and counted
        and the others are still told."""
        for name, interceptor in self.parts.interceptors:
            fn = getattr(interceptor, "on_commit", None)
            if fn is None:
                continue
            try:
                fn(offsets)
            except Exception as exc:
                self.stats.plugin_errors[name] += 1
                log.exception("interceptor %r raised in on_commit", name)
                self.observer.on_commit_failed(name, exc)
