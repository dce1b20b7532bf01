"""A pyiceberg catalog for Iceberg's Hadoop table layout: what Spark's ``HadoopCatalog`` writes.

pyiceberg has catalogs for metastores (REST, SQL, Hive, Glue, ...) but none for a plain
directory, which is what Spark's ``type = hadoop`` catalog keeps::

    <warehouse>/<namespace>/<table>/metadata/v<N>.metadata.json   version N of the table
    <warehouse>/<namespace>/<table>/metadata/version-hint.text    N, a reader's first guess

``HadoopCatalog`` is that layout behind pyiceberg's public ``Catalog`` interface (a
``MetastoreCatalog``), so pyiceberg's own ``Table`` and ``Transaction`` build every commit, and
this module only makes it: ``commit_table`` applies the transaction's updates to the newest
metadata with pyiceberg's ``update_table_metadata`` and creates ``v<N+1>.metadata.json``
atomically and only if absent (``layout.create_if_absent``: ``os.link`` of a synced temporary
file, where Java's ``HadoopTableOperations`` checks and renames, racily).  The writer that creates
the name has the version; a loser, or a transaction built on metadata that is not the newest
any more, gets ``CommitFailedException`` and nothing it wrote is referenced.

``before_commit``, if given, is called with the newest table before a commit is made on it and
may raise to refuse the commit.  pyiceberg's ``Transaction`` answers a ``CommitFailedException``
by applying the *same* staged updates to the newer metadata; kdaemon's updates (the offsets in
the snapshot summary and the table properties, the checks of the table) are computed from the
metadata they are built on, so kdaemon's appends refuse any other base there and build their
commit again themselves (``iceberg_commit.commit_append``).

The catalog keeps only what kdaemon needs: loading, creating and committing tables by
``(namespace, table)``.  Listing, dropping, renaming and views raise ``NotImplementedError``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable

from pyiceberg.catalog import MetastoreCatalog
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import CommitTableResponse, CreateTableTransaction, StagedTable, Table
from pyiceberg.table.metadata import TableMetadataUtil, TableMetadataV1, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import update_table_metadata
from pyiceberg.typedef import EMPTY_DICT

from .iceberg_meta import load_current, metadata_dir, newest_version, version_of
from .layout import create_if_absent

log = logging.getLogger(__name__)

_GZIP_METADATA = "write.metadata.compression-codec"


class MetadataUnreadable(Exception):
    """pyiceberg does not read the table's newest metadata (a version or feature it does not
    know): the message names the file."""


class RecordingIO(PyArrowFileIO):
    """pyiceberg's local file IO, remembering what it wrote and no commit references yet:
    synced before the metadata that names them is committed (``sync``), removed when that
    commit does not happen (``remove``)."""

    def __init__(self, properties=EMPTY_DICT) -> None:
        super().__init__(properties)
        self.unreferenced: list[str] = []

    def new_output(self, location: str):
        self.unreferenced.append(location)
        return super().new_output(location)

    def delete(self, location) -> None:
        super().delete(location)
        path = location if isinstance(location, str) else location.location
        if path in self.unreferenced:
            self.unreferenced.remove(path)

    def sync(self) -> None:
        for location in self.unreferenced:
            path = local(location)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def committed(self) -> None:
        """The files written so far are referenced by a committed version now: keep them."""
        self.unreferenced = []

    def remove(self) -> None:
        """Remove the files written since the last commit: nothing references them."""
        for location in self.unreferenced:
            try:
                os.unlink(local(location))
            except FileNotFoundError:
                pass
        self.unreferenced = []


def local(location: str) -> str | None:
    """The local path of a location (``/x``, ``file:/x``, ``file:///x``), None for another scheme."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    return location if location.startswith("/") else None


class HadoopCatalog(MetastoreCatalog):
    """Tables ``(namespace, table)`` at ``<warehouse>/<namespace>/<table>`` (a local path), as
    Spark's Hadoop catalog on ``warehouse`` keeps them.  ``before_commit``: see the module."""

    def __init__(self, name: str = "kdaemon", *, warehouse: str,
                 before_commit: Callable[[Table], None] | None = None, **properties: str) -> None:
        super().__init__(name, warehouse=warehouse, **properties)
        self.warehouse = os.path.abspath(warehouse)
        self.before_commit = before_commit
        self.file_io = RecordingIO()

    def table_path(self, identifier) -> str:
        namespace, name = self.identifier_to_database_and_table(identifier, NoSuchTableError)
        return os.path.join(self.warehouse, namespace, name)

    # -- tables ------------------------------------------------------------------------------------

    def load_table(self, identifier) -> Table:
        """The table at its newest version (the newest ``v<N>`` file: the hint may lag)."""
        path = self.table_path(identifier)
        current = load_current(path)
        if current is None:
            raise NoSuchTableError(f"no Iceberg table at {path} (no metadata/v<N>.metadata.json)")
        _, name, raw = current
        try:
            metadata = TableMetadataUtil.parse_obj(raw)
        except Exception as exc:   # pydantic's errors: metadata of a version or feature pyiceberg does not read
            raise MetadataUnreadable(f"pyiceberg does not read {os.path.join(metadata_dir(path), name)}: "
                                     f"{str(exc)[:300]}") from None
        # As the metadata log names it: under the table's location, with its scheme.
        location = f"{metadata.location.rstrip('/')}/metadata/{name}"
        return Table(self.identifier_to_tuple(identifier), metadata, location, self.file_io, self)

    def create_table_transaction(self, identifier, schema: Schema, location: str | None = None,
                                 partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
                                 sort_order: SortOrder = UNSORTED_SORT_ORDER,
                                 properties=EMPTY_DICT) -> CreateTableTransaction:
        """A new table's transaction (fresh field ids, as ``new_table_metadata`` assigns them);
        it becomes ``v1.metadata.json`` when committed.  The location is the layout's: a Hadoop
        table is found by its path, so no other is accepted."""
        path = self.table_path(identifier)
        if location is not None and os.path.abspath(local(location) or location) != path:
            raise ValueError(f"a Hadoop-layout table is at <warehouse>/<namespace>/<table> ({path}), not {location}")
        if not isinstance(schema, Schema):
            raise NotImplementedError("this catalog creates tables of a pyiceberg Schema only")
        metadata = new_table_metadata(schema, partition_spec, sort_order, path, dict(properties))
        staged = StagedTable(self.identifier_to_tuple(identifier), metadata, f"{path}/metadata/v1.metadata.json",
                             self.file_io, self)
        return CreateTableTransaction(staged)

    def create_table(self, identifier, schema: Schema, location: str | None = None,
                     partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
                     sort_order: SortOrder = UNSORTED_SORT_ORDER, properties=EMPTY_DICT) -> Table:
        """The table, created (``TableAlreadyExistsError`` if another writer created it first)."""
        return self.create_table_transaction(identifier, schema, location, partition_spec, sort_order,
                                             properties).commit_transaction()

    def commit_table(self, table: Table, requirements, updates) -> CommitTableResponse:
        """Make ``table``'s transaction the table's next version: its requirements checked and
        its updates applied on the newest metadata, which must be the one ``table`` has (a new
        table: none), then ``v<N+1>.metadata.json`` created if absent and the hint moved on.
        ``CommitFailedException`` when another writer's version came first; a new table that
        exists already, ``TableAlreadyExistsError``.  Once the version file exists the commit
        has happened: nothing after it raises."""
        path = self.table_path(table.name())
        newest = newest_version(path)
        creating = isinstance(table, StagedTable)
        if creating:
            if newest is not None:
                raise TableAlreadyExistsError(f"the Iceberg table {path} exists already")
            base, version = TableMetadataV1.model_construct(last_column_id=-1, schema=Schema()), 0
        else:
            if newest is None:
                raise NoSuchTableError(f"the Iceberg table {path} disappeared")
            # A version file never changes: the newest is the table's own, or read.
            current = table if newest == version_of(table.metadata_location) else self.load_table(table.name())
            if self.before_commit is not None:
                self.before_commit(current)
            if current.metadata_location != table.metadata_location:
                raise CommitFailedException(f"{current.metadata_location} was committed after "
                                            f"{table.metadata_location}, which this commit is built on")
            base, version = current.metadata, version_of(current.metadata_location)
        for requirement in requirements:
            requirement.validate(None if creating else base)
        metadata = update_table_metadata(base, updates, enforce_validation=creating,
                                         metadata_location=None if creating else current.metadata_location)
        if metadata.properties.get(_GZIP_METADATA, "none").lower() not in ("none", ""):
            raise NotImplementedError(f"{path} asks for compressed metadata files ({_GZIP_METADATA}), "
                                      f"which this catalog does not write")
        directory, name = metadata_dir(path), f"v{version + 1}.metadata.json"
        os.makedirs(directory, exist_ok=True)
        if os.path.exists(os.path.join(directory, f"v{version + 1}.gz.metadata.json")):
            raise CommitFailedException(f"another writer committed v{version + 1} of {path} first")
        self.file_io.sync()   # manifests and manifest lists first: the metadata names them
        if not create_if_absent(directory, name, metadata.model_dump_json().encode()):
            if creating:
                raise TableAlreadyExistsError(f"another writer created the Iceberg table {path} first")
            raise CommitFailedException(f"another writer committed v{version + 1} of {path} first")
        self.file_io.committed()
        try:
            _write_hint(directory, version + 1)
        except OSError as exc:   # readers list the directory from the hint on: a stale one is harmless
            log.warning("committed v%d of %s, but could not write its version-hint.text: %s", version + 1, path, exc)
        return CommitTableResponse(metadata=metadata,
                                   metadata_location=f"{metadata.location.rstrip('/')}/metadata/{name}")

    # -- what kdaemon does not use -----------------------------------------------------------------

    def register_table(self, identifier, metadata_location: str, overwrite: bool = False) -> Table:
        _unsupported("register tables", self.warehouse)

    def drop_table(self, identifier) -> None:
        _unsupported("drop tables", self.warehouse)

    def rename_table(self, from_identifier, to_identifier) -> Table:
        _unsupported("rename tables", self.warehouse)

    def create_namespace(self, namespace, properties=EMPTY_DICT) -> None:
        _unsupported("create namespaces (a table's creation makes its directory)", self.warehouse)

    def drop_namespace(self, namespace) -> None:
        _unsupported("drop namespaces", self.warehouse)

    def list_tables(self, namespace) -> list:
        _unsupported("list tables", self.warehouse)

    def list_namespaces(self, namespace=()) -> list:
        _unsupported("list namespaces", self.warehouse)

    def load_namespace_properties(self, namespace) -> dict:
        _unsupported("keep namespace properties", self.warehouse)

    def update_namespace_properties(self, namespace, removals=None, updates=EMPTY_DICT):
        _unsupported("keep namespace properties", self.warehouse)

    def list_views(self, namespace) -> list:
        _unsupported("keep views", self.warehouse)

    def view_exists(self, identifier) -> bool:
        _unsupported("keep views", self.warehouse)

    def load_view(self, identifier):
        _unsupported("keep views", self.warehouse)

    def register_view(self, identifier, metadata_location: str):
        _unsupported("keep views", self.warehouse)

    def drop_view(self, identifier) -> None:
        _unsupported("keep views", self.warehouse)


def _unsupported(what: str, warehouse: str):
    raise NotImplementedError(f"kdaemon's Hadoop-layout catalog does not {what}; use Spark's Hadoop catalog "
                              f"on {warehouse} for that")


def _write_hint(directory: str, version: int) -> None:
    """version-hint.text := ``version`` unless it names a newer one already.  Readers take the
    hint as a start and look for newer versions themselves, so a stale hint is harmless; a hint
    naming a version that is not there yet would not be.  Hadoop's checksum of the old hint
    goes (it would not match, and Hadoop's local filesystem checks it on read)."""
    hint = os.path.join(directory, "version-hint.text")
    try:
        with open(hint) as fh:
            if int(fh.read().strip() or 0) >= version:
                return
    except (OSError, ValueError):
        pass
    tmp = os.path.join(directory, f".kdaemon-{uuid.uuid4()}-version-hint.temp")
    with open(tmp, "w") as fh:
        fh.write(str(version))
        fh.flush()
        os.fsync(fh.fileno())
    _remove(os.path.join(directory, ".version-hint.text.crc"))
    os.replace(tmp, hint)
    _remove(os.path.join(directory, ".version-hint.text.crc"))


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
