"""The direct path's Delta commit through delta-rs: which tables a blind append of kdaemon's own
data files may go to (``refusal``), the commit of a job's files with its partitions'
application transactions (``commit``), and the checkpoint after it (``checkpoint_if_due``).
``delta.append_files`` runs them: read the state, refuse or check the offsets, write the data
files, commit, and on a lost race read again.

**The commit.**  ``DeltaTable.create_write_transaction`` (a table that exists) or
``create_table_with_add_actions`` (a new one: its protocol, metadata and the files in version 0,
or a lost race when another writer created it first) with
``CommitProperties(app_transactions=...)``: one ``txn`` action per application, in the same
atomic commit as the ``add`` actions.  delta-rs commits at the next version with put-if-absent;
when another writer took it, delta-rs checks the winning commits against this one (Delta's
conflict rules) and tries the next version itself (``max_commit_retries``, 15) unless one
conflicts: a ``txn`` of an application this commit records (another uploader of the same
partition), a metadata or protocol change (say, ``ADD CONSTRAINT``).  Those raise
``CommitFailedError`` before anything is written: a *lost* race (``Lost``), which the caller
settles by reading the table again.

**What a blind append of these files may go to.**  delta-rs refuses to commit to a table whose
protocol lists a writer feature it does not support (``UnsupportedTableFeatures``: row
tracking, domain metadata, in-commit timestamps, identity columns, column defaults,
clustering, any feature it does not know): ``Refused``, naming them.  What delta-rs supports and
still must not get these files is refused here, before any file is written: the caller's
rows are built by ``arrow_rows`` and written by ``delta_files`` without delta-rs seeing them, so
nothing checks them against the table, and ``create_write_transaction`` in append mode does
not compare the schema (delta-rs 1.6 builds the error and drops it).  So:

* CHECK constraints (``delta.constraints.*``): refused while any is set (Spark's writer checks
  them, and sends the rows that fail one to the dead letters: ``refused_rows``);
* the schema: exactly the rows' (every field nullable, no column metadata: so no column
  invariants, generated columns, identity columns or NOT NULL fields either);
* the partitioning: exactly ``partition_by``;
* column mapping (the files would need its physical names and field ids), and the table
  features this append was not checked against: writer version 7 with only
  ``ACCEPTED_FEATURES``, no reader version above 3, no writer version 5 or 6.

**Checkpoints** are delta-rs's (``DeltaTable.create_checkpoint``, the state at the version just
read), made right after a commit that lands on a multiple of the table's
``delta.checkpointInterval``, as Spark's Delta does: delta-rs's own post-commit hook counts
differently (version + 1) and, without the property, every 100 commits where Delta's default is
10; and an error of the hook would fail a job whose commit happened.  So the hook writes none
and cleans no log; here a failed checkpoint costs only a warning (the next one covers it), and
after a checkpoint the expired log files are removed (``cleanup_metadata``) unless the table
sets ``delta.enableExpiredLogCleanup = false``.  A checkpoint leaves out the ``txn`` actions
older than ``delta.setTransactionRetentionDuration``, as Spark's does (``delta.py`` keeps
kdaemon's fresh).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("kdaemon.spark.uploader")

# Writer features a blind append of kdaemon's files honours (nothing to write for them, or
# checked here) and delta-rs 1.6 writes.
ACCEPTED_FEATURES = frozenset({
    "appendOnly", "invariants", "checkConstraints", "generatedColumns", "changeDataFeed",
    "deletionVectors", "timestampNtz", "v2Checkpoint"})
DEFAULT_CHECKPOINT_INTERVAL = 10   # Delta's (Spark's) default
# CommitFailedError's text for a table delta-rs will not write at all (not a lost race).
_NOT_WRITABLE = ("Unsupported table features", "Table features must be specified", "append-only")


@dataclass(frozen=True)
class Committed:
    version: int   # the table's newest version right after the commit: this one's, unless another came since


@dataclass(frozen=True)
class Lost:
    """Another writer's commit conflicts with this one; nothing was written."""
    reason: str


@dataclass(frozen=True)
class Refused:
    """delta-rs does not write this table; nothing was written."""
    reason: str


def nullable(data_type):
    """Spark's ``asNullable`` of a type's JSON (``StructType.jsonValue()``): every struct field,
    array element and map value may be null, as Delta's writer stores a new table's schema."""
    if isinstance(data_type, dict):
        kind = data_type.get("type")
        if kind == "struct":
            return {**data_type, "fields": [{**f, "type": nullable(f["type"]), "nullable": True}
                                             for f in data_type["fields"]]}
        if kind == "array":
            return {**data_type, "elementType": nullable(data_type["elementType"]), "containsNull": True}
        if kind == "map":
            return {**data_type, "keyType": nullable(data_type["keyType"]),
                    "valueType": nullable(data_type["valueType"]), "valueContainsNull": True}
    return data_type


