"""kdaemon/sinks/spark/tables/arrow_rows.py against real Spark, value by value: where pyarrow builds a
job's rows itself (no ``NotDirect``) they must be exactly the rows ``SparkWriter.prepare``
would have written, and a value Spark's ``from_json`` marks corrupt must never be direct."""

from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from testkit.spark import requires_spark

requires_spark()

from kdaemon.sinks.spark.tables import arrow_rows
from kdaemon.sinks.spark import staged  # noqa: E402
from kdaemon.sinks.spark.tables.arrow_rows import NotDirect, job_rows, parse_json_values, value_arrow_type   # noqa: E402
from kdaemon.sinks.spark.tables.layout import BatchId   # noqa: E402
from kdaemon.sinks.spark.uploader.writer import _CORRUPT, SparkWriter   # noqa: E402

pytestmark = [pytest.mark.spark]

# Every type value_arrow_type accepts: the simple ones, a nested struct, arrays, array of struct.
DDL = ("b BOOLEAN, t TINYINT, s SMALLINT, i INT, id BIGINT, d DOUBLE, str STRING, "
       "nested STRUCT<x: INT, name: STRING>, arr ARRAY<BIGINT>, objs ARRAY<STRUCT<k: STRING, v: DOUBLE>>")
GOOD = [b'{"i":1,"str":"a"}', b'{"d":2.5,"arr":[1,2],"nested":{"x":3}}']   # mixed in with every case
ORDINARY = (b'{"b":true,"t":-128,"s":32767,"i":-2147483648,"id":9223372036854775807,"d":1.5,"str":"x y",'
            b'"nested":{"x":1,"name":"n"},"arr":[1,-2],"objs":[{"k":"a","v":0.25},{"v":-1}]}')

