"""Data files of an Iceberg table written by the uploader (``arrow_rows``' rows).

The direct path's half of Iceberg's Spark writer: one Parquet file per partition value under
the table's ``data/`` directory, whose columns carry the table's field ids.  Iceberg resolves a
data file's columns by id, not by name (a renamed column keeps its id), so a file without them
would read as all nulls.  Nothing here commits: ``iceberg.append_files`` appends the files
(``data_files``: their entries, with the column metrics Iceberg's Java ``ParquetUtil`` reads
from a footer) in one snapshot that records the offsets.

The entries are built here, from pyiceberg's public statistics functions
(``compute_statistics_plan``, ``data_file_statistics_from_parquet_metadata``), rather than by
``Transaction.add_files``, which reads the same footers but infers each file's partition from
its column bounds (truncated to 16 characters for strings: a longer topic name has no single
value), keeps pyiceberg's metrics (no bounds for fields of structs, which Java keeps), and reads
every manifest of the table to refuse files it holds already.

The ids come from the table's schema as Iceberg's ``SchemaParser`` writes it (the JSON of the
table spec); a column whose Iceberg type this path does not write as Iceberg's own writer would
(anything beyond kdaemon's columns and ``arrow_rows.value_arrow_type``'s types), or a required
column, is ``NotDirect``, and the job goes through Spark.
"""

from __future__ import annotations

import os
import urllib.parse
import uuid

import pyarrow as pa

from .arrow_rows import NotDirect, PartitionedFiles, write_pieces

_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
               "string": pa.string(), "binary": pa.binary(), "timestamptz": pa.timestamp("us", tz="UTC")}


def _meta(field_id: int) -> dict:
    return {b"PARQUET:field_id": str(field_id).encode()}


def _type(ice, name: str) -> pa.DataType:
    """The Arrow type, ids included, that Iceberg's type ``ice`` (spec JSON) is written as."""
    if isinstance(ice, str):
        if ice not in _PRIMITIVES:
            raise NotDirect(f"the Iceberg column {name} is of type {ice}, which Spark writes")
        return _PRIMITIVES[ice]
    kind = ice.get("type")
    if kind == "struct":
        return pa.struct([_field(f, f"{name}.{f['name']}") for f in ice["fields"]])
    if kind == "list":
        if ice["element-required"]:
            raise NotDirect(f"the Iceberg column {name} holds required elements")
        return pa.list_(pa.field("element", _type(ice["element"], f"{name}[]"), metadata=_meta(ice["element-id"])))
    if kind == "map":
        if ice["value-required"]:
            raise NotDirect(f"the Iceberg column {name} holds required values")
        return pa.map_(pa.field("key", _type(ice["key"], f"{name}.key"), nullable=False, metadata=_meta(ice["key-id"])),
                       pa.field("value", _type(ice["value"], f"{name}.value"), metadata=_meta(ice["value-id"])))
    raise NotDirect(f"the Iceberg column {name} is of type {kind}, which Spark writes")


def _field(ice: dict, name: str) -> pa.Field:
    if ice.get("required"):
        raise NotDirect(f"the Iceberg column {name} is required")
    return pa.field(ice["name"], _type(ice["type"], name), metadata=_meta(ice["id"]))


def file_schema(table_schema: dict, columns: list[str]) -> pa.Schema:
    """The Arrow schema of a data file holding ``columns`` of a table whose schema (Iceberg's
    spec JSON) is ``table_schema``: Iceberg's types and field ids."""
    by_name = {f["name"]: f for f in table_schema["fields"]}
    missing = [c for c in columns if c not in by_name]
    if missing or len(by_name) != len(columns):
        raise NotDirect(f"the table's columns are {sorted(by_name)}, the rows' {sorted(columns)}")
    return pa.schema([_field(by_name[c], c) for c in columns])


def write_files(pieces, table_path: str, partition_by: list[str], table_schema: dict,
                compression: str = "zstd") -> list[tuple[str, list[str], int]]:
    """Write the rows of ``pieces`` (tables of ``arrow_rows.COLUMNS``, a batch each) as data
    files of the table at ``table_path``; return each file's (absolute path, partition values
    as strings, size), synced.  NotDirect if the rows cannot be written with the table's types;
    an error leaves no file behind."""
    schema = None

    def shape(part: pa.Table) -> pa.Table:
        nonlocal schema
        schema = schema or file_schema(table_schema, list(part.column_names))
        try:   # Iceberg keeps identity-partitioned columns in the data files too (unlike Delta)
            return part.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise NotDirect(f"the rows do not cast to the Iceberg table's types ({exc})") from None

    def path_for(values: tuple[str, ...]) -> str:
        rel = [f"{c}={urllib.parse.quote_plus(v)}" for c, v in zip(partition_by, values)]
        return os.path.join(table_path, "data", *rel, f"00000-kdaemon-{uuid.uuid4()}.parquet")

    files = PartitionedFiles(partition_by, path_for, shape, compression)
    return [(path, list(values), size) for values, path, size in write_pieces(pieces, files)]


