"""The direct path's Delta commit through delta-rs (``delta.append_files``, ``delta_commit``,
``delta_state``): what Spark's Delta reads back from it (rows, history, its own txn versions),
each writer's commits on top of the other's (Spark, then delta-rs, then Spark) and of either's
checkpoints, a table earlier kdaemon versions wrote going on without a gap, races lost to real
concurrent commits (in this process and from two processes), the offsets check, the tables it
refuses (nothing written), checkpoints, and the versions renewed on a table whose
transactions expire."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
import urllib.parse
import uuid

import pytest

from kdaemon.sinks.spark import staged
from kdaemon.sinks.spark.tables import arrow_rows, delta, delta_commit, delta_files, delta_state, layout
from testkit.spark import requires_spark

requires_spark()

T0 = 1_764_000_000_000   # 2025-11-24T16:00:00Z
PARTITION_BY = ["topic", "date"]


def _schema():
    """The rows' Spark schema, as ``SparkWriter`` gives ``append_files`` for a JSON value."""
    from pyspark.sql import types as T
    value = T.StructType([T.StructField("id", T.LongType()), T.StructField("kind", T.StringType()),
                          T.StructField("tags", T.ArrayType(T.IntegerType()))])
    return arrow_rows.rows_schema(value)


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
    d = delta_state.log_dir(path)
    names = sorted(n for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit())
    return [[json.loads(line) for line in open(os.path.join(d, n)) if line.strip()] for n in names]


def _checkpoints(path: str) -> set[int]:
    return {int(n[:20]) for n in os.listdir(delta_state.log_dir(path)) if ".checkpoint." in n and n[:20].isdigit()}


def _data_files(path: str) -> set[str]:
    return {os.path.join(d, f) for d, _, files in os.walk(path)
            if "_delta_log" not in d and "_kdaemon" not in d for f in files}


def _offsets_in_table(table: str) -> list[tuple[str, int, int]]:
    """Every (topic, partition, offset) of the table, read by delta-rs (no JVM)."""
    from deltalake import DeltaTable
    t = DeltaTable(table).to_pyarrow_table(columns=["topic", "partition", "offset"])
    return sorted(zip(t.column("topic").to_pylist(), t.column("partition").to_pylist(), t.column("offset").to_pylist()))


def _spark_df(spark, rows):
    return spark.createDataFrame(rows, schema=_schema())


def _jvm_snapshot(spark, table: str):
    log = spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table)
    none = spark._jvm.scala.Option.empty()
    return log, log.update(False, none, none)


def _jvm_txns(spark, table: str) -> dict[str, int]:
    """Delta's own view of the table's application versions (a fresh snapshot)."""
    _, snapshot = _jvm_snapshot(spark, table)
    txns = spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(snapshot.transactions())
    return {str(k): int(txns.get(k)) for k in txns.keySet()}


def _jvm_checkpoint(spark, table: str) -> None:
    """Delta's own checkpoint of the table's newest version, as Spark's writer makes one."""
    log, snapshot = _jvm_snapshot(spark, table)
    log.checkpoint(snapshot, spark._jvm.scala.Option.empty())


KEYS = [("t", p) for p in range(10)]


# -- with Spark's Delta ----------------------------------------------------------------------------

@pytest.mark.spark
def test_a_direct_commit_is_what_spark_reads_with_its_history_and_txns(spark, tmp_path):
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
    # The table's schema, partitioning, properties and protocol are what Delta's own writer
    # gives the same rows.
    twin = str(tmp_path / "twin")
    _spark_df(spark, _rows(tmp_path, 0, range(0, 2))).write.format("delta").partitionBy(*PARTITION_BY).save(twin)
    ours, theirs = (next(c for c in _commits(p)[0] if "metaData" in c)["metaData"] for p in (table, twin))
    assert json.loads(ours["schemaString"]) == json.loads(theirs["schemaString"])
    for key in ("format", "partitionColumns"):
        assert ours[key] == theirs[key], key
    assert (ours.get("configuration") or {}) == (theirs.get("configuration") or {}) == {}
    assert [a for a in _commits(table)[0] if "protocol" in a] == [a for a in _commits(twin)[0] if "protocol" in a]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [(h.version, h.operation) for h in history] == [(0, "CREATE TABLE"), (1, "WRITE")]
    assert history[1].operationParameters["mode"] == "Append" and history[0].engineInfo.startswith("delta-rs")
    # Delta's own txn state agrees with ours, and its writer skips a recorded version.
    assert _jvm_txns(spark, table) == {"kdaemon:t:0": 39, "kdaemon:t:1": 119}
    assert delta.committed_offsets(table, KEYS) == {("t", 0): 39, ("t", 1): 119}
    (_spark_df(spark, _rows(tmp_path, 1, range(119, 120))).write.format("delta").mode("append")
     .option("txnAppId", delta.app_id("t", 1)).option("txnVersion", 119).save(table))
    assert spark.read.format("delta").load(table).count() == 60 and len(_commits(table)) == 2


