"""Fetch sessions (KIP-227) as Apache Kafka grants them, and every way they end.

The suite's other brokers never grant a session (Tansu and librdkafka's mock cluster answer
session id 0; see tests/client/test_fetch_session.py), so this is where the incremental path
meets a real session cache.  The module runs its own single-node Kafka, because it needs a
small session cache and kills and restarts the node.

How Kafka 4.4 caches sessions decides what can be shown, so here it is (server module,
``FetchSessionCacheShard``): ``max.incremental.fetch.session.cache.slots`` is divided among 8
shards (integer division: **1 slot means no session at all**, ever — every Fetch is answered with
session id 0), new sessions go to the shards round robin, and a consumer's session can only evict
another consumer's once that one is 120 s old (``MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS``) —
too long for a test.  A *follower's* (privileged) session evicts a consumer's at once.  So the
cache here has 8 slots, one per shard, and the eviction is done by a competing fetcher that
fetches as a follower would (``replica_id`` set, as a replica broker's fetcher does): the real
cache then evicts our consumer's session by its own rules.

Every request and response of the consumer under test is observed through
``NetworkClient.observers`` (see tests/protocol/test_protocol_kafka.py), so the session ids and
epochs below are the ones that went over the wire.
"""

from __future__ import annotations

import time
import uuid

import pytest

from kdaemon.client.fetch_session import FINAL_EPOCH, INITIAL_EPOCH, INVALID_SESSION_ID
from kdaemon.client.types import TopicPartition
from kdaemon.protocol import messages
from kdaemon.protocol.apis import FETCH
from kdaemon.protocol.errors import Errors
from tests.protocol.test_protocol_kafka import CLIENT_ID, Recorder, Wire, observed_consumer
from testkit.apache_kafka import start_or_fail
from testkit.produce import create_topic, produce

pytestmark = pytest.mark.kafka

SHARDS = 8                        # Kafka's NumFetchSessionCacheShards
SESSION_ID_RANGE = (2**31 - 1) // SHARDS
FOLLOWER_ID = 1000                # a replica id no node has: the competing "follower"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One Kafka node, one fetch-session slot per shard (see the module docstring)."""
    c = start_or_fail(tmp_path_factory, "kafka-sessions",
                      extra_properties={"max.incremental.fetch.session.cache.slots": str(SHARDS)})
    yield c
    c.stop()


@pytest.fixture
def kafka(cluster):
    """The module's cluster under the name the suite's log hook attaches on failure."""
    return cluster


# -- helpers -------------------------------------------------------------------------------------

def new_topic(kafka, partitions: int, per_partition: int = 0, prefix: str = "sessions") -> str:
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, partitions)
    if per_partition:
        produce_range(kafka, topic, range(partitions), 0, per_partition)
    return topic


def produce_range(kafka, topic: str, partitions, start: int, end: int) -> None:
    for p in partitions:
        produce(kafka.bootstrap, topic, [(None, f"{p}/{i}".encode()) for i in range(start, end)],
                partition=p)


def fetches(rec: Recorder, response: bool = False) -> list[dict]:
    """Bodies of the Fetch requests (or responses) the consumer exchanged with node 1, in order."""
    seen = rec.responses if response else rec.requests
    return [body for node, api, _, body in seen if api is FETCH and node == 1]


def fetch_version(rec: Recorder) -> int:
    return next(v for node, api, v, _ in rec.requests if api is FETCH)


def consume(consumer, got: dict, until, timeout: float = 90.0, what: str = "") -> None:
    """Poll into ``got`` ({tp: [values]}) until ``until(got)``; fail with what arrived."""
    deadline = time.monotonic() + timeout
    while not until(got):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: "
                                 f"{ {str(tp): len(v) for tp, v in got.items()} }")
        for tp, records in consumer.poll(100).items():
            got.setdefault(tp, []).extend(r.value.decode() for r in records)


def total(got: dict) -> int:
    return sum(map(len, got.values()))


def assert_exactly_once_in_order(got: dict, topic: str, partitions: int, count: int) -> None:
    for p in range(partitions):
        values = got.get(TopicPartition(topic, p), [])
        assert values == [f"{p}/{i}" for i in range(count)], (
            f"partition {p}: {len(values)} records, {len(set(values))} distinct, "
            f"first out of order at {next((i for i, v in enumerate(values) if v != f'{p}/{i}'), None)}")


def session_epochs(requests: list[dict], session_id: int) -> list[int]:
    return [b["session_epoch"] for b in requests if b["session_id"] == session_id]


