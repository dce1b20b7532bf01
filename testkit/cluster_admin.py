"""Aim a fault at a running Apache Kafka cluster: who leads what, who coordinates a group, and
moving leadership on purpose.

The fault tests need to know which broker to kill (the leader of a partition, the coordinator of
a group) and to move leaders without killing anything (a reassignment, a preferred election).
Leaders come from confluent-kafka's metadata; the coordinator from a FindCoordinator request with
kdaemon's own codec (testkit/wire.py); reassignments from an AlterPartitionReassignments
request (key 45, declared below: the consumer never sends it, so it has no place in
kdaemon/protocol/apis, and confluent-kafka 2.16 has no binding for it, nor are Kafka's command
line tools among the jars the test cluster runs on); preferred elections from confluent-kafka's
``elect_leaders``.  Every wait is bounded and fails with what it saw.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from confluent_kafka import ElectionType, TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient

from kdaemon.protocol.apis import FIND_COORDINATOR
from kdaemon.protocol.schema import INT16, INT32, STRING, Api, Array, Field, Struct
from testkit.apache_kafka import HOST, KafkaCluster
from testkit.wire import request

TIMEOUT = 60.0
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16

# AlterPartitionReassignments v0 as in Kafka's AlterPartitionReassignmentsRequest/Response.json
# (flexible from v0; ``replicas`` null cancels a pending reassignment).  Any broker forwards it
# to the active controller.
ALTER_PARTITION_REASSIGNMENTS = Api(
    45, "AlterPartitionReassignments", versions=(0, 0), flexible="0+",
    request=Struct(
        Field("timeout_ms", INT32, "0+", default=60_000),
        Field("topics", Array(Struct(
            Field("name", STRING, "0+"),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32, "0+"),
                Field("replicas", Array(INT32), "0+", nullable="0+"),
                name="ReassignablePartition")), "0+"),
            name="ReassignableTopic")), "0+"),
        name="AlterPartitionReassignmentsRequest",
    ),
    response=Struct(
        Field("throttle_time_ms", INT32, "0+"),
        Field("error_code", INT16, "0+"),
        Field("error_message", STRING, "0+", nullable="0+"),
        Field("responses", Array(Struct(
            Field("name", STRING, "0+"),
            Field("partitions", Array(Struct(
                Field("partition_index", INT32, "0+"),
                Field("error_code", INT16, "0+"),
                Field("error_message", STRING, "0+", nullable="0+"),
                name="ReassignablePartitionResponse")), "0+"),
            name="ReassignableTopicResponse")), "0+"),
        name="AlterPartitionReassignmentsResponse",
    ),
)


class TopicMetadataError(RuntimeError):
    """The metadata answer had an error for the topic (right after creation: a broker that has
    not seen it yet says UNKNOWN_TOPIC_OR_PART)."""


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def describe_partitions(bootstrap: str, topic: str) -> dict[int, dict]:
    """partition -> {"leader", "replicas", "isr"} as the cluster's metadata says now."""
    md = admin(bootstrap).list_topics(topic=topic, timeout=TIMEOUT).topics[topic]
    if md.error is not None:
        raise TopicMetadataError(f"metadata for {topic}: {md.error}")
    return {p: {"leader": pm.leader, "replicas": list(pm.replicas), "isr": list(pm.isrs)}
            for p, pm in md.partitions.items()}


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """partition -> leader id (-1 during an election), from the first broker that knows the topic."""
    seen = wait_partitions(bootstrap, topic, lambda ps: True, "the topic's metadata")
    return {p: d["leader"] for p, d in seen.items()}


