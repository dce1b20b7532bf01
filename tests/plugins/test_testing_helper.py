"""kdaemon.testing: make_record and run_plugin follow the worker's stage semantics."""

from __future__ import annotations

import dataclasses
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
    [name] = [n for n in os.listdir(tmp_path) if n.endswith(".jsonl")]   # beside it: _kdaemon/ (dedupe's index)
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


def test_a_sink_refusing_for_good_is_its_error_too():
    """A sink's ``SinkRefused`` (what stops the daemon with exit 6) is recorded like any error."""
    from kdaemon.plugins.types import SinkRefused

    class Refusing:
        @hookimpl
        def kdaemon_sinks(self):
            class Sink:
                def __init__(self, settings):
                    pass

                def write(self, records):
                    pass

                def flush(self):
                    raise SinkRefused("table t does not exist", target="t", fix="create it")

                def close(self):
                    pass
            return {"refusing": Sink}

    run = run_plugin(Refusing(), make_records([b"a"]), sink="refusing")
    assert isinstance(run.sink_error, SinkRefused) and run.sink_error.fix == "create it" and run.committed == {}


def test_unknown_names_and_refused_settings():
    with pytest.raises(ValueError, match=r"no interceptor named 'nope' \(available: drop-first, none"):
        run_plugin(Upper(), [], interceptors=["nope"])
    with pytest.raises(ValueError, match=r"<run_plugin>: sink\.colour: unknown setting \(known: none\)"):
        run_plugin(Upper(), [], sink=("null", {"colour": "red"}))


def test_builtins_can_be_left_out():
    with pytest.raises(ValueError, match="no deserializer named 'bytes'"):
        run_plugin(Upper(), [], deserializer="bytes", include_builtin=False)
    assert run_plugin(Upper(), make_records([b"x"]), deserializer="bytes").values == [b"x"]


# -- run_plugin is the daemon's pipeline ------------------------------------------------------------

class Chain:
    """Interceptors for the chain rule: one that raises without touching its input, one that
    returns a generator, one that tags, one whose on_commit raises."""

    def __init__(self):
        self.commits = []

    @hookimpl
    def kdaemon_interceptors(self):
        plugin = self

        class Boom:
            def __init__(self, settings):
                pass

            def on_consume(self, records):
                raise RuntimeError("boom")

            def on_commit(self, offsets):
                raise RuntimeError("commit boom")

        class Tag:
            def __init__(self, settings):
                self.tag = settings["tag"]

            def on_consume(self, records):
                return [dataclasses.replace(r, value=r.value + self.tag) for r in records]

            def on_commit(self, offsets):
                plugin.commits.append((self.tag, dict(offsets)))

        class Lazy:
            def __init__(self, settings):
                pass

            def on_consume(self, records):
                return (r for r in records if r.offset % 2 == 0)   # any iterable will do

        return {"boom": Boom, "tag": Tag, "lazy": Lazy}


CHAIN = ["boom", ("tag", {"tag": b"1"}), "boom", "lazy", ("tag", {"tag": b"2"})]


def test_the_interceptor_chain_rule_runs_in_the_daemons_pipeline(caplog):
    """Java semantics: an on_consume that raises is logged and counted, and the next
    interceptor gets the output of the last one that succeeded; an on_commit that raises does
    not keep the others from being told."""
    plugin = Chain()
    run = run_plugin(plugin, make_records([b"a", b"b", b"c", b"d"]), interceptors=CHAIN)
    assert run.values == [b"a12", b"c12"]
    assert [(n, out is None) for n, out in run.interceptor_outputs] == \
        [("boom", True), ("tag", False), ("boom", True), ("lazy", False), ("tag", False)]
    assert [(n, s, str(e)) for n, s, e in run.interceptor_errors] == [
        ("boom", "on_consume", "boom"), ("boom", "on_consume", "boom"),
        ("boom", "on_commit", "commit boom"), ("boom", "on_commit", "commit boom")]
    assert plugin.commits == [(b"1", {TopicPartition("test", 0): OffsetAndMetadata(4)}),
                              (b"2", {TopicPartition("test", 0): OffsetAndMetadata(4)})]
    assert caplog.text.count("interceptor 'boom' raised in on_consume") == 2


def test_run_plugin_and_the_daemons_stages_agree():
    """The same names as a daemon configuration, built by build_pipeline_parts and run by the
    worker's Pipeline directly: the same output and the same per-plugin error counts."""
    from kdaemon.client.types import ConsumerRecord
    from kdaemon.config import parse
    from kdaemon.plugins.manager import PluginManager
    from kdaemon.worker.build import build_pipeline_parts
    from kdaemon.worker.pipeline import Pipeline

    records = make_records([b"a", b"b", b"c", b"d"])
    run = run_plugin(Chain(), records, interceptors=CHAIN)

    manager = PluginManager(enabled=[])
    manager.register(Chain(), "chain")
    from kdaemon.sinks import builtin as builtin_sinks
    manager.register(builtin_sinks, "builtin-sinks")
    config = parse({"plugins": [], "kafka": {"bootstrap_servers": "x:1", "group_id": "g"},
                    "daemon": {"topics": ["test"], "on_deserialize_error": "skip"},
                    "interceptors": [{"name": n} if isinstance(n, str) else {"name": n[0], "settings": n[1]}
                                     for n in CHAIN],
                    "sink": {"type": "null"}})
    pipeline = Pipeline(config, build_pipeline_parts(config, manager))
    raw = [ConsumerRecord(r.topic, r.partition, r.offset, r.timestamp, r.timestamp_type, r.key, r.value,
                          r.headers, None) for r in records]
    direct = pipeline.intercept(pipeline.deserialize(raw)[0])
    assert [r.value for r in direct] == run.values
    assert pipeline.stats.plugin_errors == {"boom": 2}


def test_run_plugin_reports_problems_as_the_daemon_does():
    with pytest.raises(ValueError, match=r"<run_plugin>: interceptors\[0\]\.name: no interceptor named 'nope'"):
        run_plugin(Upper(), [], interceptors=["nope"])
    with pytest.raises(ValueError, match=r"one \[deserializer.settings\] table for both"):
        run_plugin(Upper(), [], deserializer=("str", {"encoding": "latin-1"}),
                   key_deserializer=("str", {"encoding": "utf-8"}))
    # The same settings for both, or settings for one only, is what the daemon can express.
    run = run_plugin(Upper(), make_records([b"\xe9"], key=b"k"), deserializer=("str", {"encoding": "latin-1"}),
                     key_deserializer="str")
    assert run.values == ["é"] and run.output[0].key == "k"


def test_a_filtered_only_batch_is_committed_without_reaching_the_sink():
    run = run_plugin(Upper(), make_records([b"a", b"b"], offset=5), filters=["has-x"], sink="null")
    assert run.kept == [] and len(run.dropped) == 2 and run.output == []
    assert run.sink.records == 0
    assert run.committed == {TopicPartition("test", 0): OffsetAndMetadata(7)}
