"""The Delta format's exactly-once pieces against real Delta Lake (the staged jars): the txn
versions read through delta-rs, through Delta's own checkpoints; the JVM's one commit per job;
and the settling of an upload the uploader did not finish, rolled forward when its commit
happened and back when it did not.  The end-to-end kill test is test_spark_sink_chaos.py's
delta case; table maintenance, test_spark_delta_maintenance.py."""

from __future__ import annotations

import json
import os

import pytest

from kdaemon.sinks.spark.tables import delta, delta_state, layout
from testkit.spark import check_unfinished_uploads_settle, requires_spark

requires_spark()

pytestmark = [pytest.mark.spark]


def _append(spark, path: str, rows: list[tuple[str, int, int]], app: str, version: int) -> None:
    df = spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT")
    (df.write.format("delta").mode("append").option("txnAppId", app).option("txnVersion", version)
     .option("delta.checkpointInterval", "3").save(path))   # a table property, set on creation


def _versions(path: str) -> dict[str, int]:
    return delta_state.versions(delta_state.open_table(path), [f"app-{i}" for i in range(4)])


def test_transactions_read_through_checkpoints_match_what_delta_skips(spark, tmp_path):
    path = str(tmp_path / "t")
    assert _versions(path) == {}
    expected: dict[str, int] = {}
    for i in range(8):   # a checkpoint every 3 commits: the state spans two of them
        app = f"app-{i % 3}"
        expected[app] = i
        _append(spark, path, [("t", i % 3, i)], app, i)
    names = os.listdir(delta_state.log_dir(path))
    assert any(".checkpoint." in n for n in names), names   # the test reads through one
    assert _versions(path) == expected
    # Delta itself agrees: a write at a recorded version is skipped, one above it is not.
    _append(spark, path, [("t", 0, 999)], "app-0", expected["app-0"])
    assert spark.read.format("delta").load(path).where("offset = 999").count() == 0
    _append(spark, path, [("t", 0, 999)], "app-0", expected["app-0"] + 1)
    assert spark.read.format("delta").load(path).where("offset = 999").count() == 1
    assert _versions(path)["app-0"] == expected["app-0"] + 1
    keys = [("t", p) for p in range(4)]
    assert delta.committed_offsets(path, keys) == {}   # none of those applications is kdaemon's
    _append(spark, path, [("t", 3, 5)], delta.app_id("t", 3), 5)
    assert delta.committed_offsets(path, keys) == {("t", 3): 5}


def test_an_unfinished_upload_rolls_forward_if_its_commit_happened_else_back(spark, tmp_path):
    table = str(tmp_path / "table")
    check_unfinished_uploads_settle(table, "delta", tmp_path / "state", lambda: _append(
        spark, table, [("t", 0, o) for o in range(10)], delta.app_id("t", 0), 9))


KEYS = [("t", p) for p in range(4)]


def _job_rows(spark, rows: list[tuple[str, int, int]]):
    return spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT")


def _commits(path: str) -> list[list[dict]]:
    """Each commit file of the log, as its list of actions."""
    d = delta_state.log_dir(path)
    names = sorted(n for n in os.listdir(d) if n.endswith(".json") and n[:20].isdigit())
    return [[json.loads(line) for line in open(os.path.join(d, n)) if line.strip()] for n in names]


def test_a_job_of_several_partitions_is_one_commit_recording_each(spark, tmp_path):
    path = str(tmp_path / "t")
    rows = [("t", p, o) for p in range(3) for o in range(5)]
    delta.append(spark, _job_rows(spark, rows), path, ["topic"], {("t", p): 4 for p in range(3)})
    delta.append(spark, _job_rows(spark, [("t", 0, 5), ("t", 2, 5)]), path, ["topic"], {("t", 0): 5, ("t", 2): 5})
    commits = _commits(path)
    # One commit per job with the rows' files and every txn action; the first also creates the
    # table (its metadata: the rows' schema, the partition columns).
    assert len(commits) == 2, commits
    meta = [a["metaData"] for a in commits[0] if "metaData" in a]
    assert len(meta) == 1 and meta[0]["partitionColumns"] == ["topic"]
    assert [f["name"] for f in json.loads(meta[0]["schemaString"])["fields"]] == ["topic", "partition", "offset"]
    assert not any("metaData" in a for a in commits[1])
    for commit, apps in ((commits[0], {"kdaemon:t:0": 4, "kdaemon:t:1": 4, "kdaemon:t:2": 4}),
                         (commits[1], {"kdaemon:t:0": 5, "kdaemon:t:2": 5})):
        assert {a["txn"]["appId"]: a["txn"]["version"] for a in commit if "txn" in a} == apps
        assert any("add" in a for a in commit)
        assert [a["commitInfo"]["operation"] for a in commit if "commitInfo" in a] == ["WRITE"]
    assert delta.committed_offsets(path, KEYS) == {("t", 0): 5, ("t", 1): 4, ("t", 2): 5}
    got = sorted(tuple(r) for r in spark.read.format("delta").load(path).select("topic", "partition", "offset").collect())
    assert got == sorted(rows + [("t", 0, 5), ("t", 2, 5)])
    # Delta's own idempotent writer sees those versions: a write at one is skipped.
    _append(spark, path, [("t", 1, 4)], delta.app_id("t", 1), 4)
    assert spark.read.format("delta").load(path).count() == len(rows) + 2


