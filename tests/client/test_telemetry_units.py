"""Client telemetry (KIP-714) without a broker: the state machine's table and timers, what each
error in an answer does, the close, and the OTLP payload decoded with opentelemetry-proto.

The broker's side (a real plugin receiving kdaemon's and the Java consumer's pushes) is
tests/client/test_telemetry_kafka.py; here are the answers a test broker cannot be made to give.
"""

from __future__ import annotations

import random
import uuid

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2

from kdaemon.client.config import ConsumerConfig
from kdaemon.client.consumer import Consumer
from kdaemon.client.telemetry_metrics import (CUMULATIVE, DELTA, GAUGE, SUM, MetricPoint, PushPayload, WireCounters,
                                              compressed)
from kdaemon.client.telemetry_state import (TRANSITIONS, IllegalTelemetryTransition, TelemetryEvent,
                                            TelemetryState, TelemetryStateMachine)
from kdaemon.protocol.apis import API_VERSIONS, FETCH, OFFSET_COMMIT
from kdaemon.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, decompress
from kdaemon.protocol.errors import Errors

S = TelemetryState
INSTANCE = uuid.UUID("0f0e0d0c-0b0a-4908-8706-050403020100")
INTERVAL_MS = 10_000


def answer(**changes) -> dict:
    body = {"throttle_time_ms": 0, "error_code": 0, "client_instance_id": INSTANCE, "subscription_id": 7,
            "accepted_compression_types": [ZSTD, LZ4, GZIP, SNAPPY], "push_interval_ms": INTERVAL_MS,
            "telemetry_max_bytes": 1 << 20, "delta_temporality": True,
            "requested_metrics": ["org.apache.kafka.consumer."]}
    body.update(changes)
    return body


def subscribed(now: float = 100.0, **changes) -> tuple[TelemetryStateMachine, int]:
    sm = TelemetryStateMachine(random.Random(1))
    assert sm.due(now) == "get"
    ticket = sm.sent("get")
    sm.get_answered(ticket, now, answer(**changes))
    return sm, ticket


def pushing(now: float = 100.0) -> tuple[TelemetryStateMachine, int]:
    sm, _ = subscribed(now)
    return sm, sm.sent("push")


def test_first_get_carries_the_zero_uuid_and_the_answer_assigns_the_id():
    sm = TelemetryStateMachine()
    assert (sm.state, sm.due(0.0), sm.client_instance_id.int) == (S.SUBSCRIPTION_NEEDED, "get", 0)
    sm, _ = subscribed()
    assert sm.client_instance_id == INSTANCE and sm.subscription.subscription_id == 7
    # A later answer carries the zero UUID: the id stays.
    sm.push_answered(sm.sent("push"), 200.0, Errors.UNKNOWN_SUBSCRIPTION_ID)
    sm.get_answered(sm.sent("get"), 200.0, answer(client_instance_id=uuid.UUID(int=0), subscription_id=8))
    assert sm.client_instance_id == INSTANCE and sm.subscription.subscription_id == 8


def test_first_push_jittered_within_half_and_one_and_a_half_intervals_then_the_interval():
    waits = []
    for seed in range(50):
        sm = TelemetryStateMachine(random.Random(seed))
        sm.get_answered(sm.sent("get"), 100.0, answer())
        waits.append(sm.next_at - 100.0)
        assert sm.due(sm.next_at - 0.001) is None and sm.due(sm.next_at) == "push"
    assert all(5.0 <= w <= 15.0 for w in waits) and max(waits) - min(waits) > 5.0, waits
    sm, ticket = pushing()
    sm.push_answered(ticket, 300.0, 0)
    assert (sm.state, sm.next_at) == (S.PUSH_NEEDED, 310.0)


@pytest.mark.parametrize("requested, pushes, wants", [
    ([], False, None),                                         # nothing subscribed
    ([""], True, True),                                        # everything (the KIP's word)
    (["*"], True, True),                                       # everything (Java's and the broker's)
    (["org.apache.kafka.consumer.fetch"], True, True),
    (["org.apache.kafka.producer."], True, False),
])
def test_requested_metrics(requested, pushes, wants):
    sm, _ = subscribed(requested_metrics=requested)
    assert sm.subscription.pushes is pushes
    if not pushes:
        # Subscribed to nothing: no push, ask again after the interval.
        assert (sm.state, sm.next_at, sm.due(109.0), sm.due(110.0)) == (S.SUBSCRIPTION_NEEDED, 110.0, None, "get")
    else:
        assert sm.subscription.wants("org.apache.kafka.consumer.fetch.manager.fetch.latency.avg") is wants


