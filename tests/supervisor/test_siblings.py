"""``supervisor/siblings.py``: which workers a group change pokes, and when; the worker's side of
the poke (its signal handler, ``Worker.group_news``).  No broker: the effect on a real group is
tests/supervisor/test_spread_kafka.py, the time it saves bench/groups/spread.py."""

from __future__ import annotations

import os
import signal

import pytest

from kdaemon.supervisor import siblings
from kdaemon.supervisor.heartbeat import WorkerHeartbeat


def _pokes(targets):
    sent = []
    pokes = siblings.Pokes(lambda: list(targets), kill=lambda pid, sig: sent.append((pid, sig)))
    return pokes, sent


def _times_of_poking_all(pokes, sent, start, end, step=0.01):
    """The moments (to 10 ms) ``tick`` poked every target, ticking from ``start`` to ``end``."""
    out = []
    for i in range(round((end - start) / step) + 1):
        now = start + i * step
        before = len(sent)
        pokes.tick(now)
        if len(sent) > before:
            out.append(round(now, 2))
    return out


def test_news_pokes_the_others_at_once_then_everyone_through_the_assignment_interval():
    pokes, sent = _pokes([10, 11, 12])
    assert pokes.due_in(100.0) is None
    pokes.news(11)
    assert pokes.due_in(100.0) == 0.0
    pokes.tick(100.0)
    assert sent == [(10, siblings.SIBLING_SIGNAL), (12, siblings.SIBLING_SIGNAL)]   # not the reporter
    sent.clear()
    assert pokes.due_in(100.0) == pytest.approx(siblings.FOLLOW_EVERY_S)
    pokes.tick(100.0 + siblings.FOLLOW_EVERY_S - 0.01)
    assert sent == []
    pokes.tick(100.0 + siblings.FOLLOW_EVERY_S)
    assert [pid for pid, _ in sent] == [10, 11, 12]   # by then the reporter may have news waiting too
    sent.clear()
    times = _times_of_poking_all(pokes, sent, 100.26, 103.0)
    assert times == [100.5, 100.75, 101.0, 100.0 + siblings.AGAIN_AFTER_S]   # the last exactly at the end
    assert len(sent) == 3 * len(times)
    assert pokes.due_in(200.0) is None   # nothing more for this change


def test_a_target_computed_anywhere_in_the_window_is_found_within_a_follow_up():
    """The coordinator's next target comes at most an assignment interval (1 s) after the news;
    whenever it comes, a poke follows within ``FOLLOW_EVERY_S``."""
    pokes, sent = _pokes([10])
    pokes.news(None)
    pokes.tick(0.0)
    times = [0.0] + _times_of_poking_all(pokes, sent, 0.01, 5.0)
    for computed in [i / 100 for i in range(0, 101)]:
        after = [t for t in times if t >= computed]
        assert after and after[0] - computed <= siblings.FOLLOW_EVERY_S + 1e-9, computed


def test_news_from_two_workers_or_from_an_exit_pokes_everyone_once():
    pokes, sent = _pokes([10, 11, 12])
    pokes.news(10)
    pokes.news(11)
    pokes.news(11)
    pokes.tick(5.0)
    assert [pid for pid, _ in sent] == [10, 11, 12]
    sent.clear()
    pokes.news(None)   # a worker exited: what it held is free
    pokes.tick(100.0)
    assert [pid for pid, _ in sent] == [10, 11, 12]


def test_a_burst_of_news_is_followed_through_the_interval_after_its_last():
    """The coordinator computes a target at most every assignment interval: the one after the
    first join of a burst may leave out the later ones, which a poke after the last finds."""
    pokes, sent = _pokes([10])
    times = []
    for t in (0.0, 0.5, 1.0):
        pokes.news(None)
        pokes.tick(t)
        times.append(t)
        times += _times_of_poking_all(pokes, sent, t + 0.01, t + 0.49)
    times += _times_of_poking_all(pokes, sent, 1.5, 10.0)
    assert times[-1] == pytest.approx(1.0 + siblings.AGAIN_AFTER_S)
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert max(gaps) <= siblings.FOLLOW_EVERY_S + 1e-9
    assert len(sent) == len(times)


def test_a_worker_already_gone_is_skipped():
    def kill(pid, sig):
        if pid == 10:
            raise ProcessLookupError
        sent.append(pid)
    sent = []
    pokes = siblings.Pokes(lambda: [10, 11], kill=kill)
    pokes.news(None)
    pokes.tick(0.0)
    assert sent == [11] and pokes.sent == 1


def test_the_generation_rides_the_heartbeat_only_when_it_changed():
    beat = WorkerHeartbeat(True, 2, 0, 0, epoch=7)
    assert WorkerHeartbeat.decode(beat.encode().rstrip(b"\n")).epoch == 7
    assert b"epoch" not in WorkerHeartbeat(True, 2, 0, 0).encode()
    assert WorkerHeartbeat.decode(WorkerHeartbeat(True, 2, 0, 0).encode().rstrip(b"\n")).epoch is None


class _Consumer:
    def __init__(self) -> None:
        self.asked = 0

    def heartbeat_soon(self) -> None:
        self.asked += 1

    def wakeup(self) -> None:
        pass


def test_a_poked_worker_asks_its_consumer_to_heartbeat_and_a_stopping_one_does_not():
    """The worker's handler of SIBLING_SIGNAL (child.run_child installs ``group_news``)."""
    from kdaemon.config import parse
    from kdaemon.worker.build import PipelineParts
    from kdaemon.worker.pipeline import Worker
    config = parse({"kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g"},
                    "daemon": {"topics": ["t"]}, "sink": {"type": "null"}})
    consumer = _Consumer()
    worker = Worker(config, PipelineParts(None, None, None, [], None, None), consumer, lambda c, w: None)
    previous = signal.signal(siblings.SIBLING_SIGNAL, lambda *_: worker.group_news())
    try:
        os.kill(os.getpid(), siblings.SIBLING_SIGNAL)
        assert consumer.asked == 1
        worker.request_stop()
        os.kill(os.getpid(), siblings.SIBLING_SIGNAL)
        assert consumer.asked == 1
    finally:
        signal.signal(siblings.SIBLING_SIGNAL, previous)
