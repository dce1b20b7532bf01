"""``kdaemon.cli.watch``: Burrow's lag evaluation rules over made-up polls, no broker.

Burrow's wiki page "Consumer Lag Evaluation Rules" (github.com/linkedin/Burrow/wiki) states the
rules; its worked examples could not be read here, so the first tests replay instead the table
Burrow's own tests call "the correctness proof for the evaluator": ``tests`` in
core/internal/evaluator/caching_test.go (linkedin/Burrow), cases 0-11.  Each case is a list of
commits (offset, timestamp, lag), the current lag, and "now".  Translated to our sampling: a poll
at each commit's time that sees it (committed = the offset, lag = its lag), the evaluation at
"now", and one more poll at "now" when the current lag differs from the last commit's.  Burrow's
recent broker offsets (cases 9 and 10) become polls after the last commit.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from click.testing import CliRunner

from kdaemon.cli.offsets import offsets
from kdaemon.cli.watch import STATUSES, GroupWatch, PartitionWindow, Status

OK, LAGGING, STALLED, STOPPED, REWIND, UNKNOWN = (Status.OK, Status.LAGGING, Status.STALLED, Status.STOPPED,
                                                  Status.REWIND, Status.UNKNOWN)


def replay(commits, current_lag, now, *, after=(), window=None) -> Status:
    """commits: (offset, timestamp ms, lag) as Burrow's fixtures; after: (time s, lag) polls of
    the last offset after the last commit (Burrow's broker offsets)."""
    w = PartitionWindow(window or len(commits))
    for offset, ts_ms, lag in commits:
        w.observe(ts_ms / 1000, offset, lag)
    for t, lag in after:
        w.observe(t, commits[-1][0], lag)
    if current_lag != w.polls[-1].lag:
        w.observe(now, commits[-1][0], current_lag)
    return w.evaluate(now).status


def steady(lags, start=1000, step=1000, t0=100):
    """Commits every 100 s (Burrow's fixtures' rhythm), the offset moving by ``step``."""
    return [(start + i * step, (t0 + 100 * i) * 1000, lag) for i, lag in enumerate(lags)]


# caching_test.go cases 0-3 and 8 share these offsets (1000..5000 at 100..500 s).
CASES = [
    # 0: OK, lag zero somewhere in the window.
    (steady([0, 50, 100, 150, 200]), 200, 600, OK),
    # 1: OK, not yet stopped: 400 s since the last commit equals the window's span (not greater).
    (steady([0, 50, 100, 150, 200]), 200, 900, OK),
    # 2: STOP, 500 s since the last commit, though lag was zero at the start (Burrow #290).
    (steady([0, 50, 100, 150, 200]), 200, 1000, STOPPED),
    # 3: STOP when the lag is never zero too.
    (steady([50, 100, 150, 200, 250]), 250, 1000, STOPPED),
    # 4: OK: the offset never moves but the lag was zero in the window ("another commit will turn
    #    this to stall").
    (steady([0, 50, 100, 150, 200], step=0), 200, 600, OK),
    # 5: STALL, the offset never moves and the lag is never zero.
    (steady([100, 150, 200, 250, 300], step=0), 300, 600, STALLED),
    # 6: STALL also with a lag that stays the same.
    (steady([100] * 5, step=0), 100, 600, STALLED),
    # 7: REWIND: the offsets go back (2000 after 3000), though the lag decreases.
    ([(1000, 100_000, 100), (2000, 200_000, 150), (3000, 300_000, 200), (2000, 400_000, 1250),
      (4000, 500_000, 300)], 300, 600, REWIND),
    # 8: OK because the current lag is 0, though the timestamps say stopped.
    (steady([50, 100, 150, 200, 250]), 0, 1000, OK),
]


@pytest.mark.parametrize("commits, current_lag, now, expected", CASES, ids=[f"burrow-{i}" for i in range(len(CASES))])
def test_burrows_correctness_table(commits, current_lag, now, expected):
    assert replay(commits, current_lag, now) is expected


# Cases 9 and 10: 15 commits a second apart, all at zero lag, then new data (Burrow #290, #338).
REAL = [(792748079 + i, 1512224618356 + ms, 0) for i, ms in
        enumerate([0, 1006, 2010, 3011, 4014, 5017, 6022, 7023, 8027, 9027, 10027, 11032, 12035, 13038, 14041])]
LAST = REAL[-1][0]


def test_burrow_9_stopped_when_recent_end_offsets_all_ran_ahead_of_the_last_commit():
    # Broker offsets 792748500 .. 792749024 since the last commit: never at it.
    after = [(1512224640 + 2.5 * i, end - LAST) for i, end in enumerate([792748500, 792748600, 792748800,
                                                                         792749000, 792749024])]
    assert replay(REAL, 792749024 - LAST, 1512224650, after=after) is STOPPED


def test_burrow_10_ok_when_a_recent_end_offset_was_at_the_last_commit():
    # Broker offsets 792748093 three times, then 792748094: data arrived a moment ago.
    after = [(1512224641 + 3 * i, end - LAST) for i, end in enumerate([792748093, 792748093, 792748093,
                                                                       792748094])]
    assert replay(REAL, 1, 1512224650, after=after) is OK


def test_burrow_11_commits_without_a_lag_do_not_change_case_0():
    commits = [(1000 + 500 * i, (100 + 50 * i) * 1000, None if i % 2 else 50 * (i // 2)) for i in range(10)]
    assert replay(commits, 200, 600) is OK


# Our own cases, one per status, each failing if its rule is dropped or loosened.

def feed(polls, window=3, now=None) -> Status:
    """polls: (time, committed, lag)."""
    w = PartitionWindow(window)
    for t, committed, lag in polls:
        w.observe(t, committed, lag)
    return w.evaluate(polls[-1][0] if now is None else now).status


def test_unknown_lag_is_unknown_and_zero_lag_ok():
    assert feed([(0, None, None)]) is UNKNOWN
    assert feed([(0, 5, None), (1, 5, None), (2, 5, None)]) is UNKNOWN
    assert feed([(0, 5, 10), (1, 5, 20), (2, 5, 0)]) is OK   # caught up now, whatever came before


def test_stalled_needs_the_whole_window_unmoved_and_a_lag_that_never_fell():
    assert feed([(0, 5, 10), (1, 5, 10)]) is OK               # 2 polls of a window of 3: too early
    assert feed([(0, 5, 10), (1, 5, 10), (2, 5, 10)]) is STALLED
    assert feed([(0, 5, 10), (1, 5, 12), (2, 5, 15)]) is STALLED
    assert feed([(0, 5, 10), (1, 5, 12), (2, 5, 11)]) is OK   # the end went back (truncated): not stuck
    assert feed([(0, 4, 10), (1, 5, 12), (2, 5, 15)]) is OK   # moved inside the window
    assert feed([(0, 5, 0), (1, 5, 12), (2, 5, 15)]) is OK    # caught up within the window
    # Never committed, counted from auto_offset_reset: stalled too.
    assert feed([(0, None, 10), (1, None, 10), (2, None, 11)]) is STALLED


def test_a_slow_committer_is_not_stalled_before_its_usual_pause():
    # Commits 60 s apart seen; then 5 polls a second apart without a new one: still within 60 s.
    polls = [(0, 10, 5), (60, 20, 5)] + [(60 + s, 20, 5 + s) for s in range(1, 5)]
    assert feed(polls, window=4) is OK
    assert feed(polls, window=4, now=121) is STALLED


def test_stopped_when_silent_longer_than_the_commits_span():
    moving = [(t, 10 * t, 5) for t in range(4)]               # 4 commits over 3 s
    quiet = [(t, 30, 5 + t) for t in (4, 5, 6, 7)]
    assert feed(moving + quiet[:2], window=4) is OK           # 2 s since the last commit, span 3 s
    assert feed(moving + quiet[:3], window=4, now=6) is OK    # 3 s: equal is not longer
    assert feed(moving + quiet, window=4) is STOPPED          # 4 s
    # Unless a poll since that commit found it caught up: new data arrived a moment ago.
    caught = [(4, 30, 0), (5, 30, 0), (6, 30, 0), (7, 30, 1)]
    assert feed(moving + caught, window=4) is OK


def test_lagging_when_the_lag_grew_at_every_commit_of_a_full_window():
    growing = [(t, 10 * t, 5 + t) for t in range(4)]
    assert feed(growing[:3], window=4) is OK                  # 3 commits of 4
    assert feed(growing, window=4) is LAGGING
    # Burrow warns on a lag that never fell; we need it to grow (a steady consumer keeps a constant lag).
    assert feed([(t, 10 * t, 7) for t in range(4)], window=4) is OK
    assert feed([(0, 0, 5), (1, 10, 6), (2, 20, 6), (3, 30, 8)], window=4) is OK
    assert feed([(0, 0, 5), (1, 10, 7), (2, 20, 6), (3, 30, 8)], window=4) is OK


def test_rewind_is_reported_while_there_is_lag():
    assert feed([(0, 50, 5), (1, 60, 5), (2, 20, 45)]) is REWIND
    assert feed([(0, 50, 0), (1, 60, 0), (2, 20, 45)]) is REWIND   # even after a zero lag (Burrow #716)
    assert feed([(0, 50, 5), (1, 60, 5), (2, 20, 0)]) is OK        # caught up again


def test_the_group_shows_its_worst_partition_and_what_changed():
    @dataclass
    class Row:
        topic: str
        partition: int
        committed: int | None
        lag: int | None

    watch = GroupWatch(2)
    first = watch.observe(0, [Row("t", 0, 5, 0), Row("t", 1, 5, 10), Row("t", 2, None, None)])
    assert first.status is OK and [p.changed for p in first.partitions] == [True, True, True]
    assert first.summary() == "2 partition(s) ok, 1 with lag unknown, total lag 10"
    second = watch.observe(1, [Row("t", 0, 5, 0), Row("t", 1, 5, 12), Row("t", 2, None, None)])
    assert second.status is STALLED
    assert [p.changed for p in second.partitions] == [False, True, False]
    assert second.summary() == "1 partition(s) stalled, total lag 12"
    assert GroupWatch(2).observe(0, []).status is UNKNOWN


def test_the_status_table_orders_every_status():
    assert set(STATUSES) == set(Status)
    assert sorted(Status, key=lambda s: s.severity) == [UNKNOWN, OK, LAGGING, STALLED, STOPPED, REWIND]
    with pytest.raises(ValueError, match="at least 2"):
        GroupWatch(1)


@pytest.mark.parametrize("args, needle", [
    (["--watch", "--interval", "0"], "'--interval': 0.0 is not in the range x>0"),
    (["--watch", "--window", "1"], "'--window': 1 is not in the range x>=2"),
    (["--watch", "--count", "0"], "'--count': 0 is not in the range x>=1"),
])
def test_bad_watch_options_are_one_click_error(tmp_path, args, needle):
    result = CliRunner().invoke(offsets, ["-c", str(tmp_path / "none.toml"), *args])
    assert result.exit_code == 2 and needle in result.output, result.output


def test_watch_options_without_watch_are_refused(tmp_path):
    config = tmp_path / "kdaemon.toml"
    config.write_text('[daemon]\ntopics = ["t"]\n[kafka]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\n'
                      '[sink]\ntype = "null"\n')
    result = CliRunner().invoke(offsets, ["-c", str(config), "--count", "3"])
    assert result.exit_code == 2 and "--interval, --window and --count go with --watch" in result.output
