"""A Delta commit written by Python, as Delta's own writer would write a blind append: what may
be committed that way (``refusal``), the commit's actions (``append_actions``) and its atomic
creation (``put_if_absent``).  ``delta.append_files`` runs them: read the state, refuse or
check the offsets, write the data files, commit, and on a lost race read again.

Delta's protocol (PROTOCOL.md) asks a writer to respect whatever the table's protocol lists.  A
blind append of rows in the table's own schema needs nothing of most of it; this module accepts
a table only where it can say so, and refuses (the job then goes through Spark, whose writer
respects everything) anything else:

* legacy writer versions 1-4: append-only (an append is allowed), column invariants and
  generated columns (they live in a column's metadata; the schema must equal the rows', whose
  fields have none, so a table that has either is refused), CHECK constraints (refused while
  any ``delta.constraints.*`` is set), change data feed (an append writes no change files: its
  inserts are its ``add`` actions);
* writer version 7 with only the ``writerFeatures`` in ``ACCEPTED_FEATURES`` (the same ones,
  plus those an append writes nothing for: deletion vectors, timestampNtz, domain metadata,
  V2 checkpoints, the VACUUM protocol check);
* everything else refused: writer versions 5-6 (column mapping, identity columns), column
  mapping, identity columns, row tracking, in-commit timestamps, clustering, column defaults,
  Iceberg compatibility, type widening, catalog-managed tables, any feature not listed;
  reader versions above 3; a ``columnMapping.mode`` other than none; a schema, partitioning
  or file format other than the rows'; a field that is not nullable (Delta checks NOT NULL).

A new table gets what Delta 4.4's writer gives a plain one (checked against its log):
protocol (1, 2), a ``metaData`` with the rows' schema (every field nullable) and no
configuration.
"""

from __future__ import annotations

import json
import time
import uuid

from .... import __version__
from .delta_log import TableState
from .layout import create_if_absent

NEW_TABLE_PROTOCOL = {"minReaderVersion": 1, "minWriterVersion": 2}
ACCEPTED_FEATURES = frozenset({
    "appendOnly", "invariants", "checkConstraints", "generatedColumns", "changeDataFeed",
    "deletionVectors", "timestampNtz", "domainMetadata", "v2Checkpoint", "vacuumProtocolCheck"})
ENGINE_INFO = f"kdaemon/{__version__} (Python Delta commit)"


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


def refusal(state: TableState, schema: dict, partition_by: list[str]) -> str | None:
    """Why a blind append of rows of ``schema`` (all nullable, as ``nullable`` makes it),
    partitioned by ``partition_by``, must not be committed here, or None where it may be."""
    if state.version < 0:
        return None   # a new table: its protocol and metadata are this commit's
    protocol, metadata = state.protocol, state.metadata
    reader, writer = int(protocol.get("minReaderVersion", 1)), int(protocol.get("minWriterVersion", 1))
    if reader > 3 or writer > 7:
        return f"protocol ({reader}, {writer}) is newer than this writer knows"
    if writer in (5, 6):
        return f"writer version {writer} (column mapping, identity columns)"
    if writer == 7:
        features = set(protocol.get("writerFeatures") or ()) | set(protocol.get("readerFeatures") or ())
        if unknown := sorted(features - ACCEPTED_FEATURES):
            return f"table features {', '.join(unknown)}"
    elif reader == 3:
        return "reader features without writer features"
    config = state.configuration
    if constraints := sorted(k for k in config if k.startswith("delta.constraints.")):
        return f"CHECK constraints ({', '.join(c.removeprefix('delta.constraints.') for c in constraints)})"
    if config.get("delta.columnMapping.mode", "none").lower() != "none":
        return "column mapping"
    for key in ("delta.enableRowTracking", "delta.enableInCommitTimestamps"):
        if config.get(key, "false").lower() == "true":
            return key
    if (metadata.get("format") or {}).get("provider", "parquet") != "parquet":
        return f"data files of format {metadata['format']['provider']}"
    if list(metadata.get("partitionColumns") or ()) != list(partition_by):
        return f"partitioned by {metadata.get('partitionColumns')}, not {partition_by}"
    if json.loads(metadata["schemaString"]) != schema:
        return "a schema other than the rows' (other columns or types, a column's metadata, NOT NULL)"
    return None


def checkpoint_interval(state: TableState) -> int:
    """``delta.checkpointInterval`` of the table (Delta's default: 10)."""
    try:
        return max(1, int(state.configuration.get("delta.checkpointInterval", "10")))
    except ValueError:
        return 10


def append_actions(state: TableState, schema: dict, partition_by: list[str], adds: list[dict],
                   txns: dict[str, int]) -> list[dict]:
    """Commit ``state.version + 1``: the blind append of ``adds`` recording each application's
    version (``txns``), as Delta's writer spells it (commitInfo, then for a new table metaData
    and protocol, the txn actions, the adds)."""
    now = int(time.time() * 1000)
    info = {"timestamp": now, "operation": "WRITE",
            "operationParameters": {"mode": "Append", "partitionBy": json.dumps(partition_by, separators=(",", ":"))}}
    if state.version >= 0:
        info["readVersion"] = state.version
    info.update({"isolationLevel": "Serializable", "isBlindAppend": True,
                 "operationMetrics": {"numFiles": str(len(adds)),
                                      "numOutputRows": str(sum(json.loads(a["stats"])["numRecords"] for a in adds)),
                                      "numOutputBytes": str(sum(a["size"] for a in adds))},
                 "engineInfo": ENGINE_INFO, "txnId": str(uuid.uuid4())})
    actions: list[dict] = [{"commitInfo": info}]
    if state.version < 0:
        actions.append({"metaData": {
            "id": str(uuid.uuid4()), "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(schema, separators=(",", ":")), "partitionColumns": list(partition_by),
            "configuration": {}, "createdTime": now}})
        actions.append({"protocol": dict(NEW_TABLE_PROTOCOL)})
    actions += [{"txn": {"appId": app, "version": version, "lastUpdated": now}} for app, version in sorted(txns.items())]
    actions += [{"add": add} for add in adds]
    return actions


def put_if_absent(log_dir: str, version: int, actions: list[dict]) -> bool:
    """Create ``<version>.json`` in ``log_dir`` holding ``actions``, atomically and only if no
    commit of that version exists (``layout.create_if_absent``): False when another writer's
    is there (it won the version)."""
    data = "".join(json.dumps(a, separators=(",", ":")) + "\n" for a in actions).encode()
    return create_if_absent(log_dir, f"{version:020d}.json", data)
