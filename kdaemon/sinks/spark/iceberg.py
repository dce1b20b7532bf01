"""Exactly-once into an Apache Iceberg table (``format = "iceberg"``): offsets in snapshots.

``path`` is the table's location, ``<warehouse>/<namespace>/<table>``: the layout of Iceberg's
Hadoop catalog, so a user's Hadoop catalog on ``<warehouse>`` lists it as ``<namespace>.<table>``
and ``spark.read.format("iceberg").load(path)`` reads it.  The uploader's session has that
catalog under the name ``kdaemon_iceberg`` and creates the table at the first upload, partitioned
by ``partition_by`` (identity partitions on the same columns as path mode and Delta).

Iceberg has no idempotent-writer id like Delta's.  Each job is one append whose snapshot carries
the property ``kdaemon.offsets``: every partition's newest offset in the table once the append
is in (``iceberg_meta.py``).  Before writing, the uploader reads the table's committed offsets
and drops rows at or below them, beside the manifests' ranges (``tables.py``): a job repeated
after a crash, or another uploader's overlapping batch, adds nothing.  The read and the append
of a partition happen under its upload lock (``layout.partition_locks``), which is what keeps
two uploaders from both appending the same new rows: on one host or a shared filesystem with
working ``flock``.  (Delta checks its application versions inside the commit itself, so it
needs no lock for that; Iceberg's append would rebase onto a concurrent commit instead.)
"""

from __future__ import annotations

import json
import os

from .iceberg_meta import SUMMARY_KEY, committed_offsets, current_metadata, summary_value
from .jars import staged_jars

__all__ = ["CATALOG", "append", "append_files", "check_path", "committed_offsets", "identifier", "session_conf"]

CATALOG = "kdaemon_iceberg"
ACCEPT_ANY_SCHEMA = "write.spark.accept-any-schema"


def _parts(table_path: str) -> tuple[str, str, str]:
    """(warehouse, namespace, table name) of a table location."""
    path = os.path.abspath(table_path)
    parent, name = os.path.split(path)
    warehouse, namespace = os.path.split(parent)
    return warehouse, namespace, name


def check_path(table_path: str) -> str | None:
    """What is wrong with ``path`` as an Iceberg table location, or None."""
    warehouse, namespace, name = _parts(table_path)
    if not namespace or not name or warehouse in ("", "/"):
        return (f"with format = \"iceberg\", path is the table's location <warehouse>/<namespace>/<table> "
                f"(Iceberg's Hadoop catalog layout), such as /data/lake/db/events; {table_path!r} has too few parts")
    bad = [part for part in (namespace, name) if "`" in part or "." in part]
    if bad:
        return f"the Iceberg namespace and table name in path may not contain '.' or '`': {bad[0]!r}"
    return None


def identifier(table_path: str) -> str:
    _, namespace, name = _parts(table_path)
    return f"{CATALOG}.`{namespace}`.`{name}`"


def session_conf(table_path: str) -> dict[str, str]:
    """The staged runtime jar, Iceberg's SQL extensions, and a Hadoop catalog on the table's
    warehouse directory."""
    warehouse, _, _ = _parts(table_path)
    return {"spark.jars": ",".join(staged_jars("iceberg")),
            "spark.sql.extensions": "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions",
            f"spark.sql.catalog.{CATALOG}": "org.apache.iceberg.spark.SparkCatalog",
            f"spark.sql.catalog.{CATALOG}.type": "hadoop",
            f"spark.sql.catalog.{CATALOG}.warehouse": warehouse}


def append(spark, df, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
           merge_schema: bool = False) -> None:
    """One append of ``df`` (rows newer than the table's committed offsets), whose snapshot
    records ``versions`` (each partition's newest offset in ``df``) merged into what the
    table had recorded.  ``merge_schema``: Iceberg's ``merge-schema`` write option, which
    needs the table property ``write.spark.accept-any-schema`` (set here when missing): new
    columns (fields of ``value``) join the table."""
    ident = identifier(table_path)
    _create_if_missing(spark, df, table_path, partition_by)
    writer = df.writeTo(ident)
    if merge_schema:
        meta = current_metadata(table_path) or {}
        if (meta.get("properties") or {}).get(ACCEPT_ANY_SCHEMA) != "true":
            spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('{ACCEPT_ANY_SCHEMA}' = 'true')")
        writer = writer.option("merge-schema", "true")
    writer.option(f"snapshot-property.{SUMMARY_KEY}", _summary_after(table_path, versions)).append()


