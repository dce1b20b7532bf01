"""The client telemetry specs (KIP-714): GetTelemetrySubscriptions (key 71) and PushTelemetry
(key 72), which ``kdaemon.client.telemetry`` speaks.

No broker needed here (the pushes a real broker receives are checked in
tests/client/test_telemetry_kafka.py): both sides round-trip values that differ from the
defaults; the v0 layouts are written out by hand from Kafka's JSON; every truncation is a
DecodeError; and both specs are compared field by field with the JSON definitions of the Kafka
release the tests run (4.4), read from its kafka-clients jar.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis import api_by_key
from kdaemon.protocol.apis.get_telemetry_subscriptions import GET_TELEMETRY_SUBSCRIPTIONS
from kdaemon.protocol.apis.push_telemetry import PUSH_TELEMETRY
from kdaemon.protocol.errors import DecodeError, Errors
from kdaemon.protocol.primitives import Reader, encode_uvarint
from tests.protocol.hand_bytes import cstr, str16
from tests.protocol.kafka_json import assert_matches_release
from tests.protocol.spec_values import sample_value

APIS = (GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY)
SIDES = [pytest.param(api, side, id=f"{api.name}-{side}") for api in APIS for side in ("request", "response")]
NO_TAGS = b"\x00"
INSTANCE = uuid.UUID("5f0e4c1a-9b7d-4e21-8f3a-0c6d2b1e9a77")


def test_declared_keys_and_versions():
    assert [(a.key, a.min_version, a.max_version, str(a.flexible)) for a in APIS] == [
        (71, 0, 0, "0+"), (72, 0, 0, "0+")]
    assert api_by_key(71) is GET_TELEMETRY_SUBSCRIPTIONS and api_by_key(72) is PUSH_TELEMETRY
    assert (Errors.UNKNOWN_SUBSCRIPTION_ID, Errors.TELEMETRY_TOO_LARGE,
            Errors.THROTTLING_QUOTA_EXCEEDED) == (117, 118, 89)


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
@pytest.mark.parametrize("api, side", SIDES)
def test_round_trip(api, side, seed):
    s = getattr(api, side)
    body = sample_value(s, 0, True, seed)
    r = Reader(codec.encode(s, 0, True, body))
    assert codec.decode(s, 0, True, r) == body and r.remaining == 0


@pytest.mark.parametrize("api, side", SIDES)
def test_every_truncation_is_a_decode_error(api, side):
    s = getattr(api, side)
    data = codec.encode(s, 0, True, sample_value(s, 0, True, seed=1))
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(s, 0, True, Reader(data[:n]))


def test_get_telemetry_subscriptions_v0_bytes():
    data = messages.encode_request(GET_TELEMETRY_SUBSCRIPTIONS, 0, 7, "kd",
                                   {"client_instance_id": uuid.UUID(int=0)})
    body = (struct.pack(">hhi", 71, 0, 7) + str16("kd") + NO_TAGS    # request header v2
            + bytes(16) + NO_TAGS)
    assert data == struct.pack(">i", len(body)) + body
    answer = (struct.pack(">i", 7) + NO_TAGS                          # response header v1
              + struct.pack(">ih", 0, 0) + INSTANCE.bytes + struct.pack(">i", 1234)
              + encode_uvarint(3) + bytes([4, 3])                     # accepted: zstd, lz4
              + struct.pack(">ii", 60000, 1 << 20) + b"\x01"
              + encode_uvarint(3) + cstr("org.apache.kafka.consumer.") + cstr("")
              + NO_TAGS)
    decoded = messages.decode_response(GET_TELEMETRY_SUBSCRIPTIONS, 0, answer)
    assert decoded == {
        "throttle_time_ms": 0, "error_code": 0, "client_instance_id": INSTANCE,
        "subscription_id": 1234, "accepted_compression_types": [4, 3], "push_interval_ms": 60000,
        "telemetry_max_bytes": 1 << 20, "delta_temporality": True,
        "requested_metrics": ["org.apache.kafka.consumer.", ""]}
    assert messages.encode_response(GET_TELEMETRY_SUBSCRIPTIONS, 0, 7, decoded)[4:] == answer


def test_push_telemetry_v0_bytes():
    payload = b"\x0a\x03otl"
    data = messages.encode_request(PUSH_TELEMETRY, 0, 8, "kd", {
        "client_instance_id": INSTANCE, "subscription_id": -5, "terminating": True,
        "compression_type": 4, "metrics": payload})
    body = (struct.pack(">hhi", 72, 0, 8) + str16("kd") + NO_TAGS
            + INSTANCE.bytes + struct.pack(">i?b", -5, True, 4)
            + encode_uvarint(len(payload) + 1) + payload + NO_TAGS)
    assert data == struct.pack(">i", len(body)) + body
    answer = struct.pack(">i", 8) + NO_TAGS + struct.pack(">ih", 25, Errors.TELEMETRY_TOO_LARGE) + NO_TAGS
    assert messages.decode_response(PUSH_TELEMETRY, 0, answer) == {"throttle_time_ms": 25, "error_code": 118}


@pytest.mark.kafka
@pytest.mark.parametrize("api, side", [pytest.param(a, s, id=f"{a.name}{s.capitalize()}")
                                       for a in APIS for s in ("request", "response")])
def test_specs_match_kafka_json_definitions(api, side):
    assert_matches_release(api, side)
