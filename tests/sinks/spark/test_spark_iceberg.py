"""The Iceberg format's exactly-once pieces against real Iceberg (the staged runtime jar): the
committed offsets read from the table's metadata through the snapshot ancestry (another
writer's snapshot, a rollback, gzip metadata) and the table properties (after expiry), the skip
of rows a table already holds, and the settling of an upload the uploader did not finish.  The end-to-end kill test is
test_spark_sink_chaos.py's iceberg case."""

from __future__ import annotations

import gzip
import json
import os
import shutil

import pytest

from kdaemon.sinks.spark.tables import iceberg, iceberg_meta, layout
from kdaemon.sinks.spark.uploader.process import Uploader
from kdaemon.sinks.spark.uploader.writer import SparkWriter
from testkit.spark import check_unfinished_uploads_settle, fresh_session, requires_spark, staged_request

requires_spark()

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def writer(tmp_path_factory):
    """An uploader's SparkWriter on an Iceberg table (its own session, whose conf holds the
    Hadoop catalog on this module's warehouse; the process's JVM has the jars)."""
    lake = tmp_path_factory.mktemp("lake")
    fresh_session()   # the writer's session next, with its own catalog
    w = SparkWriter({"type": "spark", "format": "iceberg", "master": "local[1]",
                     "path": str(lake / "db" / "first")})
    w.start()
    yield w, lake
    w.stop()
    fresh_session()   # the reader fixture starts its session next


def _rows(spark, rows: list[tuple[str, int, int]]):
    return spark.createDataFrame([(t, p, o, "1970-01-01") for t, p, o in rows],
                                 "topic STRING, partition INT, offset BIGINT, date STRING")


def _offsets(spark, path: str) -> list[int]:
    return sorted(r.offset for r in spark.read.format("iceberg").load(path).select("offset").collect())


