"""A group's own configs (KIP-848, KIP-932): read them with DescribeConfigs and set them with
IncrementalAlterConfigs, both on the GROUP resource (type 32).

A share group's record lock, delivery count limit, start-offset policy and isolation level are
group configs (``share.record.lock.duration.ms`` ...), not client settings: the daemon applies
its ``[share]`` table with ``alter_group_configs`` before its first poll and reads the delivery
count limit with ``describe_group_configs``.

Two kinds of failure, for a caller that retries one and stops on the other:

* ``GroupConfigRefused`` (permanent, a ``RefusedError``): the broker refused the change for
  good (INVALID_CONFIG for an unknown name or a value outside its bounds, an authorization
  failure, a broker without GROUP configs).  It names the setting, the value and the broker's
  own message, and says what to change.
* ``GroupConfigUnavailable`` (transient, ``retriable``): no broker answered within the timeout,
  or every answer was a retriable error (a controller moving, a connection dropped).  Nothing
  was changed that the next call would not set again: SET is idempotent.

Any broker answers for a GROUP resource (the controller applies the change; Kafka's admin
client sends it to the least loaded node, as here), so no coordinator is looked up.  Each call
opens its own short-lived network client, as ``group/release.py`` and ``lookup.py`` do.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping

from ..protocol.apis import DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS
from ..protocol.apis.describe_configs import RESOURCE_GROUP
from ..protocol.apis.incremental_alter_configs import OP_SET
from ..protocol.errors import Errors, error_code
from ..protocol.schema import Api
from .admin import ask_least_loaded
from .config import ConsumerConfig
from .errors import KafkaClientError, RefusedError
from .network import NetworkClient

__all__ = ["GroupConfigRefused", "GroupConfigUnavailable", "alter_group_configs", "describe_group_configs"]

_KAFKA_CONFIGS = "kafka-configs --bootstrap-server {servers} --describe --entity-type groups --entity-name {group}"

# What an operator changes when the broker refuses with one of these codes.
_FIXES = {
    Errors.INVALID_CONFIG: "correct it as the broker's message says: a name Kafka knows as a group config, and a "
                           "value it accepts (within the bounds of the broker's group.share.* / group.consumer.* "
                           "min and max settings, or raise those on the broker)",
    Errors.GROUP_AUTHORIZATION_FAILED: "grant the principal ALTER_CONFIGS on the group "
                                       "(kafka-acls --add --operation AlterConfigs --group {group})",
    Errors.CLUSTER_AUTHORIZATION_FAILED: "grant the principal ALTER_CONFIGS on the group "
                                         "(kafka-acls --add --operation AlterConfigs --group {group})",
    Errors.INVALID_REQUEST: "the broker has no GROUP configs (Kafka 4.0 or later has them)",
    Errors.UNSUPPORTED_VERSION: "the broker has no GROUP configs (Kafka 4.0 or later has them)",
    Errors.POLICY_VIOLATION: "the cluster's alter-config policy refuses it: see the broker's log",
}


class GroupConfigRefused(RefusedError):
    """The broker refused a group config for good: ``setting`` (None: the request as a whole,
    e.g. an authorization failure), ``value`` (None when reading), ``code`` (Kafka's error code),
    ``broker_message`` (the broker's own words, "" if none) and ``fix``."""

    def __init__(self, group_id: str, setting: str | None, value: str | None, code: int,
                 broker_message: str, fix: str) -> None:
        what = f"{setting} = {value!r}" if setting is not None and value is not None else (setting or "its configs")
        message = (f"group {group_id}: the broker refuses {what}: {error_code(code).name} ({code})"
                   + (f": {broker_message}" if broker_message else ""))
        super().__init__(message, code=code, fix=fix)
        self.group_id = group_id
        self.setting = setting
        self.value = value
        self.broker_message = broker_message


class GroupConfigUnavailable(KafkaClientError):
    """No broker gave a final answer in time (no connection, or only retriable errors): try again
    later.  ``code`` is the last retriable error code answered (None: no answer at all)."""

    retriable = True

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def alter_group_configs(config: ConsumerConfig, group_id: str, configs: Mapping[str, str], *,
                        timeout_ms: int | None = None) -> None:
    """SET each of ``configs`` (name -> value) on group ``group_id``, leaving its other configs as
    they are.  The group need not exist yet (its configs are kept for it).  All in one request:
    the broker applies all or none.  Raises ``GroupConfigRefused`` naming the setting it refused
    (found in the broker's message or, failing that, by validating each alone) or
    ``GroupConfigUnavailable``; ``timeout_ms`` (default ``default_api_timeout_ms``) bounds it all."""
    if not configs:
        return
    deadline = _deadline(config, timeout_ms)
    code, message = _alter(config, group_id, configs, validate_only=False, deadline=deadline)
    if code == Errors.NONE:
        return
    setting = _named_setting(configs, message)
    if setting is None and len(configs) > 1 and code == Errors.INVALID_CONFIG:
        # The broker's message names no setting: which one alone is refused?  Validation only,
        # nothing changes.
        for name, value in configs.items():
            alone, alone_message = _alter(config, group_id, {name: value}, validate_only=True, deadline=deadline)
            if alone != Errors.NONE:
                setting, code, message = name, alone, alone_message
                break
    if setting is None and len(configs) == 1:
        setting = next(iter(configs))
    raise GroupConfigRefused(group_id, setting, configs.get(setting) if setting else None, code, message,
                             _fix(code, config, group_id))


def describe_group_configs(config: ConsumerConfig, group_id: str, names: Iterable[str], *,
                           timeout_ms: int | None = None) -> dict[str, str]:
    """The value group ``group_id`` has for each of ``names`` now: its own, or the broker's
    default where it has none (DescribeConfigs answers both).  A name the broker does not know
    as a group config, or has no value for, is left out.  Raises ``GroupConfigRefused`` or
    ``GroupConfigUnavailable`` as ``alter_group_configs`` does."""
    wanted = list(dict.fromkeys(names))
    if not wanted:
        return {}
    body = {"resources": [{"resource_type": RESOURCE_GROUP, "resource_name": group_id,
                           "configuration_keys": wanted}]}
    resp = _ask(config, group_id, DESCRIBE_CONFIGS, body, _deadline(config, timeout_ms),
                error_of=lambda r: _resource_error(r["results"]))
    code, message = _resource_error(resp["results"])
    if code != Errors.NONE:
        setting = _named_setting(dict.fromkeys(wanted, ""), message)
        raise GroupConfigRefused(group_id, setting, None, code, message, _fix(code, config, group_id))
    found = {c["name"]: c["value"] for r in resp["results"] for c in r["configs"]}
    return {name: found[name] for name in wanted if found.get(name) is not None}


# -- the exchange ----------------------------------------------------------------------------------

def _deadline(config: ConsumerConfig, timeout_ms: int | None) -> float:
    return time.monotonic() + (config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000


def _alter(config: ConsumerConfig, group_id: str, configs: Mapping[str, str], *, validate_only: bool,
           deadline: float) -> tuple[int, str]:
    body = {"resources": [{"resource_type": RESOURCE_GROUP, "resource_name": group_id,
                           "configs": [{"name": name, "config_operation": OP_SET, "value": value}
                                       for name, value in configs.items()]}],
            "validate_only": validate_only}
    resp = _ask(config, group_id, INCREMENTAL_ALTER_CONFIGS, body, deadline,
                error_of=lambda r: _resource_error(r["responses"])[0])
    return _resource_error(resp["responses"])


def _resource_error(results: list) -> tuple[int, str]:
    """The one resource's error code and message (the top level of both answers has none)."""
    if not results:
        return Errors.UNKNOWN_SERVER_ERROR, "the broker answered for no resource"
    return results[0]["error_code"], results[0]["error_message"] or ""


def _ask(config: ConsumerConfig, group_id: str, api: Api, body: dict, deadline: float, error_of) -> dict:
    """Send ``body`` to the least loaded broker until an answer whose error (``error_of``) is not
    retriable; retriable errors and lost connections are retried after ``retry_backoff_ms``."""
    net = NetworkClient(config)
    last_code: int | None = None

    def refuse(code: int, message: str):
        raise GroupConfigRefused(group_id, None, None, code, message, _fix(code, config, group_id))
    try:
        while True:
            resp = ask_least_loaded(net, api, body, deadline, refuse)
            if resp is not None:
                code = error_of(resp)
                if code == Errors.NONE or not error_code(code).retriable:
                    return resp
                last_code = code
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                last = (f"last error {error_code(last_code).name}" if last_code is not None else
                        f"last connection error: {net.last_connection_error() or 'none'}")
                raise GroupConfigUnavailable(f"group {group_id}: no broker of {','.join(config.bootstrap_servers)} "
                                             f"answered {api.name} in time ({last})", last_code)
            net.poll(min(config.retry_backoff_ms / 1000, remaining))
    finally:
        net.close()


def _named_setting(configs: Mapping[str, str], message: str) -> str | None:
    """The one setting of ``configs`` the broker's message names (its messages say e.g.
    "Invalid value 1 for configuration share.record.lock.duration.ms: ..."), or None."""
    named = [name for name in configs if re.search(rf"(?<![\w.]){re.escape(name)}(?![\w.])", message)]
    return named[0] if len(named) == 1 else None


def _fix(code: int, config: ConsumerConfig, group_id: str) -> str:
    fix = _FIXES.get(code, "see the broker's message and log")
    see = _KAFKA_CONFIGS.format(servers=",".join(config.bootstrap_servers), group=group_id)
    return f"{fix.format(group=group_id)}; what the group has now: {see}"
