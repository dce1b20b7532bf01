"""A kdaemon plugin for the chaos run: the ``chaos_jsonl`` sink, the built-in jsonl sink that
refuses every write while a trigger file exists.

The run creates the file to make the sink fail for a window (20 s) and removes it after; the
daemon must retry the refused batches (``on_sink_error = "retry"``) and lose nothing.  Only
``write()`` fails, and it fails before the jsonl sink sees the batch: that is a sink refusing a
batch whole, the failure a real one has when its storage is away.  (Failing ``flush()`` here
would not be faithful: the wrapped jsonl sink would still hold the written lines, which a real
failed flush cuts off.)

Enabled as ``plugins = ["bench._chaos_sink:"]`` with the repository on ``PYTHONPATH``;
``[sink] type = "chaos_jsonl"`` takes the jsonl settings plus ``fail_file``.
"""

from __future__ import annotations

import os

from kdaemon.plugins import hookimpl
from kdaemon.sinks.jsonl import JsonlSink

SINK_TYPE = "chaos_jsonl"


class FailingWindowSink:
    def __init__(self, inner: JsonlSink, fail_file: str) -> None:
        self.inner = inner
        self.fail_file = fail_file
        self.refused = 0

    def write(self, records) -> None:
        if os.path.exists(self.fail_file):
            self.refused += 1
            raise OSError(f"chaos: the sink is failing on purpose while {self.fail_file} exists")
        self.inner.write(records)

    def flush(self) -> None:
        self.inner.flush()

    def on_partitions_assigned(self, partitions) -> None:
        self.inner.on_partitions_assigned(partitions)

    def close(self) -> None:
        self.inner.close()


def _settings(settings: dict) -> tuple[dict, str]:
    rest = {k: v for k, v in settings.items() if k not in ("type", "fail_file")}
    fail_file = settings.get("fail_file")
    if not isinstance(fail_file, str) or not fail_file:
        raise ValueError("fail_file is required: the path whose presence makes the sink fail")
    return rest, fail_file


def _make(settings: dict) -> FailingWindowSink:
    rest, fail_file = _settings(settings)
    return FailingWindowSink(JsonlSink.from_settings(rest), fail_file)


def _validate(settings: dict) -> None:
    rest, _ = _settings(settings)
    JsonlSink.validate_settings(rest)


_make.validate = _validate


@hookimpl
def kdaemon_sinks(context):
    return {SINK_TYPE: _make}
