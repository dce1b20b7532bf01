"""The config specs: DescribeConfigs (key 32) and IncrementalAlterConfigs (key 44), which read
and set a group's own configs (``kdaemon.client.group_configs``).

No broker needed here (the real-broker round trip of every version is in
test_protocol_kafka.py): every version of both sides round-trips values that differ from the
defaults, with random nulls; IncrementalAlterConfigs' layouts are written out by hand from
Kafka's JSON (v0 classic, v1 flexible); and both specs are compared field by field (names,
order, versions, nullability, tags, defaults) with the JSON definitions of the Kafka release the
tests run (4.4), read from its kafka-clients jar.
"""

from __future__ import annotations

import struct

import pytest

from kdaemon.protocol import codec, messages
from kdaemon.protocol.apis import api_by_key
from kdaemon.protocol.apis.describe_configs import DESCRIBE_CONFIGS, RESOURCE_GROUP
from kdaemon.protocol.apis.incremental_alter_configs import (INCREMENTAL_ALTER_CONFIGS, OP_APPEND, OP_DELETE,
                                                             OP_SET, OP_SUBTRACT)
from kdaemon.protocol.errors import DecodeError, Errors
from kdaemon.protocol.primitives import Reader, encode_uvarint
from tests.protocol.hand_bytes import cstr, str16
from tests.protocol.kafka_json import assert_matches_release
from tests.protocol.spec_values import sample_value

APIS = (DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS)
SIDES = [pytest.param(api, v, side, id=f"{api.name}-v{v}-{side}")
         for api in APIS for v in range(api.min_version, api.max_version + 1)
         for side in ("request", "response")]
NO_TAGS = b"\x00"


def test_declared_ranges_and_op_types():
    assert (INCREMENTAL_ALTER_CONFIGS.key, INCREMENTAL_ALTER_CONFIGS.min_version,
            INCREMENTAL_ALTER_CONFIGS.max_version, str(INCREMENTAL_ALTER_CONFIGS.flexible)) == (44, 0, 1, "1+")
    assert api_by_key(44) is INCREMENTAL_ALTER_CONFIGS
    assert (OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT) == (0, 1, 2, 3)   # AlterConfigOp.OpType ids


@pytest.mark.parametrize("seed", (0, 1, 2, 3))
@pytest.mark.parametrize("api, version, side", SIDES)
def test_round_trip(api, version, side, seed):
    s = getattr(api, side)
    flexible = api.is_flexible(version)
    body = sample_value(s, version, flexible, seed)
    r = Reader(codec.encode(s, version, flexible, body))
    assert codec.decode(s, version, flexible, r) == body and r.remaining == 0


@pytest.mark.parametrize("api, version, side", SIDES)
def test_every_truncation_is_a_decode_error(api, version, side):
    s = getattr(api, side)
    flexible = api.is_flexible(version)
    data = codec.encode(s, version, flexible, sample_value(s, version, flexible, seed=1))
    for n in range(len(data)):
        with pytest.raises(DecodeError):
            codec.decode(s, version, flexible, Reader(data[:n]))


def test_incremental_alter_configs_v0_request_bytes():
    data = messages.encode_request(INCREMENTAL_ALTER_CONFIGS, 0, 9, "kd", {
        "resources": [{"resource_type": RESOURCE_GROUP, "resource_name": "sg", "configs": [
            {"name": "share.record.lock.duration.ms", "config_operation": OP_SET, "value": "15000"},
            {"name": "share.auto.offset.reset", "config_operation": OP_DELETE, "value": None}]}],
        "validate_only": True})
    body = (struct.pack(">hhi", 44, 0, 9) + str16("kd")              # request header v1
            + struct.pack(">i", 1) + struct.pack(">b", 32) + str16("sg")
            + struct.pack(">i", 2)
            + str16("share.record.lock.duration.ms") + struct.pack(">b", 0) + str16("15000")
            + str16("share.auto.offset.reset") + struct.pack(">b", 1) + str16(None)
            + b"\x01")
    assert data == struct.pack(">i", len(body)) + body


def test_incremental_alter_configs_v1_bytes():
    data = messages.encode_request(INCREMENTAL_ALTER_CONFIGS, 1, 10, "kd", {
        "resources": [{"resource_type": RESOURCE_GROUP, "resource_name": "sg", "configs": [
            {"name": "share.delivery.count.limit", "config_operation": OP_SET, "value": "3"}]}]})
    body = (struct.pack(">hhi", 44, 1, 10) + str16("kd") + NO_TAGS   # request header v2
            + encode_uvarint(2) + struct.pack(">b", 32) + cstr("sg")
            + encode_uvarint(2) + cstr("share.delivery.count.limit") + struct.pack(">b", 0) + cstr("3") + NO_TAGS
            + NO_TAGS
            + b"\x00" + NO_TAGS)
    assert data == struct.pack(">i", len(body)) + body
    answer = (struct.pack(">i", 10) + NO_TAGS                        # response header v1
              + struct.pack(">i", 0) + encode_uvarint(2)
              + struct.pack(">h", Errors.INVALID_CONFIG) + cstr("Value must be at least 2")
              + struct.pack(">b", 32) + cstr("sg") + NO_TAGS
              + NO_TAGS)
    decoded = messages.decode_response(INCREMENTAL_ALTER_CONFIGS, 1, answer)
    assert decoded == {"throttle_time_ms": 0, "responses": [
        {"error_code": 40, "error_message": "Value must be at least 2", "resource_type": 32, "resource_name": "sg"}]}
    assert messages.encode_response(INCREMENTAL_ALTER_CONFIGS, 1, 10, decoded)[4:] == answer


JSON_CASES = [pytest.param(api, side, id=f"{api.name}{side.capitalize()}")
              for api in APIS for side in ("request", "response")]


@pytest.mark.kafka
@pytest.mark.parametrize("api, side", JSON_CASES)
def test_specs_match_kafka_json_definitions(api, side):
    assert_matches_release(api, side)
