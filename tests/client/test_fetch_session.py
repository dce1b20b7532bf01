"""Fetch sessions (KIP-227): the pure ``FetchSessionHandler`` and the Fetcher's use of it.

Neither broker the suite runs grants sessions (librdkafka's mock cluster and Tansu both answer
every Fetch with session id 0; see test_faults_mock_cluster.py), so the session path is tested
here without sockets: first the handler alone, then the Fetcher against a scripted network that
records each request body and answers it the way a session-capable broker would.
"""

from __future__ import annotations

import threading
import uuid

import pytest

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.errors import ConnectionFailedError
from kdaemon.client.fetch_session import (FINAL_EPOCH, INITIAL_EPOCH, INVALID_SESSION_ID,
                                          FetchSessionHandler, PartitionFetch)
from kdaemon.client.fetcher import Fetcher
from kdaemon.client.future import Future
from kdaemon.client.metadata import ClusterMetadata
from kdaemon.client.subscription import SubscriptionState
from kdaemon.client.types import TopicPartition
from kdaemon.protocol.apis import FETCH
from kdaemon.protocol.builder import RecordSpec, build_batch
from kdaemon.protocol.errors import Errors
from kdaemon.protocol.primitives import ZERO_UUID

ID_A = uuid.UUID(int=0xA)
ID_B = uuid.UUID(int=0xB)
ID_A2 = uuid.UUID(int=0xA2)
A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def pf(offset: int, topic_id: uuid.UUID = ID_A, *, max_bytes: int = 1024, leader_epoch: int = 0) -> PartitionFetch:
    return PartitionFetch(topic_id, offset, -1, max_bytes, leader_epoch, -1)


def opened(session_id: int = 42, wanted=None) -> tuple[FetchSessionHandler, dict]:
    """A handler whose full request the broker answered with ``session_id``."""
    wanted = wanted or {A0: pf(0), A1: pf(0), B0: pf(0, ID_B)}
    h = FetchSessionHandler(node_id=1)
    req = h.build(wanted, uses_topic_ids=True)
    assert h.handle_response(req, 0, session_id)
    return h, wanted


# -- the handler alone ---------------------------------------------------------------------------

def test_first_request_is_full_and_opens_a_session():
    h = FetchSessionHandler(node_id=1)
    wanted = {A0: pf(5), B0: pf(7, ID_B)}
    req = h.build(wanted, uses_topic_ids=True)
    assert (req.session_id, req.epoch, req.full) == (INVALID_SESSION_ID, INITIAL_EPOCH, True)
    assert req.to_send == wanted and req.to_forget == []
    assert req.session_partitions == wanted

    assert h.handle_response(req, 0, 42)
    assert (h.session_id, h.epoch) == (42, 1)
    assert h.partitions == wanted


def test_unchanged_partitions_are_not_resent_and_the_epoch_advances():
    h, wanted = opened()
    for expected_epoch in (1, 2, 3):
        req = h.build(dict(wanted), uses_topic_ids=True)
        assert (req.session_id, req.epoch, req.full) == (42, expected_epoch, False)
        assert req.to_send == {} and req.to_forget == []
        assert req.session_partitions == wanted  # responses are still matched against all
        assert h.handle_response(req, 0, 42)
    assert h.epoch == 4


def test_only_changed_and_new_partitions_are_sent():
    h, wanted = opened()
    nxt = dict(wanted)
    nxt[A0] = pf(10)                      # moved on
    nxt[B0] = pf(0, ID_B, max_bytes=2048)  # another limit
    nxt[TopicPartition("a", 2)] = pf(0)    # new
    req = h.build(nxt, uses_topic_ids=True)
    assert not req.full
    assert req.to_send == {A0: pf(10), B0: pf(0, ID_B, max_bytes=2048), TopicPartition("a", 2): pf(0)}
    assert req.to_forget == []
    assert h.handle_response(req, 0, 42)
    assert h.partitions == nxt


def test_partitions_no_longer_wanted_are_forgotten_by_their_session_topic_id():
    h, wanted = opened()
    nxt = {A0: wanted[A0]}
    req = h.build(nxt, uses_topic_ids=True)
    assert req.to_send == {}
    assert sorted(req.to_forget) == [A1, B0]
    assert req.forgotten_topic_ids == {A1: ID_A, B0: ID_B}
    assert h.handle_response(req, 0, 42)
    assert h.partitions == nxt


def test_recreated_topic_replaces_the_partition():
    """A new topic id for the same name: forget the old partition (by the old id) and add the new."""
    h, wanted = opened()
    nxt = dict(wanted)
    nxt[A0] = pf(0, ID_A2)
    req = h.build(nxt, uses_topic_ids=True)
    assert req.to_send == {A0: pf(0, ID_A2)}
    assert req.to_forget == [A0]
    assert req.forgotten_topic_ids == {A0: ID_A}


