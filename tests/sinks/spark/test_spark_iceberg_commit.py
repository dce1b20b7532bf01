"""The Iceberg direct path's own commits (``iceberg.append_files``, ``iceberg_commit.py``:
pyiceberg's metadata, a Hadoop-layout commit by ``os.link``) against real Iceberg on the JVM:
the table it creates is Spark's, Spark reads what it appends (rows, offsets, Java's metrics and
the file skipping they allow), each appends on top of the other's, manifests merge, and
concurrent writers (processes, no JVM) each land once; a table it must not write is left as
it was."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kdaemon.sinks.spark.tables import arrow_rows, iceberg, iceberg_catalog, iceberg_commit, iceberg_files, \
    iceberg_meta
from kdaemon.sinks.spark import staged
from testkit.spark import fresh_session, requires_spark

requires_spark()

from pyspark.sql import types as T   # noqa: E402  (after the skip)

T0 = 1_764_000_000_000   # 2025-11-24T16:00:00Z
VALUE = T.StructType([T.StructField("id", T.LongType()), T.StructField("kind", T.StringType()),
                      T.StructField("score", T.DoubleType()), T.StructField("tags", T.ArrayType(T.IntegerType())),
                      T.StructField("inner", T.StructType([T.StructField("a", T.BooleanType()),
                                                           T.StructField("b", T.ShortType())]))])
# The rows' schema as writer._direct_rows_types makes it for value_format = "json".
SCHEMA = T.StructType([
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
    T.StructField("timestamp_type", T.ByteType()), T.StructField("key", T.BinaryType()),
    T.StructField("value", VALUE), T.StructField("headers", T.MapType(T.StringType(), T.BinaryType())),
    T.StructField("date", T.StringType())])
PARTITION_BY = ["topic", "date"]


# -- batches and appends ---------------------------------------------------------------------------

def _batch(directory, partition: int, offsets: range, topic: str = "events") -> pa.Table:
    os.makedirs(directory, exist_ok=True)
    n = len(offsets)
    values = [json.dumps({"id": o, "kind": f"k{o % 3}" * (o % 9), "score": o / 4, "tags": [o, None],
                          "inner": {"a": o % 2 == 0, "b": o % 300}}).encode() if o % 7 else None for o in offsets]
    headers = [[("type", b"t%d" % (o % 2)), ("trace", None if o % 5 == 0 else b"x")] if o % 4 else [] for o in offsets]
    stamps = [-1 if o == offsets[0] else T0 + o * 3_600_000 for o in offsets]   # a day boundary, a null
    path = os.path.join(str(directory), f"{topic}-{partition}-{offsets[0]}-{offsets[-1]}.staged")
    staged.write(path, topic, partition, list(offsets), stamps, [0] * n,
                 [None if o % 3 == 0 else b"k%d" % o for o in offsets], values, headers)
    return staged.read(path)


def _versions(batches) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for b in batches:
        key = (b.column("topic")[0].as_py(), b.column("partition")[0].as_py())
        out[key] = max(out.get(key, -1), b.column("offset")[-1].as_py())
    return out


def _pieces(batches):
    return arrow_rows.each_batch_rows(batches, "json", arrow_rows.value_arrow_type(VALUE))


def _append(path: str, batches, partition_by=PARTITION_BY, schema=SCHEMA):
    return iceberg.append_files(_pieces(batches), path, list(partition_by), _versions(batches), schema)


def _expected(batches) -> list[dict]:
    rows = pa.concat_tables([arrow_rows.job_rows(b, "json", arrow_rows.value_arrow_type(VALUE)) for b in batches])
    return sorted((_plain(r) for r in rows.to_pylist()), key=lambda r: (r["topic"], r["partition"], r["offset"]))


def _plain(row: dict) -> dict:
    """A row without its timestamp (compared as microseconds apart), headers as a dict."""
    row = dict(row)
    ts = row.pop("timestamp")
    row["ts"] = None if ts is None else int(ts.timestamp() * 1_000_000) if hasattr(ts, "timestamp") else ts
    row["headers"] = dict(row["headers"]) if row["headers"] is not None else None
    return row


def _spark_rows(spark, path: str) -> list[dict]:
    from pyspark.sql import functions as F
    df = spark.read.format("iceberg").load(path)
    df = df.withColumn("timestamp", F.unix_micros("timestamp"))
    return sorted((_plain(r.asDict(recursive=True)) for r in df.collect()),
                  key=lambda r: (r["topic"], r["partition"], r["offset"]))


def _listing(path: str) -> set[tuple[str, int]]:
    return {(os.path.join(d, f), os.path.getsize(os.path.join(d, f))) for d, _, fs in os.walk(path) for f in fs}


def _metadata(path: str, version: int) -> dict:
    with open(os.path.join(iceberg_meta.metadata_dir(path), f"v{version}.metadata.json")) as fh:
        return json.load(fh)


def _data_paths(path: str) -> set[str]:
    return {os.path.join(d, f) for d, _, fs in os.walk(os.path.join(path, "data")) for f in fs if f.endswith(".parquet")}


def _read_without_jvm(path: str) -> pa.Table:
    from pyiceberg.table import StaticTable
    version = iceberg_meta.load_current(path)[0]
    return StaticTable.from_metadata(os.path.join(iceberg_meta.metadata_dir(path), f"v{version}.metadata.json")).scan().to_arrow()


# -- the JVM ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cat(tmp_path_factory):
    """A session whose Hadoop catalog ``kdaemon_iceberg`` is on this module's warehouse ``lake``
    (tables ``<lake>/db/<name>``); a session of its own, in the process's JVM with the jars."""
    from pyspark.sql import SparkSession
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    lake = tmp_path_factory.mktemp("lake")
    fresh_session()
    builder = SparkSession.builder
    for k, v in iceberg.session_conf(str(lake / "db" / "unused")).items():
        builder = builder.config(k, v)
    spark = (builder.master("local[1]").appName("kdaemon-tests-iceberg-commit")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    yield spark, lake
    spark.stop()
    fresh_session()


def _java_table(spark, path: str):
    ice = spark._jvm.org.apache.iceberg
    table = ice.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, iceberg.identifier(path))
    table.refresh()
    return table


