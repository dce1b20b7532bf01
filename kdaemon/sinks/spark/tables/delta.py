"""Exactly-once into a Delta Lake table (``format = "delta"``): Delta's idempotent writes.

Each topic partition is one idempotent application of the table, ``kdaemon:<topic>:<partition>``,
whose transaction version is the newest offset of that partition in the table.  Delta records
the pair (a ``txn`` action) in the same atomic commit as the rows, and a transaction that read an
application's version conflicts with any concurrent commit that changes it; so the recorded
version of a partition is the newest offset of it in the table, whoever wrote it — another
uploader, another daemon sharing the table — and a write repeated after a crash adds nothing.

A job is **one commit** carrying every partition's ``txn`` action.  Two writers make it:

* **the direct path** (``append_files``: local mode, rows ``arrow_rows`` builds): kdaemon writes
  the data files (``delta_files``, two write lanes) and delta-rs commits them
  (``delta_commit``: ``create_write_transaction`` with ``CommitProperties(app_transactions)``),
  no JVM, so a daemon delivers its first job without waiting for one.  It refuses, writing
  nothing, a table whose rules a blind append of these files would not follow (CHECK
  constraints, another schema or partitioning, column mapping, writer features delta-rs or
  this append does not support, named); the job then goes through Spark, which evolves the
  table, names the mismatch, or keeps refused rows out (``refused_rows``).
* **Spark** (``append``): Delta's transaction API on the JVM (``DeltaLog.startTransaction``,
  ``writeFiles``, ``commit``) where the session is classic (py4j) and the rows fit the table
  (or there is none yet: its metadata goes in the same commit); otherwise (Spark Connect,
  ``merge_schema``, rows of another shape) one commit per partition through the DataFrame
  writer's ``txnAppId``/``txnVersion``, which evolves the schema or refuses the rows as Delta's
  writer does.

Both read the recorded versions through delta-rs (``delta_state``: ``transaction_version``, the
same application ids and versions earlier kdaemon versions wrote, so their tables go on
without a gap).  Checkpoints: the direct path's are delta-rs's, written after a commit that
lands on a multiple of ``delta.checkpointInterval`` (``delta_commit.checkpoint_if_due``); the
JVM's commits checkpoint as Delta's writer does.

**Table maintenance keeps the offsets.**  OPTIMIZE (Spark's, or delta-rs's ``optimize.compact``)
removes and adds files with ``dataChange = false`` and no ``txn`` action: the versions stay, and
a blind append does not conflict with it (delta-rs and Spark commit past it).  VACUUM removes
files no version needs, never the log (nor ``_kdaemon``, a hidden directory to both).
Checkpoints carry every ``txn`` action, except those older than
``delta.setTransactionRetentionDuration`` where a table sets it: Delta (Spark and delta-rs)
then drops an application's version at checkpoints and when it reads the state, so a partition
that receives no records for that long would lose its record.  So on such a table every commit
of kdaemon's carries, besides its own partitions', the recorded version of every other
partition of the output (those its manifests name, ``uploaded_partitions``), with
``lastUpdated`` now (``carried_versions``): while kdaemon commits to the table at least once
per retention period, no partition's version expires.  The edge that remains: a table with no
kdaemon commit for a whole retention period (a daemon stopped that long, or a retention
shorter than the time since the last commit when it is set) loses its partitions' versions;
the manifests in ``_kdaemon`` still make a replay of those offsets add nothing.

**The data files: kdaemon's, not ``write_deltalake``'s.**  bench/spark/delta_write.py, on the
two-core development machine otherwise idle (2026-12-02, deltalake 1.6.6, pyarrow 26.0.1): jobs
of 100,000 of the peer bench's records (four batches, two ``date`` partitions), the median of
five warm jobs per round, four rounds of the new code and two of the old:

=====================================================  ==============  ================
write path                                             wall per job    CPU per job
=====================================================  ==============  ================
kdaemon's files (two write lanes), hand-written commit 0.31-0.34 s     0.40-0.43 s
kdaemon's files (two write lanes), delta-rs commit     0.29-0.37 s     0.38-0.47 s
``write_deltalake`` (same rows, same app transactions) 0.35-0.46 s     0.45-0.57 s
=====================================================  ==============  ================

So the direct path keeps writing its own files (``delta_files``: the same speed as before,
delta-rs's commit costs a few milliseconds a job) and hands delta-rs the file list;
``write_deltalake`` was slower in every round (by 5-55%, about a fifth over all rounds) and used
about a fifth more CPU, and a commit it loses leaves its files behind where the direct path
removes its own.

One table per (topic, consumer group): the application ids name the topic partition only.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Callable

from . import delta_state, layout
from .jars import staged_jars

log = logging.getLogger("kdaemon.spark.uploader")

# A lost race costs a state read and a commit; two uploaders take turns, so a job that loses
# this many in a row is facing something else (a writer loop, a clock, a bug).  delta-rs tries
# past commits that do not conflict on its own; these are the ones that did.
COMMIT_ATTEMPTS = 20
RETENTION = "delta.setTransactionRetentionDuration"


def app_id(topic: str, partition: int) -> str:
    return f"kdaemon:{topic}:{partition}"


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


def uploaded_partitions(table_path: str) -> set[tuple[str, int]]:
    """The (topic, partition)s kdaemon uploaded to (or began an upload to) the output at
    ``table_path``: those its manifests and pending records name (``layout``).  Delta cannot
    list the application ids a table records; these are kdaemon's."""
    out = set()
    for kind in ("manifests", "pending"):
        base = os.path.join(layout.kdaemon_dir(table_path), kind)
        try:
            topics = os.listdir(base)
        except FileNotFoundError:
            continue
        for topic in topics:
            try:
                partitions = os.listdir(os.path.join(base, topic))
            except (FileNotFoundError, NotADirectoryError):
                continue
            out.update((topic, int(p)) for p in partitions if p.isdigit())
    return out


