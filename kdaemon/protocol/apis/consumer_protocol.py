"""The embedded consumer protocol: what "consumer" groups put inside JoinGroup and SyncGroup bytes.

A member's JoinGroup ``protocols[].metadata`` is a ``ConsumerProtocolSubscription``; the leader's
SyncGroup ``assignments[].assignment`` (and every member's SyncGroup response ``assignment``) is a
``ConsumerProtocolAssignment``.  Both come from Kafka's ConsumerProtocolSubscription.json and
ConsumerProtocolAssignment.json: versions 0-3, never flexible, and on the wire each is preceded
by an int16 version.

Compatibility rule (from those files): a newer version may only append fields.  So, exactly like
Kafka's ``ConsumerProtocol``, a version newer than ours is decoded with our newest layout and
whatever follows is ignored; bytes after the known fields are ignored for every version, since
Kafka ignores them too.  A negative version, or bytes too short for the layout, raise
``DecodeError`` and nothing else.  An empty byte string is not an assignment: brokers send one
with SyncGroup errors, so callers look at the error code before decoding.

Decoded ``user_data`` is a slice of the input (a ``memoryview`` when the input is one, as it is
for bytes taken from a decoded response frame).  librdkafka sends empty, not null, user data.

Subscription versions: 1 adds ``owned_partitions`` (cooperative rebalancing, KIP-429), 2 adds
``generation_id`` (KIP-792), 3 adds ``rack_id`` (rack-aware assignment, KIP-881).  Assignment
versions 1-3 add no field; they exist to stay in step with the subscription.
"""

from __future__ import annotations

import struct
from typing import Any

from .. import codec
from ..errors import DecodeError, EncodeError
from ..primitives import Reader
from ..schema import BYTES, INT32, STRING, Array, Field, Struct

SUBSCRIPTION_VERSIONS = (0, 3)
ASSIGNMENT_VERSIONS = (0, 3)

CONSUMER_PROTOCOL_SUBSCRIPTION = Struct(
    Field("topics", Array(STRING)),
    Field("user_data", BYTES, nullable="0+", default=None),
    Field("owned_partitions", Array(Struct(
        Field("topic", STRING, "1+"),
        Field("partitions", Array(INT32), "1+"),
        name="TopicPartition",
    )), "1+"),
    Field("generation_id", INT32, "2+", default=-1),
    Field("rack_id", STRING, "3+", nullable="3+", default=None),
    name="ConsumerProtocolSubscription",
)

CONSUMER_PROTOCOL_ASSIGNMENT = Struct(
    Field("assigned_partitions", Array(Struct(
        Field("topic", STRING),
        Field("partitions", Array(INT32)),
        name="TopicPartition",
    ))),
    Field("user_data", BYTES, nullable="0+", default=None),
    name="ConsumerProtocolAssignment",
)

_VERSION = struct.Struct(">h")


def _encode(struct_: Struct, versions: tuple[int, int], what: str, version: int, value: dict) -> bytes:
    lo, hi = versions
    if not isinstance(version, int) or not lo <= version <= hi:
        raise EncodeError(f"{what} version {version!r} is outside the supported range {lo}-{hi}")
    return _VERSION.pack(version) + codec.encode(struct_, version, False, value)


def _decode(struct_: Struct, versions: tuple[int, int], what: str, data) -> tuple[int, dict[str, Any]]:
    r = Reader(data)
    try:
        version = r.int16()
    except DecodeError as exc:
        raise DecodeError(f"{what}: no version prefix ({exc})") from None
    if version < versions[0]:
        raise DecodeError(f"{what} version {version} is not valid (lowest is {versions[0]})")
    try:
        value = codec.decode(struct_, min(version, versions[1]), False, r)
    except DecodeError as exc:
        raise DecodeError(f"{what} v{version}: {exc}") from None
    return version, value


def encode_subscription(version: int, value: dict) -> bytes:
    """The JoinGroup protocol metadata for ``value`` at ``version`` (0-3), version prefix included."""
    return _encode(CONSUMER_PROTOCOL_SUBSCRIPTION, SUBSCRIPTION_VERSIONS, "ConsumerProtocolSubscription",
                   version, value)


def decode_subscription(data) -> tuple[int, dict[str, Any]]:
    """Return (version on the wire, subscription).  Fields come from min(version, 3)."""
    return _decode(CONSUMER_PROTOCOL_SUBSCRIPTION, SUBSCRIPTION_VERSIONS, "ConsumerProtocolSubscription",
                   data)


def encode_assignment(version: int, value: dict) -> bytes:
    """The SyncGroup assignment bytes for ``value`` at ``version`` (0-3), version prefix included."""
    return _encode(CONSUMER_PROTOCOL_ASSIGNMENT, ASSIGNMENT_VERSIONS, "ConsumerProtocolAssignment",
                   version, value)


def decode_assignment(data) -> tuple[int, dict[str, Any]]:
    """Return (version on the wire, assignment).  Fields come from min(version, 3)."""
    return _decode(CONSUMER_PROTOCOL_ASSIGNMENT, ASSIGNMENT_VERSIONS, "ConsumerProtocolAssignment", data)
