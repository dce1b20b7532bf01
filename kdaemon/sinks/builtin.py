"""The built-in sinks, registered as the plugin ``builtin-sinks`` by the worker (and by the
supervisor, which asks it for the spark sink's companion, the uploader): jsonl, stdout, null,
spark, and kafka (the Kafka-topic dead-letter queue).

What a sink needs to know about the daemon comes with the hook call (``SinkContext``), so
nothing here is module state: two pipelines built in one process with different state
directories each get their own."""

from __future__ import annotations

from ..plugins import hookimpl
from ..plugins.companion import CompanionSpec, SinkContext

_DEFAULT_STATE_DIR = "./var/kdaemon"   # without a daemon's context (a plugin's unit test)


def _spark(settings: dict, context: SinkContext | None):
    try:
        from .spark.staging import SparkSink
    except ImportError as exc:
        raise ValueError(f"the spark sink needs the spark extra (pip install 'kdaemon[spark]'): {exc}") from None
    if context is None:
        return SparkSink(settings, _DEFAULT_STATE_DIR)
    return SparkSink(settings, context.state_dir, heartbeat_timeout_s=context.heartbeat_timeout_s,
                     memory_bytes=context.memory_budget_bytes, group_type=context.group_type)


def _with_validate(factory, validate, preflight=None):
    """A factory with a side-effect-free ``validate(settings)`` for ``kdaemon check-config``, and
    optionally ``preflight(settings)``, the check that connects (docs/PLUGINS.md, "Sinks")."""
    def make(settings: dict):
        return factory(settings)
    make.validate = validate
    if preflight is not None:
        make.preflight = preflight
    return make


def _validate_spark(settings: dict, context: SinkContext | None) -> None:
    try:
        from .spark.staging import validate_settings
    except ImportError as exc:
        raise ValueError(f"the spark sink needs the spark extra (pip install 'kdaemon[spark]'): {exc}") from None
    # The same checks the workers and the uploader make (a share group refused: spark/settings.py).
    validate_settings(settings, group_type=context.group_type if context is not None else "consumer")


def _preflight_spark(settings: dict) -> None:
    try:
        from .spark.staging import preflight_settings
    except ImportError:
        return None   # validate() says the extra is missing
    preflight_settings(settings)   # the installed pyspark against the staged jars (the uploader's check)
    return None


def _kafka_dlq(settings: dict, context: SinkContext | None):
    from .kafka_dlq import KafkaDeadLetterSink   # the client's modules only where it is used
    return KafkaDeadLetterSink.from_settings(settings, context)


def _validate_kafka_dlq(settings: dict, context: SinkContext | None) -> None:
    from .kafka_dlq import KafkaDeadLetterSink
    KafkaDeadLetterSink.validate_settings(settings, context)


def _preflight_kafka_dlq(settings: dict, context: SinkContext | None) -> str | None:
    from .kafka_dlq import preflight_settings
    return preflight_settings(settings, context)


@hookimpl
def kdaemon_sinks(context: SinkContext | None):
    from .jsonl import JsonlSink
    from .simple import NullSink, StdoutSink
    group_type = context.group_type if context is not None else "consumer"
    return {"jsonl": _with_validate(lambda settings: JsonlSink.from_settings(settings, group_type=group_type),
                                    JsonlSink.validate_settings),
            "stdout": StdoutSink.from_settings, "null": NullSink.from_settings,
            "spark": _with_validate(lambda settings: _spark(settings, context),
                                    lambda settings: _validate_spark(settings, context), _preflight_spark),
            # A sink like the others, meant for [dlq]: dead letters into a Kafka topic (kafka_dlq.py).
            "kafka": _with_validate(lambda settings: _kafka_dlq(settings, context),
                                    lambda settings: _validate_kafka_dlq(settings, context),
                                    lambda settings: _preflight_kafka_dlq(settings, context))}


@hookimpl
def kdaemon_sink_companions(sink_type: str, settings: dict, context: SinkContext):
    """The spark sink's uploader: one process per daemon holding the SparkSession.  Its spec
    carries the sink's ``SparkSettings`` (as ``to_wire()`` writes them: every default filled in)
    and ``[daemon] on_sink_error`` (what to do with rows a table refuses), so a reload that
    changes any of them restarts the uploader (which reads its settings only when it starts)."""
    if sink_type != "spark":
        return None
    try:
        from .spark.settings import SparkSettings
    except ImportError as exc:
        raise ValueError(f"the spark sink needs the spark extra (pip install 'kdaemon[spark]'): {exc}") from None
    parsed = SparkSettings.parse(settings, group_type=context.group_type)
    return [CompanionSpec("spark-uploader", entry="kdaemon.sinks.spark.uploader.process:run",
                          kwargs={"settings": parsed.to_wire(), "state_dir": context.state_dir,
                                  "on_sink_error": context.on_sink_error})]
