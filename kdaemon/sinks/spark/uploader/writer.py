"""The Spark side of the uploader: the SparkSession, reading staged batches, writing one job.

``uploader.Uploader`` owns the socket, the queue and the exactly-once bookkeeping (manifests,
pending records, moving files into place); it calls ``SparkWriter`` for what needs Spark, so
the process logic can be followed without Spark's API in the way.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.parquet as pq

from .. import staged
from ..tables import arrow_rows, ddl, delta, formats, jars
from . import refused_rows
from ....backoff import Backoff
from ....durations import duration
from ..settings import SparkSettings
from ..staging import spark_mismatch

log = logging.getLogger("kdaemon.spark.uploader")

_CORRUPT = "_kdaemon_corrupt"   # from_json puts a value that does not parse here
# A job's rows (the output's columns and the batch each came from), and its dead letters': the
# raw value, and what was wrong with the row.
_ROW_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers", "date",
                "_batch")
_DEAD_COLUMNS = ("topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers", "date",
                 "_batch", "error")
_BATCH_IN_FILE = r"(p\d+-\d{19}-\d{19})\.parquet$"
_MASTER_CONNECT_TIMEOUT_S = 3.0
_LISTS = ("spark.jars", "spark.sql.extensions")   # comma-separated settings the sink contributes to
_STATIC_SQL = ("spark.sql.extensions", "spark.sql.hive.filesourcePartitionFileCacheSize")   # a Connect client cannot set these


@dataclass
class Job:
    """One upload job's rows on their way to the output (``SparkWriter.prepare``)."""
    df: object
    tmp_dir: str
    dlq_dir: str | None = None   # the values that do not parse, written under tmp_dir
    cached: object = None        # a persisted DataFrame to release at the end


def merged_conf(conf: dict[str, str], more: dict) -> dict[str, str]:
    """``conf`` with ``more`` set over it, except that jars and extensions in ``more`` add to
    those in ``conf`` (comma-separated lists) instead of replacing them."""
    out = dict(conf)
    for k, v in more.items():
        k, v = str(k), str(v)
        out[k] = f"{out[k]},{v}" if k in _LISTS and k in out else v
    return out


class BadValues(Exception):
    """A job prepared without its dead-letter pass met a value that does not parse; nothing
    of it was committed, and it is to be run again with ``careful``."""


_BAD_VALUE = "kdaemon: a value does not parse as value_schema"   # raise_error's message, found again in the failure


def raise_bad_values(exc: BaseException) -> None:
    """Raise ``BadValues`` if ``exc`` is a write failed by the not-careful job's check."""
    if _BAD_VALUE in str(exc):
        raise BadValues(first_line(exc)) from None


class SchemaMismatch(Exception):
    """The rows of a job do not fit the table's schema; the message names the fix."""


class RowsRefused(Exception):
    """The table refused rows of a job for what they hold (``refused_rows``: a CHECK
    constraint, a NOT NULL column); nothing of the job was committed.  The message is the
    table's line, naming the constraint or column.  The uploader runs the job again with the
    dead-letter pass, which keeps such rows out (``SparkWriter.prepare``)."""


# The error classes of Spark, Delta and Iceberg for rows that do not fit a table's columns.
_SCHEMA_ERRORS = ("DELTA_METADATA_MISMATCH", "DELTA_SCHEMA_MISMATCH", "DELTA_FAILED_TO_MERGE_FIELDS",
                  "INCOMPATIBLE_DATA_FOR_TABLE", "Cannot write incompatible data", "Cannot change column type")


class SparkStartError(Exception):
    """The SparkSession cannot be created with these settings; the message says why."""


class SparkMismatchError(SparkStartError):
    """This Spark (the installed pyspark, or the JVM's) is not the one the staged jars are built
    for (``jars.mismatch``): no restart changes that, so the uploader refuses to start
    (``EXIT_SINK_REFUSED``) instead of failing every job with a linkage error."""

    def __init__(self, mismatch: jars.SparkMismatch) -> None:
        super().__init__(mismatch.line())
        self.mismatch = mismatch