def committed_offsets(table_path: str, keys=None) -> dict[tuple[str, int], int]:
    """Each (topic, partition) of ``keys``' newest offset in the table: its application's
    recorded version, read through delta-rs (``delta_state``).  ``keys`` None: those of
    ``uploaded_partitions``.  A partition the table records nothing of (or no table) is left
    out."""
    return recorded(delta_state.open_table(table_path), uploaded_partitions(table_path) if keys is None else keys)


def recorded(table, keys) -> dict[tuple[str, int], int]:
    """``committed_offsets`` from a ``DeltaTable`` already open (None: no table)."""
    found = delta_state.versions(table, [app_id(*key) for key in keys])
    return {key: found[app_id(*key)] for key in keys if app_id(*key) in found}


def carried_versions(table, table_path: str, versions: dict[tuple[str, int], int]) -> dict[str, int]:
    """What a commit of ``versions`` records besides them on a table that sets ``RETENTION``:
    every other partition of ``uploaded_partitions`` at the version ``table`` records for it,
    so that its ``txn`` action's ``lastUpdated`` is renewed (see the module docstring).  {} on
    a table that does not set it: nothing there expires, and every commit recording every
    partition would make any two concurrent ones conflict."""
    if table is None or RETENTION not in delta_state.configuration(table):
        return {}
    others = uploaded_partitions(table_path) - set(versions)
    return {app_id(*key): version for key, version in recorded(table, others).items()}


class ConcurrentOffsets(Exception):
    """Another writer recorded a partition's offsets at or past this job's since the uploader
    read them; the job is retried, and then skips what the table holds."""


