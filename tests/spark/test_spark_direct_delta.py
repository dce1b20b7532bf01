"""The uploader's direct Delta writes (arrow_rows + delta_files, ``direct_writes``) against real
Delta Lake: the rows, schema and commit are what the Spark path makes of the same batches; the
statistics Delta skips files by are right; a job or table the direct path must not write goes
through Spark."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from kdaemon.sinks.spark import delta, delta_log, staged
from kdaemon.sinks.spark.writer import SparkWriter
from tests.spark.support import fresh_jvm, requires_spark

requires_spark()

pytestmark = [pytest.mark.spark]

SCHEMA = "id BIGINT, kind STRING, score DOUBLE, tags ARRAY<INT>, inner STRUCT<a: BOOLEAN, b: SMALLINT>"
T0 = 1_764_000_000_000   # 2025-11-24T16:00:00Z


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    """An uploader's SparkWriter on Delta (local[1]); each test writes its own tables by
    pointing ``path`` elsewhere."""
    fresh_jvm()
    w = SparkWriter({"type": "spark", "format": "delta", "master": "local[1]", "value_schema": SCHEMA,
                     "partition_by": ["topic", "date"], "path": str(tmp_path_factory.mktemp("unused"))})
    w.start()
    yield w
    w.stop()
    fresh_jvm()


def _batch(tmp_path, name: str, partition: int, offsets: range, *, headers=None, values=None):
    n = len(offsets)
    values = values or [json.dumps({"id": o, "kind": f"k{o % 3}", "score": o / 4, "tags": [o, None],
                                    "inner": {"a": o % 2 == 0, "b": o}}).encode() if o % 7 else None
                        for o in offsets]
    headers = headers or [[("type", b"t%d" % (o % 2)), ("trace", None if o % 5 == 0 else b"x")] if o % 4 else []
                          for o in offsets]
    path = str(tmp_path / f"{name}.staged")
    # A day boundary inside the batch, and one record without a timestamp.
    stamps = [-1 if o == offsets[0] else T0 + o * 3_600_000 for o in offsets]
    staged.write(path, "events", partition, list(offsets), stamps, [0] * n,
                 [None if o % 3 == 0 else b"k%d" % o for o in offsets], values, headers)
    return staged.read(path)


def _write(writer, path: str, batches, direct: bool) -> bool:
    writer.path = path
    versions = {}
    for b in batches:
        key = (b.column("topic")[0].as_py(), b.column("partition")[0].as_py())
        versions[key] = max(versions.get(key, -1), b.column("offset")[-1].as_py())
    if direct:
        return writer.append_direct(batches, versions)
    tmp = os.path.join(path + "-tmp")
    held = []
    for i, b in enumerate(batches):
        os.makedirs(tmp, exist_ok=True)
        f = os.path.join(tmp, f"w-{i}-p{b.column('partition')[0].as_py()}-{i:019d}-{i:019d}.parquet")
        pq.write_table(b, f)
        held.append((f, f"p{b.column('partition')[0].as_py()}-{i:019d}-{i:019d}", []))
    job = writer.prepare(held, tmp, careful=False)
    writer.append_table(job, versions)
    writer.finish(job)
    return True


def _read(writer, path: str) -> list[dict]:
    rows = writer.spark.read.format("delta").load(path).orderBy("partition", "offset").collect()
    return [r.asDict(recursive=True) for r in rows]


def _data_files(path: str) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(path) if "_delta_log" not in d for f in files}


def _commits(path: str) -> list[list[dict]]:
    d = delta_log.log_dir(path)
    names = sorted(n for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit())
    return [[json.loads(line) for line in open(os.path.join(d, n)) if line.strip()] for n in names]


def test_direct_rows_schema_and_commit_are_the_spark_paths(writer, tmp_path):
    batches = [_batch(tmp_path, "a", 0, range(0, 40)), _batch(tmp_path, "b", 1, range(100, 130)),
               _batch(tmp_path, "c", 0, range(40, 60))]
    direct, spark = str(tmp_path / "direct"), str(tmp_path / "spark")
    assert _write(writer, direct, batches, direct=True)
    assert _write(writer, spark, batches, direct=False)
    assert _read(writer, direct) == _read(writer, spark)
    assert len(_read(writer, direct)) == 90
    d_meta, s_meta = ([a["metaData"] for a in _commits(p)[0] if "metaData" in a][0] for p in (direct, spark))
    assert json.loads(d_meta["schemaString"]) == json.loads(s_meta["schemaString"])
    assert d_meta["partitionColumns"] == s_meta["partitionColumns"] == ["topic", "date"]
    (commit,) = _commits(direct)
    assert {a["txn"]["appId"]: a["txn"]["version"] for a in commit if "txn" in a} == \
        {"kdaemon:events:0": 59, "kdaemon:events:1": 129}
    assert delta.committed_offsets(direct) == {("events", 0): 59, ("events", 1): 129}
    adds = [a["add"] for a in commit if "add" in a]
    assert {tuple(sorted(a["partitionValues"].items())) for a in adds} == {
        tuple(sorted(a["add"]["partitionValues"].items())) for a in _commits(spark)[0] if "add" in a}
    for a in adds:
        assert "%" not in a["path"] and os.path.isfile(os.path.join(direct, a["path"]))
    # The next job appends to the table the Spark path created, and the other way round.
    more = [_batch(tmp_path, "d", 1, range(130, 140))]
    assert _write(writer, spark, more, direct=True)
    assert _write(writer, direct, more, direct=False)
    assert _read(writer, direct) == _read(writer, spark)


def test_statistics_skip_files_only_where_they_may(writer, tmp_path):
    path = str(tmp_path / "t")
    for i in range(4):   # four commits, a file each (one partition, one day)
        assert _write(writer, path, [_batch(tmp_path, f"s{i}", 2, range(i * 10 + 1, i * 10 + 11))], direct=True)
    adds = [a["add"] for c in _commits(path) for a in c if "add" in a]
    assert len(adds) > 4   # the batches cross days: several files a commit
    for add in adds:   # each file's statistics are its rows'
        rows = pq.read_table(os.path.join(path, add["path"])).to_pydict()
        stats = json.loads(add["stats"])
        stamps = [t for t in rows["timestamp"] if t is not None]
        assert stats["numRecords"] == len(rows["offset"])
        assert (stats["minValues"]["offset"], stats["maxValues"]["offset"]) == (min(rows["offset"]), max(rows["offset"]))
        assert stats["nullCount"]["timestamp"] == len(rows["timestamp"]) - len(stamps)
        if stamps:
            assert stats["minValues"]["timestamp"] == min(stamps).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        assert "partition" in stats["minValues"] and "date" not in stats["minValues"]
    df = writer.spark.read.format("delta").load(path)
    for cond, expect in (("offset >= 20", 21), ("offset < 11", 10), ("offset = 30", 1),
                         (f"timestamp >= timestamp_millis({T0 + 25 * 3_600_000})", 15),
                         ("timestamp IS NULL", 4), (f"timestamp < timestamp_millis({T0 + 2 * 3_600_000})", 0)):
        assert df.where(cond).count() == expect, cond


def test_a_job_spark_must_write_is_not_direct(writer, tmp_path):
    path = str(tmp_path / "t")
    repeated = _batch(tmp_path, "r", 0, range(0, 5), headers=[[("a", b"1"), ("a", b"2")]] * 5)
    assert not _write(writer, path, [repeated], direct=True)
    assert not os.path.exists(path)   # nothing written
    bad = _batch(tmp_path, "bad", 0, range(0, 3), values=[b'{"id": 1}', b'{"id": "x"}', b'{"id": 3}'])
    assert not _write(writer, path, [bad], direct=True)
    assert not os.path.exists(path)


def test_a_table_with_a_check_constraint_is_written_by_spark(writer, tmp_path):
    path = str(tmp_path / "t")
    assert _write(writer, path, [_batch(tmp_path, "a", 0, range(1, 11))], direct=True)
    writer.spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT small CHECK (offset < 100)")
    before = _data_files(path)
    assert not _write(writer, path, [_batch(tmp_path, "b", 0, range(11, 21))], direct=True)
    assert _data_files(path) == before   # no file left behind
    with pytest.raises(Exception, match="(?i)check constraint"):
        _write(writer, path, [_batch(tmp_path, "c", 0, range(150, 160))], direct=False)