def check_master_reachable(master: str) -> None:
    """Fail fast, with a clear message, on a standalone or Connect master nobody listens at.

    Spark itself retries a dead ``spark://`` master for about a minute, then fails with a long
    Java stack trace that does not name the setting to fix."""
    if master.startswith("spark://"):
        hostports = [hp for hp in master[len("spark://"):].split(",") if hp]
        default_port = 7077
    elif master.startswith("sc://"):
        hostports = [urlparse(master).netloc.split("@")[-1]]
        default_port = 15002
    else:
        return  # local[...], yarn, k8s://...: nothing to probe cheaply
    errors = []
    for hp in hostports:
        host, _, port = hp.strip("/").rpartition(":") if ":" in hp else (hp, "", "")
        host = host or hp
        try:
            with socket.create_connection((host.strip("[]"), int(port or default_port)),
                                          timeout=_MASTER_CONNECT_TIMEOUT_S):
                return
        except (OSError, ValueError) as exc:
            errors.append(f"{hp}: {getattr(exc, 'strerror', None) or exc}")
    raise SparkStartError(f"the Spark master {master} is not reachable ({'; '.join(errors)}); "
                          "fix [sink] master and reload (SIGHUP)")


MASTER_CHECK_MAX_S = 5.0


def wait_for_master(master: str, stopped: Callable[[], bool]) -> bool:
    """A ``spark://`` or ``sc://`` master nobody answers at: the uploader waits for it, without a
    socket, so the workers' probes fail and they hold their batches quietly; exiting instead
    had the supervisor start a new uploader (and log two errors) every 30 s for as long as the
    master was down.  Checked every ``MASTER_CHECK_MAX_S`` at most, so uploads resume within
    seconds of the master's return.  False if ``stopped()`` first."""
    backoff = Backoff(0.5, MASTER_CHECK_MAX_S)
    since = time.monotonic()
    next_summary = since + 60.0
    while not stopped():
        try:
            check_master_reachable(master)
        except SparkStartError as exc:
            now = time.monotonic()
            if backoff.failures == 0:
                log.error("%s; waiting for it (the workers hold their batches meanwhile)", exc)
            elif now >= next_summary:
                next_summary = now + 60.0
                log.warning("the Spark master %s is still not reachable after %s", master, duration(now - since))
            deadline = now + backoff.failure()
            while not stopped() and time.monotonic() < deadline:
                time.sleep(0.1)
            continue
        if backoff.failures:
            log.info("the Spark master %s is reachable again after %s", master, duration(time.monotonic() - since))
        return True
    return False


def first_line(exc: BaseException) -> str:
    """The line of a (Py4J) exception that says what went wrong, without the Java stack."""
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "An error occurred while calling")):
            return line[:500]
    return type(exc).__name__


