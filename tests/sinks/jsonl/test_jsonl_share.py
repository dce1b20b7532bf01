"""The jsonl sink in a share group (``group_type = "share"``): out of order, and again.

A share group hands one partition's records to many workers, a RELEASEd record comes back after
later ones, and a record comes again (to any worker) after its lock expired or its worker
crashed after the flush and before the acknowledgement.  The sink must write every record it
never stored and skip exactly those it did (kdaemon/sinks/jsonl_share.py), across restarts and
rotation.  A crashed writer is a child process that ends with ``os._exit`` (no close, no
publish), as in test_jsonl_dedupe.py.
"""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kdaemon.plugins.companion import SinkContext
from kdaemon.plugins.types import Record
from kdaemon.sinks import builtin
from kdaemon.sinks.jsonl import JsonlSink, JsonlWriteError
from kdaemon.sinks.jsonl_index import INDEX_DIR
from kdaemon.sinks.offset_ranges import OffsetRanges, runs


def rec(offset: int, partition: int = 0) -> Record:
    return Record("t", partition, offset, 0, 0, None, b"v", [])


def recs(offsets, partition: int = 0) -> list[Record]:
    return [rec(o, partition) for o in offsets]


def share(d: Path, **kw) -> JsonlSink:
    return JsonlSink(d, group_type="share", **kw)


def stored(d: Path) -> list[tuple[str, int, int]]:
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".jsonl") or name.endswith(".jsonl.open"):
            for line in (d / name).read_text().splitlines():
                obj = json.loads(line)
                out.append((obj["topic"], obj["partition"], obj["offset"]))
    return out


def offsets(d: Path, partition: int = 0) -> list[int]:
    return sorted(o for _, p, o in stored(d) if p == partition)