def test_without_topic_ids_a_changed_id_is_an_update_not_a_replacement():
    """By name, forgetting and adding the same partition in one request would drop it."""
    h = FetchSessionHandler(node_id=1)
    wanted = {A0: pf(0), A1: pf(0)}
    req = h.build(wanted, uses_topic_ids=False)
    assert h.handle_response(req, 0, 42)
    req = h.build({A0: pf(0, ID_A2), A1: pf(0)}, uses_topic_ids=False)
    assert req.to_send == {A0: pf(0, ID_A2)}
    assert req.to_forget == []


@pytest.mark.parametrize("code", [Errors.FETCH_SESSION_ID_NOT_FOUND, Errors.INVALID_FETCH_SESSION_EPOCH,
                                  Errors.FETCH_SESSION_TOPIC_ID_ERROR, Errors.NOT_LEADER_OR_FOLLOWER])
def test_a_top_level_error_resets_to_a_full_request(code):
    h, wanted = opened()
    req = h.build(wanted, uses_topic_ids=True)
    assert not req.full
    assert h.handle_response(req, code, 0) is False
    req = h.build(wanted, uses_topic_ids=True)
    assert (req.session_id, req.epoch, req.full) == (INVALID_SESSION_ID, INITIAL_EPOCH, True)
    assert req.to_send == wanted


def test_a_failed_request_resets_to_a_full_request():
    h, wanted = opened()
    h.build(wanted, uses_topic_ids=True)
    h.handle_error()
    req = h.build(wanted, uses_topic_ids=True)
    assert req.full and req.to_send == wanted and req.session_id == INVALID_SESSION_ID


def test_an_unexpected_session_id_resets():
    h, wanted = opened()
    req = h.build(wanted, uses_topic_ids=True)
    assert h.handle_response(req, 0, 43) is False
    assert h.build(wanted, uses_topic_ids=True).full


def test_a_broker_without_sessions_gets_full_requests_every_time():
    h = FetchSessionHandler(node_id=1)
    wanted = {A0: pf(0)}
    for _ in range(3):
        req = h.build(wanted, uses_topic_ids=True)
        assert req.full and (req.session_id, req.epoch) == (INVALID_SESSION_ID, INITIAL_EPOCH)
        assert h.handle_response(req, 0, INVALID_SESSION_ID)  # the data is still good


def test_switching_between_names_and_ids_starts_over():
    h, wanted = opened()
    req = h.build(wanted, uses_topic_ids=False)
    assert req.full and req.to_send == wanted


def test_epoch_wraps_to_one_not_to_zero_or_negative():
    h, wanted = opened()
    h.epoch = 0x7FFFFFFF
    req = h.build(wanted, uses_topic_ids=True)
    assert req.epoch == 0x7FFFFFFF
    assert h.handle_response(req, 0, 42)
    assert h.epoch == 1
    assert h.epoch not in (INITIAL_EPOCH, FINAL_EPOCH)


# -- the Fetcher with sessions, over a scripted network ------------------------------------------

class ScriptedNetwork:
    """What the Fetcher needs from NetworkClient; every send is kept for the test to answer."""

    def __init__(self, fetch_version: int = 13) -> None:
        self.fetch_version = fetch_version
        self.sent: list[tuple[int, dict, Future]] = []
        self.lock = threading.RLock()

    def ready(self, node_id: int) -> bool:
        return True

    def connection_failed(self, node_id: int) -> bool:
        return False

    def api_version(self, node_id: int, api, max_version: int | None = None) -> int:
        return self.fetch_version if max_version is None else min(self.fetch_version, max_version)

    def send(self, node_id: int, api, body: dict, **kw) -> Future:
        assert api is FETCH
        fut = Future()
        self.sent.append((node_id, body, fut))
        return fut

    def answer(self, body: dict) -> dict:
        """Complete the oldest unanswered request with ``body``; return that request's body."""
        for _, request, fut in self.sent:
            if not fut.done:
                fut.success((self.fetch_version, body))
                return request
        raise AssertionError("no request in flight")

    def fail(self) -> None:
        for _, _, fut in self.sent:
            if not fut.done:
                fut.failure(ConnectionFailedError("scripted disconnect"))
                return
        raise AssertionError("no request in flight")


def _metadata(topic_ids: dict[str, uuid.UUID]) -> ClusterMetadata:
    md = ClusterMetadata()
    md.set_wanted(set(topic_ids))
    md.handle_response(_metadata_body(topic_ids), 0.0)
    return md