@pytest.mark.spark
def test_each_writer_commits_on_top_of_the_other_and_of_either_checkpoint(spark, tmp_path):
    table = str(tmp_path / "t")
    # Spark (the JVM's one-commit path) creates the table; delta-rs appends; Spark again; a
    # checkpoint by the JVM; delta-rs reads its state through it and appends again; then
    # delta-rs checkpoints at 10 and Spark's writer goes on from that checkpoint.
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 0, range(0, 10))), table, PARTITION_BY, {("t", 0): 9})
    assert _append(table, tmp_path, {("t", 0): range(10, 20), ("t", 1): range(0, 5)}) == 1
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 1, range(5, 10))), table, PARTITION_BY, {("t", 1): 9})
    _jvm_checkpoint(spark, table)
    assert _checkpoints(table) == {2}
    assert _append(table, tmp_path, {("t", 0): range(20, 25)}) == 3
    assert delta.committed_offsets(table, KEYS) == {("t", 0): 24, ("t", 1): 9} and _jvm_txns(spark, table) == \
        {"kdaemon:t:0": 24, "kdaemon:t:1": 9}
    for v in range(4, 11):
        assert _append(table, tmp_path, {("t", 2): range(v * 2, v * 2 + 2)}) == v
    assert _checkpoints(table) == {2, 10}   # delta-rs's, at Delta's default interval
    delta.append(spark, _spark_df(spark, _rows(tmp_path, 2, range(22, 25))), table, PARTITION_BY, {("t", 2): 24})
    assert _append(table, tmp_path, {("t", 1): range(10, 12)}) == 12
    assert _jvm_txns(spark, table) == {"kdaemon:t:0": 24, "kdaemon:t:1": 11, "kdaemon:t:2": 24}
    got = sorted((r.partition, r.offset) for r in spark.read.format("delta").load(table).collect())
    assert got == [(0, o) for o in range(25)] + [(1, o) for o in range(12)] + [(2, o) for o in range(8, 25)]


@pytest.mark.spark
def test_a_table_earlier_kdaemon_versions_wrote_goes_on_without_a_gap(spark, tmp_path):
    """A table whose commits kdaemon wrote itself before delta-rs (``_hand_written``: the same
    log lines, a percent-escaped partition directory among them) and Spark read, then
    checkpointed by Spark: delta-rs reads its versions and appends on top."""
    table = str(tmp_path / "t")
    _hand_written(table, tmp_path, 0, {("t", 0): range(0, 10), ("a b", 1): range(0, 4)}, new=True)
    _hand_written(table, tmp_path, 1, {("t", 0): range(10, 15)})
    assert spark.read.format("delta").load(table).count() == 19
    assert delta.committed_offsets(table, [("t", 0), ("a b", 1)]) == {("t", 0): 14, ("a b", 1): 3}
    with pytest.raises(delta.ConcurrentOffsets):   # the old versions count
        _append(table, tmp_path, {("a b", 1): range(2, 4)})
    assert _append(table, tmp_path, {("t", 0): range(15, 20), ("a b", 1): range(4, 6)}) == 2
    _jvm_checkpoint(spark, table)
    assert _append(table, tmp_path, {("t", 0): range(20, 22)}) == 3
    assert _jvm_txns(spark, table) == {"kdaemon:t:0": 21, "kdaemon:a b:1": 5}
    got = sorted((r.topic, r.partition, r.offset) for r in spark.read.format("delta").load(table).collect())
    assert got == sorted([("t", 0, o) for o in range(22)] + [("a b", 1, o) for o in range(6)])


