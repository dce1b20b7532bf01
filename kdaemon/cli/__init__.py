"""The ``kdaemon`` command line: ``main`` and the commands that run or check the daemon;
``offsets.py`` and ``tail.py`` hold the commands that look at Kafka, ``common.py`` what all
share (one-line failures among it).

Exit codes: ``kdaemon.exit_codes`` (0 success; 1 runtime failure; 2 bad configuration or usage,
every problem listed, or the state directory is another daemon's; 3 a worker stopped on an
error policy; 4 a worker could not boot; 5 a worker was fenced by another consumer with its
static member id; 6 the sink or the dead-letter queue refused for good).
"""

from __future__ import annotations

import signal
import sys
import time

import click

from .. import __version__
from ..config import ENV_LAYOUT, ConfigError, DaemonConfig, effective_toml, load_for_check
from ..exit_codes import EXIT_CONFIG, EXIT_OK
from ..worker.build import check_against_plugins
from .common import config_option, fail, load_or_exit, plugins_or_exit, setup_logging
from .lag_exporter import lag_exporter
from .offsets import offsets
from .status import status
from .stop import stop
from .tail import tail


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kdaemon")
def main() -> None:
    """kdaemon: a Kafka consumer daemon with header filters, plugins and durable sinks."""


main.add_command(lag_exporter)
main.add_command(offsets)
main.add_command(status)
main.add_command(stop)
main.add_command(tail)


_state_lock = None   # ``run``'s lock on the state directory, held (and inherited) until the daemon ends


@main.command()
@config_option
@click.option("--workers", type=int, default=None, help="Override [daemon] workers (0: one per CPU).")
@click.option("--in-process", is_flag=True, help="Run one worker in this process, without the supervisor.")
def run(config_path: str, workers: int | None, in_process: bool) -> None:
    """Consume the configured topics into the configured sink until stopped (SIGTERM/SIGINT;
    the workers keep their static group memberships for a restart unless [daemon] on_stop =
    "leave_group"; SIGUSR2, which kdaemon stop --leave-group sends: they leave the group for good).
    If this process dies (kill -9, the OOM killer), its workers and companions see it and stop
    as on SIGTERM by themselves, within shutdown_timeout_s.

    \b
    Exit codes:
      0  stopped cleanly (SIGTERM/SIGINT): every worker flushed and committed
      1  a failure a restart may cure; or a worker still running shutdown_timeout_s
         after SIGTERM had to be killed (what it had not committed comes again)
      2  bad configuration (every problem is listed), or another kdaemon runs on
         the same [daemon] state_dir
      3  a worker stopped on an error policy (on_deserialize_error or on_sink_error
         = "stop", or records to dead-letter and no [dlq]): the others were stopped
         gracefully, the offsets before the failing record are committed; fix the
         record or the policy
      4  a worker cannot boot (plugin, sink, credentials), or workers died 5 times
         in a row before getting their assignment
      5  a worker was fenced by Kafka: another consumer joined the group with its
         static member id (a second daemon with the same [daemon] daemon_id?)
      6  the sink or the DLQ refused for good (its topic does not exist, an ACL,
         a table's schema, a Spark job that fails the same way every time, a
         Spark its staged jars are not built for): the log names the topic,
         table or versions and the fix; nothing past the records it refused is
         committed
    2 to 6 will not fix themselves: the supervisor stops rather than restart-loop.
    """
    config = load_or_exit(config_path)
    setup_logging(config.daemon.log_level)
    from ..supervisor.state_lock import StateDirInUse, lock_state_dir
    global _state_lock
    try:
        _state_lock = lock_state_dir(config.daemon.state_dir, config_path)
    except StateDirInUse as exc:
        fail(str(exc), EXIT_CONFIG)
    except OSError as exc:
        fail(f"cannot use [daemon] state_dir {config.daemon.state_dir}: {exc.strerror or exc}", EXIT_CONFIG)
    if in_process:
        problems = check_against_plugins(config, plugins_or_exit(config))
        if problems:
            for p in problems:
                click.echo(p, err=True)
            sys.exit(EXIT_CONFIG)
        sys.exit(_run_in_process(config))
    from ..supervisor.arbiter import Arbiter
    from ..supervisor.configs import validate_in_child
    # Plugin checks run in a throw-away child: the supervisor must stay free of plugin state
    # (threads, sockets) because every worker is forked from it.
    problems = validate_in_child(config_path)
    if problems:
        for p in problems:
            click.echo(p, err=True)
        sys.exit(EXIT_CONFIG)
    sys.exit(Arbiter(config_path, config, workers_override=workers).run())


