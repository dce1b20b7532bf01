"""``kdaemon lag-exporter``: the group's lag as the brokers see it, served to Prometheus by a
process that outlives the daemon.

The daemon's own ``kdaemon_records_lag`` is measured by its workers, from their fetch positions:
when the daemon stops, or every worker is stuck, those series vanish, and a lag alert built on
them can never fire when it matters most.  What a Kafka shop runs for that is a broker-side lag
exporter (kafka-exporter, Burrow, kafka-lag-exporter); this is ours.  Every ``--interval`` it
reads the group's committed offsets (OffsetFetch) and the partitions' end offsets (ListOffsets,
with the configuration's ``isolation_level``: the last stable offset under read_committed), with
``kdaemon offsets``' own ``group_lag``, and serves the last reading on ``/metrics``.

It joins no group: it only asks the coordinator for the committed offsets, so it disturbs no
member.  Kafka is read in a thread and HTTP is served by prometheus_client's threaded server
(``serve_metrics``: a thread per client, so a slow client holds only its own), so a scrape is
answered at once even while a poll waits out an unreachable broker or clients trickle; a
failed poll leaves the last good reading served and says so (``kdaemon_lag_exporter_up`` 0,
``_errors_total``, the age of ``_last_success_timestamp_seconds``).

prometheus_client is imported only where it is used: ``kdaemon.cli`` imports this module for every
command, and ``kdaemon run`` must import prometheus_client first after setting
PROMETHEUS_MULTIPROC_DIR (its multiprocess mode is chosen at that first import).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import click

from ..exit_codes import EXIT_CONFIG
from .common import config_option, fail, load_or_exit, setup_logging, usage_error
from .offsets import PartitionLag, group_lag

log = logging.getLogger("kdaemon.lag_exporter")

DEFAULT_LISTEN = "127.0.0.1:9465"   # beside the daemon's 127.0.0.1:9464


@dataclass(frozen=True)
class LagReading:
    """One successful poll: every partition of the configured topics, and the topics that do
    not exist (yet)."""

    rows: tuple[PartitionLag, ...]
    missing_topics: tuple[str, ...]
    at: float   # time.time() when the poll ended


@dataclass
class ExporterState:
    """What ``/metrics`` shows, replaced by the poller under ``LagExporter``'s lock."""

    reading: LagReading | None = None     # the last successful poll (kept through failures)
    last_poll_ok: bool = False
    errors: Counter = field(default_factory=Counter)   # failed polls, per exception class name
    last_error: str | None = None


