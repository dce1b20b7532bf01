"""Client telemetry (KIP-714): the state machine, its timers, and what each broker answer does.

Everything that moves the telemetry sender lives in this file (h11's rule); ``telemetry.py``
does the I/O and reports what came back.  Pure: no sockets, no clock of its own (every call
takes ``now``, monotonic seconds), so the tests drive it with numbers.  The rules follow the
KIP and Java's ``ClientTelemetryReporter``:

* **Subscribe first.**  GetTelemetrySubscriptions goes out at once, with the zero UUID; the
  broker assigns the client instance id, which every later request carries.  An answer with an
  empty ``requested_metrics`` subscribes to nothing: ask again after its push interval.  A list
  holding "" subscribes to every metric; otherwise a metric is pushed when its name starts with
  one of the prefixes ("*", as Java and the broker write "all", counts as "").
* **Push at the interval, the first push jittered.**  After each subscription the next push
  waits a random 0.5-1.5 of the push interval (so clients started together do not push
  together), later ones the interval itself.
* **Answers.**  UNKNOWN_SUBSCRIPTION_ID and UNSUPPORTED_COMPRESSION_TYPE: the subscription (or
  the accepted compression types) changed, ask again now.  TELEMETRY_TOO_LARGE and
  THROTTLING_QUOTA_EXCEEDED: ask again after the push interval.  INVALID_REQUEST,
  INVALID_RECORD, UNSUPPORTED_VERSION and any code the KIP does not name: a fault retrying will
  not mend, stop for good (DISABLED).  A broker that does not offer the APIs at all (no
  ClientTelemetry plugin) stops it quietly the same way.  A request that got no answer (a
  dropped connection, a timeout) asks again after the push interval (5 minutes before any
  subscription: Java's default).
* **Close.**  With a subscription that pushes, the last push goes out with ``terminating`` set
  and its answer, whatever it is, ends it (TERMINATED); without one nothing is sent.  An answer
  to a request sent before the close is ignored: only the terminating push's counts.

The states, and the table of (state, event) -> state; anything not in the table is a bug
(``IllegalTelemetryTransition``).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from enum import Enum

from ..protocol.compression import CODEC_NAMES, NONE
from ..protocol.errors import Errors

DEFAULT_PUSH_INTERVAL_MS = 300_000       # Java's, when the broker gave none (or none yet)
FIRST_PUSH_JITTER = (0.5, 1.5)           # of the push interval, after each subscription
UNSUPPORTED_COMPRESSION_TYPE = 76
ZERO_UUID = uuid.UUID(int=0)


class TelemetryState(Enum):
    SUBSCRIPTION_NEEDED = "subscription_needed"
    SUBSCRIPTION_IN_PROGRESS = "subscription_in_progress"
    PUSH_NEEDED = "push_needed"
    PUSH_IN_PROGRESS = "push_in_progress"
    TERMINATING_PUSH_NEEDED = "terminating_push_needed"
    TERMINATING_PUSH_IN_PROGRESS = "terminating_push_in_progress"
    TERMINATED = "terminated"     # closed
    DISABLED = "disabled"         # stopped for good: the broker cannot take our pushes


class TelemetryEvent(Enum):
    GET_SENT = "get_sent"
    SUBSCRIBED = "subscribed"                 # a subscription with metrics to push
    NOTHING_REQUESTED = "nothing_requested"   # a subscription to no metric: ask again later
    RETRY = "retry"                           # an answer or failure that asks to subscribe again
    PUSH_SENT = "push_sent"
    PUSHED = "pushed"
    STOP = "stop"                             # an error retrying will not mend
    CLOSE = "close"
    TERMINATING_PUSH_SENT = "terminating_push_sent"
    TERMINATING_PUSH_DONE = "terminating_push_done"   # answered, failed, or given up


S, E = TelemetryState, TelemetryEvent
_RUNNING = (S.SUBSCRIPTION_NEEDED, S.SUBSCRIPTION_IN_PROGRESS, S.PUSH_NEEDED, S.PUSH_IN_PROGRESS)

TRANSITIONS: dict[tuple[TelemetryState, TelemetryEvent], TelemetryState] = {
    (S.SUBSCRIPTION_NEEDED, E.GET_SENT): S.SUBSCRIPTION_IN_PROGRESS,
    (S.SUBSCRIPTION_IN_PROGRESS, E.SUBSCRIBED): S.PUSH_NEEDED,
    (S.SUBSCRIPTION_IN_PROGRESS, E.NOTHING_REQUESTED): S.SUBSCRIPTION_NEEDED,
    (S.SUBSCRIPTION_IN_PROGRESS, E.RETRY): S.SUBSCRIPTION_NEEDED,
    (S.PUSH_NEEDED, E.PUSH_SENT): S.PUSH_IN_PROGRESS,
    (S.PUSH_NEEDED, E.RETRY): S.SUBSCRIPTION_NEEDED,        # a payload that cannot be built
    (S.PUSH_IN_PROGRESS, E.PUSHED): S.PUSH_NEEDED,
    (S.PUSH_IN_PROGRESS, E.RETRY): S.SUBSCRIPTION_NEEDED,
    **{(s, E.STOP): S.DISABLED for s in _RUNNING},
    # Close: a terminating push only with a subscription that pushes.
    (S.SUBSCRIPTION_NEEDED, E.CLOSE): S.TERMINATED,
    (S.SUBSCRIPTION_IN_PROGRESS, E.CLOSE): S.TERMINATED,
    (S.PUSH_NEEDED, E.CLOSE): S.TERMINATING_PUSH_NEEDED,
    (S.PUSH_IN_PROGRESS, E.CLOSE): S.TERMINATING_PUSH_NEEDED,
    (S.TERMINATING_PUSH_NEEDED, E.TERMINATING_PUSH_SENT): S.TERMINATING_PUSH_IN_PROGRESS,
    (S.TERMINATING_PUSH_NEEDED, E.TERMINATING_PUSH_DONE): S.TERMINATED,
    (S.TERMINATING_PUSH_IN_PROGRESS, E.TERMINATING_PUSH_DONE): S.TERMINATED,
    # Closing twice, or closing what already stopped, changes nothing.
    **{(s, E.CLOSE): s for s in (S.TERMINATING_PUSH_NEEDED, S.TERMINATING_PUSH_IN_PROGRESS,
                                 S.TERMINATED, S.DISABLED)},
}


class IllegalTelemetryTransition(RuntimeError):
    """An event the telemetry table has no entry for in the current state: a bug."""


# What each error code in an answer (to either request) does, as the KIP's table and Java's
# ClientTelemetryUtils.maybeFetchErrorIntervalMs: "now" subscribes again at once, "interval"
# after the push interval, "stop" for good.  A code not here stops too (Java: "unmapped").
RESUBSCRIBE_NOW, RESUBSCRIBE_LATER, STOP = "now", "interval", "stop"
ERROR_ACTIONS: dict[int, str] = {
    Errors.UNKNOWN_SUBSCRIPTION_ID: RESUBSCRIBE_NOW,
    UNSUPPORTED_COMPRESSION_TYPE: RESUBSCRIBE_NOW,
    Errors.TELEMETRY_TOO_LARGE: RESUBSCRIBE_LATER,
    Errors.THROTTLING_QUOTA_EXCEEDED: RESUBSCRIBE_LATER,
    Errors.INVALID_REQUEST: STOP,
    Errors.INVALID_RECORD: STOP,
    Errors.UNSUPPORTED_VERSION: STOP,
}


@dataclass(frozen=True)
class Subscription:
    """One GetTelemetrySubscriptions answer, as the pushes use it."""

    client_instance_id: uuid.UUID
    subscription_id: int
    accepted_compression_types: tuple[int, ...]
    push_interval_ms: int
    telemetry_max_bytes: int
    delta_temporality: bool
    requested_metrics: tuple[str, ...]

    @property
    def pushes(self) -> bool:
        """False for a subscription to no metric (an empty list)."""
        return bool(self.requested_metrics)

    def wants(self, name: str) -> bool:
        """Whether the metric called ``name`` is subscribed: "" (the KIP's word for every metric,
        a prefix of every name) or "*" (Java's and the broker's) subscribes to all."""
        return any(prefix == "*" or name.startswith(prefix) for prefix in self.requested_metrics)

    @property
    def compression(self) -> int:
        """The first accepted compression type we can write (the broker lists them in its
        order of preference), or none when we know none of them."""
        return next((c for c in self.accepted_compression_types if c in CODEC_NAMES and c != NONE), NONE)


class TelemetryStateMachine:
    """The sender's state, its subscription, and when the next request is due.

    ``due(now)`` says which request to send ("get", "push", "terminating_push" or None); the
    caller sends it and reports ``sent(...)``, then the answer (``get_answered``,
    ``push_answered``) or that none came (``failed``), each with the ticket ``sent`` returned:
    an answer whose ticket is not the latest is stale (the close overtook it) and ignored.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self.state = TelemetryState.SUBSCRIPTION_NEEDED
        self.subscription: Subscription | None = None
        self.client_instance_id = ZERO_UUID
        self.next_at = 0.0               # monotonic time the next request is due
        self.stopped_because: str | None = None
        self._ticket = 0
        self._rng = rng or random.Random()

    # -- the table ------------------------------------------------------------------------------

    def apply(self, event: TelemetryEvent) -> TelemetryState:
        try:
            new = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTelemetryTransition(
                f"client telemetry cannot handle {event.value} in state {self.state.value}") from None
        self.state = new
        return new

    # -- what to send ---------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.state in (S.TERMINATED, S.DISABLED)

    def due(self, now: float) -> str | None:
        if self.state is S.TERMINATING_PUSH_NEEDED:
            return "terminating_push"
        if now < self.next_at:
            return None
        if self.state is S.SUBSCRIPTION_NEEDED:
            return "get"
        if self.state is S.PUSH_NEEDED:
            return "push"
        return None

    def sent(self, kind: str) -> int:
        """``kind`` (as ``due`` named it) went out; the ticket its answer must carry."""
        self.apply({"get": E.GET_SENT, "push": E.PUSH_SENT,
                    "terminating_push": E.TERMINATING_PUSH_SENT}[kind])
        self._ticket += 1
        return self._ticket

    def _current(self, ticket: int) -> bool:
        return ticket == self._ticket

    # -- answers --------------------------------------------------------------------------------

    def get_answered(self, ticket: int, now: float, body: dict) -> str | None:
        """A GetTelemetrySubscriptions answer; returns the error action taken, if any."""
        if not self._current(ticket) or self.state is not S.SUBSCRIPTION_IN_PROGRESS:
            return None
        if body["error_code"]:
            return self._error(now, body["error_code"])
        if body["client_instance_id"] != ZERO_UUID:
            self.client_instance_id = body["client_instance_id"]
        interval_ms = body["push_interval_ms"] if body["push_interval_ms"] > 0 else DEFAULT_PUSH_INTERVAL_MS
        self.subscription = Subscription(
            client_instance_id=self.client_instance_id, subscription_id=body["subscription_id"],
            accepted_compression_types=tuple(body["accepted_compression_types"]),
            push_interval_ms=interval_ms, telemetry_max_bytes=body["telemetry_max_bytes"],
            delta_temporality=body["delta_temporality"],
            requested_metrics=tuple(body["requested_metrics"]))
        if self.subscription.pushes:
            self.apply(E.SUBSCRIBED)
            self.next_at = now + self._rng.uniform(*FIRST_PUSH_JITTER) * interval_ms / 1000
        else:
            self.apply(E.NOTHING_REQUESTED)
            self.next_at = now + interval_ms / 1000
        return None

    def push_answered(self, ticket: int, now: float, error_code: int) -> str | None:
        """A PushTelemetry answer; returns the error action taken, if any."""
        if self.state is S.TERMINATING_PUSH_IN_PROGRESS and self._current(ticket):
            self.apply(E.TERMINATING_PUSH_DONE)
            return None
        if not self._current(ticket) or self.state is not S.PUSH_IN_PROGRESS:
            return None
        if error_code:
            return self._error(now, error_code)
        self.apply(E.PUSHED)
        self.next_at = now + self._interval_s()
        return None

    def failed(self, ticket: int, now: float, *, unsupported: bool) -> None:
        """No answer came: the connection dropped, the request timed out, or (``unsupported``)
        the broker does not offer the API at all."""
        if not self._current(ticket):
            return
        if self.state is S.TERMINATING_PUSH_IN_PROGRESS:
            self.apply(E.TERMINATING_PUSH_DONE)
        elif self.state in (S.SUBSCRIPTION_IN_PROGRESS, S.PUSH_IN_PROGRESS):
            if unsupported:
                self.stopped_because = "the broker does not offer client telemetry (no ClientTelemetry plugin)"
                self.apply(E.STOP)
            else:
                self.apply(E.RETRY)
                self.next_at = now + self._interval_s()

    def _error(self, now: float, code: int) -> str:
        action = ERROR_ACTIONS.get(code, STOP)
        if action == STOP:
            self.stopped_because = f"the broker answered error {code}"
            self.apply(E.STOP)
        else:
            self.apply(E.RETRY)
            self.next_at = now if action == RESUBSCRIBE_NOW else now + self._interval_s()
        return action

    def _interval_s(self) -> float:
        ms = self.subscription.push_interval_ms if self.subscription else DEFAULT_PUSH_INTERVAL_MS
        return ms / 1000

    # -- the end --------------------------------------------------------------------------------

    def push_skipped(self, now: float) -> None:
        """A due push had nothing that fits ``telemetry_max_bytes``: try again after the interval
        (as the broker's TELEMETRY_TOO_LARGE asks), or end the close."""
        if self.state is S.TERMINATING_PUSH_NEEDED:
            self.apply(E.TERMINATING_PUSH_DONE)
        else:
            self.next_at = now + self._interval_s()

    def close(self) -> bool:
        """The client closes: True when a terminating push is now due."""
        self.apply(E.CLOSE)
        return self.state is S.TERMINATING_PUSH_NEEDED

    def give_up(self) -> None:
        """The close's deadline passed before the terminating push was answered."""
        if self.state in (S.TERMINATING_PUSH_NEEDED, S.TERMINATING_PUSH_IN_PROGRESS):
            self.apply(E.TERMINATING_PUSH_DONE)

    def __repr__(self) -> str:
        return f"<TelemetryStateMachine {self.state.value}>"
