"""Rows built ahead of their job (kdaemon/sinks/spark/uploader/ahead.py): a worker's early-staged
batches are built while it reads on, and a job writes them as it would have built them; a batch
the job writes only part of, a failed build, a worker gone and the memory cap all leave the job
to build its rows itself.  Real staged files, real builds, and a real uploader writing an
Iceberg table directly (no JVM)."""

from __future__ import annotations

import json
import os

import pytest

from testkit.daemon import wait_for
from testkit.spark import requires_spark, staged_request, uploader_serving

requires_spark()

import pyarrow as pa  # noqa: E402

from kdaemon.plugins.types import Record  # noqa: E402
from kdaemon.sinks.spark import staged  # noqa: E402
from kdaemon.sinks.spark.staging import SparkSink  # noqa: E402
from kdaemon.sinks.spark.tables import arrow_rows, iceberg_meta  # noqa: E402
from kdaemon.sinks.spark.uploader.ahead import RowsAhead  # noqa: E402
from kdaemon.sinks.spark.uploader.process import Uploader  # noqa: E402

pytestmark = [pytest.mark.spark]

TOPIC = "events"
VALUE_SCHEMA = "id BIGINT, kind STRING"
T0 = 1_764_000_000_000


def _value(o: int) -> bytes:
    return json.dumps({"id": o, "kind": f"k{o % 3}"}).encode()


def _request(directory, partition: int, offsets: range):
    return staged_request(directory, TOPIC, partition, offsets, values=[_value(o) for o in offsets])


def _build(path: str):
    return arrow_rows.job_rows(staged.read(path), "json", pa.struct([("id", pa.int64()), ("kind", pa.string())]))


def _all_built(ahead: RowsAhead) -> bool:
    return all(future.done() for _, _, future in list(ahead._ahead.values()))


def _wait_built(ahead: RowsAhead) -> None:
    wait_for(lambda: _all_built(ahead), 10, "the builds to finish", interval=0.01)


# -- RowsAhead -------------------------------------------------------------------------------------

def test_a_hinted_batch_is_built_once_and_handed_over_once(tmp_path):
    builds: list[str] = []
    ahead = RowsAhead(lambda p: builds.append(p) or _build(p))
    a, b = _request(tmp_path, 0, range(0, 50)), _request(tmp_path, 1, range(0, 30))
    try:
        ahead.hint("conn", [a.file, b.file])
        ahead.hint("conn", [a.file])   # hinted again (a retried flush): not built twice
        _wait_built(ahead)
        assert builds == [a.file, b.file]
        assert ahead.held_bytes > 0
        assert ahead.take(a.file).equals(_build(a.file))
        assert ahead.take(a.file) is None                         # handed over once
        assert ahead.take(str(tmp_path / "never-hinted")) is None
        ahead.forget([b.file])
        assert len(ahead) == 0 and ahead.held_bytes == 0
    finally:
        ahead.close()


def test_a_failed_build_leaves_the_batch_to_its_job(tmp_path):
    bad = staged_request(tmp_path, TOPIC, 0, range(0, 5), values=[b"not json"] * 5)
    gone = _request(tmp_path, 1, range(0, 5))
    ahead = RowsAhead(_build)
    try:
        ahead.hint("conn", [bad.file, gone.file])
        _wait_built(ahead)
        os.unlink(gone.file)
        ahead.hint("conn", [str(tmp_path / "removed-before-its-hint.staged")])   # not even started
        assert len(ahead) == 2
        with pytest.raises(arrow_rows.NotDirect):   # what the job meets when it builds the batch itself
            _build(bad.file)
        assert ahead.take(bad.file) is None
        assert ahead.take(gone.file) is not None    # built before the file went: still that batch's rows
    finally:
        ahead.close()


def test_past_the_cap_hints_are_let_go(tmp_path):
    first, second = _request(tmp_path, 0, range(0, 200)), _request(tmp_path, 0, range(200, 400))
    ahead = RowsAhead(_build, max_bytes=1)
    try:
        ahead.hint("conn", [first.file, second.file])
        _wait_built(ahead)
        assert ahead.skipped == 1
        assert ahead.take(first.file) is not None and ahead.take(second.file) is None
        ahead.hint("conn", [second.file])            # room again once the first was taken
        _wait_built(ahead)
        assert ahead.take(second.file) is not None
    finally:
        ahead.close()


