"""Rows a table refuses for what they hold, and the conditions it checks them by.

A Delta table checks every row it is given against its CHECK constraints and NOT NULL columns,
and Spark every row written to an Iceberg table against its required columns, inside the
write's tasks: one row that fails one fails the whole job, nothing committed
(``DELTA_VIOLATE_CONSTRAINT_WITH_VALUES``, ``DELTA_NOT_NULL_CONSTRAINT_VIOLATED``, Spark's
``NOT_NULL_ASSERT_VIOLATION``).  Sent again, the same job fails the same way, so one bad record
used to stop its partition: after three attempts the daemon (Delta, ``failures.DETERMINISTIC``)
or for ever (Iceberg, whose ``SparkRuntimeException`` read as transient).  ``refuses_rows``
tells such a failure from the others; the uploader then runs the job once more with the
table's conditions as a dead-letter filter (``writer.SparkWriter.prepare``): the rows that
fail one go to ``_kdaemon/dlq`` with the conditions they fail named, the others are appended,
and the batch is confirmed.  A job costs one rerun; jobs that meet no refused row pay nothing.

The conditions are read from the table's own metadata (``conditions``), as Delta's PROTOCOL.md
and Iceberg's table spec lay it out, with no JVM (Delta's through delta-rs,
``delta_state.open_table``, the read the direct path makes anyway; Iceberg's
``iceberg_meta.current_metadata``), rather than from Delta's or Spark's internal Scala API,
which changes between releases.  Each is Spark SQL that is TRUE for a row
the table takes, as the writers decide:

* Delta 4.4 (its ``Constraints.getAll``, ``DeltaInvariantCheckerExec``, ``CheckDeltaInvariant``):

  - a CHECK constraint, the table property ``delta.constraints.<name>``: a row passes when the
    expression is TRUE; FALSE **and NULL** fail it (``result == null || result == false``,
    unlike SQL's CHECK, where NULL passes), hence ``(expr) IS TRUE``;
  - a column invariant, the older form (``delta.invariants`` in a field's metadata, JSON
    ``{"expression": {"expression": "<sql>"}}``): the same;
  - a NOT NULL column (``"nullable": false``), top-level or a field of structs: Delta reads it
    through its parents, so a row whose parent struct is null fails too ("when the column is
    nested, this implies its parents must also not be NULL"; Delta does not let a NOT NULL
    field sit in a nullable struct anyway); array elements and map values are not checked
    (``filterRecursively(checkComplexTypes = false)``, ``DELTA_NESTED_NOT_NULL_CONSTRAINT``).

* Iceberg (Spark's ``AssertNotNull`` on a required column written from a nullable one, checked
  against Iceberg 1.12 on Spark 4.1): a required field, top-level or of structs, must not be
  null where its struct is present: a null optional struct holds no field to check.  Required
  list elements and map values (which Spark's DDL cannot even declare) have no condition here.

Anything else a table refuses a row for (a CHAR/VARCHAR length, a generated column's value, a
required list element) has no condition here: such a job fails again on the rerun and is
classified as before (deterministic: tried ``DETERMINISTIC_ATTEMPTS`` times, then refused).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..tables import delta_state, iceberg_meta
from .failures import text

# The error classes of a row the table refuses, wherever they appear in a failed job's text
# (the task's exception is wrapped in Spark's job abort).
_NULL_IN_REQUIRED = "NOT_NULL_ASSERT_VIOLATION"   # Spark's, its field path on the lines after
_ROW_ERRORS = ("DELTA_VIOLATE_CONSTRAINT_WITH_VALUES", "DELTA_NOT_NULL_CONSTRAINT_VIOLATED", _NULL_IN_REQUIRED)
_NOT_DETAIL = ("at ", "If the schema", "Caused by", "Driver stacktrace", "...")


@dataclass(frozen=True)
class Condition:
    """One condition a table checks each row against: ``what`` names it for the dead letter
    and the log; ``holds`` is Spark SQL, over the table's columns, TRUE for a row it takes."""
    what: str
    holds: str