@pytest.mark.spark
def test_the_versions_are_read_through_v2_and_multi_part_checkpoints(spark, tmp_path):
    for policy, part_size in (("v2", None), ("classic", "1")):
        table = str(tmp_path / policy)
        df = _spark_df(spark, _rows(tmp_path, 0, range(0, 3)))
        df.write.format("delta").partitionBy(*PARTITION_BY).option("txnAppId", delta.app_id("t", 0)) \
            .option("txnVersion", 2).option("delta.checkpointPolicy", policy).save(table)
        assert _append(table, tmp_path, {("t", 1): range(0, 3)}) == 1
        if part_size:
            spark.conf.set("spark.databricks.delta.checkpoint.partSize", part_size)
        try:
            _jvm_checkpoint(spark, table)
        finally:
            spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
        names = [n for n in os.listdir(delta_state.log_dir(table)) if ".checkpoint." in n and not n.startswith(".")]
        if policy == "v2":   # a UUID-named top-level file (its adds in sidecars)
            assert any(len(n.split(".")) == 4 for n in names), names
        else:   # parts of at most one action each (Delta groups them by file: two here)
            assert len(names) >= 2 and all(len(n.split(".")) == 5 for n in names), names
        delta_state.forget(table)   # read anew: from the checkpoint, not from a kept snapshot
        assert _append(table, tmp_path, {("t", 0): range(3, 6)}) == 2
        assert delta.committed_offsets(table, KEYS) == {("t", 0): 5, ("t", 1): 2}
        assert _jvm_txns(spark, table) == {"kdaemon:t:0": 5, "kdaemon:t:1": 2}
        assert spark.read.format("delta").load(table).count() == 9


@pytest.mark.spark
@pytest.mark.parametrize("change", ["check constraint", "column mapping", "other schema", "other partitioning",
                                    "row tracking"])
def test_a_table_the_direct_commit_must_not_write_gets_none_and_no_file(spark, tmp_path, change):
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
                                     "'delta.minWriterVersion' = '5', 'delta.columnMapping.mode' = 'name')",
                   "row tracking": f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES "
                                   "('delta.enableRowTracking' = 'true')"}[change])
    before, commits = _data_files(table), len(_commits(table))
    reason = delta_commit.refusal(delta_state.open_table(table), delta_commit.nullable(_schema().jsonValue()),
                                  PARTITION_BY)
    assert reason is not None
    if change == "row tracking":   # a writer feature the append does not honour, named
        assert "rowTracking" in reason, reason
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) is None
    assert _data_files(table) == before and len(_commits(table)) == commits


# -- without a JVM ---------------------------------------------------------------------------------

def _hand_written(table: str, directory, version: int, batches: dict[tuple[str, int], range], new: bool = False):
    """A commit as kdaemon wrote it before delta-rs (its ``delta_commit.append_actions`` and
    ``put_if_absent``): commitInfo, for a new table metaData and protocol (1, 2), a ``txn`` per
    partition, an ``add`` per file with the path percent-encoded as Hadoop's ``Path.toUri``."""
    pieces = [_rows(directory, p, offsets, topic) for (topic, p), offsets in batches.items()]
    adds = delta_files.write_files(pieces, table, PARTITION_BY)
    now = int(time.time() * 1000)
    actions: list[dict] = [{"commitInfo": {
        "timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append", "partitionBy": json.dumps(
            PARTITION_BY, separators=(",", ":"))}, **({} if new else {"readVersion": version - 1}),
        "isolationLevel": "Serializable", "isBlindAppend": True, "engineInfo": "kdaemon/0.9 (Python Delta commit)",
        "txnId": str(uuid.uuid4())}}]
    if new:
        actions += [{"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
                                  "schemaString": json.dumps(delta_commit.nullable(_schema().jsonValue()),
                                                             separators=(",", ":")),
                                  "partitionColumns": PARTITION_BY, "configuration": {}, "createdTime": now}},
                    {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}]
    actions += [{"txn": {"appId": delta.app_id(*key), "version": r[-1], "lastUpdated": now}}
                for key, r in sorted(batches.items())]
    actions += [{"add": {"path": urllib.parse.quote(a.path, safe="/!$&'()*+,;=:@"), "partitionValues": a.partition_values,
                         "size": a.size, "modificationTime": a.modification_time, "dataChange": True,
                         "stats": a.stats}} for a in adds]
    data = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
    assert layout.create_if_absent(delta_state.log_dir(table), f"{version:020d}.json", data)


def test_a_job_behind_what_the_table_records_raises_concurrent_offsets_and_writes_nothing(tmp_path):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5), ("t", 1): range(0, 5)}) == 0
    before = _data_files(table)
    with pytest.raises(delta.ConcurrentOffsets, match=r"already records offset 4 of t\[1\]"):
        _append(table, tmp_path, {("t", 0): range(5, 10), ("t", 1): range(3, 5)})
    assert _data_files(table) == before and len(_commits(table)) == 1