def wait_partitions(bootstrap: str, topic: str, predicate: Callable[[dict[int, dict]], bool],
                    what: str, timeout: float = TIMEOUT) -> dict[int, dict]:
    """Poll the topic's metadata until ``predicate`` holds for it; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            seen = describe_partitions(bootstrap, topic)
        except TopicMetadataError as exc:   # a broker that has not seen the topic yet
            seen = {"error": str(exc)}
        else:
            if predicate(seen):
                return seen
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: {what} not seen within {timeout} s; metadata: {seen}")
        time.sleep(0.2)


def wait_full_isr(bootstrap: str, topic: str, replicas: int, timeout: float = TIMEOUT) -> dict[int, dict]:
    def in_sync(ps: dict[int, dict]) -> bool:
        return all(len(d["isr"]) == replicas and d["leader"] >= 0 for d in ps.values())
    return wait_partitions(bootstrap, topic, in_sync, f"all {replicas} replicas in sync", timeout)


def find_coordinator(cluster: KafkaCluster, group: str, timeout: float = TIMEOUT) -> int:
    """The node id coordinating ``group``."""
    return find_coordinators(cluster, [group], timeout)[group]


def find_coordinators(cluster: KafkaCluster, groups: list[str], timeout: float = TIMEOUT) -> dict[str, int]:
    """group -> the node id coordinating it, all from one FindCoordinator v4 request (one broker's
    view at one moment: two look-ups could straddle a leader change of __consumer_offsets)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        for node in cluster.nodes.values():
            if not node.alive:
                continue
            try:
                body = request(HOST, node.port, FIND_COORDINATOR, 4,
                               {"key_type": 0, "coordinator_keys": list(groups)}).body
            except OSError as exc:
                last = exc
                continue
            entries = {e["key"]: e for e in body["coordinators"]}
            codes = {g: entries[g]["error_code"] for g in groups}
            if not any(codes.values()):
                return {g: entries[g]["node_id"] for g in groups}
            last = f"error codes {codes} from node {node.node_id}"
            if set(codes.values()) - {0, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}:
                raise RuntimeError(f"FindCoordinator({groups}): {last}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no coordinator for {groups} within {timeout} s (last: {last})")
        time.sleep(0.2)


def reassign(cluster: KafkaCluster, topic: str, replicas: Mapping[int, list[int]],
             timeout: float = TIMEOUT) -> None:
    """Start a reassignment of ``topic``'s partitions to ``replicas`` (partition -> broker ids in
    preference order) and wait until the metadata shows the new replica lists."""
    node = next(n for n in cluster.nodes.values() if n.alive)
    body = {"timeout_ms": int(timeout * 1000),
            "topics": [{"name": topic, "partitions": [{"partition_index": p, "replicas": list(r)}
                                                      for p, r in sorted(replicas.items())]}]}
    resp = request(HOST, node.port, ALTER_PARTITION_REASSIGNMENTS, 0, body, timeout=timeout).body
    errors = [f"top level: {resp['error_code']} {resp['error_message']}"] if resp["error_code"] else []
    errors += [f"{t['name']}[{p['partition_index']}]: {p['error_code']} {p['error_message']}"
               for t in resp["responses"] for p in t["partitions"] if p["error_code"]]
    if errors:
        raise RuntimeError("AlterPartitionReassignments refused: " + "; ".join(errors))
    wait_partitions(cluster.bootstrap, topic,
                    lambda ps: all(ps[p]["replicas"] == list(r) for p, r in replicas.items()),
                    f"replicas {dict(replicas)}", timeout)


def elect_preferred(bootstrap: str, topic: str, partitions: list[int], timeout: float = TIMEOUT) -> None:
    """Preferred leader election (the first replica leads) for ``partitions`` of ``topic``.

    A partition already led by its preferred replica reports ELECTION_NOT_NEEDED, which is fine.
    """
    # No request_timeout/operation_timeout keywords: confluent-kafka 2.16.1's binding fails on
    # them with "SystemError: more argument specifiers than keyword list entries".
    client = admin(bootstrap)   # kept referenced: a collected client fails its futures
    fut = client.elect_leaders(ElectionType.PREFERRED, [CkTopicPartition(topic, p) for p in partitions])
    for tp, exc in fut.result(timeout).items():
        if exc is None:
            continue
        # A KafkaError, or a KafkaException carrying one (the binding's docs say the latter).
        err = exc.args[0] if isinstance(exc, Exception) and exc.args else exc
        if getattr(err, "name", lambda: "")() != "ELECTION_NOT_NEEDED":
            raise RuntimeError(f"preferred election for {tp.topic}[{tp.partition}]: {exc}")