def refusal(table, schema: dict, partition_by: list[str]) -> str | None:
    """Why a blind append of rows of ``schema`` (all nullable, as ``nullable`` makes it),
    partitioned by ``partition_by``, must not go to ``table`` (a ``DeltaTable``; None: no table
    yet), or None where it may."""
    if table is None:
        return None   # a new table: its protocol and metadata are this commit's
    protocol = table.protocol()
    reader, writer = protocol.min_reader_version, protocol.min_writer_version
    if reader > 3 or writer > 7:
        return f"protocol ({reader}, {writer}) is newer than this writer knows"
    if writer in (5, 6):
        return f"writer version {writer} (column mapping, identity columns)"
    if writer == 7:
        features = set(protocol.writer_features or ()) | set(protocol.reader_features or ())
        if unknown := sorted(features - ACCEPTED_FEATURES):
            return f"table features {', '.join(unknown)}"
    elif reader == 3:
        return "reader features without writer features"
    config = dict(table.metadata().configuration or {})
    if constraints := sorted(k for k in config if k.startswith("delta.constraints.")):
        return f"CHECK constraints ({', '.join(c.removeprefix('delta.constraints.') for c in constraints)})"
    if (config.get("delta.columnMapping.mode") or "none").lower() != "none":
        return "column mapping"
    for key in ("delta.enableRowTracking", "delta.enableInCommitTimestamps"):
        if (config.get(key) or "false").lower() == "true":
            return key
    if list(table.metadata().partition_columns) != list(partition_by):
        return f"partitioned by {list(table.metadata().partition_columns)}, not {partition_by}"
    if json.loads(table.schema().to_json()) != schema:
        return "a schema other than the rows' (other columns or types, a column's metadata, NOT NULL)"
    return None


def checkpoint_interval(config: dict[str, str]) -> int:
    """``delta.checkpointInterval`` of the table (Delta's default: 10)."""
    try:
        return max(1, int(config.get("delta.checkpointInterval", DEFAULT_CHECKPOINT_INTERVAL)))
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL


def commit(table, table_path: str, schema: dict, partition_by: list[str], adds: list, txns: dict[str, int]):
    """Commit ``adds`` (``deltalake.transaction.AddAction``, files already in the table's
    directory) to ``table`` (None: create the table with them), recording each application's
    version (``txns``; ``lastUpdated`` now).  ``Committed``, ``Lost`` or ``Refused``; any other
    error is raised: the commit may or may not have happened."""
    from deltalake import CommitProperties, Schema, Transaction
    from deltalake.exceptions import CommitFailedError, DeltaError
    from deltalake.transaction import PostCommitHookProperties, create_table_with_add_actions
    now = _now_ms()
    app_transactions = [Transaction(app, version, now) for app, version in sorted(txns.items())]
    hook = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
    try:
        if table is None:
            # No retry of its own: delta-rs 1.6's creator that loses version 0 to another reads
            # the table the other created and commits its own metadata (a second table id) on
            # top without a conflict check; here that race is lost, and the job appends to the
            # other's table.
            create_table_with_add_actions(table_path, Schema.from_json(json.dumps(schema)), adds, mode="error",
                                          partition_by=list(partition_by),
                                          commit_properties=CommitProperties(max_commit_retries=0,
                                                                             app_transactions=app_transactions),
                                          post_commithook_properties=hook)
        else:
            table.create_write_transaction(adds, "append", Schema.from_json(json.dumps(schema)),
                                           partition_by=list(partition_by),
                                           commit_properties=CommitProperties(app_transactions=app_transactions),
                                           post_commithook_properties=hook)
    except CommitFailedError as exc:
        text = _first_line(exc)
        return Refused(text) if any(marker in text for marker in _NOT_WRITABLE) else Lost(text)
    except DeltaError as exc:
        if table is None and "already exists" in str(exc):
            return Lost("another writer created the table first")   # checked before anything is written
        raise
    from . import delta_state
    after = delta_state.open_table(table_path)
    return Committed(after.version())


def checkpoint_if_due(table_path: str, version: int) -> None:
    """Delta's checkpoint of the table at ``version`` (the one just read: a multiple of its
    ``delta.checkpointInterval``), written by delta-rs; then the expired log files removed.  A
    failure is logged (the next checkpoint covers it): the commit before it happened."""
    from . import delta_state
    try:
        table = delta_state.open_table(table_path)
        if table is None or table.version() != version:
            return   # another commit came: the writer of a later multiple checkpoints
        config = delta_state.configuration(table)
        if version <= 0 or version % checkpoint_interval(config):
            return
        started = time.monotonic()
        table.create_checkpoint()
        if (config.get("delta.enableExpiredLogCleanup") or "true").lower() != "false":
            table.cleanup_metadata()
    except Exception as exc:
        log.warning("Delta's checkpoint of %s at version %d failed (the next one covers it): %s: %s", table_path,
                    version, type(exc).__name__, _first_line(exc))
        return
    log.info("checkpointed the Delta table at %s (version %d) in %.2fs", table_path, version, time.monotonic() - started)


def _now_ms() -> int:
    """The ``lastUpdated`` of a commit's ``txn`` actions: now."""
    return int(time.time() * 1000)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