def test_committed_offsets_follow_the_snapshot_ancestry(writer):
    w, lake = writer
    spark, path = w.spark, str(lake / "db" / "first")
    assert iceberg_meta.committed_offsets(path) == {}
    iceberg.append(spark, _rows(spark, [("t", 0, 0), ("t", 0, 1), ("t", 1, 0)]), path, ["topic"],
                   {("t", 0): 1, ("t", 1): 0})
    assert iceberg_meta.committed_offsets(path) == {("t", 0): 1, ("t", 1): 0}
    first = spark.sql(f"SELECT snapshot_id FROM {iceberg.identifier(path)}.snapshots "
                      "ORDER BY committed_at DESC LIMIT 1").first()[0]
    iceberg.append(spark, _rows(spark, [("t", 0, 2)]), path, ["topic"], {("t", 0): 2})
    assert iceberg_meta.committed_offsets(path) == {("t", 0): 2, ("t", 1): 0}

    # Another writer's snapshot carries no property: what its ancestors recorded still counts.
    spark.sql(f"DELETE FROM {iceberg.identifier(path)} WHERE offset = 0 AND partition = 1")
    assert iceberg_meta.committed_offsets(path) == {("t", 0): 2, ("t", 1): 0}
    # Two uploaders that each recorded only what they had read: the maximum over the ancestry.
    spark.sql(f"CALL {iceberg.CATALOG}.system.set_current_snapshot('db.first', {first})")
    assert iceberg_meta.committed_offsets(path) == {("t", 0): 1, ("t", 1): 0}   # rolled back: 2 is gone
    assert _offsets(spark, path) == [0, 0, 1]

    # Iceberg's own reader and the file read agree on where the newest metadata is, gzip too.
    meta_dir = iceberg_meta.metadata_dir(path)
    newest = max((n for n in os.listdir(meta_dir) if n.endswith(".metadata.json")),
                 key=lambda n: int(n[1:].split(".")[0]))
    version = int(newest[1:].split(".")[0])
    with open(os.path.join(meta_dir, newest), "rb") as src, \
            gzip.open(os.path.join(meta_dir, f"v{version + 1}.gz.metadata.json"), "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert iceberg_meta.committed_offsets(path) == {("t", 0): 1, ("t", 1): 0}


def test_a_foreign_summary_property_is_named(tmp_path):
    meta = tmp_path / "db" / "t" / "metadata"
    meta.mkdir(parents=True)
    (meta / "v1.metadata.json").write_text(json.dumps({
        "current-snapshot-id": 7,
        "snapshots": [{"snapshot-id": 7, "summary": {iceberg_meta.SUMMARY_KEY: "[1, 2]"}}]}))
    with pytest.raises(iceberg_meta.IcebergMetadataError, match="not kdaemon's"):
        iceberg_meta.committed_offsets(str(tmp_path / "db" / "t"))


def _snapshot(sid: int, parent: int | None, offsets: dict | None) -> dict:
    summary = {"operation": "append"}
    if offsets is not None:
        summary[iceberg_meta.SUMMARY_KEY] = json.dumps(offsets)
    return {"snapshot-id": sid, "parent-snapshot-id": parent, "summary": summary}


def test_the_table_properties_count_once_the_snapshots_that_recorded_them_are_gone():
    props = {iceberg_meta.property_key("t", 0): "9", iceberg_meta.property_key("a.b", 1): "4", "owner": "x"}
    # Compaction's snapshot alone (the appends expired): the properties are the record.
    expired = {"current-snapshot-id": 3, "snapshots": [_snapshot(3, 2, None)], "properties": props}
    assert iceberg_meta.offsets_of(expired) == {("t", 0): 9, ("a.b", 1): 4}
    # The append that recorded 9 is an ancestor: the same answer either way.
    kept = {**expired, "snapshots": [_snapshot(2, None, {"t": {"0": 9}}), _snapshot(3, 2, None)]}
    assert iceberg_meta.offsets_of(kept) == {("t", 0): 9, ("a.b", 1): 4}
    # Rolled back (the snapshot recording 9 is not an ancestor of the current one): its rows are
    # not in the table, and the property it set does not count while that is known.
    rolled_back = {**expired, "current-snapshot-id": 1, "snapshots": [
        _snapshot(1, None, {"t": {"0": 5}}), _snapshot(2, 1, {"t": {"0": 9}})]}
    assert iceberg_meta.offsets_of(rolled_back) == {("t", 0): 5, ("a.b", 1): 4}
    # A table written before the properties: the ancestry alone, as before.
    assert iceberg_meta.offsets_of({**kept, "properties": {}}) == {("t", 0): 9}


def test_what_a_direct_commit_sets_of_the_table_properties():
    props = {iceberg_meta.property_key("t", 0): "9", iceberg_meta.property_key("t", 1): "7", "owner": "x"}
    assert iceberg_meta.offset_properties(props, {("t", 0): 12, ("t", 1): 7, ("u", 0): 3}) == (
        {iceberg_meta.property_key("t", 0): "12", iceberg_meta.property_key("u", 0): "3"}, [])
    assert iceberg_meta.offset_properties(props, {("t", 0): 9}) == ({}, [iceberg_meta.property_key("t", 1)])


@pytest.mark.parametrize("name, value", [("kdaemon.offsets.t.x", "1"), ("kdaemon.offsets.t.0", "ten"),
                                         ("kdaemon.offsets.0", "1")])
def test_a_foreign_offsets_property_is_named(tmp_path, name, value):
    meta = tmp_path / "db" / "t" / "metadata"
    meta.mkdir(parents=True)
    (meta / "v1.metadata.json").write_text(json.dumps({"properties": {name: value}}))
    with pytest.raises(iceberg_meta.IcebergMetadataError, match=f"{name} = '{value}'.* is not kdaemon's"):
        iceberg_meta.committed_offsets(str(tmp_path / "db" / "t"))


def test_rows_the_table_holds_are_not_written_again(writer, tmp_path):
    """The table knows of a commit whose manifest was never written (its uploader died between
    them, and the pending record went too): the next upload drops those rows by the table's
    recorded offsets alone."""
    w, lake = writer
    path = str(lake / "db" / "second")
    uploader = Uploader({"type": "spark", "path": path, "format": "iceberg", "master": "local[1]"},
                        str(tmp_path / "state"))
    uploader.writer, w.path = w, path   # the module's session: its catalog's warehouse is this lake
    first = staged_request(tmp_path / "staged", "t", 0, range(0, 5))
    assert uploader.upload([first])[0] == 5 and first.error is None
    os.unlink(layout.manifest_path(path, "t", first.batch))   # as if never written

    again = staged_request(tmp_path / "staged", "t", 0, range(0, 10))
    rows, _ = uploader.upload([again])
    assert again.error is None and rows == 5
    assert _offsets(w.spark, path) == list(range(10))
    assert iceberg_meta.committed_offsets(path) == {("t", 0): 9}
    assert layout.uploaded_ranges(path, "t", 0) == [(0, 9)]


def test_an_unfinished_upload_rolls_forward_if_its_commit_happened_else_back(writer, tmp_path):
    w, lake = writer
    path = str(lake / "db" / "third")
    check_unfinished_uploads_settle(path, "iceberg", tmp_path / "state", lambda: iceberg.append(
        w.spark, _rows(w.spark, [("t", 0, o) for o in range(10)]), path, ["topic"], {("t", 0): 9}))
