"""Group members of three clients side by side, for the mixed-group suites on Apache Kafka.

Every member records the same things in the same shape, so a test can compare them:

* ``events``: the rebalance listener calls in order, ``(kind, frozenset of (topic, partition))``
  with kind ``assigned`` / ``revoked`` / ``lost``;
* ``assignment()``: what the member owns now, folded from those events (eager listeners revoke
  everything and assign everything; cooperative ones revoke and assign only what moves, so one
  rule fits both: owned = owned - revoked - lost + assigned);
* ``records``: (topic, partition, offset) of every record handed to the application;
* ``log.stamped``: the same listener calls with the ``time.monotonic()`` of the call (the Java
  peer stamps its own events with that clock), to order the calls of members in different
  processes on one machine (test_groups_consumer_protocol_kafka.py's never-shared check).

Every member takes ``group_protocol`` ("classic", the default, or KIP-848's "consumer").  Under
"consumer" the broker assigns (``group.remote.assignor`` / ``group_remote_assignor``; the
``assignor`` argument names it) and owns the session and heartbeat timing, so neither the
client-side assignor nor ``session.timeout.ms`` / ``heartbeat.interval.ms`` are set (Java and
librdkafka refuse them there).  With ``commit=True`` a member commits what it processed after
each poll (commit-after-process): ``KdProcessMember.commits`` and ``RdMember.commits`` keep the
offsets each successful commit carried.

``KdMember`` (kdaemon) and ``RdMember`` (librdkafka) each poll in their own thread, as a consumer
belongs to one thread; anything else a test wants from them (a commit, a look-up) goes through
``call(fn)``, which runs ``fn(consumer)`` on that thread between polls.  ``JavaMember`` wraps the
Java peer process (testkit/java_peer.py), whose events come over a pipe, and runs its
``committed()`` / ``commit()`` on the live consumer.  ``KdProcessMember`` is a kdaemon member in
a child process (testkit/kd_member_main.py), for a SIGKILL that leaves no LeaveGroup behind.

``describe_members(bootstrap, group)`` names every member's client id, which is how a test learns
whether the Java peer (whose member id it never sees) is the group's leader.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from confluent_kafka import Consumer as RdConsumer
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient

from kdaemon.client import Consumer, TopicPartition
from testkit.java_peer import JavaConsumerProcess

TP = tuple[str, int]
SESSION = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "500"}
KD_OPTIONS = dict(session_timeout_ms=6000, heartbeat_interval_ms=500, fetch_max_wait_ms=200,
                  auto_offset_reset="earliest", enable_auto_commit=False, retry_backoff_ms=50,
                  request_timeout_ms=15_000)
PROTOCOLS = ("classic", "consumer")


def _check_protocol(group_protocol: str) -> None:
    if group_protocol not in PROTOCOLS:
        raise ValueError(f"group_protocol {group_protocol!r} is not one of {PROTOCOLS}")


def kd_options(group_protocol: str, assignor: str | None, options: dict) -> dict:
    """kdaemon Consumer options for a test member: KD_OPTIONS, the protocol's assignor option,
    then ``options``.  Under "consumer" the broker owns session and heartbeat timing."""
    _check_protocol(group_protocol)
    opts = dict(KD_OPTIONS)
    if group_protocol == "consumer":
        del opts["session_timeout_ms"], opts["heartbeat_interval_ms"]
        opts["group_protocol"] = "consumer"
        if assignor is not None:
            opts["group_remote_assignor"] = assignor
    elif assignor is not None:
        opts["partition_assignment_strategy"] = (assignor,)
    opts.update(options)
    return opts


def _tps(partitions: Iterable) -> frozenset[TP]:
    return frozenset((tp[0], tp[1]) if isinstance(tp, tuple) else (tp.topic, tp.partition)
                     for tp in partitions)


class _Events:
    """The listener calls of one member and the assignment they add up to."""

    def __init__(self) -> None:
        self.events: list[tuple[str, frozenset[TP]]] = []
        self.stamped: list[tuple[float, str, frozenset[TP]]] = []   # (monotonic time, kind, partitions)
        self._lock = threading.Lock()

    def note(self, kind: str, partitions: Iterable, at: float | None = None) -> None:
        parts = _tps(partitions)
        with self._lock:
            self.events.append((kind, parts))
            self.stamped.append((time.monotonic() if at is None else at, kind, parts))

    def assignment(self) -> frozenset[TP]:
        owned: set[TP] = set()
        with self._lock:
            for kind, parts in self.events:
                if kind == "assigned":
                    owned |= parts
                else:
                    owned -= parts
        return frozenset(owned)

    def since(self, mark: int) -> list[tuple[str, frozenset[TP]]]:
        with self._lock:
            return list(self.events[mark:])

    def mark(self) -> int:
        with self._lock:
            return len(self.events)


class _PollingMember(threading.Thread):
    """A consumer polling on its own thread; ``call`` runs work on that thread."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.log = _Events()
        self.records: list[tuple[str, int, int]] = []
        self._calls: "queue.Queue[tuple[Callable, queue.Queue]]" = queue.Queue()
        self._stop_flag = threading.Event()
        self.error: BaseException | None = None

    @property
    def events(self) -> list[tuple[str, frozenset[TP]]]:
        return self.log.events

    def assignment(self) -> frozenset[TP]:
        return self.log.assignment()

    def call(self, fn: Callable, timeout: float = 60.0):
        """``fn(consumer)`` on the member's own thread; its result, or its exception re-raised."""
        if self.error is not None:
            raise AssertionError(f"{self.name} failed earlier") from self.error
        reply: queue.Queue = queue.Queue()
        self._calls.put((fn, reply))
        try:
            ok, value = reply.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"{self.name} did not run the call within {timeout} s "
                                 f"(error: {self.error!r})") from None
        if not ok:
            raise value
        return value

    def _run_calls(self, consumer) -> None:
        while True:
            try:
                fn, reply = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                reply.put((True, fn(consumer)))
            except BaseException as exc:  # handed to the caller
                reply.put((False, exc))

    def stop(self, timeout: float = 60.0) -> None:
        """Stop polling and close (leaving the group, unless static); re-raise a poll error."""
        self._stop_flag.set()
        self.join(timeout)
        assert not self.is_alive(), f"{self.name} did not stop within {timeout} s"
        if self.error is not None:
            raise self.error


