"""bench/groups' group members: one consumer per process, whichever client, behind one face.

Child side (``run_worker``, run by ``bench/groups --worker SPEC``): kdaemon's ``Consumer`` or
confluent-kafka's, subscribed to the bench topic with the rebalance protocol the spec names,
polling until the parent says stop (a line on stdin), then closing (leaving the group).  The
Java consumer is testkit/java/KafkaPeer.java's ``consume`` through testkit/java_peer.py.

Every member prints the same events, one JSON object a line, each stamped ``t`` with the
child's ``time.monotonic()`` (the Java peer: ``System.nanoTime()``, the same CLOCK_MONOTONIC on
Linux), so the parent puts every member's events on one time line:

* ``building``: right before the consumer object is built (imports done; the JVM started);
* ``assigned`` / ``revoked`` / ``lost`` with ``partitions``: from the rebalance callbacks, with
  the partitions the callback was given (the whole assignment under an eager protocol, what
  was added or taken away under an incremental one, as all three clients do);
* ``closing``: right before ``close()``;
* ``group`` (kdaemon, traced rounds only): one group request or answer, bench/groups/join_trace.py's
  ``group_event`` (api, send / answer, error, member epoch, owned / assigned partitions).

Parent side: ``PythonMember`` and ``JavaMember`` offer ``pid``, ``pump()`` (the events that
arrived, partitions as plain numbers), ``leave()`` (ask it to close; does not wait), ``kill()``
(SIGKILL: no leave), ``finish()`` (wait for it to exit, kill it if it does not).

Only the standard library at module level: a member's child imports nothing but its own client.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

# Rebalance protocol name -> (group protocol, assignor): the classic protocol's assignor runs in
# the group leader; the consumer protocol's (``group.remote.assignor``) in the broker.
PROTOCOLS = {"eager": ("classic", "range"),
             "cooperative": ("classic", "cooperative-sticky"),
             "consumer": ("consumer", "uniform")}
ASSIGNMENT_EVENTS = ("assigned", "revoked", "lost")
SCRIPT = Path(__file__).resolve().parent / "__main__.py"   # bench/groups


# -- the child ---------------------------------------------------------------------------------

class Emitter:
    """One JSON object per stdout line, flushed at once: the parent reacts to events live."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields) -> None:
        line = json.dumps({"event": event, "t": time.monotonic(), **fields}, default=str)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def _stop_on_stdin() -> threading.Event:
    """Set once the parent writes a line (or closes stdin): this member may close."""
    stop = threading.Event()

    def read() -> None:
        sys.stdin.readline()
        stop.set()
    threading.Thread(target=read, daemon=True).start()
    return stop


def worker_kdaemon(spec: dict, emit: Emitter) -> dict:
    import importlib

    from kdaemon.client import Consumer
    from bench.groups.join_trace import KdaemonTrace
    # Consumer() imports its group modules lazily, the first time one is built with a group_id.
    # Imported now, so that the clock, as for confluent-kafka, runs no imports.
    importlib.import_module("kdaemon.client.group.coordinator")

    # Traced: every group request and answer is also an event ("group"), for the decomposition.
    trace = KdaemonTrace(on_group=lambda **fields: emit("group", **fields)) if spec["trace"] else None
    if trace:
        trace.install()
    group_protocol, assignor = PROTOCOLS[spec["protocol"]]
    options = {"group_id": spec["group"], "group_instance_id": spec["instance_id"],
               "auto_offset_reset": "earliest", "enable_auto_commit": False}
    if group_protocol == "classic":
        options.update(session_timeout_ms=spec["session_ms"], heartbeat_interval_ms=spec["heartbeat_ms"],
                       partition_assignment_strategy=(assignor,))
    else:   # the broker sets the session timeout and the heartbeat interval, as for Java
        options.update(group_protocol=group_protocol, group_remote_assignor=assignor)
    stop = _stop_on_stdin()

    def callback(name: str):
        return lambda partitions: emit(name, partitions=sorted(tp.partition for tp in partitions))

    class Listener:
        on_partitions_revoked = staticmethod(callback("revoked"))
        on_partitions_assigned = staticmethod(callback("assigned"))
        on_partitions_lost = staticmethod(callback("lost"))

    emit("building")
    t_build = time.monotonic()
    consumer = Consumer(spec["bootstrap"], **options)
    consumer.subscribe([spec["topic"]], listener=Listener())
    records = 0
    while not stop.is_set():
        records += sum(len(v) for v in consumer.poll(spec["poll_ms"]).values())
    emit("closing")
    consumer.close()
    return {"records": records,
            "trace": [(t - t_build, text) for t, text in trace.events] if trace else None}