def _stale_once(monkeypatch, between):
    """The next ``open_table`` gives a snapshot of its own, then ``between()`` runs (another
    writer's real commit after this one's read): the commit that follows finds the table moved
    on since its snapshot."""
    real = delta_state.open_table

    def opened(path):
        monkeypatch.setattr(delta_state, "open_table", real)
        from deltalake import DeltaTable
        snapshot = DeltaTable(path) if real(path) is not None else None
        between()
        return snapshot
    monkeypatch.setattr(delta_state, "open_table", opened)


def test_a_race_lost_to_another_partitions_commit_commits_at_the_next_version(tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
    _stale_once(monkeypatch, lambda: _append(table, tmp_path, {("t", 1): range(0, 5)}))
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) == 2
    commits = _commits(table)
    assert [[a["txn"]["appId"] for a in c if "txn" in a] for c in commits] == \
        [["kdaemon:t:0"], ["kdaemon:t:1"], ["kdaemon:t:0"]]
    assert not any("metaData" in a for a in commits[2])
    assert len(_data_files(table)) == sum(1 for c in commits for a in c if "add" in a)   # no orphan
    assert _offsets_in_table(table) == sorted([("t", 0, o) for o in range(10)] + [("t", 1, o) for o in range(5)])


def test_a_race_lost_to_a_writer_of_the_same_partition_raises_and_removes_its_files(tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
    _stale_once(monkeypatch, lambda: _append(table, tmp_path, {("t", 0): range(5, 10)}))
    with pytest.raises(delta.ConcurrentOffsets, match=r"already records offset 9 of t\[0\]"):
        _append(table, tmp_path, {("t", 0): range(5, 10)})
    assert len(_commits(table)) == 2
    assert len(_data_files(table)) == sum(1 for c in _commits(table) for a in c if "add" in a)
    assert _offsets_in_table(table) == [("t", 0, o) for o in range(10)]


def test_a_race_lost_to_two_creators_lands_the_loser_on_the_winners_table(tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    real = delta_state.open_table

    def opened(path):   # no table yet, as this job reads it; another creates it meanwhile
        monkeypatch.setattr(delta_state, "open_table", real)
        assert real(path) is None
        assert _append(table, tmp_path, {("t", 1): range(0, 5)}) == 0
        return None
    monkeypatch.setattr(delta_state, "open_table", opened)
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 1
    commits = _commits(table)
    assert sum(1 for c in commits for a in c if "metaData" in a) == 1
    assert delta.committed_offsets(table, KEYS) == {("t", 0): 4, ("t", 1): 4}
    assert len(_data_files(table)) == sum(1 for c in commits for a in c if "add" in a)


def test_two_creators_at_once_make_one_table_the_loser_appending_to_it(tmp_path):
    """Two threads create the same table at the same instant, sixty times over: delta-rs 1.6's
    creator that lost version 0 committed its own metadata on top (a second table id; it did,
    for 40 of 60 tables, before ``delta_commit.commit`` turned its retry off).  Now the loser's
    race is lost, and nothing of it is written."""
    import threading
    schema = delta_commit.nullable(_schema().jsonValue())
    lost_version_0 = 0
    for n in range(60):
        table = str(tmp_path / f"t{n}")
        barrier, outcomes = threading.Barrier(2), []

        def create(p):
            barrier.wait()
            outcomes.append(delta_commit.commit(None, table, schema, PARTITION_BY, [], {delta.app_id("t", p): 0}))
        threads = [threading.Thread(target=create, args=(p,)) for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(type(o).__name__ for o in outcomes) == ["Committed", "Lost"], outcomes
        assert len(_commits(table)) == 1 and sum(1 for a in _commits(table)[0] if "metaData" in a) == 1
        lost_version_0 += not any("already exists" in o.reason or "created the table first" in o.reason
                                  for o in outcomes if isinstance(o, delta_commit.Lost))
    assert lost_version_0, "no creator lost version 0 itself (each saw the other's table first)"


def test_a_table_changed_during_the_commit_so_it_is_refused_gets_none_and_its_files_removed(tmp_path, monkeypatch):
    from deltalake import DeltaTable
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
    before = _data_files(table)
    _stale_once(monkeypatch, lambda: DeltaTable(table).alter.add_constraint({"c": "offset >= 0"}))
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) is None
    assert _data_files(table) == before and len(_commits(table)) == 2


def test_writer_features_delta_rs_does_not_write_are_refused_by_name_and_leave_no_file(tmp_path, monkeypatch):
    """A table whose protocol lists features delta-rs 1.6 does not write: refused at the commit
    by delta-rs itself (``ACCEPTED_FEATURES`` stretched here to let the job get that far), named,
    its files removed."""
    table = str(tmp_path / "t")
    assert _append(table, tmp_path, {("t", 0): range(0, 5)}) == 0
    upgrade = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 7,
                            "writerFeatures": ["appendOnly", "invariants", "rowTracking", "domainMetadata"]}}
    assert layout.create_if_absent(delta_state.log_dir(table), f"{1:020d}.json",
                                   (json.dumps({"commitInfo": {"operation": "UPGRADE"}}) + "\n" +
                                    json.dumps(upgrade) + "\n").encode())
    assert "rowTracking" in delta_commit.refusal(delta_state.open_table(table),
                                                 delta_commit.nullable(_schema().jsonValue()), PARTITION_BY)
    monkeypatch.setattr(delta_commit, "ACCEPTED_FEATURES", delta_commit.ACCEPTED_FEATURES | {"rowTracking",
                                                                                           "domainMetadata"})
    seen = []
    monkeypatch.setattr(delta.log, "info", lambda msg, *args: seen.append(msg % args))
    before = _data_files(table)
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) is None
    assert _data_files(table) == before and len(_commits(table)) == 2
    assert any("RowTracking" in line and "DomainMetadata" in line for line in seen), seen


