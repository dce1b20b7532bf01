"""Fetch a partition with kdaemon's own protocol layer over one plain blocking socket.

The kdaemon side of golden tests against a real broker (``rawfetch`` is the independent side):
ApiVersions first, Metadata and Fetch at the versions ``choose_version`` picks against the
broker's ranges, then a fetch loop that moves on from ``RecordSetReader.next_offset`` the way a
consumer does.  Every response frame is kept as it came off the wire, so a test can check that
the codec accounted for each byte.

Not a client: no retries, no reconnects, one request in flight.  Any broker error code raises.
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kdaemon.protocol.apis.api_versions import API_VERSIONS
from kdaemon.protocol.apis.fetch import FETCH
from kdaemon.protocol.apis.metadata import METADATA
from kdaemon.protocol.connection import KafkaConnection, Response
from kdaemon.protocol.errors import BrokerError, Errors
from kdaemon.protocol.records import ConsumerRecord, RecordSetReader
from kdaemon.protocol.schema import Api
from kdaemon.protocol.versions import broker_ranges, choose_version

SOFTWARE = {"client_software_name": "kdaemon-golden", "client_software_version": "0"}
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


class BrokerConnection:
    """One blocking connection driven by ``KafkaConnection``, one request at a time.

    ``last_frame`` is the last response exactly as received, size prefix excluded.
    """

    def __init__(self, host: str, port: int, *, timeout: float = 10.0,
                 client_id: str = "kdaemon-golden") -> None:
        # strict: trailing bytes after a response body are an error, not a count to ignore.
        self.conn = KafkaConnection(client_id=client_id, strict=True)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.last_frame = b""

    def request(self, api: Api, version: int, body: dict) -> Response:
        self.sock.sendall(self.conn.send(api, version, body))
        received = bytearray()
        while True:
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError(f"the broker closed the connection before answering "
                                      f"{api.name} v{version}")
            received += data
            responses = self.conn.receive_data(data)
            if responses:
                if len(responses) != 1 or self.conn.in_flight or responses[0].trailing:
                    raise AssertionError(f"one request, {len(responses)} responses, "
                                         f"{responses[0].trailing} trailing bytes")
                self.last_frame = bytes(received[4:])
                if len(self.last_frame) != responses[0].size:
                    raise AssertionError(f"{api.name} v{version}: {len(received)} bytes received "
                                         f"for a frame of {responses[0].size}")
                return responses[0]

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "BrokerConnection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def api_version_ranges(conn: BrokerConnection) -> dict[int, tuple[int, int]]:
    """The broker's {api_key: (min, max)}, asked at the newest ApiVersions both sides know."""
    body = conn.request(API_VERSIONS, API_VERSIONS.max_version, SOFTWARE).body
    if body["error_code"] == Errors.UNSUPPORTED_VERSION:
        version = choose_version(API_VERSIONS, broker_ranges(body))
        body = conn.request(API_VERSIONS, version, SOFTWARE).body
    if body["error_code"]:
        raise BrokerError(body["error_code"], "ApiVersions")
    return broker_ranges(body)


@dataclass(frozen=True)
class PartitionLeader:
    topic: str
    topic_id: uuid.UUID
    partition: int
    leader_id: int
    leader_epoch: int
    host: str
    port: int


def metadata_request(topic: str) -> dict:
    # At v10+ the topic id is sent too; the zero UUID means "look it up by name".
    return {"topics": [{"name": topic}], "allow_auto_topic_creation": False}


def find_leader(conn: BrokerConnection, version: int, topic: str, partition: int = 0) -> PartitionLeader:
    body = conn.request(METADATA, version, metadata_request(topic)).body
    if body.get("error_code"):
        raise BrokerError(body["error_code"], f"Metadata v{version}")
    found = [t for t in body["topics"] if t["name"] == topic]
    if len(found) != 1:
        raise AssertionError(f"Metadata v{version} answered {len(found)} entries for {topic!r}")
    t = found[0]
    if t["error_code"]:
        raise BrokerError(t["error_code"], f"Metadata v{version} for {topic!r}")
    parts = [p for p in t["partitions"] if p["partition_index"] == partition]
    if len(parts) != 1 or parts[0]["error_code"]:
        raise AssertionError(f"Metadata v{version}: {topic}[{partition}] is missing or failed: {parts}")
    p = parts[0]
    brokers = {b["node_id"]: b for b in body["brokers"]}
    leader = brokers.get(p["leader_id"])
    if leader is None:
        raise AssertionError(f"Metadata v{version}: leader {p['leader_id']} of {topic}[{partition}] "
                             f"is not among the brokers {sorted(brokers)}")
    return PartitionLeader(topic, t["topic_id"], partition, p["leader_id"], p["leader_epoch"],
                           leader["host"], leader["port"])


