"""A kdaemon plugin for the chaos run: the ``chaos_jsonl`` and ``chaos_spark`` sinks, the
built-in jsonl and spark sinks refusing every write while a trigger file exists.

The run creates the file to make the sink fail for a window (20 s) and removes it after; the
daemon must retry the refused batches (``on_sink_error = "retry"``) and lose nothing.  Only
``write()`` fails, and it fails before the wrapped sink sees the batch: that is a sink refusing
a batch whole, the failure a real one has when its storage is away.  (Failing ``flush()`` here
would not be faithful: the wrapped sink would still hold the written records, which a real
failed flush cuts off.)  Everything else (``flush_async``, ``commit_metadata``,
``on_partitions_assigned``, ...) is the wrapped sink's own, so the worker drives it exactly as
it drives the built-in one.

``chaos_spark`` also offers the spark sink's companion, the uploader, through the same hook the
built-in sink uses (``kdaemon_sink_companions``), with the spark settings alone.

Enabled as ``plugins = ["testkit.chaos.sink:"]`` with the repository on ``PYTHONPATH``;
``[sink] type = "chaos_jsonl"`` or ``"chaos_spark"`` takes the wrapped sink's settings plus
``fail_file``.
"""

from __future__ import annotations

import os

from kdaemon.plugins import hookimpl
from kdaemon.plugins.companion import SinkContext
from kdaemon.sinks.jsonl import JsonlSink

SINK_TYPES = {"jsonl": "chaos_jsonl", "spark": "chaos_spark"}
SINK_TYPE = SINK_TYPES["jsonl"]


REFUSALS_SUFFIX = ".refused"   # <fail_file>.refused: one line per refused write

class FailingWindowSink:
    def __init__(self, inner, fail_file: str) -> None:
        self.inner = inner
        self.fail_file = fail_file
        self.refused = 0

    def write(self, records) -> None:
        if os.path.exists(self.fail_file):
            self.refused += 1
            # Counted in a file beside the trigger (one line a refusal, appended atomically):
            # the worker logs a stall once, not every refused retry, so the log cannot count them.
            with open(self.fail_file + REFUSALS_SUFFIX, "a") as fh:
                fh.write(f"{os.getpid()}\n")
            raise OSError(f"chaos: the sink is failing on purpose while {self.fail_file} exists")
        self.inner.write(records)

    def __getattr__(self, name):
        # Only reached for what this class does not define: the wrapped sink's own interface,
        # so hasattr() answers for the wrapped sink (the worker looks for optional methods).
        return getattr(self.inner, name)


def _settings(settings: dict) -> tuple[dict, str]:
    rest = {k: v for k, v in settings.items() if k not in ("type", "fail_file")}
    fail_file = settings.get("fail_file")
    if not isinstance(fail_file, str) or not fail_file:
        raise ValueError("fail_file is required: the path whose presence makes the sink fail")
    return rest, fail_file


def _jsonl(settings: dict) -> FailingWindowSink:
    rest, fail_file = _settings(settings)
    return FailingWindowSink(JsonlSink.from_settings(rest), fail_file)


def _validate_jsonl(settings: dict) -> None:
    JsonlSink.validate_settings(_settings(settings)[0])


def _spark_factory(context: SinkContext | None):
    def make(settings: dict) -> FailingWindowSink:
        from kdaemon.sinks.spark.staging import SparkSink
        rest, fail_file = _settings(settings)
        if context is None:
            raise ValueError("chaos_spark needs the daemon's sink context (its state directory)")
        return FailingWindowSink(SparkSink(rest, context.state_dir,
                                           heartbeat_timeout_s=context.heartbeat_timeout_s), fail_file)

    def validate(settings: dict) -> None:
        from kdaemon.sinks.spark.staging import validate_settings
        validate_settings(_settings(settings)[0])

    make.validate = validate
    return make


_jsonl.validate = _validate_jsonl


@hookimpl
def kdaemon_sinks(context):
    return {SINK_TYPES["jsonl"]: _jsonl, SINK_TYPES["spark"]: _spark_factory(context)}


@hookimpl
def kdaemon_sink_companions(sink_type: str, settings: dict, context: SinkContext):
    if sink_type != SINK_TYPES["spark"]:
        return None
    from kdaemon.sinks import builtin
    return builtin.kdaemon_sink_companions("spark", _settings(settings)[0], context)
