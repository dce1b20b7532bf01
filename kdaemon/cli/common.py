"""What the commands share: the configuration, the plugins, logging, and failing in one line.

Every failure of a command is one line on stderr, ``kdaemon <command>: <what is wrong>; <what
to do>``, and an exit code from ``kdaemon.exit_codes``: 2 when the command line or the
configuration cannot be used, 1 when something outside (a broker) failed.  Never a traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import click

from ..config import ConfigError, DaemonConfig, load
from ..exit_codes import EXIT_CONFIG, EXIT_FAILURE


def setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(processName)s %(name)s: %(message)s",
                        stream=sys.stderr)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Stop the command with one line naming the command, what is wrong and what to do."""
    ctx = click.get_current_context(silent=True)
    # "kdaemon tail", also when run as ``python -m kdaemon.cli`` (whose command path differs).
    name = f"kdaemon {ctx.info_name}" if ctx is not None and ctx.parent is not None else "kdaemon"
    click.echo(f"{name}: {message}", err=True)
    sys.exit(code)


def usage_error(message: str) -> NoReturn:
    fail(message, EXIT_CONFIG)


def load_or_exit(path: str) -> DaemonConfig:
    try:
        config = load(path)
    except ConfigError as exc:
        for p in exc.problems:
            click.echo(p, err=True)
        sys.exit(EXIT_CONFIG)
    return config


def plugins_or_exit(config: DaemonConfig):
    from ..plugins.manager import PluginError
    from ..worker.main import load_plugins
    try:
        return load_plugins(config)
    except PluginError as exc:
        click.echo(f"{config.path}: plugins: {exc}", err=True)
        sys.exit(EXIT_CONFIG)


@contextmanager
def kafka_errors(config: DaemonConfig) -> Iterator[None]:
    """A client or broker error as one line naming the brokers and the setting to look at."""
    from ..client.errors import KafkaClientError, KafkaTimeoutError
    from ..protocol.errors import BrokerError
    try:
        yield
    except KafkaTimeoutError as exc:
        servers = config.consumer_options().get("bootstrap_servers") or "?"
        if not isinstance(servers, str):
            servers = ",".join(servers)
        fail(f"no answer from Kafka at {servers}: {exc}; is [kafka] bootstrap_servers in {config.path} "
             "right, and is the broker up?")
    except (KafkaClientError, BrokerError) as exc:
        fail(f"{type(exc).__name__}: {exc}")


config_option = click.option("-c", "--config", "config_path", required=True,
                             type=click.Path(dir_okay=False), help="The kdaemon TOML configuration file.")
