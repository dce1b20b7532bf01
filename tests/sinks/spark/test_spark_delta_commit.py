"""The direct path's Delta commit written by Python (``delta.append_files``, ``delta_commit``,
``delta_log.read_state``): what Spark's Delta reads back from it (rows, history, its own txn
versions), each writer's commits on top of the other's and of the JVM's checkpoints, commits
racing from two processes, the offsets check, the tables it refuses (nothing written), and
the checkpoint cadence."""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from kdaemon.sinks.spark.tables import arrow_rows, delta, delta_commit, delta_log
from kdaemon.sinks.spark import staged
from testkit.spark import requires_spark

requires_spark()

T0 = 1_764_000_000_000   # 2025-11-24T16:00:00Z
PARTITION_BY = ["topic", "date"]


def _schema():
    """The rows' Spark schema, as ``SparkWriter`` gives ``append_files`` for a JSON value."""
    from pyspark.sql import types as T
    value = T.StructType([T.StructField("id", T.LongType()), T.StructField("kind", T.StringType()),
                          T.StructField("tags", T.ArrayType(T.IntegerType()))])
    return T.StructType([
        T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestamp_type", T.ByteType()), T.StructField("key", T.BinaryType()),
        T.StructField("value", value), T.StructField("headers", T.MapType(T.StringType(), T.BinaryType())),
        T.StructField("date", T.StringType())])


def _rows(directory, partition: int, offsets: range, topic: str = "t"):
    """One batch's rows as ``arrow_rows`` builds them (a day boundary inside, headers, nulls)."""
    n = len(offsets)
    path = os.path.join(str(directory), f"{topic}-{partition}-{offsets[0]}-{os.getpid()}.staged")
    values = [json.dumps({"id": o, "kind": f"k{o % 3}", "tags": [o, None]}).encode() if o % 7 else None
              for o in offsets]
    headers = [[("type", b"t%d" % (o % 2))] if o % 4 else [] for o in offsets]
    staged.write(path, topic, partition, list(offsets), [T0 + o * 3_600_000 for o in offsets], [0] * n,
                 [b"k%d" % o for o in offsets], values, headers)
    value_type = arrow_rows.value_arrow_type(_schema()["value"].dataType)
    rows = arrow_rows.job_rows(staged.read(path), "json", value_type)
    os.unlink(path)
    return rows


def _append(table: str, directory, batches: dict[tuple[str, int], range], partition_by=PARTITION_BY):
    """``append_files`` of one batch per (topic, partition), each recording its last offset."""
    pieces = [_rows(directory, p, offsets, topic) for (topic, p), offsets in batches.items()]
    return delta.append_files(pieces, table, partition_by, {k: r[-1] for k, r in batches.items()}, _schema())


def _commits(path: str) -> list[list[dict]]:
    d = delta_log.log_dir(path)
    names = sorted(n for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit())
    return [[json.loads(line) for line in open(os.path.join(d, n)) if line.strip()] for n in names]


def _data_files(path: str) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(path) if "_delta_log" not in d for f in files}


def _offsets_in_files(table: str) -> list[tuple[str, int, int]]:
    """Every (topic, partition, offset) of the files the log adds, read without Spark."""
    import pyarrow.parquet as pq
    out = []
    for commit in _commits(table):
        for a in commit:
            if "add" in a:
                t = pq.read_table(os.path.join(table, a["add"]["path"]), columns=["partition", "offset"])
                out += [(a["add"]["partitionValues"]["topic"], p, o)
                        for p, o in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist())]
    return sorted(out)


def _spark_df(spark, rows):
    return spark.createDataFrame(rows, schema=_schema())


def _jvm_txns(spark, table: str) -> dict[str, int]:
    """Delta's own view of the table's application versions (a fresh snapshot)."""
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
    snapshot = delta._updated_snapshot(spark, log)
    txns = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(snapshot.transactions())
    return {str(k): int(txns.get(k)) for k in txns.keySet()}


# -- with Spark's Delta ----------------------------------------------------------------------------