def _run_in_process(config: DaemonConfig) -> int:
    """One worker in this process.  Without a supervisor this process also runs the sink's
    companion processes (the Spark uploader, say) with the supervisor's ``Companions``: started
    first, kept running from the worker's loop, stopped after the worker has flushed."""
    from ..supervisor.companions import Companions, specs_for
    from ..worker.main import load_plugins, make_worker
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
            if companions.refused() is not None:
                worker.request_stop()   # a companion that cannot run: stop, as the supervisor would
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
        from ..supervisor.child import RETIRE_SIGNAL
        leave = config.daemon.on_stop == "leave_group"
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: worker.request_stop(leave_group=leave))
        signal.signal(RETIRE_SIGNAL, lambda *_: worker.request_stop(leave_group=True))   # as the supervisor's
        code = worker.run()
        refused = companions.refused()
        return refused[1] if refused is not None and code == EXIT_OK else code
    finally:
        companions.stop_all()


@main.command("check-config")
@config_option
@click.option("--show", is_flag=True,
              help="Print the effective configuration (the file with the environment's KDAEMON_* values "
                   "over it, each marked with its variable; secrets hidden).")
@click.option("--offline", is_flag=True,
              help="Do not ask the cluster whether what the file names exists (the DLQ's Kafka topic).")
def check_config(config_path: str, show: bool, offline: bool) -> None:
    """Validate the configuration (and what the enabled plugins say about it); exit 2 on problems.

    Every problem in one run: those of the file and of the KDAEMON_<SECTION>_<KEY> environment
    variables set over it, then what the plugins' factories (filters, deserializers,
    interceptors, sinks' validate) say about their settings.  Each value taken from the
    environment is listed on stdout (``run`` takes the same ones).  Unless ``--offline``, a file
    without problems is then checked against the cluster: a ``[dlq] type = "kafka"`` topic that
    does not exist is a problem (with the command that creates it); a cluster that does not
    answer is a note.  A share group's settings (``[share]``) are named: what the daemon sets on
    the group when it starts, and (unless ``--offline``) what the group has now."""
    from ..worker.main import check_file
    checked = check_file(config_path, connect=not offline)
    config, problems, notes, overrides = checked.config, checked.problems, checked.notes, checked.overrides
    # Problems and notes on stderr, the rest on stdout.
    if show and config is not None:
        click.echo(f"# {config_path}, with the environment's values over it (each marked with its "
                   "variable); secrets hidden")
        click.echo(effective_toml(config.raw, overrides, ENV_LAYOUT))
    else:
        for o in overrides:
            click.echo(f"environment: {o.where} = {o.shown}   # {o.variable}")
    for p in problems:
        click.echo(p, err=True)
    if problems:
        sys.exit(EXIT_CONFIG)
    for line in checked.group_settings:
        click.echo(line)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"{config_path}: OK")


@main.command()
@click.option("-c", "--config", "config_path", default=None, type=click.Path(dir_okay=False),
              help="Show the plugins this configuration enables (default: the built-in ones).")
@click.option("--all", "import_all", is_flag=True,
              help="Import every installed plugin to list what it offers (by default only the enabled "
                   "ones are imported: the configuration's allowlist).")
