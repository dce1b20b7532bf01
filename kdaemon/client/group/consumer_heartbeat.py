"""The KIP-848 heartbeat, pure: what the next ConsumerGroupHeartbeat carries, and when it is due.

``HeartbeatRequestState`` builds request bodies that carry only the fields that changed since
the coordinator last *acknowledged* a request (Java's ``HeartbeatState``/``sentFields``): every
field the member does not repeat is sent as null (or -1), meaning "unchanged".  A request is
full after a join (member epoch 0), an error, a lost connection or a coordinator change: the
coordinator we talk to may never have seen the earlier fields.  ``group_id``, ``member_id``,
``member_epoch`` and a static member's ``instance_id`` are in every request (Java sets the
instance id whenever there is one; tests/client/test_kip848_wire_parity_kafka.py compares).

``ConsumerHeartbeatTimer`` keeps the deadlines, as ``heartbeat.HeartbeatTimer`` does for the
classic protocol, but the interval comes from the broker (each answer's
``heartbeat_interval_ms``) and there is no client-side session timeout: the coordinator fences a
member it has not heard from (``group.consumer.session.timeout.ms``) and says so in its next
answer.  Every method takes ``now``; nothing here reads a clock or does I/O.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

# member_epoch values with a meaning of their own (KIP-848)
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2

Owned = tuple[tuple[uuid.UUID, tuple[int, ...]], ...]


@dataclass(frozen=True)
class MemberFields:
    """What a member tells the coordinator about itself."""

    instance_id: str | None
    rack_id: str | None
    rebalance_timeout_ms: int
    subscribed_topic_names: tuple[str, ...] | None   # sorted; None under a regex subscription
    subscribed_topic_regex: str | None               # None under a topic-list subscription
    server_assignor: str | None
    owned: Owned


class HeartbeatRequestState:
    """The fields the coordinator has acknowledged, and the next request built against them."""

    def __init__(self) -> None:
        self._acknowledged: MemberFields | None = None

    def reset(self) -> None:
        """The next request is full (an error, a disconnect, a new coordinator, a rejoin)."""
        self._acknowledged = None

    def acknowledged(self, fields: MemberFields) -> None:
        """The coordinator answered a request built from ``fields`` without error."""
        self._acknowledged = fields

    def build(self, group_id: str, member_id: str, member_epoch: int, fields: MemberFields) -> dict:
        last = None if member_epoch == JOIN_EPOCH else self._acknowledged

        def changed(name: str) -> bool:
            return last is None or getattr(last, name) != getattr(fields, name)

        body: dict = {"group_id": group_id, "member_id": member_id, "member_epoch": member_epoch,
                      "instance_id": fields.instance_id,
                      "rack_id": fields.rack_id if changed("rack_id") else None,
                      "rebalance_timeout_ms": fields.rebalance_timeout_ms if changed("rebalance_timeout_ms") else -1,
                      "subscribed_topic_names": None, "subscribed_topic_regex": None,
                      "server_assignor": fields.server_assignor if changed("server_assignor") else None,
                      "topic_partitions": None}
        if fields.subscribed_topic_regex is not None:
            if changed("subscribed_topic_regex"):
                body["subscribed_topic_regex"] = fields.subscribed_topic_regex
            if last is not None and last.subscribed_topic_names:
                body["subscribed_topic_names"] = []          # a topic list replaced by a regex
        else:
            if changed("subscribed_topic_names"):
                body["subscribed_topic_names"] = list(fields.subscribed_topic_names or ())
            if last is not None and last.subscribed_topic_regex is not None:
                body["subscribed_topic_regex"] = ""          # a regex replaced by a topic list
        if member_epoch == JOIN_EPOCH:
            body["topic_partitions"] = []                    # a joining member owns nothing
        elif changed("owned"):
            body["topic_partitions"] = [{"topic_id": tid, "partitions": list(ps)} for tid, ps in fields.owned]
        return body


def leave_request(group_id: str, member_id: str, instance_id: str | None, *, for_good: bool = False) -> dict:
    """A leave: epoch -1, or -2 for a static member that will come back (its assignment is kept
    for it until the session times out).  ``for_good``: a static member that is not coming back
    leaves with -1 too (naming its instance id), so its partitions move at once."""
    static_stays = instance_id is not None and not for_good
    return {"group_id": group_id, "member_id": member_id,
            "member_epoch": LEAVE_STATIC_EPOCH if static_stays else LEAVE_EPOCH,
            "instance_id": instance_id}


class ConsumerHeartbeatTimer:
    """When the next heartbeat goes out, in seconds of the monotonic clock."""

    def __init__(self, *, max_poll_interval_ms: int, now: float, interval_ms: int = 5000) -> None:
        self.interval = interval_ms / 1000      # until the first answer says otherwise
        self.max_poll_interval = max_poll_interval_ms / 1000
        self.last_sent = 0.0
        self.last_poll = now
        self.last_answer = now   # the last answer without error (it proved the membership)
        self.in_flight = False
        self.retry_at = 0.0

    def sent(self, now: float) -> None:
        self.in_flight = True
        self.last_sent = now

    def received(self, interval_ms: int, *, now: float) -> None:
        """An answer without error; it names the interval the broker wants."""
        self.in_flight = False
        self.last_answer = now
        self.retry_at = 0.0
        if interval_ms > 0:
            self.interval = interval_ms / 1000

    def failed(self, now: float, backoff: float) -> None:
        """An error answer or no answer: try again after ``backoff`` seconds."""
        self.in_flight = False
        self.retry_at = now + backoff

    def polled(self, now: float) -> None:
        self.last_poll = now

    def poll_timeout_expired(self, now: float) -> bool:
        return now - self.last_poll > self.max_poll_interval

    def until_due(self, now: float) -> float | None:
        """Seconds until the interval's heartbeat is due; None while one is in flight."""
        if self.in_flight:
            return None
        return max(0.0, self.retry_at - now, self.last_sent + self.interval - now)

    def due(self, now: float, *, urgent: bool) -> bool:
        """A heartbeat may go now: none in flight, no retry backoff running, and the interval
        passed or there is news (a join, an acknowledgement, a subscription change)."""
        if self.in_flight or now < self.retry_at:
            return False
        return urgent or now - self.last_sent >= self.interval