class KdMember(_PollingMember):
    def __init__(self, bootstrap: str, group: str, *, topics: Iterable[str] | None = None,
                 pattern: str | None = None, assignor: str | None = "range", name: str = "kd",
                 group_protocol: str = "classic", observer: Callable | None = None,
                 close_membership: str = "default", **options) -> None:
        super().__init__(name)
        self.close_membership = close_membership   # Consumer.close(group_membership=...)
        opts = kd_options(group_protocol, assignor, options)
        opts.setdefault("client_id", name)
        self.consumer = Consumer(bootstrap, group_id=group, **opts)
        if observer is not None:   # sees every request and answer on the wire, from the first
            self.consumer._network.observers.append(observer)   # the public seam for tests
        self.topics = None if topics is None else list(topics)
        self.pattern = pattern
        self.start()

    # The rebalance listener: runs inside poll on this thread.
    def on_partitions_assigned(self, partitions) -> None:
        self.log.note("assigned", partitions)

    def on_partitions_revoked(self, partitions) -> None:
        self.log.note("revoked", partitions)

    def on_partitions_lost(self, partitions) -> None:
        self.log.note("lost", partitions)

    def run(self) -> None:
        c = self.consumer
        try:
            c.subscribe(self.topics, pattern=self.pattern, listener=self)
            while not self._stop_flag.is_set():
                for batch in c.poll(100).values():
                    self.records.extend((r.topic, r.partition, r.offset) for r in batch)
                self._run_calls(c)
        except BaseException as exc:  # surfaced by stop() and call()
            self.error = exc
        finally:
            c.close(group_membership=self.close_membership)