def _java_metrics(spark, table, file_path: str) -> dict:
    """What Iceberg's Java ``ParquetUtil.fileMetrics`` reads from a data file's footer."""
    jvm = spark._jvm
    m = jvm.org.apache.iceberg.parquet.ParquetUtil.fileMetrics(table.io().newInputFile(file_path),
                                                               jvm.org.apache.iceberg.MetricsConfig.forTable(table))
    as_bytes = jvm.org.apache.iceberg.util.ByteBuffers.toByteArray
    return {"column_sizes": {int(k): int(v) for k, v in dict(m.columnSizes()).items()},
            "value_counts": {int(k): int(v) for k, v in dict(m.valueCounts()).items()},
            "null_value_counts": {int(k): int(v) for k, v in dict(m.nullValueCounts()).items()},
            "nan_value_counts": {int(k): int(v) for k, v in dict(m.nanValueCounts() or {}).items()},
            "lower_bounds": {int(k): bytes(as_bytes(v)) for k, v in dict(m.lowerBounds()).items()},
            "upper_bounds": {int(k): bytes(as_bytes(v)) for k, v in dict(m.upperBounds()).items()}}


def _planned(spark, table, column: str, low: int) -> set[str]:
    """The files Iceberg's own scan planning keeps for ``column > low`` (metrics pruning)."""
    expr = spark._jvm.org.apache.iceberg.expressions.Expressions.greaterThan(column, low)
    it = table.newScan().filter(expr).planFiles().iterator()
    out = set()
    while it.hasNext():
        out.add(str(it.next().file().location()))
    return out


@pytest.mark.spark
def test_the_created_table_is_the_one_spark_creates(cat, tmp_path):
    from pyiceberg.table.metadata import TableMetadataUtil
    spark, lake = cat
    by_spark, ours = str(lake / "db" / "made_by_spark"), str(lake / "db" / "made_here")
    iceberg._create_if_missing(spark, spark.createDataFrame([], SCHEMA), by_spark, PARTITION_BY)
    assert _append(ours, [_batch(tmp_path, 0, range(0, 5))]) == 2   # v1 the creation, v2 the append
    s_raw, o_raw = _metadata(by_spark, 1), _metadata(ours, 1)
    s_meta, o_meta = TableMetadataUtil.parse_obj(s_raw), TableMetadataUtil.parse_obj(o_raw)
    assert o_meta.format_version == s_meta.format_version == 2
    assert o_meta.schema() == s_meta.schema()   # ids included
    assert o_meta.spec() == s_meta.spec()
    assert o_meta.sort_order() == s_meta.sort_order()
    assert o_meta.properties == s_meta.properties
    assert (o_meta.last_column_id, o_meta.last_partition_id) == (s_meta.last_column_id, s_meta.last_partition_id)
    # Spark's create is a CTAS of no rows: one empty append.
    for raw in (s_raw, o_raw):
        (snap,) = raw["snapshots"]
        assert snap["summary"]["operation"] == "append" and snap["summary"]["total-records"] == "0"
    assert spark.table(iceberg.identifier(ours)).schema == spark.table(iceberg.identifier(by_spark)).schema


