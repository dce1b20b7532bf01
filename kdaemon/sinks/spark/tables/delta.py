"""Exactly-once into a Delta Lake table (``format = "delta"``): Delta's idempotent writes.

Each topic partition is one idempotent application of the table, ``kdaemon:<topic>:<partition>``,
whose transaction version is the newest offset of that partition in the table.  Delta records
the pair (a ``txn`` action) in the same atomic commit as the rows, and a transaction that read an
application's version conflicts with any concurrent commit that changes it; so the recorded
version of a partition is the newest offset of it in the table, whoever wrote it — another
uploader, another daemon sharing the table — and a write repeated after a crash adds nothing.

A job is **one commit** carrying every partition's ``txn`` action: the direct path's, written by
Python (``append_files``, below), or a Spark-written job's (``_append_one_commit``),
through Delta's transaction API on the JVM (``DeltaLog.startTransaction``, ``writeFiles``,
``commit``): a Delta commit costs about a second of driver time on a small machine, and the
DataFrame writer's ``txnAppId``/``txnVersion`` options carry one application per commit, which
made a job of four partitions four commits.  That path needs the classic session (py4j) and a
table whose schema the rows already fit, or no table yet (its metadata, the rows' schema and
``partition_by``, then goes in the same commit, as Delta's own writer does); otherwise (a
Spark Connect master, ``merge_schema`` or rows of another shape) each partition is its own
commit through the DataFrame writer, which evolves the table's schema or refuses the rows as
Delta's writer does.

The uploader's direct path (``append_files``: files written by ``delta_files``, no Spark)
makes the same one commit without the JVM, by writing the commit file itself as Delta's
protocol describes it (``delta_commit``: atomic put-if-absent of ``<version>.json``, the state
read from the log by ``delta_log``), so a daemon delivers its first job without waiting for a
JVM; it refuses, writing nothing, any table whose writer rules a blind append does not already
follow.  Delta's checkpoints stay the JVM's (``checkpoint_due``, ``checkpoint``): the caller
runs one beside the jobs every ``delta.checkpointInterval`` commits, as Delta's writer would.

The rest of the exactly-once bookkeeping is shared with Iceberg (``formats.py``): the recorded
versions are the table's committed offsets, read from its log (``delta_log.transactions``).

One table per (topic, consumer group): the application ids name the topic partition only.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Callable

from . import delta_log
from .delta_log import transactions
from .jars import staged_jars

log = logging.getLogger("kdaemon.spark.uploader")

# A lost race costs a state read and a commit file; two uploaders take turns, so a job that
# loses this many in a row is facing something else (a writer loop, a clock, a bug).
COMMIT_ATTEMPTS = 20
# table path -> (the version append_files committed, its checkpoint interval), for checkpoint_due.
_intervals: dict[str, tuple[int, int]] = {}


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


class DeltaCommitContended(Exception):
    """``append_files`` lost the race for the next version ``COMMIT_ATTEMPTS`` times in a row
    (its files are removed); the job is retried."""


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


def append_files(pieces, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
                 schema) -> int | None:
    """The direct path's append, without Spark: ``pieces`` (``arrow_rows`` tables, a batch each)
    written as Parquet files by ``delta_files`` and committed by Python (``delta_commit``) as
    ``append`` commits a DataFrame's: one commit, a ``txn`` action per partition, for a new
    table its protocol and metadata.  ``schema``: the rows' Spark schema (pyspark), which must
    be the table's.  Returns the committed version; None, with nothing written, for a table
    this commit must not write (``delta_commit.refusal``): the caller then takes the Spark
    path, which evolves the table or names the mismatch.  ``ConcurrentOffsets`` when the
    table records a partition at or past ``versions``.

    A lost race for the version (another writer committed it first) reads the state again:
    a partition recorded meanwhile is ``ConcurrentOffsets``, a table changed so that it is
    refused is None; either way the files written are removed first (no commit names them, so
    nobody reads them, and "None" keeps meaning "nothing written").  Otherwise the commit is
    tried again at the next version (a blind append conflicts with nothing else), at most
    ``COMMIT_ATTEMPTS`` times (then ``DeltaCommitContended``, the files removed).  Files of a
    commit whose outcome is unknown (an unforeseen error, an interrupt) stay behind unreferenced,
    as a failed Delta writer's do."""
    from . import delta_commit
    from .delta_files import remove_files, write_files   # pyarrow: the uploader's, never a worker's
    rows_schema = delta_commit.nullable(schema.jsonValue())
    txns = {app_id(topic, partition): version for (topic, partition), version in versions.items()}
    state = delta_log.read_state(table_path)
    if (reason := delta_commit.refusal(state, rows_schema, partition_by)) is not None:
        log.debug("the Delta table at %s is written by Spark: %s", table_path, reason)
        return None
    _check_offsets(state, table_path, versions)
    adds = write_files(pieces, table_path, partition_by)
    # The files are removed only where the commit is known not to have happened; after anything
    # unforeseen (an error reading the log, an interrupt) they stay, unreferenced, as a failed
    # Delta writer's do: removing a committed commit's files would break the table.
    for _ in range(COMMIT_ATTEMPTS):
        actions = delta_commit.append_actions(state, rows_schema, partition_by, adds, txns)
        if delta_commit.put_if_absent(delta_log.log_dir(table_path), state.version + 1, actions):
            _intervals[table_path] = (state.version + 1, delta_commit.checkpoint_interval(state))
            return state.version + 1
        state = delta_log.read_state(table_path)
        try:
            _check_offsets(state, table_path, versions)
        except ConcurrentOffsets:
            remove_files(table_path, adds)
            raise
        if (reason := delta_commit.refusal(state, rows_schema, partition_by)) is not None:
            log.info("the Delta table at %s changed during a job (%s): its files are removed and "
                     "the job goes through Spark", table_path, reason)
            remove_files(table_path, adds)
            return None
    remove_files(table_path, adds)
    raise DeltaCommitContended(
        f"the Delta table at {table_path}: {COMMIT_ATTEMPTS} commits in a row lost their version to "
        f"other writers (newest {state.version}); the job is retried")