class RdMember(_PollingMember):
    def __init__(self, bootstrap: str, group: str, *, topics: Iterable[str], assignor: str | None = "range",
                 name: str = "rd", group_protocol: str = "classic", commit: bool = False, **conf) -> None:
        super().__init__(name)
        _check_protocol(group_protocol)
        config = {"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "topic.metadata.refresh.interval.ms": 2000, "fetch.wait.max.ms": 200,
                  "group.protocol": group_protocol}
        if group_protocol == "consumer":
            if assignor is not None:
                config["group.remote.assignor"] = assignor
        else:
            config.update(SESSION)
            if assignor is not None:
                config["partition.assignment.strategy"] = assignor
        config.update(conf)
        self.consumer = RdConsumer(config)
        self.topics = list(topics)
        self.commit = commit
        self.commits: list[dict[TP, int]] = []   # what each successful commit carried
        self.start()

    def run(self) -> None:
        c = self.consumer
        # librdkafka applies the assignment itself when the callbacks do not (incrementally
        # under cooperative-sticky).
        on_assign = lambda _c, ps: self.log.note("assigned", [(p.topic, p.partition) for p in ps])  # noqa: E731
        on_revoke = lambda _c, ps: self.log.note("revoked", [(p.topic, p.partition) for p in ps])  # noqa: E731
        on_lost = lambda _c, ps: self.log.note("lost", [(p.topic, p.partition) for p in ps])  # noqa: E731
        try:
            c.subscribe(self.topics, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
            while not self._stop_flag.is_set():
                processed: dict[TP, int] = {}
                for msg in c.consume(500, 0.1):
                    if msg.error():
                        raise KafkaException(msg.error())
                    self.records.append((msg.topic(), msg.partition(), msg.offset()))
                    processed[(msg.topic(), msg.partition())] = msg.offset() + 1
                if self.commit and processed:
                    # After processing, before the next poll (where a revocation would run).
                    c.commit(offsets=[RdTopicPartition(t, p, o) for (t, p), o in processed.items()],
                             asynchronous=False)
                    self.commits.append(processed)
                self._run_calls(c)
        except BaseException as exc:
            self.error = exc
        finally:
            c.close()


class JavaMember:
    """The Java KafkaConsumer in the group (the peer process); SIGTERM leaves, SIGKILL does not."""

    def __init__(self, bootstrap: str, group: str, *, topics: Iterable[str] | None = None,
                 pattern: str | None = None, regex: str | None = None, assignor: str | None = "range",
                 name: str = "java", instance_id: str | None = None, commit: bool = False,
                 settings: dict | None = None, group_protocol: str = "classic",
                 close_membership: str | None = None) -> None:
        self.name = name
        _check_protocol(group_protocol)
        conf = dict(SESSION) if group_protocol == "classic" else {}
        conf.update(settings or {})
        if pattern is not None:
            kw = dict(pattern=pattern)
        elif regex is not None:
            kw = dict(regex=regex)
        else:
            kw = dict(topics=list(topics or ()))
        self.proc = JavaConsumerProcess(bootstrap, group=group, assignor=assignor, instance_id=instance_id,
                                        commit=commit, client_id=name, settings=conf, commands=True,
                                        group_protocol=group_protocol, close_membership=close_membership, **kw)
        self._log = _Events()
        self._taken = 0

    def _pump(self) -> None:
        while True:
            try:
                event = self.proc.events.get_nowait()
            except queue.Empty:
                break
            self.proc.seen.append(event)
        for event in self.proc.seen[self._taken:]:
            if event["event"] in ("assigned", "revoked", "lost"):
                self._log.note(event["event"], [tuple(tp) for tp in event["partitions"]], event.get("t"))
        self._taken = len(self.proc.seen)

    @property
    def log(self) -> _Events:
        self._pump()
        return self._log

    @property
    def events(self) -> list[tuple[str, frozenset[TP]]]:
        return self.log.events

    def assignment(self) -> frozenset[TP]:
        return self.log.assignment()

    @property
    def records(self) -> list[tuple[str, int, int]]:
        return [(r.topic, r.partition, r.offset) for r in list(self.proc.records)]

    def committed(self, partitions: Iterable[TP]) -> dict[TP, tuple[int, str] | None]:
        """``committed()`` of the live Java consumer: (offset, metadata), None where none."""
        return self.proc.committed(partitions)

    def commit(self, offsets: dict[TP, tuple[int, str]]) -> None:
        self.proc.commit(offsets)

    @property
    def error(self) -> BaseException | None:
        code = self.proc.proc.poll()
        if code is None:
            return None
        return AssertionError(f"the Java member {self.name} exited {code}:\n{self.proc.stderr[-3000:]}")

    def stop(self) -> dict:
        return self.proc.stop()

    def kill(self) -> None:
        self.proc.kill()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, members=(),
               also: Callable[[], str] | None = None) -> None:
    """Poll ``predicate`` until true; fail naming ``what``, every member's state and ``also()``
    (e.g. what the broker logged about the group), or at once when a member has died."""
    deadline = time.monotonic() + timeout
    while True:
        for m in members:
            if m.error is not None:
                raise AssertionError(f"{m.name} failed while waiting for {what}") from m.error
        if predicate():
            return
        if time.monotonic() > deadline:
            state = "; ".join(f"{m.name}: owns {sorted(m.assignment())}, events {m.events[-6:]}"
                              for m in members)
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {state}"
                                 + (f"\n{also()}" if also else ""))
        time.sleep(0.1)