class _Table:
    """What ``delta_commit.refusal`` reads of a ``DeltaTable``."""

    def __init__(self, protocol: dict, configuration: dict, schema: dict, partition_by=PARTITION_BY):
        from deltalake.table import ProtocolVersions
        self._protocol = ProtocolVersions(protocol["minReaderVersion"], protocol["minWriterVersion"],
                                          protocol.get("writerFeatures"), protocol.get("readerFeatures"))
        self._meta = type("M", (), {"configuration": configuration, "partition_columns": list(partition_by)})()
        self._schema = type("S", (), {"to_json": lambda _self: json.dumps(schema)})()

    def protocol(self):
        return self._protocol

    def metadata(self):
        return self._meta

    def schema(self):
        return self._schema


@pytest.mark.parametrize("protocol, configuration, refused", [
    ({"minReaderVersion": 1, "minWriterVersion": 2}, {}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 4}, {"delta.enableChangeDataFeed": "true"}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 2}, {"delta.appendOnly": "true"}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 3}, {"delta.constraints.c": "offset > 0"}, "CHECK constraints"),
    ({"minReaderVersion": 2, "minWriterVersion": 5}, {}, "writer version 5"),
    ({"minReaderVersion": 1, "minWriterVersion": 6}, {}, "writer version 6"),
    ({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors", "v2Checkpoint"],
      "writerFeatures": ["deletionVectors", "v2Checkpoint", "appendOnly", "invariants"]}, {}, None),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly", "inCommitTimestamp"]}, {},
     "inCommitTimestamp"),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["rowTracking", "domainMetadata"]}, {},
     "domainMetadata, rowTracking"),
    ({"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["columnMapping"],
      "writerFeatures": ["columnMapping"]}, {}, "columnMapping"),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["identityColumns"]}, {}, "identityColumns"),
    ({"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["someFutureFeature"]}, {}, "someFutureFeature"),
    ({"minReaderVersion": 4, "minWriterVersion": 8}, {}, "newer"),
])
def test_the_protocols_and_features_a_blind_append_accepts(protocol, configuration, refused):
    schema = delta_commit.nullable(_schema().jsonValue())
    reason = delta_commit.refusal(_Table(protocol, configuration, schema), schema, PARTITION_BY)
    assert (reason is None) if refused is None else (refused in reason), reason


def test_a_column_with_metadata_or_not_null_is_refused():
    schema = delta_commit.nullable(_schema().jsonValue())
    for change in ({"metadata": {"delta.generationExpression": "offset + 1"}}, {"nullable": False}):
        table = json.loads(json.dumps(schema))
        table["fields"][2].update(change)
        reason = delta_commit.refusal(_Table({"minReaderVersion": 1, "minWriterVersion": 4}, {}, table), schema,
                                      PARTITION_BY)
        assert "schema" in reason
    # The rows' nested fields count as nullable as Spark's asNullable makes them.
    assert schema["fields"][6]["type"]["fields"][2]["type"]["containsNull"] is True
    assert schema["fields"][7]["type"]["valueContainsNull"] is True


