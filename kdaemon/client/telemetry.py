"""Client telemetry (KIP-714): a consumer pushes its metrics to a broker, as Java's and
librdkafka's do, for clusters with a ClientTelemetry plugin (``metric.reporters``).

On by default (``enable_metrics_push``, Java's ``enable.metrics.push``); a broker without the
plugin does not offer the APIs and the sender stops at its first request, quietly.  What it
sends and when is ``telemetry_state``'s (the table, the timers, the answer to each error); what
a push carries is ``telemetry_metrics``'s.  This module does the I/O: it never blocks the
consumer.  ``maybe_send`` is called from the consumer's poll loop and only sends (through the
consumer's own ``NetworkClient``, to the least loaded broker, staying with it while it is
connected); the answers come back as future callbacks on whichever thread drives the network
(the application's poll, or the heartbeat thread), which is why the state machine sits behind
its own lock (always taken after the network client's, never before).  ``close`` sends the
terminating push and waits for its answer within the consumer's close deadline.  When nothing
is due, ``maybe_send`` costs 0.3 µs (timeit, on the test machine), once per round of the poll
loop, not per record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from ..protocol.apis import GET_TELEMETRY_SUBSCRIPTIONS, PUSH_TELEMETRY
from ..protocol.compression import CODEC_NAMES
from ..protocol.errors import BrokerError, UnsupportedVersionError
from .network import NetworkClient
from .telemetry_metrics import MetricPoint, PushPayload, WireCounters, compressed
from .telemetry_state import STOP, TelemetryState, TelemetryStateMachine

log = logging.getLogger(__name__)


class ClientTelemetry:
    """The telemetry sender of one client.

    ``collect()`` returns the client's current metric points; ``resource()`` the attributes of
    the client as a whole (Java's: ``group_id``, ``group_instance_id``, ``group_member_id``,
    ``client_rack``), read at each push."""

    def __init__(self, network: NetworkClient, collect: Callable[[WireCounters], list[MetricPoint]],
                 resource: Callable[[], dict[str, str]], *, state: TelemetryStateMachine | None = None) -> None:
        self._network = network
        self._collect = collect
        self._resource = resource
        self._sm = state or TelemetryStateMachine()
        self._lock = threading.Lock()
        self._payload = PushPayload()
        self._node: int | None = None
        self.wire = WireCounters()
        network.observers.append(self.wire)
        self._warned: set[str] = set()
        self.pushes = 0                   # pushes answered without error (for tests and status)

    @property
    def state(self) -> TelemetryState:
        return self._sm.state

    @property
    def client_instance_id(self):
        """The id the broker gave this client (the zero UUID before the first subscription)."""
        return self._sm.client_instance_id

    @property
    def subscription(self):
        return self._sm.subscription

    # -- sending ------------------------------------------------------------------------------------

    def maybe_send(self, now: float | None = None) -> None:
        """Send the request that is due, if any; cheap when none is (one comparison)."""
        now = time.monotonic() if now is None else now
        if now < self._sm.next_at and self._sm.state is not TelemetryState.TERMINATING_PUSH_NEEDED:
            return
        # The node first, outside this sender's lock: answers arrive under the network client's
        # lock and then take this one, so this one is never held while waiting for that one.
        node = self._pick_node()
        if node is None:
            return                         # no broker known yet: the next poll tries again
        with self._lock:
            kind = self._sm.due(now)
            if kind is None:
                return
            if kind == "get":
                body = {"client_instance_id": self._sm.client_instance_id}
                api = GET_TELEMETRY_SUBSCRIPTIONS
            else:
                try:
                    body = self._push_body(now, terminating=kind == "terminating_push")
                except Exception:
                    # A fault of ours (as Java's "error constructing client telemetry payload"):
                    # consuming goes on, the push is tried again after the interval.
                    if "payload" not in self._warned:
                        self._warned.add("payload")
                        log.exception("client telemetry: building a push failed; trying again after the interval")
                    self._sm.push_skipped(now)
                    return
                if body is None:
                    return
                api = PUSH_TELEMETRY
            ticket = self._sm.sent(kind)
        fut = self._network.send(node, api, body)
        # The future gives (version, body).
        fut.add_callback(lambda answer, t=ticket, k=kind: self._answered(t, k, answer[1]))
        fut.add_errback(lambda exc, t=ticket: self._failed(t, exc))

    def _pick_node(self) -> int | None:
        if self._node is not None and self._network.is_ready(self._node):
            return self._node
        self._node = self._network.least_loaded_node()
        return self._node

    def _push_body(self, now: float, *, terminating: bool) -> dict | None:
        sub = self._sm.subscription
        assert sub is not None
        now_ns = time.time_ns()
        points = [p for p in self._payload.points_with_rates(self._collect(self.wire), now_ns) if sub.wants(p.name)]
        codec = sub.compression
        resource = self._resource()
        data = compressed(codec, self._payload.encode(points, resource, delta=sub.delta_temporality, now_ns=now_ns))
        if sub.telemetry_max_bytes > 0 and len(data) > sub.telemetry_max_bytes:
            # Too large: the per-topic and per-partition points go first.
            points = [p for p in points if not p.attributes]
            data = compressed(codec, self._payload.encode(points, resource, delta=sub.delta_temporality,
                                                          now_ns=now_ns))
            if len(data) > sub.telemetry_max_bytes:
                self._warn_once("too-large", "client telemetry: %d bytes of metrics do not fit the broker's "
                                "telemetry_max_bytes=%d even without per-partition figures; skipping this push",
                                len(data), sub.telemetry_max_bytes)
                self._sm.push_skipped(now)
                return None
        self._payload.pushed(points, now_ns)
        return {"client_instance_id": self._sm.client_instance_id, "subscription_id": sub.subscription_id,
                "terminating": terminating, "compression_type": codec, "metrics": data}

    # -- answers --------------------------------------------------------------------------------

    def _answered(self, ticket: int, kind: str, answer: dict) -> None:
        now = time.monotonic()
        with self._lock:
            before = self._sm.subscription
            if kind == "get":
                action = self._sm.get_answered(ticket, now, answer)
                after = self._sm.subscription
                if action is None and after is not None and after is not before:
                    if before is None or before.delta_temporality != after.delta_temporality:
                        self._payload.reset()
                    log.info("client telemetry: instance %s subscribed (id %d) to %s every %d ms, %s",
                             after.client_instance_id, after.subscription_id,
                             ", ".join(repr(m) for m in after.requested_metrics) or "no metrics",
                             after.push_interval_ms, CODEC_NAMES.get(after.compression, "?"))
            else:
                action = self._sm.push_answered(ticket, now, answer["error_code"])
                if not answer["error_code"]:
                    self.pushes += 1
            code = answer["error_code"]
        if code and action is not None:
            name = BrokerError(code).name
            if action == STOP:
                log.warning("client telemetry: the broker answered %s to %s; not pushing metrics any more",
                            name, "a subscription request" if kind == "get" else "a push")
            else:
                log.info("client telemetry: the broker answered %s; subscribing again", name)

    def _failed(self, ticket: int, exc: BaseException) -> None:
        unsupported = isinstance(exc, UnsupportedVersionError)
        with self._lock:
            self._sm.failed(ticket, time.monotonic(), unsupported=unsupported)
        if unsupported:
            log.debug("client telemetry off: %s", exc)
        else:
            self._warn_once(f"failed-{type(exc).__name__}",
                            "client telemetry: a request got no answer (%s); trying again after the push interval", exc)

    def _warn_once(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    # -- the end --------------------------------------------------------------------------------

    def close(self, deadline: float, drive: Callable[[float, Callable[[], bool]], None]) -> None:
        """Send the terminating push (with a subscription that pushes) and wait for its answer
        until ``deadline`` (monotonic), running the network with ``drive(timeout_s, until)``."""
        with self._lock:
            terminating = self._sm.close()
        if terminating:
            self.maybe_send()
            if self._sm.state is TelemetryState.TERMINATING_PUSH_NEEDED:
                self._warn_once("no-broker", "client telemetry: no broker to send the terminating push to")
            while self._sm.state is TelemetryState.TERMINATING_PUSH_IN_PROGRESS and time.monotonic() < deadline:
                drive(max(0.0, deadline - time.monotonic()), lambda: self._sm.finished)
            with self._lock:
                self._sm.give_up()
        if self._network.observers and self.wire in self._network.observers:
            self._network.observers.remove(self.wire)
