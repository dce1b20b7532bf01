"""The uploader's direct writes (arrow_rows + delta_files / iceberg_files, ``direct_writes``)
against real Delta Lake and Iceberg: the rows, schema and commit are what the Spark path makes
of the same batches, and each path appends to the other's table; Delta's statistics and
Iceberg's metrics skip files only where they may; a job or table the direct path must not write
goes through Spark."""

from __future__ import annotations

import json
import os
import tempfile

import pyarrow.parquet as pq
import pytest

from kdaemon.sinks.spark.tables import delta_state, iceberg, iceberg_meta, formats
from kdaemon.sinks.spark import staged
from kdaemon.sinks.spark.uploader.writer import SparkWriter
from testkit.spark import fresh_session, requires_spark

requires_spark()

pytestmark = [pytest.mark.spark]

SCHEMA = "id BIGINT, kind STRING, score DOUBLE, tags ARRAY<INT>, inner STRUCT<a: BOOLEAN, b: SMALLINT>"
T0 = 1_764_000_000_000   # 2025-11-24T16:00:00Z
KEYS = [("events", p) for p in range(3)]


@pytest.fixture(scope="module", params=["delta", "iceberg"])
def writer(request, tmp_path_factory):
    """An uploader's SparkWriter on ``request.param`` (local[1], a session of its own: the
    Iceberg catalog's warehouse is read when the session first uses it); each test points
    ``path`` at its own table (Iceberg: under the one warehouse, ``<lake>/db/<table>``)."""
    lake = tmp_path_factory.mktemp("lake")
    fresh_session()
    w = SparkWriter({"type": "spark", "format": request.param, "master": "local[1]", "value_schema": SCHEMA,
                     "partition_by": ["topic", "date"], "path": str(lake / "db" / "unused")})
    w.start()
    w.lake = lake
    yield w
    w.stop()
    fresh_session()


def _table(writer, name: str) -> str:
    return str(writer.lake / "db" / name)


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
    tmp = tempfile.mkdtemp(prefix="held-")
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


def _load(writer, path: str):
    return writer.spark.read.format(writer.format).load(path)


def _read(writer, path: str) -> list[dict]:
    rows = _load(writer, path).orderBy("partition", "offset").collect()
    return [r.asDict(recursive=True) for r in rows]


def _data_files(path: str) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(path) if not d.endswith(("_delta_log", "metadata"))
            for f in files}


def _commits(path: str) -> list[list[dict]]:
    d = delta_state.log_dir(path)
    names = sorted(n for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit())
    return [[json.loads(line) for line in open(os.path.join(d, n)) if line.strip()] for n in names]


def test_direct_rows_schema_and_commit_are_the_spark_paths(writer, tmp_path):
    batches = [_batch(tmp_path, "a", 0, range(0, 40)), _batch(tmp_path, "b", 1, range(100, 130)),
               _batch(tmp_path, "c", 0, range(40, 60))]
    direct, spark = _table(writer, "direct"), _table(writer, "spark")
    assert _write(writer, direct, batches, direct=True)
    assert _write(writer, spark, batches, direct=False)
    assert _read(writer, direct) == _read(writer, spark)
    assert len(_read(writer, direct)) == 90
    assert _load(writer, direct).schema == _load(writer, spark).schema
    assert formats.recorded(writer.format, direct, KEYS) == {("events", 0): 59, ("events", 1): 129}
    if writer.format == "delta":
        d_meta, s_meta = ([a["metaData"] for a in _commits(p)[0] if "metaData" in a][0] for p in (direct, spark))
        assert json.loads(d_meta["schemaString"]) == json.loads(s_meta["schemaString"])
        assert d_meta["partitionColumns"] == s_meta["partitionColumns"] == ["topic", "date"]
        (commit,) = _commits(direct)
        assert {a["txn"]["appId"]: a["txn"]["version"] for a in commit if "txn" in a} == \
            {"kdaemon:events:0": 59, "kdaemon:events:1": 129}
        adds = [a["add"] for a in commit if "add" in a]
        assert {tuple(sorted(a["partitionValues"].items())) for a in adds} == {
            tuple(sorted(a["add"]["partitionValues"].items())) for a in _commits(spark)[0] if "add" in a}
        for a in adds:
            assert "%" not in a["path"] and os.path.isfile(os.path.join(direct, a["path"]))
        assert [a for a in commit if "protocol" in a] == [a for a in _commits(spark)[0] if "protocol" in a]
    else:
        ident = iceberg.identifier(direct)
        history = "SELECT operation, summary FROM {}.snapshots ORDER BY committed_at"
        snaps = writer.spark.sql(history.format(ident)).collect()
        # As the Spark path: the table's creation (an empty append), then one append.
        assert [s.operation for s in snaps] == [s.operation for s in writer.spark.sql(
            history.format(iceberg.identifier(spark))).collect()] == ["append", "append"]
        assert json.loads(snaps[-1].summary[iceberg_meta.SUMMARY_KEY]) == {"events": {"0": 59, "1": 129}}
        files = writer.spark.sql(f"SELECT file_path, partition FROM {ident}.files").collect()
        spark_parts = {r.partition for r in writer.spark.sql(f"SELECT partition FROM {iceberg.identifier(spark)}.files").collect()}
        assert {r.partition for r in files} == spark_parts
        for f in files:   # every column of every file carries its Iceberg field id
            schema = pq.read_schema(f.file_path)
            assert all(field.metadata and b"PARQUET:field_id" in field.metadata for field in schema)
    # The next job appends to the table the Spark path created, and the other way round.
    more = [_batch(tmp_path, "d", 1, range(130, 140))]
    assert _write(writer, spark, more, direct=True)
    assert _write(writer, direct, more, direct=False)
    assert _read(writer, direct) == _read(writer, spark)
    assert formats.recorded(writer.format, spark, KEYS) == {("events", 0): 59, ("events", 1): 139}


