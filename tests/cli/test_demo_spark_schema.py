"""``make demo``'s Spark output is typed: its ``[sink]`` gives ``value_schema`` for the sample's
JSON fields, and every sample value parses as that schema with every field present, so Spark's
read-back shows ``id``, ``type``, ``amount`` and ``customer`` columns, not the value's bytes.
Checked without a JVM: ``value_schema`` through the sink's own DDL parser, the values through the
direct path's JSON reader (``tables/arrow_rows.py``, which reads a value exactly as Spark's
``from_json`` does or says it cannot)."""

from __future__ import annotations

import json
import random
import tomllib
from pathlib import Path

import pyarrow as pa
import pytest

from kdaemon import demo

pytest.importorskip("pyspark")
from kdaemon.sinks.spark.tables import arrow_rows, ddl  # noqa: E402

TEMPLATE = Path(__file__).resolve().parents[2] / "etc" / "kdaemon.toml"


def test_the_spark_demo_declares_the_samples_fields_and_every_value_parses(tmp_path):
    config = demo._config(TEMPLATE, "127.0.0.1:9", tmp_path, 9999, "spark")
    sink = tomllib.loads(config.read_text())["sink"]
    assert sink["type"] == "spark" and sink["value_format"] == "json"

    schema = ddl.parse_schema(sink["value_schema"])
    value_type = arrow_rows.value_arrow_type(schema)
    rng = random.Random(42)
    values = [demo.sample_value(i, rng) for i in range(500)]
    assert {f.name for f in schema.fields} == set(values[0])

    parsed = arrow_rows.parse_json_values(pa.array([json.dumps(v).encode() for v in values], pa.binary()),
                                          value_type).to_pylist()
    assert parsed == values   # every field, typed, none null


def test_the_spark_read_back_shows_the_values_fields():
    command = demo.read_back_command("spark", Path("/data/out"))
    assert '"value.*"' in command and "spark.read.parquet" in command