def test_delta_rs_checkpoints_at_the_tables_interval(tmp_path):
    from deltalake import DeltaTable
    table = str(tmp_path / "t")
    for v in range(0, 21):
        assert _append(table, tmp_path, {("t", v % 3): range(v * 2, v * 2 + 2)}) == v
    assert _checkpoints(table) == {10, 20}   # Delta's default interval, 10
    DeltaTable(table).alter.set_table_properties({"delta.checkpointInterval": "4"})   # version 21
    for v in range(22, 30):
        assert _append(table, tmp_path, {("t", v % 3): range(v * 2, v * 2 + 2)}) == v
    assert _checkpoints(table) == {10, 20, 24, 28}
    delta_state.forget(table)
    assert delta.committed_offsets(table, KEYS) == {("t", p): max(v * 2 + 1 for v in range(30) if v % 3 == p and v != 21)
                                                   for p in range(3)}


@pytest.mark.parametrize("carried", [True, False])
def test_on_a_table_whose_transactions_expire_every_commit_renews_every_partitions_version(tmp_path, monkeypatch,
                                                                                          carried):
    """Partition 1 was last delivered 20 minutes ago, partition 0 now.  Once the table keeps
    transactions 10 minutes only, partition 1's version is gone, at a checkpoint as on a read,
    unless partition 0's commit carried it (``delta.carried_versions``)."""
    from deltalake import DeltaTable
    table = str(tmp_path / "t")
    for key in (("t", 0), ("t", 1)):   # the output's manifests name both partitions
        os.makedirs(layout.manifest_dir(table, *key))
    real = delta_commit._now_ms
    monkeypatch.setattr(delta_commit, "_now_ms", lambda: real() - 20 * 60_000)
    assert _append(table, tmp_path, {("t", 0): range(0, 5), ("t", 1): range(0, 5)}) == 0
    monkeypatch.setattr(delta_commit, "_now_ms", real)
    DeltaTable(table).alter.set_table_properties({delta.RETENTION: "interval 30 minutes"})
    if not carried:
        monkeypatch.setattr(delta, "carried_versions", lambda *args: {})
    assert _append(table, tmp_path, {("t", 0): range(5, 10)}) == 2
    assert delta.committed_offsets(table) == {("t", 0): 9, ("t", 1): 4}   # 20 minutes < 30
    assert [sorted(a["txn"]["appId"] for a in c if "txn" in a) for c in _commits(table)][2] == \
        (["kdaemon:t:0", "kdaemon:t:1"] if carried else ["kdaemon:t:0"])
    DeltaTable(table).alter.set_table_properties({delta.RETENTION: "interval 10 minutes"})
    assert delta.committed_offsets(table) == ({("t", 0): 9, ("t", 1): 4} if carried else {("t", 0): 9})
    DeltaTable(table).create_checkpoint()
    delta_state.forget(table)
    assert delta.committed_offsets(table) == ({("t", 0): 9, ("t", 1): 4} if carried else {("t", 0): 9})
    assert _offsets_in_table(table) == sorted([("t", 0, o) for o in range(10)] + [("t", 1, o) for o in range(5)])


ROUNDS = 25


def _racer(table: str, directory: str, partition: int, start, results) -> None:
    """One of two processes: each round, wait for the other, then commit a batch of its own
    partition and try the round's batch of the shared partition 9 (one of the two must win it)."""
    lost = 0
    real = delta_commit.commit

    def counting(*args):
        nonlocal lost
        outcome = real(*args)
        lost += isinstance(outcome, delta_commit.Lost)
        return outcome
    delta_commit.commit = counting
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
    assert delta.committed_offsets(table, KEYS) == {("t", 0): ROUNDS * 4 - 1, ("t", 1): ROUNDS * 4 - 1,
                                                    ("t", 9): ROUNDS * 4 - 1}
    assert _offsets_in_table(table) == sorted(("t", p, o) for p in (0, 1, 9) for o in range(ROUNDS * 4))
    assert len(_data_files(table)) == sum(1 for c in commits for a in c if "add" in a)   # no orphan
    print("lost races:", [lost for _, _, lost in outcome])
