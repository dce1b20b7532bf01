"""The staged-batch file (kdaemon/sinks/spark/staged.py): what a worker writes without pyarrow is
what the uploader reads with it, value for value, and a damaged file is refused by name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kdaemon.sinks.spark import staged


def _write(tmp_path, **columns):
    rows = {"offsets": [0], "timestamps": [1], "timestamp_types": [0], "keys": [None], "values": [None],
            "headers": [()]}
    rows.update(columns)
    path = str(tmp_path / "b.staged")
    staged.write(path, "events", 2, rows["offsets"], rows["timestamps"], rows["timestamp_types"],
                 rows["keys"], rows["values"], rows["headers"])
    return path


def test_every_column_round_trips_as_pyarrow_would_have_built_it(tmp_path):
    offsets = [10, 11, 12, 13, 14]
    timestamps = [1_763_000_000_000, -1, 0, 2**62, 5]
    types = [0, 1, 0, 1, 0]
    keys = [b"k", None, b"", b"\x00\xff", None]
    values = [None, b"v" * 1000, b"", b'{"a":1}', b"x"]
    headers = [(), (("a", b"1"), ("b", None)), [("c", b"")], (("é", b"\xff"),), ()]
    path = _write(tmp_path, offsets=offsets, timestamps=timestamps, timestamp_types=types, keys=keys,
                  values=values, headers=headers)
    got = staged.read(path)
    expected = pa.table({
        "topic": ["events"] * 5, "partition": pa.array([2] * 5, pa.int32()), "offset": offsets,
        "timestamp": timestamps, "timestamp_type": pa.array(types, pa.int8()),
        "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
        "headers": [[{"key": k, "value": v} for k, v in h] for h in headers],
    }, schema=staged.schema())
    assert got.equals(expected), (got.to_pylist(), expected.to_pylist())
    # What the uploader writes for Spark from it is ordinary Parquet.
    pq.write_table(got, tmp_path / "b.parquet")
    assert pq.read_table(tmp_path / "b.parquet").equals(expected)


def test_values_an_interceptor_changed_are_normalized(tmp_path):
    path = _write(tmp_path, offsets=[0, 1], timestamps=[0, 0], timestamp_types=[0, 0],
                  keys=[b"k", bytearray(b"b")], values=["text", {"v": 1}],
                  headers=[[["a", "text"], {"key": "b", "value": None}], [(7, {"x": 2})]])
    rows = staged.read(path).to_pylist()
    assert [r["key"] for r in rows] == [b"k", b"b"]
    assert [r["value"] for r in rows] == [b"text", b'{"v":1}']
    assert rows[0]["headers"] == [{"key": "a", "value": b"text"}, {"key": "b", "value": None}]
    assert rows[1]["headers"] == [{"key": "7", "value": b'{"x":2}'}]


def test_an_empty_batch_and_one_without_headers(tmp_path):
    path = _write(tmp_path, offsets=[], timestamps=[], timestamp_types=[], keys=[], values=[], headers=[])
    assert staged.read(path).num_rows == 0
    path = _write(tmp_path, offsets=list(range(1000)), timestamps=[0] * 1000, timestamp_types=[0] * 1000,
                  keys=[None] * 1000, values=[b"v%d" % i for i in range(1000)], headers=[()] * 1000)
    t = staged.read(path)
    assert t.column("value").to_pylist()[999] == b"v999" and t.column("headers").to_pylist()[0] == []


def test_columns_of_different_lengths_are_refused(tmp_path):
    with pytest.raises(ValueError, match="different lengths"):
        _write(tmp_path, offsets=[0, 1])


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"PAR1" + b[4:], "is not a staged batch"),
    (lambda b: b[:-3], "its header accounts for"),
    (lambda b: b[:13] + b"!" + b[14:], "a damaged header"),
])
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage, message):
    path = _write(tmp_path, offsets=[0, 1], timestamps=[0, 0], timestamp_types=[0, 0], keys=[b"a", b"b"],
                  values=[b"x", b"y"], headers=[(), ()])
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(damage(data))
    with pytest.raises(staged.StagedFileError, match=message) as info:
        staged.read(path)
    assert path in str(info.value)


def test_offsets_that_point_outside_the_data_are_refused(tmp_path):
    path = _write(tmp_path, offsets=[0, 1], timestamps=[0, 0], timestamp_types=[0, 0], keys=[b"a", b"b"],
                  values=[b"x", b"y"], headers=[(), ()])
    with open(path, "rb") as f:
        data = bytearray(f.read())
    # The key offsets follow offset, timestamp, timestamp_type and key_valid: 16 + 16 + 2 + 2 bytes
    # into the buffers; make the last one point past the 2 bytes of key data.
    import json
    import struct
    (hlen,) = struct.unpack("<I", data[8:12])
    at = 12 + hlen + 36 + 16
    assert json.loads(data[12:12 + hlen])["buffers"][4] == 24
    data[at:at + 8] = struct.pack("<q", 1000)
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(staged.StagedFileError, match="damaged columns"):
        staged.read(path)


def test_a_worker_stages_a_batch_without_importing_pyarrow(tmp_path):
    # pyarrow is 30 MB of RSS, more than a third of a worker's default budget (issue #18).
    script = textwrap.dedent(f"""
        import os, sys
        from kdaemon.plugins.types import Record
        from kdaemon.sinks.spark.staging import SparkSink, stage_buffer
        from kdaemon.worker import main
        sink = SparkSink({{"type": "spark", "path": {str(tmp_path / "out")!r}}}, {str(tmp_path / "state")!r})
        sink.write([Record("t", 0, i, 0, 0, None, None, [("h", b"v")], b"k", b"v") for i in range(10)])
        stage_buffer({str(tmp_path / "x.staged")!r}, sink._buffers[("t", 0)])
        print(sorted(m for m in sys.modules if m.split(".")[0] == "pyarrow"))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert staged.read(str(tmp_path / "x.staged")).num_rows == 10
