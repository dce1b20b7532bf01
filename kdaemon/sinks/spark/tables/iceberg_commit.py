"""Iceberg commits without a JVM: pyiceberg's ``Transaction`` on kdaemon's Hadoop catalog.

``iceberg_catalog.HadoopCatalog`` makes a commit what a Hadoop table's commit is (the atomic
creation of ``v<N+1>.metadata.json``); pyiceberg's public API builds everything in it.  The two
commits kdaemon makes:

* ``create``: the table as Spark's ``df.writeTo(ident).using("iceberg").tableProperty(
  "format-version", "2").partitionedBy(...).create()`` makes it (``Catalog.create_table_transaction``
  and one empty append: Spark's create is a CTAS of no rows);
* ``commit_append``: one append (``Transaction.update_snapshot(snapshot_properties=...)
  .merge_append()``) of data files already written (``iceberg_files``: built as
  ``DataFile``s, since ``Transaction.add_files`` would infer their partitions from truncated
  bounds and keep pyiceberg's metrics, not Java's), with the table properties set in the same
  transaction.

Manifest merging is the table property ``commit.manifest-merge.enabled``: Java merges by
default, pyiceberg does not, so an append to a table without the property sets it to Java's
default, ``true``; then both writers merge the manifests alike (100 of them, then one).

A lost race is not pyiceberg's retry, which applies the same staged updates to the newer
metadata: ``build`` computes the snapshot summary, the offsets' table properties and the checks
of the table from the metadata the commit lands on, so ``commit_append`` refuses any other base
(the catalog's ``before_commit``) and calls ``build`` again on the new one.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import random
import time

from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.table import Table

from .iceberg_catalog import HadoopCatalog, MetadataUnreadable, local
from .iceberg_meta import version_of

__all__ = ["IcebergCommitError", "Unsupported", "commit_append", "create", "create_properties", "load", "local",
           "schema_json"]

log = logging.getLogger(__name__)

_ATTEMPTS = 30
MERGE_ENABLED = "commit.manifest-merge.enabled"


class IcebergCommitError(Exception):
    """The commit could not be made (the message says why); nothing it wrote is referenced."""


class Unsupported(Exception):
    """The table is not one this path writes (the message says why): the job goes to Spark."""


class _Moved(Exception):
    """The table has a newer version than the one this commit was built on."""


def _catalog(table_path: str, before_commit=None) -> tuple[HadoopCatalog, tuple[str, str]]:
    """The catalog of the table's warehouse, and the table's identifier in it."""
    parent, name = os.path.split(os.path.abspath(table_path))
    warehouse, namespace = os.path.split(parent)
    return HadoopCatalog(warehouse=warehouse, before_commit=before_commit), (namespace, name)


def load(table_path: str) -> Table | None:
    """The table at its newest version, None if it has none; ``Unsupported`` if pyiceberg
    does not read it."""
    catalog, ident = _catalog(table_path)
    try:
        return catalog.load_table(ident)
    except NoSuchTableError:
        return None
    except MetadataUnreadable as exc:
        raise Unsupported(str(exc)) from None


# -- creating a table ------------------------------------------------------------------------------

def create_properties() -> dict[str, str]:
    """The properties Spark's ``writeTo(...).create()`` gives a new table through Iceberg 1.x's
    SparkCatalog: its owner (the Hadoop user) and the codec new tables persist."""
    return {"owner": os.environ.get("HADOOP_USER_NAME") or getpass.getuser(),
            "write.parquet.compression-codec": "zstd"}


def create(table_path: str, schema, partition_by: list[str]) -> bool:
    """Create the table as Spark creates it for rows of ``schema`` (a pyiceberg Schema, ids to
    be assigned): v1.metadata.json holding the schema with fresh ids, identity partitions on
    ``partition_by``, no sort order, and one empty append snapshot.  False when another writer
    created v1 first (what this one wrote is removed)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform
    spec = PartitionSpec(*[PartitionField(source_id=schema.find_field(c).field_id, field_id=1000 + i,
                                          transform=IdentityTransform(), name=c) for i, c in enumerate(partition_by)])
    catalog, ident = _catalog(table_path)
    os.makedirs(os.path.join(catalog.table_path(ident), "metadata"), exist_ok=True)
    try:
        txn = catalog.create_table_transaction(ident, schema, partition_spec=spec,
                                               properties={"format-version": "2", **create_properties()})
        txn.update_snapshot().fast_append().commit()
        txn.commit_transaction()
        return True
    except TableAlreadyExistsError:
        catalog.file_io.remove()
        return False
    except BaseException:
        catalog.file_io.remove()
        raise


# -- an append -------------------------------------------------------------------------------------

def commit_append(table_path: str, base: Table, build) -> int:
    """Append in one snapshot and return the new version N.  ``build(table)`` gives, for the
    table at that version, (the data files, the snapshot's extra summary properties, the table
    properties to set, those to remove), or raises to give up (its files are the caller's);
    it is called again on the new version after a lost race."""
    built_on = [base.metadata_location]

    def landing(current: Table) -> None:
        if current.metadata_location != built_on[0]:
            raise _Moved(current.metadata_location)

    catalog, ident = _catalog(table_path, before_commit=landing)
    table = Table(base.name(), base.metadata, base.metadata_location, catalog.file_io, catalog)
    for attempt in range(_ATTEMPTS):
        if attempt:
            try:
                table = catalog.load_table(ident)
            except NoSuchTableError:
                raise IcebergCommitError(f"the Iceberg table {table_path} disappeared during a commit") from None
            except MetadataUnreadable as exc:
                raise Unsupported(str(exc)) from None
        files, summary, properties, removals = build(table)
        built_on[0] = table.metadata_location
        try:
            txn = table.transaction()
            if MERGE_ENABLED not in table.metadata.properties:
                properties = {**properties, MERGE_ENABLED: "true"}   # Java's default, made the table's
            if properties:
                txn.set_properties(properties)
            if removals:
                txn.remove_properties(*removals)
            with txn.update_snapshot(snapshot_properties=summary).merge_append() as append:
                for f in files:
                    append.append_data_file(f)
            return version_of(txn.commit_transaction().metadata_location)
        except (CommitFailedException, _Moved):
            catalog.file_io.remove()
        except BaseException:
            catalog.file_io.remove()
            raise
        log.debug("another writer committed a version of %s after v%s; building the append again on it",
                  table_path, version_of(built_on[0]))
        time.sleep(random.uniform(0.005, 0.05) * min(attempt + 1, 5))
    raise IcebergCommitError(f"{_ATTEMPTS} commits to the Iceberg table {table_path} in a row lost the race "
                             f"to another writer's")


def schema_json(meta) -> dict:
    """The table's current schema as the Iceberg spec writes it (``iceberg_files``' input)."""
    return json.loads(meta.schema().model_dump_json())
