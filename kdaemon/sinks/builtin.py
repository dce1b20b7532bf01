"""The built-in sinks, registered as the plugin ``builtin-sinks`` by the worker."""

from __future__ import annotations

from ..plugins import hookimpl


_STATE = {"state_dir": "./var/kdaemon", "heartbeat_timeout_s": None}


@hookimpl
def kdaemon_configure(config):
    _STATE["state_dir"] = config.daemon.state_dir
    _STATE["heartbeat_timeout_s"] = config.daemon.heartbeat_timeout_s


def _spark(settings: dict):
    try:
        from .spark.staging import SparkSink
    except ImportError as exc:
        raise ValueError(f"the spark sink needs the spark extra (pip install 'kdaemon[spark]'): {exc}") from None
    return SparkSink(settings, _STATE["state_dir"], heartbeat_timeout_s=_STATE["heartbeat_timeout_s"])


def _with_validate(factory, validate):
    """A factory with a side-effect-free ``validate(settings)`` for ``kdaemon check-config``."""
    def make(settings: dict):
        return factory(settings)
    make.validate = validate
    return make


def _validate_spark(settings: dict) -> None:
    try:
        from .spark.staging import validate_settings
    except ImportError as exc:
        raise ValueError(f"the spark sink needs the spark extra (pip install 'kdaemon[spark]'): {exc}") from None
    validate_settings(settings)   # the same checks the workers and the uploader make


@hookimpl
def kdaemon_sinks():
    from .jsonl import JsonlSink
    from .simple import NullSink, StdoutSink
    return {"jsonl": _with_validate(JsonlSink.from_settings, JsonlSink.validate_settings),
            "stdout": StdoutSink.from_settings, "null": NullSink.from_settings,
            "spark": _with_validate(_spark, _validate_spark)}
