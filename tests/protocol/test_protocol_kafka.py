"""Our codec against Apache Kafka 4.x, byte for byte, and the versions our client really sends.

Four things are shown here against the reference broker (the session ``kafka`` fixture):

* **Every version of every API we implement that Kafka offers round-trips.**  For each API in
  ``kdaemon/protocol/apis`` and each version in the intersection of our range and Kafka's, a real
  request built with our codec goes to Kafka; its answer must decode strictly (no trailing
  bytes) and re-encode to exactly the bytes Kafka sent (``encode_response(decode(frame)) ==
  frame``).  Group APIs get a real group (join, sync, commit ...), share-group APIs (KIP-932) a
  real share group: a member joins and is assigned the topic, ShareFetch acquires every record
  (from a session opened at epoch 0) and its record sets decode to what was produced,
  ShareAcknowledge accepts, releases (the records come again, delivered twice) and renews, the
  start offsets are described, moved and deleted.  Where Kafka answers with an error (SASL on a
  PLAINTEXT listener, NON_EMPTY_GROUP) the error response is round-tripped just the same.
  Versions we implement and Kafka 4 no longer offers (KIP-896) are sent too: Kafka must refuse
  them (it closes the connection), so the table of removed versions below is a fact, not a
  belief.
* **KIP-896**: the version our negotiation picks lies inside Kafka's range for every API, and the
  real ``Consumer`` (assign + poll, offsets_for_times, a group with commits, close) never sends a
  version Kafka 4 removed.  Every request is observed through ``NetworkClient.observers``.
* **Fetch by topic id** (v13+): the consumer's Fetch requests carry Kafka's topic ids and no
  names, and Kafka's answers, which carry ids only, reach the right topic.
* **Share groups are on** and Kafka offers exactly the share-API versions we declare.
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections import defaultdict

import pytest

from kdaemon.client.consumer import Consumer
from kdaemon.client.types import TopicPartition
from kdaemon.protocol import messages
from kdaemon.protocol.apis import (ALL_APIS, API_VERSIONS, CONSUMER_GROUP_DESCRIBE, CONSUMER_GROUP_HEARTBEAT,
                                   DESCRIBE_GROUPS, FETCH,
                                   FIND_COORDINATOR, HEARTBEAT, JOIN_GROUP, LEAVE_GROUP,
                                   LIST_OFFSETS, METADATA, OFFSET_COMMIT, OFFSET_FETCH,
                                   OFFSET_FOR_LEADER_EPOCH, SASL_AUTHENTICATE, SASL_HANDSHAKE,
                                   SYNC_GROUP, PRODUCE, INIT_PRODUCER_ID, DESCRIBE_CONFIGS,
                                   SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH,
                                   SHARE_ACKNOWLEDGE, DESCRIBE_SHARE_GROUP_OFFSETS,
                                   ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS,
                                   INCREMENTAL_ALTER_CONFIGS, CREATE_TOPICS, GET_TELEMETRY_SUBSCRIPTIONS,
                                   PUSH_TELEMETRY)
from kdaemon.protocol.apis.incremental_alter_configs import OP_DELETE, OP_SET
from kdaemon.protocol.apis.share_fetch import ACK_ACCEPT, ACK_RELEASE, ACK_RENEW
from kdaemon.protocol.records import decode_record_set
from kdaemon.protocol.apis.describe_configs import RESOURCE_GROUP
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.apis.consumer_protocol import encode_assignment, encode_subscription
from kdaemon.protocol.errors import Errors
from kdaemon.protocol.primitives import ZERO_UUID
from kdaemon.protocol.versions import choose_version
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

CLIENT_ID = "kdaemon-protocol-test"
PARTITIONS = 3

# What Kafka 4 removed (KIP-896) of the versions we implement, by API name.  We keep these
# layouts for older brokers; negotiation only picks them when a broker offers nothing newer.
# A change here (a new API with old versions, or a Kafka release removing more) must be
# deliberate: test_removed_versions_are_exactly_the_documented_ones fails until it is.
REMOVED_IN_KAFKA_4 = {"OffsetCommit": [0, 1], "OffsetFetch": [0]}


# -- one raw exchange, bytes kept ----------------------------------------------------------------

class Wire:
    """One plain socket to a broker: requests encoded by our codec, answers kept as raw frames."""

    def __init__(self, host: str, port: int, timeout: float = 15.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.correlation_id = 0

    def exchange(self, api, version: int, body: dict) -> tuple[bytes, dict]:
        """Send one request; return the whole response frame (size prefix included) and its
        strict decoding.  ConnectionError if Kafka closes the connection instead of answering."""
        self.correlation_id += 1
        cid = self.correlation_id
        self.sock.sendall(messages.encode_request(api, version, cid, CLIENT_ID, body))
        size = struct.unpack(">i", self._read(4, api, version))[0]
        frame = self._read(size, api, version)
        assert messages.read_correlation_id(frame) == cid
        return struct.pack(">i", size) + frame, messages.decode_response(api, version, frame)

    def _read(self, n: int, api, version: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            data = self.sock.recv(n - len(buf))
            if not data:
                raise ConnectionError(f"Kafka closed the connection instead of answering "
                                      f"{api.name} v{version}")
            buf += data
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Wire":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def round_trip(api, version: int, wire: Wire, body: dict) -> dict:
    """Exchange once and check that our encoding of the decoded answer is Kafka's frame."""
    raw, decoded = wire.exchange(api, version, body)
    again = messages.encode_response(api, version, wire.correlation_id, decoded)
    assert again == raw, (f"{api.name} v{version}: re-encoding differs from Kafka's {len(raw)} bytes "
                          f"(ours {len(again)}); first difference at byte "
                          f"{next((i for i, (a, b) in enumerate(zip(raw, again)) if a != b), min(len(raw), len(again)))}")
    return decoded


# -- fixtures ------------------------------------------------------------------------------------

class Env:
    """The module's topic (3 partitions with records) and its id, on the session broker."""

    def __init__(self, kafka) -> None:
        self.kafka = kafka
        self.host, self.port = kafka.host, kafka.port
        self.topic = f"protocol-{uuid.uuid4().hex[:8]}"
        create_topic(kafka.bootstrap, self.topic, PARTITIONS)
        for p in range(PARTITIONS):
            produce(kafka.bootstrap, self.topic,
                    [(b"k%d" % i, b"v%d-%d" % (p, i), [("h", b"x")]) for i in range(5)], partition=p)
        with self.wire() as w:
            md = w.exchange(METADATA, 12, {"topics": [{"name": self.topic}],
                                           "allow_auto_topic_creation": False})[1]
        self.topic_id = md["topics"][0]["topic_id"]
        assert self.topic_id != ZERO_UUID

    def wire(self) -> Wire:
        return Wire(self.host, self.port)

    def coordinator(self, group: str) -> Wire:
        """A connection to ``group``'s coordinator (the only node here, asked all the same).
        COORDINATOR_NOT_AVAILABLE is retried: Kafka answers it while it creates and loads
        ``__consumer_offsets`` for the first group of a fresh broker."""
        deadline = time.monotonic() + 60
        with self.wire() as w:
            while True:
                body = w.exchange(FIND_COORDINATOR, 6, {"key_type": 0, "coordinator_keys": [group]})[1]
                c = body["coordinators"][0]
                if c["error_code"] != Errors.COORDINATOR_NOT_AVAILABLE or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert c["error_code"] == Errors.NONE, c
        return Wire(c["host"], c["port"])


