"""Exactly-once into a Delta Lake table (``format = "delta"``): Delta's idempotent writes.

Each topic partition is one idempotent application of the table, ``kdaemon:<topic>:<partition>``,
and a job appends each partition's new rows in its own commit, with the newest offset among
them as the transaction version (``txnAppId``/``txnVersion``).  Delta records the pair in the
same atomic commit as the rows and skips a later write of that application whose version is
not above the recorded one; so the recorded version of a partition is the newest offset of it
in the table, whoever wrote it — another uploader, another daemon sharing the table — and a
write repeated after a crash adds nothing.

The rest of the exactly-once bookkeeping is shared with Iceberg (``tables.py``): the recorded
versions are the table's committed offsets, read from its log (``delta_log.transactions``).

One table per (topic, consumer group): the application ids name the topic partition only.
"""

from __future__ import annotations

from .delta_log import transactions
from .jars import staged_jars


def app_id(topic: str, partition: int) -> str:
    return f"kdaemon:{topic}:{partition}"


def parse_app_id(app: str) -> tuple[str, int] | None:
    """The (topic, partition) of one of kdaemon's application ids; None for anyone else's."""
    prefix, _, rest = app.partition(":")
    topic, _, partition = rest.rpartition(":")
    if prefix != "kdaemon" or not topic or not partition.isdigit():
        return None
    return topic, int(partition)


def session_conf(table_path: str | None = None) -> dict[str, str]:
    """What a SparkSession needs to write Delta: the jars staged at install time (a running
    daemon never downloads), Delta's SQL extension and catalog.

    Delta rebuilds the table's state before each commit in ``snapshotPartitions`` tasks (50 by
    default): on local[1] that was 5 of each append's 6 seconds, for the few files an uploader's
    commits add.  Two is the default here; ``[sink.conf]`` overrides it for a table of very
    many files on a cluster."""
    return {"spark.jars": ",".join(staged_jars("delta")),
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.databricks.delta.snapshotPartitions": "2"}


def committed_offsets(table_path: str) -> dict[tuple[str, int], int]:
    """Each (topic, partition)'s newest offset in the table: its application's recorded
    version (other applications' are not kdaemon's)."""
    out = {}
    for app, version in transactions(table_path).items():
        key = parse_app_id(app)
        if key is not None:
            out[key] = version
    return out


def append(spark, df, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
           merge_schema: bool = False) -> None:
    """One idempotent append per topic partition of ``df``, in partition order, each with its
    application id and its newest offset (``versions``) as the transaction version.
    ``merge_schema``: Delta's own option, new columns (fields of ``value``) join the table."""
    from pyspark.sql import functions as F
    for (topic, partition), version in sorted(versions.items()):
        (df.where((F.col("topic") == topic) & (F.col("partition") == partition))
         .write.format("delta").mode("append")
         .option("txnAppId", app_id(topic, partition)).option("txnVersion", version)
         .option("mergeSchema", str(merge_schema).lower())
         .partitionBy(*partition_by).save(table_path))