def worker_confluent(spec: dict, emit: Emitter) -> dict:
    from confluent_kafka import Consumer, KafkaError, KafkaException

    group_protocol, assignor = PROTOCOLS[spec["protocol"]]
    conf = {"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"],
            "auto.offset.reset": "earliest", "enable.auto.commit": False}
    if spec["instance_id"]:
        conf["group.instance.id"] = spec["instance_id"]
    if group_protocol == "classic":
        conf.update({"session.timeout.ms": spec["session_ms"], "heartbeat.interval.ms": spec["heartbeat_ms"],
                     "partition.assignment.strategy": assignor})
    else:   # librdkafka refuses the classic-only settings under the consumer protocol
        conf.update({"group.protocol": group_protocol, "group.remote.assignor": assignor})
    if spec["trace"]:
        conf.update({"debug": "cgrp,protocol", "log_level": 7})
    stop = _stop_on_stdin()

    def callback(name: str):
        return lambda consumer, partitions: emit(name, partitions=sorted(tp.partition for tp in partitions))

    wall_at_build = time.time()
    emit("building", wall=wall_at_build)   # the parent maps librdkafka's wall-clock log onto its time line
    consumer = Consumer(conf)
    consumer.subscribe([spec["topic"]], on_assign=callback("assigned"), on_revoke=callback("revoked"),
                       on_lost=callback("lost"))
    records = 0
    while not stop.is_set():
        msg = consumer.poll(spec["poll_ms"] / 1000)
        if msg is None:
            continue
        if msg.error() is None:
            records += 1
        elif msg.error().fatal() or msg.error().code() == KafkaError._FATAL:   # e.g. UNRELEASED_INSTANCE_ID
            raise KafkaException(msg.error())
        else:
            print(f"confluent-kafka: {msg.error()}", file=sys.stderr, flush=True)
    emit("closing")
    consumer.close()
    # librdkafka's debug log goes to stderr (the member's log); the parent reads it for --trace.
    return {"records": records, "wall_at_build": wall_at_build}


WORKERS = {"kdaemon": worker_kdaemon, "confluent": worker_confluent}


def run_worker(spec: dict) -> None:
    emit = Emitter()
    try:
        result = WORKERS[spec["client"]](spec, emit)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        emit("error", error=f"{type(exc).__name__}: {exc}")
        raise
    emit("result", **result)


# -- the parent's handles ----------------------------------------------------------------------

class MemberFailed(RuntimeError):
    """A member reported an error or exited unasked; ``name`` says which."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class _Member:
    """What both kinds of member share: the queue their reader fills, and the log."""

    client = ""

    def __init__(self, name: str, log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        self.events: queue.Queue = queue.Queue()
        self.result: dict = {}
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pump(self) -> list[dict]:
        """The events that arrived since the last call (an "error" among them: the caller raises
        ``MemberFailed``, once it has kept the others)."""
        out = []
        while True:
            try:
                ev = self.events.get_nowait()
            except queue.Empty:
                return out
            if ev.get("event") == "result":
                self.result = ev
            if "partitions" in ev:
                ev["partitions"] = [p[1] if isinstance(p, list) else p for p in ev["partitions"]]
            out.append(ev)

    def kill(self) -> None:
        """SIGKILL, by our own child's handle: the member gets no chance to leave."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(10)

    def finish(self, timeout: float = 30.0) -> None:
        """Wait for the member to exit (after ``leave``); kill it past ``timeout``."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"{self.client} member {self.name} did not exit within {timeout:g} s "
                               f"of being asked to leave; see {self.log_path}") from None


class PythonMember(_Member):
    """kdaemon or confluent-kafka in ``bench/groups --worker``; a line on stdin makes it leave."""

    def __init__(self, name: str, spec: dict, log_path: Path, env: dict) -> None:
        super().__init__(name, log_path)
        self.client = spec["client"]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT), "--worker", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     env=env, text=True, bufsize=1)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                continue
        self._log.close()

    def leave(self) -> None:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass


class JavaMember(_Member):
    """The Java KafkaConsumer: KafkaPeer's ``consume`` (testkit/java_peer.py); SIGTERM
    makes it close (its shutdown hook wakes the consumer up) and leave."""

    client = "java"

    def __init__(self, name: str, spec: dict, log_path: Path) -> None:
        from testkit.java_peer import JavaConsumerProcess
        super().__init__(name, log_path)
        group_protocol, assignor = PROTOCOLS[spec["protocol"]]
        settings = {}   # the Java consumer refuses the classic-only settings under the consumer protocol
        if group_protocol == "classic":
            settings = {"session.timeout.ms": str(spec["session_ms"]),
                        "heartbeat.interval.ms": str(spec["heartbeat_ms"])}
        self._peer = JavaConsumerProcess(spec["bootstrap"], topics=[spec["topic"]], group=spec["group"],
                                         assignor=assignor, instance_id=spec["instance_id"],
                                         group_protocol=group_protocol, print_records=False,
                                         client_id=f"gj-{name}", settings=settings)
        self.proc = self._peer.proc
        self.events = self._peer.events

    def leave(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        try:
            super().kill()
        finally:
            self.log_path.write_text(self._peer.stderr)

    def finish(self, timeout: float = 30.0) -> None:
        try:
            super().finish(timeout)
        finally:
            self.log_path.write_text(self._peer.stderr)


def start_member(name: str, spec: dict, log_path: Path, env: dict) -> _Member:
    if spec["client"] == "java":
        return JavaMember(name, spec, log_path)
    return PythonMember(name, spec, log_path, env)
