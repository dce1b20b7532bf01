"""Exactly-once into an Apache Iceberg table (``format = "iceberg"``): offsets in the table.

``path`` is the table's location, ``<warehouse>/<namespace>/<table>``: the layout of Iceberg's
Hadoop catalog, so a user's Hadoop catalog on ``<warehouse>`` lists it as ``<namespace>.<table>``
and ``spark.read.format("iceberg").load(path)`` reads it.  The uploader's session has that
catalog under the name ``kdaemon_iceberg`` and creates the table at the first upload, partitioned
by ``partition_by`` (identity partitions on the same columns as path mode and Delta).

Iceberg has no idempotent-writer id like Delta's.  Each job is one append that records every
partition's newest offset in the table once the append is in: in its snapshot's summary
(``kdaemon.offsets``) and in the table properties ``kdaemon.offsets.<topic>.<partition>``,
which compaction and snapshot expiry carry forward (``iceberg_meta.py``).  Before writing, the
uploader reads the table's committed offsets and drops rows at or below them, beside the
manifests' ranges (``formats.py``): a job repeated after a crash, or another uploader's
overlapping batch, adds nothing.  The read and the append of a partition happen under its
upload lock (``layout.partition_locks``), which is what keeps two uploaders from both appending
the same new rows: on one host or a shared filesystem with working ``flock``.  (Delta checks its
application versions inside the commit itself, so it needs no lock for that; Iceberg's append
would rebase onto a concurrent commit instead.)

The direct path (``append_files``, a local master) needs no Spark at all: ``iceberg_files``
writes the data files, and ``iceberg_commit`` appends them with pyiceberg's ``Transaction`` on
kdaemon's Hadoop-layout catalog (``iceberg_catalog``), the table's properties in the same
commit (the table created there too, as Spark creates it).  A table it would write differently
from Spark's Iceberg (``refusal``) goes to ``append``, whose Spark append records the offsets'
table properties in a second commit right after (Spark's writer sets no table property).
"""

from __future__ import annotations

import logging
import os

from .iceberg_meta import SUMMARY_KEY, committed_offsets, current_metadata, property_key, summary_value
from .jars import staged_jars

__all__ = ["CATALOG", "append", "append_files", "check_path", "committed_offsets", "identifier", "session_conf"]

