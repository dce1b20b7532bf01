"""A share consumer's settings: the consumer's, less what a share group decides, plus its own.

Parsed once into typed values (``ShareConsumerConfig``): the connection, fetch and security
options are ``ConsumerConfig``'s (same names, same checks); the two share options are
``share_acknowledgement_mode`` and ``share_acquire_mode`` (Java's ``share.acknowledgement.mode``
and ``share.acquire.mode``).  What Java's ``ShareConsumerConfig`` refuses is refused here, by
name and with the reason: in a share group the broker decides where reading starts
(``share.auto.offset.reset``), the isolation level (``share.isolation.level``) and the
session, and nothing is committed by offset.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ..config import ConsumerConfig
from .types import AcknowledgementMode, AcquireMode

# Consumer options a share consumer refuses when set (Java's ShareConsumerConfig), and why.
NOT_FOR_SHARE_GROUPS = {
    "auto_offset_reset": "a share group starts where its share.auto.offset.reset group config says "
                         "(latest by default); set it with kafka-configs --entity-type groups",
    "enable_auto_commit": "a share consumer commits acknowledgements, not offsets",
    "auto_commit_interval_ms": "a share consumer commits acknowledgements, not offsets",
    "group_instance_id": "share groups have no static members",
    "isolation_level": "the share group decides it (its share.isolation.level group config)",
    "partition_assignment_strategy": "the broker assigns share groups",
    "group_protocol": "a share consumer speaks the share group protocol only",
    "group_remote_assignor": "the broker assigns share groups",
    "session_timeout_ms": "the broker decides it (group.share.session.timeout.ms)",
    "heartbeat_interval_ms": "the broker decides it (group.share.heartbeat.interval.ms)",
    "rebalance_timeout_ms": "share groups do not rebalance by revocation",
    "on_commit": "use set_acknowledgement_commit_callback",
}


@dataclass(frozen=True)
class ShareConsumerConfig:
    consumer: ConsumerConfig
    acknowledgement_mode: AcknowledgementMode = AcknowledgementMode.IMPLICIT
    acquire_mode: AcquireMode = AcquireMode.BATCH_OPTIMIZED

    @classmethod
    def from_options(cls, **options: Any) -> "ShareConsumerConfig":
        """``ConsumerConfig`` options plus ``share_acknowledgement_mode`` and
        ``share_acquire_mode``; ``group_id`` is required."""
        problems = []
        mode = options.pop("share_acknowledgement_mode", AcknowledgementMode.IMPLICIT.value)
        acquire = options.pop("share_acquire_mode", AcquireMode.BATCH_OPTIMIZED.value)
        try:
            mode = AcknowledgementMode(mode)
        except ValueError:
            problems.append(f"share_acknowledgement_mode={mode!r} is not one of "
                            f"{', '.join(m.value for m in AcknowledgementMode)}")
        try:
            acquire = AcquireMode(acquire)
        except ValueError:
            problems.append(f"share_acquire_mode={acquire!r} is not one of "
                            f"{', '.join(m.value for m in AcquireMode)}")
        defaults = {f.name: f.default for f in fields(ConsumerConfig)}
        for name, why in NOT_FOR_SHARE_GROUPS.items():
            if name in options and options[name] != defaults.get(name):
                problems.append(f"{name} cannot be set on a share consumer: {why}")
            options.pop(name, None)
        if not options.get("group_id"):
            problems.append("group_id is required: a share consumer is always a member of a share group")
        if problems:
            raise ValueError("invalid share consumer configuration: " + "; ".join(problems))
        # A share group's records are locked for this member when fetched: nothing is committed
        # by offset, nothing is auto-committed.
        consumer = ConsumerConfig.from_options(enable_auto_commit=False, **options)
        return cls(consumer, mode, acquire)
