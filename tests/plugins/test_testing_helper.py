"""kdaemon.testing: make_record and run_plugin follow the worker's stage semantics."""

from __future__ import annotations

import json
import os

import pytest

from kdaemon.client.types import OffsetAndMetadata, TopicPartition
from kdaemon.plugins import hookimpl
from kdaemon.plugins.types import Record
from kdaemon.testing import make_record, make_records, run_plugin


def test_make_record_conversions():
    r = make_record("héllo", key=b"k", headers={"a": "1", "b": b"\x00", "n": None}, offset=4,
                    timestamp=123, topic="x", partition=2)
    assert (r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type) == ("x", 2, 4, 123, 0)
    assert (r.key, r.raw_key) == (b"k", b"k")
    assert (r.value, r.raw_value) == ("héllo".encode(), "héllo".encode())
    assert r.headers == [("a", b"1"), ("b", b"\x00"), ("n", None)]
    obj = make_record({"a": 1}, headers=[("h", "v")])
    assert obj.value == {"a": 1} and json.loads(obj.raw_value) == {"a": 1}
    assert make_record().value is None and make_record().raw_value is None
    assert abs(make_record().timestamp / 1000 - __import__("time").time()) < 60
    assert [r.offset for r in make_records([b"a", b"b"], offset=10)] == [10, 11]


class Upper:
    """A plugin object offering a few things, to drive run_plugin."""

    def __init__(self):
        self.commits = []

    @hookimpl
    def kdaemon_header_filters(self):
        return {"has-x": lambda settings: (lambda headers: any(k == "x" for k, _ in headers)),
                "not-y": lambda settings: (lambda headers: all(k != "y" for k, _ in headers))}

    @hookimpl
    def kdaemon_deserializers(self):
        def upper(settings):
            def d(topic, headers, data):
                if data == b"bad":
                    raise ValueError("bad data")
                return None if data is None else data.decode().upper()
            return d
        return {"upper": upper}

    @hookimpl
    def kdaemon_interceptors(self):
        plugin = self

        class Suffix:
            def __init__(self, settings):
                self.suffix = settings.get("suffix", "!")

            def on_consume(self, records):
                return [Record(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key,
                               r.value + self.suffix, r.headers) for r in records]

            def on_commit(self, offsets):
                plugin.commits.append(dict(offsets))

        class DropFirst:
            def __init__(self, settings):
                pass

            def on_consume(self, records):
                return records[1:]

        class Raises:
            def __init__(self, settings):
                pass

            def on_consume(self, records):
                records.clear()  # a badly behaved interceptor that also mutates its input...
                raise RuntimeError("interceptor bug")

            def on_commit(self, offsets):
                raise RuntimeError("commit bug")

        class ReturnsNone:
            def __init__(self, settings):
                pass

            def on_consume(self, records):
                return None

        return {"suffix": Suffix, "drop-first": DropFirst, "raises": Raises, "none": ReturnsNone}


def test_filters_all_must_keep():
    records = [make_record(b"a", headers={"x": "1"}, offset=0),
               make_record(b"b", headers={"x": "1", "y": "1"}, offset=1),
               make_record(b"c", offset=2)]
    run = run_plugin(Upper(), records, filters=["has-x", "not-y"])
    assert [r.offset for r in run.kept] == [0] and [r.offset for r in run.dropped] == [1, 2]
    assert run.committed == {TopicPartition("test", 0): OffsetAndMetadata(3)}


def test_deserializer_errors_take_the_record_out():
    run = run_plugin(Upper(), make_records([b"a", b"bad", None]), deserializer="upper",
                     key_deserializer="upper")
    assert run.values == ["A", None]
    [(r, exc)] = run.deserialize_errors
    assert r.offset == 1 and str(exc) == "bad data"
    assert run.deserialized[0].raw_value == b"a"  # raw bytes are kept for a DLQ


def test_interceptor_chain_continues_from_the_last_success(caplog):
    plugin = Upper()
    run = run_plugin(plugin, make_records([b"a", b"b", b"c"]), deserializer="upper",
                     interceptors=["drop-first", ("suffix", {"suffix": "?"}), "none",
                                   ("suffix", {"suffix": "!"})])
    assert run.values == ["B?!", "C?!"]
    assert [name for name, out in run.interceptor_outputs] == ["drop-first", "suffix", "none", "suffix"]
    assert run.interceptor_outputs[2][1] is None
    [(name, stage, exc)] = run.interceptor_errors
    assert (name, stage) == ("none", "on_consume") and "returned None" in str(exc)
    assert "interceptor 'none' raised in on_consume" in caplog.text
    # on_commit is called for every interceptor, with offsets covering the dropped record too
    assert plugin.commits == [{TopicPartition("test", 0): OffsetAndMetadata(3)}] * 2


def test_interceptor_raising_in_both_stages_is_recorded():
    run = run_plugin(Upper(), make_records([b"a"]), deserializer="upper",
                     interceptors=["suffix", "raises"])
    # "raises" emptied the list it was given before raising.  Like the worker, run_plugin goes
    # on with suffix's output *list*, which is now empty: an interceptor must build a new list
    # and never mutate the one it receives.
    assert run.output == []
    assert [(n, s) for n, s, _ in run.interceptor_errors] == [("raises", "on_consume"), ("raises", "on_commit")]
    assert len(run.errors) == 2


def test_sink_is_built_written_flushed_and_closed(tmp_path):
    run = run_plugin(Upper(), make_records([b"a", b"b"]), deserializer="upper",
                     sink=("jsonl", {"path": str(tmp_path)}))
    assert run.sink.closed and run.sink_error is None
    [name] = os.listdir(tmp_path)
    lines = (tmp_path / name).read_text().splitlines()
    assert [json.loads(line)["value"] for line in lines] == ["A", "B"]


def test_sink_error_means_no_commit():
    class Failing:
        @hookimpl
        def kdaemon_sinks(self):
            class Sink:
                def __init__(self, settings):
                    assert settings == {"type": "failing"}
                def write(self, records):
                    raise OSError("disk full")
                def flush(self):
                    pass
                def close(self):
                    pass
            return {"failing": Sink}

    run = run_plugin(Failing(), make_records([b"a"]), sink="failing")
    assert isinstance(run.sink_error, OSError) and run.committed == {}


def test_unknown_names_and_refused_settings():
    with pytest.raises(ValueError, match=r"no interceptor named 'nope' \(available: drop-first, none"):
        run_plugin(Upper(), [], interceptors=["nope"])
    with pytest.raises(ValueError, match=r"unknown null sink setting"):
        run_plugin(Upper(), [], sink=("null", {"colour": "red"}))


def test_builtins_can_be_left_out():
    with pytest.raises(ValueError, match="no deserializer named 'bytes'"):
        run_plugin(Upper(), [], deserializer="bytes", include_builtin=False)
    assert run_plugin(Upper(), make_records([b"x"]), deserializer="bytes").values == [b"x"]