def test_statistics_skip_files_only_where_they_may(writer, tmp_path):
    path = _table(writer, "stats")
    for i in range(4):   # four commits of a partition, crossing days
        assert _write(writer, path, [_batch(tmp_path, f"s{i}", 2, range(i * 10 + 1, i * 10 + 11))], direct=True)
    df = _load(writer, path)
    for cond, expect in (("offset >= 20", 21), ("offset < 11", 10), ("offset = 30", 1),
                         (f"timestamp >= timestamp_millis({T0 + 25 * 3_600_000})", 15),
                         ("timestamp IS NULL", 4), (f"timestamp < timestamp_millis({T0 + 2 * 3_600_000})", 0),
                         ("value.id = 17", 1), ("value IS NULL", 5)):
        assert df.where(cond).count() == expect, cond
    if writer.format != "delta":
        return
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


def test_a_job_spark_must_write_is_not_direct(writer, tmp_path):
    path = _table(writer, "not-direct")
    good = _batch(tmp_path, "good", 0, range(0, 3))
    bad = _batch(tmp_path, "bad", 0, range(3, 6), values=[b'{"id": 1}', b'{"id": "x"}', b'{"id": 3}'])
    assert not _write(writer, path, [good, bad], direct=True)   # the good batch's files are removed
    assert _data_files(path) == set()


def test_an_iceberg_table_of_another_partition_spec_is_written_by_spark(writer, tmp_path):
    if writer.format != "iceberg":
        pytest.skip("Iceberg's partition specs")
    path = _table(writer, "bucketed")
    assert _write(writer, path, [_batch(tmp_path, "a", 0, range(1, 11))], direct=True)
    writer.spark.sql(f"ALTER TABLE {iceberg.identifier(path)} ADD PARTITION FIELD bucket(4, offset)")
    before = _data_files(path)
    assert not _write(writer, path, [_batch(tmp_path, "b", 0, range(11, 21))], direct=True)
    assert _data_files(path) == before
    assert _write(writer, path, [_batch(tmp_path, "b", 0, range(11, 21))], direct=False)
    assert _load(writer, path).count() == 20


def test_a_delta_table_with_a_check_constraint_is_written_by_spark(writer, tmp_path):
    if writer.format != "delta":
        pytest.skip("Delta's CHECK constraints")
    path = _table(writer, "checked")
    assert _write(writer, path, [_batch(tmp_path, "a", 0, range(1, 11))], direct=True)
    writer.spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT small CHECK (offset < 100)")
    before = _data_files(path)
    assert not _write(writer, path, [_batch(tmp_path, "b", 0, range(11, 21))], direct=True)
    assert _data_files(path) == before   # no file left behind
    with pytest.raises(Exception, match="(?i)check constraint"):
        _write(writer, path, [_batch(tmp_path, "c", 0, range(150, 160))], direct=False)


def test_delta_direct_commits_are_checkpointed_by_delta_rs_at_the_commit(writer, tmp_path):
    """The direct commits' checkpoints are delta-rs's, written right after the commit that lands
    on the interval (Delta's default, 10): no JVM, no thread, nothing to wait for; Spark reads
    the table through it."""
    if writer.format != "delta":
        pytest.skip("Delta's checkpoints")
    path = _table(writer, "checkpointed")
    for i in range(12):
        assert _write(writer, path, [_batch(tmp_path, f"k{i}", 0, range(i * 5, i * 5 + 5))], direct=True)
    assert {n for n in os.listdir(delta_state.log_dir(path)) if ".checkpoint." in n} == \
        {f"{10:020d}.checkpoint.parquet"}
    assert formats.recorded("delta", path, KEYS) == {("events", 0): 59}
    assert _load(writer, path).count() == 60
