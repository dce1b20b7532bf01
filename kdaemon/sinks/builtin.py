"""The built-in sinks, registered as the plugin ``builtin-sinks`` by the worker."""

from __future__ import annotations

from ..plugins import hookimpl


_STATE = {"state_dir": "./var/kdaemon"}


@hookimpl
def kdaemon_configure(config):
    _STATE["state_dir"] = config.daemon.state_dir


def _spark(settings: dict):
    try:
        from .spark.staging import SparkSink
    except ImportError as exc:
        raise ValueError(f"the spark sink needs the spark extra (pip install 'kdaemon[spark]'): {exc}") from None
    return SparkSink(settings, _STATE["state_dir"])


@hookimpl
def kdaemon_sinks():
    from .jsonl import JsonlSink
    from .simple import NullSink, StdoutSink
    return {"jsonl": JsonlSink.from_settings, "stdout": StdoutSink.from_settings,
            "null": NullSink.from_settings, "spark": _spark}