@pytest.mark.parametrize("accepted, chosen", [([ZSTD, LZ4], ZSTD), ([SNAPPY, GZIP], SNAPPY), ([9, LZ4], LZ4),
                                              ([], NONE), ([NONE], NONE)])
def test_compression_is_the_first_accepted_we_know(accepted, chosen):
    sm, _ = subscribed(accepted_compression_types=accepted)
    assert sm.subscription.compression == chosen


@pytest.mark.parametrize("code, state, wait", [
    (Errors.UNKNOWN_SUBSCRIPTION_ID, S.SUBSCRIPTION_NEEDED, 0.0),        # subscribe again now
    (76, S.SUBSCRIPTION_NEEDED, 0.0),                                     # UNSUPPORTED_COMPRESSION_TYPE
    (Errors.TELEMETRY_TOO_LARGE, S.SUBSCRIPTION_NEEDED, INTERVAL_MS / 1000),
    (Errors.THROTTLING_QUOTA_EXCEEDED, S.SUBSCRIPTION_NEEDED, INTERVAL_MS / 1000),
    (Errors.INVALID_REQUEST, S.DISABLED, None),
    (Errors.INVALID_RECORD, S.DISABLED, None),
    (Errors.UNSUPPORTED_VERSION, S.DISABLED, None),
    (Errors.CLUSTER_AUTHORIZATION_FAILED, S.DISABLED, None),              # not in the KIP's table
])
def test_push_errors(code, state, wait):
    sm, ticket = pushing()
    sm.push_answered(ticket, 200.0, code)
    assert sm.state is state
    if wait is None:
        assert sm.finished and sm.due(10**9) is None and sm.stopped_because
        assert sm.close() is False          # stopped: no terminating push either
    else:
        assert sm.next_at == 200.0 + wait and sm.due(200.0 + wait) == "get"


def test_get_errors_follow_the_same_table():
    sm = TelemetryStateMachine()
    sm.get_answered(sm.sent("get"), 50.0, answer(error_code=Errors.THROTTLING_QUOTA_EXCEEDED))
    assert (sm.state, sm.next_at) == (S.SUBSCRIPTION_NEEDED, 350.0)   # no interval known: Java's 5 minutes
    sm.get_answered(sm.sent("get"), 400.0, answer(error_code=Errors.INVALID_REQUEST))
    assert sm.state is S.DISABLED


def test_no_answer_retries_after_the_interval_and_a_broker_without_the_api_stops_it():
    sm, ticket = pushing()
    sm.failed(ticket, 200.0, unsupported=False)
    assert (sm.state, sm.next_at) == (S.SUBSCRIPTION_NEEDED, 210.0)
    sm = TelemetryStateMachine()
    sm.failed(sm.sent("get"), 1.0, unsupported=True)
    assert sm.state is S.DISABLED and "does not offer" in sm.stopped_because


def test_close_pushes_a_terminating_push_only_with_a_subscription_that_pushes():
    assert TelemetryStateMachine().close() is False                      # never subscribed
    sm, _ = subscribed(requested_metrics=[])
    assert sm.close() is False and sm.state is S.TERMINATED
    sm, _ = subscribed()
    assert sm.close() is True and sm.due(0.0) == "terminating_push"      # due at once, whatever the timer
    ticket = sm.sent("terminating_push")
    sm.push_answered(ticket, 1.0, Errors.UNKNOWN_SUBSCRIPTION_ID)        # any answer ends it
    assert sm.state is S.TERMINATED and sm.due(10**9) is None
    assert sm.close() is False and sm.state is S.TERMINATED              # closing twice


def test_an_answer_overtaken_by_the_close_is_ignored():
    sm, push = pushing()
    assert sm.close() is True
    last = sm.sent("terminating_push")
    sm.push_answered(push, 2.0, Errors.UNKNOWN_SUBSCRIPTION_ID)          # the earlier push's answer
    assert sm.state is S.TERMINATING_PUSH_IN_PROGRESS
    sm.failed(push, 2.0, unsupported=False)
    assert sm.state is S.TERMINATING_PUSH_IN_PROGRESS
    sm.push_answered(last, 3.0, 0)
    assert sm.state is S.TERMINATED


