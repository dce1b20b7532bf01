"""The built-in sinks, registered as the plugin ``builtin-sinks`` by the worker."""

from __future__ import annotations

from ..plugins import hookimpl


@hookimpl
def kdaemon_sinks():
    from .jsonl import JsonlSink
    from .simple import NullSink, StdoutSink
    return {"jsonl": JsonlSink.from_settings, "stdout": StdoutSink.from_settings,
            "null": NullSink.from_settings}
