"""What a Delta table has recorded of its idempotent writers: the ``txn`` actions of its log.

Delta Lake's idempotent writes (``txnAppId``/``txnVersion`` on a write) put a ``txn`` action,
``{"appId": ..., "version": ...}``, into the commit; Delta skips a later write of the same
application id whose version is not above the recorded one.  The uploader names one
application per topic partition and uses a batch's last offset as the version, so the recorded
version of a partition is the newest offset of it the table holds (``delta.py``).

No Delta API offers the recorded versions to Python (Scala's ``Snapshot.transactions`` is the
JVM's), so they are read here from the log, as the Delta protocol (PROTOCOL.md) lays it out::

    _delta_log/00000000000000000012.json                    a commit: one action per line
    _delta_log/00000000000000000010.checkpoint.parquet      the state at version 10 (classic)
    _delta_log/00000000000000000010.checkpoint.0000000001.0000000002.parquet   (multi-part)
    _delta_log/00000000000000000010.checkpoint.<uuid>.json|parquet            (V2; its txn
                                                            actions are in this file, not in sidecars)

The state at the newest commit is the newest complete checkpoint's txn actions, then every
later commit's, in order; a later action for an application replaces the earlier one.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?(?:\.[0-9a-fA-F-]{36})?\.(parquet|json)$")


class DeltaLogError(Exception):
    """The log cannot be read as Delta's protocol describes it."""


def log_dir(table_path: str) -> str:
    return os.path.join(table_path, "_delta_log")


def transactions(table_path: str) -> dict[str, int]:
    """Each application id's recorded version ({} for a table that does not exist yet)."""
    try:
        names = os.listdir(log_dir(table_path))
    except FileNotFoundError:
        return {}
    commits: dict[int, str] = {}
    checkpoints: dict[int, list[tuple[str, int, int]]] = defaultdict(list)
    for name in names:
        if m := _COMMIT.match(name):
            commits[int(m[1])] = name
        elif m := _CHECKPOINT.match(name):
            checkpoints[int(m[1])].append((name, int(m[2] or 1), int(m[3] or 1)))
    if not commits and not checkpoints:
        return {}
    newest = max([*commits, *checkpoints])
    base = next((v for v in sorted(checkpoints, reverse=True) if v <= newest and _complete(checkpoints[v])), None)
    txns: dict[str, int] = {}
    if base is not None:
        for name, _, _ in checkpoints[base]:
            txns.update(_checkpoint_txns(os.path.join(log_dir(table_path), name)))
    start = 0 if base is None else base + 1
    missing = [v for v in range(start, newest + 1) if v not in commits]
    if missing:
        raise DeltaLogError(f"{log_dir(table_path)}: commit {missing[0]} is missing (and no checkpoint covers it)")
    for version in range(start, newest + 1):
        with open(os.path.join(log_dir(table_path), commits[version]), "rb") as fh:
            for line in fh:
                if b'"txn"' in line:
                    txn = json.loads(line).get("txn")
                    if txn:
                        txns[txn["appId"]] = int(txn["version"])
    return txns


def _complete(files: list[tuple[str, int, int]]) -> bool:
    """A multi-part checkpoint counts only with all its parts (a writer may have died between);
    a classic or V2 checkpoint is one file (part 1 of 1)."""
    if any(total == 1 for _, _, total in files):
        return True
    return {part for _, part, _ in files} == set(range(1, files[0][2] + 1))


def _checkpoint_txns(path: str) -> dict[str, int]:
    out: dict[str, int] = {}
    if path.endswith(".json"):
        with open(path, "rb") as fh:
            for line in fh:
                txn = json.loads(line).get("txn") if b'"txn"' in line else None
                if txn:
                    out[txn["appId"]] = int(txn["version"])
        return out
    import pyarrow.parquet as pq
    schema = pq.read_schema(path)
    if "txn" not in schema.names:
        return out
    for txn in pq.read_table(path, columns=["txn"]).column("txn").to_pylist():
        if txn:
            out[txn["appId"]] = int(txn["version"])
    return out
