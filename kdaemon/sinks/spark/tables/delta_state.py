"""A Delta table's state as the uploader reads it, through delta-rs (``deltalake``): the
newest snapshot (``open``) and the versions kdaemon's applications recorded in it
(``versions``).

delta-rs reads the log as Delta's protocol lays it out, checkpoints of every kind included
(classic, multi-part, V2 with sidecars), and answers one application id's version from the
snapshot (``DeltaTable.transaction_version``), leaving out a ``txn`` action whose
``lastUpdated`` is older than the table's ``delta.setTransactionRetentionDuration``, as Spark's
Delta does (delta-rs 1.6 keeps one without ``lastUpdated``; Spark drops it, so every ``txn``
kdaemon writes has one).

What delta-rs cannot tell is which application ids a table holds: it has no listing of them.
So the caller names them (``delta.committed_offsets``: the partitions it asks about, or those
of the output's manifests).

A snapshot is kept per table between reads and brought up to date by the commits since
(``update_incremental``: a few files, where loading anew reads every add action of the
table).  One thread reads a table at a time (the uploader's serving thread).  A kept snapshot
whose newest commit file is gone (the table was removed, or its log cleaned up past it) is
loaded anew.
"""

from __future__ import annotations

import os
import threading

_tables: dict[str, object] = {}   # table path -> its DeltaTable, at the newest version read
_lock = threading.Lock()


class DeltaUnreadable(Exception):
    """delta-rs cannot read the table (a reader feature it does not know, a broken log): the
    offsets kdaemon recorded in it cannot be read either, so no job of it is uploaded."""


def log_dir(table_path: str) -> str:
    return os.path.join(table_path, "_delta_log")


def open_table(table_path: str):
    """The table's ``DeltaTable`` at its newest version; None where no table exists yet."""
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError, TableNotFoundError
    with _lock:
        table = _tables.get(table_path)
        if table is not None:
            try:
                if os.path.exists(os.path.join(log_dir(table_path), f"{table.version():020d}.json")):
                    table.update_incremental()
                    return table
            except (DeltaError, OSError):
                pass   # loaded anew below
            _tables.pop(table_path, None)
        try:
            table = DeltaTable(table_path)
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            import deltalake
            raise DeltaUnreadable(f"delta-rs {deltalake.__version__} cannot read the Delta table at {table_path}: "
                                  f"{_first_line(exc)} (kdaemon reads the offsets it records there through "
                                  "delta-rs: upgrade the deltalake package, or write another table)") from None
        _tables[table_path] = table
        return table


def forget(table_path: str) -> None:
    """Drop the kept snapshot of the table (the next ``open_table`` loads it anew)."""
    with _lock:
        _tables.pop(table_path, None)


def versions(table, app_ids) -> dict[str, int]:
    """Each of ``app_ids``' recorded version in ``table``'s snapshot (a ``DeltaTable`` or None:
    no table, nothing recorded); an application with none (never, or expired) is left out."""
    if table is None:
        return {}
    out = {}
    for app in app_ids:
        version = table.transaction_version(app)
        if version is not None:
            out[app] = int(version)
    return out


def configuration(table) -> dict[str, str]:
    return dict(table.metadata().configuration or {}) if table is not None else {}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
