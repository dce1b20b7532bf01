"""Building and running one worker from a configuration (in-process, or in a forked child).

Everything with threads or sockets — the consumer, its heartbeat thread, sinks that open
connections — is created here, i.e. after fork in the child, never in the supervisor.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence

from ..client import Consumer, TopicPartition
from ..config import DaemonConfig
from ..plugins.manager import PluginManager
from .build import build_pipeline_parts
from .pipeline import Worker

log = logging.getLogger(__name__)


def load_plugins(config: DaemonConfig, *, configure: bool = True) -> PluginManager:
    """The allowlisted plugins and the built-in sinks.  ``configure=False`` (the supervisor)
    imports and registers them without running ``kdaemon_configure``: no plugin code but the
    imports runs in the process every worker is forked from."""
    from ..sinks import builtin as builtin_sinks
    plugins = PluginManager(config.plugins)
    plugins.register(builtin_sinks, "builtin-sinks")
    if configure:
        plugins.configure(config)
    return plugins


def consumer_options(config: DaemonConfig, parts, *, index: int = 0, static_members: bool = False) -> dict:
    opts = config.consumer_options()
    opts["enable_auto_commit"] = False  # the worker commits after the sink flushed
    opts["header_filter"] = parts.header_filter
    if static_members and config.daemon.assignment == "group" and "group_instance_id" not in opts:
        daemon_id = config.daemon.daemon_id or socket.gethostname()
        opts["group_instance_id"] = f"{daemon_id}-{index}"
    opts.setdefault("client_id", f"kdaemon-{os.getpid()}")
    return opts


def static_subset(consumer: Consumer, topics: Sequence[str], index: int, workers: int,
                  timeout_ms: int = 60_000) -> list[TopicPartition]:
    """Worker ``index`` of ``workers`` takes every ``workers``-th partition of the sorted list:
    deterministic, so every worker computes its share alone and the shares are disjoint."""
    everything = []
    for topic in sorted(topics):
        found = consumer.partitions_for(topic, timeout_ms=timeout_ms)
        if found is None:
            raise ValueError(f"topic {topic} does not exist")
        everything += [TopicPartition(topic, p) for p in sorted(found)]
    return everything[index::workers]


def make_worker(config: DaemonConfig, *, index: int = 0, workers: int = 1,
                partitions: Sequence[TopicPartition] | None = None,
                static_members: bool = False, on_tick: Callable | None = None) -> Worker:
    plugins = load_plugins(config)
    parts = build_pipeline_parts(config, plugins)
    consumer = Consumer(**consumer_options(config, parts, index=index, static_members=static_members))

    def subscribe_or_assign(c: Consumer, worker: Worker) -> None:
        if partitions is not None:
            c.assign(partitions)
        elif config.daemon.assignment == "static":
            c.assign(static_subset(c, config.daemon.topics, index, workers))
        elif config.daemon.topic_pattern:
            c.subscribe(pattern=config.daemon.topic_pattern, listener=worker)
        else:
            c.subscribe(list(config.daemon.topics), listener=worker)

    return Worker(config, parts, consumer, subscribe_or_assign, on_tick=on_tick)
