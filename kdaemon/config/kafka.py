"""The ``[kafka]`` section: the consumer's options (``kdaemon.client.ConsumerConfig``) in the
daemon's file.

Each option's TOML type comes from ConsumerConfig's own annotations and is checked here, before
the values are handed over, so a wrong type is a ``kafka.<option>: expected ..., found ...``
line and never a Python error from inside the consumer ("'int' object is not iterable" from
``bootstrap_servers = 5``).  What ConsumerConfig then checks (ranges, choices, protocol rules)
comes back as ``kafka.<option>`` problems too.  Secrets (``sasl_password``, ``ssl_password``)
may be given inline, or as ``<name>_env`` (an environment variable) or ``<name>_file`` (a file,
e.g. a systemd credential under ``$CREDENTIALS_DIRECTORY``), so they never have to live in the
file.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from ..client.config import ConsumerConfig
from ..client.share.config import NOT_FOR_SHARE_GROUPS, ShareConsumerConfig
from ..secrets import read_secret
from ..settings import STRING, Kind, did_you_mean, key_path, kinds_of
from .model import GROUP_PROTOCOLS, GROUP_TYPES
from .schema import string_or_list

SECRETS = ("sasl_password", "ssl_password")
SECRET_SOURCES = {f"{name}{suffix}": name for name in SECRETS for suffix in ("_env", "_file")}
# Consumer options the daemon owns: configuring them would break delivery guarantees.
DAEMON_OWNED = {"enable_auto_commit", "header_filter", "on_filtered", "on_consume", "on_commit"}

# Every key [kafka] takes, and its TOML type.  The consumer splits a comma-separated string for
# its two list options, so those take either.
KAFKA_KINDS: dict[str, Kind] = {
    **kinds_of(ConsumerConfig),
    "bootstrap_servers": string_or_list("a string or a list of strings (host:port)"),
    "partition_assignment_strategy": string_or_list("a string or a list of strings (assignor names)"),
    "group_protocol": STRING,
    "group_type": STRING,
    # ShareConsumer's own (Java's share.acquire.mode): "record_limit" makes max_poll_records a
    # hard limit per fetch.  Only with group_type = "share".
    "share_acquire_mode": STRING,
    **{key: STRING for key in SECRET_SOURCES},
}
_CONSUMER_FIELDS = set(kinds_of(ConsumerConfig)) | DAEMON_OWNED | {"bootstrap_servers",
                                                                   "partition_assignment_strategy",
                                                                   "share_acquire_mode"}
# Where a consumer-group option refused in a share group has a share-group counterpart.
_SHARE_INSTEAD = {"auto_offset_reset": "[share] auto_offset_reset", "isolation_level": "[share] isolation_level",
                  "session_timeout_ms": None, "heartbeat_interval_ms": None}

Problem = Callable[[str, str], None]


def kafka_section(section: dict, env: Any, problems: list[str]) -> dict:
    """The consumer options of a ``[kafka]`` table (already known to be a table); every
    problem is appended to ``problems`` as ``kafka.<key>: text``."""
    def problem(where: str, text: str) -> None:
        problems.append(f"{where}: {text}")

    out: dict = {}
    for key, value in section.items():
        if key in DAEMON_OWNED:
            problem(key_path("kafka", key), "is managed by the daemon (offsets are committed after the sink "
                                    "flushes; filters come from [[filters]])")
            continue
        kind = KAFKA_KINDS.get(key)
        if kind is None:
            problem(key_path("kafka", key), f"unknown consumer option{did_you_mean(key, KAFKA_KINDS)}")
            continue
        wrong = kind.problems(f"kafka.{key}", value)
        if wrong:
            problems += wrong
            continue
        if key in SECRET_SOURCES:
            base = SECRET_SOURCES[key]
            resolved = _resolve_secret(key, value, env, problem)
            if resolved is not None:
                if base in out:
                    problem(f"kafka.{key}", f"{base} is given more than once")
                out[base] = resolved
            continue
        if key == "group_protocol" and value not in GROUP_PROTOCOLS:
            problem(f"kafka.{key}", f"{value!r} is not one of {', '.join(GROUP_PROTOCOLS)}")
            continue
        if key == "group_type" and value not in GROUP_TYPES:
            problem(f"kafka.{key}", f"{value!r} is not one of {', '.join(GROUP_TYPES)}")
            continue
        if key in out:
            problem(f"kafka.{key}", "given more than once")
        out[key] = tuple(value) if isinstance(value, list) else value
    share = out.get("group_type") == "share"
    if share:
        _refuse_consumer_group_options(out, problem)
    elif "share_acquire_mode" in out:
        problem("kafka.share_acquire_mode", "only for a share group: set kafka.group_type = \"share\", or remove it")
        del out["share_acquire_mode"]
    try:
        # "auto" and group_type are the daemon's, not the consumer's: check the rest as the
        # worker will pass it, to the client of the group type (one typed parse each).
        options = {k: v for k, v in out.items() if k != "group_type" and not (k == "group_protocol" and v == "auto")}
        if share:
            ShareConsumerConfig.from_options(**options)
        else:
            ConsumerConfig.from_options(**options)
    except (TypeError, ValueError) as exc:
        for part in _consumer_problems(str(exc)):
            # The consumer's messages start with the option's name ("session_timeout_ms must
            # be positive", "auto_offset_reset='x' is not one of ..."): report them as
            # kafka.<option> like every other problem.
            name = re.match(r"[a-z_]+", part)
            if name and name.group(0) in _CONSUMER_FIELDS:
                problem(f"kafka.{name.group(0)}", part[name.end():].lstrip("= "))
            elif part.startswith("bootstrap server"):
                problem("kafka.bootstrap_servers", part)
            else:
                problem("kafka", part)
    return out


def _refuse_consumer_group_options(out: dict, problem: Problem) -> None:
    """With ``group_type = "share"``: every consumer-group-only option given (whatever its
    value: a share group would silently ignore it) is a problem naming why, and what to set
    instead where there is something (``ShareConsumerConfig``'s reasons, one wording)."""
    for key in sorted(set(out) & set(NOT_FOR_SHARE_GROUPS)):
        instead = _SHARE_INSTEAD.get(key)
        problem(f"kafka.{key}", f"not for a share group (group_type = \"share\"): {NOT_FOR_SHARE_GROUPS[key]}"
                + (f"; set {instead} instead" if instead else "; remove it"))
        del out[key]


def _consumer_problems(message: str) -> list[str]:
    """The consumer's one-line error as its problems: they are joined with "; ", which a
    problem's own text may contain too ("...: the broker decides it; leave it unset, ..."),
    so a part that does not start with an option's name continues the one before."""
    problems: list[str] = []
    message = message.replace("invalid share consumer configuration: ", "")
    for part in message.replace("invalid consumer configuration: ", "").split("; "):
        name = re.match(r"[a-z_]+", part)
        starts = (name is not None and name.group(0) in _CONSUMER_FIELDS) or part.startswith(
            ("bootstrap server", "unknown consumer option"))
        if problems and not starts:
            problems[-1] += "; " + part
        else:
            problems.append(part)
    return problems


def _resolve_secret(key: str, value: str, env: Any, problem: Problem) -> str | None:
    try:
        return read_secret(f"kafka.{key}", "env" if key.endswith("_env") else "file", value, env)
    except ValueError as exc:
        where, _, text = str(exc).partition(": ")
        problem(where, text)
        return None
