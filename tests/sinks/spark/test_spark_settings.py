"""``SparkSettings`` (kdaemon/sinks/spark/settings.py): the ``[sink]`` table parsed once, its defaults
written once, and the typed settings as what the uploader companion receives.  Offline: no Spark
JVM, no broker."""

from __future__ import annotations

import json
import logging

import pytest

pytest.importorskip("pyarrow", reason="the spark sink needs pyarrow (pip install -e '.[spark]')")

from kdaemon.plugins.companion import SinkContext  # noqa: E402
from kdaemon.settings import SettingsError  # noqa: E402
from kdaemon.sinks import builtin  # noqa: E402
from kdaemon.sinks.spark.settings import DEFAULT_MAX_BYTES, SparkSettings  # noqa: E402
from kdaemon.sinks.spark.staging import SparkSink  # noqa: E402


def table(tmp_path, **more) -> dict:
    return {"type": "spark", "path": str(tmp_path / "out"), "socket": str(tmp_path / "nobody.sock"), **more}


def test_the_defaults_are_the_settings_own():
    s = SparkSettings.parse({"path": "/out"})
    assert (s.format, s.master, s.partition_by, s.max_records, s.max_age_s, s.upload_timeout_s, s.value_format,
            s.merge_schema, s.direct_writes, s.conf) == \
        ("parquet", "local[*]", ("topic", "date"), 100_000, 10.0, 300.0, "binary", False, True, {})
    assert SparkSettings.parse({"path": "/out", "value_schema": "id BIGINT"}).value_format == "json"
    assert s.batch_bytes() == DEFAULT_MAX_BYTES and s.batch_bytes(10 << 20) == 5 << 20
    assert SparkSettings.parse({"path": "/out", "max_bytes": 1000}).batch_bytes(10 << 20) == 1000


def test_the_worker_side_reads_the_parsed_settings(tmp_path):
    sink = SparkSink(table(tmp_path, max_records=62, max_age_s=3), str(tmp_path / "state"), memory_bytes=8 << 20)
    try:
        assert isinstance(sink.settings, SparkSettings)
        assert (sink.max_records, sink.max_age_s, sink.max_bytes, sink.output) == \
            (62, 3.0, 4 << 20, str(tmp_path / "out"))
    finally:
        sink.close()


def test_the_uploader_companion_gets_the_typed_settings_as_their_table(tmp_path):
    """The spec carries ``to_wire()``: JSON values, every default filled in, which parse back to
    the same settings; a table the workers would refuse gives no spec."""
    context = SinkContext(str(tmp_path / "state"), "d", 60.0, on_sink_error="dlq")
    raw = table(tmp_path, value_schema="id BIGINT", conf={"spark.driver.memory": "1g"}, partition_by=["topic"])
    [spec] = builtin.kdaemon_sink_companions("spark", raw, context)
    wire = spec.kwargs["settings"]
    assert "type" not in wire and wire["max_records"] == 100_000 and wire["value_format"] == "json"
    assert SparkSettings.parse(json.loads(json.dumps(wire))) == SparkSettings.parse(raw)
    assert spec.kwargs["on_sink_error"] == "dlq" and spec.kwargs["state_dir"] == str(tmp_path / "state")
    with pytest.raises(SettingsError, match=r"sink\.max_records: expected a positive integer"):
        builtin.kdaemon_sink_companions("spark", table(tmp_path, max_records=0), context)
    share = SinkContext(str(tmp_path / "state"), "d", 60.0, group_type="share")
    with pytest.raises(SettingsError, match=r"^sink\.type: the spark sink cannot consume from a share group"):
        builtin.kdaemon_sink_companions("spark", raw, share)


def test_the_uploader_refuses_bad_settings_in_one_line(tmp_path, caplog):
    from kdaemon.sinks.spark.uploader import process
    with caplog.at_level(logging.ERROR, logger="kdaemon.spark.uploader"):
        code = process.run({"path": "", "max_records": 0}, str(tmp_path / "state"))
    assert code == process.EXIT_BAD_SETTINGS
    assert [r.getMessage() for r in caplog.records] == [
        'bad spark sink settings: sink.path: expected a directory path, found string ""; '
        "sink.max_records: expected a positive integer, found integer 0"]
    assert not (tmp_path / "state").exists()
