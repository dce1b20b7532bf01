"""A job's rows built in Arrow by the uploader itself, instead of by a Spark job.

Why: on a two-core machine a Spark job's fixed cost was most of an upload.  100,000 rows into
Delta took 5-6 s warm, 4.2-4.5 s of it in Delta's ``writeFiles``; the same rows parsed and
written with pyarrow take about 0.3 s.  So in local mode, where the uploader and the table share
a filesystem, the uploader builds the rows here, writes the data files itself
(``delta_files.py``, ``iceberg_files.py``) and commits them without a JVM (``delta_commit.py``
through delta-rs, ``iceberg_commit.py``), with the offsets that make the upload exactly-once.

``job_rows`` gives exactly the rows ``writer.SparkWriter.prepare`` would write, or raises
``NotDirect`` and the job takes the Spark path, which also sends every value that does not parse
to the dead letters.  The rules that make the two the same:

* ``timestamp``: milliseconds to ``timestamp[us, UTC]``, null where negative (Spark:
  ``when(ts >= 0, timestamp_millis(ts))``); ``date``: its UTC day as ``yyyy-mm-dd``, and
  ``1970-01-01`` where it is null.  A year past 9999 (Spark writes ``+10000-…``) is not direct.
* ``headers``: ``map<string, binary>`` in the record's order.  A record that repeats a header
  key is not direct (Spark keeps the last value at the first key's place: LAST_WIN).
* ``value``: as is for ``binary``; for ``string`` valid UTF-8 only (Spark's cast keeps invalid
  bytes, pyarrow's refuses them).  For ``json``, pyarrow's JSON reader with ``value_schema`` as
  its explicit schema, over values that each open with ``{`` and hold no line break, so that
  line *i* of the reader's input is value *i*.  Whatever the reader refuses (a field of another
  type, a number out of range, a repeated key, a value that is not one object) is not direct:
  Spark's ``from_json`` decides those, as before.  Only the types whose JSON reading the two
  agree on are direct (``value_arrow_type``); tests/sinks/spark/test_spark_arrow_rows.py compares
  the two readers value by value.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

log = logging.getLogger("kdaemon.spark.uploader")

COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers", "date")
HEADERS = pa.map_(pa.string(), pa.binary())


def rows_schema(value_type):
    """The rows' Spark schema (``COLUMNS``) with ``value_type`` (a pyspark type) as ``value``:
    what the Spark path writes and the direct path's commits declare."""
    from pyspark.sql import types as T
    return T.StructType([
        T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestamp_type", T.ByteType()), T.StructField("key", T.BinaryType()),
        T.StructField("value", value_type), T.StructField("headers", T.MapType(T.StringType(), T.BinaryType())),
        T.StructField("date", T.StringType())])
TIMESTAMP = pa.timestamp("us", tz="UTC")
_YEAR_10000_MS = 253_402_300_800_000   # 10000-01-01T00:00:00Z: Spark writes such dates as "+10000-…"
# The JSON reader's block: larger than any value it is given (``_LONG_VALUE``), since a line may
# not straddle two blocks.  Not larger: the reader allocates a block's size per call, and a
# job's batches are about 1 MB of values each.  Measured on 20 batches of 5,000 of the
# benchmarks' 200-byte values (bench/spark): 140 ms with 256 KiB or 1 MiB blocks, 220-245 ms
# with 16 MiB.
_BLOCK_SIZE = 256 << 10
_LONG_VALUE = 50_000   # bytes; longer values go to Spark (``_within_jackson_limits``)
# The integer token -0 (not -0.0 or -0e0), which Jackson reads as the integer 0.
_MINUS_ZERO = r"-0\s*[,\]}]"
_LF, _CR = 10, 13
_BUILDERS = 2   # threads building a job's rows (``each_batch_rows``)


class NotDirect(Exception):
    """These rows are not built here: the job goes through Spark (the message says why)."""


def value_arrow_type(spark_type) -> pa.DataType:
    """The Arrow type pyarrow's JSON reader fills for a field of ``value_schema`` (a pyspark
    type), or NotDirect for a type the two readers may read differently.

    Left to Spark: floats (Jackson reads a float through a double, pyarrow directly, and the two
    roundings can differ), decimals, dates and timestamps (Spark's formats and time zones),
    binary (base64), maps."""
    from pyspark.sql import types as T
    simple = {T.BooleanType: pa.bool_(), T.ByteType: pa.int8(), T.ShortType: pa.int16(),
              T.IntegerType: pa.int32(), T.LongType: pa.int64(), T.DoubleType: pa.float64(),
              T.StringType: pa.string()}
    for cls, arrow in simple.items():
        if type(spark_type) is cls:
            return arrow
    if isinstance(spark_type, T.StructType):
        return pa.struct([pa.field(f.name, value_arrow_type(f.dataType)) for f in spark_type.fields])
    if isinstance(spark_type, T.ArrayType):
        return pa.list_(value_arrow_type(spark_type.elementType))
    raise NotDirect(f"value_schema type {spark_type.simpleString()} is read by Spark")