def crash_after_flush(d: Path, batches: list[list[int]], *, drop_index: bool = False) -> None:
    """A share-group writer in a child process: writes and flushes each batch of partition 0's
    offsets, then dies without closing (its acknowledgements never sent: every record comes
    again); ``drop_index`` removes its index as if it died before the index's rename."""
    script = textwrap.dedent(f"""
        import os, shutil
        from kdaemon.plugins.types import Record
        from kdaemon.sinks.jsonl import JsonlSink, JsonlWriteError
        s = JsonlSink({str(d)!r}, group_type="share")
        for batch in {batches!r}:
            s.write([Record("t", 0, o, 0, 0, None, b"v", []) for o in batch])
            s.flush()
        if {drop_index!r}:
            shutil.rmtree(os.path.join({str(d)!r}, {INDEX_DIR!r}))
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[3])


# -- the range set ------------------------------------------------------------------------------


def test_ranges_merge_as_they_touch_and_answer_membership():
    r = OffsetRanges()
    r.add(10, 20)
    r.add(30, 40)
    r.add(20, 25)            # touches [10, 20): one range
    assert r.pairs() == [(10, 25), (30, 40)]
    r.add(24, 31)            # bridges both
    assert r.pairs() == [(10, 40)]
    r.add(0, 3)
    r.add_offsets([5, 7, 6, 50])
    assert r.pairs() == [(0, 3), (5, 8), (10, 40), (50, 51)]
    assert [o in r for o in (-1, 0, 2, 3, 4, 5, 9, 10, 39, 40, 50, 51)] == \
        [False, True, True, False, False, True, False, True, True, False, True, False]
    assert r.overlaps(3, 4) is False and r.overlaps(3, 5) is True and r.overlaps(41, 49) is False
    assert r.overlaps(60, 70) is False and r.highest() == 50
    assert OffsetRanges.from_flat(r.flat()) == r
    assert runs([3, 1, 2, 2, 7, 9, 8]) == [(1, 4), (7, 10)]


@pytest.mark.parametrize("n", [3, 50], ids=["range by range", "one merge"])
def test_update_takes_another_sets_offsets(n):
    rng = random.Random(n)
    mine, theirs, expected = OffsetRanges(), OffsetRanges(), set()
    for r in (mine, theirs):
        for _ in range(n):
            start = rng.randrange(0, 1000)
            end = start + rng.randrange(1, 20)
            r.add(start, end)
            expected.update(range(start, end))
    mine.update(theirs)
    assert {o for s, e in mine.pairs() for o in range(s, e)} == expected
    assert all(e < s2 for (_, e), (s2, _) in zip(mine.pairs(), mine.pairs()[1:]))   # merged, sorted
    small = OffsetRanges(limit=2)
    small.update(OffsetRanges.from_flat([k for i in range(20) for k in (10 * i, 10 * i + 1)]))
    assert small.pairs() == [(180, 181), (190, 191)] and small.floor == 171


def test_a_full_set_forgets_its_lowest_ranges_and_says_so():
    r = OffsetRanges(limit=3)
    for start in (0, 10, 20, 30):
        r.add(start, start + 2)
    assert r.pairs() == [(10, 12), (20, 22), (30, 32)] and r.floor == 2
    assert 0 not in r        # forgotten counts as not stored: written again, never dropped
    with pytest.raises(ValueError, match="pairs"):
        OffsetRanges.from_flat([1, 2, 3])
    with pytest.raises(ValueError, match="integers"):
        OffsetRanges.from_flat([1, "2"])


# -- one sink -----------------------------------------------------------------------------------


def test_out_of_order_offsets_are_all_written(tmp_path):
    """A RELEASEd batch comes back after later ones: a consumer-group index (the highest
    offset) would drop it."""
    sink = share(tmp_path)
    sink.write(recs(range(10, 20)))
    sink.flush()
    sink.write(recs(range(0, 10)))          # released by another worker, now here
    sink.write(recs([25, 21, 23]))          # gaps: other workers hold 20, 22, 24
    sink.flush()
    sink.write(recs([22, 20, 24]))
    sink.close()
    assert offsets(tmp_path) == list(range(0, 26)) and sink.skipped == 0


def test_a_redelivered_record_is_skipped_flushed_or_not(tmp_path):
    sink = share(tmp_path)
    sink.write(recs(range(0, 10)) + recs(range(0, 3), partition=1))
    sink.flush()
    sink.write(recs([12, 5, 11, 9, 10]))    # 5 and 9 stored: a lock expired before the ACCEPT
    sink.write(recs([11, 13]))              # 11 written, not yet flushed: not twice either
    sink.write(recs([14, 14, 2], partition=1))   # twice in one batch
    sink.close()
    assert offsets(tmp_path) == list(range(0, 14))
    assert offsets(tmp_path, 1) == [0, 1, 2, 14]
    assert sink.skipped == 5


def test_records_lost_with_a_failed_flush_are_written_when_they_come_again(tmp_path, monkeypatch):
    """A flush fails: what was written since the last one is gone (the daemon RELEASEs it and a
    restarted worker gets it again): it must not count as stored."""
    real_fsync, failing = os.fsync, []

    def fsync(fd):
        if failing:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    sink = share(tmp_path)
    sink.write(recs(range(0, 5)))
    sink.flush()
    sink.write(recs(range(5, 10)))
    failing.append(True)
    with pytest.raises(JsonlWriteError, match="lost"):
        sink.flush()
    failing.clear()
    with pytest.raises(JsonlWriteError, match="lost"):
        sink.write(recs(range(5, 10)))      # broken for good: a restart consumes them again
    again = share(tmp_path)
    again.write(recs(range(0, 10)))         # 0-4 stored, 5-9 RELEASEd: all redelivered
    again.close()
    assert offsets(tmp_path) == list(range(0, 10)) and again.skipped == 5


def test_the_index_holds_ranges_and_the_highest(tmp_path):
    sink = share(tmp_path)
    sink.write(recs([7, 3, 4, 5]))
    sink.flush()
    [name] = os.listdir(tmp_path / INDEX_DIR)
    [data] = [n for n in os.listdir(tmp_path) if n.endswith(".open")]
    assert json.loads((tmp_path / INDEX_DIR / name).read_text()) == {
        "bytes": (tmp_path / data).stat().st_size, "high": [["t", 0, 7]], "ranges": [["t", 0, [3, 6, 7, 8]]]}
    sink.close()


# -- across a crash, a restart, a rotation, other workers ----------------------------------------------------


@pytest.mark.parametrize("drop_index", [False, True], ids=["index", "no index: the file is read"])
def test_a_successor_skips_exactly_what_a_crashed_worker_stored(tmp_path, drop_index):
    crash_after_flush(tmp_path, [[20, 21, 22, 23, 24], [0, 1, 2, 3, 4], [30, 32]], drop_index=drop_index)
    successor = share(tmp_path)
    assert len(successor.recovered) == 1
    successor.write(recs(range(0, 40)))     # every lock expired: all of them come again
    successor.close()
    assert offsets(tmp_path) == list(range(0, 40))
    assert len(stored(tmp_path)) == 40 and successor.skipped == 12


def test_across_rotation_and_restart(tmp_path):
    """Files rotate after every batch; a second sink (a restart) knows every file's offsets."""
    first = share(tmp_path, max_bytes=1)
    for batch in ([10, 11], [0, 1], [5], [30, 31, 32]):
        first.write(recs(batch))
        first.flush()
    first.write(recs([1, 2, 11, 12]))       # across files already published
    first.close()
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".jsonl")]) == 5
    assert first.skipped == 2
    second = share(tmp_path, max_bytes=1)
    second.write(recs(range(0, 35)))
    second.close()
    assert offsets(tmp_path) == list(range(0, 35)) and second.skipped == 10


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_what_another_worker_flushed_is_seen_after_the_refresh_interval(tmp_path):
    """Two workers of one daemon share the directory: B's records come to A after a lock expired
    (B's flush took too long, or B crashed before its ACCEPT), with no assignment call.  A looks
    for other writers' flushes at most every ``refresh_interval_s`` (0.2 s): sooner than that,
    what B flushed meanwhile is written twice (a duplicate, never a loss)."""
    clock = Clock()
    a, b = share(tmp_path, clock=clock), share(tmp_path, clock=clock)
    b.write(recs(range(5, 10)))             # B looks at the directory: nothing yet
    b.flush()                               # B's index is on disk; its file still open
    a.write(recs(range(0, 12)))             # A looks: B's 5-9 are stored
    a.flush()
    clock.t += 0.1
    b.write(recs([4, 11, 12]))              # B looked 0.1 s ago: A's 4 and 11 written twice
    clock.t += 0.1
    b.write(recs([3, 10, 13]))              # B looks again: A's 3 and 10 are stored
    a.close()
    b.close()
    assert offsets(tmp_path) == sorted(list(range(0, 14)) + [4, 11])
    assert (a.skipped, b.skipped) == (5, 2)


