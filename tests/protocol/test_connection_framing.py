"""``KafkaConnection.receive_data``: responses split into frames however the socket delivers the
bytes (one byte at a time, many frames in one read, a large frame in many reads), matched to
the requests in flight by correlation id, and a bad frame size refused."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kdaemon.protocol.apis import API_VERSIONS, METADATA
from kdaemon.protocol.connection import KafkaConnection
from kdaemon.protocol.errors import CorrelationMismatchError, FrameTooLargeError
from kdaemon.protocol.messages import encode_response


def _metadata_body(topics: int, pad: int = 0) -> dict:
    return {"throttle_time_ms": 0, "brokers": [{"node_id": 1, "host": "h" * 40, "port": 9092, "rack": None}],
            "cluster_id": "c", "controller_id": 1,
            "topics": [{"error_code": 0, "name": f"topic-{i:05d}" + "x" * pad, "topic_id": None, "is_internal": False,
                        "partitions": [], "topic_authorized_operations": -2147483648} for i in range(topics)]}


def _exchange(sizes: list[int], pad: int = 0):
    """A connection with one Metadata v9 request in flight per entry of ``sizes``, and the
    answers' bytes (each with that many topics, names ``pad`` characters longer), in order."""
    conn = KafkaConnection()
    frames = []
    for n in sizes:
        conn.send(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False}, context=n)
        cid = conn._in_flight[-1].correlation_id
        frames.append(encode_response(METADATA, 9, cid, _metadata_body(n, pad)))
    return conn, b"".join(frames)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 2000), min_size=1, max_size=5), data=st.data())
def test_frames_come_out_whole_and_in_order_however_the_bytes_are_cut(sizes, data):
    conn, stream = _exchange(sizes)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    got = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)]):
        got += conn.receive_data(stream[a:b])
    assert [r.context for r in got] == sizes
    assert [len(r.body["topics"]) for r in got] == sizes
    assert conn.in_flight == 0


def test_a_large_frame_in_socket_sized_reads():
    conn, stream = _exchange([25_000, 3], pad=180)   # ~5 MB, then a small one in the same reads
    assert len(stream) > 4 << 20
    got = []
    for i in range(0, len(stream), 256 * 1024):
        got += conn.receive_data(stream[i:i + 256 * 1024])
    assert [r.context for r in got] == [25_000, 3]
    assert got[0].body["topics"][-1]["name"] == "topic-24999" + "x" * 180


def test_one_byte_at_a_time():
    conn, stream = _exchange([2, 0, 1])
    got = []
    for i in range(len(stream)):
        got += conn.receive_data(stream[i:i + 1])
    assert [r.context for r in got] == [2, 0, 1]


@pytest.mark.parametrize("size", [0, 3, 2**31 - 1])
def test_a_frame_size_outside_the_limits_is_refused(size):
    conn, _ = _exchange([1])
    with pytest.raises(FrameTooLargeError, match=f"response frame size {size} is outside"):
        conn.receive_data(size.to_bytes(4, "big") + b"\0" * 8)


def test_an_answer_to_nothing_in_flight_is_refused():
    conn = KafkaConnection()
    with pytest.raises(CorrelationMismatchError, match="nothing in flight"):
        conn.receive_data(encode_response(API_VERSIONS, 0, 5, {"error_code": 0, "api_keys": []}))
