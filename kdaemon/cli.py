"""The ``kdaemon`` command line.

Exit codes: ``kdaemon.exit_codes`` (0 success; 1 runtime failure; 2 bad configuration or usage,
every problem listed; 3 a worker stopped on an error policy; 4 a worker could not boot).
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
import time

import click

from . import __version__
from .config import ConfigError, DaemonConfig, load
from .exit_codes import EXIT_CONFIG
from .worker.build import check_against_plugins


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s",
                        stream=sys.stderr)


def _load_or_exit(path: str) -> DaemonConfig:
    try:
        config = load(path)
    except ConfigError as exc:
        for p in exc.problems:
            click.echo(p, err=True)
        sys.exit(EXIT_CONFIG)
    return config


def _plugins_or_exit(config: DaemonConfig):
    from .plugins.manager import PluginError
    from .worker.main import load_plugins
    try:
        return load_plugins(config)
    except PluginError as exc:
        click.echo(f"{config.path}: plugins: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


config_option = click.option("-c", "--config", "config_path", required=True,
                             type=click.Path(dir_okay=False), help="The kdaemon TOML configuration file.")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kdaemon")
def main() -> None:
    """kdaemon: a Kafka consumer daemon with header filters, plugins and durable sinks."""


@main.command()
@config_option
@click.option("--workers", type=int, default=None, help="Override [daemon] workers (0: one per CPU).")
@click.option("--in-process", is_flag=True, help="Run one worker in this process, without the supervisor.")
def run(config_path: str, workers: int | None, in_process: bool) -> None:
    """Consume the configured topics into the configured sink until stopped (SIGTERM/SIGINT).

    \b
    Exit codes:
      0  stopped cleanly (SIGTERM/SIGINT): every worker flushed and committed
      1  a failure a restart may cure; or a worker still running shutdown_timeout_s
         after SIGTERM had to be killed (what it had not committed comes again)
      2  bad configuration (every problem is listed)
      3  a worker stopped on an error policy (on_deserialize_error or on_sink_error
         = "stop", or records to dead-letter and no [dlq]): the others were stopped
         gracefully, the offsets before the failing record are committed; fix the
         record or the policy
      4  a worker cannot boot (plugin, sink, credentials), or workers died 5 times
         in a row before getting their assignment
    2, 3 and 4 will not fix themselves: the supervisor stops rather than restart-loop.
    """
    config = _load_or_exit(config_path)
    _setup_logging(config.daemon.log_level)
    if in_process:
        problems = check_against_plugins(config, _plugins_or_exit(config))
        if problems:
            for p in problems:
                click.echo(p, err=True)
            sys.exit(EXIT_CONFIG)
        sys.exit(_run_in_process(config))
    from .supervisor.arbiter import Arbiter, validate_in_subprocess
    # Plugin checks run in a throw-away process: the supervisor must stay free of plugin state
    # (threads, sockets) because every worker is forked from it.
    problems = validate_in_subprocess(config_path)
    if problems:
        for p in problems:
            click.echo(p, err=True)
        sys.exit(EXIT_CONFIG)
    sys.exit(Arbiter(config_path, config, workers_override=workers).run())


def _run_in_process(config: DaemonConfig) -> int:
    """One worker in this process.  Without a supervisor this process also runs the sink's
    companion processes (the Spark uploader, say) with the supervisor's ``Companions``: started
    first, kept running from the worker's loop, stopped after the worker has flushed."""
    from .supervisor.companions import Companions, specs_for
    from .worker.main import load_plugins, make_worker
    try:
        specs = specs_for(config, load_plugins(config, configure=False))
    except ValueError as exc:
        click.echo(f"{config.path}: sink companions: {exc}", err=True)
        return EXIT_CONFIG
    companions = Companions()
    companions.configure(specs, log_level=config.daemon.log_level, stop_timeout_s=config.daemon.shutdown_timeout_s)
    companions.tick()
    next_check = [0.0]

    def keep_companions(worker) -> None:
        now = time.monotonic()
        if now >= next_check[0]:
            next_check[0] = now + 0.5
            companions.poll()
            companions.tick()

    try:
        try:
            worker = make_worker(config, on_tick=keep_companions)
        except ConfigError as exc:
            # Sink settings are only checked when the sink is built (a dry run must not
            # create its files), so a bad [sink] table shows up here.
            for p in exc.problems:
                click.echo(p, err=True)
            return EXIT_CONFIG
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.request_stop())
        return worker.run()
    finally:
        companions.stop_all()


@main.command("check-config")
@config_option
def check_config(config_path: str) -> None:
    """Validate the configuration (and what the enabled plugins say about it); exit 2 on problems."""
    config = _load_or_exit(config_path)
    problems = check_against_plugins(config, _plugins_or_exit(config))
    if problems:
        for p in problems:
            click.echo(p, err=True)
        sys.exit(EXIT_CONFIG)
    click.echo(f"{config_path}: OK")


@main.command()
@config_option
def plugins(config_path: str) -> None:
    """List discovered plugins, whether each is enabled, and the hooks it implements."""
    config = _load_or_exit(config_path)
    manager = _plugins_or_exit(config)
    for p in manager.describe():
        state = "enabled " if p["enabled"] else "disabled"
        hooks = ", ".join(p["hooks"]) if p["enabled"] else "(not imported)"
        click.echo(f"{state}  {p['name']:<16} {p['source']:<32} {hooks}")


