"""Data files of an Iceberg table written by the uploader (``arrow_rows``' rows).

The direct path's half of Iceberg's Spark writer: one Parquet file per partition value under
the table's ``data/`` directory, whose columns carry the table's field ids.  Iceberg resolves a
data file's columns by id, not by name (a renamed column keeps its id), so a file without them
would read as all nulls.  Nothing here commits: ``iceberg.append_files`` appends the files, with
metrics Iceberg computes from their footers, in one snapshot that records the offsets.

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