def plugins(config_path: str | None, import_all: bool) -> None:
    """List installed plugins: enabled or not, version, source, hooks, and the names each offers
    per kind (filters, deserializers, interceptors, sinks).  Works without -c, and with a
    configuration that has problems (its plugin list is used all the same)."""
    from ..config import DEFAULT_PLUGINS
    from ..plugins.companion import SinkContext
    from ..plugins.manager import PluginError, PluginManager
    from ..sinks import builtin as builtin_sinks
    enabled = list(DEFAULT_PLUGINS)
    if config_path is not None:
        problems: list[str] = []
        config = load_for_check(config_path, problems)
        if config is not None:
            enabled = list(config.plugins)
        if problems:
            click.echo(f"note: {config_path} has {len(problems)} problem(s) (kdaemon check-config lists them); "
                       + ("its plugins list is used" if config is not None else "showing the default plugins"),
                       err=True)
    try:
        if import_all:
            enabled += [d.name for d in PluginManager([]).discovered]
        manager = PluginManager(enabled)
        manager.register(builtin_sinks, "builtin-sinks")
        offered = manager.offered(SinkContext(state_dir="/nonexistent", daemon_id="", heartbeat_timeout_s=30.0))
    except PluginError as exc:
        fail(str(exc), EXIT_CONFIG)
    for p in manager.describe():
        state = "enabled " if p["enabled"] else "disabled"
        hooks = ", ".join(p["hooks"]) if p["enabled"] else "(not imported)"
        offers = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in offered.get(p["name"], {}).items())
        click.echo(f"{state}  {p['name']:<16} {p['version'] or '-':<10} {p['source']:<32} {hooks}"
                   + (f"  [{offers}]" if offers else ""))


@main.command()
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Listen here (default: a free port).")
@click.option("--log-dir", default="var/broker", show_default=True, type=click.Path(file_okay=False),
              help="Where the broker's log goes.")
def broker(port: int | None, log_dir: str) -> None:
    """Start the embedded broker (Tansu, in memory) for trying plugins locally; print its address
    and serve until SIGINT/SIGTERM.  What it holds is gone when it stops."""
    from ..embedded import EmbeddedBrokerError, start_broker
    try:
        b = start_broker(log_dir, port=port)
    except (EmbeddedBrokerError, OSError) as exc:
        fail(f"the embedded broker did not start: {exc}")
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    click.echo(f'bootstrap_servers = "{b.bootstrap}"')
    click.echo(f"# the embedded broker (Tansu, in memory) listens at {b.bootstrap}; its log is {b.log_path}. "
               "Ctrl-C stops it.", err=True)
    try:
        while not stop:
            if b.process.poll() is not None:
                fail(f"the embedded broker exited with {b.process.returncode}; its log:\n{b.log_tail()}")
            time.sleep(0.2)
    finally:
        b.stop()


@main.command()
@click.option("--records", default=50_000, show_default=True, help="Sample records to write.")
@click.option("--partitions", default=4, show_default=True)
@click.option("--state-dir", default="var/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--sink", type=click.Choice(["jsonl", "spark"]), default="jsonl", show_default=True)
@click.option("--follow", is_flag=True, help="Keep the daemon running after the sample is delivered.")
@click.option("--template", type=click.Path(dir_okay=False), default=None,
              help="Configuration to start from (default: etc/kdaemon.toml).")
@click.option("--no-progress", is_flag=True,
              help="No live progress bar, also on a terminal: a plain line every few seconds (as when piped).")
def demo(records: int, partitions: int, state_dir: str, sink: str, follow: bool, template: str | None,
         no_progress: bool) -> None:
    """Start the embedded broker, write a sample topic, run the daemon on it (its progress and lag
    live), then show what it did per partition and the command that reads the output back."""
    from ..demo import run_demo
    from .progress import DemoDisplay, console
    setup_logging("WARNING")
    sys.exit(run_demo(DemoDisplay(console(), no_progress=no_progress), records, partitions, state_dir, sink,
                      follow, template))

