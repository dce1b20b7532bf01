"""The Delta format's exactly-once pieces against real Delta Lake (the staged jars): the txn
actions read from the log, through Delta's own checkpoints; and the settling of an upload the
uploader did not finish, rolled forward when its commit happened and back when it did not.
The end-to-end kill test is test_spark_sink_chaos.py's delta case."""

from __future__ import annotations

import os

import pytest

from kdaemon.sinks.spark import delta, delta_log
from tests.spark.support import check_unfinished_uploads_settle, requires_spark

requires_spark()

pytestmark = [pytest.mark.spark]


def _append(spark, path: str, rows: list[tuple[str, int, int]], app: str, version: int) -> None:
    df = spark.createDataFrame(rows, "topic STRING, partition INT, offset BIGINT")
    (df.write.format("delta").mode("append").option("txnAppId", app).option("txnVersion", version)
     .option("delta.checkpointInterval", "3").save(path))   # a table property, set on creation


def test_transactions_read_through_checkpoints_match_what_delta_skips(spark, tmp_path):
    path = str(tmp_path / "t")
    assert delta_log.transactions(path) == {}
    expected: dict[str, int] = {}
    for i in range(8):   # a checkpoint every 3 commits: the state spans two of them
        app = f"app-{i % 3}"
        expected[app] = i
        _append(spark, path, [("t", i % 3, i)], app, i)
    names = os.listdir(delta_log.log_dir(path))
    assert any(".checkpoint." in n for n in names), names   # the test reads through one
    assert delta_log.transactions(path) == expected
    # Delta itself agrees: a write at a recorded version is skipped, one above it is not.
    _append(spark, path, [("t", 0, 999)], "app-0", expected["app-0"])
    assert spark.read.format("delta").load(path).where("offset = 999").count() == 0
    _append(spark, path, [("t", 0, 999)], "app-0", expected["app-0"] + 1)
    assert spark.read.format("delta").load(path).where("offset = 999").count() == 1
    assert delta_log.transactions(path)["app-0"] == expected["app-0"] + 1
    assert delta.committed_offsets(path) == {}   # none of those applications is kdaemon's
    _append(spark, path, [("t", 3, 5)], delta.app_id("t", 3), 5)
    assert delta.committed_offsets(path) == {("t", 3): 5}


def test_an_unfinished_upload_rolls_forward_if_its_commit_happened_else_back(spark, tmp_path):
    table = str(tmp_path / "table")
    check_unfinished_uploads_settle(table, "delta", tmp_path / "state", lambda: _append(
        spark, table, [("t", 0, o) for o in range(10)], delta.app_id("t", 0), 9))