@pytest.mark.spark
def test_appends_read_back_with_offsets_metrics_and_file_skipping(cat, tmp_path):
    spark, lake = cat
    path = str(lake / "db" / "appended")
    jobs = [[_batch(tmp_path, 0, range(0, 40)), _batch(tmp_path, 1, range(100, 130))],
            [_batch(tmp_path, 0, range(40, 60))], [_batch(tmp_path, 2, range(7, 40), topic="other")]]
    for n, job in enumerate(jobs):
        assert _append(path, job) == n + 2
    everything = [b for job in jobs for b in job]
    assert _spark_rows(spark, path) == _expected(everything)
    assert iceberg_meta.committed_offsets(path) == {("events", 0): 59, ("events", 1): 129, ("other", 2): 39}
    snaps = spark.sql(f"SELECT operation, summary FROM {iceberg.identifier(path)}.snapshots ORDER BY committed_at").collect()
    assert [s.operation for s in snaps] == ["append"] * 4
    assert json.loads(snaps[2].summary[iceberg_meta.SUMMARY_KEY]) == {"events": {"0": 59, "1": 129}}
    assert snaps[-1].summary["total-records"] == str(len(_expected(everything)))

    table = _java_table(spark, path)
    files = spark.sql(f"SELECT file_path, record_count, column_sizes, value_counts, null_value_counts, "
                      f"nan_value_counts, lower_bounds, upper_bounds FROM {iceberg.identifier(path)}.files").collect()
    assert len(files) > len(jobs)   # the batches cross days: several files a job
    for f in files:   # the metrics are Java's, exactly
        ours = {k: {int(i): (bytes(v) if isinstance(v, (bytes, bytearray)) else v) for i, v in (getattr(f, k) or {}).items()}
                for k in ("column_sizes", "value_counts", "null_value_counts", "nan_value_counts",
                          "lower_bounds", "upper_bounds")}
        assert ours == _java_metrics(spark, table, f.file_path), f.file_path
        assert f.record_count == pq.read_metadata(f.file_path).num_rows
    # Iceberg keeps exactly the files whose offsets reach past the bound, and Spark's answer is right.
    top = {f.file_path: max(pq.read_table(f.file_path, columns=["offset"]).column("offset").to_pylist()) for f in files}
    df = spark.read.format("iceberg").load(path)
    for low in (-1, 20, 39, 59, 120, 129):
        assert _planned(spark, table, "offset", low) == {p for p, m in top.items() if m > low}, low
        assert df.where(f"offset > {low}").count() == sum(1 for r in _expected(everything) if r["offset"] > low)
    expected = _expected(everything)
    assert df.where("value.id = 17").count() == sum(1 for r in expected if r["value"] and r["value"]["id"] == 17) == 2
    assert df.where("value IS NULL").count() == sum(1 for r in expected if r["value"] is None)