class SparkWriter:
    """Everything that talks to Spark: session, transformation, the write of one job."""

    def __init__(self, settings: SparkSettings | Mapping) -> None:
        self.settings = settings = SparkSettings.of(settings)
        self.path = settings.path
        self.format = settings.format
        self.value_schema = settings.value_schema
        self.value_format = settings.value_format
        self.partition_by = list(settings.partition_by)
        self.master = settings.master
        self.spark = None
        self._value_struct = None  # value_schema plus the corrupt-record column
        # Local mode runs on this machine: Spark can read the uploader's held Parquet files itself.
        self.direct = self.master.startswith("local")
        # ...and the uploader can write a table's data files itself (arrow_rows): set in
        # start(), with the rows' types.
        self._direct_rows: tuple | None = None   # (the value's Arrow type, the rows' Spark schema)
        self._gateway = None   # the JVM gateway ``start`` launched (``stop_jvm``), not one it found

    def prepare_offline(self) -> None:
        """What the writer can know before its session starts: ``value_schema`` parsed by
        ``ddl.py`` and so whether direct writes apply (``direct_writes``).  With them, the
        uploader serves jobs at once and starts the session beside them (``start``): Spark's
        start (10 s here) and a first cold commit were the whole critical path of a daemon
        started to deliver a topic.  A schema ``ddl.py`` does not parse waits for Spark's parser."""
        if self.value_schema:
            try:
                self._value_struct = self._checked_value_struct(
                    ddl.parse_schema(self.value_schema, conf=self.settings.conf))
            except ddl.NotParsedHere as exc:
                log.info("value_schema is parsed once the Spark session is up (%s)", exc)
                return
        self._direct_rows = self._direct_rows_types()
        if self._direct_rows and self.format == "iceberg":
            try:   # pyiceberg's import (0.5 s) now, while the workers read their first batches
                from ..tables import iceberg_commit  # noqa: F401
            except ImportError:
                pass   # iceberg.append_files says so, and Spark writes the jobs
        if self._direct_rows and self.format == "delta":
            import deltalake  # noqa: F401  (delta-rs, the direct path's commits: imported before the first job)

    def check_spark(self) -> None:
        """Raise ``SparkMismatchError`` if the installed pyspark is not the Spark the staged jars
        of this table format are built for; before anything else, no JVM needed."""
        found = spark_mismatch(self.settings)
        if found is not None:
            raise SparkMismatchError(found)

    def start(self) -> None:
        """Start the SparkSession (the JVM: seconds), then parse ``value_schema`` with Spark's
        own parser: the reference for ``ddl.py``'s result, or the parse it could not make.  A
        JVM whose Spark is not the one the staged jars are built for (SPARK_HOME naming another
        Spark) raises ``SparkMismatchError``."""
        check_master_reachable(self.master)
        from pyspark.sql import SparkSession
        builder = SparkSession.builder.appName("kdaemon-uploader")
        remote = self.master.startswith("sc://")
        builder = builder.remote(self.master) if remote else builder.master(self.master)
        conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                "spark.sql.session.timeZone": "UTC", "spark.sql.mapKeyDedupPolicy": "LAST_WIN",
                "spark.sql.sources.partitionOverwriteMode": "dynamic",
                "spark.sql.shuffle.partitions": "2",
                # Staged files are read once each: caching their listings only grows the heap.
                "spark.sql.hive.filesourcePartitionFileCacheSize": "0"}
        if self.master.startswith("local"):
            # Nothing outside this host talks to a local-mode driver: keep it on loopback
            # (Spark would otherwise pick the address the host name resolves to).
            conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if self.format in formats.FORMATS:
            conf.update(formats.FORMATS[self.format].session_conf(self.path))
        if remote:
            # A Connect client sets only runtime SQL settings; the server owns the rest (its
            # jars, UI, driver address), and Spark warns about every other one it is sent.
            conf = {k: v for k, v in conf.items() if k.startswith("spark.sql.") and k not in _STATIC_SQL}
        conf = merged_conf(conf, self.settings.conf)
        for k, v in conf.items():
            builder = builder.config(k, v)
        from pyspark import SparkContext
        found_gateway = SparkContext._gateway
        try:
            spark = builder.getOrCreate()
        except Exception as exc:
            raise SparkStartError(f"cannot start a SparkSession on master {self.master}: {first_line(exc)}") from None
        finally:
            if found_gateway is None:   # launched here (even for a session that then failed): ours to stop
                self._gateway = SparkContext._gateway
        if not remote:
            spark.sparkContext.setLogLevel("WARN")
            found = spark_mismatch(self.settings, spark.version, jars.JVM)
            if found is not None:
                raise SparkMismatchError(found)   # the session is stopped with the writer
        if self.value_schema:
            offline = self._value_struct
            self._value_struct = self._parse_value_schema(self.value_schema)
            if offline is not None and offline != self._value_struct:
                # ddl.py's parity tests say this cannot happen; if it does, Spark's parse wins
                # from here on (jobs committed before used ddl.py's, which the log names).
                log.error("value_schema %r: kdaemon's parser read %s, Spark's %s; using Spark's from now on",
                          self.value_schema, offline.simpleString(), self._value_struct.simpleString())
                self._direct_rows = None
        if self._direct_rows is None:
            self._direct_rows = self._direct_rows_types()
        self.spark = spark   # last: a job that needs Spark waits for this (``session_ready``)
        log.info("Spark session ready (master %s, Spark %s); %s", self.master, spark.version,
                 "the uploader writes the table's data files itself where it can (direct_writes)"
                 if self._direct_rows else "Spark writes every job")

    @property
    def session_ready(self) -> bool:
        return self.spark is not None

    def _direct_rows_types(self) -> tuple | None:
        """(the value's Arrow type, the rows' Spark schema) where ``append_direct`` may write
        this sink's jobs; None where every job goes through Spark: a cluster (its executors
        write where the uploader may not see), Parquet path mode (not yet),
        ``merge_schema`` (Delta's writer evolves the table), a ``value_schema`` type that only
        Spark reads, or ``direct_writes = false``."""
        if not (self.direct and self.format in formats.FORMATS and self.settings.direct_writes
                and not self.settings.merge_schema):
            return None
        from pyspark.sql import types as T
        value_type, arrow_value = {"binary": (T.BinaryType(), None), "string": (T.StringType(), None)}.get(
            self.value_format, (None, None))
        if self.value_format == "json":
            value_type = T.StructType([f for f in self._value_struct.fields if f.name != _CORRUPT])
            try:
                arrow_value = arrow_rows.value_arrow_type(value_type)
            except arrow_rows.NotDirect as exc:
                log.info("every job goes through Spark: %s", exc)
                return None
        return arrow_value, arrow_rows.rows_schema(value_type)

    @property
    def direct_writes(self) -> bool:
        """May ``append_direct`` write this sink's jobs (known once the session started)?"""
        return self._direct_rows is not None

    def append_direct(self, batches: list, versions: dict[tuple[str, int], int]) -> bool:
        """Table mode without Spark: the rows built by ``arrow_rows`` from ``batches``
        (``staged.schema()`` tables without the rows the output holds, or ``arrow_rows.Built``
        rows of a whole batch, built ahead: ``direct_rows``), their files written and
        committed by the uploader itself (``delta.append_files``, ``iceberg.append_files``: no
        JVM, so this works before the session is up), as ``append_table`` commits a job.  False,
        with nothing written, where this job needs Spark (the reason is logged at DEBUG): the
        caller then runs it through ``prepare``/``append_table``."""
        if not self.direct_writes:
            return False
        arrow_value, schema = self._direct_rows
        # A batch at a time: the job's memory is two batches' rows, whatever its size.
        pieces = arrow_rows.each_batch_rows(batches, self.value_format, arrow_value)
        try:
            version = formats.FORMATS[self.format].append_files(pieces, self.path, self.partition_by, versions, schema)
        except arrow_rows.NotDirect as exc:
            log.debug("this job goes through Spark: %s", exc)
            return False
        if version is None:
            log.debug("this job goes through Spark: the table is not one the direct path writes")
            return False
        return True

    def direct_rows(self, staged_file: str):
        """The job rows ``append_direct`` would build of the whole batch in ``staged_file``
        (for ``ahead.RowsAhead``); raises what reading or building it raises (``NotDirect``
        among others).  Only where ``direct_writes``."""
        arrow_value, _ = self._direct_rows
        return arrow_rows.job_rows(staged.read(staged_file), self.value_format, arrow_value)

    def _parse_value_schema(self, text: str):
        from pyspark.sql.types import DataType
        try:
            parsed = DataType.fromDDL(text)
        except Exception as exc:
            raise SparkStartError(f"value_schema {text!r} is not a Spark DDL schema: {first_line(exc)}") from None
        return self._checked_value_struct(parsed)

    def _checked_value_struct(self, parsed):
        """``value_schema`` parsed, as a struct with the corrupt-record column that
        ``from_json`` fills."""
        from pyspark.sql.types import StringType, StructField, StructType
        if not isinstance(parsed, StructType):
            raise SparkStartError(f"value_schema {self.value_schema!r} must describe a struct (\"a INT, b STRING\"), "
                                  f"not {parsed.simpleString()}")
        if _CORRUPT in parsed.fieldNames():
            raise SparkStartError(f"value_schema must not have a field named {_CORRUPT}")
        return StructType(parsed.fields + [StructField(_CORRUPT, StringType())])

    def _read_direct(self, batches):
        """Spark reads the held Parquet files itself (local mode: same machine, same filesystem):
        nothing passes through Python, about twice as fast as shipping Arrow via the driver."""
        from pyspark.sql import functions as F
        df = self.spark.read.schema(self._staged_schema()).parquet(*[f for f, _, _ in batches])
        # The uploader names a held file "<worker>-<unique>-<batch name>.parquet".
        df = df.withColumn("_batch", F.regexp_extract(F.col("_metadata.file_path"), _BATCH_IN_FILE, 1))
        return self._drop_uploaded(df, batches)

    def _read_via_driver(self, batches):
        """The uploader reads the held files and hands them to Spark as Arrow: for a cluster
        whose executors cannot see this machine's disk."""
        tables = []
        for path, name, _ in batches:
            t = pq.read_table(path)
            tables.append(t.append_column("_batch", pa.array([name] * t.num_rows, pa.string())))
        return self._drop_uploaded(self.spark.createDataFrame(pa.concat_tables(tables)), batches)

    @staticmethod
    def _drop_uploaded(df, batches):
        from pyspark.sql import functions as F
        drop = None
        for _, name, ranges in batches:
            for first, last in ranges:
                c = (F.col("_batch") == name) & F.col("offset").between(first, last)
                drop = c if drop is None else drop | c
        return df if drop is None else df.where(~drop)

    @staticmethod
    def _staged_schema():
        from pyspark.sql.types import (ArrayType, BinaryType, ByteType, IntegerType, LongType, StringType,
                                       StructField, StructType)
        return StructType([
            StructField("topic", StringType()), StructField("partition", IntegerType()),
            StructField("offset", LongType()), StructField("timestamp", LongType()),
            StructField("timestamp_type", ByteType()), StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                         StructField("value", BinaryType())]))),
        ])

    def prepare(self, batches: list[tuple[str, str, list[tuple[int, int]]]], tmp_dir: str,
                careful: bool = True) -> "Job":
        """The DataFrame of one job: ``batches`` are (held file, batch name, offset ranges to
        drop).  Two kinds of rows go to the dead letters instead of the output: with a JSON
        ``value_format``, values that do not parse as ``value_schema``; in a table, rows it
        refuses for what they hold (``refused_rows.conditions``: its CHECK constraints and NOT
        NULL columns).

        * ``careful``: the dead-letter pass.  The rows are persisted, and the dead letters
          written at once, as Parquet partitioned by topic and ``_batch`` under
          ``tmp_dir/dlq`` (``Job.dlq_dir``), each with the raw value and an ``error`` naming
          what was wrong: an extra Spark job, and the persist, on every upload;
        * not ``careful``: no dead-letter pass; a bad value fails the job's write with
          ``BadValues`` (``raise_error`` on the very condition the careful pass uses), a row the
          table refuses with ``RowsRefused`` (the table's own check), and the uploader runs the
          job again carefully.  Both are rare, so most jobs read their rows once.

        The rows stay to be written by ``write_parquet`` or ``append_table``, then ``finish``."""
        from pyspark.sql import functions as F
        df = self._read_direct(batches) if self.direct else self._read_via_driver(batches)
        # timestamp_millis is exact; a division into a double is not (…123 ms → …122.999).
        df = df.withColumn("timestamp", F.when(F.col("timestamp") >= 0, F.timestamp_millis("timestamp")))
        df = df.withColumn("date", F.coalesce(F.to_date("timestamp"), F.lit("1970-01-01").cast("date")).cast("string"))
        df = df.withColumn("headers", F.map_from_entries("headers"))
        job = Job(df=None, tmp_dir=tmp_dir)
        dead = []   # the dead letters: _DEAD_COLUMNS, the raw value
        refusals = refused_rows.conditions(self.format, self.path) if careful and self.format in formats.FORMATS else []
        if refusals:
            df = df.withColumn("_raw", F.col("value"))
        if self.value_format == "string":
            df = df.withColumn("value", F.col("value").cast("string"))
        elif self.value_format == "json":
            # PERMISSIVE from_json gives a struct of nulls, not null, for a value that does not
            # parse; the corrupt-record column is what tells a bad value from an empty one.
            parsed = F.from_json(F.col("value").cast("string"), self._value_struct,
                                 {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": _CORRUPT})
            df = df.withColumn("_parsed", parsed)
            is_bad = F.col("value").isNotNull() & (F.col("_parsed").isNull() | F.col(f"_parsed.{_CORRUPT}").isNotNull())
            value = F.col("_parsed").dropFields(_CORRUPT)
            if careful:
                job.cached = df = df.persist()
                dead.append(df.where(is_bad).withColumn("error", F.lit(f"value does not parse as {self.value_schema}"))
                            .select(*_DEAD_COLUMNS))
                df = df.where(~is_bad)
            else:
                value = F.when(is_bad, F.raise_error(F.lit(_BAD_VALUE))).otherwise(value)
            df = df.withColumn("value", value).drop("_parsed")
        df = df.select(*_ROW_COLUMNS, *(["_raw"] if refusals else []))
        if refusals:
            # The conditions are over the table's columns, which the rows have by now.  A row
            # fails a condition unless it holds (TRUE): what each names is its dead letter's error.
            failed = F.concat_ws("; ", *[F.when(~F.coalesce(F.expr(c.holds), F.lit(False)), F.lit(c.what))
                                         for c in refusals])
            df = df.withColumn("_refused", failed)
            if job.cached is None:
                job.cached = df = df.persist()
            refused = df.where(F.col("_refused") != "")
            why = F.concat(F.lit(f"the {self.format} table at {self.path} refuses the row: "), F.col("_refused"))
            dead.append(refused.withColumn("value", F.col("_raw")).withColumn("error", why).select(*_DEAD_COLUMNS))
            df = df.where(F.col("_refused") == "").select(*_ROW_COLUMNS)
        if dead:
            job.dlq_dir = os.path.join(tmp_dir, "dlq")
            letters = dead[0]
            for more in dead[1:]:
                letters = letters.unionByName(more)
            letters.write.mode("overwrite").partitionBy("topic", "_batch").parquet(job.dlq_dir)
        job.df = df
        return job

    def write_parquet(self, job: "Job") -> str:
        """Path mode: Spark's files under ``tmp_dir/data``, partitioned by ``_batch`` as well
        (the uploader moves them into place under their batch names); that directory."""
        data_dir = os.path.join(job.tmp_dir, "data")
        try:
            job.df.write.mode("overwrite").partitionBy(*self.partition_by, "_batch").parquet(data_dir)
        except Exception as exc:
            raise_bad_values(exc)
            raise
        return data_dir

    def append_table(self, job: "Job", versions: dict[tuple[str, int], int]) -> None:
        """Table mode: the format's append (``tables/formats.py``); ``versions`` holds each topic
        partition's newest offset among the rows."""
        df = job.df.drop("_batch")
        merge = self.settings.merge_schema
        if self.format == "delta" and len(versions) > 1 and job.cached is None \
                and delta.commits_per_partition(self.spark, merge):
            job.cached = df = df.persist()   # one append per partition: read the held files once
        try:
            formats.FORMATS[self.format].append(self.spark, df, self.path, self.partition_by, versions,
                                               merge_schema=merge)
        except Exception as exc:
            raise_bad_values(exc)
            if refused_rows.refuses_rows(exc):
                raise RowsRefused(refused_rows.refusal_line(exc) or first_line(exc)) from exc
            if not any(marker in str(exc) for marker in _SCHEMA_ERRORS):
                raise
            fix = ("the change is not one merge_schema can make (only new fields are added): alter the table "
                   "or write a new one" if merge else
                   "set merge_schema = true in [sink] to add new fields of value_schema to the table, or to write "
                   "rows without a field it no longer has")
            raise SchemaMismatch(f"the rows do not fit the {self.format} table at {self.path}: "
                                 f"{first_line(exc)} ({fix}; see docs/SPARK.md, schema evolution)") from None

    @staticmethod
    def finish(job: "Job") -> None:
        if job.cached is not None:
            job.cached.unpersist()

    def stop(self) -> None:
        if self.spark is not None:
            try:
                self.spark.stop()
            except Exception:
                pass
        if self._gateway is not None:
            stop_jvm(self._gateway)
            self._gateway = None


# How long the uploader waits for its JVM to exit once told to, before it kills it.
JVM_EXIT_WAIT_S = 10.0


def stop_jvm(gateway, wait_s: float = JVM_EXIT_WAIT_S) -> None:
    """End the JVM behind pyspark's ``gateway`` (a child of the uploader, launched by its
    session's start) before the uploader exits, and wait for it.

    Left alone it exits once the uploader is gone (its gateway reads the stdin pyspark gave it
    and exits at EOF, which the kernel delivers however the uploader died, a SIGKILL included;
    about 4 s here): closing that stdin now ends it while the uploader waits, so a stopped
    uploader leaves no JVM behind, and one that does not go within ``wait_s`` is killed.  Not a
    parent-death signal: the JVM is launched by the session's start thread, and the kernel
    sends that signal when the *thread* that forked it ends."""
    from pyspark import SparkContext
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:
        pass
    if SparkContext._gateway is gateway:
        SparkContext._gateway = SparkContext._jvm = None
    if proc is None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()
    except OSError:
        pass
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        log.warning("the Spark JVM (pid %d) did not exit within %.0fs of being told to; killing it", proc.pid, wait_s)
        proc.kill()
        proc.wait()