log = logging.getLogger(__name__)

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
    columns (fields of ``value``) join the table.

    Then the table properties of ``versions``' partitions, in a commit of their own (Spark's
    writer sets none with an append).  An uploader stopped between the two leaves the offsets
    in the append's summary only, as before; the partition's next commit, or the next direct
    commit of any partition (which records every partition's offset), puts them in the
    properties.  Only these partitions' properties: under their upload locks nobody else
    changes them, so Iceberg's retry of the commit on a newer version cannot set an old value."""
    ident = identifier(table_path)
    _create_if_missing(spark, df, table_path, partition_by)
    writer = df.writeTo(ident)
    if merge_schema:
        meta = current_metadata(table_path) or {}
        if (meta.get("properties") or {}).get(ACCEPT_ANY_SCHEMA) != "true":
            spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ('{ACCEPT_ANY_SCHEMA}' = 'true')")
        writer = writer.option("merge-schema", "true")
    offsets = committed_offsets(table_path)
    writer.option(f"snapshot-property.{SUMMARY_KEY}", _summary_after(offsets, versions)).append()
    recorded = ", ".join(f"'{property_key(t, p)}' = '{offsets[(t, p)]}'" for t, p in sorted(versions))
    spark.sql(f"ALTER TABLE {ident} SET TBLPROPERTIES ({recorded})")


def _summary_after(offsets: dict[tuple[str, int], int], versions: dict[tuple[str, int], int]) -> str:
    """The ``kdaemon.offsets`` of an append recording ``versions`` over what the table has
    recorded (``offsets``, a copy of its own, changed to what the table records after it)."""
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


# Table properties that move data or metadata files away from <table>/data/<partition path>/
# and <table>/metadata/.
_ELSEWHERE = ("write.data.path", "write.folder-storage.path", "write.object-storage.path", "write.metadata.path")
_MAX_INFERRED_COLUMNS = 100   # Java's write.metadata.metrics.max-inferred-column-defaults


def append_files(pieces, table_path: str, partition_by: list[str], versions: dict[tuple[str, int], int],
                 schema) -> int | None:
    """The direct path's append, without Spark or a JVM: ``pieces`` (``arrow_rows.job_rows``
    of each batch) written as data files by ``iceberg_files`` and appended in one snapshot that
    records ``versions`` over what the table had (its summary, and the table properties of
    every partition the table records: ``iceberg_meta``), as ``append`` does with a
    DataFrame's (the table created first if missing, as Spark creates it:
    ``iceberg_commit.create``).  ``schema``: the rows' Spark schema (pyspark, no session).

    Returns the table's new metadata version, or None, with nothing written, when the table
    is not one this path writes as Iceberg's Spark writer would (``refusal``): the caller then
    takes the Spark path.  ``NotDirect`` (rows this path does not write) leaves no file either.

    The caller holds the upload lock of every partition in ``versions`` and has dropped the
    rows at or below the offsets the table recorded (``formats.py``), so no other writer adds a
    row of these partitions meanwhile.  Other partitions' commits may land first: the commit
    is then built again on the new metadata (its offsets merged, the table checked again); if
    the new metadata records one of *our* partitions further than when we began, the lock did
    not hold (a filesystem without working ``flock``): ``IcebergCommitError``, and our data
    files are removed, rather than an append that may hold rows twice."""
    try:   # pyarrow, pyiceberg: the uploader's, never a worker's
        from . import iceberg_commit, iceberg_files
    except ImportError as exc:
        log.warning("Iceberg jobs go through Spark: %s (pip install pyiceberg)", exc)
        return None
    from .arrow_rows import NotDirect
    from .iceberg_meta import offset_properties
    try:
        rows_schema = iceberg_schema(schema)
        # What refusal() would find of the table once created: checked before creating it.
        for c in partition_by:
            iceberg_files.partition_value(rows_schema.find_field(c).field_type, "0")
        if len(_leaves(rows_schema.as_struct())) > _MAX_INFERRED_COLUMNS:
            raise NotDirect(f"more than {_MAX_INFERRED_COLUMNS} columns")
        base = iceberg_commit.load(table_path)
        if base is None:
            iceberg_commit.create(table_path, rows_schema, partition_by)   # or another writer did
            base = iceberg_commit.load(table_path)
    except (NotDirect, ValueError, iceberg_commit.Unsupported) as exc:
        log.debug("not a direct append to %s: %s", table_path, exc)
        return None
    why = refusal(base, rows_schema, table_path, partition_by)
    if why:
        log.debug("not a direct append to %s: %s", table_path, why)
        return None
    codec = base.metadata.properties.get("write.parquet.compression-codec", "zstd").lower()
    written = iceberg_files.write_files(pieces, table_path, partition_by, iceberg_commit.schema_json(base.metadata),
                                        "none" if codec == "uncompressed" else codec)
    start = recorded_offsets(base.metadata, table_path)

    def build(current):
        offsets = recorded_offsets(current.metadata, table_path)
        if current.metadata_location != base.metadata_location:   # a lost race: the new metadata
            why = refusal(current, rows_schema, table_path, partition_by)
            if why:
                raise iceberg_commit.Unsupported(why)
            moved = sorted(k for k in versions if offsets.get(k, -1) != start.get(k, -1))
            if moved:
                raise iceberg_commit.IcebergCommitError(
                    f"another writer committed rows of {moved[0][0]}[{moved[0][1]}] to {table_path} during this "
                    f"append, which holds its upload lock: is flock working on this filesystem?")
        summary = _summary_after(offsets, versions)
        # Every partition's: a table written before the properties, or by the Spark path
        # stopped between its two commits, gets them all with this one.
        properties, stale = offset_properties(current.metadata.properties, offsets)
        return iceberg_files.data_files(current.metadata, written), {SUMMARY_KEY: summary}, properties, stale

    try:
        return iceberg_commit.commit_append(table_path, base, build)
    except BaseException as exc:
        for path, _, _ in written:   # referenced by no commit
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        if isinstance(exc, iceberg_commit.Unsupported):
            log.debug("not a direct append to %s: %s", table_path, exc)
            return None
        raise


def recorded_offsets(meta, table_path: str) -> dict[tuple[str, int], int]:
    """``iceberg_meta.offsets_of`` of pyiceberg's ``TableMetadata``: the same reading of the
    same fields, without writing the metadata out as JSON again."""
    from .iceberg_meta import offsets_of
    return offsets_of({
        "current-snapshot-id": meta.current_snapshot_id, "properties": meta.properties,
        "snapshots": [{"snapshot-id": s.snapshot_id, "parent-snapshot-id": s.parent_snapshot_id,
                       "summary": {SUMMARY_KEY: s.summary.get(SUMMARY_KEY)} if s.summary is not None else {}}
                      for s in meta.snapshots]}, table_path)


def refusal(base, rows_schema, table_path: str, partition_by: list[str]) -> str | None:
    """Why the direct path must not write the table at ``base`` (a pyiceberg ``Table``)
    with rows of ``rows_schema``, or None.  What Iceberg's Spark writer would write differently,
    or where this path's own commit would not be what Java's is:

    * format version 3 (row lineage, deletion vectors: left to Spark's Iceberg) or above;
    * columns or types other than the rows' (ids aside), a required column;
    * a default partition spec other than identity on ``partition_by``, or on a column whose
      partition value this path does not type (``iceberg_files.partition_value``);
    * a sort order (Spark sorts each file's rows by it);
    * data or metadata files placed elsewhere (``write.data.path``, object storage,
      ``write.metadata.path``), a location that is not ``table_path``, or a write format other
      than Parquet;
    * gzip metadata files (``write.metadata.compression-codec``): a Java writer would commit
      ``v<N>.gz.metadata.json`` beside our ``v<N>.metadata.json``, and the link would not see it;
    * more than 100 columns without ``write.metadata.metrics.default``: Java then keeps
      metrics for the first 100 only, which this path does not copy."""
    from . import iceberg_files
    from .arrow_rows import NotDirect
    meta = base.metadata
    props = meta.properties
    if meta.format_version not in (1, 2):
        return f"format version {meta.format_version}"
    if _shape(meta.schema().as_struct()) != _shape(rows_schema.as_struct()):
        return "the table's columns are not the rows' (names, types, order, nullability)"
    spec = meta.spec()
    names = [meta.schema().find_column_name(f.source_id) for f in spec.fields]
    if names != list(partition_by) or any(str(f.transform) != "identity" for f in spec.fields):
        return (f"the partition spec is {[f'{n}: {f.transform}' for n, f in zip(names, spec.fields)]}, "
                f"not identity on {partition_by}")
    try:
        for f in spec.fields:
            iceberg_files.partition_value(meta.schema().find_field(f.source_id).field_type, "0")
    except (NotDirect, ValueError) as exc:
        return str(exc)
    if not meta.sort_order().is_unsorted:
        return "the table has a sort order"
    if any(k in props for k in _ELSEWHERE) or props.get("write.object-storage.enabled", "false").lower() == "true":
        return "the table places its files elsewhere"
    from .iceberg_commit import local
    if local(meta.location) is None or os.path.abspath(local(meta.location)) != os.path.abspath(table_path):
        return f"the table's location is {meta.location}"
    if props.get("write.format.default", "parquet").lower() != "parquet":
        return "the table's write format is not Parquet"
    if props.get("write.metadata.compression-codec", "none").lower() not in ("none", ""):
        return "the table's metadata files are compressed"
    if "write.metadata.metrics.default" not in props and len(_leaves(meta.schema().as_struct())) > _MAX_INFERRED_COLUMNS:
        return f"more than {_MAX_INFERRED_COLUMNS} columns"
    return None


def _shape(kind):
    """A type without its field ids: what two schemas must share to hold the same rows."""
    from pyiceberg.types import ListType, MapType, StructType
    if isinstance(kind, StructType):
        return ("struct", tuple((f.name, f.required, _shape(f.field_type)) for f in kind.fields))
    if isinstance(kind, ListType):
        return ("list", kind.element_required, _shape(kind.element_type))
    if isinstance(kind, MapType):
        return ("map", _shape(kind.key_type), kind.value_required, _shape(kind.value_type))
    return str(kind)


def _leaves(kind) -> list:
    from pyiceberg.types import ListType, MapType, StructType
    if isinstance(kind, StructType):
        return [x for f in kind.fields for x in _leaves(f.field_type)]
    if isinstance(kind, ListType):
        return _leaves(kind.element_type)
    if isinstance(kind, MapType):
        return _leaves(kind.key_type) + _leaves(kind.value_type)
    return [kind]


def iceberg_schema(spark_schema):
    """The Iceberg schema (pyiceberg; ids still to be assigned) of rows of ``spark_schema``, as
    Iceberg's ``SparkSchemaUtil.convert`` makes it of a CTAS's (nullable) schema: every field,
    element and value optional, map keys required; TINYINT and SMALLINT as int, TIMESTAMP as
    timestamptz, TIMESTAMP_NTZ as timestamp.  NotDirect for a type it does not convert here."""
    import itertools
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField
    ids = itertools.count(1)
    fields = [NestedField(next(ids), f.name, _iceberg_type(f.dataType, ids), required=False) for f in spark_schema.fields]
    return Schema(*fields)


def _iceberg_type(t, ids):
    from pyiceberg import types as I
    from pyspark.sql import types as T

    from .arrow_rows import NotDirect
    simple = {T.BooleanType: I.BooleanType(), T.ByteType: I.IntegerType(), T.ShortType: I.IntegerType(),
              T.IntegerType: I.IntegerType(), T.LongType: I.LongType(), T.FloatType: I.FloatType(),
              T.DoubleType: I.DoubleType(), T.StringType: I.StringType(), T.BinaryType: I.BinaryType(),
              T.DateType: I.DateType(), T.TimestampType: I.TimestamptzType(), T.TimestampNTZType: I.TimestampType()}
    if type(t) in simple:
        return simple[type(t)]
    if isinstance(t, T.DecimalType):
        return I.DecimalType(t.precision, t.scale)
    if isinstance(t, T.StructType):
        return I.StructType(*[I.NestedField(next(ids), f.name, _iceberg_type(f.dataType, ids), required=False)
                              for f in t.fields])
    if isinstance(t, T.ArrayType):
        return I.ListType(next(ids), _iceberg_type(t.elementType, ids), element_required=False)
    if isinstance(t, T.MapType):
        key_id, value_id = next(ids), next(ids)
        return I.MapType(key_id, _iceberg_type(t.keyType, ids), value_id, _iceberg_type(t.valueType, ids),
                         value_required=False)
    raise NotDirect(f"the Spark type {t.simpleString()} is not converted to Iceberg's here")