@pytest.mark.spark
def test_spark_and_the_direct_path_append_on_each_other(cat, tmp_path):
    spark, lake = cat
    path = str(lake / "db" / "both")
    ident = iceberg.identifier(path)
    value_type = arrow_rows.value_arrow_type(VALUE)

    def spark_append(batches):
        rows = pa.concat_tables([arrow_rows.job_rows(b, "json", value_type) for b in batches]).to_pylist()
        for r in rows:
            r["headers"] = dict(r["headers"])
        iceberg.append(spark, spark.createDataFrame(rows, SCHEMA), path, PARTITION_BY, _versions(batches))

    first, second, third, fourth = ([_batch(tmp_path, 0, range(i * 10, i * 10 + 10))] for i in range(4))
    spark_append(first)                  # Spark creates the table
    assert _append(path, second) == 4    # v1 Spark's create, v2 its append, v3 the offsets' properties
    spark_append(third)
    assert iceberg_meta.committed_offsets(path) == {("events", 0): 29}
    spark.sql(f"CALL {iceberg.CATALOG}.system.rewrite_data_files(table => 'db.both', options => map('min-input-files', '2'))")
    spark.sql(f"CALL {iceberg.CATALOG}.system.expire_snapshots(table => 'db.both', "
              f"older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    assert spark.sql(f"SELECT count(*) FROM {ident}.snapshots").first()[0] == 1
    # Compaction's snapshot records no offsets and expiry left it alone; the table properties
    # both writers set (the Spark path's in a commit after its append) came through.
    assert iceberg_meta.SUMMARY_KEY not in iceberg_meta.current_metadata(path)["snapshots"][0]["summary"]
    assert iceberg_meta.committed_offsets(path) == {("events", 0): 29}
    version = _append(path, fourth)
    assert version is not None
    assert _spark_rows(spark, path) == _expected(first + second + third + fourth)
    assert iceberg_meta.committed_offsets(path)[("events", 0)] == 39
    spark_append([_batch(tmp_path, 1, range(0, 3))])   # and Spark after ours again
    assert spark.read.format("iceberg").load(path).count() == 43


@pytest.mark.spark
def test_a_hundred_and_five_appends_merge_their_manifests(cat, tmp_path):
    from pyiceberg.io.pyarrow import PyArrowFileIO
    spark, lake = cat
    path = str(lake / "db" / "many")
    counts = []
    for i in range(105):
        assert _append(path, [_batch(tmp_path / str(i), i % 3, range(i * 2, i * 2 + 2))]) is not None
        meta = iceberg_commit.load(path).metadata
        counts.append(len(meta.current_snapshot().manifests(PyArrowFileIO())))
    assert max(counts) <= 100 and counts[-1] < 10, counts   # Java's default: 100 manifests, then one
    assert spark.read.format("iceberg").load(path).count() == 210
    assert spark.sql(f"SELECT count(*) FROM {iceberg.identifier(path)}.manifests").first()[0] == counts[-1]
    assert iceberg_meta.committed_offsets(path) == {("events", 0): 205, ("events", 1): 207, ("events", 2): 209}
    # Java's metadata log keeps the newest write.metadata.previous-versions-max (100) versions.
    log = _metadata(path, 106)["metadata-log"]
    assert len(log) == 100 and log[-1]["metadata-file"].endswith("/metadata/v105.metadata.json")


# -- without a JVM ---------------------------------------------------------------------------------

def test_a_lost_race_is_built_again_on_the_winners_metadata(tmp_path, monkeypatch):
    """Another uploader commits another partition between our read and our link: we commit
    next, on top of it, with both partitions' offsets."""
    path = str(tmp_path / "db" / "race")
    assert _append(path, [_batch(tmp_path, 0, range(0, 5))]) == 2
    real, calls = iceberg_files.data_files, []

    def data_files(meta, files):
        calls.append(len(files))
        if len(calls) == 1:   # as if the other uploader committed now
            monkeypatch.setattr(iceberg_files, "data_files", real)
            assert _append(path, [_batch(tmp_path, 1, range(0, 3))]) == 3
            monkeypatch.setattr(iceberg_files, "data_files", data_files)
        return real(meta, files)

    monkeypatch.setattr(iceberg_files, "data_files", data_files)
    assert _append(path, [_batch(tmp_path, 0, range(5, 9))]) == 4
    assert len(calls) == 2
    assert iceberg_meta.committed_offsets(path) == {("events", 0): 8, ("events", 1): 2}
    meta = _metadata(path, 4)
    assert len(meta["snapshots"]) == 4
    assert sorted(_read_without_jvm(path).column("offset").to_pylist()) == sorted([*range(9), *range(3)])
    _no_strays(path)


def test_a_race_lost_at_the_link_is_built_again_not_retried_by_pyiceberg(tmp_path, monkeypatch):
    """The other uploader's version appears between our catalog's read and its link: pyiceberg's
    Transaction would apply our staged updates (the offsets we read) to the winner's metadata;
    the catalog refuses that base, and the append is built again on it, both partitions'
    offsets in the summary and the properties."""
    path = str(tmp_path / "db" / "link")
    assert _append(path, [_batch(tmp_path, 0, range(0, 5))]) == 2
    real_link, real_files, built = iceberg_catalog.create_if_absent, iceberg_files.data_files, []

    def create_if_absent(directory, name, data):
        monkeypatch.setattr(iceberg_catalog, "create_if_absent", real_link)
        assert _append(path, [_batch(tmp_path, 1, range(0, 3))]) == 3   # the winner
        return real_link(directory, name, data)

    def data_files(meta, files):
        built.append(len(files))
        return real_files(meta, files)

    monkeypatch.setattr(iceberg_catalog, "create_if_absent", create_if_absent)
    monkeypatch.setattr(iceberg_files, "data_files", data_files)
    assert _append(path, [_batch(tmp_path, 0, range(5, 9))]) == 4
    assert len(built) == 3   # ours, the winner's, ours again
    raw = _metadata(path, 4)
    assert json.loads(raw["snapshots"][-1]["summary"][iceberg_meta.SUMMARY_KEY]) == {"events": {"0": 8, "1": 2}}
    assert {k: v for k, v in raw["properties"].items() if k.startswith(iceberg_meta.PROPERTY_PREFIX)} == \
        {iceberg_meta.property_key("events", 0): "8", iceberg_meta.property_key("events", 1): "2"}
    assert sorted(_read_without_jvm(path).column("offset").to_pylist()) == sorted([*range(9), *range(3)])
    _no_strays(path)


def test_a_commit_of_our_own_partition_meanwhile_is_an_error(tmp_path, monkeypatch):
    """The partition lock did not hold: rather than rows twice, an error, and our files go."""
    path = str(tmp_path / "db" / "unlocked")
    assert _append(path, [_batch(tmp_path, 0, range(0, 5))]) == 2
    real = iceberg_files.data_files

    def data_files(meta, files):
        monkeypatch.setattr(iceberg_files, "data_files", real)
        assert _append(path, [_batch(tmp_path / "other", 0, range(5, 8))]) == 3
        return real(meta, files)

    monkeypatch.setattr(iceberg_files, "data_files", data_files)
    with pytest.raises(iceberg_commit.IcebergCommitError, match="flock"):
        _append(path, [_batch(tmp_path, 0, range(5, 9))])
    assert iceberg_meta.load_current(path)[0] == 3
    assert sorted(_read_without_jvm(path).column("offset").to_pylist()) == list(range(8))
    _no_strays(path)


def _no_strays(path: str) -> None:
    """Every data file, manifest and manifest list is referenced by the table; no temp file."""
    from pyiceberg.table.metadata import TableMetadataUtil
    from pyiceberg.io.pyarrow import PyArrowFileIO
    io = PyArrowFileIO()
    meta = TableMetadataUtil.parse_obj(iceberg_meta.current_metadata(path))
    lists = {s.manifest_list for s in meta.snapshots}
    manifests = {m.manifest_path for s in meta.snapshots for m in s.manifests(io)}
    data = {e.data_file.file_path for s in meta.snapshots for m in s.manifests(io) for e in m.fetch_manifest_entry(io)}
    d = iceberg_meta.metadata_dir(path)
    on_disk = {os.path.join(d, n) for n in os.listdir(d) if n.endswith(".avro")}
    assert on_disk == lists | manifests
    assert not [n for n in os.listdir(d) if n.startswith(".kdaemon-")]
    assert _data_paths(path) == data


def _appender(path: str, staging: str, partition: int, jobs: int, start) -> None:
    start.wait()
    for i in range(jobs):
        batch = _batch(os.path.join(staging, f"p{partition}-{i}"), partition, range(i * 10, i * 10 + 10))
        assert _append(path, [batch]) is not None


def _run_at_once(target, args_list) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(args_list))
    procs = [ctx.Process(target=target, args=(*args, start)) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_two_processes_append_at_once_and_each_append_lands_once(tmp_path):
    path = str(tmp_path / "db" / "shared")
    jobs = 12
    _run_at_once(_appender, [(path, str(tmp_path / "a"), 0, jobs), (path, str(tmp_path / "b"), 1, jobs)])
    meta = iceberg_meta.current_metadata(path)
    assert len(meta["snapshots"]) == 1 + 2 * jobs   # both raced to create the table too: one creation
    assert iceberg_meta.committed_offsets(path) == {("events", 0): jobs * 10 - 1, ("events", 1): jobs * 10 - 1}
    recorded = [json.loads(s["summary"][iceberg_meta.SUMMARY_KEY])["events"] for s in meta["snapshots"]
                if iceberg_meta.SUMMARY_KEY in s["summary"]]
    for p in ("0", "1"):   # each append's offset is recorded by its snapshot, and never lost after it
        mine = [r[p] for r in recorded if p in r]
        assert mine == sorted(mine) and set(mine) == {i * 10 + 9 for i in range(jobs)}
    rows = _read_without_jvm(path)
    for p in (0, 1):
        offsets = [o for o, q in zip(rows.column("offset").to_pylist(), rows.column("partition").to_pylist()) if q == p]
        assert sorted(offsets) == list(range(jobs * 10))
    _no_strays(path)


def test_two_creators_one_table(tmp_path):
    """The loser of the creation's race removes its files and writes into the winner's table."""
    path = str(tmp_path / "db" / "created")
    schema = iceberg.iceberg_schema(SCHEMA)
    assert iceberg_commit.create(path, schema, PARTITION_BY)
    v1 = _metadata(path, 1)
    assert not iceberg_commit.create(path, iceberg.iceberg_schema(SCHEMA), PARTITION_BY)
    assert _metadata(path, 1) == v1
    _no_strays(path)
    _run_at_once(_appender, [(str(tmp_path / "db" / "raced"), str(tmp_path / n), p, 1) for p, n in ((0, "a"), (1, "b"))])
    raced = str(tmp_path / "db" / "raced")
    assert iceberg_meta.load_current(raced)[0] == 3
    assert len(_read_without_jvm(raced)) == 20
    _no_strays(raced)


def _edit(path: str, change) -> None:
    """A new version of the table's metadata, ``change``d (as another writer's commit)."""
    version, _, raw = iceberg_meta.load_current(path)
    change(raw)
    with open(os.path.join(iceberg_meta.metadata_dir(path), f"v{version + 1}.metadata.json"), "w") as fh:
        json.dump(raw, fh)


def _field(raw, name):
    return next(f for f in raw["schemas"][0]["fields"] if f["name"] == name)


_REFUSED = {
    "another type": lambda m: _field(m, "offset").update(type="int"),
    "a required column": lambda m: _field(m, "topic").update(required=True),
    "another partition spec": lambda m: m["partition-specs"][0]["fields"].pop(),
    "a bucket partition": lambda m: m["partition-specs"][0]["fields"][1].update(transform="bucket[4]"),
    "a sort order": lambda m: (m["sort-orders"].append({"order-id": 1, "fields": [
        {"transform": "identity", "source-id": 3, "direction": "asc", "null-order": "nulls-first"}]}),
        m.update({"default-sort-order-id": 1})),
    "write.data.path": lambda m: m["properties"].update({"write.data.path": "/elsewhere"}),
    "object storage": lambda m: m["properties"].update({"write.object-storage.enabled": "true"}),
    "gzip metadata": lambda m: m["properties"].update({"write.metadata.compression-codec": "gzip"}),
    "ORC": lambda m: m["properties"].update({"write.format.default": "orc"}),
    "another location": lambda m: m.update(location="/elsewhere/db/t"),
    "format version 3": lambda m: m.update({"format-version": 3, "next-row-id": 0}),
}


@pytest.mark.parametrize("case", sorted(_REFUSED))
def test_a_table_the_direct_path_must_not_write_is_left_as_it_was(tmp_path, case):
    path = str(tmp_path / "db" / "refused")
    assert _append(path, [_batch(tmp_path, 0, range(0, 5))]) == 2
    _edit(path, _REFUSED[case])
    before = _listing(path)
    assert _append(path, [_batch(tmp_path, 0, range(5, 9))]) is None
    assert _listing(path) == before


def test_rows_of_a_type_it_does_not_convert_create_nothing(tmp_path):
    path = str(tmp_path / "db" / "interval")
    schema = T.StructType(SCHEMA.fields + [T.StructField("span", T.DayTimeIntervalType())])
    assert _append(path, [_batch(tmp_path, 0, range(0, 5))], schema=schema) is None
    assert not os.path.exists(path)


def test_the_partition_by_of_the_rows_must_be_the_tables(tmp_path):
    path = str(tmp_path / "db" / "by_topic")
    assert _append(path, [_batch(tmp_path, 0, range(0, 5))], partition_by=["topic"]) == 2
    before = _listing(path)
    assert _append(path, [_batch(tmp_path, 0, range(5, 9))]) is None
    assert _listing(path) == before
    shutil.rmtree(path)