def in_session(rec: Recorder, n: int = 2):
    """A condition: the consumer has sent ``n`` incremental requests in its current session."""
    def check(_got=None) -> bool:
        reqs = fetches(rec)
        if not reqs or reqs[-1]["session_id"] == INVALID_SESSION_ID:
            return False
        return len(session_epochs(reqs, reqs[-1]["session_id"])) >= n
    return check


def wire_fetch(kafka, body: dict, version: int = FETCH.max_version) -> dict:
    with Wire(kafka.host, kafka.port) as w:
        return w.exchange(FETCH, version, dict({"max_wait_ms": 0, "min_bytes": 1}, **body))[1]


class Follower:
    """A competing fetcher that fetches as a follower replica would (``replica_id`` set), with
    no partitions.  Its full requests open *privileged* sessions, which Kafka's cache lets evict
    a consumer's session at once; ``close()`` closes them again (epoch -1)."""

    def __init__(self, kafka) -> None:
        self.kafka = kafka
        self.sessions: list[int] = []

    def fill_every_shard(self) -> None:
        for _ in range(SHARDS):
            body = wire_fetch(self.kafka, {"replica_state": {"replica_id": FOLLOWER_ID, "replica_epoch": -1},
                                           "session_id": INVALID_SESSION_ID, "session_epoch": INITIAL_EPOCH})
            assert body["error_code"] == 0 and body["session_id"] != INVALID_SESSION_ID, body
            self.sessions.append(body["session_id"])
        assert {s // SESSION_ID_RANGE for s in self.sessions} == set(range(SHARDS)), self.sessions

    def close(self) -> None:
        for sid in self.sessions:
            body = wire_fetch(self.kafka, {"replica_state": {"replica_id": FOLLOWER_ID, "replica_epoch": -1},
                                           "session_id": sid, "session_epoch": FINAL_EPOCH})
            assert (body["error_code"], body["session_id"]) == (0, INVALID_SESSION_ID), body
        self.sessions = []


# -- the tests -----------------------------------------------------------------------------------

def test_incremental_requests_after_the_full_one_and_their_size(kafka):
    """1,000 partitions: one full request opens the session (id 0, epoch 0); Kafka grants an
    id; every later request is incremental with epochs 1, 2, 3, ...; once nothing changes,
    a request carries no partitions at all.  Sizes are whole request frames."""
    partitions = 1000
    topic = new_topic(kafka, partitions, prefix="wide")
    with_data = range(0, partitions, 100)   # 10 partitions with records, 990 idle
    produce_range(kafka, topic, with_data, 0, 20)
    rec = Recorder()
    c = observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100)
    got: dict = {}
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        for tp in tps:   # every position known at once: the first request lists all 1,000
            c.seek(tp, 0)
        consume(c, got, lambda g: total(g) >= 20 * len(with_data), what="200 records")
        steady = lambda _g: sum(1 for b in fetches(rec)[-3:] if not b["topics"]) == 3  # noqa: E731
        consume(c, got, steady, what="three incremental requests with nothing changed")
    finally:
        c.close()
    assert {tp.partition for tp in got} == set(with_data)
    assert all(got[TopicPartition(topic, p)] == [f"{p}/{i}" for i in range(20)] for p in with_data)

    requests, responses = fetches(rec), fetches(rec, response=True)
    full = requests[0]
    assert (full["session_id"], full["session_epoch"]) == (INVALID_SESSION_ID, INITIAL_EPOCH)
    assert sum(len(t["partitions"]) for t in full["topics"]) == partitions
    session_id = responses[0]["session_id"]
    assert responses[0]["error_code"] == 0 and session_id != INVALID_SESSION_ID, "Kafka granted no session"
    assert all((r["error_code"], r["session_id"]) == (0, session_id) for r in responses[1:-1])
    epochs = session_epochs(requests, session_id)
    assert epochs[:-1] == list(range(1, len(epochs))), epochs      # 1, 2, 3, ... then close
    assert epochs[-1] == FINAL_EPOCH
    # An incremental request names only partitions whose fetch position moved.
    assert all(sum(len(t["partitions"]) for t in b["topics"]) <= len(with_data) for b in requests[1:])

    version = fetch_version(rec)
    idle = next(b for b in reversed(requests) if not b["topics"] and b["session_epoch"] > 0)
    full_bytes = len(messages.encode_request(FETCH, version, 0, CLIENT_ID, full))
    idle_bytes = len(messages.encode_request(FETCH, version, 0, CLIENT_ID, idle))
    print(f"\nFetch v{version}, {partitions} partitions, session {session_id}: full request "
          f"{full_bytes} bytes, steady-state incremental (epoch {idle['session_epoch']}) {idle_bytes} bytes; "
          f"epochs sent in the session: 0 (full, no id), then {epochs}")
    assert idle_bytes * 100 < full_bytes


