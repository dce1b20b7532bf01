"""Our codec against Apache Kafka 4.x, byte for byte, and the versions our client really sends.

Three things are shown here against the reference broker (the session ``kafka`` fixture):

* **Every version of every API we implement that Kafka offers round-trips.**  For each API in
  ``kdaemon/protocol/apis`` and each version in the intersection of our range and Kafka's, a real
  request built with our codec goes to Kafka; its answer must decode strictly (no trailing
  bytes) and re-encode to exactly the bytes Kafka sent (``encode_response(decode(frame)) ==
  frame``).  Group APIs get a real group (join, sync, commit ...); where Kafka answers with an
  error (SASL on a PLAINTEXT listener) the error response is round-tripped just the same.
  Versions we implement and Kafka 4 no longer offers (KIP-896) are sent too: Kafka must refuse
  them (it closes the connection), so the table of removed versions below is a fact, not a
  belief.
* **KIP-896**: the version our negotiation picks lies inside Kafka's range for every API, and the
  real ``Consumer`` (assign + poll, offsets_for_times, a group with commits, close) never sends a
  version Kafka 4 removed.  Every request is observed through ``NetworkClient.observers``.
* **Fetch by topic id** (v13+): the consumer's Fetch requests carry Kafka's topic ids and no
  names, and Kafka's answers, which carry ids only, reach the right topic.
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
                                   SYNC_GROUP, PRODUCE, INIT_PRODUCER_ID, DESCRIBE_CONFIGS)
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


def all_versions():
    """(api, version) for every version we implement; Kafka's range is checked in the test."""
    return [pytest.param(api, v, id=f"{api.name}-v{v}")
            for api in ALL_APIS for v in range(api.min_version, api.max_version + 1)]


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


def test_removed_versions_are_exactly_the_documented_ones(kafka):
    """KIP-896: which of our versions Kafka 4 no longer offers, API by API.  Below Kafka's
    floor we keep layouts only for older brokers; above its ceiling we implement nothing."""
    removed, table = {}, []
    for api in ALL_APIS:
        lo, hi = offered(kafka, api)
        gone = list(range(api.min_version, min(lo, api.max_version + 1)))
        if gone:
            removed[api.name] = gone
        assert api.max_version <= hi, f"{api.name}: we implement v{api.max_version}, Kafka only v{hi}"
        table.append(f"{api.name:24} ours v{api.min_version}-v{api.max_version}  Kafka v{lo}-v{hi}"
                     f"  chosen v{choose_version(api, kafka.offered)}")
    print("\n" + "\n".join(table))
    assert removed == REMOVED_IN_KAFKA_4


def test_negotiated_versions_lie_in_kafkas_range(kafka):
    for api in ALL_APIS:
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