@pytest.mark.spark
def test_a_python_commit_is_what_spark_reads_with_its_history_and_txns(spark, tmp_path):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 30), ("t", 1): range(100, 120)}) == 0
    assert _append(table, tmp_path, {("t", 0): range(30, 40)}) == 1
    got = spark.read.format("delta").load(table)
    assert got.count() == 60
    assert sorted((r.partition, r.offset) for r in got.select("partition", "offset").collect()) == sorted(
        [(0, o) for o in range(40)] + [(1, o) for o in range(100, 120)])
    row = got.where("offset = 29").collect()[0].asDict(recursive=True)
    assert row["value"] == {"id": 29, "kind": "k2", "tags": [29, None]} and row["headers"] == {"type": b"t1"}
    assert row["date"] == "2025-11-25" and row["timestamp_type"] == 0 and row["key"] == b"k29"
    # The table's metadata and protocol are what Delta's own writer gives the same rows.
    twin = str(tmp_path / "twin")
    _spark_df(spark, _rows(tmp_path, 0, range(0, 2))).write.format("delta").partitionBy(*PARTITION_BY).save(twin)
    ours, theirs = (next(c for c in _commits(p)[0] if "metaData" in c)["metaData"] for p in (table, twin))
    assert json.loads(ours["schemaString"]) == json.loads(theirs["schemaString"])
    assert {k: v for k, v in ours.items() if k not in ("id", "createdTime", "schemaString")} == \
        {k: v for k, v in theirs.items() if k not in ("id", "createdTime", "schemaString")}
    assert [a for a in _commits(table)[0] if "protocol" in a] == [a for a in _commits(twin)[0] if "protocol" in a]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [(h.version, h.operation, h.operationParameters["mode"]) for h in history] == \
        [(0, "WRITE", "Append"), (1, "WRITE", "Append")]
    assert history[0].engineInfo == delta_commit.ENGINE_INFO and history[1].readVersion == 0
    assert history[0].isBlindAppend and history[0].operationMetrics["numOutputRows"] == "50"
    # Delta's own txn state agrees with ours, and its writer skips a recorded version.
    assert _jvm_txns(spark, table) == {"kdaemon:t:0": 39, "kdaemon:t:1": 119}
    assert delta.committed_offsets(table) == {("t", 0): 39, ("t", 1): 119}
    (_spark_df(spark, _rows(tmp_path, 1, range(119, 120))).write.format("delta").mode("append")
     .option("txnAppId", delta.app_id("t", 1)).option("txnVersion", 119).save(table))
    assert spark.read.format("delta").load(table).count() == 60 and len(_commits(table)) == 2


@pytest.mark.spark
def test_each_writer_commits_on_top_of_the_other_and_of_a_jvm_checkpoint(spark, tmp_path):
    table = str(tmp_path / "t")
    # Spark (the JVM's one-commit path) creates the table; Python appends; Spark again; a
    # checkpoint by the JVM; Python reads its state through it and appends again.
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 0, range(0, 10))), table, PARTITION_BY, {("t", 0): 9})
    assert _append(table, tmp_path, {("t", 0): range(10, 20), ("t", 1): range(0, 5)}) == 1
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 1, range(5, 10))), table, PARTITION_BY, {("t", 1): 9})
    delta.checkpoint(spark, table)
    assert os.path.exists(os.path.join(delta_log.log_dir(table), f"{2:020d}.checkpoint.parquet"))
    state = delta_log.read_state(table)
    assert (state.version, state.protocol) == (2, delta_commit.NEW_TABLE_PROTOCOL)
    assert state.metadata["partitionColumns"] == PARTITION_BY and state.metadata["configuration"] == {}
    assert _append(table, tmp_path, {("t", 0): range(20, 25)}) == 3
    assert delta.committed_offsets(table) == {("t", 0): 24, ("t", 1): 9} and _jvm_txns(spark, table) == \
        {"kdaemon:t:0": 24, "kdaemon:t:1": 9}
    got = sorted((r.partition, r.offset) for r in spark.read.format("delta").load(table).collect())
    assert got == [(0, o) for o in range(25)] + [(1, o) for o in range(10)]