def _metadata_body(topic_ids: dict[str, uuid.UUID]) -> dict:
    return {
        "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": 1, "rack": None}],
        "cluster_id": "c", "controller_id": 1,
        "topics": [{"name": name, "error_code": 0, "topic_id": tid, "is_internal": False,
                    "partitions": [{"error_code": 0, "partition_index": p, "leader_id": 1, "leader_epoch": 0,
                                    "replica_nodes": [1], "isr_nodes": [1], "offline_replicas": []}
                                   for p in (0, 1)]}
                   for name, tid in topic_ids.items()],
    }


def _partition(p: int, records: bytes | None = b"", hw: int = 0, error: int = 0) -> dict:
    return {"partition_index": p, "error_code": error, "high_watermark": hw, "last_stable_offset": hw,
            "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1,
            "records": records}


def _response(topic_id: uuid.UUID, partitions: list[dict], session_id: int, error: int = 0) -> dict:
    return {"throttle_time_ms": 0, "error_code": error, "session_id": session_id,
            "responses": [{"topic_id": topic_id, "topic": "", "partitions": partitions}] if partitions else []}


def _batch(base: int, n: int) -> bytes:
    return build_batch([RecordSpec(value=b"v%d" % (base + i)) for i in range(n)], base_offset=base)


def _requested(body: dict) -> dict[int, int]:
    return {p["partition"]: p["fetch_offset"] for t in body["topics"] for p in t["partitions"]}


def _forgotten(body: dict) -> list[tuple[uuid.UUID, list[int]]]:
    return [(t["topic_id"], sorted(t["partitions"])) for t in body["forgotten_topics_data"]]


@pytest.fixture
def fetcher():
    config = ConsumerConfig(fetch_max_wait_ms=0)
    network = ScriptedNetwork()
    md = _metadata({"a": ID_A})
    subs = SubscriptionState("earliest")
    subs.assign([A0, A1])
    subs.seek(A0, 0)
    subs.seek(A1, 0)
    f = Fetcher(config, network, md, subs)
    return f, network, md, subs


def _drain(f: Fetcher) -> dict[TopicPartition, list[int]]:
    return {tp: [r.offset for r in rs] for tp, rs in f.fetched_records().items()}


def test_fetcher_goes_incremental_after_the_first_full_fetch(fetcher):
    f, net, md, subs = fetcher
    assert f.send_fetches() == 1
    full = net.answer(_response(ID_A, [_partition(0, _batch(0, 3), hw=3), _partition(1, hw=0)], session_id=7))
    assert (full["session_id"], full["session_epoch"]) == (0, 0)
    assert _requested(full) == {0: 0, 1: 0}
    assert full["topics"][0]["topic_id"] == ID_A
    assert _drain(f) == {A0: [0, 1, 2]}

    # Only a-0 moved: an incremental request with just a-0, the session's epoch 1.
    f.send_fetches()
    inc = net.answer(_response(ID_A, [_partition(0, _batch(3, 2), hw=5)], session_id=7))
    assert (inc["session_id"], inc["session_epoch"]) == (7, 1)
    assert _requested(inc) == {0: 3}
    assert inc["forgotten_topics_data"] == []
    assert _drain(f) == {A0: [3, 4]}

    # The broker answered only for a-0; a-1 stays in the session without being resent.
    f.send_fetches()
    inc = net.answer(_response(ID_A, [], session_id=7))
    assert (inc["session_id"], inc["session_epoch"]) == (7, 2)
    assert _requested(inc) == {0: 5}
    assert f.last_request_body is inc
    assert _drain(f) == {}
    f.send_fetches()
    inc = net.answer(_response(ID_A, [], session_id=7))
    assert (inc["session_id"], inc["session_epoch"]) == (7, 3)
    assert _requested(inc) == {}
    assert subs.state(A0).position == 5 and subs.state(A1).position == 0


@pytest.mark.parametrize("code", [Errors.FETCH_SESSION_ID_NOT_FOUND, Errors.INVALID_FETCH_SESSION_EPOCH])
def test_fetcher_sends_a_full_request_after_a_session_error(fetcher, code):
    f, net, md, subs = fetcher
    f.send_fetches()
    net.answer(_response(ID_A, [_partition(0, hw=0), _partition(1, hw=0)], session_id=7))
    assert _drain(f) == {}
    f.send_fetches()
    inc = net.answer(_response(ID_A, [], session_id=0, error=code))
    assert inc["session_id"] == 7
    assert f.stats.errors == 1
    f.send_fetches()
    full = net.answer(_response(ID_A, [_partition(0, hw=0), _partition(1, hw=0)], session_id=8))
    assert _drain(f) == {}
    assert (full["session_id"], full["session_epoch"]) == (0, 0)
    assert _requested(full) == {0: 0, 1: 0}
    f.send_fetches()
    inc = net.answer(_response(ID_A, [], session_id=8))
    assert (inc["session_id"], inc["session_epoch"]) == (8, 1)