def set_group_session(bootstrap: str, group: str, session_ms: int, heartbeat_ms: int = 500) -> None:
    """A consumer-protocol group's own session timeout and heartbeat interval (KIP-848 group
    configs, IncrementalAlterConfigs on the GROUP resource): the broker decides both."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("consumer.session.timeout.ms", str(session_ms), incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("consumer.heartbeat.interval.ms", str(heartbeat_ms), incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([resource]).values():
        fut.result(30)


def all_partitions(topic: str, n: int) -> frozenset[TP]:
    return frozenset((topic, p) for p in range(n))


def split_is_complete(members, expected: frozenset[TP]) -> bool:
    """Every member owns something, no partition twice, and together all of ``expected``."""
    owned = [m.assignment() for m in members]
    return all(owned) and sum(map(len, owned)) == len(expected) and frozenset().union(*owned) == expected


def group_log(cluster, group: str, lines: int = 40) -> str:
    """The brokers' log lines about ``group`` (joins, rebalances and their reasons), the last few."""
    found = []
    for node in cluster.nodes.values():
        try:
            text = node.log_path.read_text(errors="replace")
        except OSError as exc:
            found.append(f"(log of node {node.node_id}: {exc})")
            continue
        found += [line for line in text.splitlines() if group in line]
    return "broker log for the group:\n" + "\n".join(found[-lines:])