def test_give_up_ends_a_close_without_an_answer():
    sm, _ = subscribed()
    sm.close()
    sm.sent("terminating_push")
    sm.give_up()
    assert sm.state is S.TERMINATED


def test_the_table_refuses_what_it_does_not_name():
    sm = TelemetryStateMachine()
    with pytest.raises(IllegalTelemetryTransition, match="pushed in state subscription_needed"):
        sm.apply(TelemetryEvent.PUSHED)
    # Every state can be closed; only running states can be stopped.
    assert {s for s, e in TRANSITIONS if e is TelemetryEvent.CLOSE} == set(S)
    assert {s for s, e in TRANSITIONS if e is TelemetryEvent.STOP} == {
        S.SUBSCRIPTION_NEEDED, S.SUBSCRIPTION_IN_PROGRESS, S.PUSH_NEEDED, S.PUSH_IN_PROGRESS}


# -- the payload ----------------------------------------------------------------------------------

def decoded(data: bytes) -> metrics_pb2.MetricsData:
    out = metrics_pb2.MetricsData()
    out.ParseFromString(data)
    return out


def by_name(md: metrics_pb2.MetricsData) -> dict[tuple[str, tuple], metrics_pb2.Metric]:
    return {(m.name, tuple((a.key, a.value.string_value) for a in (m.sum.data_points or m.gauge.data_points)[0].attributes)): m
            for rm in md.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_payload_is_otlp_with_sums_gauges_attributes_and_the_resource():
    points = [MetricPoint("a.total", SUM, 5), MetricPoint("a.avg", GAUGE, 1.5),
              MetricPoint("a.lag", GAUGE, 3, (("topic", "t"), ("partition", "0")))]
    payload = PushPayload()
    md = decoded(payload.encode(points, {"group_id": "g"}, delta=False, now_ns=10**18))
    assert [(a.key, a.value.string_value) for a in md.resource_metrics[0].resource.attributes] == [("group_id", "g")]
    got = by_name(md)
    total = got[("a.total", ())]
    assert (total.sum.is_monotonic, total.sum.aggregation_temporality, total.sum.data_points[0].as_double) == \
        (True, CUMULATIVE, 5.0)
    assert total.sum.data_points[0].time_unix_nano == 10**18
    assert got[("a.avg", ())].gauge.data_points[0].as_double == 1.5
    assert got[("a.lag", (("topic", "t"), ("partition", "0")))].gauge.data_points[0].as_double == 3.0


def test_delta_temporality_counts_from_the_last_push_and_rates_over_it():
    payload = PushPayload()
    first = [MetricPoint("org.apache.kafka.consumer.fetch.manager.records.consumed.total", SUM, 10)]
    start = payload._last_ns
    with_rates = payload.points_with_rates(first, start + 2 * 10**9)
    assert with_rates[-1] == MetricPoint("org.apache.kafka.consumer.fetch.manager.records.consumed.rate", GAUGE, 5.0)
    md = decoded(payload.encode(first, {}, delta=True, now_ns=start + 2 * 10**9))
    dp = md.resource_metrics[0].scope_metrics[0].metrics[0].sum
    assert (dp.aggregation_temporality, dp.data_points[0].as_double) == (DELTA, 10.0)
    payload.pushed(first, start + 2 * 10**9)
    second = [MetricPoint(first[0].name, SUM, 16)]
    assert payload.points_with_rates(second, start + 4 * 10**9)[-1].value == 3.0
    md = decoded(payload.encode(second, {}, delta=True, now_ns=start + 4 * 10**9))
    dp = md.resource_metrics[0].scope_metrics[0].metrics[0].sum.data_points[0]
    assert (dp.as_double, dp.start_time_unix_nano) == (6.0, start + 2 * 10**9)


@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
def test_compressed_payload_decompresses_as_a_record_batch_would(codec):
    data = PushPayload().encode([MetricPoint("x.total", SUM, 1)] * 50, {}, delta=False)
    assert decompress(codec, compressed(codec, data)) == data


def test_wire_counters_count_connections_requests_and_commit_latency():
    wire = WireCounters()
    wire(1, API_VERSIONS, 3, {}, False)
    wire(1, API_VERSIONS, 3, {}, True)
    wire(1, OFFSET_COMMIT, 9, {}, False)
    wire(1, FETCH, 17, {}, False)
    wire(1, OFFSET_COMMIT, 9, {}, True)
    assert (wire.connections, wire.requests, wire.responses, wire.commits) == (1, 3, 2, 1)
    names = {p.name: p for p in wire.points(group=True)}
    assert names["org.apache.kafka.consumer.coordinator.commit.total"].value == 1
    assert names["org.apache.kafka.consumer.coordinator.commit.latency.avg"].value >= 0.0
    assert not any("coordinator" in p.name for p in wire.points(group=False))


# -- the setting ------------------------------------------------------------------------------------

def test_enable_metrics_push_is_on_by_default_and_turns_the_sender_off():
    assert ConsumerConfig().enable_metrics_push is True
    with pytest.raises(ValueError, match="enable_metrics_push must be true or false"):
        ConsumerConfig(enable_metrics_push="no")
    on = Consumer("127.0.0.1:9", group_id="g")
    off = Consumer("127.0.0.1:9", group_id="g", enable_metrics_push=False)
    try:
        assert on._telemetry is not None and on._telemetry.wire in on._network.observers
        assert off._telemetry is None and off._network.observers == []
        assert on.client_instance_id() is None and off.client_instance_id() is None
    finally:
        on.close(timeout_ms=0)
        off.close(timeout_ms=0)


class AnsweringNetwork:
    """What ClientTelemetry uses of a NetworkClient, answering each request at once with a body
    the test chose (the faults of this module's own code need no broker)."""

    def __init__(self, answers: dict) -> None:
        self.observers: list = []
        self.answers = answers
        self.sent: list[tuple[str, dict]] = []

    def least_loaded_node(self):
        return 1

    def is_ready(self, node):
        return True

    def send(self, node, api, body):
        from kdaemon.client.future import Future
        self.sent.append((api.name, body))
        return Future().success((0, self.answers[api.name]))


def test_a_push_that_cannot_be_built_never_reaches_the_consumer(caplog):
    from kdaemon.client.telemetry import ClientTelemetry

    def broken(wire):
        raise RuntimeError("a bug in a metric")

    network = AnsweringNetwork({"GetTelemetrySubscriptions": answer(),
                                "PushTelemetry": {"throttle_time_ms": 0, "error_code": 0}})
    t = ClientTelemetry(network, broken, dict, state=TelemetryStateMachine(random.Random(3)))
    t.maybe_send(0.0)
    assert t.state is S.PUSH_NEEDED and t.client_instance_id == INSTANCE
    due = t._sm.next_at
    t.maybe_send(due)                            # raises nothing; logged; tried again later
    assert t.state is S.PUSH_NEEDED and t._sm.next_at == due + INTERVAL_MS / 1000
    assert "building a push failed" in caplog.text and [n for n, _ in network.sent] == ["GetTelemetrySubscriptions"]


def test_pushes_carry_the_subscription_and_the_last_one_terminates():
    from kdaemon.client.telemetry import ClientTelemetry
    network = AnsweringNetwork({"GetTelemetrySubscriptions": answer(accepted_compression_types=[GZIP]),
                                "PushTelemetry": {"throttle_time_ms": 0, "error_code": 0}})
    points = [MetricPoint("org.apache.kafka.consumer.fetch.manager.records.consumed.total", SUM, 4),
              MetricPoint("org.apache.kafka.producer.record.send.total", SUM, 1)]      # not subscribed
    t = ClientTelemetry(network, lambda wire: points, lambda: {"group_id": "g"},
                        state=TelemetryStateMachine(random.Random(3)))
    t.maybe_send(0.0)
    t.maybe_send(t._sm.next_at)
    t.close(10**9, lambda timeout, until: None)
    assert t.state is S.TERMINATED and t.pushes == 2 and t.wire not in network.observers
    (_, get), (_, push), (_, last) = network.sent
    assert get == {"client_instance_id": uuid.UUID(int=0)}
    assert [(b["client_instance_id"], b["subscription_id"], b["compression_type"], b["terminating"])
            for b in (push, last)] == [(INSTANCE, 7, GZIP, False), (INSTANCE, 7, GZIP, True)]
    names = {m.name for rm in decoded(decompress(GZIP, push["metrics"])).resource_metrics
             for sm in rm.scope_metrics for m in sm.metrics}
    assert names == {"org.apache.kafka.consumer.fetch.manager.records.consumed.total",
                     "org.apache.kafka.consumer.fetch.manager.records.consumed.rate"}