@pytest.fixture(scope="module")
def env(kafka) -> Env:
    return Env(kafka)


def offered(kafka, api) -> tuple[int, int] | None:
    return kafka.offered.get(api.key)


# A broker offers the client telemetry APIs (KIP-714) only with a ClientTelemetry plugin among
# its metric reporters, which this module's broker has not: they are exchanged with a real one
# in tests/client/test_telemetry_kafka.py, and here only checked to be absent.
NEEDS_TELEMETRY_PLUGIN = (GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY)
OFFERED_APIS = tuple(api for api in ALL_APIS if api not in NEEDS_TELEMETRY_PLUGIN)


def all_versions():
    """(api, version) for every version we implement; Kafka's range is checked in the test."""
    return [pytest.param(api, v, id=f"{api.name}-v{v}")
            for api in OFFERED_APIS for v in range(api.min_version, api.max_version + 1)]


# -- request bodies: one realistic request per API, at any version --------------------------------

def subscription(topic: str) -> bytes:
    return encode_subscription(1, {"topics": [topic], "owned_partitions": []})


# What a group coordinator answers while the __consumer_offsets partition behind a group is
# still being created or loaded (the first groups on a fresh broker): ask again.
COORDINATOR_LOADING = {Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                       Errors.NOT_COORDINATOR}


def until_loaded(send, body: dict, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        answer = send(body)
        if answer["error_code"] not in COORDINATOR_LOADING or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def join(w: Wire, group: str, topic: str, version: int = JOIN_GROUP.max_version,
         check=None) -> dict:
    """Join ``group`` as its only member (two rounds from v4: MEMBER_ID_REQUIRED first).

    ``check`` (round_trip or None) is applied to every JoinGroup exchange."""
    body = {"group_id": group, "session_timeout_ms": 30_000, "rebalance_timeout_ms": 30_000,
            "member_id": "", "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": subscription(topic)}],
            "reason": "protocol test"}
    send = (lambda b: check(JOIN_GROUP, version, w, b)) if check else \
        (lambda b: w.exchange(JOIN_GROUP, version, b)[1])
    answer = until_loaded(send, body)
    if answer["error_code"] == Errors.MEMBER_ID_REQUIRED:
        assert version >= 4
        answer = send(dict(body, member_id=answer["member_id"]))
    assert answer["error_code"] == Errors.NONE, answer
    assert answer["leader"] == answer["member_id"]
    return answer


def sync(w: Wire, group: str, joined: dict, topic: str, version: int = SYNC_GROUP.max_version,
         check=None) -> dict:
    assignment = encode_assignment(0, {"assigned_partitions": [{"topic": topic,
                                                                "partitions": list(range(PARTITIONS))}]})
    body = {"group_id": group, "generation_id": joined["generation_id"],
            "member_id": joined["member_id"], "protocol_type": "consumer", "protocol_name": "range",
            "assignments": [{"member_id": joined["member_id"], "assignment": assignment}]}
    answer = check(SYNC_GROUP, version, w, body) if check else w.exchange(SYNC_GROUP, version, body)[1]
    assert answer["error_code"] == Errors.NONE, answer
    assert bytes(answer["assignment"]) == assignment
    return answer


def stable_member(env: Env, w: Wire, group: str) -> dict:
    joined = join(w, group, env.topic)
    sync(w, group, joined, env.topic)
    return joined



# -- share groups (KIP-932) ------------------------------------------------------------------------

def share_join(env: Env, w: Wire, group: str, version: int = SHARE_GROUP_HEARTBEAT.max_version,
               check=None) -> dict:
    """Join share group ``group`` as a new member subscribed to the module's topic, and heartbeat
    until the coordinator has assigned it every partition.  Returns the last answer; its
    ``member_id`` is the one this member chose (a share member names itself).

    ``check`` (round_trip or None) is applied to every exchange.  The assignment comes once the
    share coordinator has initialized the group's state for the topic, a few heartbeats later."""
    send = (lambda b: check(SHARE_GROUP_HEARTBEAT, version, w, b)) if check else \
        (lambda b: w.exchange(SHARE_GROUP_HEARTBEAT, version, b)[1])
    member_id = str(uuid.uuid4())
    answer = until_loaded(send, {"group_id": group, "member_id": member_id, "member_epoch": 0,
                                 "subscribed_topic_names": [env.topic]})
    deadline = time.monotonic() + 60
    while True:
        assert answer["error_code"] == Errors.NONE, answer
        assert answer["member_id"] == member_id, answer
        if answer["assignment"] is not None and answer["assignment"]["topic_partitions"] == \
                [{"topic_id": env.topic_id, "partitions": list(range(PARTITIONS))}]:
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
        answer = send({"group_id": group, "member_id": member_id, "member_epoch": answer["member_epoch"]})


def share_leave(w: Wire, group: str, member: dict) -> None:
    left = w.exchange(SHARE_GROUP_HEARTBEAT, SHARE_GROUP_HEARTBEAT.max_version, {
        "group_id": group, "member_id": member["member_id"], "member_epoch": -1})[1]
    assert (left["error_code"], left["member_epoch"]) == (Errors.NONE, -1), left


def share_group_from_start(env: Env, w: Wire, group: str) -> dict:
    """A new share group whose start offsets are 0 on every partition of the module's topic.
    A share group starts at the end of a partition (share.auto.offset.reset=latest) and the
    module's records are already written; AlterShareGroupOffsets on a group nobody created
    creates it with those start offsets (``kafka-share-groups.sh --reset-offsets`` does the same
    to an empty group)."""
    moved = until_loaded(lambda b: w.exchange(ALTER_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS.max_version, b)[1],
                         share_start_offsets_body(env, group, 0))
    assert moved["error_code"] == Errors.NONE, moved
    assert all(p["error_code"] == Errors.NONE for t in moved["responses"] for p in t["partitions"]), moved
    return moved


def share_start_offsets_body(env: Env, group: str, offset: int) -> dict:
    """AlterShareGroupOffsets: every partition of the module's topic starts at ``offset``."""
    return {"group_id": group, "topics": [{"topic_name": env.topic, "partitions": [
        {"partition_index": p, "start_offset": offset} for p in range(PARTITIONS)]}]}


def share_fetch_body(env: Env, group: str, member: dict, epoch: int, *, partitions=True,
                     acknowledge: dict | None = None, max_wait_ms: int = 5000) -> dict:
    """A ShareFetch of the module's topic; ``acknowledge`` maps partition -> acknowledgement
    batches.  Only a session's first request (epoch 0) must list the partitions."""
    listed = set(range(PARTITIONS)) if partitions else set()
    listed |= set(acknowledge or {})
    topics = [{"topic_id": env.topic_id, "partitions": [
        {"partition_index": p, "acknowledgement_batches": (acknowledge or {}).get(p, [])}
        for p in sorted(listed)]}] if listed else []
    return {"group_id": group, "member_id": member["member_id"], "share_session_epoch": epoch,
            "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 500,
            "batch_size": 500, "topics": topics}


def acquired(answer: dict) -> dict[int, list[tuple[int, int, int]]]:
    """{partition: [(first, last, delivery count)]} of a ShareFetch answer."""
    return {p["partition_index"]: [(a["first_offset"], a["last_offset"], a["delivery_count"])
                                   for a in p["acquired_records"]]
            for t in answer["responses"] for p in t["partitions"] if p["acquired_records"]}