def fetch_request(leader: PartitionLeader, offset: int, *, max_bytes: int,
                  isolation_level: int = READ_UNCOMMITTED, max_wait_ms: int = 100) -> dict:
    """A sessionless Fetch for one partition; the codec writes ``topic`` or ``topic_id`` by version."""
    partition = {"partition": leader.partition, "fetch_offset": offset,
                 "partition_max_bytes": max_bytes, "current_leader_epoch": leader.leader_epoch}
    return {"max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": max_bytes,
            "isolation_level": isolation_level,
            "topics": [{"topic": leader.topic, "topic_id": leader.topic_id, "partitions": [partition]}]}


def fetch_partition(conn: BrokerConnection, version: int, leader: PartitionLeader, offset: int,
                    **kw) -> dict:
    """One Fetch; the partition's part of the response (``records`` as the codec returned it)."""
    body = conn.request(FETCH, version, fetch_request(leader, offset, **kw)).body
    if body["error_code"]:
        raise BrokerError(body["error_code"], f"Fetch v{version}")
    topics = body["responses"]
    if len(topics) != 1 or len(topics[0]["partitions"]) != 1:
        raise AssertionError(f"Fetch v{version} for one partition answered {topics}")
    t = topics[0]
    # v13 replaced the topic name by its id, in the response too.
    echoed, expected = (t["topic_id"], leader.topic_id) if version >= 13 else (t["topic"], leader.topic)
    if echoed != expected:
        raise AssertionError(f"Fetch v{version} answered for {echoed!r}, asked for {expected!r}")
    p = t["partitions"][0]
    if p["partition_index"] != leader.partition:
        raise AssertionError(f"Fetch v{version} answered partition {p['partition_index']}")
    if p["error_code"]:
        raise BrokerError(p["error_code"], f"Fetch v{version} {leader.topic}[{leader.partition}]")
    return p


@dataclass
class FetchRound:
    """One Fetch of the loop: where it started, the bytes the broker sent, what we made of them."""

    fetch_offset: int
    records: bytes
    partition: dict
    reader: RecordSetReader
    decoded: list[ConsumerRecord] = field(default_factory=list)


ReaderFactory = Callable[[int, "bytes | memoryview"], RecordSetReader]


def fetch_until(conn: BrokerConnection, version: int, leader: PartitionLeader, *, last_offset: int,
                reader_for: ReaderFactory, start: int = 0, max_bytes: int = 64 << 10,
                isolation_level: int = READ_UNCOMMITTED, max_rounds: int = 2000,
                max_idle_rounds: int = 20) -> list[FetchRound]:
    """Fetch from ``start`` until the position passes ``last_offset``.

    The position after each round is the round's ``reader.next_offset``, as in a consumer; the
    broker's high watermark is never consulted (Tansu's is not the log end).  ``reader_for``
    makes a fresh reader for (fetch offset, record set); it is read to the end here.  Raises if
    the position stops moving for ``max_idle_rounds`` rounds in a row.
    """
    rounds: list[FetchRound] = []
    offset, idle = start, 0
    while offset <= last_offset:
        if len(rounds) >= max_rounds:
            raise AssertionError(f"{max_rounds} fetches and the position is only at {offset}")
        p = fetch_partition(conn, version, leader, offset, max_bytes=max_bytes,
                            isolation_level=isolation_level)
        data = p["records"] if p["records"] is not None else b""
        reader = reader_for(offset, data)
        decoded = reader.read_all()
        rounds.append(FetchRound(offset, bytes(data), {k: v for k, v in p.items() if k != "records"},
                                 reader, decoded))
        if reader.next_offset < offset:
            raise AssertionError(f"next_offset {reader.next_offset} went back from {offset}")
        if reader.next_offset == offset:
            idle += 1
            if idle >= max_idle_rounds:
                raise AssertionError(f"position stuck at {offset} (wanted past {last_offset}) after "
                                     f"{idle} fetches; last record set had {len(data)} bytes")
        else:
            idle = 0
        offset = reader.next_offset
    return rounds
