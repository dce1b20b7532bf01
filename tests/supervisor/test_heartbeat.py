"""The worker heartbeat message: what the child writes is what the supervisor reads."""

from __future__ import annotations

import logging

import pytest

from kdaemon.supervisor.heartbeat import HeartbeatReader, WorkerHeartbeat


def test_round_trip_with_and_without_the_assignment():
    plain = WorkerHeartbeat(True, 4, 17, 1000)
    assigned = WorkerHeartbeat(True, 2, 0, 5, generation=7, partitions=("t-0", "t-1"))
    unknown_generation = WorkerHeartbeat(True, 1, 0, 0, generation=None, partitions=("t-3",))
    member = WorkerHeartbeat(True, 2, 0, 5, generation=3, partitions=("t-0",), member_id="AbCdEfGhIjKlMnOpQrStUv")
    # A KIP-848 member's id before it joined: no assignment yet, the id alone.
    joining = WorkerHeartbeat(False, 0, 0, 0, member_id="AbCdEfGhIjKlMnOpQrStUv", group_protocol="consumer")
    stalled = WorkerHeartbeat(True, 4, 900, 1000, sink_down_s=125.5)   # its sink down for 2 minutes
    for beat in (plain, assigned, unknown_generation, member, joining, stalled):
        line = beat.encode()
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert WorkerHeartbeat.decode(line[:-1]) == beat
    assert b"partitions" not in plain.encode()   # only the beat that turns ready carries them
    assert b"member_id" not in plain.encode()
    assert b"sink_down_s" not in plain.encode()
    assert b"partitions" not in joining.encode() and b'"group_protocol": "consumer"' in joining.encode()


def test_reader_joins_split_lines_and_reports_bad_ones(caplog):
    reader = HeartbeatReader("worker 1 (pid 42)")
    a, b = WorkerHeartbeat(False, 0, 0, 0), WorkerHeartbeat(True, 3, 9, 12, generation=2, partitions=("t-0",))
    data = a.encode() + b"{not json}\n" + b'{"ready": true}\n' + b.encode()
    with caplog.at_level(logging.WARNING, logger="kdaemon.supervisor"):
        got = reader.feed(data[:7]) + reader.feed(data[7:-5]) + reader.feed(data[-5:])
    assert got == [a, b]   # a bad line is no heartbeat (it does not count as liveness) ...
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and all("worker 1 (pid 42) sent a heartbeat that does not parse" in w
                                      for w in warnings), warnings   # ... and never passes silently
    assert "'assigned'" in warnings[1], warnings


@pytest.mark.parametrize("line", [b"[1, 2]", b'{"ready": true, "assigned": "x", "lag": 0, "delivered": 0}'])
def test_decode_refuses_what_is_not_a_heartbeat(line):
    with pytest.raises(ValueError):
        WorkerHeartbeat.decode(line)


def test_a_share_members_figures_round_trip():
    """A share-group member has no positions: its records' figures ride the beat instead."""
    from kdaemon.supervisor.heartbeat import ShareFigures
    beat = WorkerHeartbeat(True, 2, 0, 40, member_id="m", group_protocol="share",
                           share=ShareFigures(acquired=50, accepted=40, released=6, rejected=2, in_flight=2))
    line = beat.encode()
    assert b'"share": {"acquired": 50' in line and b'"held"' not in line
    assert WorkerHeartbeat.decode(line[:-1]) == beat
    assert b'"share"' not in WorkerHeartbeat(True, 2, 0, 40).encode()
