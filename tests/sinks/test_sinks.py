"""Sinks: the JSON line format, stdout/null, and the jsonl sink's durability rules.

Every jsonl test reads the files back: what a reader taking only ``*.jsonl`` files sees is
the contract.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import re

import pytest

from kdaemon.plugins.types import Record, SinkWriteError
from kdaemon.sinks import jsonl as jsonl_mod
from kdaemon.sinks.encoding import (dead_letter, decode_data, record_from_object, record_to_json,
                                    records_to_jsonl)
from kdaemon.sinks.jsonl import JsonlSink, JsonlWriteError
from kdaemon.sinks.simple import NullSink, StdoutSink

NAME = re.compile(r"records-\d{8}T\d{6}Z-\d{6}\.jsonl")


def rec(offset: int, value=b"v", key=None, headers=None, topic="t", partition=0) -> Record:
    return Record(topic, partition, offset, 1_700_000_000_000 + offset, 0, key, value,
                  headers if headers is not None else [("h", b"x")])


def done_files(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".jsonl"))


def open_files(d) -> list[str]:
    return sorted(n for n in os.listdir(d) if n.endswith(".jsonl.open"))


def read_records(d, names=None) -> list[Record]:
    out = []
    for n in names if names is not None else done_files(d):
        with open(os.path.join(d, n), encoding="ascii") as fh:
            text = fh.read()
        assert text == "" or text.endswith("\n"), f"{n} ends in a partial line"
        out += [record_from_object(json.loads(line)) for line in text.splitlines()]
    return out


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def fsyncs(monkeypatch):
    """Count os.fsync calls, and let a test make the next ones fail."""
    real = os.fsync
    state = {"calls": 0, "fail": None, "fail_times": None}  # fail_times None: until reset

    def fsync(fd):
        state["calls"] += 1
        if state["fail"] is not None:
            exc = state["fail"]
            if state["fail_times"] is not None:
                state["fail_times"] -= 1
                if state["fail_times"] <= 0:
                    state["fail"] = None
            raise exc
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return state


# -- the line format ---------------------------------------------------------------------------

VALUES = [
    pytest.param(b"\x00\xffraw", id="bytes"),
    pytest.param(None, id="null"),
    pytest.param("text é ☃", id="str"),
    pytest.param({"a": [1, 2.5, None, True], "b": {"c": "d"}}, id="json-object"),
    pytest.param([1, "two"], id="json-array"),
    pytest.param(42, id="json-number"),
    pytest.param(b"", id="empty-bytes"),
    pytest.param("", id="empty-str"),
]


@pytest.mark.parametrize("value", VALUES)
def test_line_round_trip(value):
    r = rec(7, value=value, key=value, headers=[("a", b"\x01"), ("n", None), ("a", b"")])
    line = record_to_json(r)
    assert "\n" not in line and line.isascii()
    obj = json.loads(line)
    assert list(obj) == ["topic", "partition", "offset", "timestamp", "timestamp_type", "key",
                         "value", "headers"]
    assert obj["headers"] == [["a", {"base64": "AQ=="}], ["n", None], ["a", {"base64": ""}]]
    back = record_from_object(obj)
    assert back == Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type,
                          value, value, r.headers)


def test_bytes_are_base64_objects_at_any_depth():
    obj = json.loads(record_to_json(rec(0, value={"blob": b"\xff", "list": [b"a"]}, key=b"k")))
    assert obj["key"] == {"base64": "aw=="}
    assert obj["value"] == {"blob": {"base64": "/w=="}, "list": [{"base64": "YQ=="}]}
    assert decode_data(obj["value"]) == {"blob": b"\xff", "list": [b"a"]}


def test_unencodable_value_is_a_type_error():
    with pytest.raises(TypeError, match="set cannot be written as JSON"):
        record_to_json(rec(0, value={1, 2}))


def test_records_to_jsonl_terminates_every_line():
    assert records_to_jsonl([]) == ""
    text = records_to_jsonl([rec(0), rec(1)])
    assert text.endswith("\n") and text.count("\n") == 2


def test_dead_letter_keeps_raw_bytes_and_says_why():
    r = Record("t", 1, 5, 0, 0, {"parsed": 1}, None, [("h", b"1")], b"rawkey", b"{bad")
    d = dead_letter(r, "deserialize", ValueError("not valid JSON"))
    assert (d.key, d.value, d.raw_key, d.raw_value) == (b"rawkey", b"{bad", b"rawkey", b"{bad")
    assert d.headers == [("h", b"1"), ("kdaemon.error", b"ValueError: not valid JSON"),
                         ("kdaemon.stage", b"deserialize")]
    assert r.headers == [("h", b"1")]  # the original is untouched
    obj = json.loads(record_to_json(d))
    assert obj["value"] == {"base64": "e2JhZA=="}
    with pytest.raises(ValueError, match="stage"):
        dead_letter(r, "elsewhere", "x")


# -- stdout and null ---------------------------------------------------------------------------

def test_stdout_sink_writes_one_line_per_record(capsys):
    sink = StdoutSink.from_settings({"type": "stdout"})
    sink.write([rec(0, value="a"), rec(1, value=b"\x00")])
    sink.flush()
    sink.close()
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(l)["value"] for l in lines] == ["a", {"base64": "AA=="}]


def test_stdout_sink_flush_flushes_the_stream():
    class Stream(io.StringIO):
        flushed = 0

        def flush(self):
            Stream.flushed += 1

    s = Stream()
    sink = StdoutSink(stream=s)
    sink.write([rec(0)])
    sink.flush()
    assert Stream.flushed == 1 and s.getvalue().count("\n") == 1


def test_stdout_sink_reports_unencodable_records_by_index(capsys):
    sink = StdoutSink()
    with pytest.raises(SinkWriteError) as info:
        sink.write([rec(0), rec(1, value=object()), rec(2)])
    assert info.value.failed_indexes == [1]
    assert [json.loads(l)["offset"] for l in capsys.readouterr().out.splitlines()] == [0, 2]


def test_null_sink_counts_and_discards():
    sink = NullSink.from_settings({"type": "null"})
    sink.write([rec(0), rec(1)])
    sink.write([rec(2)])
    sink.flush()
    sink.close()
    assert (sink.records, sink.batches, sink.flushes, sink.closed) == (3, 2, 1, True)


@pytest.mark.parametrize("cls", [StdoutSink, NullSink])
def test_simple_sinks_reject_unknown_settings(cls):
    with pytest.raises(ValueError, match=r"sink\.path: unknown setting \(known: none\)\n"
                                         r"sink\.colour: unknown setting \(known: none\)"):
        cls.from_settings({"type": "x", "path": "/tmp", "colour": "red"})


# -- jsonl: settings ----------------------------------------------------------------------------

def test_jsonl_defaults(tmp_path):
    sink = JsonlSink.from_settings({"type": "jsonl", "path": str(tmp_path / "out")})
    assert (sink.prefix, sink.max_bytes, sink.max_age_s, sink.fsync) == ("records", 128 << 20, 3600.0, True)
    assert (tmp_path / "out").is_dir()  # created
    assert os.listdir(tmp_path / "out") == []  # no file until there is something to write
    sink.close()


@pytest.mark.parametrize("settings, message", [
    ({"path": "D", "maxbytes": 1}, r"sink\.maxbytes: unknown setting \(did you mean 'max_bytes'\?\)"),
    ({}, r"sink\.path: required: the directory to write files into"),
    ({"path": ""}, r'sink\.path: expected a directory path, found string ""'),
    ({"path": "D", "max_bytes": 0}, "sink.max_bytes: expected a positive integer, found integer 0"),
    ({"path": "D", "max_bytes": "1MB"}, 'sink.max_bytes: expected a positive integer, found string "1MB"'),
    ({"path": "D", "max_bytes": True}, "sink.max_bytes: expected a positive integer, found boolean true"),
    ({"path": "D", "max_age_s": -1}, "sink.max_age_s: expected a positive number of seconds, found integer -1"),
    ({"path": "D", "fsync": "yes"}, 'sink.fsync: expected true or false, found string "yes"'),
    ({"path": "D", "prefix": "a/b"}, r"sink\.prefix: expected a file-name part \(letters, digits"),
    ({"path": "D", "prefix": ""}, r"sink\.prefix: expected a file-name part"),
])
def test_jsonl_rejects_bad_settings(tmp_path, settings, message):
    if settings.get("path") == "D":
        settings = {**settings, "path": str(tmp_path)}
    with pytest.raises(ValueError, match=message):
        JsonlSink.from_settings({"type": "jsonl", **settings})


def test_jsonl_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        JsonlSink.from_settings({"type": "jsonl", "path": str(f)})


# -- jsonl: round trips, naming, the .open → .jsonl rename ------------------------------------

def test_jsonl_round_trip(tmp_path):
    records = [rec(i, value=v, key=v) for i, v in enumerate(
        [b"\x00bin", None, "str ☃", {"json": [1, None]}, 3.5, b"", "", True])]
    sink = JsonlSink(tmp_path)
    sink.write(records[:3])
    sink.write(records[3:])
    sink.close()
    names = done_files(tmp_path)
    assert len(names) == 1 and NAME.fullmatch(names[0]) and open_files(tmp_path) == []
    assert read_records(tmp_path) == records


def test_file_is_open_until_rotation_or_close(tmp_path):
    sink = JsonlSink(tmp_path)
    sink.write([rec(0)])
    assert done_files(tmp_path) == [] and len(open_files(tmp_path)) == 1
    sink.flush()  # durable, but neither full nor old: stays .open
    [name] = open_files(tmp_path)
    assert done_files(tmp_path) == []
    assert read_records(tmp_path, [name]) == [rec(0)]  # flushed bytes are in the file
    sink.write([rec(1)])
    sink.close()
    assert open_files(tmp_path) == [] and done_files(tmp_path) == [name[: -len(".open")]]
    assert read_records(tmp_path) == [rec(0), rec(1)]
    sink.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        sink.write([rec(2)])


def test_rename_happens_after_fsync(tmp_path, monkeypatch):
    events = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd):
        events.append("fsync-dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "fsync-file")
        real_fsync(fd)

    def link(src, dst, *a, **kw):
        events.append("link")
        real_link(src, dst, *a, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    sink = JsonlSink(tmp_path)
    sink.write([rec(0)])
    sink.close()
    # file, new directory entry, then publish and make the rename durable
    assert events == ["fsync-file", "fsync-dir", "link", "fsync-dir"]


def test_names_sort_in_write_order_and_carry_utc_time(tmp_path):
    wall = FakeClock(1_700_000_000.0)  # 2023-11-14T22:13:20Z
    sink = JsonlSink(tmp_path, max_bytes=1, wall_clock=wall)
    for i in range(3):
        sink.write([rec(i)])
        sink.flush()
    sink.close()
    assert done_files(tmp_path) == [f"records-20231114T221320Z-00000{i}.jsonl" for i in (1, 2, 3)]


def test_custom_prefix(tmp_path):
    sink = JsonlSink.from_settings({"type": "jsonl", "path": str(tmp_path), "prefix": "dlq"})
    sink.write([rec(0)])
    sink.close()
    [name] = done_files(tmp_path)
    assert name.startswith("dlq-") and name.endswith(".jsonl")


# -- jsonl: rotation ---------------------------------------------------------------------------

def test_rotation_by_size(tmp_path):
    line_len = len(record_to_json(rec(0))) + 1
    sink = JsonlSink(tmp_path, max_bytes=3 * line_len)
    records = [rec(i) for i in range(10)]
    for r in records:
        sink.write([r])
        sink.flush()
    sink.close()
    names = done_files(tmp_path)
    assert len(names) == 4  # 3 + 3 + 3 + 1
    sizes = [os.path.getsize(tmp_path / n) for n in names]
    assert sizes == [3 * line_len] * 3 + [line_len]
    assert read_records(tmp_path) == records


def test_rotation_by_size_before_a_write_without_flush(tmp_path):
    sink = JsonlSink(tmp_path, max_bytes=10)
    sink.write([rec(0)])
    sink.write([rec(1)])  # the current file is already full: publish it first
    assert len(done_files(tmp_path)) == 1 and len(open_files(tmp_path)) == 1
    sink.close()
    assert read_records(tmp_path) == [rec(0), rec(1)]


def test_rotation_by_age(tmp_path):
    clock = FakeClock()
    sink = JsonlSink(tmp_path, max_age_s=60, clock=clock)
    sink.write([rec(0)])
    clock.t += 59
    sink.flush()
    assert done_files(tmp_path) == []
    clock.t += 1
    sink.flush()  # 60 s old: published even with nothing new written
    assert len(done_files(tmp_path)) == 1 and open_files(tmp_path) == []
    sink.flush()  # nothing open: nothing to do
    sink.write([rec(1)])
    clock.t += 30
    sink.write([rec(2)])
    clock.t += 30
    sink.write([rec(3)])  # that file is 60 s old: rotate before writing
    sink.close()
    names = done_files(tmp_path)
    assert [len(read_records(tmp_path, [n])) for n in names] == [1, 2, 1]
    assert read_records(tmp_path) == [rec(i) for i in range(4)]


# -- jsonl: durability ---------------------------------------------------------------------------

def test_flush_fsyncs_file_and_directory(tmp_path, fsyncs):
    sink = JsonlSink(tmp_path, max_bytes=1 << 20)
    sink.write([rec(0)])
    assert fsyncs["calls"] == 0  # write only buffers
    sink.flush()
    assert fsyncs["calls"] == 2  # the file, and the directory holding its new entry
    sink.write([rec(1)])
    sink.flush()
    assert fsyncs["calls"] == 3  # the file only
    sink.flush()
    assert fsyncs["calls"] == 4  # cheap, but still a promise: sync again
    sink.close()
    assert fsyncs["calls"] == 6  # file, then the directory after the rename


def test_fsync_false_never_fsyncs(tmp_path, fsyncs):
    sink = JsonlSink.from_settings({"type": "jsonl", "path": str(tmp_path), "fsync": False})
    sink.write([rec(0)])
    sink.flush()
    sink.close()
    assert fsyncs["calls"] == 0
    assert read_records(tmp_path) == [rec(0)]


def test_unencodable_records_are_reported_and_the_rest_written(tmp_path):
    sink = JsonlSink(tmp_path)
    with pytest.raises(SinkWriteError) as info:
        sink.write([rec(0), rec(1, value={1}), rec(2), rec(3, key=object())])
    assert info.value.failed_indexes == [1, 3]
    sink.close()
    assert [r.offset for r in read_records(tmp_path)] == [0, 2]


def test_flush_failure_keeps_earlier_files_and_breaks_the_sink(tmp_path, fsyncs):
    sink = JsonlSink(tmp_path, max_bytes=1)
    sink.write([rec(0)])
    sink.flush()  # full: published
    [first] = done_files(tmp_path)
    sink.write([rec(1)])
    fsyncs["fail"] = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(JsonlWriteError, match="No space left on device.*restart the worker"):
        sink.flush()
    fsyncs["fail"] = None
    # rec(1) was accepted by write() and is gone: no later call may pretend otherwise
    with pytest.raises(JsonlWriteError, match="lost"):
        sink.flush()
    with pytest.raises(JsonlWriteError, match="lost"):
        sink.write([rec(2)])
    with pytest.raises(JsonlWriteError, match="lost"):
        sink.close()
    assert done_files(tmp_path) == [first] and open_files(tmp_path) == []
    assert read_records(tmp_path) == [rec(0)]
    # a new sink (a restarted worker) carries on beside the intact file
    again = JsonlSink(tmp_path)
    again.write([rec(1)])
    again.close()
    assert read_records(tmp_path) == [rec(0), rec(1)]


def test_failed_write_of_a_fresh_batch_can_be_retried(tmp_path, fsyncs):
    clock = FakeClock()
    sink = JsonlSink(tmp_path, max_age_s=10, clock=clock)
    sink.write([rec(0)])
    sink.flush()  # durable, still open
    clock.t += 10
    fsyncs["fail"], fsyncs["fail_times"] = OSError(errno.EIO, "Input/output error"), 1
    with pytest.raises(JsonlWriteError, match="write failed: Input/output error.*write it again"):
        sink.write([rec(1)])  # rotation first: the sync fails; only this batch is lost
    assert len(done_files(tmp_path)) == 1  # the durable part was published on the way out
    sink.write([rec(1)])  # the caller retries the batch
    sink.close()
    names = done_files(tmp_path)
    assert len(names) == 2 and open_files(tmp_path) == []
    assert [read_records(tmp_path, [n]) for n in names] == [[rec(0)], [rec(1)]]


def test_file_that_cannot_be_published_is_recovered_by_the_next_sink(tmp_path, fsyncs):
    clock = FakeClock()
    sink = JsonlSink(tmp_path, max_age_s=10, clock=clock)
    sink.write([rec(0)])
    sink.flush()
    clock.t += 10
    fsyncs["fail"] = OSError(errno.EIO, "Input/output error")
    with pytest.raises(JsonlWriteError):
        sink.write([rec(1)])
    assert done_files(tmp_path) == [] and len(open_files(tmp_path)) == 1  # left for recovery
    fsyncs["fail"] = None
    again = JsonlSink(tmp_path)
    assert len(again.recovered) == 1
    again.close()
    assert read_records(tmp_path) == [rec(0)]


def test_removed_directory_is_an_error_not_a_silent_loss(tmp_path):
    d = tmp_path / "out"
    sink = JsonlSink(d)
    sink.write([rec(0)])
    sink.flush()
    shutil.rmtree(d)
    sink.write([rec(1)])  # lands in the unlinked inode: the OS cannot tell us yet
    with pytest.raises(JsonlWriteError, match=r"directory .*out does not exist \(was it removed\?\)"):
        sink.flush()


def test_missing_directory_on_write(tmp_path):
    d = tmp_path / "out"
    sink = JsonlSink(d)
    os.rmdir(d)
    with pytest.raises(JsonlWriteError, match="does not exist.*write it again"):
        sink.write([rec(0)])
    os.mkdir(d)  # the operator puts it back: the same batch goes through
    sink.write([rec(0)])
    sink.close()
    assert read_records(d) == [rec(0)]


def test_probe_says_whether_a_file_can_be_created(tmp_path):
    d = tmp_path / "out"
    sink = JsonlSink(d)
    assert sink.probe() is None
    assert os.listdir(d) == []             # the probe file is gone again
    os.rmdir(d)                            # the directory went away: as unwritable as it gets
    reason = sink.probe()
    assert reason.startswith(f"cannot create a file in {d}") and "No such file" in reason
    os.mkdir(d)
    assert sink.probe() is None
    sink.write([rec(0)])
    sink.close()
    assert read_records(d) == [rec(0)]


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path):
    sink = JsonlSink(tmp_path, max_bytes=1)
    sink.write([rec(0)])
    sink.flush()
    os.chmod(tmp_path, 0o555)
    try:
        with pytest.raises(JsonlWriteError, match="Permission denied"):
            sink.write([rec(1)])
    finally:
        os.chmod(tmp_path, 0o755)
    assert read_records(tmp_path) == [rec(0)]


# -- jsonl: several writers, crash recovery ------------------------------------------------------

def test_two_writers_sharing_a_directory_never_clobber(tmp_path):
    wall = FakeClock(1_700_000_000.0)  # same second, same sequence numbers
    a = JsonlSink(tmp_path, max_bytes=1, wall_clock=wall)
    b = JsonlSink(tmp_path, max_bytes=1, wall_clock=wall)
    for i in range(3):
        a.write([rec(i, topic="a")])
        b.write([rec(i, topic="b")])
        a.flush()
        b.flush()
    a.close()
    b.close()
    got = read_records(tmp_path)
    assert len(done_files(tmp_path)) == 6 and open_files(tmp_path) == []
    assert sorted((r.topic, r.offset) for r in got) == [(t, i) for t in "ab" for i in range(3)]


def test_orphaned_open_file_is_cut_to_complete_lines_and_published(tmp_path):
    good = records_to_jsonl([rec(0), rec(1)])
    orphan = tmp_path / "records-20240101T000000Z-000001.jsonl.open"
    orphan.write_text(good + '{"topic":"t","parti')  # the process died mid-write
    other = tmp_path / "other-20240101T000000Z-000001.jsonl.open"
    other.write_text(good + "{")
    sink = JsonlSink(tmp_path)
    assert [os.path.basename(p) for p in sink.recovered] == ["records-20240101T000000Z-000001.jsonl"]
    assert read_records(tmp_path, ["records-20240101T000000Z-000001.jsonl"]) == [rec(0), rec(1)]
    assert other.exists()  # another prefix is another sink's business
    sink.close()


def test_orphan_without_a_complete_line_is_removed(tmp_path):
    orphan = tmp_path / "records-20240101T000000Z-000001.jsonl.open"
    orphan.write_text('{"topic"')
    JsonlSink(tmp_path).close()
    assert os.listdir(tmp_path) == []


def test_orphan_already_published_before_the_crash(tmp_path):
    final = tmp_path / "records-20240101T000000Z-000001.jsonl"
    final.write_text(records_to_jsonl([rec(0)]))
    os.link(final, str(final) + ".open")  # died between link and unlink
    JsonlSink(tmp_path).close()
    assert os.listdir(tmp_path) == [final.name]
    assert read_records(tmp_path) == [rec(0)]


def test_a_live_writers_file_is_not_recovered(tmp_path):
    a = JsonlSink(tmp_path)
    a.write([rec(0)])
    a.flush()
    [name] = open_files(tmp_path)
    b = JsonlSink(tmp_path)  # a second worker starting up
    assert b.recovered == [] and open_files(tmp_path) == [name]
    a.write([rec(1)])
    a.close()
    b.close()
    assert read_records(tmp_path) == [rec(0), rec(1)]


def test_write_error_type_is_reexported():
    assert jsonl_mod.JsonlWriteError is JsonlWriteError
