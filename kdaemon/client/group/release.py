"""Releasing a static membership on behalf of a process that no longer holds it.

A daemon's worker is a static member (``group_instance_id`` "<daemon_id>-<index>"), and its
successor — after a crash, a kill, or a roll — joins under the same instance id.  Both protocols
let a successor take over without the other members noticing, but not in every case:

* Consumer protocol (KIP-848): a static member that stops cleanly leaves with epoch -2 and the
  coordinator keeps its assignment for the instance id until the session timeout; a successor
  joining within it takes it over.  A member that was SIGKILLed never sent that leave, and the
  coordinator refuses its successor (UNRELEASED_INSTANCE_ID) until the old session expires —
  after moving its partitions to the others, and before moving them back: two rebalances for
  one restart.  ``release_static_member`` sends the dead member's -2 leave for it.
* Online upgrade (a classic group rolled to the consumer protocol): a classic static member
  never leaves on close (its successor replaces it at once under classic), but a
  consumer-protocol successor is refused the instance id of a classic member that has not left.
  ``leave_classic_member`` sends the classic LeaveGroup (v3+, KIP-345) the predecessor did not.
  Its partitions then move to the other members until the successor joins; each move commits
  first, so nothing is read twice.

The coordinator checks that member id and instance id still belong together (else
FENCED_INSTANCE_ID, or UNKNOWN_MEMBER_ID once the member is gone): a stale id releases nothing
but itself.  Each call opens its own short-lived network client.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...protocol.apis import CONSUMER_GROUP_HEARTBEAT, FIND_COORDINATOR, LEAVE_GROUP
from ...protocol.errors import BrokerError, Errors, error_code
from ...protocol.schema import Api
from ..config import ConsumerConfig
from ..errors import KafkaTimeoutError
from ..future import Future
from ..network import NetworkClient
from .consumer_heartbeat import LEAVE_STATIC_EPOCH
from .discovery import COORDINATOR_ERRORS, coordinator_connection_id

_RETRY = COORDINATOR_ERRORS | {Errors.COORDINATOR_LOAD_IN_PROGRESS}
KIP345_LEAVE = 3   # the first LeaveGroup version naming members with their instance ids


def leave_group_request(group_id: str, member_id: str, instance_id: str | None, reason: str) -> dict:
    """A classic LeaveGroup body for one member: ``member_id`` at the top for v0-2, the
    ``members`` list (with the instance id, KIP-345) for v3+.  Removing a static member needs
    v3+ (``KIP345_LEAVE``)."""
    return {"group_id": group_id, "member_id": member_id,
            "members": [{"member_id": member_id, "group_instance_id": instance_id, "reason": reason}]}


def release_static_member(config: ConsumerConfig, member_id: str, *, timeout_ms: int | None = None) -> str:
    """ConsumerGroupHeartbeat with epoch -2 for ``member_id`` (instance ``config.group_instance_id``
    of ``config.group_id``).  Returns "released", or the error the coordinator answered
    (UNKNOWN_MEMBER_ID: nothing left to release; FENCED_INSTANCE_ID: the instance id is someone
    else's now; GROUP_ID_NOT_FOUND: not a consumer-protocol group)."""
    body = {"group_id": config.group_id, "member_id": member_id, "member_epoch": LEAVE_STATIC_EPOCH,
            "instance_id": config.group_instance_id}
    _need_static(config)
    code = ask_coordinator(config, CONSUMER_GROUP_HEARTBEAT, body, timeout_ms)["error_code"]
    return "released" if code == 0 else error_code(code).name


def leave_classic_member(config: ConsumerConfig, member_id: str, *, timeout_ms: int | None = None) -> str:
    """LeaveGroup (v3+) for the classic static member ``member_id`` with instance
    ``config.group_instance_id``.  Returns "left", or the error the coordinator answered for the
    group or the member (UNKNOWN_MEMBER_ID: it is gone already; FENCED_INSTANCE_ID: the
    instance id is someone else's now)."""
    body = leave_group_request(config.group_id, member_id, config.group_instance_id,
                               "kdaemon: a successor of this worker takes its place")
    _need_static(config)
    resp = ask_coordinator(config, LEAVE_GROUP, body, timeout_ms, min_version=KIP345_LEAVE)
    code = resp["error_code"] or next((m["error_code"] for m in resp["members"] if m["error_code"]), 0)
    return "left" if code == 0 else error_code(code).name


def _need_static(config: ConsumerConfig) -> None:
    if not config.group_id or not config.group_instance_id:
        raise ValueError("releasing a static member needs group_id and group_instance_id")


def ask_coordinator(config: ConsumerConfig, api: Api, body: dict, timeout_ms: int | None,
                    min_version: int | None = None,
                    error_of: Callable[[dict], int] = lambda resp: resp["error_code"]) -> dict:
    """Find ``config.group_id``'s coordinator and send it ``body``; the response body.  Retries
    a coordinator that moved or is loading (``error_of`` reads the answer's error code) and
    dropped connections; ``KafkaTimeoutError`` past ``timeout_ms`` (default
    ``default_api_timeout_ms``).  One short-lived network client per call."""
    if not config.group_id:
        raise ValueError("asking a group coordinator needs group_id")
    timeout = (config.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000
    deadline = time.monotonic() + timeout
    net = NetworkClient(config)

    def wait(fut: Future, what: str) -> Future:
        net.poll(max(0.0, deadline - time.monotonic()), until=lambda: fut.done)
        if not fut.done:
            raise KafkaTimeoutError(f"group {config.group_id}: no answer to {what} within {timeout:.0f} s "
                                    f"(last connection error: {net.last_connection_error() or 'none'})")
        return fut

    def pause() -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise KafkaTimeoutError(f"group {config.group_id}: the coordinator did not answer {api.name} in time")
        net.poll(min(config.retry_backoff_ms / 1000, remaining))

    try:
        while True:
            node = net.least_loaded_node()
            if node is None:
                pause()
                continue
            found = wait(net.send(node, FIND_COORDINATOR, {"key": config.group_id, "key_type": 0,
                                                           "coordinator_keys": [config.group_id]}),
                         "FindCoordinator")
            if found.failed:
                pause()
                continue
            version, resp = found.value()
            if version >= 4:
                entry = resp["coordinators"][0] if resp["coordinators"] else \
                    {"error_code": Errors.COORDINATOR_NOT_AVAILABLE}
            else:
                entry = resp
            if entry["error_code"] in _RETRY:
                pause()
                continue
            if entry["error_code"]:
                raise BrokerError(entry["error_code"], f"FindCoordinator for group {config.group_id}")
            connection = coordinator_connection_id(entry["node_id"])
            net.pin_node(connection, entry["host"], entry["port"])
            answer = wait(net.send(connection, api, body, min_version=min_version), api.name)
            if not answer.failed and error_of(answer.value()[1]) not in _RETRY:
                return answer.value()[1]
            net.unpin_node(connection)
            pause()
    finally:
        net.close()