def test_a_table_two_writers_create_at_once_is_created_by_one(spark, tmp_path):
    """A writer whose transaction began before the table existed cannot commit a second
    version 0 over the first job's: Delta fails its commit (its job is then retried)."""
    path = str(tmp_path / "t")
    jvm = spark._jvm
    other = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path).startTransaction()
    assert other.readVersion() == -1
    delta.append(spark, _job_rows(spark, [("t", 0, 0)]), path, ["topic"], {("t", 0): 0})
    rows = _job_rows(spark, [("t", 0, 1)])
    other.updateMetadataForNewTable(delta._new_table_metadata(jvm, rows._jdf.schema().asNullable().json(), ["topic"]))
    actions = list(jvm.scala.jdk.javaapi.CollectionConverters.asJava(other.writeFiles(rows._jdf)))
    none = jvm.scala.Option.empty()
    write = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
        jvm.org.apache.spark.sql.SaveMode.Append, none, none, none, none, none, none, none, none)
    with pytest.raises(Exception, match="DELTA_PROTOCOL_CHANGED"):
        other.commit(delta._scala_list(jvm, actions), write)
    assert len(_commits(path)) == 1
    assert sorted(r.offset for r in spark.read.format("delta").load(path).collect()) == [0]


def test_a_job_behind_what_another_writer_recorded_commits_nothing(spark, tmp_path):
    path = str(tmp_path / "t")
    delta.append(spark, _job_rows(spark, [("t", 0, 0), ("t", 1, 0)]), path, ["topic"], {("t", 0): 0, ("t", 1): 0})
    before = len(_commits(path))
    # Partition 1's rows are not past what the table records, as after another writer's commit
    # that came between this uploader's read of the offsets and its job.
    with pytest.raises(delta.ConcurrentOffsets, match=r"already records offset 0 of t\[1\]"):
        delta.append(spark, _job_rows(spark, [("t", 0, 1), ("t", 1, 0)]), path, ["topic"], {("t", 0): 1, ("t", 1): 0})
    assert len(_commits(path)) == before
    assert delta.committed_offsets(path, KEYS) == {("t", 0): 0, ("t", 1): 0}


def test_a_writer_recording_the_partition_during_a_job_fails_the_job(spark, tmp_path, monkeypatch):
    """The job reads the table's offsets through delta-rs after its transaction began; another
    writer that records the same partition after that read makes the job's commit a conflict
    (the application was registered as read), so nothing is written twice."""
    path = str(tmp_path / "t")
    delta.append(spark, _job_rows(spark, [("t", 0, 0)]), path, ["topic"], {("t", 0): 0})
    real = delta_state.open_table

    def read_then_another_writer_commits(table_path):
        from deltalake import DeltaTable
        monkeypatch.setattr(delta_state, "open_table", real)
        seen = DeltaTable(table_path)
        delta.append(spark, _job_rows(spark, [("t", 0, 1)]), path, ["topic"], {("t", 0): 1})
        return seen

    monkeypatch.setattr(delta_state, "open_table", read_then_another_writer_commits)
    with pytest.raises(Exception, match="DELTA_CONCURRENT_TRANSACTION"):
        delta.append(spark, _job_rows(spark, [("t", 0, 1), ("t", 0, 2)]), path, ["topic"], {("t", 0): 2})
    assert delta.committed_offsets(path, KEYS) == {("t", 0): 1}
    assert sorted(r.offset for r in spark.read.format("delta").load(path).collect()) == [0, 1]


def test_on_a_table_whose_transactions_expire_the_jvms_commit_renews_every_partitions_version(spark, tmp_path):
    """As the direct path's (``delta.carried_versions``): the commit of partition 0 carries
    partition 1's recorded version, with ``lastUpdated`` now."""
    path = str(tmp_path / "t")
    for p in (0, 1):   # the output's manifests name both partitions
        os.makedirs(layout.manifest_dir(path, "t", p))
    delta.append(spark, _job_rows(spark, [("t", 0, 0), ("t", 1, 0)]), path, ["topic"], {("t", 0): 0, ("t", 1): 0})
    delta.append(spark, _job_rows(spark, [("t", 0, 1)]), path, ["topic"], {("t", 0): 1})
    assert [a["txn"]["appId"] for a in _commits(path)[-1] if "txn" in a] == ["kdaemon:t:0"]   # nothing expires
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('{delta.RETENTION}' = 'interval 1 days')")
    delta.append(spark, _job_rows(spark, [("t", 0, 2)]), path, ["topic"], {("t", 0): 2})
    last = _commits(path)[-1]
    assert {a["txn"]["appId"]: a["txn"]["version"] for a in last if "txn" in a} == {"kdaemon:t:0": 2, "kdaemon:t:1": 0}
    assert delta.committed_offsets(path) == {("t", 0): 2, ("t", 1): 0}


def test_rows_of_another_shape_take_the_dataframe_writer_which_names_the_mismatch(spark, tmp_path):
    path = str(tmp_path / "t")
    delta.append(spark, _job_rows(spark, [("t", 0, 0)]), path, ["topic"], {("t", 0): 0})
    wider = spark.createDataFrame([("t", 0, 1, "x")], "topic STRING, partition INT, offset BIGINT, extra STRING")
    with pytest.raises(Exception, match="DELTA_METADATA_MISMATCH|schema mismatch"):
        delta.append(spark, wider, path, ["topic"], {("t", 0): 1})
    delta.append(spark, wider, path, ["topic"], {("t", 0): 1}, merge_schema=True)
    assert delta.committed_offsets(path, KEYS) == {("t", 0): 1}
    assert spark.read.format("delta").load(path).where("extra = 'x'").count() == 1