def test_a_worker_gone_takes_its_hints_with_it(tmp_path):
    mine, theirs = _request(tmp_path, 0, range(0, 10)), _request(tmp_path, 1, range(0, 10))
    ahead = RowsAhead(_build)
    try:
        ahead.hint("gone", [mine.file])
        ahead.hint("stays", [theirs.file])
        _wait_built(ahead)
        ahead.forget_connection("gone")
        assert ahead.take(mine.file) is None and ahead.take(theirs.file) is not None
    finally:
        ahead.close()


# -- in the uploader, into an Iceberg table --------------------------------------------------------

def _settings(tmp_path, **more) -> dict:
    return {"type": "spark", "format": "iceberg", "master": "local[1]", "value_schema": VALUE_SCHEMA,
            "partition_by": ["topic", "date"], "path": str(tmp_path / "lake" / "db" / "t"),
            "socket": str(tmp_path / "up.sock"), **more}


def _table_offsets(path: str) -> list[tuple[int, int]]:
    from pyiceberg.table import StaticTable
    version = iceberg_meta.load_current(path)[0]
    table = StaticTable.from_metadata(os.path.join(iceberg_meta.metadata_dir(path), f"v{version}.metadata.json"))
    rows = table.scan(selected_fields=("partition", "offset", "value")).to_arrow().to_pylist()
    assert all(r["value"] == json.loads(_value(r["offset"])) for r in rows), "a row holds another record's value"
    return sorted((r["partition"], r["offset"]) for r in rows)


def test_a_job_writes_rows_built_ahead_only_for_whole_batches(tmp_path):
    up = Uploader(_settings(tmp_path), str(tmp_path / "state"))
    up.writer.prepare_offline()
    assert up.writer.direct_writes
    try:
        up.upload([_request(tmp_path / "w", 0, range(0, 100))])
        assert up.built_ahead == 0
        # Read again by a next owner (overlapping what is in), and a fresh partition: both hinted.
        overlap, fresh = _request(tmp_path / "w", 0, range(50, 150)), _request(tmp_path / "w", 1, range(0, 80))
        up._ahead.hint(None, [overlap.file, fresh.file])
        _wait_built(up._ahead)
        up.upload([overlap, fresh])
        assert up.built_ahead == 1                    # the fresh batch; the overlap built in the job, rows 100-149
        assert len(up._ahead) == 0                    # nothing held past its job
        assert _table_offsets(up.root) == [(0, o) for o in range(150)] + [(1, o) for o in range(80)]
    finally:
        up._ahead.close()


def test_a_workers_early_staged_batches_are_built_while_it_reads(tmp_path, monkeypatch):
    """The whole path: a worker's sink past ``max_bytes`` stages and hints; the running uploader
    builds those batches before the flush asks for them, and the job writes every record once."""
    settings = _settings(tmp_path, max_bytes=20_000, max_records=100_000, max_age_s=3600)
    up = Uploader(settings, str(tmp_path / "state"))
    sink = SparkSink(settings, str(tmp_path / "state"))
    try:
        with uploader_serving(up, sink, monkeypatch, seconds=30):
            for first in range(0, 1000, 100):
                sink.write([Record(TOPIC, p, o, T0 + o, 0, b"k", _value(o), [("type", b"t")], b"k", _value(o))
                            for p in (0, 1) for o in range(first, first + 100)])
            spilled = len(sink._spilled)
            assert spilled >= 4, "the test's writes did not pass max_bytes"
            wait_for(lambda: len(up._ahead) == spilled and _all_built(up._ahead), 30,
                     f"{spilled} batches built ahead", lambda: f"{len(up._ahead)} hinted", interval=0.01)
            sink.flush()
            assert up.built_ahead == spilled
            assert _table_offsets(up.root) == [(p, o) for p in (0, 1) for o in range(1000)]
    finally:
        sink.close()