# (id, value, direct): direct True = pyarrow must read it itself, None = either way (then it
# must agree with Spark).  A value Spark marks corrupt must be NotDirect whatever this says.
CASES = [
    ("ordinary", ORDINARY, True), ("empty-object", b"{}", True), ("missing-fields", b'{"i":1}', True),
    ("extra-fields", b'{"i":1,"zz":{"q":[1,{"r":null}]},"other":"x"}', True),
    ("extra-nested-field", b'{"nested":{"x":1,"extra":[2]},"objs":[{"k":"a","w":1}]}', True),
    ("explicit-nulls", b'{"b":null,"i":null,"d":null,"str":null,"nested":null,"arr":null,"objs":null}', True),
    ("nulls-in-arrays", b'{"arr":[1,null,3],"objs":[null,{"k":null,"v":null}]}', True),
    ("empty-arrays", b'{"arr":[],"objs":[]}', True), ("empty-key", b'{"":1,"i":2}', None),
    ("case-ID", b'{"ID":1}', None), ("case-Str", b'{"Str":"x"}', None), ("case-nested-X", b'{"nested":{"X":1}}', None),
    ("case-both", b'{"id":1,"ID":2}', None),
    ("leading-zero-int", b'{"i":007}', None), ("leading-zero-double", b'{"d":007.5}', None),
    ("leading-zero-00", b'{"i":00}', None), ("minus-zero-int", b'{"i":-0}', None),
    ("raw-tab", b'{"str":"a\tb"}', None), ("raw-ctrl-01", b'{"str":"a\x01b"}', None),
    ("raw-nul-in-string", b'{"str":"a\x00b"}', None), ("trailing-nul", b'{"i":1}\x00', None),
    ("nul-then-garbage", b'{"i":1}\x00garbage', None),
    ("surrogate-pair", b'{"str":"\\ud83d\\ude00"}', None), ("lone-high-surrogate", b'{"str":"\\ud83d"}', None),
    ("lone-low-surrogate", b'{"str":"\\ude00"}', None), ("high-then-char", b'{"str":"\\ud83dx"}', None),
    ("reversed-surrogates", b'{"str":"\\ude00\\ud83d"}', None),
    ("escaped-slash", b'{"str":"a\\/b"}', None), ("escapes", b'{"str":"\\"\\\\\\b\\f\\n\\r\\t\\u00e9\\u0000"}', None),
    ("bad-escape", b'{"str":"\\q"}', None), ("utf8-literal", '{"str":"é😀\u2028"}'.encode(), None),
    ("escaped-key", b'{"\\u0069":5}', None),
    ("double-minus-0", b'{"d":-0}', None), ("double-minus-0-nested", b'{"objs":[{"v":-0}]}', None),
    ("double-minus-0.0", b'{"d":-0.0}', None),
    ("double-1E2", b'{"d":1E2}', None), ("double-1e+2", b'{"d":1.0e+2}', None),
    ("double-1e-400", b'{"d":1e-400}', None), ("double-1e400", b'{"d":1e400}', None),
    ("double-min-subnormal", b'{"d":5e-324}', None), ("double-max", b'{"d":1.7976931348623157e308}', None),
    ("double-hard-rounding", b'{"d":2.2250738585072011e-308}', None), ("double-0.1+0.2", b'{"d":0.30000000000000004}', None),
    ("double-int", b'{"d":3}', None), ("double-2^53+1", b'{"d":9007199254740993}', None),
    ("double-huge-int", b'{"d":123456789012345678901234567890}', None),
    ("double-17-digits", b'{"d":0.10000000000000000555}', None), ("double-dot5", b'{"d":.5}', None),
    ("double-1dot", b'{"d":1.}', None), ("double-plus", b'{"d":+1}', None),
    ("int-max", b'{"i":2147483647}', None), ("int-over", b'{"i":2147483648}', None), ("int-under", b'{"i":-2147483649}', None),
    ("tiny-max", b'{"t":127}', None), ("tiny-over", b'{"t":128}', None), ("tiny-under", b'{"t":-129}', None),
    ("small-over", b'{"s":32768}', None), ("bigint-over", b'{"id":9223372036854775808}', None),
    ("bigint-min", b'{"id":-9223372036854775808}', None),
    ("bigint-1.0", b'{"id":1.0}', None), ("bigint-1.5", b'{"id":1.5}', None), ("bigint-1e2", b'{"id":1e2}', None),
    ("int-1.0", b'{"i":1.0}', None), ("array-float-bigint", b'{"arr":[1.0]}', None),
    ("string-for-int", b'{"i":"1"}', None), ("string-for-double", b'{"d":"1.5"}', None),
    ("string-NaN-for-double", b'{"d":"NaN"}', None), ("string-Infinity", b'{"d":"-Infinity"}', None),
    ("int-for-string", b'{"str":1}', None), ("float-for-string", b'{"str":1.50}', None),
    ("exp-for-string", b'{"str":1e2}', None), ("minus-zero-for-string", b'{"str":-0.0}', None),
    ("bool-for-string", b'{"str":true}', None), ("object-for-string", b'{"str":{"a": 1}}', None),
    ("array-for-string", b'{"str":[1, "x"]}', None), ("null-literal-string", b'{"str":"null"}', None),
    ("bool-true", b'{"b":true}', None), ("bool-1", b'{"b":1}', None), ("bool-string", b'{"b":"true"}', None),
    ("bool-True", b'{"b":True}', None),
    ("scalar-for-array", b'{"arr":1}', None), ("object-for-array", b'{"objs":{"k":"a"}}', None),
    ("scalar-for-struct", b'{"nested":1}', None), ("array-for-struct", b'{"nested":[]}', None),
    ("repeat-top", b'{"i":1,"i":2}', None), ("repeat-top-null", b'{"i":1,"i":null}', None),
    ("repeat-nested", b'{"nested":{"x":1,"x":2}}', None),
    ("repeat-struct", b'{"nested":{"x":1},"nested":{"name":"a"}}', None),
    ("repeat-in-array", b'{"objs":[{"k":"a","k":"b"}]}', None), ("repeat-unknown", b'{"zz":1,"zz":2,"i":3}', None),
    ("NaN", b'{"d":NaN}', None), ("Infinity", b'{"d":Infinity}', None), ("-Infinity", b'{"d":-Infinity}', None),
    ("+INF", b'{"d":+INF}', None),
    ("single-quotes", b"{'i':1}", None), ("single-quoted-value", b"{\"str\":'x'}", None),
    ("unquoted-name", b'{i:1}', None), ("comment", b'{"i":1 /* c */}', None),
    ("trailing-garbage", b'{"i":1}x', None), ("trailing-object", b'{"i":1} {"i":2}', None),
    ("trailing-brace", b'{"i":1}}', None), ("trailing-comma-after", b'{"i":1},', None),
    ("trailing-comma-inside", b'{"i":1,}', None), ("unterminated", b'{"i":1', None),
    ("trailing-space", b'{"i":1}   ', None), ("trailing-tab", b'{"i":1}\t', None),
    ("leading-space", b'  {"i":1}', None), ("leading-tab", b'\t{"i":1}', None),
    ("leading-nbsp", b'\xc2\xa0{"i":1}', None), ("leading-bom", b'\xef\xbb\xbf{"i":1}', None),
    ("leading-formfeed", b'\x0c{"i":1}', None), ("leading-vtab", b'\x0b{"i":1}', None),
    ("top-null", b"null", None), ("top-number", b"1", None), ("top-array", b'[{"i":1}]', None),
    ("top-string", b'"s"', None), ("empty", b"", None), ("space", b" ", None), ("tab", b"\t", None),
    ("newline-between", b'{"i":1,\n"d":2}', None), ("newline-in-string", b'{"str":"a\nb"}', None),
    ("cr-between", b'{"i":1,\r"d":2}', None), ("trailing-crlf", b'{"i":1}\r\n', None),
    ("invalid-utf8-ff", b'{"str":"\xff"}', None), ("invalid-utf8-truncated", b'{"str":"\xc3"}', None),
    ("invalid-utf8-outside", b'{"i":1}\xff', None), ("overlong-utf8", b'{"str":"\xc0\xaf"}', None),
    ("raw-del", b'{"str":"a\x7fb"}', None), ("double-minus-1e-400", b'{"d":-1e-400}', None),
    ("exp-leading-zeros", b'{"d":1e0002}', None), ("corrupt-column-named", b'{"_kdaemon_corrupt":"x","i":1}', None),
    # Jackson's read constraints (StreamReadConstraints: nesting depth 1000, 1000 digits a number,
    # 50,000 characters a name, 20,000,000 a string) that pyarrow's reader has not: each pair is
    # the last value Spark takes and the first it marks corrupt.
    ("depth-1000", b'{"zz":' + b"[" * 999 + b"]" * 999 + b',"i":1}', None),
    ("depth-1001", b'{"zz":' + b"[" * 1000 + b"]" * 1000 + b',"i":1}', None),
    ("int-1000-digits", b'{"zz":' + b"1" * 1000 + b',"i":1}', None),
    ("int-1001-digits", b'{"zz":' + b"1" * 1001 + b',"i":1}', None),
    ("double-1001-digits", b'{"d":' + b"1" * 1001 + b"}", None),
    ("fraction-1001-digits", b'{"d":0.' + b"0" * 1000 + b"1}", None),
    ("exponent-1000-digits", b'{"d":1e' + b"0" * 999 + b"2}", None),
    ("name-50000", b'{"' + b"k" * 50000 + b'":1,"i":1}', None),
    ("name-50001", b'{"' + b"k" * 50001 + b'":1,"i":1}', None),
    ("string-21M", b'{"str":"' + b"x" * 21_000_000 + b'"}', None),
    ("kafka-null", None, None),
]