def refuses_rows(exc: BaseException) -> bool:
    """Did the job fail because the table refused rows for what they hold (see the module
    docstring)?  Read from the failure's text, as pyspark or Py4J hold it."""
    found = text(exc)
    return any(marker in found for marker in _ROW_ERRORS)


def refusal_line(exc: BaseException) -> str:
    """The line of the table's refusal, without the Java around it: the constraint or column,
    with the values Delta shows (``CHECK constraint positive (value.amount > 0) violated by row
    with values: - value.amount : -5``) or the field Spark names (``NULL value appeared in
    non-nullable field: value.id``)."""
    lines = text(exc).splitlines()
    for n, line in enumerate(lines):
        for marker in _ROW_ERRORS:
            at = line.find(f"[{marker}]")
            if at < 0:
                continue
            details = []
            for more in lines[n + 1:n + 9]:
                more = more.strip()
                if not more or more.startswith(_NOT_DETAIL):
                    break
                details.append(more)
            if marker == _NULL_IN_REQUIRED:   # one line per part of the field's path
                details = [".".join(details)] if details else []
            return " ".join([line[at:].strip(), *details])[:1000]
    return ""


def conditions(fmt: str, table_path: str) -> list[Condition]:
    """The conditions the table at ``table_path`` checks each row against (none for a table
    that does not exist yet, or a format that refuses no row for what it holds)."""
    if fmt == "iceberg":
        return _iceberg_conditions(table_path)
    if fmt != "delta":
        return []
    table = delta_state.open_table(table_path)
    if table is None:
        return []
    out = [Condition(f"CHECK constraint {key[len('delta.constraints.'):]} ({expr})", f"({expr}) IS TRUE")
           for key, expr in sorted(delta_state.configuration(table).items())
           if key.lower().startswith("delta.constraints.")]
    schema = json.loads(table.schema().to_json())
    out += list(_struct_conditions(schema, []))
    return out


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _struct_conditions(struct: dict, parents: list[str]):
    """NOT NULL fields and column invariants of a struct (Delta's schema JSON), through nested
    structs only, as Delta 4.4's ``Invariants.getFromSchema`` finds them."""
    for field in struct.get("fields") or ():
        path = parents + [field["name"]]
        column = ".".join(_quote(p) for p in path)
        name = ".".join(path)
        if not field.get("nullable", True):
            yield Condition(f"NOT NULL column {name}", f"{column} IS NOT NULL")
        rule = (field.get("metadata") or {}).get("delta.invariants")
        if rule:
            expr = (json.loads(rule).get("expression") or {}).get("expression")
            if expr:
                yield Condition(f"column invariant of {name} ({expr})", f"({expr}) IS TRUE")
        kind = field.get("type")
        if isinstance(kind, dict) and kind.get("type") == "struct":
            yield from _struct_conditions(kind, path)


def _iceberg_conditions(table_path: str) -> list[Condition]:
    """The required fields of the Iceberg table's current schema (its spec JSON), through
    nested structs, each guarded by its optional parents."""
    meta = iceberg_meta.current_metadata(table_path)
    if meta is None:
        return []
    schema = next((s for s in meta.get("schemas") or () if s.get("schema-id") == meta.get("current-schema-id")),
                  meta.get("schema") or {})
    return list(_required(schema, [], []))


def _required(struct: dict, parents: list[str], guards: list[str]):
    for field in struct.get("fields") or ():
        path = parents + [field["name"]]
        column = ".".join(_quote(p) for p in path)
        if field.get("required"):
            yield Condition(f"NOT NULL column {'.'.join(path)}", " OR ".join(guards + [f"{column} IS NOT NULL"]))
        kind = field.get("type")
        if isinstance(kind, dict) and kind.get("type") == "struct":
            yield from _required(kind, path, guards if field.get("required") else guards + [f"{column} IS NULL"])