@pytest.mark.spark
def test_commits_with_the_jvms_checkpoints_at_ten_and_twenty(spark, tmp_path):
    table = str(tmp_path / "t")
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 0, range(0, 3))), table, PARTITION_BY, {("t", 0): 2})
    due = []
    for v in range(1, 25):
        version = _append(table, tmp_path, {("t", v % 3): range(v * 3, v * 3 + 3)})
        assert version == v + (v > 20)
        if delta.checkpoint_due(table, version):
            due.append(version)
            if version == 20:   # as a checkpoint thread would: once the table has moved on
                assert _append(table, tmp_path, {("t", 7): range(500, 501)}) == 21
            delta.checkpoint(spark, table, version)
    assert due == [10, 20]
    names = os.listdir(delta_log.log_dir(table))
    assert {n for n in names if ".checkpoint." in n and not n.startswith(".")} == {f"{10:020d}.checkpoint.parquet", f"{20:020d}.checkpoint.parquet"}
    expected = {("t", p): max(v * 3 + 2 for v in range(25) if v % 3 == p) for p in range(3)}
    expected[("t", 7)] = 500
    assert delta.committed_offsets(table) == expected
    assert _jvm_txns(spark, table) == {delta.app_id(*k): v for k, v in expected.items()}
    assert spark.read.format("delta").load(table).count() == 76
    # Spark's own writer goes on at 26 (it would checkpoint at 30), Python after it.
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 0, range(75, 76))), table, PARTITION_BY, {("t", 0): 75})
    assert _append(table, tmp_path, {("t", 0): range(76, 77)}) == 27
    assert spark.read.format("delta").load(table).count() == 78


@pytest.mark.spark
def test_the_state_is_read_through_v2_and_multi_part_checkpoints(spark, tmp_path):
    for policy, part_size in (("v2", None), ("classic", "1")):
        table = str(tmp_path / policy)
        df = _spark_df(spark, _rows(tmp_path, 0, range(0, 3)))
        df.write.format("delta").partitionBy(*PARTITION_BY).option("txnAppId", delta.app_id("t", 0)) \
            .option("txnVersion", 2).option("delta.checkpointPolicy", policy).save(table)
        assert _append(table, tmp_path, {("t", 1): range(0, 3)}) == 1
        if part_size:
            spark.conf.set("spark.databricks.delta.checkpoint.partSize", part_size)
        try:
            delta.checkpoint(spark, table)
        finally:
            spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
        names = [n for n in os.listdir(delta_log.log_dir(table)) if ".checkpoint." in n and not n.startswith(".")]
        if policy == "v2":   # a UUID-named top-level file (its adds in sidecars)
            assert any(len(n.split(".")) == 4 for n in names), names
        else:   # parts of at most one action each (Delta groups them by file: two here)
            assert len(names) >= 2 and all(len(n.split(".")) == 5 for n in names), names
        assert _append(table, tmp_path, {("t", 0): range(3, 6)}) == 2
        state = delta_log.read_state(table)
        assert state.txns == {"kdaemon:t:0": 5, "kdaemon:t:1": 2} == _jvm_txns(spark, table)
        assert state.metadata["partitionColumns"] == PARTITION_BY
        assert spark.read.format("delta").load(table).count() == 9


@pytest.mark.spark
@pytest.mark.parametrize("change", ["check constraint", "column mapping", "other schema", "other partitioning"])
def test_a_table_the_python_commit_must_not_write_gets_none_and_no_file(spark, tmp_path, change):
    table = str(tmp_path / "t")
    first = _rows(tmp_path, 0, range(0, 5))
    if change == "other schema":
        _spark_df(spark, first).drop("headers").write.format("delta").partitionBy(*PARTITION_BY).save(table)
    elif change == "other partitioning":
        _spark_df(spark, first).write.format("delta").partitionBy("topic").save(table)
    else:
        assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
        spark.sql({"check constraint": f"ALTER TABLE delta.`{table}` ADD CONSTRAINT small CHECK (offset < 100)",
                   "column mapping": f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.minReaderVersion' = '2', "
                                     "'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')"}[change])
    before, commits = _data_files(table), len(_commits(table))
    assert delta_commit.refusal(delta_log.read_state(table), delta_commit.nullable(_schema().jsonValue()),
                                PARTITION_BY) is not None
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) is None
    assert _data_files(table) == before and len(_commits(table)) == commits


# -- without a JVM ---------------------------------------------------------------------------------

def test_a_job_behind_what_the_table_records_raises_concurrent_offsets_and_writes_nothing(tmp_path):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5), ("t", 1): range(0, 5)}) == 0
    before = _data_files(table)
    with pytest.raises(delta.ConcurrentOffsets, match=r"already records offset 4 of t\[1\]"):
        _append(table, tmp_path, {("t", 0): range(5, 10), ("t", 1): range(3, 5)})
    assert _data_files(table) == before and len(_commits(table)) == 1