def share_fetch_all(env: Env, w: Wire, group: str, member: dict, version: int = SHARE_FETCH.max_version,
                    check=None) -> tuple[list[dict], int]:
    """ShareFetch, opening a session (epoch 0), until every record of the module's topic is
    acquired by this member.  Returns the answers and the session's next epoch."""
    send = (lambda b: check(SHARE_FETCH, version, w, b)) if check else \
        (lambda b: w.exchange(SHARE_FETCH, version, b)[1])
    answers, got, epoch = [], {}, 0
    deadline = time.monotonic() + 60
    while sum(last - first + 1 for ranges in got.values() for first, last, _ in ranges) < 5 * PARTITIONS:
        assert time.monotonic() < deadline, answers
        answers.append(send(share_fetch_body(env, group, member, epoch, partitions=epoch == 0)))
        assert answers[-1]["error_code"] == Errors.NONE, answers[-1]
        for p, ranges in acquired(answers[-1]).items():
            got.setdefault(p, []).extend(ranges)
        epoch += 1
    return answers, epoch


def ack(first: int, last: int, kind: int) -> list[dict]:
    return [{"first_offset": first, "last_offset": last, "acknowledge_types": [kind]}]


def exercise(env: Env, api, version: int) -> list[dict]:
    """Send ``api`` at ``version`` the way a client would; every answer is round-tripped.
    Returns the decoded answers so the caller can check what matters for the API."""
    topic, tid = env.topic, env.topic_id
    group = f"protocol-{api.name}-{version}-{uuid.uuid4().hex[:6]}"
    answers: list[dict] = []

    def rt(a, v, w, body):
        answers.append(round_trip(a, v, w, body))
        return answers[-1]

    if api is API_VERSIONS:
        with env.wire() as w:
            rt(api, version, w, {"client_software_name": "kdaemon-tests", "client_software_version": "1.0"})
    elif api is METADATA:
        topics = [{"name": None, "topic_id": tid}] if version >= 12 else [{"name": topic}]
        with env.wire() as w:
            rt(api, version, w, {"topics": topics, "allow_auto_topic_creation": False,
                                 "include_topic_authorized_operations": version >= 8})
            rt(api, version, w, {"topics": None, "allow_auto_topic_creation": False})   # all topics
    elif api is FETCH:
        partitions = [{"partition": p, "fetch_offset": 1 if p == 0 else 0, "partition_max_bytes": 1 << 20,
                       "current_leader_epoch": -1} for p in range(PARTITIONS)]
        t = {"topic_id": tid} if version >= 13 else {"topic": topic}
        with env.wire() as w:
            rt(api, version, w, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 24,
                                 "isolation_level": 1, "session_id": 0, "session_epoch": -1,
                                 "topics": [dict(t, partitions=partitions)], "rack_id": ""})
    elif api is LIST_OFFSETS:
        targets = [-2, -1, -3 if version >= 7 else int(time.time() * 1000) - 3_600_000]
        with env.wire() as w:
            rt(api, version, w, {"replica_id": -1, "isolation_level": 0, "timeout_ms": 10_000, "topics": [
                {"name": topic, "partitions": [{"partition_index": p, "timestamp": ts}
                                               for p, ts in enumerate(targets)]}]})
    elif api is FIND_COORDINATOR:
        with env.wire() as w:
            rt(api, version, w, {"key": group, "key_type": 0, "coordinator_keys": [group]})
    elif api is JOIN_GROUP:
        with env.coordinator(group) as w:
            join(w, group, topic, version, check=rt)
    elif api is SYNC_GROUP:
        with env.coordinator(group) as w:
            sync(w, group, join(w, group, topic), topic, version, check=rt)
    elif api is HEARTBEAT:
        with env.coordinator(group) as w:
            m = stable_member(env, w, group)
            rt(api, version, w, {"group_id": group, "generation_id": m["generation_id"],
                                 "member_id": m["member_id"]})
            rt(api, version, w, {"group_id": group, "generation_id": m["generation_id"] + 7,
                                 "member_id": m["member_id"]})   # ILLEGAL_GENERATION
    elif api is LEAVE_GROUP:
        with env.coordinator(group) as w:
            m = stable_member(env, w, group)
            rt(api, version, w, {"group_id": group, "member_id": m["member_id"],
                                 "members": [{"member_id": m["member_id"], "reason": "protocol test"}]})
    elif api is OFFSET_COMMIT:
        with env.coordinator(group) as w:
            m = stable_member(env, w, group)
            t = {"topic_id": tid} if version >= 10 else {"name": topic}
            rt(api, version, w, {"group_id": group, "generation_id_or_member_epoch": m["generation_id"],
                                 "member_id": m["member_id"], "topics": [dict(t, partitions=[
                                     {"partition_index": p, "committed_offset": 3 + p,
                                      "committed_leader_epoch": 0, "committed_metadata": f"m{p}" if p else None}
                                     for p in range(PARTITIONS)])]})
    elif api is OFFSET_FETCH:
        with env.coordinator(group) as w:
            m = stable_member(env, w, group)
            w.exchange(OFFSET_COMMIT, 9, {"group_id": group, "generation_id_or_member_epoch": m["generation_id"],
                                          "member_id": m["member_id"], "topics": [{"name": topic, "partitions": [
                                              {"partition_index": 0, "committed_offset": 4,
                                               "committed_metadata": "meta"}]}]})
            parts = list(range(PARTITIONS))
            t = {"topic_id": tid} if version >= 10 else {"name": topic}
            rt(api, version, w, {"group_id": group, "topics": [{"name": topic, "partition_indexes": parts}],
                                 "groups": [{"group_id": group, "topics": [dict(t, partition_indexes=parts)]}],
                                 "require_stable": True})
            if version >= 2:   # a null topic list: everything the group committed
                rt(api, version, w, {"group_id": group, "topics": None,
                                     "groups": [{"group_id": group, "topics": None}]})
    elif api is SASL_HANDSHAKE:
        with env.wire() as w:
            rt(api, version, w, {"mechanism": "PLAIN"})
    elif api is SASL_AUTHENTICATE:
        with env.wire() as w:
            rt(api, version, w, {"auth_bytes": b"\0alice\0alice-secret"})
    elif api is CONSUMER_GROUP_HEARTBEAT:
        member_id = str(uuid.uuid4())
        with env.coordinator(group) as w:
            first = until_loaded(lambda b: rt(api, version, w, b), {
                "group_id": group, "member_id": member_id, "member_epoch": 0, "rebalance_timeout_ms": 30_000,
                "subscribed_topic_names": [topic], "topic_partitions": []})
            if first["error_code"] == Errors.NONE:
                rt(api, version, w, {"group_id": group, "member_id": first["member_id"] or member_id,
                                     "member_epoch": first["member_epoch"]})
                rt(api, version, w, {"group_id": group, "member_id": first["member_id"] or member_id,
                                     "member_epoch": -1})   # leave
    elif api is OFFSET_FOR_LEADER_EPOCH:
        with env.wire() as w:
            rt(api, version, w, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
                {"partition": p, "current_leader_epoch": 0, "leader_epoch": 0} for p in range(PARTITIONS)]}]})
            rt(api, version, w, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": 5, "leader_epoch": 0}]}]})   # UNKNOWN_LEADER_EPOCH
    elif api is DESCRIBE_GROUPS:
        with env.coordinator(group) as w:
            stable_member(env, w, group)
            rt(api, version, w, {"groups": [group, f"{group}-none"], "include_authorized_operations": version >= 3})
    elif api is CONSUMER_GROUP_DESCRIBE:
        # A real KIP-848 group (our consumer, group_protocol="consumer"), a classic group and one
        # nobody created, in one request.
        member = Consumer(env.kafka.bootstrap, client_id=CLIENT_ID, group_id=group, group_protocol="consumer",
                          auto_offset_reset="earliest")
        try:
            member.subscribe([topic])
            with env.coordinator(group) as w:
                stable_member(env, w, f"{group}-classic")
                ask = {"group_ids": [group, f"{group}-classic", f"{group}-none"], "include_authorized_operations": True}
                deadline = time.monotonic() + 60
                while True:   # until the coordinator has our member, by its own id, Stable with everything
                    member.poll(100)
                    g = next(g for g in w.exchange(api, version, ask)[1]["groups"] if g["group_id"] == group)
                    mine = [m for m in g["members"] if m["member_id"] == member.group_member_id()]
                    if g["group_state"] == "Stable" and mine and \
                            {p for t in mine[0]["assignment"]["topic_partitions"] for p in t["partitions"]} == \
                            {tp.partition for tp in member.assignment()} == set(range(PARTITIONS)):
                        break
                    assert time.monotonic() < deadline, (g, member.assignment())
                rt(api, version, w, ask)
        finally:
            member.close()
    elif api is INIT_PRODUCER_ID:
        with env.wire() as w:
            # A fresh broker answers COORDINATOR_LOAD_IN_PROGRESS until its producer-id block is in.
            first = until_loaded(lambda b: rt(api, version, w, b),
                                 {"transactional_id": None, "transaction_timeout_ms": 60_000})
            if version >= 3:   # the id and epoch of KIP-360, for a producer without a transactional id
                rt(api, version, w, {"transactional_id": None, "transaction_timeout_ms": 60_000,
                                     "producer_id": first["producer_id"],
                                     "producer_epoch": first["producer_epoch"]})
    elif api is PRODUCE:
        # Into a topic of its own (the module's topic must keep its 5 records per partition).
        name = f"{topic}-produce-v{version}"
        create_topic(env.kafka.bootstrap, name, 1)
        with env.wire() as w:
            md = w.exchange(METADATA, 12, {"topics": [{"name": name}], "allow_auto_topic_creation": False})[1]
            pid = until_loaded(lambda b: w.exchange(INIT_PRODUCER_ID, 4, b)[1],
                               {"transactional_id": None, "transaction_timeout_ms": 60_000})
            t = {"topic_id": md["topics"][0]["topic_id"]} if version >= 13 else {"name": name}
            for seq in (0, 0, 5):   # written, a duplicate, a gap (OUT_OF_ORDER_SEQUENCE_NUMBER)
                batch = build_batch([RecordSpec(b"k", b"v", [("h", b"x")]), RecordSpec(None, None)],
                                    producer_id=pid["producer_id"], producer_epoch=pid["producer_epoch"],
                                    base_sequence=seq)
                rt(api, version, w, {"transactional_id": None, "acks": -1, "timeout_ms": 10_000,
                                     "topic_data": [dict(t, partition_data=[{"index": 0, "records": batch}])]})
    elif api is DESCRIBE_CONFIGS:
        # A group's own configs (KIP-848: a group nobody configured has the broker's defaults),
        # one key, then all of them with synonyms (and documentation where the version has it).
        with env.wire() as w:
            rt(api, version, w, {"resources": [{"resource_type": RESOURCE_GROUP, "resource_name": group,
                                                "configuration_keys": ["consumer.session.timeout.ms"]}]})
            rt(api, version, w, {"resources": [{"resource_type": RESOURCE_GROUP, "resource_name": group,
                                                "configuration_keys": None}],
                                 "include_synonyms": True, "include_documentation": version >= 3})
    elif api is INCREMENTAL_ALTER_CONFIGS:
        # A share group's own configs (KIP-932), on any broker: validated only, set, refused
        # (a lock below group.share.min.record.lock.duration.ms), deleted; each read back.
        lock = "share.record.lock.duration.ms"

        def group_configs(ops, validate_only=False):
            return {"resources": [{"resource_type": RESOURCE_GROUP, "resource_name": group, "configs": [
                {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}], "validate_only": validate_only}

        def read_lock(w):
            answers.append(w.exchange(DESCRIBE_CONFIGS, 4, {"resources": [{
                "resource_type": RESOURCE_GROUP, "resource_name": group, "configuration_keys": [lock]}]})[1])

        with env.wire() as w:
            rt(api, version, w, group_configs([(lock, OP_SET, "12000")], validate_only=True))
            read_lock(w)
            rt(api, version, w, group_configs([(lock, OP_SET, "12000"), ("share.auto.offset.reset", OP_SET, "earliest")]))
            read_lock(w)
            rt(api, version, w, group_configs([(lock, OP_SET, "1")]))
            read_lock(w)
            rt(api, version, w, group_configs([(lock, OP_DELETE, None)]))
            read_lock(w)
    elif api is SHARE_GROUP_HEARTBEAT:
        with env.coordinator(group) as w:
            member = share_join(env, w, group, version, check=rt)
            rt(api, version, w, {"group_id": group, "member_id": member["member_id"], "member_epoch": -1})   # leave
    elif api is SHARE_GROUP_DESCRIBE:
        # A share group with one member, a classic group and one nobody created, in one request.
        with env.coordinator(group) as w:
            share_join(env, w, group)
            stable_member(env, w, f"{group}-classic")
            rt(api, version, w, {"group_ids": [group, f"{group}-classic", f"{group}-none"],
                                 "include_authorized_operations": True})
    elif api is SHARE_FETCH:
        with env.coordinator(group) as w:
            share_group_from_start(env, w, group)
            member = share_join(env, w, group)
        with env.wire() as w:   # the partitions' leader
            share_fetch_all(env, w, group, member, version, check=rt)
    elif api is SHARE_ACKNOWLEDGE:
        with env.coordinator(group) as w:
            share_group_from_start(env, w, group)
            member = share_join(env, w, group)
        with env.wire() as w:
            _, epoch = share_fetch_all(env, w, group, member)

            def acknowledge(epoch: int, batches: dict, renew: bool = False) -> dict:
                return rt(api, version, w, {
                    "group_id": group, "member_id": member["member_id"], "share_session_epoch": epoch,
                    "is_renew_ack": renew, "topics": [{"topic_id": tid, "partitions": [
                        {"partition_index": p, "acknowledgement_batches": b} for p, b in batches.items()]}]})
            # Partition 0 accepted, 1 released: delivered again by the next ShareFetch, 2 still held.
            acknowledge(epoch, {0: ack(0, 4, ACK_ACCEPT), 1: ack(0, 4, ACK_RELEASE)})
            rt(SHARE_FETCH, SHARE_FETCH.max_version, w,
               share_fetch_body(env, group, member, epoch + 1, partitions=False))
            epoch += 2
            if version >= 2:   # KIP-1222: partition 2's lock renewed, not settled
                acknowledge(epoch, {2: ack(0, 4, ACK_RENEW)}, renew=True)
                epoch += 1
            acknowledge(-1, {1: ack(0, 4, ACK_ACCEPT), 2: ack(0, 4, ACK_ACCEPT)})   # and close the session
            acknowledge(0, {})   # a ShareAcknowledge never opens a session
        with env.coordinator(group) as w:   # every record settled: no lag left
            rt(DESCRIBE_SHARE_GROUP_OFFSETS, DESCRIBE_SHARE_GROUP_OFFSETS.max_version, w,
               {"groups": [{"group_id": group, "topics": None}]})
    elif api is DESCRIBE_SHARE_GROUP_OFFSETS:
        with env.coordinator(group) as w:
            share_group_from_start(env, w, group)
            rt(api, version, w, {"groups": [{"group_id": group, "topics": None},   # null: every topic
                                            {"group_id": f"{group}-none", "topics": None}]})
            rt(api, version, w, {"groups": [{"group_id": group, "topics": [
                {"topic_name": topic, "partitions": [1]}]}]})
    elif api is ALTER_SHARE_GROUP_OFFSETS:
        with env.coordinator(group) as w:
            until_loaded(lambda b: rt(api, version, w, b), share_start_offsets_body(env, group, 0))   # creates the group
            member = share_join(env, w, group)
            rt(api, version, w, share_start_offsets_body(env, group, 2))   # NON_EMPTY_GROUP
            share_leave(w, group, member)
            rt(api, version, w, share_start_offsets_body(env, group, 3))
            rt(DESCRIBE_SHARE_GROUP_OFFSETS, DESCRIBE_SHARE_GROUP_OFFSETS.max_version, w,
               {"groups": [{"group_id": group, "topics": None}]})
    elif api is DELETE_SHARE_GROUP_OFFSETS:
        with env.coordinator(group) as w:
            share_group_from_start(env, w, group)
            member = share_join(env, w, group)
            rt(api, version, w, {"group_id": group, "topics": [{"topic_name": topic}]})   # NON_EMPTY_GROUP
            share_leave(w, group, member)
            rt(api, version, w, {"group_id": group, "topics": [{"topic_name": topic}, {"topic_name": f"{topic}-none"}]})
            rt(DESCRIBE_SHARE_GROUP_OFFSETS, DESCRIBE_SHARE_GROUP_OFFSETS.max_version, w,
               {"groups": [{"group_id": group, "topics": None}]})
    elif api is CREATE_TOPICS:
        # Validated only, created (2 partitions, one topic config), created again, and refused
        # (more replicas than the one broker): each answer per topic.
        name = f"{topic}-created-v{version}"

        def new(replicas=1, validate_only=False):
            return {"topics": [{"name": name, "num_partitions": 2, "replication_factor": replicas, "assignments": [],
                                "configs": [{"name": "retention.ms", "value": "3600000"}]}],
                    "timeout_ms": 30_000, "validate_only": validate_only}

        with env.wire() as w:
            rt(api, version, w, new(validate_only=True))
            rt(api, version, w, new())
            rt(api, version, w, new())
            rt(api, version, w, dict(new(replicas=3), topics=[dict(new(replicas=3)["topics"][0], name=f"{name}-rf3")]))
    else:
        raise AssertionError(f"no request written for {api.name}: add one to exercise()")
    return answers


def check_answers(env: Env, api, version: int, answers: list[dict]) -> None:
    """What each API's answer must say, beyond decoding: Kafka understood our request."""
    first = answers[0]
    if api is API_VERSIONS:
        assert first["error_code"] == 0 and len(first["api_keys"]) > 40
    elif api is METADATA:
        t = first["topics"][0]
        assert (t["error_code"], len(t["partitions"])) == (0, PARTITIONS)
        assert t["name"] == env.topic
        if version >= 10:
            assert t["topic_id"] == env.topic_id
        assert env.topic in {t["name"] for t in answers[1]["topics"]}
    elif api is FETCH:
        assert first["error_code"] == 0
        t = first["responses"][0]
        assert (t["topic_id"] if version >= 13 else t["topic"]) == (env.topic_id if version >= 13 else env.topic)
        by_partition = {p["partition_index"]: p for p in t["partitions"]}
        assert all(p["error_code"] == 0 and p["high_watermark"] == 5 for p in by_partition.values())
        assert by_partition[0]["records"] and len(by_partition[0]["records"]) > 0
    elif api is LIST_OFFSETS:
        parts = {p["partition_index"]: p for p in first["topics"][0]["partitions"]}
        assert all(p["error_code"] == 0 for p in parts.values()), parts
        assert (parts[0]["offset"], parts[1]["offset"]) == (0, 5)
    elif api is FIND_COORDINATOR:
        if version >= 4:
            assert first["coordinators"][0]["error_code"] == 0 and first["coordinators"][0]["port"] > 0
        else:
            assert first["error_code"] == 0 and first["port"] > 0
    elif api is JOIN_GROUP:
        assert answers[-1]["error_code"] == 0 and len(answers[-1]["members"]) == 1
        if version >= 4:
            assert any(a["error_code"] == Errors.MEMBER_ID_REQUIRED and a["member_id"] for a in answers)
    elif api is SYNC_GROUP:
        assert first["error_code"] == 0
    elif api is HEARTBEAT:
        assert [a["error_code"] for a in answers] == [Errors.NONE, Errors.ILLEGAL_GENERATION]
    elif api is LEAVE_GROUP:
        assert first["error_code"] == 0
        if version >= 3:
            assert first["members"][0]["error_code"] == 0
    elif api is OFFSET_COMMIT:
        parts = first["topics"][0]["partitions"]
        assert [p["error_code"] for p in parts] == [0] * PARTITIONS
    elif api is OFFSET_FETCH:
        if version >= 8:
            group = first["groups"][0]
            assert group["error_code"] == 0
            parts = {p["partition_index"]: p for p in group["topics"][0]["partitions"]}
        else:
            parts = {p["partition_index"]: p for p in first["topics"][0]["partitions"]}
        assert (parts[0]["committed_offset"], parts[0]["metadata"]) == (4, "meta")
        assert parts[1]["committed_offset"] == -1
    elif api in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
        # A PLAINTEXT listener has nothing to authenticate: Kafka answers ILLEGAL_SASL_STATE.
        assert first["error_code"] == Errors.ILLEGAL_SASL_STATE
    elif api is CONSUMER_GROUP_HEARTBEAT:
        joined = [a for a in answers if a["error_code"] not in COORDINATOR_LOADING]
        assert joined[0]["error_code"] == 0 and joined[0]["member_epoch"] >= 1, joined[0]
        assert answers[-1]["member_epoch"] == -1
    elif api is DESCRIBE_GROUPS:
        # Kafka answers in its own order: the asked group, and one nobody created ("-none").
        unknown, described = sorted(first["groups"], key=lambda g: not g["group_id"].endswith("-none"))
        assert (described["error_code"], described["group_state"], described["protocol_type"]) == \
            (0, "Stable", "consumer"), described
        assert len(described["members"]) == 1 and described["members"][0]["client_host"], described
        assert described["members"][0]["member_assignment"], described   # the ConsumerProtocol assignment
        assert unknown["group_state"] == "Dead" and unknown["members"] == [], unknown
    elif api is CONSUMER_GROUP_DESCRIBE:
        # Kafka answers in its own order: the KIP-848 group, the classic one, one nobody created.
        by_kind = {g["group_id"].rsplit("-", 1)[-1] if g["group_id"].endswith(("-classic", "-none")) else "kip848": g
                   for g in first["groups"]}
        described = by_kind["kip848"]
        assert (described["error_code"], described["error_message"], described["group_state"],
                described["assignor_name"]) == (0, None, "Stable", "uniform"), described
        assert described["group_epoch"] >= 1 and described["assignment_epoch"] == described["group_epoch"]
        assert described["authorized_operations"] not in (0, -2147483648), described   # asked for; no ACLs here
        (m,) = described["members"]
        assert (m["client_id"], m["client_host"], m["instance_id"], m["rack_id"]) == \
            (CLIENT_ID, "/127.0.0.1", None, None), m
        assert len(m["member_id"]) == 22 and m["member_epoch"] == described["group_epoch"], m
        assert m["subscribed_topic_names"] == [env.topic], m
        everything = [{"topic_id": env.topic_id, "topic_name": env.topic, "partitions": list(range(PARTITIONS))}]
        assert m["assignment"]["topic_partitions"] == m["target_assignment"]["topic_partitions"] == everything, m
        assert m["member_type"] == (1 if version >= 1 else -1), m   # v1: a consumer-protocol member
        # GROUP_ID_NOT_FOUND (69) for a classic group ("... is not a consumer group.") as for none at all.
        for gone in (by_kind["classic"], by_kind["none"]):
            assert (gone["error_code"], gone["group_state"], gone["members"]) == (69, "", []), gone
        assert "not a consumer group" in by_kind["classic"]["error_message"], by_kind["classic"]
    elif api is INIT_PRODUCER_ID:
        first = next(a for a in answers if a["error_code"] not in COORDINATOR_LOADING)
        assert first["error_code"] == 0 and first["producer_id"] >= 0, first
        if version >= 3:
            # Without a transactional id Kafka ignores the id and epoch sent and hands out a new id
            # at epoch 0: an idempotent producer bumps its epoch locally, as Java's does.
            assert (answers[-1]["error_code"], answers[-1]["producer_epoch"]) == (0, 0), answers[-1]
            assert answers[-1]["producer_id"] not in (-1, first["producer_id"]), answers[-1]
    elif api is PRODUCE:
        parts = [a["responses"][0]["partition_responses"][0] for a in answers]
        assert [(p["index"], p["error_code"]) for p in parts] == \
            [(0, 0), (0, 0), (0, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)], parts
        assert parts[0]["base_offset"] == parts[1]["base_offset"] == 0   # the duplicate: its first offset
        if version >= 13:
            assert all(a["responses"][0]["topic_id"] != ZERO_UUID for a in answers)
    elif api is OFFSET_FOR_LEADER_EPOCH:
        parts = first["topics"][0]["partitions"]
        assert [(p["error_code"], p["leader_epoch"], p["end_offset"]) for p in parts] == [(0, 0, 5)] * PARTITIONS
        assert answers[1]["topics"][0]["partitions"][0]["error_code"] == Errors.UNKNOWN_LEADER_EPOCH
    elif api is DESCRIBE_CONFIGS:
        (one,) = first["results"]
        assert (one["error_code"], one["resource_type"]) == (0, RESOURCE_GROUP), one
        (timeout,) = one["configs"]
        # The broker's group.consumer.session.timeout.ms (45 s unless the test run lowered it),
        # as a default (config_source 5, DEFAULT_CONFIG).
        assert timeout["name"] == "consumer.session.timeout.ms" and int(timeout["value"]) > 0, timeout
        assert (timeout["config_source"], timeout["read_only"], timeout["is_sensitive"]) == (5, False, False), timeout
        every = {c["name"]: c for c in answers[1]["results"][0]["configs"]}
        assert every["consumer.session.timeout.ms"]["value"] == timeout["value"]
        assert "consumer.heartbeat.interval.ms" in every
        if version >= 3:
            assert every["consumer.session.timeout.ms"]["documentation"], every["consumer.session.timeout.ms"]

    elif api is INCREMENTAL_ALTER_CONFIGS:
        validated, after_validate, changed, after_change, refused, after_refusal, deleted, after_delete = answers
        lock_of = lambda a: (a["results"][0]["configs"][0]["value"], a["results"][0]["configs"][0]["config_source"])
        for a in (validated, changed, deleted):
            assert a["responses"] == [{"error_code": 0, "error_message": None, "resource_type": RESOURCE_GROUP,
                                       "resource_name": a["responses"][0]["resource_name"]}], a
        # The broker's default (source 5) until set; the group's own (source 8, GROUP_CONFIG) after.
        assert lock_of(after_validate) == ("30000", 5), after_validate
        assert lock_of(after_change) == ("12000", 8), after_change
        (r,) = refused["responses"]
        assert r["error_code"] == Errors.INVALID_CONFIG and "share.record.lock.duration.ms" in r["error_message"], r
        assert lock_of(after_refusal) == ("12000", 8), after_refusal
        assert lock_of(after_delete) == ("30000", 5), after_delete
    elif api is CREATE_TOPICS:
        validated, created, again, refused = ([a["topics"][0] for a in answers])
        for t in (validated, created):
            assert (t["error_code"], t["error_message"]) == (0, None), t
        if version >= 5:   # KIP-525: what the topic got, its configs included
            assert (created["num_partitions"], created["replication_factor"]) == (2, 1), created
            configs = {c["name"]: c["value"] for c in created["configs"]}
            assert configs["retention.ms"] == "3600000", created
        if version >= 7:
            assert created["topic_id"] != ZERO_UUID, created
        assert again["error_code"] == Errors.TOPIC_ALREADY_EXISTS, again
        assert refused["error_code"] == Errors.INVALID_REPLICATION_FACTOR and refused["error_message"], refused
    elif api is SHARE_GROUP_HEARTBEAT:
        joined = [a for a in answers if a["error_code"] not in COORDINATOR_LOADING]
        first = joined[0]
        assert first["error_code"] == 0 and first["member_epoch"] >= 1 and first["heartbeat_interval_ms"] > 0, first
        uuid.UUID(first["member_id"])   # the id the member chose, echoed
        assert all(a["member_id"] == first["member_id"] for a in joined), joined
        assert joined[-2]["assignment"]["topic_partitions"] == \
            [{"topic_id": env.topic_id, "partitions": list(range(PARTITIONS))}], joined[-2]
        assert (joined[-1]["error_code"], joined[-1]["member_epoch"]) == (0, -1), joined[-1]
    elif api is SHARE_GROUP_DESCRIBE:
        share, classic, none = sorted(first["groups"], key=lambda g: (g["group_id"].endswith("-classic"),
                                                                      g["group_id"].endswith("-none")))
        assert (share["error_code"], share["error_message"], share["group_state"], share["assignor_name"]) == \
            (0, None, "Stable", "simple"), share
        assert share["group_epoch"] >= 1 and share["assignment_epoch"] == share["group_epoch"], share
        assert share["authorized_operations"] not in (0, -2147483648), share   # asked for; no ACLs here
        (m,) = share["members"]
        uuid.UUID(m["member_id"])
        assert (m["client_id"], m["client_host"], m["rack_id"], m["member_epoch"]) == \
            (CLIENT_ID, "/127.0.0.1", None, share["group_epoch"]), m
        assert m["subscribed_topic_names"] == [env.topic], m
        assert m["assignment"]["topic_partitions"] == \
            [{"topic_id": env.topic_id, "topic_name": env.topic, "partitions": list(range(PARTITIONS))}], m
        for other in (classic, none):   # not a share group, or none at all: GROUP_ID_NOT_FOUND
            assert (other["error_code"], other["group_state"], other["members"]) == (69, "", []), other
    elif api is SHARE_FETCH:
        # The session's first request (epoch 0) already acquires; by the end this member holds
        # every record, each delivered once, and the record sets decode to what was produced.
        assert acquired(first), first
        held: dict[int, list] = {}
        for a in answers:
            assert a["error_code"] == 0 and a["acquisition_lock_timeout_ms"] > 0, a
            for t in a["responses"]:
                assert t["topic_id"] == env.topic_id, t
                for p in t["partitions"]:
                    assert (p["error_code"], p["acknowledge_error_code"]) == (0, 0), p
                    if not p["acquired_records"]:
                        continue
                    assert all(r["delivery_count"] == 1 for r in p["acquired_records"]), p
                    mine = {o for r in p["acquired_records"] for o in range(r["first_offset"], r["last_offset"] + 1)}
                    records, _ = decode_record_set(p["records"], topic=env.topic, partition=p["partition_index"],
                                                   fetch_offset=min(mine))
                    held.setdefault(p["partition_index"], []).extend(
                        (r.offset, r.key, r.value, list(r.headers)) for r in records if r.offset in mine)
        assert held == {p: [(i, b"k%d" % i, b"v%d-%d" % (p, i), [("h", b"x")]) for i in range(5)]
                        for p in range(PARTITIONS)}, held
    elif api is SHARE_ACKNOWLEDGE:
        # answers: accept 0 + release 1, the ShareFetch after it, (v2) renew 2, close, epoch 0, lag
        again, no_session, offsets = answers[1], answers[-2], answers[-1]
        acks = [answers[0]] + answers[2:-2]
        for a in acks:   # every acknowledgement taken, partition by partition
            assert a["error_code"] == 0 and a["responses"], a
            assert all(p["error_code"] == 0 for t in a["responses"] for p in t["partitions"]), a
        if version >= 2:
            assert acks[1]["acquisition_lock_timeout_ms"] > 0, acks[1]   # the renewed lock's time
        assert acquired(again) == {1: [(0, 4, 2)]}, again   # released, so delivered again
        assert no_session["error_code"] == Errors.INVALID_SHARE_SESSION_EPOCH, no_session
        lag = [(p["partition_index"], p["start_offset"], p["lag"])
               for t in offsets["groups"][0]["topics"] for p in t["partitions"]]
        assert sorted(lag) == [(p, 0, 0) for p in range(PARTITIONS)], offsets
    elif api is DESCRIBE_SHARE_GROUP_OFFSETS:
        mine, none = sorted(first["groups"], key=lambda g: g["group_id"].endswith("-none"))
        assert (mine["error_code"], mine["error_message"]) == (0, None), mine
        (t,) = mine["topics"]
        assert (t["topic_name"], t["topic_id"]) == (env.topic, env.topic_id), t
        lag = 5 if version >= 1 else -1   # v1 (KIP-1226): the records not yet settled
        assert sorted((p["partition_index"], p["start_offset"], p["leader_epoch"], p["lag"], p["error_code"])
                      for p in t["partitions"]) == [(p, 0, 0, lag, 0) for p in range(PARTITIONS)], t
        assert (none["error_code"], none["topics"]) == (0, []), none   # a group nobody created has no offsets
        (t,) = answers[1]["groups"][0]["topics"]
        assert [p["partition_index"] for p in t["partitions"]] == [1], t
    elif api is ALTER_SHARE_GROUP_OFFSETS:
        created, refused, moved, described = answers[-4:]   # before them: answers while loading
        for a in (created, moved):
            (t,) = a["responses"]
            assert (a["error_code"], t["topic_name"], t["topic_id"]) == (0, env.topic, env.topic_id), a
            assert [(p["partition_index"], p["error_code"]) for p in t["partitions"]] == \
                [(p, 0) for p in range(PARTITIONS)], a
        assert (refused["error_code"], refused["responses"]) == (Errors.NON_EMPTY_GROUP, []), refused
        (t,) = described["groups"][0]["topics"]
        assert sorted((p["partition_index"], p["start_offset"], p["lag"]) for p in t["partitions"]) == \
            [(p, 3, 2) for p in range(PARTITIONS)], t
    elif api is DELETE_SHARE_GROUP_OFFSETS:
        refused, deleted, described = answers
        assert (refused["error_code"], refused["responses"]) == (Errors.NON_EMPTY_GROUP, []), refused
        assert deleted["error_code"] == 0, deleted
        assert [(t["topic_name"], t["topic_id"], t["error_code"]) for t in deleted["responses"]] == \
            [(env.topic, env.topic_id, 0), (f"{env.topic}-none", ZERO_UUID, Errors.UNKNOWN_TOPIC_OR_PARTITION)], deleted
        assert described["groups"][0]["topics"] == [], described


# -- the tests -----------------------------------------------------------------------------------

def test_kafka_api_versions_decode_at_every_version(env, kafka):
    """Kafka's ApiVersions answer, at each version both sides know, decodes and re-encodes
    exactly, and every version lists the same ranges (the layout changes, not the content)."""
    hi = offered(kafka, API_VERSIONS)[1]
    ranges = {}
    for version in range(API_VERSIONS.min_version, min(API_VERSIONS.max_version, hi) + 1):
        with env.wire() as w:
            body = round_trip(API_VERSIONS, version, w, {"client_software_name": "kdaemon-tests",
                                                         "client_software_version": "1.0"})
        assert body["error_code"] == 0
        ranges[version] = {e["api_key"]: (e["min_version"], e["max_version"]) for e in body["api_keys"]}
        if version >= 3:
            # Kafka 4 is KRaft: finalized features (metadata.version ...) come in tagged fields.
            assert body["finalized_features_epoch"] >= 0
            assert "metadata.version" in {f["name"] for f in body["finalized_features"]}
    assert all(r == ranges[0] for r in ranges.values())
    assert ranges[0] == kafka.offered
    print(f"\nKafka offers ApiVersions v0-v{hi}; decoded v0-v{max(ranges)}; "
          f"{len(ranges[0])} APIs listed")


@pytest.mark.parametrize("api, version", all_versions())
def test_every_offered_version_round_trips(env, kafka, api, version):
    rng = offered(kafka, api)
    assert rng is not None, f"Kafka 4 does not offer {api.name} at all"
    if not rng[0] <= version <= rng[1]:
        # Ours, not Kafka's any more: it must really refuse it, and we must have said so.
        assert version in REMOVED_IN_KAFKA_4.get(api.name, ()), (
            f"{api.name} v{version} is outside Kafka's v{rng[0]}-v{rng[1]} and not in REMOVED_IN_KAFKA_4")
        with pytest.raises(ConnectionError):
            exercise(env, api, version)
        return
    answers = exercise(env, api, version)
    assert answers, f"{api.name} v{version}: nothing was exchanged"
    check_answers(env, api, version, answers)


def test_kafka_offers_the_share_apis_as_declared(kafka):
    """Share groups (KIP-932) are on in Kafka 4.4 as the tests start it (the share.version
    feature is finalized at format time), and it offers exactly the versions our specs declare:
    v0 of the first four was 4.0's early access, removed in 4.1."""
    share = (SHARE_GROUP_HEARTBEAT, SHARE_GROUP_DESCRIBE, SHARE_FETCH, SHARE_ACKNOWLEDGE,
             DESCRIBE_SHARE_GROUP_OFFSETS, ALTER_SHARE_GROUP_OFFSETS, DELETE_SHARE_GROUP_OFFSETS)
    assert {api.key: offered(kafka, api) for api in share} == \
        {api.key: (api.min_version, api.max_version) for api in share}
    with Wire(kafka.host, kafka.port) as w:
        body = w.exchange(API_VERSIONS, API_VERSIONS.max_version, {"client_software_name": "kdaemon-tests",
                                                                  "client_software_version": "1.0"})[1]
    features = {f["name"]: f["max_version_level"] for f in body["finalized_features"]}
    assert features.get("share.version", 0) >= 1, features


def test_removed_versions_are_exactly_the_documented_ones(kafka):
    """KIP-896: which of our versions Kafka 4 no longer offers, API by API.  Below Kafka's
    floor we keep layouts only for older brokers; above its ceiling we implement nothing."""
    removed, table = {}, []
    for api in OFFERED_APIS:
        lo, hi = offered(kafka, api)
        gone = list(range(api.min_version, min(lo, api.max_version + 1)))
        if gone:
            removed[api.name] = gone
        assert api.max_version <= hi, f"{api.name}: we implement v{api.max_version}, Kafka only v{hi}"
        table.append(f"{api.name:24} ours v{api.min_version}-v{api.max_version}  Kafka v{lo}-v{hi}"
                     f"  chosen v{choose_version(api, kafka.offered)}")
    print("\n" + "\n".join(table))
    assert removed == REMOVED_IN_KAFKA_4


def test_telemetry_apis_only_with_a_telemetry_plugin(kafka):
    assert {api.name: offered(kafka, api) for api in NEEDS_TELEMETRY_PLUGIN} == \
        {api.name: None for api in NEEDS_TELEMETRY_PLUGIN}


def test_negotiated_versions_lie_in_kafkas_range(kafka):
    for api in OFFERED_APIS:
        lo, hi = offered(kafka, api)
        chosen = choose_version(api, kafka.offered)
        assert lo <= chosen <= hi, f"{api.name}: chose v{chosen}, Kafka offers v{lo}-v{hi}"
        assert chosen == min(api.max_version, hi)


class Recorder:
    """A ``NetworkClient`` observer: every request and response of one consumer."""

    def __init__(self) -> None:
        self.requests: list[tuple[int, object, int, dict]] = []
        self.responses: list[tuple[int, object, int, dict]] = []

    def __call__(self, node_id, api, version, body, response) -> None:
        (self.responses if response else self.requests).append((node_id, api, version, body))

    def sent(self) -> dict[str, set[int]]:
        out: dict[str, set[int]] = defaultdict(set)
        for _, api, version, _ in self.requests:
            out[api.name].add(version)
        return dict(out)


def observed_consumer(kafka, recorder: Recorder, **options) -> Consumer:
    c = Consumer(kafka.bootstrap, client_id=CLIENT_ID, **options)
    c._network.observers.append(recorder)   # the public seam; Consumer has no option for it
    return c


def poll_until(consumer: Consumer, done, timeout: float = 60.0, what: str = "") -> dict:
    got: dict = defaultdict(list)
    deadline = time.monotonic() + timeout
    while not done(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or done}: got "
                                 f"{ {tp: len(r) for tp, r in got.items()} }")
        for tp, records in consumer.poll(200).items():
            got[tp] += records
    return got


def test_the_consumer_never_sends_a_version_kafka_4_removed(env, kafka):
    """KIP-896 from the client's side: assign + poll, offsets_for_times, a group subscription
    with commits, and close, every request recorded on the way out."""
    rec = Recorder()
    tps = [TopicPartition(env.topic, p) for p in range(PARTITIONS)]
    c = observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    try:
        c.assign(tps)
        poll_until(c, lambda got: sum(map(len, got.values())) >= 5 * PARTITIONS, what="all records")
        found = c.offsets_for_times({tp: 0 for tp in tps})
        assert {tp: o.offset for tp, o in found.items()} == {tp: 0 for tp in tps}
        assert c.end_offsets(tps) == {tp: 5 for tp in tps}
    finally:
        c.close()
    group = f"kip896-{uuid.uuid4().hex[:8]}"
    g = observed_consumer(kafka, rec, group_id=group, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                          enable_auto_commit=False, heartbeat_interval_ms=300, session_timeout_ms=6000)
    try:
        g.subscribe([env.topic])
        poll_until(g, lambda got: sum(map(len, got.values())) >= 5 * PARTITIONS, what="the group's records")
        g.commit()
        assert {tp: om.offset for tp, om in g.committed(tps).items()} == {tp: 5 for tp in tps}
        deadline = time.monotonic() + 30
        while "Heartbeat" not in rec.sent() and time.monotonic() < deadline:
            g.poll(200)
    finally:
        g.close()
    sent = rec.sent()
    print("\nsent by the consumer: " + ", ".join(f"{name} v{sorted(v)}" for name, v in sorted(sent.items())))
    expected = {"ApiVersions", "Metadata", "Fetch", "ListOffsets", "FindCoordinator", "JoinGroup",
                "SyncGroup", "Heartbeat", "OffsetCommit", "OffsetFetch", "LeaveGroup"}
    assert expected <= set(sent), f"never sent: {expected - set(sent)}"
    by_name = {api.name: api for api in ALL_APIS}
    for name, versions in sent.items():
        lo, hi = offered(kafka, by_name[name])
        assert all(lo <= v <= hi for v in versions), f"{name}: sent v{sorted(versions)}, Kafka offers v{lo}-v{hi}"


def test_fetch_uses_topic_ids_and_answers_are_matched_by_id(kafka):
    """Fetch v13+ names topics by id only, in both directions.  Two topics with distinct
    records: every Fetch carries Kafka's ids (never a zero UUID, never a name on the wire), every
    answer carries ids only, and each record comes back under its own topic."""
    assert offered(kafka, FETCH)[1] >= 13
    topics = [f"by-id-{i}-{uuid.uuid4().hex[:8]}" for i in range(2)]
    for t in topics:
        create_topic(kafka.bootstrap, t, 2)
        for p in range(2):
            produce(kafka.bootstrap, t, [(None, f"{t}/{p}/{i}".encode()) for i in range(4)], partition=p)
    with Wire(kafka.host, kafka.port) as w:
        md = w.exchange(METADATA, 12, {"topics": [{"name": t} for t in topics]})[1]
    ids = {t["name"]: t["topic_id"] for t in md["topics"]}
    assert len(set(ids.values())) == 2 and ZERO_UUID not in ids.values()

    rec = Recorder()
    c = observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    try:
        c.assign([TopicPartition(t, p) for t in topics for p in range(2)])
        got = poll_until(c, lambda got: sum(map(len, got.values())) >= 16, what="16 records")
    finally:
        c.close()
    for tp, records in got.items():
        assert [r.value.decode() for r in records] == [f"{tp.topic}/{tp.partition}/{i}" for i in range(4)]

    fetches = [(v, b) for _, api, v, b in rec.requests if api is FETCH]
    with_partitions = [(v, b) for v, b in fetches if b["topics"]]
    assert with_partitions, "no Fetch carried partitions"
    for version, body in fetches:
        assert version >= 13, f"Fetch v{version} names topics; Kafka offers v13+"
        frame = messages.encode_request(FETCH, version, 0, CLIENT_ID, body)
        for t in topics:
            assert t.encode() not in frame, f"topic name {t} on the wire in Fetch v{version}"
        for topic in body["topics"]:
            assert topic["topic_id"] in ids.values(), topic["topic_id"]
        for topic in body["forgotten_topics_data"]:
            assert topic["topic_id"] in ids.values()
    answered = [b for _, api, v, b in rec.responses if api is FETCH and b["responses"]]
    assert answered
    for body in answered:
        for topic in body["responses"]:
            assert topic["topic"] == "" and topic["topic_id"] in ids.values()
    print(f"\n{len(fetches)} Fetch requests at v{sorted({v for v, _ in fetches})}, all by topic id; "
          f"{len(answered)} answers with data, matched by id")