@main.command()
@config_option
@click.option("--timeout-ms", default=15000, show_default=True)
def offsets(config_path: str, timeout_ms: int) -> None:
    """Committed offset, end offset and lag per partition of the configured group and topics."""
    from .client import Consumer, TopicPartition
    config = _load_or_exit(config_path)
    opts = config.consumer_options()
    opts["enable_auto_commit"] = False
    consumer = Consumer(**opts)
    try:
        parts = []
        topics = list(config.daemon.topics)
        for topic in topics:
            found = consumer.partitions_for(topic, timeout_ms=timeout_ms)
            if found is None:
                click.echo(f"{topic}: does not exist", err=True)
                continue
            parts += [TopicPartition(topic, p) for p in sorted(found)]
        ends = consumer.end_offsets(parts, timeout_ms=timeout_ms)
        committed = consumer.committed(parts, timeout_ms=timeout_ms) if opts.get("group_id") else {}
        click.echo(f"{'topic':<30} {'partition':>9} {'committed':>12} {'end':>12} {'lag':>10}")
        total = 0
        for tp in parts:
            om = committed.get(tp)
            end = ends.get(tp)
            lag = None if om is None or end is None else max(0, end - om.offset)
            total += lag or 0
            click.echo(f"{tp.topic:<30} {tp.partition:>9} {om.offset if om else '-':>12} "
                       f"{end if end is not None else '-':>12} {lag if lag is not None else '-':>10}")
        click.echo(f"total lag: {total}")
    finally:
        consumer.close()


@main.command()
@click.argument("topic")
@config_option
@click.option("--partition", "-p", type=int, multiple=True, help="Only these partitions (default: all).")
@click.option("--offset", "-o", "start", default="end", show_default=True,
              help="beginning, end, or an absolute offset.")
@click.option("--count", "-n", type=int, default=None, help="Stop after this many records.")
@click.option("--idle-ms", type=int, default=2000, show_default=True,
              help="Stop after this long without records (0: never).")
def tail(topic: str, config_path: str, partition: tuple[int, ...], start: str, count: int | None,
         idle_ms: int) -> None:
    """Print records of TOPIC as JSON lines, through the configured filters and deserializers
    (like ``kcat -C``).  Never joins the group or commits.

    The records go through the daemon's own stages (config, ``build_pipeline_parts``, the
    consumer options and ``Pipeline``): tail only prints, so what it shows is what the daemon
    would hand to its sink."""
    from .client import Consumer, TopicPartition
    from .sinks.encoding import record_to_json
    from .worker.build import build_pipeline_parts
    from .worker.main import consumer_options
    from .worker.pipeline import Pipeline, StageObserver
    config = _load_or_exit(config_path)
    _setup_logging("WARNING")
    manager = _plugins_or_exit(config)
    parts = build_pipeline_parts(config, manager, dry_run=True)
    opts = consumer_options(config, parts)
    opts.pop("group_id", None)
    opts.pop("group_instance_id", None)
    consumer = Consumer(**opts)

    class Report(StageObserver):
        def deserialize_failed(self, record, exc):
            # The position and the error type, never the payload.
            click.echo(f"# {record.topic}-{record.partition}@{record.offset}: could not deserialize "
                       f"({type(exc).__name__})", err=True)

    # Whatever the daemon's policy, tail reports a record that fails to deserialize and goes
    # on ("stop" would end it with a traceback on exactly the record one wants to look at);
    # "dlq" only hands the dead letter back, which tail drops once reported.
    pipeline = Pipeline(dataclasses.replace(
        config, daemon=dataclasses.replace(config.daemon, on_deserialize_error="dlq")), parts,
        observer=Report())
    printed = 0
    try:
        found = consumer.partitions_for(topic)
        if found is None:
            click.echo(f"topic {topic} does not exist", err=True)
            sys.exit(1)
        tps = [TopicPartition(topic, p) for p in sorted(found) if not partition or p in partition]
        consumer.assign(tps)
        if start == "beginning":
            consumer.seek_to_beginning(*tps)
        elif start == "end":
            consumer.seek_to_end(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, int(start))
        last = time.monotonic()
        while count is None or printed < count:
            polled = consumer.poll(200)
            raw = [r for rs in polled.values() for r in rs]
            if raw:
                last = time.monotonic()
            records, _ = pipeline.deserialize(raw)
            for r in pipeline.intercept(records):
                click.echo(record_to_json(r))  # already one JSON line
                printed += 1
                if count is not None and printed >= count:
                    break
            if idle_ms and (time.monotonic() - last) * 1000 >= idle_ms:
                break
    finally:
        consumer.close()


@main.command()
@click.option("--records", default=50_000, show_default=True, help="Sample records to write.")
@click.option("--partitions", default=4, show_default=True)
@click.option("--state-dir", default="var/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--sink", type=click.Choice(["jsonl", "spark"]), default="jsonl", show_default=True)
@click.option("--follow", is_flag=True, help="Keep the daemon running after the sample is delivered.")
@click.option("--template", type=click.Path(dir_okay=False), default=None,
              help="Configuration to start from (default: etc/kdaemon.toml).")
def demo(records: int, partitions: int, state_dir: str, sink: str, follow: bool, template: str | None) -> None:
    """Start the embedded broker, write a sample topic, run the daemon on it, show the output."""
    from .demo import run_demo
    _setup_logging("WARNING")
    sys.exit(run_demo(records, partitions, state_dir, sink, follow, template))


if __name__ == "__main__":
    main()
