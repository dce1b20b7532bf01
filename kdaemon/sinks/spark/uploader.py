"""The Spark uploader: one process per daemon holding the SparkSession.

Started by the supervisor (``python -m kdaemon.sinks.spark.uploader -c FILE``) before the
workers and stopped after them; restarted with backoff if it dies.  Workers connect over a Unix
socket and send one request per staged batch; the uploader gathers what arrives within a short
window into one Spark job, and answers each request once its batch is in the output (files moved
into place, manifest written) — or with the error.

See ``layout.py`` for the output layout and the exactly-once rules.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import selectors
import shutil
import signal
import socket
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import layout
from .layout import BatchId
from .staging import SETTINGS, socket_path

log = logging.getLogger("kdaemon.spark.uploader")

COALESCE_S = 0.2
MAX_REQUESTS_PER_JOB = 256


@dataclass
class Request:
    conn: socket.socket
    id: int
    file: str
    topic: str
    batch: BatchId
    rows: int


class SparkWriter:
    """Everything that talks to Spark: session, transformation, the write of one job."""

    def __init__(self, settings: dict) -> None:
        self.settings = settings
        self.path = settings.get("path")
        self.table = settings.get("table")
        self.value_format = settings.get("value_format", "binary")
        self.value_schema = settings.get("value_schema")
        if self.value_schema:
            self.value_format = "json"
        if self.value_format not in ("binary", "string", "json"):
            raise ValueError(f"value_format must be binary, string or json, not {self.value_format!r}")
        self.partition_by = list(settings.get("partition_by", ["topic", "date"]))
        self.spark = None

    def start(self) -> None:
        from pyspark.sql import SparkSession
        master = self.settings.get("master", "local[*]")
        builder = SparkSession.builder.appName("kdaemon-uploader")
        builder = builder.remote(master) if master.startswith("sc://") else builder.master(master)
        conf = {"spark.ui.enabled": "false", "spark.sql.session.timeZone": "UTC",
                "spark.sql.mapKeyDedupPolicy": "LAST_WIN", "spark.sql.execution.arrow.pyspark.enabled": "true",
                "spark.sql.sources.partitionOverwriteMode": "dynamic",
                "spark.sql.shuffle.partitions": "2"}
        conf.update({str(k): str(v) for k, v in (self.settings.get("conf") or {}).items()})
        for k, v in conf.items():
            builder = builder.config(k, v)
        self.spark = builder.getOrCreate()
        self.spark.sparkContext.setLogLevel("WARN") if hasattr(self.spark, "sparkContext") else None
        log.info("Spark session ready (master %s, Spark %s)", master, self.spark.version)

    def write(self, table: pa.Table, tmp_dir: str) -> tuple[str, str | None]:
        """Write one job's rows (with a ``_batch`` column) under ``tmp_dir``; return the data dir
        and the dead-letter dir (rows whose value did not parse), or None."""
        from pyspark.sql import functions as F
        df = self.spark.createDataFrame(table)
        ts = F.when(F.col("timestamp") >= 0, (F.col("timestamp") / 1000).cast("timestamp"))
        df = df.withColumn("timestamp", ts)
        df = df.withColumn("date", F.coalesce(F.to_date("timestamp"), F.lit("1970-01-01").cast("date")).cast("string"))
        df = df.withColumn("headers", F.map_from_entries("headers"))
        dlq_dir = None
        if self.value_format == "string":
            df = df.withColumn("value", F.col("value").cast("string"))
        elif self.value_format == "json":
            parsed = F.from_json(F.col("value").cast("string"), self.value_schema, {"mode": "PERMISSIVE"})
            df = df.withColumn("_parsed", parsed)
            bad = df.where(F.col("value").isNotNull() & F.col("_parsed").isNull())
            df = df.where(F.col("value").isNull() | F.col("_parsed").isNotNull())
            df = df.withColumn("value", F.col("_parsed")).drop("_parsed")
            dlq_dir = os.path.join(tmp_dir, "dlq")
            (bad.drop("_parsed").withColumn("error", F.lit(f"value does not parse as {self.value_schema}"))
             .write.mode("overwrite").partitionBy("topic", "_batch").parquet(dlq_dir))
        columns = ["topic", "partition", "offset", "timestamp", "timestamp_type", "key", "value", "headers", "date", "_batch"]
        df = df.select(*columns)
        data_dir = os.path.join(tmp_dir, "data")
        if self.table:
            df.drop("_batch").write.mode("append").partitionBy(*self.partition_by).saveAsTable(self.table)
            return data_dir, dlq_dir
        df.write.mode("overwrite").partitionBy(*self.partition_by, "_batch").parquet(data_dir)
        return data_dir, dlq_dir

    def stop(self) -> None:
        if self.spark is not None:
            try:
                self.spark.stop()
            except Exception:
                pass


class Uploader:
    def __init__(self, settings: dict, state_dir: str) -> None:
        unknown = set(settings) - SETTINGS
        if unknown:
            raise ValueError(f"unknown spark sink settings: {', '.join(sorted(unknown))}")
        self.settings = settings
        self.writer = SparkWriter(settings)
        self.root = settings.get("path") or os.path.join(os.path.abspath(state_dir), "spark-table-state")
        self.socket_path = settings.get("socket") or socket_path(state_dir)
        self._stop = False
        self._sel = selectors.DefaultSelector()
        self._buffers: dict[socket.socket, bytes] = {}
        self._queue: list[Request] = []
        self.jobs = 0

    # -- serving --------------------------------------------------------------------------------

    def serve(self) -> int:
        self.writer.start()
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(self.socket_path)
        server.listen(64)
        server.setblocking(False)
        self._sel.register(server, selectors.EVENT_READ, None)
        signal.signal(signal.SIGTERM, lambda *_: self._request_stop())
        signal.signal(signal.SIGINT, lambda *_: self._request_stop())
        log.info("uploader listening on %s, writing to %s", self.socket_path, self.settings.get("path") or self.settings.get("table"))
        try:
            while not self._stop:
                self._pump(server, 0.5)
                if self._queue:
                    deadline = time.monotonic() + COALESCE_S
                    while time.monotonic() < deadline and len(self._queue) < MAX_REQUESTS_PER_JOB:
                        self._pump(server, max(0.0, deadline - time.monotonic()))
                    batch, self._queue = self._queue[:MAX_REQUESTS_PER_JOB], self._queue[MAX_REQUESTS_PER_JOB:]
                    self._run_job(batch)
        finally:
            server.close()
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
            self.writer.stop()
        return 0

    def _request_stop(self) -> None:
        self._stop = True

    def _pump(self, server: socket.socket, timeout: float) -> None:
        for key, _ in self._sel.select(timeout):
            if key.data is None:
                try:
                    conn, _ = server.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                self._sel.register(conn, selectors.EVENT_READ, "conn")
                self._buffers[conn] = b""
                continue
            conn = key.fileobj
            try:
                data = conn.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self._drop(conn)
                continue
            buf = self._buffers[conn] + data
            *lines, self._buffers[conn] = buf.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                    self._queue.append(Request(conn, msg["id"], msg["file"], msg["topic"],
                                               BatchId(msg["partition"], msg["first"], msg["last"]), msg["rows"]))
                except (ValueError, KeyError) as exc:
                    log.error("bad request from a worker: %s", exc)

    def _drop(self, conn: socket.socket) -> None:
        try:
            self._sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        self._buffers.pop(conn, None)
        conn.close()
        self._queue = [r for r in self._queue if r.conn is not conn]

    def _reply(self, req: Request, ok: bool, error: str | None = None) -> None:
        msg = {"id": req.id, "ok": ok}
        if error:
            msg["error"] = error
        try:
            req.conn.setblocking(True)
            req.conn.sendall(json.dumps(msg).encode() + b"\n")
            req.conn.setblocking(False)
        except OSError:
            self._drop(req.conn)

    # -- one job --------------------------------------------------------------------------------

    def _run_job(self, requests: list[Request]) -> None:
        started = time.monotonic()
        try:
            done = self.upload(requests)
        except Exception as exc:
            log.error("Spark upload of %d batch(es) failed: %s: %s", len(requests), type(exc).__name__, exc)
            for req in requests:
                self._reply(req, False, f"{type(exc).__name__}: {exc}"[:2000])
            return
        self.jobs += 1
        rows = sum(r.rows for r in requests)
        log.info("uploaded %d batch(es), %d rows (%d new) in %.2fs", len(requests), rows, done,
                 time.monotonic() - started)
        for req in requests:
            self._reply(req, True)

    def upload(self, requests: list[Request]) -> int:
        """Upload the batches; return the number of rows written (after dropping rows already
        in the output).  Raises on any failure: then nothing of these batches is confirmed."""
        root = self.root
        tables = []
        by_partition: dict[tuple[str, int], list[Request]] = defaultdict(list)
        for req in requests:
            by_partition[(req.topic, req.batch.partition)].append(req)
        fresh: list[Request] = []
        for (topic, partition), reqs in by_partition.items():
            ranges = layout.uploaded_ranges(root, topic, partition)
            if self.writer.table is None:
                self._delete_orphans(topic, partition, {BatchId(partition, f, l) for f, l in ranges})
            for req in reqs:
                if (req.batch.first, req.batch.last) in ranges:
                    continue  # uploaded before (its confirmation was lost): nothing to do
                table = pq.read_table(req.file)
                overlapping = [(f, l) for f, l in ranges if req.batch.overlaps(f, l)]
                if overlapping:
                    offsets = table.column("offset")
                    keep = None
                    for first, last in overlapping:
                        inside = pc.and_(pc.greater_equal(offsets, first), pc.less_equal(offsets, last))
                        keep = inside if keep is None else pc.or_(keep, inside)
                    table = table.filter(pc.invert(keep))
                table = table.append_column("_batch", pa.array([req.batch.name] * table.num_rows, pa.string()))
                tables.append(table)
                fresh.append(req)
        rows = sum(t.num_rows for t in tables)
        if rows:
            tmp = os.path.join(root, "_kdaemon", "tmp", uuid.uuid4().hex)
            data_dir, dlq_dir = self.writer.write(pa.concat_tables(tables), tmp)
            if self.writer.table is None:
                self._move_into_place(data_dir, root)
            if dlq_dir is not None:
                self._move_into_place(dlq_dir, os.path.join(root, "_kdaemon", "dlq"))
            shutil.rmtree(tmp, ignore_errors=True)
        for req in fresh:
            manifest = {"topic": req.topic, "partition": req.batch.partition, "first": req.batch.first,
                        "last": req.batch.last, "rows": req.rows, "uploaded_at": time.time()}
            layout.write_durably(layout.manifest_path(root, req.topic, req.batch),
                                 json.dumps(manifest).encode())
        return rows

    def _move_into_place(self, src: str, dest_root: str) -> None:
        """Move Spark's ``.../<partition dirs>/_batch=<id>/part-*.parquet`` to
        ``dest_root/<partition dirs>/part-<id>-<n>.parquet``: names from the batch identity."""
        for dirpath, _, filenames in os.walk(src):
            parts = [f for f in sorted(filenames) if f.endswith(".parquet")]
            if not parts:
                continue
            rel = os.path.relpath(dirpath, src)
            segments = rel.split(os.sep)
            batch_seg = [s for s in segments if s.startswith("_batch=")]
            if not batch_seg:
                continue
            batch_name = batch_seg[0][len("_batch="):]
            target_dir = os.path.join(dest_root, *[s for s in segments if not s.startswith("_batch=")])
            os.makedirs(target_dir, exist_ok=True)
            for n, name in enumerate(parts):
                target = os.path.join(target_dir, f"part-{batch_name}-{n:03d}.parquet")
                with open(os.path.join(dirpath, name), "rb") as fh:
                    os.fsync(fh.fileno())
                os.replace(os.path.join(dirpath, name), target)
            layout.fsync_dir(target_dir)

    def _delete_orphans(self, topic: str, partition: int, uploaded: set[BatchId]) -> None:
        """Files of this partition whose batch has no manifest: an upload that did not finish."""
        for base in (layout.topic_dir(self.root, topic),
                     layout.topic_dir(os.path.join(self.root, "_kdaemon", "dlq"), topic)):
            if not os.path.isdir(base):
                continue
            for dirpath, _, filenames in os.walk(base):
                for name in filenames:
                    parsed = layout.parse_part_file(name)
                    if parsed is None or parsed[0].partition != partition:
                        continue
                    if parsed[0] not in uploaded:
                        log.warning("removing %s: left by an upload that did not finish", name)
                        os.unlink(os.path.join(dirpath, name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kdaemon's Spark uploader (started by the supervisor)")
    parser.add_argument("-c", "--config", required=True)
    args = parser.parse_args(argv)
    from ...config import load
    config = load(args.config)
    logging.basicConfig(level=getattr(logging, config.daemon.log_level, logging.INFO),
                        format="%(asctime)s %(levelname)s uploader %(name)s: %(message)s", stream=sys.stderr)
    if config.sink.type != "spark":
        log.error("the configured sink is %r, not spark", config.sink.type)
        return 2
    try:
        uploader = Uploader(config.sink.settings, config.daemon.state_dir)
    except ValueError as exc:
        log.error("bad spark sink settings: %s", exc)
        return 2
    try:
        return uploader.serve()
    except Exception as exc:
        log.error("the uploader failed: %s: %s", type(exc).__name__, exc)
        return 1


if __name__ == "__main__":
    sys.exit(main())