def test_close_ends_the_session_on_the_broker(kafka):
    """close() sends the session's id with epoch -1 and no partitions (Java's
    FetchSessionHandler.notifyClose); Kafka answers sessionless and forgets the session.
    Proof from the broker's side: a probe of the closed session's id is FETCH_SESSION_ID_NOT_FOUND,
    while the same probe of a session still open is accepted (or refused for its epoch only)."""
    topic = new_topic(kafka, 2, 5)
    tps = [TopicPartition(topic, p) for p in range(2)]
    recs = {name: Recorder() for name in "ab"}
    consumers = {name: observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100)
                 for name, rec in recs.items()}
    try:
        for name, c in consumers.items():
            c.assign(tps)
            consume(c, {}, in_session(recs[name], 3), what=f"consumer {name} in a session")
        consumers["a"].close()
        requests, responses = fetches(recs["a"]), fetches(recs["a"], response=True)
        session_a = requests[-2]["session_id"]
        close = requests[-1]
        assert (close["session_id"], close["session_epoch"]) == (session_a, FINAL_EPOCH)
        assert close["topics"] == [] and close["forgotten_topics_data"] == []
        assert (responses[-1]["error_code"], responses[-1]["session_id"]) == (0, INVALID_SESSION_ID)

        version = fetch_version(recs["a"])
        b_requests = fetches(recs["b"])
        session_b, epoch_b = b_requests[-1]["session_id"], b_requests[-1]["session_epoch"]
        probe_b = wire_fetch(kafka, {"session_id": session_b, "session_epoch": epoch_b + 1}, version)
        probe_a = wire_fetch(kafka, {"session_id": session_a, "session_epoch": requests[-2]["session_epoch"] + 1},
                             version)
        print(f"\nclosed session {session_a}: probe -> error {probe_a['error_code']}; "
              f"open session {session_b}: probe -> error {probe_b['error_code']}")
        assert probe_b["error_code"] in (Errors.NONE, Errors.INVALID_FETCH_SESSION_EPOCH)
        assert probe_a["error_code"] == Errors.FETCH_SESSION_ID_NOT_FOUND
    finally:
        for c in consumers.values():
            c.close()


def test_an_evicted_session_falls_back_to_a_full_fetch_with_nothing_lost(kafka):
    """A follower's sessions take every slot: Kafka evicts our consumer's session, the next
    incremental request gets FETCH_SESSION_ID_NOT_FOUND, the consumer goes back to full requests
    (sessionless while the cache is full of privileged sessions), and once the slots are free
    again it opens a new session.  Records produced in each phase arrive once, in order."""
    parts, step = 3, 100
    topic = new_topic(kafka, parts, step)
    rec, follower = Recorder(), Follower(kafka)
    c = observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100, max_poll_records=50)
    got: dict = {}
    try:
        c.assign([TopicPartition(topic, p) for p in range(parts)])
        consume(c, got, lambda g: total(g) >= step and in_session(rec, 2)(), what="a session")
        first_session = fetches(rec)[-1]["session_id"]

        follower.fill_every_shard()                       # evicts the consumer's session
        produce_range(kafka, topic, range(parts), step, 2 * step)
        responses = lambda: fetches(rec, response=True)   # noqa: E731
        consume(c, got, lambda g: any(r["error_code"] == Errors.FETCH_SESSION_ID_NOT_FOUND for r in responses()),
                what="FETCH_SESSION_ID_NOT_FOUND")
        evicted_at = next(i for i, r in enumerate(responses()) if r["error_code"] == Errors.FETCH_SESSION_ID_NOT_FOUND)
        consume(c, got, lambda g: len(fetches(rec)) > evicted_at + 3, what="requests after the eviction")
        after = fetches(rec)[evicted_at + 1:]
        assert all((b["session_id"], b["session_epoch"]) == (INVALID_SESSION_ID, INITIAL_EPOCH) for b in after), \
            "after the eviction every request must be full while no slot is free"
        assert all(r["session_id"] == INVALID_SESSION_ID for r in responses()[evicted_at + 1:]), \
            "Kafka granted a session with every slot held by a follower"

        follower.close()                                  # the slots are free again
        produce_range(kafka, topic, range(parts), 2 * step, 3 * step)
        consume(c, got, lambda g: total(g) >= 3 * step * parts and in_session(rec, 2)(),
                what="every record and a new session")
        second_session = fetches(rec)[-1]["session_id"]
    finally:
        follower.close()
        c.close()
    print(f"\nsession {first_session} evicted (FETCH_SESSION_ID_NOT_FOUND), full requests meanwhile, "
          f"then session {second_session}; {total(got)} records")
    assert second_session != first_session
    assert_exactly_once_in_order(got, topic, parts, 3 * step)


