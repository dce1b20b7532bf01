"""``kdaemon run`` with the otel plugin, end to end on Apache Kafka and a real OTLP receiver.

A producer instrumented by OpenTelemetry's own confluent-kafka instrumentation writes records
carrying its ``send`` spans' W3C ``traceparent`` headers: good JSON values, one value that is
not JSON (a dead letter), one record a header rule filters out.  The daemon (one worker, the
json deserializer, the default DLQ, the ``otel`` interceptor) exports to testkit's OTLP receiver
with a batch delay no test waits out, so the spans can only arrive through the flush of the
worker's drain.  Then:

* every delivered record has a CONSUMER ``process <topic>`` span in its producer's trace,
  a child of the producer's span, with the messaging attributes and its offset;
* the dead letter's span is in its producer's trace too, status ERROR, ``error.type`` the
  deserializer's exception and ``kdaemon.stage = deserialize``;
* the filtered record has no span and is counted in the settle spans' ``kdaemon.records.untraced``;
  with ``[otel] trace_filtered = true`` it has a ``filter <topic>`` span instead, a child of its
  producer's span shaped as a process span, and nothing is untraced;
* ``commit <topic>`` settle spans cover the committed end of the partition;
* the SDK ran in the worker: the supervisor has one thread, and the exporter's start was logged
  by the worker's pid.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the otel extra")
pytest.importorskip("opentelemetry.instrumentation.confluent_kafka", reason="needs the test extra")

from confluent_kafka import KafkaException, Producer
from opentelemetry.instrumentation.confluent_kafka import ConfluentKafkaInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.otlp_receiver import OtlpReceiver
from testkit.produce import committed_offsets, create_topic, high_watermarks

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

GOOD = 5
BAD_AT = 3        # the value that is not JSON
FILTERED_AT = 1   # the record with a "skip" header


def threads_of(pid: int) -> int:
    """The OS threads of a process (any thread a library starts, Python's or not)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1))


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int] | None:
    """The group's committed offsets; None while the coordinator is not ready to say."""
    try:
        return committed_offsets(bootstrap, group, topic, 1)
    except KafkaException:   # NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS: ask again
        return None


@pytest.mark.parametrize("trace_filtered", [False, True], ids=["filtered-counted", "filtered-traced"])
def test_process_spans_continue_the_producers_traces_and_a_dead_letter_is_an_error(kafka, tmp_path, trace_filtered):
    topic = f"otel-{uuid.uuid4().hex[:8]}"
    group = f"otel-group-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1)

    sent = InMemorySpanExporter()
    producer_traces = TracerProvider()
    producer_traces.add_span_processor(SimpleSpanProcessor(sent))
    producer = ConfluentKafkaInstrumentor.instrument_producer(
        Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0}), tracer_provider=producer_traces)
    send_span = {}   # offset -> the producer's send span (trace id, span id)
    for offset in range(GOOD + 2):
        value = b"{not json" if offset == BAD_AT else json.dumps({"n": offset}).encode()
        headers = [("skip", b"1")] if offset == FILTERED_AT else []
        producer.produce(topic, value=value, key=f"k{offset}".encode(), headers=headers, partition=0)
        producer.flush(30)
        span = sent.get_finished_spans()[-1].get_span_context()
        send_span[offset] = (f"{span.trace_id:032x}", f"{span.span_id:016x}")
    del producer   # librdkafka's threads end with it
    ends = high_watermarks(kafka.bootstrap, topic, 1)
    assert ends == {0: GOOD + 2} and len({t for t, _ in send_span.values()}) == GOOD + 2

    with OtlpReceiver() as otlp:
        config = daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=1, on_deserialize_error="dlq",
                               filters=[{"header": "skip", "op": "exists", "action": "drop"}])
        config["plugins"] = ["json", "kdaemon_otel:"]
        config["deserializer"] = {"key": "str", "value": "json"}
        config["interceptors"] = [{"name": "otel"}]
        config["otel"] = {"endpoint": otlp.endpoint, "service_name": "otel-test", "spans": "record",
                          "trace_filtered": trace_filtered}
        # Exported only when the queue fills (it does not) or a flush asks: the drain's.
        env = {"OTEL_BSP_SCHEDULE_DELAY": "3600000"}
        with Daemon(tmp_path, config, env=env) as daemon:
            wait_for(lambda: committed(kafka.bootstrap, group, topic) == ends, 90,
                     f"the group's commits at the partition's end {ends}", daemon.log_tail)
            supervisor, workers = daemon.pid, daemon.worker_pids()
            assert threads_of(supervisor) == 1, "the supervisor must hold no thread (the SDK's included)"
            assert daemon.stop() == 0, daemon.log_tail()
            log = daemon.log_tail(400)
        started = [int(pid) for pid in re.findall(r"otel: exporting traces over OTLP http/protobuf .* \(pid (\d+)\)", log)]
        assert started and set(started) <= workers and supervisor not in started, log

        spans = otlp.snapshot()
    assert not otlp.errors
    process = {s.attributes["messaging.kafka.offset"]: s for s in spans if s.name == f"process {topic}"}
    assert sorted(process) == [o for o in range(GOOD + 2) if o != FILTERED_AT]   # the filtered one: none
    for offset, s in process.items():
        assert (s.trace_id, s.parent_span_id) == send_span[offset], f"offset {offset}: not the producer's child"
        assert s.kind == "CONSUMER" and s.resource["service.name"] == "otel-test"
        assert s.schema_url == "https://opentelemetry.io/schemas/1.44.0"
        assert {k: v for k, v in s.attributes.items() if k not in ("error.type", "kdaemon.stage")} == {
            "messaging.system": "kafka", "messaging.operation.name": "process",
            "messaging.operation.type": "process", "messaging.destination.name": topic,
            "messaging.destination.partition.id": "0", "messaging.consumer.group.name": group,
            "messaging.kafka.offset": offset}
        if offset == BAD_AT:
            assert s.status == "ERROR" and s.attributes["error.type"] == "ValueError", s
            assert s.attributes["kdaemon.stage"] == "deserialize" and "not valid JSON" in s.status_message
        else:
            assert s.status == "UNSET" and "error.type" not in s.attributes, s

    filtered = [s for s in spans if s.name == f"filter {topic}"]
    if trace_filtered:
        assert len(filtered) == 1, filtered
        s = filtered[0]
        assert (s.trace_id, s.parent_span_id) == send_span[FILTERED_AT] and s.kind == "CONSUMER"
        assert s.attributes == {
            "messaging.system": "kafka", "messaging.operation.name": "filter",
            "messaging.operation.type": "process", "messaging.destination.name": topic,
            "messaging.destination.partition.id": "0", "messaging.consumer.group.name": group,
            "messaging.kafka.offset": FILTERED_AT}
    else:
        assert filtered == []

    settle = [s for s in spans if s.name == f"commit {topic}"]
    assert settle and all(s.kind == "CLIENT" and s.attributes["messaging.operation.type"] == "settle"
                          and s.attributes["messaging.consumer.group.name"] == group for s in settle)
    assert max(s.attributes["messaging.kafka.offset"] for s in settle) == GOOD + 2
    untraced = sum(s.attributes.get("kdaemon.records.untraced", 0) for s in settle)
    assert untraced == (0 if trace_filtered else 1)   # the filtered record, unless traced
    linked = {span_id for s in settle for _, span_id in s.links}
    assert linked and linked <= {s.span_id for s in process.values()} | {s.span_id for s in filtered}
