"""Building and running one worker from a configuration (in-process, or in a forked child).

Everything with threads or sockets — the consumer, its heartbeat thread, sinks that open
connections — is created here, i.e. after fork in the child, never in the supervisor.

The group protocol (``[kafka] group_protocol``) is settled here too, once per worker start:
"auto" asks a bootstrap broker what it supports (``kdaemon.client.features``) and every worker
logs what it chose and why.  Per worker rather than once in the supervisor because the probe
is a socket (the supervisor opens none, and must never block its signal loop on a broker that
is down), and because a worker start is exactly when a choice can take effect: a broker upgrade
is picked up by the next restart or SIGHUP roll, one worker at a time, which is the online
migration Kafka supports for a classic group (``group.consumer.migration.policy``).
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..client import Consumer, ConsumerConfig, TopicPartition
from ..client.config import CLASSIC_ONLY_OPTIONS
from ..client.errors import KafkaClientError, NoBrokersAvailableError
from ..client.features import CLASSIC, CONSUMER, choose_group_protocol, probe
from ..client.group.release import leave_classic_member, release_static_member
from ..config import DaemonConfig, Override, load_for_check
from ..plugins.manager import PluginError, PluginManager
from ..protocol.errors import BrokerError
from .build import build_pipeline_parts, check_against_plugins, preflight_sinks, unchecked_sinks
from .health import CONDITIONS, FIRST_WARNING_S
from .memory import MemoryShares, MemoryWatch
from .ownership import OwnershipCheck
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


@dataclass
class Checked:
    """What ``check_file`` found: every problem of the file, of the environment's values over it
    and of the plugins' checks; ``notes`` (sinks whose settings could not be checked) and the
    ``overrides`` taken from the environment, for ``check-config`` to show; for a share group,
    ``group_settings``: what the daemon sets on the group, and (connected) what it has now."""
    config: DaemonConfig | None
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    overrides: list[Override] = field(default_factory=list)
    group_settings: list[str] = field(default_factory=list)


def check_file(config_path: str, *, connect: bool = False) -> Checked:
    """The one configuration check: ``check-config`` prints it, ``kdaemon run`` and a SIGHUP
    reload refuse on its problems.  It runs plugin code (factories), so the supervisor runs it
    in a throw-away child (``supervisor.configs.validate_in_child``).  An unexpected failure of
    a plugin's check propagates when the file itself was fine (a bug to see whole); with
    problems in the file it becomes one more problem (what was wrong can keep the plugins from
    being asked at all).

    ``connect`` (``check-config``): a file without problems is also checked against what it
    names (``build.preflight_sinks``: the Kafka DLQ's topic exists).  ``run`` and a reload leave
    that to each worker, before its first poll (``Delivery.preflight``): there a broker that does
    not answer yet is waited for, not a refusal."""
    checked = Checked(None)
    checked.config = config = load_for_check(config_path, checked.problems, overrides=checked.overrides)
    if config is None:
        return checked
    file_ok = not checked.problems
    try:
        manager = load_plugins(config)
        checked.problems += check_against_plugins(config, manager)
        checked.notes = unchecked_sinks(config, manager)
        if connect and not checked.problems:
            problems, notes = preflight_sinks(config, manager)
            checked.problems += problems
            checked.notes += notes
        if config.group_type == "share" and not checked.problems:
            from .share_group import configured_lines, current_lines
            checked.group_settings = configured_lines(config)
            if connect:
                now, why = current_lines(config)
                checked.group_settings += now
                if why is not None:
                    checked.notes.append(f"{config.path}: {why}")
    except PluginError as exc:
        checked.problems.append(f"{config.path}: plugins: {exc}")
    except Exception as exc:
        if file_ok:
            raise
        checked.problems.append(f"{config.path}: the plugins' checks did not run ({type(exc).__name__}: {exc}); "
                                "fix the problems above first")
    return checked


# A daemon whose "auto" resolves to the consumer protocol drops the classic-only consumer options
# (client.config.CLASSIC_ONLY_OPTIONS: the broker owns them there) rather than failing on a file
# written for classic.


def resolve_group_protocol(config: DaemonConfig, *, index: int = 0, wait_ms: int | None = None,
                           on_wait: Callable[[], None] | None = None) -> str | None:
    """The group protocol worker ``index`` speaks, logged with the reason: ``[kafka]
    group_protocol`` when it names one, else (``"auto"``) "consumer" if a bootstrap broker
    offers ConsumerGroupHeartbeat and ``group.version`` >= 1 is finalized, "classic" if not.
    None when the worker joins no group (static assignment).

    "auto" waits for a broker to answer, as a starting consumer would: up to ``wait_ms``
    (default: for ever, with a warning every ``default_api_timeout_ms``), calling ``on_wait``
    meanwhile; past ``wait_ms``, ``NoBrokersAvailableError``."""
    if config.daemon.assignment != "group":
        return None
    wanted = config.group_protocol
    if wanted != "auto":
        log.info("worker %d: group protocol %s (set in [kafka] group_protocol)", index, wanted)
        return wanted
    client = ConsumerConfig.from_options(**config.consumer_options())
    deadline = None if wait_ms is None else time.monotonic() + wait_ms / 1000
    # The first warning after a few seconds (an operator starting the daemon wants to know now
    # that nothing answers), then one a default_api_timeout_ms.
    round_ms = min(client.default_api_timeout_ms, int(FIRST_WARNING_S * 1000))
    while True:
        if deadline is not None:
            round_ms = min(round_ms, max(1, int((deadline - time.monotonic()) * 1000)))
        try:
            features = probe(client, timeout_ms=round_ms, on_wait=on_wait)
            break
        except NoBrokersAvailableError as exc:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            log.warning("worker %d: %s; %s; still trying (the group protocol is chosen from the first answer)",
                        index, exc, CONDITIONS["broker_unreachable"][1])
            round_ms = client.default_api_timeout_ms
    choice = choose_group_protocol(features)
    log.info("worker %d: group protocol %s (group_protocol = \"auto\": %s, asked %s)", index,
             choice.protocol, choice.reason, features.broker)
    return choice.protocol


def release_predecessor(config: DaemonConfig, index: int, group_protocol: str | None, *,
                        member_id: str, was: str | None, clean: bool) -> None:
    """Release the static membership worker ``index``'s previous process (member ``member_id``,
    protocol ``was``, exited cleanly or not) left behind, before this one joins under
    ``group_protocol`` (client/group/release.py says why each case needs it):

    * it spoke the consumer protocol and did not exit cleanly (killed: no -2 leave went out):
      the -2 leave it could not send, so this worker takes over its partitions at once;
    * it spoke classic and this worker speaks consumer (an online upgrade rolling through): the
      LeaveGroup a classic static member never sends, without which the coordinator refuses
      this worker the instance id until the old session expires.

    Best effort: the outcome or the failure is logged and the worker goes on to join."""
    if was == CONSUMER and not clean:
        release, action = release_static_member, "released (epoch -2)"
    elif was == CLASSIC and group_protocol == CONSUMER:
        release, action = leave_classic_member, "left (LeaveGroup)"
    else:
        return
    opts = config.consumer_options()
    opts["group_instance_id"] = _instance_id(config, index, opts)
    client = ConsumerConfig.from_options(**opts)
    try:
        # Bounded by one request timeout: the worker is not beating to its supervisor meanwhile.
        outcome = release(client, member_id, timeout_ms=client.request_timeout_ms)
    except (KafkaClientError, BrokerError) as exc:
        log.warning("worker %d: could not release the %s static membership of its predecessor %s: %s",
                    index, was, member_id, exc)
        return
    log.info("worker %d: %s static membership %s of its predecessor %s %s: %s", index, was,
             opts["group_instance_id"], member_id, action, outcome)


def _instance_id(config: DaemonConfig, index: int, opts: dict) -> str:
    """The static member id of worker ``index``: [kafka] group_instance_id, or "<daemon_id>-<index>"."""
    if "group_instance_id" in opts:
        return opts["group_instance_id"]
    return f"{daemon_id(config)}-{index}"


def daemon_id(config: DaemonConfig) -> str:
    """The daemon's name in its workers' static member ids: [daemon] daemon_id, else the host name."""
    return config.daemon.daemon_id or socket.gethostname()


_STATIC_MEMBER = re.compile(r"(?P<daemon>.+)-(?P<index>\d+)")


def daemon_of(instance_id: str | None) -> str | None:
    """The daemon_id a static member id "<daemon_id>-<index>" names; None for any other id."""
    m = _STATIC_MEMBER.fullmatch(instance_id or "")
    return m["daemon"] if m else None


def consumer_options(config: DaemonConfig, parts, *, index: int = 0, static_members: bool = False,
                     group_protocol: str | None = None) -> dict:
    """The ``Consumer`` options of worker ``index``.  ``group_protocol`` is the resolved one
    (``resolve_group_protocol``); None leaves the consumer's default and "auto" out."""
    opts = config.consumer_options()
    opts["enable_auto_commit"] = False  # the worker commits after the sink flushed
    if group_protocol is not None:
        opts["group_protocol"] = group_protocol
        if group_protocol == CONSUMER and config.group_protocol == "auto":
            dropped = [k for k in CLASSIC_ONLY_OPTIONS if opts.pop(k, None) is not None]
            if dropped:
                log.info("worker %d: %s not used under the consumer protocol (the broker's group.consumer.* "
                         "settings apply)", index, ", ".join(dropped))
    opts["header_filter"] = parts.header_filter
    if parts.on_filtered is not None:
        opts["on_filtered"] = parts.on_filtered
    if static_members and config.daemon.assignment == "group":
        opts["group_instance_id"] = _instance_id(config, index, opts)
    return _every_worker_options(config, opts)