def describe_members(bootstrap: str, group: str) -> dict[str, str]:
    """member id -> client id, as the coordinator describes the group."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_consumer_groups([group])[group].result(timeout=30)
    return {m.member_id: m.client_id for m in desc.members}


def rd_committed_of(consumer, partitions: Iterable[TP]) -> dict[TP, int | None]:
    """librdkafka's ``committed()`` offsets (run it on the member's thread), None where nothing is
    committed.  Not the metadata: confluent-kafka treats it as a NUL-terminated C string both ways
    (it commits the NUL, and reads up to one), so metadata another client committed comes back
    with whatever bytes follow it in memory."""
    found = consumer.committed([RdTopicPartition(t, p) for t, p in partitions], timeout=30)
    return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in found}


def kd_committed_of(consumer: Consumer, partitions: Iterable[TP]) -> dict[TP, tuple[int, str] | None]:
    """kdaemon's ``committed()`` (run it on the member's thread): (offset, metadata) per
    partition, None where nothing is committed."""
    found = consumer.committed([TopicPartition(t, p) for t, p in partitions], timeout_ms=30_000)
    return {(tp.topic, tp.partition): (None if om is None else (om.offset, om.metadata))
            for tp, om in found.items()}


class KdProcessMember:
    """A kdaemon member in a child process (testkit/kd_member_main.py), so a test can SIGKILL
    it: no close, no LeaveGroup, no last commit, as a crashed worker; or SIGSTOP it.

    With ``commit=True`` it commits each poll's records right after printing them: ``commits``
    holds what each successful commit carried, ``commit_failures`` (error type, text, offsets)
    the ones that raised.  ``epochs`` is (generation / member epoch, member id, stable,
    assignment) each time the member's ``group_state()`` changes, ``heartbeats`` the KIP-848
    ConsumerGroupHeartbeat requests and answers whose epoch or error changed (``("sent",
    epoch)``, ``("answer", error code, epoch)``).  ``stall()`` makes it SIGSTOP itself right
    after it printed a poll's records and before it commits them (``stalled`` then holds
    those records)."""

    def __init__(self, bootstrap: str, group: str, *, topics: Iterable[str], assignor: str | None = "range",
                 name: str = "kd-proc", group_protocol: str = "classic", commit: bool = False,
                 stall_file: str | None = None, **options) -> None:
        self.name = name
        opts = kd_options(group_protocol, assignor, options)
        opts.setdefault("client_id", name)
        self.stall_file = stall_file
        spec = {"bootstrap": bootstrap, "group": group, "topics": list(topics), "options": opts,
                "commit": commit, "stall_file": stall_file}
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen([sys.executable, "-m", "testkit.kd_member_main", json.dumps(spec)],
                                     cwd=root, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.log = _Events()
        self.records: list[tuple[str, int, int]] = []
        self.generations: list[tuple[int, str]] = []
        self.epochs: list[tuple[int, str, bool, frozenset[TP]]] = []
        self.heartbeats: list[tuple] = []
        self.commits: list[dict[TP, int]] = []
        self.commit_failures: list[tuple[str, str, dict[TP, int]]] = []
        self.stalled: list[tuple[str, int, int]] | None = None
        self.stalled_at: float | None = None  # monotonic time it stopped itself
        self.ended_at: float | None = None    # monotonic time of a SIGKILL, once it took effect
        self.lines: list[dict] = []           # everything it printed, in order
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def _read(self) -> None:
        def offsets(rows) -> dict[TP, int]:
            return {(t, p): o for t, p, o in rows}

        for line in self.proc.stdout:
            o = json.loads(line)
            self.lines.append(o)
            kind = o["event"]
            if kind == "generation":
                self.generations.append((o["generation"], o["member_id"]))
            elif kind == "epoch":
                self.epochs.append((o["epoch"], o["member_id"], o["stable"],
                                    frozenset(tuple(tp) for tp in o["assignment"])))
            elif kind == "heartbeat":
                self.heartbeats.append(tuple(o["what"]))
            elif kind == "records":
                self.records.extend(tuple(r) for r in o["records"])
            elif kind == "committed":
                self.commits.append(offsets(o["offsets"]))
            elif kind == "commit_failed":
                self.commit_failures.append((o["type"], o["error"], offsets(o["offsets"])))
            elif kind == "stalling":
                self.stalled = [tuple(r) for r in o["records"]]
                self.stalled_at = o["t"]
            elif kind in ("assigned", "revoked", "lost"):
                self.log.note(kind, [tuple(tp) for tp in o["partitions"]], o["t"])
            else:
                raise AssertionError(f"{self.name} printed an unknown event: {o}")

    def stall(self) -> None:
        """Ask the member to SIGSTOP itself between printing its next records and committing them."""
        if self.stall_file is None:
            raise ValueError(f"{self.name} was started without stall_file")
        Path(self.stall_file).touch()

    def is_stopped(self) -> bool:
        """True while the process is stopped (state T in /proc)."""
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    @property
    def events(self) -> list[tuple[str, frozenset[TP]]]:
        return self.log.events

    def assignment(self) -> frozenset[TP]:
        return self.log.assignment()

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    @property
    def error(self) -> BaseException | None:
        code = self.proc.poll()
        if code is None or code == -9:
            return None
        return AssertionError(f"the kdaemon member process {self.name} exited {code}:\n"
                              f"{''.join(self._stderr)[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the member vanishes without a word to the coordinator."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        if self.ended_at is None:
            self.ended_at = time.monotonic()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)   # a stopped member must run to see SIGTERM
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