def parse_json_values(values: pa.Array, value_type: pa.StructType) -> pa.Array:
    """``values`` (binary, nullable) parsed as ``value_type``: a struct array of the same
    length, null where the value is null; NotDirect where pyarrow's reader and Spark's
    ``from_json`` might not agree, or where a value does not parse."""
    present = values.drop_null()
    if len(present) == 0:
        return pa.nulls(len(values), value_type)
    text = _utf8(present)
    if not (pc.all(pc.starts_with(text, "{")).as_py()
            or pc.all(pc.match_substring_regex(text, r"^\s*\{")).as_py()):
        raise NotDirect("a value is not a JSON object")
    if pc.any(pc.match_substring_regex(text, _MINUS_ZERO)).as_py():
        raise NotDirect("a value holds the integer -0 (Spark reads 0.0 into a DOUBLE, pyarrow -0.0)")
    _within_jackson_limits(text)
    joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, len(text)], pa.int32()), text), "\n")[0]
    # No value holds a line break: the joined text's only ones are the n - 1 put between them.
    # (Counted over the whole buffer: a regex per value took 4 times as long as the rest of
    # these checks together.)
    buffer = joined.as_buffer()
    data = np.frombuffer(buffer, np.uint8)
    if np.count_nonzero(data == _LF) != len(text) - 1 or np.any(data == _CR):
        raise NotDirect("a value holds a line break (it would read as two lines)")
    try:
        table = pj.read_json(pa.BufferReader(buffer),
                             read_options=pj.ReadOptions(use_threads=True, block_size=_BLOCK_SIZE),
                             parse_options=pj.ParseOptions(explicit_schema=pa.schema(list(value_type)),
                                                           unexpected_field_behavior="ignore"))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise NotDirect(f"pyarrow's JSON reader refused a value ({exc})") from None
    if table.num_rows != len(present):
        raise NotDirect(f"{len(present)} values read as {table.num_rows} JSON lines")
    parsed = pa.StructArray.from_arrays([table.column(i).combine_chunks() for i in range(table.num_columns)],
                                        fields=list(value_type))
    return parsed if len(present) == len(values) else _spread(parsed, values.is_valid())


class Built:
    """A batch's ``job_rows`` built before its job (``uploader/ahead.py``), in the list
    ``each_batch_rows`` is given: passed on as they are."""

    __slots__ = ("rows",)

    def __init__(self, rows: pa.Table) -> None:
        self.rows = rows


def each_batch_rows(batches: list, value_format: str, value_type: pa.StructType | None):
    """``job_rows`` of each batch (a ``staged.schema()`` table, or ``Built`` rows), in order,
    the next ``_BUILDERS`` built on threads of their own while the caller writes this one
    (pyarrow parses and writes outside the GIL; at most ``_BUILDERS`` + 1 batches' rows are
    held at once, besides the ``Built`` ones).  A NotDirect is raised where its batch comes.

    Two builders: parsing the values is most of a job's time (20 batches of 5,000 of the
    benchmarks' values: 150 ms on two threads, 250 ms on one)."""
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=_BUILDERS, thread_name_prefix="job-rows") as pool:
        ahead: deque = deque()
        try:
            for batch in batches:
                if isinstance(batch, Built):
                    built: Future = Future()
                    built.set_result(batch.rows)
                    ahead.append(built)
                else:
                    ahead.append(pool.submit(job_rows, batch, value_format, value_type))
                if len(ahead) > _BUILDERS:
                    yield ahead.popleft().result()
            while ahead:
                yield ahead.popleft().result()
        finally:
            for future in ahead:
                future.cancel()


