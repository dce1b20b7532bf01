"""``arrow_rows.PartitionedFiles``: a direct job's rows written by ``WRITE_LANES`` threads, each
with its own Parquet file per partition value; every row lands exactly once, a one-batch job
makes one file per value, and a failure anywhere (a piece that cannot be built, a write that
fails in a lane) leaves no file behind.  No JVM: the files are read back with pyarrow."""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kdaemon.sinks.spark.tables.arrow_rows import WRITE_LANES, NotDirect, PartitionedFiles, split_by, write_pieces


def _batch(start: int, n: int) -> pa.Table:
    offsets = list(range(start, start + n))
    return pa.table({"topic": ["t"] * n, "date": ["2026-11-27" if o % 3 else "2026-11-28" for o in offsets],
                     "offset": pa.array(offsets, pa.int64()), "value": [b"v%d" % o for o in offsets]})


def _files(tmp_path, lanes: int = WRITE_LANES) -> PartitionedFiles:
    def path_for(values):
        return os.path.join(tmp_path, *[f"{c}={v}" for c, v in zip(("topic", "date"), values)],
                            f"part-{uuid.uuid4()}.parquet")
    return PartitionedFiles(["topic", "date"], path_for, lambda part: part.drop_columns(["topic", "date"]), "zstd",
                            lanes=lanes)


def _parquet(tmp_path) -> list[str]:
    return sorted(str(p) for p in tmp_path.rglob("*.parquet"))


@pytest.mark.parametrize("offsets", [[1, 2, 4], [1, 3, 4, 6], [3, 6], []])
def test_split_by_gives_each_value_its_rows(offsets):
    # One value (no filtering), two, every row of the other value, and no rows at all.
    rows = pa.table({"topic": ["t"] * len(offsets), "partition": pa.array([o % 2 for o in offsets], pa.int32()),
                     "date": ["2026-11-27" if o % 3 else "2026-11-28" for o in offsets],
                     "offset": pa.array(offsets, pa.int64())})
    for columns in (["topic", "date"], ["partition"]):
        got = {values: part.column("offset").to_pylist() for values, part in split_by(rows, columns)}
        want: dict = {}
        for r in rows.to_pylist():
            want.setdefault(tuple(str(r[c]) for c in columns), []).append(r["offset"])
        assert got == want


def test_every_row_lands_once_in_a_file_per_value_and_lane(tmp_path):
    batches = [_batch(i * 1000, 1000) for i in range(7)]
    written = write_pieces(iter(batches), _files(tmp_path))
    assert WRITE_LANES == 2
    assert sorted(values for values, _, _ in written) == sorted([("t", "2026-11-27"), ("t", "2026-11-28")] * 2)
    assert sorted(path for _, path, _ in written) == _parquet(tmp_path)
    seen = []
    for values, path, size in written:
        assert os.path.getsize(path) == size
        offsets = pq.read_table(path).column("offset").to_pylist()
        assert all(("2026-11-27" if o % 3 else "2026-11-28") == values[1] for o in offsets)
        seen += offsets
    assert sorted(seen) == list(range(7000))


def test_a_job_of_one_batch_makes_one_file_per_value(tmp_path):
    written = write_pieces(iter([_batch(0, 10)]), _files(tmp_path))
    assert sorted(values for values, _, _ in written) == [("t", "2026-11-27"), ("t", "2026-11-28")]


def test_one_lane_writes_what_two_do(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    batches = [_batch(i * 100, 100) for i in range(4)]
    rows = {}
    for d, lanes in ((one, 1), (two, 2)):
        written = write_pieces(iter(batches), _files(d, lanes))
        assert len(written) == 2 * lanes
        rows[lanes] = sorted(o for _, path, _ in written for o in pq.read_table(path).column("offset").to_pylist())
    assert rows[1] == rows[2] == list(range(400))


def test_a_piece_that_cannot_be_built_leaves_no_file(tmp_path):
    def pieces():
        for i in range(5):
            yield _batch(i * 10, 10)
        raise NotDirect("a value Spark must read")
    with pytest.raises(NotDirect, match="a value Spark must read"):
        write_pieces(pieces(), _files(tmp_path))
    assert _parquet(tmp_path) == []


def test_a_write_that_fails_in_a_lane_is_raised_and_leaves_no_file(tmp_path):
    """The fourth batch has another type for ``value``: the lane's writer refuses it (a schema
    that does not match its file), the error comes back to the job, every file is removed."""
    bad = _batch(300, 10).set_column(3, "value", pa.array(list(range(10)), pa.int64()))
    with pytest.raises(ValueError, match="does not match"):
        write_pieces(iter([_batch(0, 100), _batch(100, 100), _batch(200, 100), bad, _batch(400, 100)]),
                     _files(tmp_path))
    assert _parquet(tmp_path) == []


def test_a_second_failing_lane_is_logged_not_lost(tmp_path, caplog):
    """Both lanes refuse a batch: the job raises the first failure and the other one is logged
    (an abort must not swallow it), and no file is left."""
    bad = _batch(300, 10).set_column(3, "value", pa.array(list(range(10)), pa.int64()))
    with pytest.raises(ValueError, match="does not match"):
        write_pieces(iter([_batch(0, 100), _batch(100, 100), bad, bad]), _files(tmp_path))
    assert _parquet(tmp_path) == []
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "a write thread of the aborted job failed too" in warned[0], warned