def data_files(meta, files: list[tuple[str, list[str], int]]) -> list:
    """pyiceberg DataFile entries of ``files`` (``write_files``' answer) for the table whose
    metadata (pyiceberg's) is ``meta``: record count, size, split offsets, partition values
    typed by the default spec, and column metrics as Iceberg's Java ``ParquetUtil.fileMetrics``
    takes them from the footer under the table's metrics modes (default ``truncate(16)``):
    sizes for every column; value and null counts, and bounds (truncated for strings and
    binary), for columns outside lists and maps, struct fields included.  (pyiceberg alone keeps no
    bounds for struct fields.)"""
    import pyarrow.parquet as pq
    from pyiceberg.io.pyarrow import data_file_statistics_from_parquet_metadata, parquet_path_to_id_mapping
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record
    schema, spec = meta.schema(), meta.spec()
    plan, ids = metrics_plan(schema, meta.properties), parquet_path_to_id_mapping(schema)
    kinds = [schema.find_field(f.source_id).field_type for f in spec.fields]
    repeated = _ids_under_repeated(schema.as_struct(), False)
    out = []
    for path, values, size in files:
        stats = data_file_statistics_from_parquet_metadata(pq.read_metadata(path), plan, ids)
        for fid in repeated:   # Parquet counts a list's elements, not rows: Java keeps neither count
            stats.value_counts.pop(fid, None)
            stats.null_value_counts.pop(fid, None)
        out.append(DataFile.from_args(   # as pyiceberg's own writer builds its entries
            content=DataFileContent.DATA, file_path=path,
            file_format=FileFormat.PARQUET, partition=Record(*[partition_value(k, v) for k, v in zip(kinds, values)]),
            file_size_in_bytes=size, sort_order_id=None, spec_id=meta.default_spec_id, equality_ids=None,
            key_metadata=None, **stats.to_serialized_dict()))
    return out


def partition_value(kind, text: str):
    """An identity partition's value from its string (``arrow_rows.split_by``), typed as the
    spec's source column: the types ``iceberg.refusal`` lets through."""
    name = str(kind)
    if name == "string":
        return text
    if name in ("int", "long"):
        return int(text)
    if name == "boolean":
        return text == "True"
    raise NotDirect(f"an identity partition on a column of type {name}")


def metrics_plan(schema, properties: dict) -> dict:
    """pyiceberg's statistics plan, with Java's bounds for fields nested in structs only
    (pyiceberg counts every nested field; Java's ``ParquetUtil`` keeps bounds unless the
    column is inside a list or map)."""
    from pyiceberg.io.pyarrow import MetricModeTypes, MetricsMode, StatisticsCollector, compute_statistics_plan, \
        match_metrics_mode
    from pyiceberg.types import BinaryType, StringType
    plan = compute_statistics_plan(schema, properties)
    default = properties.get("write.metadata.metrics.default", "truncate(16)")
    repeated = _ids_under_repeated(schema.as_struct(), False)
    for fid, col in list(plan.items()):
        if fid in repeated or col.mode.type != MetricModeTypes.COUNTS:
            continue
        mode = match_metrics_mode(properties.get(f"write.metadata.metrics.column.{col.column_name}", default))
        if mode.type == MetricModeTypes.TRUNCATE and not isinstance(col.iceberg_type, (StringType, BinaryType)):
            mode = MetricsMode(MetricModeTypes.FULL)
        plan[fid] = StatisticsCollector(field_id=fid, iceberg_type=col.iceberg_type, mode=mode,
                                        column_name=col.column_name)
    return plan


def _ids_under_repeated(kind, inside: bool) -> set[int]:
    from pyiceberg.types import ListType, MapType, StructType
    out: set[int] = set()
    if isinstance(kind, StructType):
        for f in kind.fields:
            if inside:
                out.add(f.field_id)
            out |= _ids_under_repeated(f.field_type, inside)
    elif isinstance(kind, ListType):
        out.add(kind.element_id)
        out |= _ids_under_repeated(kind.element_type, True)
    elif isinstance(kind, MapType):
        out |= {kind.key_id, kind.value_id}
        out |= _ids_under_repeated(kind.key_type, True) | _ids_under_repeated(kind.value_type, True)
    return out
