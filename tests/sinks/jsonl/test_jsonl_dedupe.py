"""The jsonl sink writes no record twice (``dedupe``, on by default).

A worker killed after its flush and before its commit leaves records that its successor
consumes again; the successor's sink must recognise them from what the directory holds: the
per-file indexes (kdaemon/sinks/jsonl_index.py), or the data files themselves where an index is
missing or stale (the crash fell between the data's fsync and the index's rename).  A crashed
writer is a child process that ends with ``os._exit`` (no close, no publish), so its flock and
its file are left as a SIGKILL leaves them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kdaemon.client.types import TopicPartition
from kdaemon.plugins.types import Record, SinkWriteError
from kdaemon.sinks.jsonl import JsonlSink
from kdaemon.sinks.jsonl_index import INDEX_DIR


def rec(offset: int, partition: int = 0, value=b"v") -> Record:
    return Record("t", partition, offset, 0, 0, None, value, [])


def stored(d: Path) -> list[tuple[str, int, int]]:
    """Every (topic, partition, offset) in the directory's data files, in file order."""
    out = []
    for name in sorted(os.listdir(d)):
        if name.endswith(".jsonl") or name.endswith(".jsonl.open"):
            for line in (d / name).read_text().splitlines():
                obj = json.loads(line)
                out.append((obj["topic"], obj["partition"], obj["offset"]))
    return out


def crash_after_flush(d: Path, offsets: range, *, drop_index: bool = False) -> None:
    """A writer in a child process: writes and flushes ``offsets`` of partition 0, then dies
    without closing; ``drop_index`` also removes the index it wrote (as if it died between the
    data's fsync and the index's rename)."""
    script = textwrap.dedent(f"""
        import os, shutil
        from kdaemon.plugins.types import Record
        from kdaemon.sinks.jsonl import JsonlSink
        s = JsonlSink({str(d)!r})
        s.write([Record("t", 0, o, 0, 0, None, b"v", []) for o in range({offsets.start}, {offsets.stop})])
        s.flush()
        if {drop_index!r}:
            shutil.rmtree(os.path.join({str(d)!r}, {INDEX_DIR!r}))
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parents[3])


@pytest.mark.parametrize("drop_index", [False, True], ids=["index", "no index: the file is read"])
def test_a_successor_does_not_write_what_a_crashed_writer_flushed(tmp_path, drop_index):
    crash_after_flush(tmp_path, range(0, 10), drop_index=drop_index)
    successor = JsonlSink(tmp_path)           # publishes the orphan, then consumes from offset 5
    assert len(successor.recovered) == 1
    successor.write([rec(o) for o in range(5, 15)])
    successor.close()
    assert stored(tmp_path) == [("t", 0, o) for o in range(15)]
    assert successor.skipped == 5


def test_a_stale_index_is_not_trusted(tmp_path):
    first = JsonlSink(tmp_path)
    first.write([rec(o) for o in range(3)])
    first.flush()
    first.write([rec(o) for o in range(3, 6)])
    first.close()
    [index] = os.listdir(tmp_path / INDEX_DIR)
    (tmp_path / INDEX_DIR / index).write_text(json.dumps({"bytes": 1, "high": [["t", 0, 0]]}))
    second = JsonlSink(tmp_path)
    second.write([rec(o) for o in range(4, 8)])
    second.close()
    assert stored(tmp_path) == [("t", 0, o) for o in range(8)]


def test_a_partition_assigned_again_is_read_again(tmp_path):
    """Worker A wrote partition 0, lost it to B, which wrote more and died before committing;
    A gets it back from B's last commit.  Told of the assignment, A reads what B stored."""
    a, b = JsonlSink(tmp_path), JsonlSink(tmp_path)
    a.write([rec(o) for o in range(5)])
    a.flush()
    b.write([rec(o) for o in range(5, 10)])
    b.flush()
    b.close()
    a.on_partitions_assigned({TopicPartition("t", 0)})
    a.write([rec(o) for o in range(5, 12)])   # B's commit was at 5
    a.close()
    assert sorted(stored(tmp_path)) == [("t", 0, o) for o in range(12)]


def test_without_being_told_a_sink_trusts_what_it_knows(tmp_path):
    """The same without ``on_partitions_assigned``: A only knows its own writes and writes B's
    records again.  (What the worker's rebalance listener prevents; this shows the call
    matters.)"""
    a, b = JsonlSink(tmp_path), JsonlSink(tmp_path)
    a.write([rec(o) for o in range(5)])
    a.flush()
    b.write([rec(o) for o in range(5, 10)])
    b.close()
    a.write([rec(o) for o in range(5, 12)])
    a.close()
    assert len(stored(tmp_path)) == 17


def test_partitions_are_apart_and_dedupe_can_be_turned_off(tmp_path):
    first = JsonlSink(tmp_path / "on")
    first.write([rec(o, p) for p in (0, 1) for o in range(3)])
    first.close()
    again = JsonlSink(tmp_path / "on")
    again.write([rec(2, 0), rec(0, 2), rec(3, 1)])
    again.close()
    assert sorted(stored(tmp_path / "on")) == sorted(
        [("t", p, o) for p in (0, 1) for o in range(3)] + [("t", 2, 0), ("t", 1, 3)])
    off = JsonlSink.from_settings({"type": "jsonl", "path": str(tmp_path / "off"), "dedupe": False})
    off.write([rec(0)])
    off.close()
    off2 = JsonlSink(tmp_path / "off", dedupe=False)
    off2.write([rec(0)])
    off2.close()
    assert stored(tmp_path / "off") == [("t", 0, 0), ("t", 0, 0)]
    with pytest.raises(ValueError, match='sink.dedupe: expected true or false, found string "yes"'):
        JsonlSink.from_settings({"type": "jsonl", "path": str(tmp_path / "x"), "dedupe": "yes"})


def test_refused_records_are_named_by_their_place_in_the_batch_given(tmp_path):
    first = JsonlSink(tmp_path)
    first.write([rec(o) for o in range(3)])
    first.close()
    again = JsonlSink(tmp_path)
    batch = [rec(1), rec(2), rec(3), rec(4, value=object()), rec(5)]   # 1, 2 stored; 4 cannot be JSON
    with pytest.raises(SinkWriteError) as info:
        again.write(batch)
    assert info.value.failed_indexes == [3]
    again.close()
    assert stored(tmp_path) == [("t", 0, o) for o in (0, 1, 2, 3, 5)]


def test_the_index_follows_its_file_and_records_only_durable_bytes(tmp_path):
    sink = JsonlSink(tmp_path)
    sink.write([rec(0), rec(1)])
    assert not (tmp_path / INDEX_DIR).exists()        # nothing durable yet
    sink.flush()
    [name] = os.listdir(tmp_path / INDEX_DIR)
    [data] = [n for n in os.listdir(tmp_path) if n.endswith(".open")]
    assert name == data[: -len(".jsonl.open")] + ".json"
    assert json.loads((tmp_path / INDEX_DIR / name).read_text()) == {
        "bytes": (tmp_path / data).stat().st_size, "high": [["t", 0, 1]]}
    sink.close()
    [done] = [n for n in os.listdir(tmp_path) if n.endswith(".jsonl")]
    assert os.listdir(tmp_path / INDEX_DIR) == [done[: -len(".jsonl")] + ".json"]
