"""bench/groups' traces: the request timeline of a traced kdaemon member (``KdaemonTrace``,
installed in the member's child process) and librdkafka's debug log turned into the same kind of
timeline, printed by ``--trace``.

Only the standard library at module level: a member's child imports this module, and kdaemon
only once a trace is installed (never in a timed run).
"""

from __future__ import annotations

import re
import time
from pathlib import Path


# -- the kdaemon member's trace (child process) ---------------------------------------------------

class KdaemonTrace:
    """Request and connection timeline of one kdaemon consumer, taken by wrapping methods.

    Patched in the child only, never in timed runs.  Nothing in kdaemon is changed.  Every
    group request and answer (``GROUP_APIS``) also goes to ``on_group`` as a structured event
    (``group_event``), live, so the parent has them even from a member it later kills.
    """

    def __init__(self, on_group=None) -> None:
        self.events: list[tuple[float, str]] = []
        self.on_group = on_group

    def add(self, text: str) -> None:
        self.events.append((time.monotonic(), text))

    def install(self) -> None:
        import logging

        from kdaemon.client import connection, network

        trace = self
        send, connect, ready = network.NetworkClient.send, connection.BrokerConnection.connect, \
            connection.BrokerConnection._become_ready

        def traced_send(self, node_id, api, body, **kw):
            fut = send(self, node_id, api, body, **kw)
            name = api.name
            extra = ""
            if name == "Fetch":
                extra = f" ({sum(len(t['partitions']) for t in body.get('topics', ()))} partitions)"
            trace.add(f"send {name} to node {node_id}{extra}")
            if trace.on_group is not None and name in GROUP_APIS:
                trace.on_group(**group_event(name, "send", body))

            def done(value) -> None:
                version, resp = value
                if trace.on_group is not None and name in GROUP_APIS and isinstance(resp, dict):
                    trace.on_group(**group_event(name, "answer", resp))
                code = resp.get("error_code") if isinstance(resp, dict) else None
                if name == "FindCoordinator" and resp.get("coordinators"):
                    code = resp["coordinators"][0]["error_code"]
                if name == "Fetch":
                    n = sum(len(p.get("records") or b"") for t in resp.get("responses", ())
                            for p in t.get("partitions", ()))
                    trace.add(f"answer {name} v{version} ({n} record bytes)")
                else:
                    trace.add(f"answer {name} v{version}" + (f" error {code}" if code else ""))
            fut.add_callback(done)
            fut.add_errback(lambda exc: trace.add(f"failed {name}: {exc}"))
            return fut

        def traced_connect(self, now):
            trace.add(f"connect node {self.node_id} ({self.host}:{self.port})")
            return connect(self, now)

        def traced_ready(self, now):
            trace.add(f"node {self.node_id} ready (ApiVersions done)")
            return ready(self, now)

        network.NetworkClient.send = traced_send
        connection.BrokerConnection.connect = traced_connect
        connection.BrokerConnection._become_ready = traced_ready

        class ToTrace(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                trace.add(f"log {record.name.rsplit('.', 1)[-1]}: {record.getMessage()}")

        logger = logging.getLogger("kdaemon.client")
        logger.setLevel(logging.DEBUG)
        logger.addHandler(ToTrace())


# The group requests the decomposition follows (both protocols).
GROUP_APIS = ("ConsumerGroupHeartbeat", "Heartbeat", "JoinGroup", "SyncGroup", "LeaveGroup")


def _partitions(topic_partitions) -> list[int] | None:
    """A ConsumerGroupHeartbeat's ``topic_partitions`` (request: owned; answer: assigned) as
    partition numbers (the bench has one topic); None when the field says "unchanged"."""
    if topic_partitions is None:
        return None
    return sorted(p for t in topic_partitions for p in t["partitions"])


def group_event(api: str, direction: str, body: dict) -> dict:
    """One group request or answer, the fields the decomposition reads: the error, the member
    epoch, and for ConsumerGroupHeartbeat the partitions the member reports owning (request)
    or is assigned (answer; None: no assignment in this answer)."""
    out = {"api": api, "dir": direction, "error": body.get("error_code") or 0}
    if api == "ConsumerGroupHeartbeat":
        out["epoch"] = body.get("member_epoch")
        if direction == "send":
            out["owned"] = _partitions(body.get("topic_partitions"))
        else:
            assignment = body.get("assignment")
            out["assigned"] = None if assignment is None else _partitions(assignment["topic_partitions"])
    elif api == "JoinGroup" and direction == "answer":
        out["generation"] = body.get("generation_id")
    return out


# -- timelines ---------------------------------------------------------------------------------

# A librdkafka log line: %level|unix seconds.ms|FACILITY|client name| [thrd:name]: text
_RDKAFKA_LINE = re.compile(r"^%(\d)\|(\d+\.\d+)\|([A-Z0-9_]+)\|[^|]*\| \[thrd:([^\]]*)\]: (.*)$")
# librdkafka requests worth showing; Fetch only the first time it appears.
_RD_SHOWN = re.compile(r"(Sent|Received) (\w+?)(Request|Response) \(v(\d+)[^)]*?(?:rtt ([\d.]+)ms)?\)")


def confluent_timeline(log_path: str, wall_at_build: float, until_s: float) -> list[tuple[float, str]]:
    """Request send/answer lines from librdkafka's debug log, relative to the consumer's build."""
    out = []
    fetch_seen = 0
    for line in Path(log_path).read_text(errors="replace").splitlines():
        m = _RDKAFKA_LINE.match(line)
        if not m or "consumer" not in line.split("|", 4)[3]:
            continue
        rel = float(m.group(2)) - wall_at_build
        if rel > until_s + 0.05:
            break
        fac, thread, text = m.group(3), m.group(4), m.group(5)
        r = _RD_SHOWN.search(text)
        if fac in ("SEND", "RECV") and r:
            name = r.group(2)
            if name == "Fetch":
                fetch_seen += 1
                if fetch_seen > 2:
                    continue
            where = thread.split("/")[-1] if "/" in thread else thread
            verb = "send" if r.group(1) == "Sent" else "answer"
            rtt = f" (rtt {float(r.group(5)):.0f} ms)" if r.group(5) else ""
            out.append((rel, f"{verb} {name} v{r.group(4)} [{where}]{rtt}"))
        elif fac in ("CGRPJOINSTATE", "CGRPSTATE", "JOINGROUP", "ASSIGNDONE", "ASSIGNMENT", "HEARTBEAT", "REBALANCE"):
            out.append((rel, f"{fac.lower()}: {text[:110]}"))
    return out


def confluent_group_requests(log_path, wall_at_build: float, t_build: float) -> list[dict]:
    """The group requests and answers (``GROUP_APIS``) in a librdkafka member's debug log, as ``group`` events
    (group_event's shape, without content: librdkafka does not log the assignment an answer
    carries) on the members' monotonic time line: a log line's wall-clock time minus the wall
    clock at the consumer's build, plus the build's monotonic instant."""
    out = []
    for line in Path(log_path).read_text(errors="replace").splitlines():
        m = _RDKAFKA_LINE.match(line)
        if not m or m.group(3) not in ("SEND", "RECV"):
            continue
        r = _RD_SHOWN.search(m.group(5))
        if r and r.group(2) in GROUP_APIS:
            out.append({"event": "group", "api": r.group(2), "dir": "send" if r.group(1) == "Sent" else "answer",
                        "error": 0, "t": t_build + float(m.group(2)) - wall_at_build})
    return out


def kdaemon_timeline(trace: list, until_s: float) -> list[tuple[float, str]]:
    out, fetches = [], 0
    for rel, text in trace:
        if rel > until_s + 0.05:
            break
        if "Fetch" in text and "OffsetFetch" not in text:
            fetches += 1
            if fetches > 2:
                continue
        out.append((rel, text))
    return out


def print_timeline(title: str, events: list[tuple[float, str]], end_s: float, end_label: str) -> None:
    print(f"\n{title}  (ms from building the consumer; {end_label} at {end_s * 1000:.1f} ms)")
    last = 0.0
    for rel, text in events:
        gap = (rel - last) * 1000
        print(f"  {rel * 1000:9.1f}  (+{gap:7.1f})  {text}")
        last = rel