def _stale_once(monkeypatch, table, between):
    """The next ``read_state`` of ``table`` returns the state, then ``between()`` runs (another
    writer's commit after this one's read): the commit that follows loses its version."""
    real = delta_log.read_state

    def read(path):
        state = real(path)
        monkeypatch.setattr(delta_log, "read_state", real)
        between()
        return state
    monkeypatch.setattr(delta_log, "read_state", read)


def test_a_lost_race_commits_at_the_next_version(tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
    _stale_once(monkeypatch, table, lambda: _append(table, tmp_path, {("t", 1): range(0, 5)}))
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) == 2
    commits = _commits(table)
    assert [[a["txn"]["appId"] for a in c if "txn" in a] for c in commits] == \
        [["kdaemon:t:0"], ["kdaemon:t:1"], ["kdaemon:t:0"]]
    assert commits[2][0]["commitInfo"]["readVersion"] == 1 and not any("metaData" in a for a in commits[2])
    assert len(_data_files(table)) == sum(1 for c in commits for a in c if "add" in a)   # no orphan


def test_a_lost_race_to_a_writer_of_the_same_partition_raises_and_removes_its_files(tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
    _stale_once(monkeypatch, table, lambda: _append(table, tmp_path, {("t", 0): range(5, 10)}))
    with pytest.raises(delta.ConcurrentOffsets, match=r"already records offset 9 of t\[0\]"):
        _append(table, tmp_path, {("t", 0): range(5, 10)})
    assert len(_commits(table)) == 2
    assert len(_data_files(table)) == sum(1 for c in _commits(table) for a in c if "add" in a)
    assert _offsets_in_files(table) == [("t", 0, o) for o in range(10)]


def test_a_table_changed_during_the_commit_so_it_is_refused_gets_none_and_its_files_removed(tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0

    def add_a_constraint():   # as ALTER TABLE ADD CONSTRAINT commits it: a new metaData
        meta = dict(delta_log.read_state(table).metadata, configuration={"delta.constraints.c": "offset < 3"})
        assert delta_commit.put_if_absent(delta_log.log_dir(table), 1, [
            {"commitInfo": {"operation": "ADD CONSTRAINT"}}, {"metaData": meta},
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 3}}])
    before = _data_files(table)
    _stale_once(monkeypatch, table, add_a_constraint)
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) is None
    assert _data_files(table) == before and len(_commits(table)) == 2


@pytest.mark.parametrize("protocol, configuration, refused", [
    ({"minReaderVersion": 1, "minWriterVersion": 2}, {}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 4}, {"delta.enableChangeDataFeed": "true"}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 2}, {"delta.appendOnly": "true"}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 3}, {"delta.constraints.c": "offset > 0"}, "CHECK constraints"),
    ({"minReaderVersion": 2, "minWriterVersion": 5}, {}, "writer version 5"),
    ({"minReaderVersion": 1, "minWriterVersion": 6}, {}, "writer version 6"),
    ({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors", "v2Checkpoint"],
      "writerFeatures": ["deletionVectors", "v2Checkpoint", "appendOnly", "invariants", "domainMetadata"]}, {}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly", "inCommitTimestamp"]}, {},
     "inCommitTimestamp"),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["rowTracking", "domainMetadata"]}, {},
     "rowTracking"),
    ({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["columnMapping"],
      "writerFeatures": ["columnMapping"]}, {}, "columnMapping"),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["identityColumns"]}, {}, "identityColumns"),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["someFutureFeature"]}, {}, "someFutureFeature"),
    ({"minReaderVersion": 4, "minWriterVersion": 8}, {}, "newer"),
])
def test_the_protocols_and_features_a_blind_append_accepts(protocol, configuration, refused):
    schema = delta_commit.nullable(_schema().jsonValue())
    state = delta_log.TableState(version=3, protocol=protocol, metadata={
        "format": {"provider": "parquet"}, "schemaString": json.dumps(schema), "partitionColumns": PARTITION_BY,
        "configuration": configuration})
    reason = delta_commit.refusal(state, schema, PARTITION_BY)
    assert (reason is None) if refused is None else (refused in reason), reason


