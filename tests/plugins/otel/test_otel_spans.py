"""The otel plugin without a broker: its sink wrapper through the real plugin manager, batch
spans and their links, and a sink write that fails; spans exported by the real SDK to testkit's
OTLP receiver."""

from __future__ import annotations

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the otel extra")

import kdaemon_otel
from kdaemon.config import parse
from kdaemon.plugins import hookimpl
from kdaemon.plugins.manager import PluginManager
from kdaemon.plugins.types import SinkWriteError
from kdaemon.sinks import builtin as builtin_sinks
from kdaemon.testing import make_record
from kdaemon.worker.build import sink_context
from testkit.otlp_receiver import OtlpGrpcReceiver, OtlpReceiver

SAMPLED = "00-{:032x}-{:016x}-01"
UNSAMPLED = "00-{:032x}-{:016x}-00"


class AsyncSink:
    """A sink with the optional parts a worker asks for with getattr."""

    deduplicates_by_offset = True

    def __init__(self, settings: dict) -> None:
        self.written: list = []
        self.fail_at: int | None = settings.get("fail_at")

    def write(self, records) -> None:
        self.written.extend(records)
        if self.fail_at is not None:
            raise SinkWriteError("refused one", failed_indexes=[self.fail_at])

    def flush(self) -> None: ...

    def flush_async(self):
        return "handle"

    def probe(self):
        return None

    def close(self) -> None: ...


class AsyncSinkPlugin:
    @hookimpl
    def kdaemon_sinks(self):
        def make(settings):
            return AsyncSink(settings)
        make.validate = lambda settings: None
        return {"async": make}


def manager(otlp: OtlpReceiver, sink: dict, spans: str, protocol: str = "http/protobuf") -> tuple[PluginManager, object]:
    config = parse({"plugins": ["kdaemon_otel:"], "kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g"},
                    "daemon": {"topics": ["t"]}, "sink": sink,
                    "otel": {"endpoint": otlp.endpoint, "spans": spans, "protocol": protocol}}, "f.toml", environ={})
    plugins = PluginManager(config.plugins)
    plugins.register(builtin_sinks, "builtin-sinks")
    plugins.register(AsyncSinkPlugin(), "async-sink")
    plugins.configure(config)
    return plugins, config


@pytest.fixture
def otlp():
    with OtlpReceiver() as receiver:
        yield receiver
    kdaemon_otel.kdaemon_worker_exit(0, 0)


def test_every_sink_is_wrapped_and_keeps_exactly_what_it_offers(otlp):
    plugins, config = manager(otlp, {"type": "null"}, "batch")
    factories = plugins.sinks(sink_context(config))
    # `kdaemon plugins`: the wrapper offers nothing of its own (and is not called outside pluggy)
    assert plugins.offered(sink_context(config))["kdaemon_otel:"] == {"interceptors": ["otel"]}
    assert factories["async"].validate is not None and factories["jsonl"].validate is not None
    null = factories["null"]({"type": "null"})
    wrapped = factories["async"]({"type": "async"})
    assert type(null).__name__ == "TracedSink" and type(wrapped).__name__ == "TracedAsyncSink"
    assert getattr(null, "flush_async", None) is None and getattr(null, "deduplicates_by_offset", False) is False
    assert wrapped.flush_async() == "handle" and wrapped.probe() is None and wrapped.deduplicates_by_offset
    wrapped.write([make_record(b"v", offset=0)])
    wrapped.close()   # the drain: what was queued is exported now
    otlp.wait_for(lambda spans: [s for s in spans if s.name == "process test"], 30, "the process span")


def test_a_batch_span_links_the_sampled_producer_spans_of_its_partition(otlp):
    plugins, config = manager(otlp, {"type": "null"}, "batch")
    sink = plugins.sinks(sink_context(config))["null"]({"type": "null"})
    records = [make_record(b"v", offset=i, headers={"traceparent": (SAMPLED if i % 3 else UNSAMPLED).format(i + 1, i + 1)})
               for i in range(300)]
    sink.write(records)
    sink.close()
    spans = otlp.wait_for(lambda spans: [s for s in spans if s.name == "process test"] if sum(
        s.attributes.get("messaging.batch.message_count", 0) for s in spans) == 300 else None, 30, "three batch spans")
    assert sorted(s.attributes["messaging.batch.message_count"] for s in spans) == [44, 128, 128]
    linked = sorted(int(span_id, 16) for s in spans for _, span_id in s.links)
    assert linked == [i + 1 for i in range(300) if i % 3]   # the unsampled producers' spans exist nowhere
    assert all(s.parent_span_id == "" and s.kind == "CONSUMER" and "messaging.kafka.offset" not in s.attributes
               for s in spans)


def test_records_a_sink_write_refuses_are_errors_and_the_others_are_not(otlp):
    plugins, config = manager(otlp, {"type": "async", "fail_at": 1}, "record")
    sink = plugins.sinks(sink_context(config))["async"]({"type": "async", "fail_at": 1})
    records = [make_record(b"v", offset=i, headers={"traceparent": SAMPLED.format(7, i + 1)}) for i in range(3)]
    with pytest.raises(SinkWriteError):
        sink.write(records)
    sink.close()
    spans = otlp.wait_for(lambda spans: len(spans) == 3 and spans, 30, "three process spans")
    by_offset = {s.attributes["messaging.kafka.offset"]: s for s in spans}
    assert {o: (s.status, s.attributes.get("error.type")) for o, s in by_offset.items()} == {
        0: ("UNSET", None), 1: ("ERROR", "SinkWriteError"), 2: ("UNSET", None)}
    assert all(s.parent_span_id == f"{o + 1:016x}" and s.trace_id == f"{7:032x}" for o, s in by_offset.items())


def test_spans_go_out_over_grpc_too():
    with OtlpGrpcReceiver() as otlp:
        try:
            plugins, config = manager(otlp, {"type": "null"}, "record", protocol="grpc")
            sink = plugins.sinks(sink_context(config))["null"]({"type": "null"})
            sink.write([make_record(b"v", offset=4, headers={"traceparent": SAMPLED.format(9, 3)})])
            sink.close()
            (span,) = otlp.wait_for(lambda spans: spans, 30, "the span over gRPC")
        finally:
            kdaemon_otel.kdaemon_worker_exit(0, 0)
    assert (span.name, span.trace_id, span.parent_span_id, span.attributes["messaging.kafka.offset"]) == (
        "process test", f"{9:032x}", f"{3:016x}", 4)



WHAT_IS_IMPORTED = """
import sys
from kdaemon.config import parse
from kdaemon.worker.build import build_pipeline_parts
from kdaemon.worker.main import load_plugins
base = {"kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g"}, "daemon": {"topics": ["t"]},
        "sink": {"type": "null"}}
off = parse({**base, "plugins": ["json"]}, "f.toml", environ={})
build_pipeline_parts(off, load_plugins(off))                     # a worker without the plugin
print(sorted({m.split(".")[0] for m in sys.modules if m.startswith(("opentelemetry", "kdaemon_otel"))}))
on = parse({**base, "plugins": ["json", "kdaemon_otel:"], "otel": {}}, "f.toml", environ={})
load_plugins(on, configure=False)                                # what the supervisor does
print(sorted({m.split(".")[0] for m in sys.modules if m.startswith(("opentelemetry", "kdaemon_otel"))}))
"""


def test_off_nothing_is_imported_and_the_supervisor_imports_no_opentelemetry(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "plugins")])}
    out = subprocess.run([sys.executable, "-c", WHAT_IS_IMPORTED], env=env, cwd=tmp_path, capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["[]", "['kdaemon_otel']"]
