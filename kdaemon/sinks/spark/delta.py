"""Exactly-once into a Delta Lake table (``format = "delta"``): Delta's idempotent writes.

Each topic partition is one idempotent application of the table, ``kdaemon:<topic>:<partition>``,
whose transaction version is the newest offset of that partition in the table.  Delta records
the pair (a ``txn`` action) in the same atomic commit as the rows, and a transaction that read an
application's version conflicts with any concurrent commit that changes it; so the recorded
version of a partition is the newest offset of it in the table, whoever wrote it — another
uploader, another daemon sharing the table — and a write repeated after a crash adds nothing.

A job is **one commit** carrying every partition's ``txn`` action (``_append_one_commit``),
through Delta's transaction API on the JVM (``DeltaLog.startTransaction``, ``writeFiles``,
``commit``): a Delta commit costs about a second of driver time on a small machine, and the
DataFrame writer's ``txnAppId``/``txnVersion`` options carry one application per commit, which
made a job of four partitions four commits.  That path needs the classic session (py4j) and a
table whose schema the rows already fit, or no table yet (its metadata, the rows' schema and
``partition_by``, then goes in the same commit, as Delta's own writer does); otherwise (a
Spark Connect master, ``merge_schema`` or rows of another shape) each partition is its own
commit through the DataFrame writer, which evolves the table's schema or refuses the rows as
Delta's writer does.

The rest of the exactly-once bookkeeping is shared with Iceberg (``tables.py``): the recorded
versions are the table's committed offsets, read from its log (``delta_log.transactions``).

One table per (topic, consumer group): the application ids name the topic partition only.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Callable

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


class ConcurrentOffsets(Exception):
    """Another writer recorded a partition's offsets at or past this job's since the uploader
    read them; the job is retried, and then skips what the table holds."""


def commits_per_partition(spark, merge_schema: bool) -> bool:
    """Will ``append`` make one commit per partition (so the caller had better persist the
    rows it filters once per partition)?"""
    return merge_schema or getattr(spark, "_jvm", None) is None


def append(spark, df, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
           merge_schema: bool = False) -> None:
    """Append ``df``, recording each topic partition's newest offset (``versions``) as its
    application's transaction version: in one commit where ``_append_one_commit`` can, else
    one commit per partition.  ``merge_schema``: Delta's own option, new columns (fields of
    ``value``) join the table."""
    if not commits_per_partition(spark, merge_schema):
        schema = df._jdf.schema().asNullable().json()
        files = lambda txn: list(spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(  # noqa: E731
            txn.writeFiles(df._jdf)))
        if _append_one_commit(spark, table_path, partition_by, versions, schema, files):
            return
    from pyspark.sql import functions as F
    for (topic, partition), version in sorted(versions.items()):
        (df.where((F.col("topic") == topic) & (F.col("partition") == partition))
         .write.format("delta").mode("append")
         .option("txnAppId", app_id(topic, partition)).option("txnVersion", version)
         .option("mergeSchema", str(merge_schema).lower())
         .partitionBy(*partition_by).save(table_path))


def append_files(spark, pieces, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
                 schema) -> bool:
    """The direct path's append: ``pieces`` (``arrow_rows.job_rows`` of each batch) written as Parquet files by
    ``delta_files`` and committed as ``append`` commits the DataFrame's (one commit, a ``txn``
    action per partition).  ``schema``: the rows' Spark schema (pyspark), which must be the
    table's.  False (nothing written) when it is not, or over Spark Connect: the caller then
    takes the Spark path, which evolves the table or names the mismatch."""
    if commits_per_partition(spark, False):
        return False
    from .delta_files import write_files   # pyarrow: the uploader's, never a worker's (staged.py)
    jvm = spark._jvm
    schema_json = spark._jsparkSession.parseDataType(schema.json()).asNullable().json()
    action = jvm.org.apache.spark.sql.delta.actions.Action

    def files(txn) -> list | None:
        # Delta's writer checks a table's CHECK constraints on every row; this path does not.
        # (Generated, identity and column-mapped columns carry field metadata, so such a table's
        # schema is not the rows' and never gets this far.)
        config = jvm.scala.jdk.javaapi.CollectionConverters.asJava(txn.metadata().configuration())
        if any(str(key).startswith("delta.constraints.") for key in config.keySet()):
            return None
        return [action.fromJson(json.dumps({"add": add})) for add in write_files(pieces, table_path, partition_by)]
    return _append_one_commit(spark, table_path, partition_by, versions, schema_json, files)


def _append_one_commit(spark, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
                       schema: str, files: Callable[[object], list | None]) -> bool:
    """One Delta commit: the rows' files (``files(txn)`` writes them and gives their actions,
    or None: not for this table)
    plus a ``txn`` action per partition, and for a new table its metadata.  False (nothing
    done) when the rows' schema (``schema``, Spark's JSON of it, all nullable) or partitioning
    is not the table's (the DataFrame writer then evolves the table, or names the mismatch)."""
    jvm = spark._jvm
    scala = jvm.scala
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table_path)
    txn = log.startTransaction()
    if txn.readVersion() < 0:
        # Two uploaders creating the table at once: Delta lets one commit version 0 and fails
        # the other, whose job is retried against the table the first created.
        txn.updateMetadataForNewTable(_new_table_metadata(jvm, schema, partition_by))
    else:
        meta = txn.metadata()
        if (meta.schema().asNullable().json() != schema
                or list(scala.jdk.javaapi.CollectionConverters.asJava(meta.partitionColumns())) != list(partition_by)):
            return False
    # What ``txn.txnVersion(app)`` does, without its cost: it registers the application as read
    # (a concurrent commit that records it is then a conflict at ``commit``) and looks the version
    # up in the snapshot's transactions, which Delta computes with a Spark job over the log for
    # every new snapshot, 1-3 s a job here.  The versions are read from the log files instead
    # (``delta_log``), after the transaction began: at or past its snapshot, so a commit the
    # read misses came after it and is caught as a conflict.
    read, table_offsets = txn.readTxn(), committed_offsets(table_path)
    for (topic, partition), version in sorted(versions.items()):
        read.addOne(app_id(topic, partition))
        recorded = table_offsets.get((topic, partition), -1)
        if recorded >= version:
            raise ConcurrentOffsets(f"the Delta table at {table_path} already records offset {recorded} of "
                                    f"{topic}[{partition}] (this job's newest is {version}): another writer got "
                                    "there first; the job is retried without what the table holds")
    actions = files(txn)
    if actions is None:
        return False
    now = scala.Option.apply(jvm.java.lang.Long.valueOf(int(time.time() * 1000)))
    for (topic, partition), version in sorted(versions.items()):
        actions.append(jvm.org.apache.spark.sql.delta.actions.SetTransaction(app_id(topic, partition), version, now))
    none = scala.Option.empty()
    columns = scala.Option.apply(_scala_list(jvm, partition_by))
    operation = jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
        jvm.org.apache.spark.sql.SaveMode.Append, columns, none, none, none, none, none, none, none)
    txn.commit(_scala_list(jvm, actions), operation)
    return True