def _every_worker_options(config: DaemonConfig, opts: dict) -> dict:
    """What every worker's client gets, a consumer's or a share consumer's: its client id, and
    the fetched bytes counted against the worker's memory budget (worker/memory.py): the
    response in flight and the fetch-ahead buffer capped at their shares unless [kafka] set them."""
    opts.setdefault("client_id", f"kdaemon-{os.getpid()}")
    shares = MemoryShares.of(config.daemon.memory_budget_mb)
    if shares.budget:
        opts.setdefault("fetch_max_bytes", shares.fetch_max_bytes)
        opts.setdefault("fetch_buffer_bytes", shares.fetch_buffer_bytes)
    return opts


def all_partitions(consumer: Consumer, topics: Sequence[str], timeout_ms: int = 60_000) -> list[TopicPartition]:
    """Every partition of ``topics``, sorted: the list static assignment divides."""
    everything = []
    for topic in sorted(topics):
        found = consumer.partitions_for(topic, timeout_ms=timeout_ms)
        if found is None:
            raise ValueError(f"topic {topic} does not exist")
        everything += [TopicPartition(topic, p) for p in sorted(found)]
    return everything


def static_subset(everything: list[TopicPartition], index: int, workers: int) -> list[TopicPartition]:
    """Worker ``index`` of ``workers`` takes every ``workers``-th partition of the sorted list
    (``all_partitions``): deterministic, so every worker computes its share alone and the
    shares are disjoint."""
    return everything[index::workers]


