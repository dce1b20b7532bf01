"""The one Backoff every retry in kdaemon uses."""

import pytest

from kdaemon.backoff import Backoff


def test_doubles_from_initial_and_caps_at_maximum():
    b = Backoff(initial=0.5, maximum=3.0)
    assert [b.failure() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert b.failures == 5


def test_reset_starts_again_from_initial():
    b = Backoff(initial=0.1, maximum=1.0)
    b.failure(), b.failure()
    b.reset()
    assert b.failures == 0 and b.delay() == 0.0
    assert b.failure() == 0.1


def test_delay_is_pure_and_matches_failure():
    b = Backoff(initial=1.0, maximum=60.0)
    assert b.delay(3) == 4.0
    assert b.failures == 0
    assert b.delay(10_000) == 60.0      # a very long outage does not overflow


def test_jitter_stays_within_its_band():
    b = Backoff(initial=1.0, maximum=1.0, jitter=0.2)
    seen = [b.failure() for _ in range(200)]
    assert all(0.8 <= d <= 1.2 for d in seen)
    assert max(seen) - min(seen) > 0.05   # it does spread


@pytest.mark.parametrize("kw", [dict(initial=-1, maximum=1), dict(initial=1, maximum=1, multiplier=0.5),
                                dict(initial=1, maximum=1, jitter=1.0)])
def test_bad_settings_are_named(kw):
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**kw)
