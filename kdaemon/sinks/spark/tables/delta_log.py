"""A Delta table's state as its writers need it, read from ``_delta_log`` without Spark: the
newest version, the effective ``protocol`` and ``metaData``, and the ``txn`` versions of its
idempotent writers.

Delta Lake's idempotent writes put a ``txn`` action, ``{"appId": ..., "version": ...}``, into the
commit; a later write of the same application id whose version is not above the recorded one is
skipped.  The uploader names one application per topic partition and uses a batch's last offset
as the version, so the recorded version of a partition is the newest offset of it the table
holds (``delta.py``).  The direct path's commits (``delta.py``, ``delta_commit.py``) need the
protocol and metadata as well, to refuse a table whose writer rules they do not follow.

The log, as the Delta protocol (PROTOCOL.md) lays it out::

    _delta_log/00000000000000000012.json                    a commit: one action per line
    _delta_log/00000000000000000010.checkpoint.parquet      the state at version 10 (classic)
    _delta_log/00000000000000000010.checkpoint.0000000001.0000000002.parquet   (multi-part)
    _delta_log/00000000000000000010.checkpoint.<uuid>.json|parquet            (V2; protocol,
                                                            metaData and txn are in this file,
                                                            only add/remove go to sidecars)

The state at the newest version is the newest complete checkpoint's actions, then every later
commit's, in order: a later ``protocol`` or ``metaData`` replaces the earlier one, a later action
for an application replaces its earlier version.  ``_last_checkpoint`` is a hint only; the
listing is what counts.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?(?:\.[0-9a-fA-F-]{36})?\.(parquet|json)$")
# The actions the state keeps; a commit's line is parsed only if it may hold one (its adds are
# most of its bytes).  A string inside an action spells its quotes \", so never matches these.
_KEPT = ("protocol", "metaData", "txn")
_MARKERS = tuple(f'"{name}"'.encode() for name in _KEPT)


class DeltaLogError(Exception):
    """The log cannot be read as Delta's protocol describes it."""


@dataclass
class TableState:
    """What the log says at ``version`` (-1: no table yet; then no protocol or metadata)."""

    version: int = -1
    protocol: dict | None = None
    metadata: dict | None = None
    txns: dict[str, int] = field(default_factory=dict)

    def apply(self, action: dict) -> None:
        if (p := action.get("protocol")) is not None:
            self.protocol = p
        if (m := action.get("metaData")) is not None:
            self.metadata = m
        if (t := action.get("txn")) is not None:
            self.txns[t["appId"]] = int(t["version"])

    @property
    def configuration(self) -> dict[str, str]:
        return dict((self.metadata or {}).get("configuration") or {})


def log_dir(table_path: str) -> str:
    return os.path.join(table_path, "_delta_log")


def transactions(table_path: str) -> dict[str, int]:
    """Each application id's recorded version ({} for a table that does not exist yet)."""
    return read_state(table_path).txns


def read_state(table_path: str) -> TableState:
    """The table's state at its newest version, in one pass over the log (an empty state for a
    table that does not exist yet)."""
    state = TableState()
    directory = log_dir(table_path)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return state
    commits: dict[int, str] = {}
    checkpoints: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for name in names:
        if m := _COMMIT.match(name):
            commits[int(m[1])] = name
        elif m := _CHECKPOINT.match(name):
            checkpoints[int(m[1])].append((name, int(m[2] or 1), int(m[3] or 1)))
    if not commits and not checkpoints:
        return state
    newest = max([*commits, *checkpoints])
    base = next((v for v in sorted(checkpoints, reverse=True) if _complete(checkpoints[v])), None)
    if base is not None:
        for name in _checkpoint_files(checkpoints[base]):
            for action in _checkpoint_actions(os.path.join(directory, name)):
                state.apply(action)
    start = 0 if base is None else base + 1
    missing = [v for v in range(start, newest + 1) if v not in commits]
    if missing:
        raise DeltaLogError(f"{directory}: commit {missing[0]} is missing (and no checkpoint covers it)")
    for version in range(start, newest + 1):
        with open(os.path.join(directory, commits[version]), "rb") as fh:
            for line in fh:
                if any(marker in line for marker in _MARKERS):
                    state.apply(json.loads(line))
    state.version = newest
    if state.protocol is None or state.metadata is None:
        raise DeltaLogError(f"{directory}: no protocol or metaData action up to version {newest}")
    return state


def _complete(files: list[tuple[str, int, int]]) -> bool:
    """A multi-part checkpoint counts only with all its parts (a writer may have died between);
    a classic or V2 checkpoint is one file (part 1 of 1)."""
    if any(total == 1 for _, _, total in files):
        return True
    return {part for _, part, _ in files} == set(range(1, files[0][2] + 1))


def _checkpoint_files(files: list[tuple[str, int, int]]) -> list[str]:
    """The files of one checkpoint: a single-file one (classic or V2; with several, which hold the
    same state, the first by name), else every part."""
    single = sorted(name for name, _, total in files if total == 1)
    return single[:1] if single else sorted(name for name, _, _ in files)


def _checkpoint_actions(path: str):
    """The ``protocol``, ``metaData`` and ``txn`` actions of one checkpoint file, as the JSON
    log spells them."""
    if path.endswith(".json"):
        with open(path, "rb") as fh:
            for line in fh:
                if any(marker in line for marker in _MARKERS):
                    yield json.loads(line)
        return
    import pyarrow.parquet as pq   # the uploader's; a worker reads no checkpoint of a new table
    columns = [name for name in _KEPT if name in pq.read_schema(path).names]
    if not columns:
        return
    table = pq.read_table(path, columns=columns)
    for name in columns:
        column = table.column(name)
        for value in column.to_pylist():
            if value is not None:
                yield {name: _json_shape(value, column.type)}


def _json_shape(value, arrow_type):
    """A checkpoint's value as the JSON log has it: Arrow's maps (lists of pairs) as objects,
    null fields left out."""
    import pyarrow as pa
    if value is None:
        return None
    if pa.types.is_map(arrow_type):
        return {k: _json_shape(v, arrow_type.item_type) for k, v in value}
    if pa.types.is_struct(arrow_type):
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        return {f.name: _json_shape(value[f.name], f.type) for f in fields if value.get(f.name) is not None}
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return [_json_shape(v, arrow_type.value_type) for v in value]
    return value