def _summary_after(table_path: str, versions: dict[tuple[str, int], int]) -> str:
    """The ``kdaemon.offsets`` of an append recording ``versions`` over what the table has."""
    offsets = committed_offsets(table_path)
    for key, version in versions.items():
        offsets[key] = max(offsets.get(key, -1), version)
    return summary_value(offsets)


def _create_if_missing(spark, df, table_path: str, partition_by: list[str]) -> None:
    """Create the table with ``df``'s columns, partitioned by ``partition_by``, unless it exists."""
    from pyspark.sql import functions as F
    ident = identifier(table_path)
    if spark.catalog.tableExists(ident):
        return
    _, namespace, _ = _parts(table_path)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CATALOG}.`{namespace}`")
    try:
        (df.limit(0).writeTo(ident).using("iceberg").tableProperty("format-version", "2")
         .partitionedBy(*[F.col(c) for c in partition_by]).create())
    except Exception as exc:   # another uploader created it first
        if "already exists" not in str(exc).lower():
            raise


# Table properties that move data files away from <table>/data/<partition path>/.
_DATA_LOCATION = ("write.data.path", "write.object-storage.enabled", "write.folder-storage.path")


def append_files(spark, pieces, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
                 schema) -> bool:
    """The direct path's append: ``pieces`` (``arrow_rows.job_rows`` of each batch) written as data files by
    ``iceberg_files`` and appended in one snapshot recording the offsets, as ``append`` does
    with the DataFrame's (the table created first if missing).  ``schema``: the rows' Spark
    schema (pyspark).  False, with nothing written, when the table is not one this path writes
    as Iceberg's Spark writer would (other columns or types, a partition spec other than
    identity on ``partition_by``, data files placed elsewhere), or over Spark Connect: the
    caller then takes the Spark path."""
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return False
    from . import iceberg_files   # pyarrow: the uploader's, never a worker's (staged.py)
    _create_if_missing(spark, spark.createDataFrame([], schema), table_path, partition_by)
    ice = jvm.org.apache.iceberg
    table = ice.spark.Spark3Util.loadIcebergTable(spark._jsparkSession, identifier(table_path))
    table.refresh()
    convert = ice.spark.SparkSchemaUtil.convert
    # The rows' schema as Iceberg would make it (a TINYINT becomes an int), against the table's.
    rows_schema = convert(convert(spark._jsparkSession.parseDataType(schema.json()))).asNullable().json()
    spec = [(f.name(), f.transform().isIdentity()) for f in table.spec().fields()]
    props = table.properties()
    if (convert(table.schema()).asNullable().json() != rows_schema or spec != [(c, True) for c in partition_by]
            or any(props.containsKey(k) for k in _DATA_LOCATION)):
        return False
    codec = str(props.getOrDefault("write.parquet.compression-codec", "zstd")).lower()
    files = iceberg_files.write_files(pieces, table_path, partition_by, json.loads(ice.SchemaParser.toJson(table.schema())),
                                      "none" if codec == "uncompressed" else codec)
    metrics = ice.MetricsConfig.forTable(table)
    append = table.newAppend()
    for path, values, size in files:
        java_values = jvm.java.util.ArrayList()
        for v in values:
            java_values.add(v)
        append.appendFile(ice.DataFiles.builder(table.spec()).withPath(path).withFormat("PARQUET")
                          .withFileSizeInBytes(size).withPartitionValues(java_values)
                          .withMetrics(ice.parquet.ParquetUtil.fileMetrics(table.io().newInputFile(path), metrics))
                          .build())
    append.set(SUMMARY_KEY, _summary_after(table_path, versions))
    append.commit()
    return True
