"""A share group (KIP-932) from outside: its members and what it has left to settle.

A test sets the group's configs first (testkit/group_configs.py): ``share.auto.offset.reset`` =
earliest so a new share group reads records written before it (it starts at the end of each
partition otherwise), and ``share.record.lock.duration.ms`` to hold a record past its lock in
seconds rather than the default 30.

``share_lag`` asks the group coordinator DescribeShareGroupOffsets v1 (kdaemon's codec): per
partition, the start offset and the records not yet settled (KIP-1226).  Every record
accepted, rejected or settled as a gap: lag 0.

``share_members`` asks ShareGroupDescribe: each member's client id and assigned partitions (a
test waits for every member, a Java one included, to hold its partitions before producing).
"""

from __future__ import annotations

import time

from kdaemon.protocol.apis import DESCRIBE_SHARE_GROUP_OFFSETS, FIND_COORDINATOR, SHARE_GROUP_DESCRIBE
from testkit.wire import request

TIMEOUT = 30.0
_LOADING = {14, 15, 16}   # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


def _coordinator(host: str, port: int, group: str, timeout: float) -> tuple[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        c = request(host, port, FIND_COORDINATOR, 6, {"key_type": 0, "coordinator_keys": [group]}).body["coordinators"][0]
        if not c["error_code"]:
            return c["host"], c["port"]
        if c["error_code"] not in _LOADING or time.monotonic() > deadline:
            raise RuntimeError(f"FindCoordinator({group}): error code {c['error_code']}")
        time.sleep(0.2)


def share_members(host: str, port: int, group: str, timeout: float = TIMEOUT) -> dict[str, tuple[str, set[tuple[str, int]]]]:
    """{member id: (client id, {(topic, partition), ...})} of share group ``group``; {} when it
    has no members (or does not exist yet)."""
    chost, cport = _coordinator(host, port, group, timeout)
    (g,) = request(chost, cport, SHARE_GROUP_DESCRIBE, 1, {"group_ids": [group]}).body["groups"]
    if g["error_code"]:
        return {}
    return {m["member_id"]: (m["client_id"], {(t["topic_name"], p) for t in m["assignment"]["topic_partitions"]
                                              for p in t["partitions"]})
            for m in g["members"]}


def share_lag(host: str, port: int, group: str, timeout: float = TIMEOUT) -> dict[tuple[str, int], tuple[int, int]]:
    """{(topic, partition): (start offset, lag)} of ``group``, from its coordinator."""
    deadline = time.monotonic() + timeout
    while True:
        c = request(host, port, FIND_COORDINATOR, 6, {"key_type": 0, "coordinator_keys": [group]}).body["coordinators"][0]
        if not c["error_code"]:
            body = request(c["host"], c["port"], DESCRIBE_SHARE_GROUP_OFFSETS, 1,
                           {"groups": [{"group_id": group, "topics": None}]}).body
            g = body["groups"][0]
            if not g["error_code"]:
                return {(t["topic_name"], p["partition_index"]): (p["start_offset"], p["lag"])
                        for t in g["topics"] for p in t["partitions"]}
            code = g["error_code"]
        else:
            code = c["error_code"]
        if code not in _LOADING or time.monotonic() > deadline:
            raise RuntimeError(f"DescribeShareGroupOffsets of {group}: error code {code}")
        time.sleep(0.2)