def test_a_session_used_by_another_fetcher_gives_invalid_epoch_and_a_full_fetch(kafka):
    """Another fetcher uses our session id at the epoch Kafka expects next: Kafka accepts it and
    moves the epoch on, so our next request is INVALID_FETCH_SESSION_EPOCH; we go back to a full
    request and a new session, and nothing is lost or repeated."""
    parts, step = 2, 100
    topic = new_topic(kafka, parts, step)
    rec = Recorder()
    c = observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100, max_poll_records=50)
    got: dict = {}
    try:
        c.assign([TopicPartition(topic, p) for p in range(parts)])
        consume(c, got, lambda g: in_session(rec, 2)(), what="a session")
        version = fetch_version(rec)
        responses = lambda: fetches(rec, response=True)   # noqa: E731
        invalid = lambda: any(r["error_code"] == Errors.INVALID_FETCH_SESSION_EPOCH for r in responses())  # noqa: E731
        deadline = time.monotonic() + 60
        while not invalid():
            # Between polls our last request (epoch e) is on its way or answered: Kafka expects
            # e + 1 next.  If ours arrives first the intruder is the one refused: try again.
            last = fetches(rec)[-1]
            if last["session_id"] != INVALID_SESSION_ID:
                wire_fetch(kafka, {"session_id": last["session_id"], "session_epoch": last["session_epoch"] + 1},
                           version)
            assert time.monotonic() < deadline, "the intruder never got in before us"
            consume(c, got, lambda g, n=len(responses()): len(responses()) > n + 1 or invalid(),
                    what="two more answers")
        produce_range(kafka, topic, range(parts), step, 2 * step)
        consume(c, got, lambda g: total(g) >= 2 * step * parts and in_session(rec, 2)(),
                what="every record and a new session")
    finally:
        c.close()
    requests = fetches(rec)
    refused = next(i for i, r in enumerate(responses()) if r["error_code"] == Errors.INVALID_FETCH_SESSION_EPOCH)
    print(f"\nsession {requests[refused]['session_id']} epoch {requests[refused]['session_epoch']}: "
          f"INVALID_FETCH_SESSION_EPOCH; then a full request and session {requests[-1]['session_id']}; "
          f"{total(got)} records")
    assert (requests[refused + 1]["session_id"], requests[refused + 1]["session_epoch"]) == \
        (INVALID_SESSION_ID, INITIAL_EPOCH)
    assert requests[-1]["session_id"] not in (INVALID_SESSION_ID, requests[refused]["session_id"])
    assert_exactly_once_in_order(got, topic, parts, 2 * step)


def test_a_broker_restart_mid_consumption_loses_and_repeats_nothing(kafka):
    """SIGKILL the node halfway through the records, keep polling while it is down, start it
    again and produce more: the consumer reconnects, opens a new session with a full request, and
    every record produced before and after arrives exactly once, in order."""
    parts, step = 3, 200
    topic = new_topic(kafka, parts, step)
    rec = Recorder()
    c = observed_consumer(kafka, rec, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                          max_poll_records=50, reconnect_backoff_max_ms=500)
    got: dict = {}
    try:
        c.assign([TopicPartition(topic, p) for p in range(parts)])
        consume(c, got, lambda g: total(g) >= step and in_session(rec, 2)(), what="half the records")
        before = fetches(rec)[-1]["session_id"]
        sent_before = len(fetches(rec))
        kafka.nodes[1].kill()
        down_until = time.monotonic() + 3
        while time.monotonic() < down_until:   # the consumer notices the broker is gone
            c.poll(100)
        kafka.restart(1)
        produce_range(kafka, topic, range(parts), step, 2 * step)
        consume(c, got, lambda g: total(g) >= 2 * step * parts and in_session(rec, 2)(),
                what="every record and a session after the restart")
    finally:
        c.close()
    after = fetches(rec)[sent_before:]
    full = [b for b in after if (b["session_id"], b["session_epoch"]) == (INVALID_SESSION_ID, INITIAL_EPOCH)]
    assert full, "no full request after the restart"
    new_session = fetches(rec)[-1]["session_id"]   # the close request names it
    print(f"\nsession {before} before the restart, {new_session} after; {total(got)} records")
    assert new_session not in (INVALID_SESSION_ID, before)
    assert_exactly_once_in_order(got, topic, parts, 2 * step)