class DeltaCommitContended(Exception):
    """``append_files`` lost the race to a conflicting commit ``COMMIT_ATTEMPTS`` times in a row
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
    written as Parquet files by ``delta_files`` and committed by delta-rs (``delta_commit``) as
    ``append`` commits a DataFrame's: one commit, a ``txn`` action per partition (and on a
    table that sets ``RETENTION``, per other partition of the output: ``carried_versions``), for
    a new table its protocol and metadata.  ``schema``: the rows' Spark schema (pyspark), which
    must be the table's.  Returns the table's version right after the commit (this job's, unless
    another writer committed since); None, with nothing written, for a table this commit must
    not write (``delta_commit.refusal``, or delta-rs refusing its writer features): the caller
    then takes the Spark path, which evolves the table or names the mismatch.
    ``ConcurrentOffsets`` when the table records a partition at or past ``versions``.

    A race lost to a conflicting commit (delta-rs commits past the others itself) reads the
    table again: a partition recorded meanwhile is ``ConcurrentOffsets``, a table changed so that
    it is refused is None; either way the files written are removed first (no commit names them,
    so nobody reads them, and "None" keeps meaning "nothing written").  Otherwise the commit is
    tried again, at most ``COMMIT_ATTEMPTS`` times (then ``DeltaCommitContended``, the files
    removed).  Files of a commit whose outcome is unknown (an unforeseen error, an interrupt)
    stay behind unreferenced, as a failed Delta writer's do."""
    from . import delta_commit
    from .delta_files import remove_files, write_files   # pyarrow: the uploader's, never a worker's
    rows_schema = delta_commit.nullable(schema.jsonValue())
    txns = {app_id(topic, partition): version for (topic, partition), version in versions.items()}
    table = delta_state.open_table(table_path)
    if (reason := delta_commit.refusal(table, rows_schema, partition_by)) is not None:
        log.debug("the Delta table at %s is written by Spark: %s", table_path, reason)
        return None
    _check_offsets(table, table_path, versions)
    adds = write_files(pieces, table_path, partition_by)
    # The files are removed only where the commit is known not to have happened; after anything
    # unforeseen (an error reading the table, an interrupt) they stay, unreferenced, as a failed
    # Delta writer's do: removing a committed commit's files would break the table.
    for _ in range(COMMIT_ATTEMPTS):
        carried = carried_versions(table, table_path, versions)
        outcome = delta_commit.commit(table, table_path, rows_schema, partition_by, adds, {**carried, **txns})
        if isinstance(outcome, delta_commit.Committed):
            delta_commit.checkpoint_if_due(table_path, outcome.version)
            return outcome.version
        if isinstance(outcome, delta_commit.Refused):
            log.info("delta-rs does not write the Delta table at %s (%s): the job's files are removed and it goes "
                     "through Spark", table_path, outcome.reason)
            remove_files(table_path, adds)
            return None
        table = delta_state.open_table(table_path)
        try:
            _check_offsets(table, table_path, versions)
        except ConcurrentOffsets:
            remove_files(table_path, adds)
            raise
        if (reason := delta_commit.refusal(table, rows_schema, partition_by)) is not None:
            log.info("the Delta table at %s changed during a job (%s): its files are removed and the job goes "
                     "through Spark", table_path, reason)
            remove_files(table_path, adds)
            return None
    remove_files(table_path, adds)
    raise DeltaCommitContended(
        f"the Delta table at {table_path}: {COMMIT_ATTEMPTS} commits in a row lost to conflicting commits of "
        f"other writers (the last: {outcome.reason}); the job is retried")


def _check_offsets(table, table_path: str, versions: dict[tuple[str, int], int]) -> None:
    found = recorded(table, versions)
    for (topic, partition), version in sorted(versions.items()):
        recorded_version = found.get((topic, partition), -1)
        if recorded_version >= version:
            raise ConcurrentOffsets(f"the Delta table at {table_path} already records offset {recorded_version} of "
                                    f"{topic}[{partition}] (this job's newest is {version}): another writer got "
                                    "there first; the job is retried without what the table holds")


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
    # every new snapshot, 1-3 s a job here.  The versions are read through delta-rs instead
    # (``delta_state``), after the transaction began: at or past its snapshot, so a commit the
    # read misses came after it and is caught as a conflict.  The partitions a table that sets
    # ``RETENTION`` has its versions renewed for (``carried_versions``) are registered as read too.
    read, table = txn.readTxn(), delta_state.open_table(table_path)
    table_offsets = recorded(table, versions)
    for (topic, partition), version in sorted(versions.items()):
        read.addOne(app_id(topic, partition))
        recorded_version = table_offsets.get((topic, partition), -1)
        if recorded_version >= version:
            raise ConcurrentOffsets(f"the Delta table at {table_path} already records offset {recorded_version} of "
                                    f"{topic}[{partition}] (this job's newest is {version}): another writer got "
                                    "there first; the job is retried without what the table holds")
    carried = carried_versions(table, table_path, versions)
    for app in sorted(carried):
        read.addOne(app)
    actions = files(txn)
    if actions is None:
        return False
    now = scala.Option.apply(jvm.java.lang.Long.valueOf(int(time.time() * 1000)))
    txns = {**carried, **{app_id(topic, partition): version for (topic, partition), version in versions.items()}}
    for app, version in sorted(txns.items()):
        actions.append(jvm.org.apache.spark.sql.delta.actions.SetTransaction(app, version, now))
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
