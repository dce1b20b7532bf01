"""Hook specifications: what a kdaemon plugin can provide.

The collecting hooks below are called once, when the worker starts (after fork), never per
record (the supervisor's process hooks at the end are called around each worker process).
Each returns a mapping of *names* to *factories*; the configuration picks what to use by name, so two
plugins can offer the same kind of thing without clashing, and an unused factory costs nothing.

A factory receives the ``settings`` table from the configuration entry that named it (a plain
dict of TOML values) and returns the object the worker will call.  Raise ``ValueError`` from a
factory for bad settings: the message is shown to the operator as a configuration error.
``kdaemon.plugins.parse_settings(Dataclass, settings, where)`` parses the table into a frozen
dataclass and raises ``SettingsError`` (a ``ValueError``) listing every problem, which the
operator reads one per line as the daemon's own (``sink.key: expected ..., found ...``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import hookspec
from .companion import CompanionSpec, SinkContext
from .types import Deserializer, Interceptor, Sink

HeaderFilterFactory = Callable[[dict], Callable[[list], bool]]
InterceptorFactory = Callable[[dict], Interceptor]
SinkFactory = Callable[[dict], Sink]


@hookspec
def kdaemon_header_filters() -> Mapping[str, HeaderFilterFactory]:
    """Header filters this plugin offers, by name.

    Called once at start-up.  A ``[[filters]]`` entry with ``plugin = "<name>"`` calls the
    factory with that entry's ``settings`` table.  The factory returns a predicate
    ``(headers) -> bool`` (True keeps the record) that the decoder calls on each record's raw
    headers *before* its key and value are sliced out — ``headers`` is a list of
    ``(str, bytes | None)``.  A predicate with a ``native_rules`` attribute (see
    ``kdaemon.protocol.header_match.HeaderRules``) is evaluated inside the C decoder without a
    Python call per record.  A dropped record still advances the committed offset.

    :return: mapping of filter name to factory; return ``{}`` or ``None`` to offer none.
    """


@hookspec
def kdaemon_deserializers() -> Mapping[str, Callable[[dict], Deserializer]]:
    """Deserializers this plugin offers, by name.

    Called once at start-up.  ``[deserializer] key = "<name>"`` / ``value = "<name>"`` select
    them; the factory receives the ``[deserializer.settings]`` table.  The returned callable is
    ``(topic, headers, data) -> object`` and runs once per kept record; ``data`` is None for a
    null key or value.  An exception marks the record as failed and it is handled by the
    ``[daemon] on_deserialize_error`` policy (dlq, skip or stop).

    :return: mapping of deserializer name to factory.
    """


@hookspec
def kdaemon_interceptors() -> Mapping[str, InterceptorFactory]:
    """Consumer interceptors this plugin offers, by name.

    Called once at start-up; each ``[[interceptors]]`` entry with ``name = "<name>"`` builds one
    instance, and they run in the configured order.  ``on_consume(records) -> records`` runs
    once per poll batch before the sink and may drop, change or add records.  ``on_commit``
    runs after offsets were committed.  As in Java, an exception is logged and counted, and the
    chain continues with the output of the last interceptor that succeeded.

    :return: mapping of interceptor name to factory.
    """


@hookspec
def kdaemon_sinks(context: SinkContext | None) -> Mapping[str, SinkFactory]:
    """Sinks this plugin offers, by type name.

    Called once at start-up; ``[sink] type = "<name>"`` picks one and the factory receives the
    whole ``[sink]`` table.  The sink's ``flush()`` must return only when everything written
    is durable: offsets are committed right after it.

    :param context: the daemon's ``kdaemon.plugins.companion.SinkContext`` (state directory,
        daemon id, heartbeat timeout; ``group_type``: "share" when records arrive out of order
        and may come again, docs/PLUGINS.md) for the factories to close over; ``None`` outside a
        daemon (a plugin's own unit tests).  An implementation that needs no context may leave
        the parameter out: pluggy passes only the arguments it names.
    :return: mapping of sink type to factory.
    """


@hookspec
def kdaemon_sink_companions(sink_type: str, settings: dict, context: SinkContext) -> Iterable[CompanionSpec] | None:
    """Companion processes a sink needs beside the workers (the Spark uploader, say).

    Called in the supervisor (and by ``kdaemon run --in-process``) at start-up and on every
    reload, once for ``[sink]`` and once for ``[dlq]``, before any worker exists; every
    implementation is called, and the companions of all of them are run.  It runs in the
    process every worker is forked from: describe the processes, do not start anything (no
    threads, sockets or files here).  The supervisor starts them before the workers, restarts
    them with backoff, restarts one whose spec a reload changed, and stops them after the last
    worker (see ``kdaemon.plugins.companion.CompanionSpec``).  Two sinks asking for one name
    share that process, which must then have the same spec.

    :param sink_type: the table's ``type``; offer companions only for the sink types you provide.
    :param settings: the whole ``[sink]`` (or ``[dlq]``) table, as its factory receives it.
    :param context: the daemon's ``SinkContext`` (state directory, daemon id, ...).
    :return: the ``CompanionSpec`` objects this sink needs, or ``None`` / ``()`` for none.
    """


@hookspec
def kdaemon_filtered_observer() -> Callable[[list[Record]], None] | None:
    """A callable to hand the records header filters drop to, or None (the usual answer).

    Called once in each worker, after ``kdaemon_configure``.  Where a plugin returns one, the
    worker's decoder decodes a batch the filters dropped records of a second time without them
    (a dropped record is otherwise never built: 2-2.8 µs of CPU a record instead of 1.05 µs at
    90% dropped, docs/PERFORMANCE.md), and hands the dropped ones to each observer, a list per
    record batch, in offset order.  Their ``key`` and ``value`` are the broker's bytes: no
    deserializer ran.  They stay filtered: counted in
    ``kdaemon_records_filtered_total``, never given to interceptors or a sink, and committed
    past like any filtered record.  An observer that raises is logged and counted
    (``kdaemon_plugin_errors_total``), as an interceptor's ``on_consume`` is; the records stay
    filtered.  Return one only when the user asked for it (the otel plugin: ``[otel]
    trace_filtered = true``).

    :return: the observer, or None.
    """


@hookspec
def kdaemon_configure(config: Any) -> None:
    """Called once after the configuration was loaded and validated, before any factory.

    :param config: the ``kdaemon.config.DaemonConfig`` (read-only).  Use it for settings that
        several of a plugin's objects share.
    :return: ignored.
    """


# -- the supervisor's process hooks ------------------------------------------------------------
#
# Unlike the hooks above they are not called at a worker's start-up but around every worker
# process the supervisor forks (also a restart or a replacement during a reload), and they run
# in the supervisor (pre_fork) or in the forked child (post_fork, worker_exit).  They are
# notifications: every implementation is called, the return values are ignored, and an
# exception is the plugin's bug — it stops the daemon (pre_fork) or fails that worker's boot
# (post_fork, exit code 4).  ``kdaemon run --in-process`` forks nothing and calls none of them.


@hookspec
def kdaemon_pre_fork(index: int, config: Any) -> None:
    """Called in the supervisor just before it forks worker ``index``.

    The supervisor holds no thread, socket or Kafka client that a child could inherit half-way:
    keep it so (no threads here).  Use it for per-worker preparation the supervisor owns, such
    as a directory for that worker's files.

    :param index: the worker's slot, 0 .. workers-1; a replacement gets its predecessor's index.
    :param config: the ``kdaemon.config.DaemonConfig`` the worker will run with (after a reload,
        the new one).
    :return: ignored.
    """


@hookspec
def kdaemon_post_fork(index: int, config: Any) -> None:
    """Called in the forked worker right after fork, before anything of the worker is built.

    Signal handlers are back to their defaults and logging is set up for the worker; the
    consumer, the plugins' factories and the sink do not exist yet.  Settings that objects read
    when they are built (a profiler to start, an environment variable) take effect here.

    :param index: the worker's slot, as given to ``kdaemon_pre_fork``.
    :param config: the ``kdaemon.config.DaemonConfig`` the worker runs with.
    :return: ignored.
    """


@hookspec
def kdaemon_worker_exit(index: int, exit_code: int) -> None:
    """Called in the worker process as its last Python code, before it exits.

    A forked worker leaves with ``os._exit`` (it must not run the supervisor's ``atexit``
    handlers or flush buffers it inherited), so ``atexit`` never runs in it: write what must
    outlive the worker (a profile, a report) here.  Not called when the worker is killed
    (SIGKILL after ``shutdown_timeout_s``, or a missed heartbeat).

    :param index: the worker's slot.
    :param exit_code: the code the worker exits with: 0 clean stop, 3 stopped by an error
        policy, 4 could not boot, 1 anything else.
    :return: ignored.
    """


ALL_HOOKS = ("kdaemon_header_filters", "kdaemon_deserializers", "kdaemon_interceptors",
             "kdaemon_sinks", "kdaemon_sink_companions", "kdaemon_filtered_observer", "kdaemon_configure",
             "kdaemon_pre_fork", "kdaemon_post_fork", "kdaemon_worker_exit")
