"""Iceberg commits without a JVM: pyiceberg builds the metadata, we commit it the Hadoop way.

pyiceberg (0.12) writes manifests, manifest lists, snapshot summaries and table metadata, but
has no Hadoop catalog, so the commit itself is here, as Iceberg's ``HadoopTableOperations``
lays it out (``iceberg_meta.py``)::

    metadata/.kdaemon-<uuid>.metadata.json.tmp   the new metadata, written and fsynced
    metadata/v<N+1>.metadata.json                os.link of it: exists already = another
                                                 writer committed N+1 first (the lost race)
    metadata/version-hint.text                   N+1, temp + os.replace, never moved back

``os.link`` is put-if-absent on a POSIX filesystem, where Java's ``rename`` would overwrite (it
checks for the target first, racily).  A lost race is not pyiceberg's retry: the caller
(``commit_append``'s ``build``) rebuilds the snapshot on the new base, since the
``kdaemon.offsets`` summary and the checks of the table depend on it.

What pyiceberg does here, by name (they are internals, and may change between versions):
``Table(...)`` with no catalog, ``Transaction.update_snapshot().merge_append()`` and the
producer's ``append_data_file``/``commit`` (staging only) and ``_merge_enabled`` (Java merges by
default, pyiceberg not), ``Transaction.table_metadata``, ``new_table_metadata``,
``pyiceberg.io.pyarrow``'s ``compute_statistics_plan``, ``parquet_path_to_id_mapping``,
``data_file_statistics_from_parquet_metadata``, ``StatisticsCollector``, ``match_metrics_mode``.
"""

from __future__ import annotations

import getpass
import json
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass

from pyiceberg.io.pyarrow import PyArrowFileIO

from .iceberg_meta import load_current, metadata_dir
from .layout import create_if_absent

log = logging.getLogger(__name__)

_ATTEMPTS = 30
_MERGE_ENABLED = "commit.manifest-merge.enabled"
_PREVIOUS_MAX = "write.metadata.previous-versions-max"
_DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"


class IcebergCommitError(Exception):
    """The commit could not be made (the message says why); nothing it wrote is referenced."""


class Unsupported(Exception):
    """The table is not one this path writes (the message says why): the job goes to Spark."""


@dataclass(frozen=True)
class Base:
    """A table's newest metadata: what the next commit builds on."""

    version: int
    location: str   # the metadata file, as the metadata log names it
    raw: dict       # the JSON
    metadata: object   # pyiceberg's TableMetadata


def local(path: str) -> str | None:
    """The local path of a location (``/x``, ``file:/x``, ``file:///x``), None for another scheme."""
    if path.startswith("file://"):
        return path[len("file://"):]
    if path.startswith("file:"):
        return path[len("file:"):]
    return path if path.startswith("/") else None


def load(table_path: str) -> Base | None:
    from pyiceberg.table.metadata import TableMetadataUtil
    current = load_current(table_path)
    if current is None:
        return None
    version, name, raw = current
    try:
        meta = TableMetadataUtil.parse_obj(raw)
    except Exception as exc:   # pydantic's errors: metadata of a version or feature pyiceberg does not read
        raise Unsupported(f"pyiceberg does not read v{version} of {table_path}: {str(exc)[:300]}") from None
    return Base(version, f"{meta.location.rstrip('/')}/metadata/{name}", raw, meta)


class _RecordingIO(PyArrowFileIO):
    """Local file IO that remembers what it wrote: synced before a commit names them, removed
    after a lost race (nothing references them)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[str] = []

    def new_output(self, location: str):
        self.written.append(location)
        return super().new_output(location)

    def sync(self) -> None:
        for path in self.written:
            _fsync(local(path))

    def remove(self) -> None:
        for path in self.written:
            try:
                os.unlink(local(path))
            except FileNotFoundError:
                pass
        self.written = []


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- creating a table ------------------------------------------------------------------------------

def create_properties() -> dict[str, str]:
    """The properties Spark's ``writeTo(...).create()`` gives a new table through Iceberg 1.x's
    SparkCatalog: its owner (the Hadoop user) and the codec new tables persist."""
    return {"owner": os.environ.get("HADOOP_USER_NAME") or getpass.getuser(),
            "write.parquet.compression-codec": "zstd"}


def create(table_path: str, schema, partition_by: list[str]) -> bool:
    """Create the table as Spark's ``df.writeTo(ident).using("iceberg").tableProperty(
    "format-version", "2").partitionedBy(...).create()`` does for rows of ``schema`` (a pyiceberg
    Schema, ids to be assigned): v1.metadata.json holding the schema with fresh ids, identity
    partitions on ``partition_by``, no sort order, and one empty append snapshot (Spark's create
    is a CTAS of no rows).  False when another writer created v1 first (ours is removed)."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import new_table_metadata
    from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
    from pyiceberg.transforms import IdentityTransform
    spec = PartitionSpec(*[PartitionField(source_id=schema.find_field(c).field_id, field_id=1000 + i,
                                          transform=IdentityTransform(), name=c) for i, c in enumerate(partition_by)])
    location = os.path.abspath(table_path)
    meta = new_table_metadata(schema, spec, UNSORTED_SORT_ORDER, location,
                              {"format-version": "2", **create_properties()})
    os.makedirs(metadata_dir(table_path), exist_ok=True)
    io = _RecordingIO()
    txn = Table(("kdaemon", os.path.basename(location)), meta, "", io, None).transaction()
    txn.update_snapshot().fast_append().commit()
    if _put(table_path, 1, txn.table_metadata, io):
        return True
    io.remove()
    return False


