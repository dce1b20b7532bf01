"""``supervisor/siblings.py``: which workers a group change pokes, and when (no broker: the
effect on a real group is tests/kafka/test_daemon_consumer_protocol_kafka.py)."""

from __future__ import annotations

from kdaemon.supervisor import siblings
from kdaemon.supervisor.heartbeat import WorkerHeartbeat


def test_news_pokes_the_others_at_once_and_everyone_again_after_the_assignment_interval(monkeypatch):
    sent = []
    monkeypatch.setattr(siblings.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    pokes = siblings.Pokes(lambda: [10, 11, 12])
    pokes.news(100.0, exclude=11)
    assert sent == [(10, siblings.SIBLING_SIGNAL), (12, siblings.SIBLING_SIGNAL)]
    sent.clear()
    pokes.tick(100.0 + siblings.AGAIN_AFTER_S - 0.01)
    assert sent == []
    pokes.tick(100.0 + siblings.AGAIN_AFTER_S)
    assert [pid for pid, _ in sent] == [10, 11, 12]   # by then the newcomer may have news waiting too
    sent.clear()
    pokes.tick(200.0)
    assert sent == []                                  # once per change


def test_a_worker_already_gone_is_skipped(monkeypatch):
    def kill(pid, sig):
        if pid == 10:
            raise ProcessLookupError
        sent.append(pid)
    sent = []
    monkeypatch.setattr(siblings.os, "kill", kill)
    siblings.poke([10, 11])
    assert sent == [11]


def test_the_generation_rides_the_heartbeat_only_when_it_changed():
    beat = WorkerHeartbeat(True, 2, 0, 0, epoch=7)
    assert WorkerHeartbeat.decode(beat.encode().rstrip(b"\n")).epoch == 7
    assert b"epoch" not in WorkerHeartbeat(True, 2, 0, 0).encode()
    assert WorkerHeartbeat.decode(WorkerHeartbeat(True, 2, 0, 0).encode().rstrip(b"\n")).epoch is None