class LagExporter:
    """Polls one group's lag on its own thread and is the Prometheus collector of what it read.

    ``open()`` builds the consumer (before the thread starts, so options it refuses stop the
    command at once); from then on only the polling thread uses and closes it."""

    def __init__(self, consumer_options: dict, topics: list[str], *, interval_s: float, timeout_ms: int) -> None:
        self.group: str = consumer_options["group_id"]
        self.topics = list(topics)
        self.interval_s = interval_s
        self.timeout_ms = timeout_ms
        self._options = consumer_options
        self._reset = consumer_options.get("auto_offset_reset", "latest")
        self._state = ExporterState()
        self._lock = threading.Lock()
        self._consumer = None

    def open(self) -> None:
        from ..client import Consumer
        self._consumer = Consumer(**self._options)

    # -- polling (its own thread) -----------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Poll every ``interval_s`` until ``stop`` is set; a slow poll delays the next one."""
        try:
            while not stop.is_set():
                started = time.monotonic()
                self.poll_once()
                stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        finally:
            if self._consumer is not None:
                try:
                    self._consumer.close(timeout_ms=self.timeout_ms)
                except Exception as exc:   # closing is best effort: the process is ending
                    log.warning("closing the consumer failed: %s: %s", type(exc).__name__, exc)

    def poll_once(self) -> None:
        """One reading; a failure is counted, logged (when it is new) and leaves the last good
        reading in place."""
        from ..client.errors import KafkaClientError
        from ..protocol.errors import BrokerError
        try:
            reading = self._read()
        except (KafkaClientError, BrokerError, OSError) as exc:
            self._failed(exc, traceback=False)
            return
        except Exception as exc:   # a bug, not Kafka: say where, and go on serving
            self._failed(exc, traceback=True)
            return
        with self._lock:
            previous = self._state
            self._state = ExporterState(reading, True, previous.errors, None)
        if not previous.last_poll_ok and previous.last_error is not None:
            log.info("group %s: polling works again (%d partition(s))", self.group, len(reading.rows))
        if previous.reading is None or previous.reading.missing_topics != reading.missing_topics:
            for topic in reading.missing_topics:
                log.warning("group %s: topic %s does not exist; check [daemon] topics", self.group, topic)

    def _read(self) -> LagReading:
        from ..client import TopicPartition
        if self._consumer is None:
            raise RuntimeError("LagExporter.open() was not called")
        parts, missing = [], []
        for topic in self.topics:
            found = self._consumer.partitions_for(topic, timeout_ms=self.timeout_ms)
            if found is None:
                missing.append(topic)
            else:
                parts += [TopicPartition(topic, p) for p in sorted(found)]
        rows = group_lag(self._consumer, parts, reset=self._reset, has_group=True,
                         timeout_ms=self.timeout_ms) if parts else []
        return LagReading(tuple(rows), tuple(missing), time.time())

    def _failed(self, exc: Exception, *, traceback: bool) -> None:
        text = f"{type(exc).__name__}: {exc}"
        with self._lock:
            state = self._state
            state.errors[type(exc).__name__] += 1
            new = state.last_error != text
            state.last_poll_ok, state.last_error = False, text
        if not new:   # said once per kind of failure, not every interval while a broker stays away
            return
        if traceback:
            log.exception("group %s: polling failed unexpectedly; /metrics keeps the last good reading, if any, "
                          "with kdaemon_lag_exporter_up 0", self.group)
        else:
            log.warning("group %s: polling Kafka failed (%s); /metrics keeps the last good reading, if any, "
                        "with kdaemon_lag_exporter_up 0 until a poll succeeds", self.group, text)

    # -- what /metrics shows (the HTTP thread) ----------------------------------------------------

    def state(self) -> ExporterState:
        """A copy of the current state."""
        with self._lock:
            s = self._state
            return ExporterState(s.reading, s.last_poll_ok, Counter(s.errors), s.last_error)

    def describe(self):
        """The metric families, empty: what this exporter serves (tests list it from here)."""
        return self._families(None)

    def collect(self):
        return self._families(self.state())

    def _families(self, state: ExporterState | None):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        labels = ["group", "topic", "partition"]
        lag = GaugeMetricFamily("kdaemon_group_lag",
                                "Records the group has yet to consume, as the brokers see it: end offset minus "
                                "committed offset (without a commit, from where auto_offset_reset would start)",
                                labels=labels)
        committed = GaugeMetricFamily("kdaemon_group_committed_offset",
                                      "The group's committed offset (OffsetFetch); absent for a partition it never "
                                      "committed", labels=labels)
        end = GaugeMetricFamily("kdaemon_partition_end_offset",
                                "The partition's end offset as the group reads it (ListOffsets: the high watermark, "
                                "or the last stable offset under read_committed)", labels=labels)
        up = GaugeMetricFamily("kdaemon_lag_exporter_up",
                               "1 if the last poll of Kafka succeeded, 0 if it failed (the other series are then "
                               "those of the last successful poll)", labels=["group"])
        last = GaugeMetricFamily("kdaemon_lag_exporter_last_success_timestamp_seconds",
                                 "When the last successful poll ended, in seconds since the Unix epoch",
                                 labels=["group"])
        errors = CounterMetricFamily("kdaemon_lag_exporter_errors",
                                     "Polls of Kafka that failed, by the error's class (the exporter's log has the "
                                     "message)", labels=["group", "error"])
        families = [lag, committed, end, up, last, errors]
        if state is None:
            return families
        group = self.group
        up.add_metric([group], 1.0 if state.last_poll_ok else 0.0)
        for error, n in sorted(state.errors.items()):
            errors.add_metric([group, error], n)
        reading = state.reading
        if reading is None:
            return families
        last.add_metric([group], reading.at)
        for row in reading.rows:
            key = [group, row.topic, str(row.partition)]
            if row.lag is not None:
                lag.add_metric(key, row.lag)
            if row.committed is not None:
                committed.add_metric(key, row.committed)
            if row.end is not None:
                end.add_metric(key, row.end)
        return families

    def registry(self):
        """A registry of this exporter alone, for prometheus_client's server to render."""
        from prometheus_client import CollectorRegistry
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry


# -- HTTP ----------------------------------------------------------------------------------------

CLIENT_TIMEOUT_S = 30.0   # a client silent this long (between two reads or writes) is closed, freeing its thread


