"""A share group's own settings (``[share]``): set when the daemon starts, read for what the
worker must know, and named by ``check-config``.

Why the daemon sets them, and only from worker 0: a share group's behaviour (where a new group
starts reading, how long a record stays locked for a member, after how many deliveries a record
is archived, which records it sees of a transaction) lives in GROUP configs on the broker, not
in the members.  A file that says them is the one place an operator looks; applying them with
IncrementalAlterConfigs (SET, only the keys given: the others stay as the group has them) on the
GROUP resource at start keeps the broker in step with the file.  One worker does it, before its
first poll, so a restart of N workers is one change and not N.

Failures, as everywhere in the daemon (docs/DESIGN.md): a broker that does not answer, or a
retriable error (the coordinator loading), is waited out with backoff, said once when it starts
and once when it is over, the worker beating meanwhile; a refusal (INVALID_CONFIG: a value
outside the broker's ``group.share.min/max.*`` bounds, POLICY_VIOLATION, an ACL) is permanent:
the client's ``GroupConfigRefused`` (kdaemon/client/group_configs.py, naming the setting, the
broker's words and the fix), which stops the worker as a boot failure (``EXIT_BOOT_FAILURE``).

The delivery count limit (``share.delivery.count.limit``) decides which delivery of a record is
its last (``ShareWorker``): the file's value when it sets one, else what the group has
(DescribeConfigs), else the broker's default.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..backoff import Backoff
from ..client.config import ConsumerConfig
from ..client.errors import KafkaClientError
from ..client.group_configs import GroupConfigRefused, alter_group_configs, describe_group_configs
from ..config import DaemonConfig, ShareSection

log = logging.getLogger(__name__)

DELIVERY_COUNT_LIMIT = "share.delivery.count.limit"
DEFAULT_DELIVERY_COUNT_LIMIT = 5   # Kafka's group.share.delivery.count.limit default
GROUP_CONFIG_NAMES = tuple(name for _, name in ShareSection.GROUP_CONFIGS)


def client_config(config: DaemonConfig) -> ConsumerConfig:
    """The connection settings the admin requests use (the [kafka] section's, secrets resolved)."""
    from ..client.share.config import ShareConsumerConfig
    return ShareConsumerConfig.from_options(**config.consumer_options()).consumer


def configured_lines(config: DaemonConfig) -> list[str]:
    """What ``check-config`` says of the share group's settings without the cluster: each group
    config and the value the daemon sets, or that it leaves the group's."""
    group = config.kafka.get("group_id", "?")
    out = []
    for key, name in ShareSection.GROUP_CONFIGS:
        value = getattr(config.share, key)
        said = f"set to {value} at start ([share] {key})" if value is not None else \
            f"not set by the daemon: the group's value stays ([share] {key} sets it)"
        out.append(f"share group {group}: {name} {said}")
    return out


def current_lines(config: DaemonConfig, *, timeout_ms: int = 10_000) -> tuple[list[str], str | None]:
    """What the group has now (DescribeConfigs on the GROUP resource), for ``check-config``:
    (lines, None), or ([], why it could not be asked)."""
    group = config.kafka.get("group_id", "?")
    try:
        now = describe_group_configs(client_config(config), group, list(GROUP_CONFIG_NAMES))
    except KafkaClientError as exc:   # GroupConfigRefused (an ACL) too: a note, the file is fine
        return [], f"could not ask the cluster for share group {group}'s configs now ({exc})"
    wanted = config.share.group_configs()
    lines = []
    for name in GROUP_CONFIG_NAMES:
        value = now.get(name)
        change = f" (the daemon sets {wanted[name]} at start)" if name in wanted and wanted[name] != value else ""
        lines.append(f"share group {group} has now: {name} = {value if value is not None else '(not set)'}{change}")
    return lines, None


# Each request to the cluster before the first poll is bounded by this, so the worker beats to
# its supervisor between tries (a beat is missed only past heartbeat_timeout_s, 60 s).
ASK_TIMEOUT_MS = 10_000


def apply_group_configs(config: DaemonConfig, *, index: int, tick: Callable[[], None],
                        stopping: Callable[[], bool], sleep: Callable[[float], None] = time.sleep) -> None:
    """Worker 0 (``index``) sets the ``[share]`` settings on the group, waiting out what is
    transient (``tick`` called meanwhile, until ``stopping()``); the client's
    ``GroupConfigRefused`` propagates.  Nothing to do without settings."""
    wanted = config.share.group_configs()
    if not wanted or index != 0:
        return
    group = config.kafka["group_id"]
    client = client_config(config)
    done = _until_answered(config, f"set share group {group}'s configs",
                           lambda: alter_group_configs(client, group, wanted, timeout_ms=_timeout(client)),
                           tick=tick, stopping=stopping, sleep=sleep)
    if done:
        log.info("share group %s: set %s", group, ", ".join(f"{k}={v}" for k, v in wanted.items()))


def delivery_count_limit(config: DaemonConfig, *, tick: Callable[[], None], stopping: Callable[[], bool],
                         sleep: Callable[[float], None] = time.sleep) -> int:
    """The group's ``share.delivery.count.limit``: the file's when it sets one, else what the
    group has (DescribeConfigs: its own, or the broker's default), waited for as the configs
    are; a refusal to describe the group (an ACL) is said once and the broker's default taken."""
    if config.share.delivery_count_limit is not None:
        return config.share.delivery_count_limit
    group = config.kafka["group_id"]
    client = client_config(config)
    found: dict[str, str] = {}
    try:
        _until_answered(config, f"read share group {group}'s {DELIVERY_COUNT_LIMIT}",
                        lambda: found.update(describe_group_configs(client, group, [DELIVERY_COUNT_LIMIT],
                                                                    timeout_ms=_timeout(client))),
                        tick=tick, stopping=stopping, sleep=sleep)
    except GroupConfigRefused as exc:
        log.warning("share group %s: cannot read %s (%s); taking the broker default %d: set [share] "
                    "delivery_count_limit to say it", group, DELIVERY_COUNT_LIMIT, exc, DEFAULT_DELIVERY_COUNT_LIMIT)
    try:
        return int(found.get(DELIVERY_COUNT_LIMIT) or DEFAULT_DELIVERY_COUNT_LIMIT)
    except ValueError:
        return DEFAULT_DELIVERY_COUNT_LIMIT


def _timeout(client: ConsumerConfig) -> int:
    return min(client.default_api_timeout_ms, ASK_TIMEOUT_MS)


def _until_answered(config: DaemonConfig, what: str, call: Callable[[], None], *, tick: Callable[[], None],
                    stopping: Callable[[], bool], sleep: Callable[[float], None]) -> bool:
    """``call()`` until it returns (True), or ``stopping()`` (False); ``GroupConfigRefused``
    propagates, any other client error (``GroupConfigUnavailable``: no broker answered, or only
    retriable errors) is waited out with the sink retry's backoff, said once per change of
    reason and once when it is over, ``tick`` called meanwhile."""
    d = config.daemon
    backoff = Backoff(d.sink_retry_backoff_ms / 1000, d.sink_retry_backoff_max_ms / 1000)
    said: str | None = None
    while not stopping():
        try:
            call()
        except GroupConfigRefused:
            raise
        except KafkaClientError as exc:
            reason = f"{type(exc).__name__}: {exc}"
        else:
            if said is not None:
                log.info("could %s after all", what)
            return True
        delay = backoff.failure()
        if reason != said:
            log.warning("cannot %s yet (%s); nothing is consumed until then; trying again with backoff", what, reason)
            said = reason
        until = time.monotonic() + delay
        while not stopping() and time.monotonic() < until:
            tick()
            sleep(min(0.1, max(0.0, until - time.monotonic())))
    return False