def test_fetcher_sends_a_full_request_after_a_failed_request(fetcher):
    f, net, md, subs = fetcher
    f.send_fetches()
    net.answer(_response(ID_A, [_partition(0, hw=0), _partition(1, hw=0)], session_id=7))
    assert _drain(f) == {}
    f.send_fetches()
    net.fail()
    f.send_fetches()
    full = net.sent[-1][1]
    assert (full["session_id"], full["session_epoch"]) == (0, 0)
    assert _requested(full) == {0: 0, 1: 0}


def test_fetcher_forgets_unassigned_partitions_by_topic_id(fetcher):
    f, net, md, subs = fetcher
    f.send_fetches()
    net.answer(_response(ID_A, [_partition(0, hw=0), _partition(1, hw=0)], session_id=7))
    assert _drain(f) == {}
    subs.assign([A0])
    md.set_wanted({"a"})
    f.send_fetches()
    inc = net.answer(_response(ID_A, [], session_id=7))
    assert (inc["session_id"], inc["session_epoch"]) == (7, 1)
    assert _requested(inc) == {}
    assert _forgotten(inc) == [(ID_A, [1])]


def test_fetcher_replaces_partitions_of_a_recreated_topic(fetcher):
    f, net, md, subs = fetcher
    f.send_fetches()
    net.answer(_response(ID_A, [_partition(0, hw=0), _partition(1, hw=0)], session_id=7))
    assert _drain(f) == {}
    md.handle_response(_metadata_body({"a": ID_A2}), 1.0)
    f.send_fetches()
    inc = net.answer(_response(ID_A2, [], session_id=7))
    assert (inc["session_id"], inc["session_epoch"]) == (7, 1)
    assert [t["topic_id"] for t in inc["topics"]] == [ID_A2]
    assert _requested(inc) == {0: 0, 1: 0}
    # Forgotten by the id the broker's session holds, or the broker drops what was just added.
    assert _forgotten(inc) == [(ID_A, [0, 1])]


def test_fetcher_by_name_below_v13_keeps_sessions_too():
    config = ConsumerConfig(fetch_max_wait_ms=0)
    net = ScriptedNetwork(fetch_version=12)
    md = _metadata({"a": ZERO_UUID})
    subs = SubscriptionState("earliest")
    subs.assign([A0, A1])
    subs.seek(A0, 0)
    subs.seek(A1, 0)
    f = Fetcher(config, net, md, subs)
    f.send_fetches()
    full = net.answer({"throttle_time_ms": 0, "error_code": 0, "session_id": 9,
                       "responses": [{"topic": "a", "partitions": [_partition(0, _batch(0, 2), hw=2),
                                                                   _partition(1, hw=0)]}]})
    assert full["topics"][0]["topic"] == "a"
    assert _drain(f) == {A0: [0, 1]}
    subs.assign([A0])
    f.send_fetches()
    inc = net.answer({"throttle_time_ms": 0, "error_code": 0, "session_id": 9, "responses": []})
    assert (inc["session_id"], inc["session_epoch"]) == (9, 1)
    assert _requested(inc) == {0: 2}
    assert [(t["topic"], t["partitions"]) for t in inc["forgotten_topics_data"]] == [("a", [1])]


class _ArrivesMeanwhile:
    """A buffered answer whose size is read just as the heartbeat thread's network poll
    completes another fetch: reading ``size`` appends to the fetcher's queue, as that thread
    would between two steps of the application thread's look at it."""

    def __init__(self, f: Fetcher, cf) -> None:
        self._f, self._cf = f, cf
        self.tp, self.consumed, self.initialized = cf.tp, False, False

    @property
    def size(self) -> int:
        self._f.completed.append(self._cf)
        return self._cf.size

    def end_offset(self):
        return self._cf.end_offset()


def test_a_fetch_completed_by_another_thread_while_the_buffer_is_measured_is_kept(fetcher):
    f, net, md, subs = fetcher
    f.send_fetches()
    net.answer(_response(ID_A, [_partition(0, _batch(0, 3), hw=3), _partition(1, _batch(0, 2), hw=2)],
                         session_id=7))
    first, second = list(f.completed)
    f.completed.clear()
    f.completed.append(_ArrivesMeanwhile(f, second))
    # Measuring the buffer (for fetch-ahead) while an answer arrives neither fails nor loses it.
    f.send_fetches()
    assert second in f.completed
