"""The schema rule of the table formats, on real Delta and Iceberg tables: the table's columns
are fixed by the first upload; a ``value_schema`` that gains a field fails the upload with the
mismatch named (nothing confirmed, so nothing committed) unless ``merge_schema = true``, which
adds the field to the table (older rows read it as null).  A field removed is written as null
(Iceberg needs ``merge_schema`` for that too); a type changed is refused either way."""

from __future__ import annotations

import json

import pytest

from kdaemon.sinks.spark.tables import formats
from kdaemon.sinks.spark.uploader.process import Uploader
from kdaemon.sinks.spark.uploader.writer import SchemaMismatch
from testkit.spark import fresh_jvm, requires_spark, staged_request

requires_spark()

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """One JVM for both formats (Delta's jars added through [sink.conf], as a user would) and
    its uploaders' sessions; the reader fixture launches its own afterwards."""
    lake = tmp_path_factory.mktemp("lake")
    fresh_jvm()
    yield lake
    fresh_jvm()


def _uploader(lake, tmp_path, fmt: str, name: str, schema: str, merge: bool | None = None) -> Uploader:
    settings = {"type": "spark", "format": fmt, "master": "local[1]", "path": str(lake / "db" / name),
                "value_schema": schema, "partition_by": ["topic"]}
    if fmt == "iceberg":   # a session that writes both formats: Delta's settings added by the user
        delta = formats.FORMATS["delta"].session_conf()
        settings["conf"] = {k: delta[k] for k in ("spark.jars", "spark.sql.extensions",
                                                  "spark.sql.catalog.spark_catalog")}
    if merge is not None:
        settings["merge_schema"] = merge
    uploader = Uploader(settings, str(tmp_path / "state"))
    uploader.writer.start()   # the module's JVM: the first start launches it, later ones reuse it
    return uploader


def _values(offsets, **fields) -> list[bytes]:
    return [json.dumps({"id": o, **fields}).encode() for o in offsets]


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])   # iceberg first: its session launches the JVM
def test_a_new_field_fails_without_merge_schema_and_joins_with_it(lake, tmp_path, fmt):
    name = f"events_{fmt}"
    first = _uploader(lake, tmp_path, fmt, name, "id BIGINT")
    req = staged_request(tmp_path / "staged", "t", 0, range(0, 3), _values(range(0, 3), kind="x"))
    assert first.upload([req])[0] == 3 and req.error is None

    strict = _uploader(lake, tmp_path, fmt, name, "id BIGINT, kind STRING")
    req = staged_request(tmp_path / "staged", "t", 0, range(3, 6), _values(range(3, 6), kind="y"))
    with pytest.raises(SchemaMismatch, match="set merge_schema = true") as failed:
        strict.upload([req])
    print(f"{fmt} without merge_schema: {failed.value}")
    assert formats.FORMATS[fmt].committed_offsets(str(lake / "db" / name)) == {("t", 0): 2}

    merging = _uploader(lake, tmp_path, fmt, name, "id BIGINT, kind STRING", merge=True)
    assert merging.upload([req])[0] == 3 and req.error is None
    spark = merging.writer.spark
    reader = spark.read.format(fmt).load(str(lake / "db" / name))
    got = sorted((r["id"], r["kind"]) for r in reader.select("offset", "value.*").collect())
    assert got == [(0, None), (1, None), (2, None), (3, "y"), (4, "y"), (5, "y")]
    assert formats.FORMATS[fmt].committed_offsets(str(lake / "db" / name)) == {("t", 0): 5}

    # A type change is not one merge_schema makes: named as such.
    changed = _uploader(lake, tmp_path, fmt, name, "id STRING, kind STRING", merge=True)
    req = staged_request(tmp_path / "staged", "t", 0, range(6, 7), [b'{"id": "six", "kind": "z"}'])
    with pytest.raises(SchemaMismatch, match="not one merge_schema can make") as failed:
        changed.upload([req])
    print(f"{fmt} type change: {failed.value}")


@pytest.mark.parametrize("fmt", ["iceberg", "delta"])
@pytest.mark.parametrize("merge", [False, True])
def test_a_field_removed_from_value_schema_reads_as_null(lake, tmp_path, fmt, merge):
    name = f"narrowed_{fmt}_{merge}"
    wide = _uploader(lake, tmp_path, fmt, name, "id BIGINT, kind STRING")
    req = staged_request(tmp_path / "staged", "t", 0, range(0, 2), _values(range(0, 2), kind="x"))
    assert wide.upload([req])[0] == 2
    narrow = _uploader(lake, tmp_path, fmt, name, "id BIGINT", merge=merge)
    req = staged_request(tmp_path / "staged", "t", 0, range(2, 4), _values(range(2, 4), kind="y"))
    if fmt == "iceberg" and not merge:   # Iceberg wants every column unless told otherwise
        with pytest.raises(SchemaMismatch, match="Cannot find data for the output column `value`.`kind`"):
            narrow.upload([req])
        narrow = _uploader(lake, tmp_path, fmt, name, "id BIGINT", merge=True)
    assert narrow.upload([req])[0] == 2 and req.error is None
    reader = narrow.writer.spark.read.format(fmt).load(str(lake / "db" / name))
    got = sorted((r["id"], r["kind"]) for r in reader.select("value.*").collect())
    assert got == [(0, "x"), (1, "x"), (2, None), (3, None)]