# -- an append -------------------------------------------------------------------------------------

def commit_append(table_path: str, base: Base, build) -> int:
    """Append in one snapshot and return the new version N.  ``build(base)`` gives, for the
    table at ``base``, (the data files, the snapshot's extra summary properties), or raises to
    give up (its files are the caller's); it is called again on the new base after a lost race."""
    from pyiceberg.table import Table
    from pyiceberg.utils.properties import property_as_bool
    for attempt in range(_ATTEMPTS):
        if attempt:
            base = load(table_path)
            if base is None:
                raise IcebergCommitError(f"the Iceberg table {table_path} disappeared during a commit")
        files, summary = build(base)
        io = _RecordingIO()
        table = Table(("kdaemon", os.path.basename(table_path)), base.metadata, base.location, io, None)
        txn = table.transaction()
        append = txn.update_snapshot(snapshot_properties=summary).merge_append()
        # Java's default (pyiceberg's is not to merge): the manifest list stays short.
        append._merge_enabled = property_as_bool(base.metadata.properties, _MERGE_ENABLED, True)
        for f in files:
            append.append_data_file(f)
        try:
            append.commit()   # stages the snapshot in txn: manifests and manifest list written
            meta = _with_log(txn.table_metadata, base)
            if _put(table_path, base.version + 1, meta, io):
                if meta.properties.get(_DELETE_AFTER_COMMIT, "false").lower() == "true":
                    _delete_dropped_metadata(base, meta)
                return base.version + 1
        except BaseException:
            io.remove()
            raise
        io.remove()
        log.debug("another writer committed v%d of %s first; building the append again on it",
                  base.version + 1, table_path)
        time.sleep(random.uniform(0.005, 0.05) * min(attempt + 1, 5))
    raise IcebergCommitError(f"{_ATTEMPTS} commits to the Iceberg table {table_path} in a row lost the race "
                             f"to another writer's")


def _with_log(meta, base: Base):
    """``meta`` with ``base`` at the end of its metadata log, which keeps the newest
    ``write.metadata.previous-versions-max`` (100) entries, as HadoopTableOperations does."""
    from pyiceberg.table.metadata import MetadataLogEntry
    keep = max(1, int(meta.properties.get(_PREVIOUS_MAX, "100")))
    log = list(base.metadata.metadata_log) + [MetadataLogEntry(metadata_file=base.location,
                                                               timestamp_ms=base.metadata.last_updated_ms)]
    return meta.model_copy(update={"metadata_log": log[-keep:]})


def _put(table_path: str, version: int, meta, io: _RecordingIO) -> bool:
    """Commit ``meta`` as version ``version``: False, with nothing changed, if it exists."""
    d = metadata_dir(table_path)
    if os.path.exists(os.path.join(d, f"v{version}.gz.metadata.json")):
        return False
    io.sync()   # manifests and manifest list first: the metadata names them
    if not create_if_absent(d, f"v{version}.metadata.json", meta.model_dump_json().encode()):
        return False
    _write_hint(d, version)
    return True


def _write_hint(d: str, version: int) -> None:
    """version-hint.text := ``version`` unless it names a newer one already.  Readers take the
    hint as a start and look for newer versions themselves, so a stale hint is harmless; a hint
    naming a version that is not there yet would not be.  Hadoop's checksum of the old hint
    goes (it would not match, and Hadoop's local filesystem checks it on read)."""
    hint = os.path.join(d, "version-hint.text")
    try:
        with open(hint) as fh:
            if int(fh.read().strip() or 0) >= version:
                return
    except (OSError, ValueError):
        pass
    tmp = os.path.join(d, f".kdaemon-{uuid.uuid4()}-version-hint.temp")
    with open(tmp, "w") as fh:
        fh.write(str(version))
        fh.flush()
        os.fsync(fh.fileno())
    _remove(os.path.join(d, ".version-hint.text.crc"))
    os.replace(tmp, hint)
    _remove(os.path.join(d, ".version-hint.text.crc"))


def _delete_dropped_metadata(base: Base, meta) -> None:
    """``write.metadata.delete-after-commit.enabled``: remove the metadata files that left the
    log with this commit (Java: ``deleteRemovedMetadataFiles``)."""
    kept = {e.metadata_file for e in meta.metadata_log}
    for entry in base.metadata.metadata_log:
        if entry.metadata_file not in kept and (path := local(entry.metadata_file)):
            _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def schema_json(meta) -> dict:
    """The table's current schema as the Iceberg spec writes it (``iceberg_files``' input)."""
    return json.loads(meta.schema().model_dump_json())