def make_worker(config: DaemonConfig, *, index: int = 0, workers: int = 1,
                partitions: Sequence[TopicPartition] | None = None,
                static_members: bool = False, on_tick: Callable | None = None,
                on_wait: Callable[[], None] | None = None, predecessor=None) -> Worker:
    """Plugins and the pipeline first (what cannot boot fails at once, broker or not), then the
    group protocol (``resolve_group_protocol``, calling ``on_wait`` while a broker is awaited),
    the release of what ``predecessor`` (a supervisor's ``Predecessor``) left behind, and the
    consumer."""
    plugins = load_plugins(config)
    parts = build_pipeline_parts(config, plugins)
    if config.group_type == "share":
        return make_share_worker(config, parts, index=index, on_tick=on_tick)
    group_protocol = None
    if partitions is None:
        group_protocol = resolve_group_protocol(config, index=index, on_wait=on_wait)
        if predecessor is not None:
            release_predecessor(config, index, group_protocol, member_id=predecessor.member_id,
                                was=predecessor.group_protocol, clean=predecessor.clean)
    consumer = Consumer(**consumer_options(config, parts, index=index, static_members=static_members,
                                           group_protocol=group_protocol))

    def subscribe_or_assign(c: Consumer, worker: Worker) -> None:
        # Worker 0 also looks out for partitions nobody consumes (worker/ownership.py): of the
        # configured topics, so not for a pattern or a fixed assignment given by the caller.
        watch = index == 0 and partitions is None and not config.daemon.topic_pattern
        if partitions is not None:
            c.assign(partitions)
        elif config.daemon.assignment == "static":
            everything = all_partitions(c, config.daemon.topics)
            c.assign(static_subset(everything, index, workers))
            if watch:
                worker.watch_ownership(OwnershipCheck(c.config, config.daemon.topics, static=set(everything)))
            return
        elif config.daemon.topic_pattern:
            c.subscribe(pattern=config.daemon.topic_pattern, listener=worker)
        else:
            c.subscribe(list(config.daemon.topics), listener=worker)
        if watch and c.group_state() is not None:
            worker.watch_ownership(OwnershipCheck(c.config, config.daemon.topics))

    return Worker(config, parts, consumer, subscribe_or_assign, on_tick=on_tick,
                  memory=MemoryWatch(config.daemon.memory_budget_mb))


def share_consumer_options(config: DaemonConfig, parts, *, index: int = 0) -> dict:
    """The ``ShareConsumer`` options of worker ``index``: [kafka]'s (the loader refused the
    consumer-group ones), explicit acknowledgement (the worker accepts a record only once the
    sink made it durable), the header filter, and the memory budget's fetch shares."""
    opts = config.consumer_options()
    opts["share_acknowledgement_mode"] = "explicit"
    opts["header_filter"] = parts.header_filter
    if parts.on_filtered is not None:
        opts["on_filtered"] = parts.on_filtered
    return _every_worker_options(config, opts)


def make_share_worker(config: DaemonConfig, parts, *, index: int = 0, on_tick: Callable | None = None):
    """A member of the share group ``[kafka] group_id`` (``group_type = "share"``); it applies
    the ``[share]`` settings and reads the delivery count limit when it runs, beating meanwhile."""
    from ..client.share import ShareConsumer
    from .share import ShareWorker
    consumer = ShareConsumer(**share_consumer_options(config, parts, index=index))
    log.info("worker %d: share group %s member (explicit acknowledgement)", index, config.kafka["group_id"])
    return ShareWorker(config, parts, consumer, index=index, on_tick=on_tick,
                       memory=MemoryWatch(config.daemon.memory_budget_mb))