def _within_jackson_limits(text: pa.Array) -> None:
    """NotDirect where Spark's JSON parser (Jackson) refuses a value for its size and pyarrow's
    reads it: nesting deeper than 1,000, a number of more than 1,000 digits, a field name of
    more than 50,000 characters, a string of more than 20,000,000.  Counted loosely (brackets
    and digits inside strings count too), so a value near a limit goes to Spark whichever way
    Jackson would count it; a value of at most 1,000 bytes is within every limit."""
    lengths = pc.binary_length(text)
    if pc.max(lengths).as_py() > _LONG_VALUE:
        raise NotDirect(f"a value is longer than {_LONG_VALUE} bytes")
    long = text.filter(pc.greater(lengths, 1000))
    if len(long) == 0:
        return
    if pc.max(pc.count_substring_regex(long, r"[\[{]")).as_py() > 1000:
        raise NotDirect("a value may nest deeper than Spark's JSON parser reads (1,000)")
    if pc.any(pc.match_substring_regex(long, r"[0-9.eE+-]{1000}")).as_py():
        raise NotDirect("a value may hold a number longer than Spark's JSON parser reads (1,000 digits)")


def job_rows(batch: pa.Table, value_format: str, value_type: pa.StructType | None) -> pa.Table:
    """The rows of a job's batch (a ``staged.schema()`` table, already without the rows the
    output holds) as the output's columns (``COLUMNS``); NotDirect for rows Spark must build."""
    rows = batch.combine_chunks()
    ms = rows.column("timestamp")
    if len(ms) and pc.max(ms).as_py() >= _YEAR_10000_MS:
        raise NotDirect("a record's timestamp is past the year 9999")
    known = pc.greater_equal(ms, 0)
    ts = pc.if_else(known, pc.multiply(ms, 1000), None).cast(pa.int64()).cast(TIMESTAMP)
    date = pc.fill_null(ts.cast(pa.date32()).cast(pa.string()), "1970-01-01")
    value = rows.column("value")
    if value_format == "string":
        value = _utf8(value.combine_chunks())
    elif value_format == "json":
        value = parse_json_values(value.combine_chunks(), value_type)
    return pa.table({"topic": rows.column("topic"), "partition": rows.column("partition"),
                     "offset": rows.column("offset"), "timestamp": ts,
                     "timestamp_type": rows.column("timestamp_type"), "key": rows.column("key"),
                     "value": value, "headers": _headers_map(rows.column("headers").combine_chunks()),
                     "date": date})


def _headers_map(headers: pa.ListArray) -> pa.MapArray:
    """The staged list of (key, value) entries as a map, as Spark's ``map_from_entries`` makes it
    under ``mapKeyDedupPolicy = LAST_WIN`` (the writer's): a key a record repeats keeps its first
    entry's place and its last entry's value."""
    if headers.offset or headers.null_count:
        raise NotDirect("headers column with an offset or nulls")   # staged.read makes neither
    entries = headers.flatten()
    keys, values = entries.field("key"), entries.field("value")
    offsets = headers.offsets
    if len(keys):
        rows = pc.list_parent_indices(headers)
        pairs = pa.table({"row": rows, "key": keys, "at": pa.array(np.arange(len(keys)), pa.int64())})
        kept = pairs.group_by(["row", "key"], use_threads=False).aggregate([("at", "min"), ("at", "max")])
        if kept.num_rows != len(keys):   # a record repeats a key: one entry per key
            kept = kept.sort_by("at_min").combine_chunks()
            keys = keys.take(kept.column("at_min").chunk(0))
            values = values.take(kept.column("at_max").chunk(0))
            per_row = np.bincount(kept.column("row").to_numpy(), minlength=len(headers))
            offsets = pa.array(np.concatenate([[0], np.cumsum(per_row)]), pa.int32())
    return pa.MapArray.from_arrays(offsets, keys, values, type=HEADERS)


def _utf8(values: pa.Array) -> pa.Array:
    try:
        return values.cast(pa.string())
    except pa.ArrowInvalid:
        raise NotDirect("a value is not valid UTF-8") from None


def _spread(parsed: pa.Array, valid: pa.Array) -> pa.Array:
    """``parsed`` (one row per valid value) at the valid positions, null elsewhere."""
    # The n-th valid position takes parsed[n]: a running count of the valid ones, masked.
    counted = pc.subtract(pc.cumulative_sum(valid.cast(pa.int64())), 1)
    return parsed.take(pc.if_else(valid, counted, None))