def _check_offsets(state, table_path: str, versions: dict[tuple[str, int], int]) -> None:
    for (topic, partition), version in sorted(versions.items()):
        recorded = state.txns.get(app_id(topic, partition), -1)
        if recorded >= version:
            raise ConcurrentOffsets(f"the Delta table at {table_path} already records offset {recorded} of "
                                    f"{topic}[{partition}] (this job's newest is {version}): another writer got "
                                    "there first; the job is retried without what the table holds")


def checkpoint_due(table_path: str, version: int) -> bool:
    """Is ``version`` (a commit of ``append_files``) one Delta would checkpoint after: a
    multiple of the table's ``delta.checkpointInterval`` (default 10)?  Then the caller runs
    ``checkpoint`` (the JVM's, in the background): without checkpoints every read of the state,
    ours and Spark's, reads every commit."""
    if version <= 0:
        return False
    known = _intervals.get(table_path)
    if known is not None and known[0] == version:
        interval = known[1]
    else:
        from . import delta_commit
        interval = delta_commit.checkpoint_interval(delta_log.read_state(table_path))
    return version % interval == 0


def checkpoint(spark, table_path: str, version: int | None = None) -> None:
    """Delta's own checkpoint of the table (a Spark job): of ``version`` (Delta's writer
    checkpoints exactly the versions ``checkpoint_due`` names), or of the newest.  The JVM's
    DeltaLog caches its snapshot and never saw the Python commits: it is updated first."""
    jvm = spark._jvm
    log_ = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, table_path)
    none = jvm.scala.Option.empty()
    if version is None:
        snapshot = _updated_snapshot(spark, log_)
    else:   # (version, lastCheckpointHint, catalogTable, enforceTimeTravelWithinDeletedFileRetention)
        snapshot = log_.getSnapshotAt(version, none, none, False)
    log_.checkpoint(snapshot, none)


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


def _updated_snapshot(spark, delta_log_):
    """``DeltaLog.update()``: its newest snapshot, read from the log now."""
    none = spark._jvm.scala.Option.empty()
    return delta_log_.update(False, none, none)


def warm_up(spark, rows, scratch: str, partition_by: list[str], schema) -> None:
    """Run a direct commit and Delta's checkpoint once on a scratch table at ``scratch``
    (removed after): the table's first checkpoint, ten commits in, is otherwise the uploader's
    first Spark job, and a cold one held one job 16 s (the checkpoint and its state, computed by
    a Spark job; direct writes run no other).  ``rows``: one row as ``arrow_rows`` builds it."""
    import shutil
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        if append_files([rows], scratch, partition_by, {("kdaemon-warm-up", 0): 0}, schema) is not None:
            checkpoint(spark, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