def serve_metrics(listen: str, registry):
    """prometheus_client's WSGI app on ``listen`` (HOST:PORT, an IPv6 host in brackets) in its
    threaded server: one thread per client, so a slow or silent client holds its own thread and
    never a scrape (this process never forks, unlike the supervisor, and may hold threads).
    Beside what ``start_http_server`` does: a client silent for ``CLIENT_TIMEOUT_S`` is closed,
    so idle connections do not keep threads for ever, and that close is not a traceback on
    stderr.  Returns the server, serving from a daemon thread; OSError when ``listen`` cannot be
    bound."""
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    family = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family
        request_queue_size = 128   # socketserver's 5 drops the connects of a burst (retried after 1 s)

        def handle_error(self, request, client_address) -> None:
            log.debug("an HTTP client %s failed", client_address, exc_info=True)

    class Handler(WSGIRequestHandler):
        timeout = CLIENT_TIMEOUT_S

        def log_message(self, format, *args) -> None:   # no access log
            pass

    server = make_server(host, int(port), make_wsgi_app(registry), Server, handler_class=Handler)
    threading.Thread(target=server.serve_forever, name="lag-http", daemon=True).start()
    return server


# -- the command ---------------------------------------------------------------------------------

def _listen_address(ctx, param, value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN}, or [::]:9465)")
    return value


@click.command("lag-exporter")
@config_option
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, callback=_listen_address, metavar="HOST:PORT",
              help="Serve /metrics here.")
@click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              metavar="SECONDS", help="Time between polls of Kafka.")
@click.option("--timeout-ms", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="How long each request to Kafka may take.")
def lag_exporter(config_path: str, listen: str, interval: float, timeout_ms: int) -> None:
    """Serve the configured group's lag per partition, as the brokers see it, on /metrics for
    Prometheus, until SIGTERM or SIGINT.

    A broker-side exporter (as kafka-exporter or Burrow): it keeps measuring while the daemon is
    stopped or stuck, which the daemon's own kdaemon_records_lag cannot, and the KdaemonLagGrowing
    alert (monitoring/prometheus/alerts.yml) reads it.  It joins no group.  Series:
    kdaemon_group_lag, kdaemon_group_committed_offset and kdaemon_partition_end_offset
    {group, topic, partition}; kdaemon_lag_exporter_up (0: the last poll failed, the series are
    the last good ones), kdaemon_lag_exporter_last_success_timestamp_seconds,
    kdaemon_lag_exporter_errors_total {group, error}."""
    from ..supervisor import sdnotify
    config = load_or_exit(config_path)
    if config.group_type == "share":
        usage_error(f"{config.path} names a share group: the lag exporter reads committed offsets, which a share "
                    "group has none of; its lag per partition is kdaemon offsets' (DescribeShareGroupOffsets)")
    setup_logging(config.daemon.log_level)
    opts = config.consumer_options()
    if not opts.get("group_id"):
        usage_error(f"[kafka] group_id is not set in {config.path}: there is no group whose lag to export")
    if config.daemon.topic_pattern is not None:
        usage_error(f"{config.path} subscribes by [daemon] topic_pattern, which the lag exporter does not "
                    "resolve: list the topics in [daemon] topics")
    if not config.daemon.topics:
        usage_error(f"[daemon] topics is empty in {config.path}: no partitions to export the lag of")
    opts["enable_auto_commit"] = False
    opts.pop("group_instance_id", None)   # it joins no group: never speak for a static member
    opts.setdefault("client_id", "kdaemon-lag-exporter")
    exporter = LagExporter(opts, config.daemon.topics, interval_s=interval, timeout_ms=timeout_ms)
    try:
        exporter.open()
    except (TypeError, ValueError) as exc:   # an option the client refuses
        fail(f"{config.path}: [kafka]: {exc}", EXIT_CONFIG)
    try:
        server = serve_metrics(listen, exporter.registry())
    except OSError as exc:
        fail(f"cannot listen on {listen}: {exc.strerror or exc}; choose another --listen", EXIT_CONFIG)
    log.info("metrics on http://%s/metrics", listen)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    poller = threading.Thread(target=exporter.run, args=(stop,), name="lag-poller", daemon=True)
    poller.start()
    log.info("exporting the lag of group %s on %s (%s) every %gs", exporter.group,
             ", ".join(config.daemon.topics), opts.get("isolation_level", "read_uncommitted"), interval)
    sdnotify.notify("READY=1")
    try:
        while not stop.wait(0.5):
            pass
    finally:
        sdnotify.notify("STOPPING=1")
        server.shutdown()       # no new request; those under way end with the process
        server.server_close()
        # A poll waiting on an unreachable broker ends within its timeout; no longer is waited.
        poller.join(timeout_ms / 1000 * 2 + 5)