def split_by(rows: pa.Table, columns: list[str]) -> list[tuple[tuple[str, ...], pa.Table]]:
    """``rows`` by their values of ``columns`` (partition columns, never null here), each
    group's values as strings, as table formats spell partition values."""
    if not columns:
        return [((), rows)]
    # Mostly one group (a batch's records are rarely of two days): then no filtering at all.
    uniques = [pc.unique(rows.column(c)) for c in columns]
    if all(len(u) == 1 for u in uniques):
        return [(tuple(str(u[0].as_py()) for u in uniques), rows)]
    keys = rows.select(columns).group_by(columns).aggregate([])
    out = []
    for key in keys.to_pylist():
        mask = None
        for c in columns:
            m = pc.equal(rows.column(c), pa.scalar(key[c], rows.schema.field(c).type))
            mask = m if mask is None else pc.and_(mask, m)
        out.append((tuple(str(key[c]) for c in columns), rows.filter(mask)))
    return out


# Threads a job's data files are written by, each with its own file per partition value: pyarrow
# encodes and compresses outside the GIL, and one writer was the longest part of a 100,000-row
# job (0.17 s alone, about twice that beside the thread that parses the next batch).  Two, as a
# Spark job on local[2] writes a file per task: batch i goes to lane i % 2, so a one-batch job
# still makes one file.
WRITE_LANES = 2


class PartitionedFiles:
    """A job's rows written piece by piece (a batch at a time, so that a job holds a few
    batches' rows in memory, not all of them) as Parquet files, one per partition value and
    write lane (``WRITE_LANES``).

    ``path_for(values)`` names a new file for the partition values (strings); ``shape(rows)``
    gives the columns a file holds (a format drops or casts columns).  ``close`` syncs the files
    (a table commit that names them must not outlive them) and gives (values, path, size) per
    file; ``abort`` removes them: a job that turns out ``NotDirect`` halfway leaves nothing.
    A lane holds at most one batch waiting: ``write`` waits for that lane's previous one (and
    raises its error)."""

    def __init__(self, partition_by: list[str], path_for, shape, compression: str,
                 lanes: int = WRITE_LANES) -> None:
        from concurrent.futures import ThreadPoolExecutor
        self.partition_by, self.path_for, self.shape, self.compression = partition_by, path_for, shape, compression
        self._lanes = [_Lane(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"parquet-{i}"))
                       for i in range(max(1, lanes))]
        self._next = 0

    def write(self, rows: pa.Table) -> None:
        lane = self._lanes[self._next % len(self._lanes)]
        self._next += 1
        lane.settle()
        parts = [(values, self.shape(part)) for values, part in split_by(rows, self.partition_by)]
        lane.pending = lane.pool.submit(self._write_parts, lane, parts)

    def _write_parts(self, lane: "_Lane", parts: list) -> None:
        import pyarrow.parquet as pq
        for values, data in parts:
            if values not in lane.open:
                path = self.path_for(values)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                lane.open[values] = (path, pq.ParquetWriter(path, data.schema, compression=self.compression))
            lane.open[values][1].write_table(data)

    def close(self) -> list[tuple[tuple[str, ...], str, int]]:
        out = []
        try:
            for lane in self._lanes:
                lane.settle()
            for lane in self._lanes:
                for values, (path, writer) in lane.open.items():
                    writer.close()
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                        out.append((values, path, os.fstat(fd).st_size))
                    finally:
                        os.close(fd)
                lane.open = {}
        finally:
            self._shut()
        return out

    def abort(self) -> None:
        try:
            for lane in self._lanes:
                try:
                    lane.settle()
                except Exception as exc:   # the error that made us abort is the one raised
                    log.warning("a write thread of the aborted job failed too: %s: %s", type(exc).__name__, exc)
                for path, writer in lane.open.values():
                    try:
                        writer.close()
                    except Exception as exc:
                        log.warning("closing %s of the aborted job failed (removed all the same): %s: %s",
                                    path, type(exc).__name__, exc)
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                lane.open = {}
        finally:
            self._shut()

    def _shut(self) -> None:
        for lane in self._lanes:
            lane.pool.shutdown(wait=True)


class _Lane:
    """One write thread of ``PartitionedFiles``: its open files and the batch it is writing."""

    def __init__(self, pool) -> None:
        self.pool = pool
        self.open: dict[tuple[str, ...], tuple[str, object]] = {}
        self.pending = None

    def settle(self) -> None:
        """Wait for the batch in hand; its error, if any, is raised here."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()


def write_pieces(pieces, files: PartitionedFiles) -> list[tuple[tuple[str, ...], str, int]]:
    """Every piece of ``pieces`` (an iterable of tables; building one may raise NotDirect)
    through ``files``; the files, closed.  On any error the files written so far are removed."""
    try:
        for rows in pieces:
            files.write(rows)
        return files.close()
    except BaseException:
        files.abort()
        raise