def test_a_column_with_metadata_or_not_null_is_refused():
    schema = delta_commit.nullable(_schema().jsonValue())
    for change in ({"metadata": {"delta.generationExpression": "offset + 1"}}, {"nullable": False}):
        table = json.loads(json.dumps(schema))
        table["fields"][2].update(change)
        state = delta_log.TableState(version=0, protocol={"minReaderVersion": 1, "minWriterVersion": 4}, metadata={
            "format": {"provider": "parquet"}, "schemaString": json.dumps(table), "partitionColumns": PARTITION_BY,
            "configuration": {}})
        assert "schema" in delta_commit.refusal(state, schema, PARTITION_BY)
    # The rows' nested fields count as nullable as Spark's asNullable makes them.
    assert schema["fields"][6]["type"]["fields"][2]["type"]["containsNull"] is True
    assert schema["fields"][7]["type"]["valueContainsNull"] is True


def test_checkpoint_due_follows_the_tables_interval(tmp_path):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 2)}) == 0
    assert [v for v in range(0, 31) if delta.checkpoint_due(table, v)] == [10, 20, 30]
    meta = dict(delta_log.read_state(table).metadata, configuration={"delta.checkpointInterval": "4"})
    assert delta_commit.put_if_absent(delta_log.log_dir(table), 1, [{"metaData": meta}])
    delta._intervals.clear()
    assert [v for v in range(0, 13) if delta.checkpoint_due(table, v)] == [4, 8, 12]


ROUNDS = 25


def _racer(table: str, directory: str, partition: int, start, results) -> None:
    """One of two processes: each round, wait for the other, then commit a batch of its own
    partition and try the round's batch of the shared partition 9 (one of the two must win it)."""
    lost = 0
    real = delta_commit.put_if_absent

    def counting(*args):
        nonlocal lost
        won = real(*args)
        lost += not won
        return won
    delta_commit.put_if_absent = counting
    won_shared = []
    for r in range(ROUNDS):
        start.wait()
        assert _append(table, directory, {("t", partition): range(r * 4, r * 4 + 4)}) is not None
        try:
            if _append(table, directory, {("t", 9): range(r * 4, r * 4 + 4)}) is not None:
                won_shared.append(r)
        except delta.ConcurrentOffsets:
            pass
    results.put((partition, won_shared, lost))


def test_two_processes_committing_at_once_each_land_once(tmp_path):
    """Two creators of a new table, then rounds of commits racing for each version: every
    commit lands once, at its own version; each shared batch is in the table exactly once."""
    table = str(tmp_path / "t")
    ctx = multiprocessing.get_context("spawn")   # no JVM, no threads of the test process inherited
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(table, str(tmp_path), p, start, results)) for p in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0, p.exitcode
    outcome = sorted(results.get(timeout=5) for _ in procs)
    won = sorted(r for _, rounds, _ in outcome for r in rounds)
    assert won == list(range(ROUNDS))   # each round's shared batch: one winner, no second commit
    commits = _commits(table)
    assert len(commits) == 3 * ROUNDS
    assert sum(1 for c in commits for a in c if "metaData" in a) == 1   # one creator won version 0
    assert delta.committed_offsets(table) == {("t", 0): ROUNDS * 4 - 1, ("t", 1): ROUNDS * 4 - 1,
                                              ("t", 9): ROUNDS * 4 - 1}
    assert _offsets_in_files(table) == sorted(("t", p, o) for p in (0, 1, 9) for o in range(ROUNDS * 4))
    assert len(_data_files(table)) == sum(1 for c in commits for a in c if "add" in a)   # no orphan
    assert not [n for n in os.listdir(delta_log.log_dir(table)) if n.endswith(".tmp")]
    print("lost races:", [lost for _, _, lost in outcome])


def test_put_if_absent_never_replaces_a_commit(tmp_path):
    d = str(tmp_path / "_delta_log")
    assert delta_commit.put_if_absent(d, 0, [{"commitInfo": {"n": 1}}])
    assert not delta_commit.put_if_absent(d, 0, [{"commitInfo": {"n": 2}}])
    assert os.listdir(d) == [f"{0:020d}.json"]   # the temporary files are gone
    assert json.loads(open(os.path.join(d, f"{0:020d}.json")).read()) == {"commitInfo": {"n": 1}}