def test_a_flush_into_an_open_file_is_seen_without_listing_the_directory(tmp_path):
    """Between rotations only the other writers' open files change: a look reads their indexes
    alone (a ``stat`` each), not every index the directory holds."""
    clock = Clock()
    a, b = share(tmp_path, clock=clock), share(tmp_path, clock=clock)
    b.write(recs(range(0, 5)))
    b.flush()                               # B's file exists from now until it is published
    old = os.stat(tmp_path).st_mtime_ns - 10 ** 10
    os.utime(tmp_path, ns=(old, old))       # as if B's file had been created long ago
    a.write(recs([100]))                    # A's first look lists everything; its own file is new
    os.utime(tmp_path, ns=(old, old))
    clock.t += 0.2
    a.write(recs([101]))                    # lists the data files again (its mtime changed), sure now
    a.flush()
    b.write(recs(range(5, 10)))
    b.flush()                               # only the index directory changes
    clock.t += 0.2
    a.write(recs(range(0, 12)))             # all of B's, whose flushes A saw through its index
    a.close()
    b.close()
    assert offsets(tmp_path) == list(range(0, 12)) + [100, 101]
    assert a.skipped == 10


def test_a_directory_listing_is_trusted_only_once_its_mtime_is_old(tmp_path):
    """The mtime gate (jsonl_share._Listing): a directory's mtime ticks coarsely, so a listing
    made within a second of the mtime it saw is made again at the next look."""
    from kdaemon.sinks.jsonl_share import _Listing
    d = tmp_path / "d"
    d.mkdir()
    old = os.stat(d).st_mtime_ns - 10 ** 10
    os.utime(d, ns=(old, old))
    listing = _Listing()
    assert listing.stale(str(d)) is True          # never listed
    assert listing.stale(str(d)) is False         # unchanged, and old when listed
    (d / "x").touch()                             # a change: the mtime is now
    assert listing.stale(str(d)) is True
    assert listing.stale(str(d)) is True          # unchanged, but too recent to be sure
    os.utime(d, ns=(old + 1, old + 1))
    assert listing.stale(str(d)) is True and listing.stale(str(d)) is False


def test_retention_and_consumer_group_indexes(tmp_path):
    """A data file removed by retention still counts through its index (ranges); a file a
    consumer-group sink wrote is read for its ranges (and indexed with them); a consumer-group
    index without ranges whose data is gone says nothing: those records are written, never
    dropped."""
    old = JsonlSink(tmp_path, prefix="c")   # consumer group: an index with the highest only
    old.write(recs([0, 1, 2, 9]))
    old.close()
    gone = JsonlSink(tmp_path, prefix="c")
    gone.write(recs([20, 21]))
    gone.close()
    os.unlink(gone.published[-1])           # retention took it before any share sink read it
    kept = share(tmp_path, prefix="c")
    kept.write(recs([3, 9, 20]))            # 3 and 20 are in no file it can read: written
    kept.close()
    assert offsets(tmp_path) == [0, 1, 2, 3, 9, 20] and kept.skipped == 1
    for name in os.listdir(tmp_path):
        if name.endswith(".jsonl"):
            os.unlink(tmp_path / name)      # retention removes every data file
    again = share(tmp_path, prefix="c")
    again.write(recs([0, 3, 4, 20]))        # their indexes have ranges now; 4 is new
    again.close()
    assert offsets(tmp_path) == [4] and again.skipped == 3


def test_consumer_group_mode_is_unchanged(tmp_path):
    """The default (a consumer group) keeps the highest offset: what share mode must not do."""
    sink = JsonlSink(tmp_path)
    sink.write(recs(range(10, 20)))
    sink.flush()
    sink.write(recs(range(0, 10)))
    sink.close()
    assert offsets(tmp_path) == list(range(10, 20)) and sink.skipped == 10
    with pytest.raises(ValueError, match="group_type must be one of consumer, share"):
        JsonlSink(tmp_path, group_type="queue")


def test_the_plugin_passes_the_group_type_to_the_sink(tmp_path):
    context = SinkContext(str(tmp_path / "state"), "d", 60.0, group_type="share")
    sink = builtin.kdaemon_sinks(context)["jsonl"]({"type": "jsonl", "path": str(tmp_path / "out")})
    assert sink.group_type == "share" and sink._share is not None
    sink.close()
    default = builtin.kdaemon_sinks(SinkContext(str(tmp_path / "state"), "d", 60.0))["jsonl"](
        {"type": "jsonl", "path": str(tmp_path / "out2")})
    assert default.group_type == "consumer" and default._share is None
    default.close()
