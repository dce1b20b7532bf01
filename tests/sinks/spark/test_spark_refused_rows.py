"""Rows a table refuses for what they hold (a Delta CHECK constraint or NOT NULL column, a null
in an Iceberg required column) do not stall their partition (issue #32): under
``on_sink_error`` "retry" or "dlq" they go to the output's ``_kdaemon/dlq`` with the constraint
named and the rest of the job is appended; under "stop" the job is refused at once, naming the
constraint.  On real Delta Lake and Iceberg (the staged jars): the uploader alone, then the
daemon end to end with records produced to a real broker.

The conditions read from a table's log are checked first, on logs written here (no Spark).
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from kdaemon.sinks.spark.tables import iceberg, layout, formats
from kdaemon.sinks.spark.uploader import refused_rows
from kdaemon.sinks.spark.uploader.refused_rows import Condition
from testkit.spark import (Produced, Sent, SparkDaemon, assert_exact, committed, fresh_session, new_topic, produce,
                           read_output, requires_spark, row_key, spark_config, staged_request)

requires_spark()

pytestmark = [pytest.mark.spark]

SCHEMA = "id BIGINT, amount DOUBLE"
EXPR = "value . amount > 0"   # CHECK (value.amount > 0) as Delta keeps it: the parser's tokens, spaced
CHECK = f"CHECK constraint positive ({EXPR})"
NOT_NULL = "NOT NULL column key"


# -- the conditions, from a table's log --------------------------------------------------------

def _log(path, configuration: dict, fields: list[dict]) -> None:
    os.makedirs(os.path.join(path, "_delta_log"))
    actions = [{"protocol": {"minReaderVersion": 1, "minWriterVersion": 3}},
               {"metaData": {"id": "x", "format": {"provider": "parquet", "options": {}}, "partitionColumns": [],
                             "schemaString": json.dumps({"type": "struct", "fields": fields}),
                             "configuration": configuration}}]
    with open(os.path.join(path, "_delta_log", f"{0:020d}.json"), "w") as fh:
        fh.write("".join(json.dumps(a) + "\n" for a in actions))


def _field(name: str, kind, nullable: bool = True, metadata: dict | None = None) -> dict:
    return {"name": name, "type": kind, "nullable": nullable, "metadata": metadata or {}}


def test_the_conditions_of_a_delta_table_as_delta_checks_them(tmp_path):
    """CHECK constraints pass only on TRUE (NULL fails, as in Delta's checker); NOT NULL fields
    at any depth of structs, read through their parents; column invariants; nothing inside
    arrays and maps, which Delta does not check."""
    inner = {"type": "struct", "fields": [_field("amount", "double", nullable=False),
                                          _field("note", "string", metadata={"delta.invariants": json.dumps(
                                              {"expression": {"expression": "length(value.note) < 10"}})})]}
    listed = {"type": "array", "elementType": {"type": "struct", "fields": [_field("n", "long", nullable=False)]},
              "containsNull": False}
    _log(tmp_path / "t", {"delta.constraints.positive": "value.amount > 0", "delta.checkpointInterval": "5",
                          "delta.constraints.odd`name": "offset >= 0"},
         [_field("topic", "string"), _field("key", "binary", nullable=False), _field("value", inner),
          _field("tags", listed)])
    assert refused_rows.conditions("delta", str(tmp_path / "t")) == [
        Condition("CHECK constraint odd`name (offset >= 0)", "(offset >= 0) IS TRUE"),
        Condition("CHECK constraint positive (value.amount > 0)", "(value.amount > 0) IS TRUE"),
        Condition(NOT_NULL, "`key` IS NOT NULL"),
        Condition("NOT NULL column value.amount", "`value`.`amount` IS NOT NULL"),
        Condition("column invariant of value.note (length(value.note) < 10)", "(length(value.note) < 10) IS TRUE")]
    assert refused_rows.conditions("delta", str(tmp_path / "none")) == []   # no table yet
    assert refused_rows.conditions("parquet", str(tmp_path / "t")) == []


def test_a_refused_row_the_dead_letter_pass_cannot_keep_out_is_deterministic_unless_the_policy_stops():
    from kdaemon.sinks.spark.uploader.failures import DETERMINISTIC, PERMANENT, classify
    from kdaemon.sinks.spark.uploader.process import StoppedAtRefusedRows
    from kdaemon.sinks.spark.uploader.writer import RowsRefused
    line = "[DELTA_NOT_NULL_CONSTRAINT_VIOLATED] NOT NULL constraint violated for column: key."
    assert classify(RowsRefused(line)).kind == DETERMINISTIC
    try:
        try:
            raise RowsRefused(line)
        except RowsRefused as exc:
            raise StoppedAtRefusedRows(f"the delta table at /t refuses a row: {exc}") from exc
    except StoppedAtRefusedRows as stop:
        failure = classify(stop)
    assert failure.kind == PERMANENT and "_kdaemon/dlq" in failure.fix
    assert refused_rows.refuses_rows(RuntimeError(f"Job aborted: ...: {line}\n\tat x.y(Z.java:1)"))
    assert refused_rows.refusal_line(RuntimeError(f"Job aborted: ...: {line}\n\tat x.y(Z.java:1)")) == line
    assert not refused_rows.refuses_rows(RuntimeError("[DELTA_SCHEMA_MISMATCH] ..."))


# -- the uploader on a real Delta table --------------------------------------------------------

@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    """The uploaders' sessions, each its own in the process's JVM with the jars; the reader
    fixture starts its session again afterwards."""
    lake = tmp_path_factory.mktemp("lake")
    fresh_session()
    yield lake
    fresh_session()


def _uploader(lake, tmp_path, fmt: str, name: str, on_sink_error: str = "retry"):
    """An uploader of a table at ``<lake>/db/<name>``, its session able to write both formats
    (the first one started launches the module's JVM, the others reuse it)."""
    from kdaemon.sinks.spark.uploader.process import Uploader
    path = lake / "db" / name
    other = formats.FORMATS["delta" if fmt == "iceberg" else "iceberg"].session_conf(str(path))
    settings = {"type": "spark", "format": fmt, "master": "local[1]", "path": str(path), "value_schema": SCHEMA,
                "partition_by": ["topic"], "conf": other}
    uploader = Uploader(settings, str(tmp_path / "state"), on_sink_error)
    uploader.writer.start()
    return uploader


def _value(o: int, amount: float | None = None) -> bytes:
    return json.dumps({"id": o, "amount": o + 1.5 if amount is None else amount}).encode()


COLUMNS = ("topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, timestamp_type TINYINT, "
           "key BINARY NOT NULL, value STRUCT<id: BIGINT, amount: DOUBLE>, headers MAP<STRING, BINARY>, date STRING")


def _make_table(spark, path: str, partition_by: str) -> None:
    """The Delta table a daemon writes (the columns the uploader writes), made beforehand as a
    user would: ``key`` NOT NULL (Spark's ALTER cannot make a column NOT NULL), and a CHECK
    constraint added."""
    spark.sql(f"CREATE TABLE delta.`{path}` ({COLUMNS}) USING delta PARTITIONED BY ({partition_by})")
    spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT positive CHECK (value.amount > 0)")


def _constrained(uploader, tmp_path) -> str:
    """The uploader's table, made with a CHECK constraint and a NOT NULL column, and given
    offsets 0..2."""
    path = uploader.root
    _make_table(uploader.writer.spark, path, "topic")
    assert refused_rows.conditions("delta", path) == [Condition(CHECK, f"({EXPR}) IS TRUE"),
                                                      Condition(NOT_NULL, "`key` IS NOT NULL")]
    req = staged_request(tmp_path / "staged", "t", 0, range(0, 3), [_value(o) for o in range(3)])
    assert uploader.upload([req])[0] == 3 and req.error is None
    return path


def _dead_letters(spark, root: str) -> dict[int, dict]:
    return {r["offset"]: r for r in spark.read.parquet(layout.dlq_root(root)).collect()}


def test_rows_an_iceberg_table_refuses_go_to_the_dead_letters(lake, tmp_path, caplog):
    """Iceberg refuses a row with a null in a required column (Spark's NOT_NULL_ASSERT_VIOLATION,
    which a job's retry took for transient, for ever): a required field of an optional struct
    only where the struct is there."""
    uploader = _uploader(lake, tmp_path, "iceberg", "required")
    path = uploader.root
    spark = uploader.writer.spark
    spark.sql("CREATE NAMESPACE IF NOT EXISTS kdaemon_iceberg.db")
    spark.sql(f"CREATE TABLE {iceberg.identifier(path)} (topic STRING, partition INT, offset BIGINT, "
              "timestamp TIMESTAMP, timestamp_type INT, key BINARY NOT NULL, "
              "value STRUCT<id: BIGINT NOT NULL, amount: DOUBLE>, headers MAP<STRING, BINARY>, date STRING) "
              "USING iceberg PARTITIONED BY (topic) TBLPROPERTIES ('format-version' = '2')")
    assert refused_rows.conditions("iceberg", path) == [
        Condition(NOT_NULL, "`key` IS NOT NULL"),
        Condition("NOT NULL column value.id", "`value` IS NULL OR `value`.`id` IS NOT NULL")]
    # Offset 2 has no key, 4 a value without its id; 6 no value at all, which Iceberg takes.
    offsets = range(0, 8)
    values = [None if o == 6 else b'{"amount": 1.0}' if o == 4 else _value(o) for o in offsets]
    keys = [None if o == 2 else b"k" for o in offsets]
    req = staged_request(tmp_path / "staged", "t", 0, offsets, values, keys)
    uploader.upload([req])
    assert req.error is None
    kept = sorted(r.offset for r in spark.read.format("iceberg").load(path).select("offset").collect())
    assert kept == [0, 1, 3, 5, 6, 7]
    assert formats.FORMATS["iceberg"].committed_offsets(path) == {("t", 0): 7}
    dead = _dead_letters(spark, path)
    prefix = f"the iceberg table at {path} refuses the row: "
    assert {o: r["error"] for o, r in dead.items()} == {2: prefix + NOT_NULL, 4: prefix + "NOT NULL column value.id"}
    warned = [r.getMessage() for r in caplog.records if "refuses rows of this job" in r.getMessage()]
    assert len(warned) == 1 and "[NOT_NULL_ASSERT_VIOLATION]" in warned[0], warned


def test_rows_the_table_refuses_go_to_the_dead_letters_and_the_rest_is_appended(lake, tmp_path, caplog):
    uploader = _uploader(lake, tmp_path, "delta", "refusing")
    path = _constrained(uploader, tmp_path)
    # Offset 5 fails the CHECK constraint, 8 has no key, 10 no value: its amount is NULL, which a
    # Delta CHECK constraint refuses (unlike SQL's).
    offsets = range(3, 13)
    values = [None if o == 10 else _value(o, -1.0 if o == 5 else None) for o in offsets]
    keys = [None if o == 8 else b"k" for o in offsets]
    req = staged_request(tmp_path / "staged", "t", 0, offsets, values, keys)
    uploader.upload([req])
    assert req.error is None
    spark = uploader.writer.spark
    kept = sorted(r.offset for r in spark.read.format("delta").load(path).select("offset").collect())
    assert kept == [0, 1, 2, 3, 4, 6, 7, 9, 11, 12]
    assert formats.FORMATS["delta"].committed_offsets(path) == {("t", 0): 12}   # the batch is in
    assert (3, 12) in layout.uploaded_ranges(path, "t", 0)
    dead = _dead_letters(spark, path)
    assert sorted(dead) == [5, 8, 10]
    prefix = f"the delta table at {path} refuses the row: "
    assert dead[5]["error"] == prefix + CHECK and dead[10]["error"] == prefix + CHECK
    assert dead[8]["error"] == prefix + NOT_NULL
    assert [dead[o]["value"] for o in (5, 8, 10)] == [values[5 - 3], values[8 - 3], None]   # the raw bytes
    assert dead[8]["key"] is None and dead[5]["key"] == b"k" and dead[5]["topic"] == "t"
    warned = [r.getMessage() for r in caplog.records if "refuses rows of this job" in r.getMessage()]
    assert len(warned) == 1 and re.search(r"DELTA_(VIOLATE_CONSTRAINT_WITH_VALUES|NOT_NULL_CONSTRAINT_VIOLATED)",
                                          warned[0]), warned

    # The next jobs keep the dead-letter pass: a refused row costs them no failed write.
    req = staged_request(tmp_path / "staged", "t", 0, range(13, 16), [_value(o, -2.0 if o == 14 else None)
                                                                      for o in range(13, 16)])
    uploader.upload([req])
    assert req.error is None
    assert len([r for r in caplog.records if "refuses rows of this job" in r.getMessage()]) == 1
    assert sorted(_dead_letters(spark, path)) == [5, 8, 10, 14]
    assert formats.FORMATS["delta"].committed_offsets(path) == {("t", 0): 15}


def test_under_the_stop_policy_a_refused_row_refuses_the_job_at_once_naming_the_constraint(lake, tmp_path):
    from kdaemon.sinks.spark.uploader.failures import PERMANENT, classify
    from kdaemon.sinks.spark.uploader.process import StoppedAtRefusedRows
    uploader = _uploader(lake, tmp_path, "delta", "stopping", on_sink_error="stop")
    path = _constrained(uploader, tmp_path)
    req = staged_request(tmp_path / "staged", "t", 0, range(3, 6), [_value(o, -1.0 if o == 4 else None)
                                                                    for o in range(3, 6)])
    with pytest.raises(StoppedAtRefusedRows) as refused:
        uploader.upload([req])
    assert re.search(r"\[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES\] CHECK constraint positive \(value.amount > 0\) "
                     r"violated by row with values: - value.amount : -1.0", str(refused.value)), str(refused.value)
    failure = classify(refused.value)
    assert failure.kind == PERMANENT and 'on_sink_error to "retry" or "dlq"' in failure.fix
    assert formats.FORMATS["delta"].committed_offsets(path) == {("t", 0): 2}   # nothing of the job
    assert not os.path.exists(layout.dlq_root(path))


# -- the daemon, end to end --------------------------------------------------------------------

TYPE = (("type", b"order.created"),)   # kept by the tests' header rule


def _records(n: int, now_ms: int, bad: dict[int, str]) -> list[Sent]:
    """``n`` records, good but those in ``bad``: "check" (a negative amount) or "key" (none)."""
    out = []
    for i in range(n):
        amount = -1.0 if bad.get(i) == "check" else i + 0.5
        key = None if bad.get(i) == "key" else f"k{i}".encode()
        out.append(Sent(key, json.dumps({"id": i, "amount": amount}).encode(), TYPE, now_ms + i))
    return out


@pytest.mark.broker
@pytest.mark.slow
def test_the_daemon_dead_letters_refused_rows_and_goes_on(broker, spark, tmp_path):
    """Two refused records among 400 on two partitions, in different jobs: the good ones reach
    the table exactly once, the refused ones the dead letters, the offsets are committed past
    them, and the daemon keeps running."""
    topic = new_topic(broker.bootstrap, 2)
    produced = Produced(topic, 2)
    bad = {101: "check", 250: "key"}
    produce(broker.bootstrap, produced, _records(400, int(time.time() * 1000), bad))
    out = tmp_path / "out"
    _make_table(spark, str(out), "topic, date")
    group = f"g-{topic}"
    # Jobs of up to 100 records (one Spark job each, as the table's constraint keeps direct writes
    # out): at 50, eight jobs took 374 s on a loaded machine.
    config = spark_config(tmp_path / "d", broker.bootstrap, topic, group, out,
                          sink={"format": "delta", "value_schema": SCHEMA, "max_records": 100, "max_age_s": 1})
    with SparkDaemon(tmp_path / "d", config) as daemon:
        daemon.wait_caught_up(broker.bootstrap, produced, timeout=180)
        assert daemon.alive(), daemon.log_tail()
        log = daemon.log()
        assert "refused for good" not in log, daemon.log_tail()
        assert daemon.stop() == 0, daemon.log_tail()
    refused_keys = {key for key, sent in produced.expected().items()
                    if sent.key is None or json.loads(sent.value)["amount"] < 0}
    assert len(refused_keys) == 2
    expected = {k: v for k, v in produced.expected().items() if k not in refused_keys}
    assert_exact(read_output(spark, out, "delta"), expected)
    dead = spark.read.parquet(layout.dlq_root(str(out))).toArrow().to_pylist()
    assert sorted(row_key(r) for r in dead) == sorted(refused_keys)
    prefix = f"the delta table at {out} refuses the row: "
    assert sorted(r["error"] for r in dead) == sorted([prefix + CHECK, prefix + NOT_NULL])
    for row in dead:
        assert row["value"] == produced.expected()[row_key(row)].value   # the raw bytes, for a replay
    assert "refuses rows of this job" in log


@pytest.mark.broker
@pytest.mark.slow
def test_under_the_stop_policy_the_daemon_stops_at_a_refused_row_naming_the_constraint(broker, spark, tmp_path):
    from kdaemon.exit_codes import EXIT_SINK_REFUSED
    topic = new_topic(broker.bootstrap, 1)
    produced = Produced(topic, 1)
    produce(broker.bootstrap, produced, _records(100, int(time.time() * 1000), {60: "check"}))
    out = tmp_path / "out"
    _make_table(spark, str(out), "topic, date")
    group = f"g-{topic}"
    config = spark_config(tmp_path / "d", broker.bootstrap, topic, group, out, workers=1, on_sink_error="stop",
                          sink={"format": "delta", "value_schema": SCHEMA, "max_records": 50, "max_age_s": 1})
    with SparkDaemon(tmp_path / "d", config) as daemon:
        assert daemon.wait_exit(180) == EXIT_SINK_REFUSED, daemon.log_tail()
    log = daemon.log()
    line = next(l for l in log.splitlines() if "worker stopping, refused for good" in l)
    assert (f"the delta output at {out} refuses the upload for good: StoppedAtRefusedRows: the table refuses a row "
            'for what it holds, and daemon.on_sink_error = "stop": [DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK '
            "constraint positive (value.amount > 0) violated by row with values: - value.amount : -1.0 (to fix: "
            in line and 'set on_sink_error to "retry" or "dlq"' in line), line
    # The batches before the one holding offset 60 are in; that one is not, nor anything after
    # it, in the table or committed.
    offset, _ = committed(broker.bootstrap, group, topic, 1)[0]
    kept = sorted(r["offset"] for r in read_output(spark, out, "delta"))
    assert kept == list(range(len(kept))) and offset <= len(kept) <= 60, (offset, kept)
    assert not os.path.exists(layout.dlq_root(str(out)))