def _new_table_metadata(jvm, schema_json: str, partition_by: list[str]):
    """A new table's ``metaData`` action: the rows' (nullable) schema, ``partition_by``, no
    table properties; Delta adds the protocol when the transaction commits it."""
    actions = jvm.org.apache.spark.sql.delta.actions
    defaults = getattr(getattr(actions, "Metadata$"), "MODULE$")
    parquet = actions.Format("parquet", getattr(getattr(getattr(actions, "Format$"), "MODULE$"), "apply$default$2")())
    created = jvm.scala.Option.apply(jvm.java.lang.Long.valueOf(int(time.time() * 1000)))
    return actions.Metadata(str(uuid.uuid4()), None, None, parquet, schema_json, _scala_list(jvm, partition_by),
                            getattr(defaults, "apply$default$7")(), created)


def _scala_list(jvm, items):
    """A Scala immutable List of ``items`` (Python or Java objects), as Delta's API takes."""
    java = jvm.java.util.ArrayList()
    for item in items:
        java.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(java).toList()


def warm_up(spark, rows, scratch: str, partition_by: list[str], schema) -> None:
    """Run Delta's commit and checkpoint once on a scratch table at ``scratch`` (removed
    after): the uploader's first Spark job is otherwise the table's first checkpoint, ten
    commits in, and a cold first job held one job 16 s (the checkpoint and its state, computed
    by a Spark job; direct writes run no other).  ``rows``: one row as ``arrow_rows`` builds it."""
    import shutil
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        if append_files(spark, [rows], scratch, partition_by, {("kdaemon-warm-up", 0): 0}, schema):
            spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, scratch).checkpoint()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

