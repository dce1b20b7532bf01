"""The pure heartbeat timer (kdaemon/client/group/heartbeat.py): every deadline checked by
passing ``now``, no clock, no sockets."""

from __future__ import annotations

from kdaemon.client.group.heartbeat import HeartbeatTimer


def timer(now: float = 100.0, session_ms: int = 10_000, interval_ms: int = 3_000,
          max_poll_ms: int = 300_000) -> HeartbeatTimer:
    return HeartbeatTimer(session_timeout_ms=session_ms, heartbeat_interval_ms=interval_ms,
                          max_poll_interval_ms=max_poll_ms, now=now)


def test_the_interval_is_at_most_a_third_of_the_session():
    assert timer(interval_ms=3_000).interval == 3.0
    assert timer(session_ms=6_000, interval_ms=3_000).interval == 2.0


def test_a_heartbeat_is_due_once_per_interval_and_never_two_in_flight():
    t = timer(now=100.0)
    assert t.should_heartbeat(100.0)          # nothing sent yet
    t.sent(100.0)
    assert not t.should_heartbeat(103.5)      # the first one is still unanswered
    t.received(100.2)
    assert not t.should_heartbeat(102.9)
    assert t.should_heartbeat(103.0)
    t.sent(103.0)
    t.answered()                              # an error answer: in flight no more, interval still counts
    assert not t.should_heartbeat(105.0)
    assert t.should_heartbeat(106.0)


def test_the_session_expires_without_an_answer_that_proves_membership():
    t = timer(now=100.0)
    t.sent(100.0)
    assert not t.session_expired(110.0)
    assert t.session_expired(110.1)
    t.answered()                              # an error answer does not renew the session
    assert t.session_expired(110.1)
    t.received(110.05)
    assert not t.session_expired(120.0)
    assert t.session_expired(120.1)


def test_a_new_session_clock_may_count_the_first_beat_from_the_join():
    t = timer(now=100.0)
    t.reset_session(200.0)
    assert not t.session_expired(210.0) and t.session_expired(210.1)
    assert t.should_heartbeat(200.0)          # last_sent untouched: due at once
    t.reset_session(200.0, first_beat_from=198.0)
    assert not t.should_heartbeat(200.9)
    assert t.should_heartbeat(201.0)          # 3 s after the JoinGroup went out


def test_the_poll_interval_runs_from_the_last_poll():
    t = timer(now=100.0, max_poll_ms=5_000)
    assert not t.poll_timeout_expired(105.0)
    assert t.poll_timeout_expired(105.1)
    t.polled(105.05)
    assert not t.poll_timeout_expired(110.0)
    assert t.poll_timeout_expired(110.1)


def test_until_due_says_when_the_next_heartbeat_goes_and_nothing_while_one_is_in_flight():
    from kdaemon.client.group.consumer_heartbeat import ConsumerHeartbeatTimer
    t = HeartbeatTimer(session_timeout_ms=10_000, heartbeat_interval_ms=1000, max_poll_interval_ms=60_000, now=0.0)
    t.sent(10.0)
    assert t.until_due(10.2) is None
    t.received(10.3)
    assert abs(t.until_due(10.3) - 0.7) < 1e-9 and t.until_due(12.0) == 0.0
    c = ConsumerHeartbeatTimer(max_poll_interval_ms=60_000, now=0.0, interval_ms=1000)
    c.sent(5.0)
    assert c.until_due(5.1) is None
    c.failed(5.2, 0.5)                     # an error: the retry backoff decides
    assert abs(c.until_due(5.2) - 0.8) < 1e-9
    c.sent(6.0)
    c.received(1000, now=6.1)
    assert abs(c.until_due(6.1) - 0.9) < 1e-9


def _locks_taken(call) -> list:
    """The lock acquisitions (C-level ``acquire``/``__enter__`` calls) while ``call`` runs."""
    import sys
    seen = []

    def profile(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") in ("acquire", "__enter__"):
            seen.append(arg)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_waking_the_heartbeat_thread_takes_no_lock():
    """``wake`` runs in a signal handler (a worker's sibling poke, ``Consumer.heartbeat_soon``);
    a second signal can be handled inside the first handler, and a lock the first one holds
    would then never be released: with ``threading.Event.set`` a worker hung for good, its loop
    and its heartbeat thread both, until the coordinator fenced it.  Before ``start`` and after
    ``stop`` a wake does nothing."""
    from kdaemon.client.group.heartbeat import HeartbeatThread
    ticks = []
    t = HeartbeatThread(lambda: ticks.append(1), 1.0, "test-heartbeat")
    t.wake()
    t.start()
    try:
        assert _locks_taken(t.wake) == []
    finally:
        t.stop()
    assert ticks
    t.wake()