_spark_results: dict = {}   # value -> (Spark's parsed struct as a dict, marked corrupt), for all CASES


def _writer(spark, tmp_path, **settings) -> SparkWriter:
    """A SparkWriter built from settings, not started: ``start`` would getOrCreate (and
    reconfigure) the reader session these tests share.  It runs on a new session of that JVM
    with the SQL settings of ``start`` that make rows (the UTC session time zone, LAST_WIN for
    a repeated map key) and the value struct ``start`` makes of value_schema."""
    w = SparkWriter({"type": "spark", "master": "local[1]", "path": str(tmp_path / "out"), **settings})
    w.spark = spark.newSession()
    w.spark.conf.set("spark.sql.session.timeZone", "UTC")
    w.spark.conf.set("spark.sql.mapKeyDedupPolicy", "LAST_WIN")
    if w.value_schema:
        w._value_struct = w._parse_value_schema(w.value_schema)
    return w


@pytest.fixture
def writer(spark, tmp_path):
    return _writer(spark, tmp_path, value_schema=DDL)


def _spark_parse(w: SparkWriter, values: list) -> dict:
    """Spark's from_json of ``values``, exactly as ``prepare`` calls it."""
    from pyspark.sql import functions as F
    df = w.spark.createDataFrame([(n, v) for n, v in enumerate(values)], "n INT, value BINARY")
    parsed = F.from_json(F.col("value").cast("string"), w._value_struct,
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
    out = {}
    for row in df.select("n", parsed.alias("p")).collect():
        value = values[row.n]
        p = None if row.p is None else row.p.asDict(recursive=True)
        corrupt = value is not None and (p is None or p[_CORRUPT] is not None)
        out[value] = (None if p is None else {k: v for k, v in p.items() if k != _CORRUPT}, corrupt)
    return out


def _short(v, n: int = 300) -> str:
    text = repr(v)
    return text if len(text) <= n else f"{text[:n]}... ({len(text)} characters)"


def _same(a, b) -> bool:
    """Equal, doubles exactly (the sign of zero too), NaN equal to NaN; bool is not int."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _value_type() -> pa.StructType:
    from pyspark.sql.types import DataType
    return value_arrow_type(DataType.fromDDL(DDL))


def test_value_arrow_type_covers_the_schema_and_refuses_the_rest(spark):   # fromDDL needs a session
    from pyspark.sql.types import DataType
    t = _value_type()
    assert [(f.name, str(f.type)) for f in t][:7] == [
        ("b", "bool"), ("t", "int8"), ("s", "int16"), ("i", "int32"), ("id", "int64"), ("d", "double"),
        ("str", "string")]
    assert t.field("objs").type == pa.list_(pa.struct([("k", pa.string()), ("v", pa.float64())]))
    for ddl in ("f FLOAT", "m MAP<STRING, INT>", "x DECIMAL(10,2)", "ts TIMESTAMP", "dt DATE", "bin BINARY",
                "a ARRAY<FLOAT>", "s STRUCT<t: TIMESTAMP>"):
        with pytest.raises(NotDirect):
            value_arrow_type(DataType.fromDDL(ddl))


@pytest.mark.parametrize("value, direct", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_json_values_agrees_with_spark_from_json(writer, value, direct):
    if not _spark_results:
        _spark_results.update(_spark_parse(writer, [c[1] for c in CASES] + GOOD))
    want, corrupt = _spark_results[value]
    value_type = _value_type()
    for batch, at in (([value], 0), ([GOOD[0], None, value, GOOD[1]], 2)):
        try:
            got = parse_json_values(pa.array(batch, pa.binary()), value_type)
        except NotDirect:
            assert direct is not True, f"{_short(value)} (in a batch of {len(batch)}) is not direct"
            continue
        assert got.type == value_type and len(got) == len(batch)
        rows = got.to_pylist()
        assert not corrupt, f"pyarrow read {_short(rows[at])} where Spark marks corrupt {_short(value)}"
        assert _same(rows[at], want), f"{_short(value)}: pyarrow {_short(rows[at])}, Spark {_short(want)}"
        for v, r in zip(batch, rows):   # the good values around it too, and the null
            assert _same(r, _spark_results[v][0]), \
                f"{v!r} next to {_short(value)}: pyarrow {r!r}, Spark {_spark_results[v][0]!r}"


def test_only_null_values_are_nulls_without_parsing(spark):
    got = parse_json_values(pa.array([None, None], pa.binary()), _value_type())
    assert got.type == _value_type() and got.to_pylist() == [None, None]


def test_values_up_to_the_longest_direct_one_parse_across_the_readers_blocks(spark):
    # Values as long as the direct path takes (``_LONG_VALUE``), 1.5 MB of them, so several of
    # the JSON reader's blocks, none on a block's boundary on purpose: every one read, in order
    # (a block shorter than a value fails: "straddling object straddles two block boundaries").
    import json
    n = 30
    values = [json.dumps({"i": k, "str": "x" * (arrow_rows._LONG_VALUE - 40 - k)}).encode() for k in range(n)]
    assert all(len(v) <= arrow_rows._LONG_VALUE for v in values)
    got = parse_json_values(pa.array(values, pa.binary()), _value_type())
    assert [(r["i"], len(r["str"])) for r in got.to_pylist()] == [(k, arrow_rows._LONG_VALUE - 40 - k) for k in range(n)]


# -- job_rows end to end ---------------------------------------------------------------------------

DAY_MS = 86_400_000
BATCHES = [   # (partition, first offset, [(timestamp, key, value, headers)])
    (0, 10, [(-1, None, b'{"i":1,"str":"a","objs":[{"k":"x","v":0.5}]}', [("type", b"a"), ("n", None)]),
             (0, b"k1", None, []),
             (1_763_000_123_456, b"", b'{"d":-0.0,"nested":{"x":7},"arr":[]}', [("h", b"\x00\xff")]),
             (253_402_300_799_999, b"\xff", b"  {}  ", [("", b""), ("\u00e9", None)])]),
    (3, 0, [(1_700_000_000_001, b"k", b'{"id":-9223372036854775808,"b":false}', [("a", b"1"), ("b", b"2")]),
            (-86_400_001, None, b'{"str":"\\ud83d\\ude00 \\/"}', []),
            (DAY_MS - 1, b"kk", b'{"t":1,"s":2}', [("x", None)]),
            # a repeated header key: Spark's LAST_WIN keeps the first entry's place, the last value
            (5, b"r", b'{"i":2}', [("type", b"a"), ("x", b"1"), ("type", b"b")]),
            (6, None, b'{"i":3}', [("a", b"1"), ("dup", None), ("dup", b"z"), ("dup", None)])]),
]
VALUE_FORMATS = {"json": DDL, "string": None, "binary": None}


def _stage(tmp_path, partition: int, first: int, rows: list) -> tuple[str, str, pa.Table]:
    """A worker's staged batch (staged.write), read back (staged.read) and held as the Parquet
    file ``prepare`` reads, named the way ``uploader._hold`` names it."""
    batch = BatchId(partition, first, first + len(rows) - 1)
    path = str(tmp_path / f"{batch.name}{staged.SUFFIX}")
    staged.write(path, "events", partition, list(range(first, first + len(rows))), [r[0] for r in rows],
                 [n % 2 for n in range(len(rows))], [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows])
    table = staged.read(path)
    held = str(tmp_path / f"w0-0001-{batch.name}.parquet")
    pq.write_table(table, held, compression="none")
    return held, batch.name, table


@pytest.mark.parametrize("value_format", list(VALUE_FORMATS))
def test_job_rows_are_the_rows_spark_prepares(spark, tmp_path, value_format):
    schema = VALUE_FORMATS[value_format]
    w = _writer(spark, tmp_path, value_format=value_format, **({"value_schema": schema} if schema else {}))
    held = [_stage(tmp_path, *b) for b in BATCHES]
    job = w.prepare([(path, name, []) for path, name, _ in held], str(tmp_path / "tmp"), careful=False)
    want = job.df.drop("_batch").toArrow().sort_by([("partition", "ascending"), ("offset", "ascending")])
    got = pa.concat_tables([job_rows(t, value_format, _value_type() if schema else None) for _, _, t in held])
    got = got.sort_by([("partition", "ascending"), ("offset", "ascending")])
    assert got.column_names == list(arrow_rows.COLUMNS) == want.column_names
    for name in got.column_names:
        assert got.schema.field(name).type.equals(want.schema.field(name).type), \
            (name, got.schema.field(name).type, want.schema.field(name).type)
    assert got.num_rows == want.num_rows == sum(len(b[2]) for b in BATCHES)
    for g, s in zip(got.to_pylist(), want.to_pylist()):
        assert _same(g, s), f"pyarrow {g!r}\n  Spark {s!r}"


@pytest.mark.parametrize("timestamp, headers", [
    (253_402_300_800_000, []),                           # 10000-01-01: Spark writes "+10000-01-01"
    (2**62, [("a", b"1")]),
])
def test_rows_spark_must_build_are_not_direct(spark, tmp_path, timestamp, headers):
    rows = [(1_700_000_000_000, b"k", b"{}", [("ok", b"1")]), (timestamp, None, b'{"i":1}', headers)]
    _, _, table = _stage(tmp_path, 0, 0, rows)
    assert job_rows(table.slice(0, 1), "json", _value_type()).num_rows == 1   # the first row alone is direct
    with pytest.raises(NotDirect):
        job_rows(table, "json", _value_type())


def test_invalid_utf8_is_not_direct_as_a_string(spark, tmp_path):
    _, _, table = _stage(tmp_path, 0, 0, [(0, None, b"ok", []), (0, None, b"\xff", [])])
    assert job_rows(table, "binary", None).column("value").to_pylist() == [b"ok", b"\xff"]
    with pytest.raises(NotDirect):
        job_rows(table, "string", None)
