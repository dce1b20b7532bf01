"""The Java KafkaConsumer and KafkaProducer beside kdaemon: testkit/java/KafkaPeer.java, run as a child.

``peer_command()`` compiles the peer with ``javac`` against the jars of the same Maven resolution
as the broker (``apache_kafka.kafka_jars()``), once per source hash, into the cache next to them,
and returns the ``java`` command line that runs it.  Tests and benchmarks use:

* ``java_consume(bootstrap, assign=[(t, p)], until_end=True, isolation=...)`` → ``JavaRun`` with
  the records (``JavaRecord``, the fields of a Java ``ConsumerRecord``) and the end event;
* ``JavaConsumerProcess`` for a long-running group member: events as they come (assigned,
  revoked, lost, committed; each with ``t``, the peer's monotonic clock, which is Python's
  ``time.monotonic()``), subscribed to topics, a client-side ``pattern`` or (consumer protocol)
  a broker-side RE2J ``regex``, ``stop()`` by SIGTERM (the peer commits if asked and closes, leaving
  the group; ``close_membership`` "leave" / "remain" closes with Java's
  ``CloseOptions.groupMembershipOperation`` LEAVE_GROUP / REMAIN_IN_GROUP); with ``commands=True`` its ``committed()`` and ``commit()`` run on the live consumer;
* ``JavaShareConsumerProcess`` for a member of a share group (KIP-932): its records carry
  ``delivery_count``;
* ``java_offsets_for_times(bootstrap, [(t, p, ts)])``;
* ``java_produce(bootstrap, topic, ops)``: records and transaction markers through the Java
  producer, returning the acknowledgements in input order.

Everything the peer prints is one JSON object a line; bytes travel as base64 with null kept.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testkit import jvm_archive
from testkit.apache_kafka import cache_dir, compiled_jar, java_binary, kafka_classpath
from testkit.shared import locked

SOURCE = Path(__file__).resolve().parent / "java" / "KafkaPeer.java"
MAIN_CLASS = "KafkaPeer"
JAR = "kafka-peer.jar"
_LOG4J2 = """<Configuration status="warn"><Appenders><Console name="err" target="SYSTEM_ERR">
<PatternLayout pattern="[java-peer %d{HH:mm:ss,SSS}] %p %m (%c{1})%n"/></Console></Appenders>
<Loggers><Root level="WARN"><AppenderRef ref="err"/></Root></Loggers></Configuration>
"""


class JavaPeerError(RuntimeError):
    """The Java peer failed; the message carries its stderr."""


def peer_command(heap: str = "256m") -> list[str]:
    """``java ... KafkaPeer`` (compiled on first use), ready for a sub-command and its options."""
    # Compiled once per machine: the workers of a test run (processes) and their threads wait
    # for each other instead of writing one another's partial output.
    with locked(cache_dir() / "peer.lock"):
        classes = _compiled()
    log4j = classes / "log4j2-peer.xml"
    if not log4j.exists():
        log4j.write_text(_LOG4J2)
    classpath = os.pathsep.join([str(classes / JAR), kafka_classpath()])
    return [java_binary(), f"-Xmx{heap}", f"-Dlog4j2.configurationFile={log4j}",
            *jvm_archive.flags("peer", classpath), "-cp", classpath, MAIN_CLASS]


def _compiled() -> Path:
    """The compiled peer's directory: its classes in ``JAR`` (a class path of jars only is one
    the JDK can map a class-data archive for: testkit/jvm_archive.py)."""
    return compiled_jar(SOURCE, "peer", JAR, JavaPeerError).parent


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


@dataclass(frozen=True)
class JavaRecord:
    """A ``ConsumerRecord<byte[], byte[]>`` as the Java consumer returned it."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: str            # "CreateTime" / "LogAppendTime" (Java's TimestampType.name)
    leader_epoch: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int | None = None   # a share consumer's (KafkaShareConsumer) records only
    poll: int | None = None             # share --verdicts: the poll that returned it (1, 2, ...)
    verdict: str | None = None          # share --verdicts: how it was acknowledged ("accept" ...: Java's toString)

    @classmethod
    def from_json(cls, o: dict) -> "JavaRecord":
        return cls(o["topic"], o["partition"], o["offset"], o["timestamp"], o["timestamp_type"],
                   o["leader_epoch"], _unb64(o["key"]), _unb64(o["value"]),
                   tuple((k, _unb64(v)) for k, v in o["headers"]), o.get("delivery_count"), o.get("poll"),
                   o.get("verdict"))


@dataclass
class JavaRun:
    records: list[JavaRecord]
    events: list[dict]
    end: dict
    stderr: str = ""

    def positions(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.end.get("positions", [])}

    def lags(self) -> dict[tuple[str, int], int | None]:
        """``KafkaConsumer.currentLag`` per partition at the end (None: not known yet)."""
        return {(t, p): lag for t, p, lag in self.end.get("lags", [])}

    def committed(self) -> dict[tuple[str, int], int]:
        return {(t, p): o for t, p, o in self.end.get("committed", [])}


def _consume_args(bootstrap: str, *, assign: Iterable[tuple[str, int]] | None = None,
                  topics: Sequence[str] | None = None, pattern: str | None = None,
                  regex: str | None = None, group: str | None = None, assignor: str | None = None,
                  instance_id: str | None = None,
                  group_protocol: str = "classic", isolation: str = "read_uncommitted",
                  reset: str = "earliest", until_end: bool = False, max_records: int | None = None,
                  idle_ms: int | None = None, commit: bool = False, print_records: bool = True,
                  client_id: str | None = None, commands: bool = False, close_membership: str | None = None,
                  settings: dict[str, str] | None = None) -> list[str]:
    args = ["consume", "--bootstrap", bootstrap, "--isolation", isolation, "--reset", reset,
            "--group-protocol", group_protocol]
    if assign is not None:
        args += ["--assign", ",".join(f"{t}:{p}" for t, p in assign)]
    elif pattern is not None:
        args += ["--pattern", pattern]
    elif regex is not None:
        if group_protocol != "consumer":
            raise ValueError("regex= is the broker-side (RE2J) subscription of group_protocol='consumer'; "
                             "use pattern= with the classic protocol")
        args += ["--regex", regex]
    elif topics:
        args += ["--topics", ",".join(topics)]
    else:
        raise ValueError("give assign=, topics=, pattern= or regex=")
    for flag, value in (("--group", group), ("--assignor", assignor), ("--instance-id", instance_id),
                        ("--max-records", max_records), ("--idle-ms", idle_ms), ("--client-id", client_id),
                        ("--close-membership", close_membership)):
        if value is not None:
            args += [flag, str(value)]
    if until_end:
        args.append("--until-end")
    if commit:
        args += ["--commit", "sync"]
    if print_records:
        args.append("--print")
    if commands:
        args.append("--commands")
    for k, v in (settings or {}).items():
        args += ["--set", f"{k}={v}"]
    return args


def _split(lines: Iterable[str]) -> tuple[list[JavaRecord], list[dict], dict]:
    records, events, end = [], [], {}
    for line in lines:
        if not line.strip():
            continue
        o = json.loads(line)
        if "event" not in o:
            records.append(JavaRecord.from_json(o))
        elif o["event"] == "end":
            end = o
        else:
            events.append(o)
    return records, events, end


def java_consume(bootstrap: str, *, timeout: float = 120.0, **options) -> JavaRun:
    """Run the Java consumer to completion (``until_end``, ``max_records`` or ``idle_ms``)."""
    cmd = peer_command() + _consume_args(bootstrap, **options)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise JavaPeerError(f"the Java consumer exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    records, events, end = _split(proc.stdout.splitlines())
    if not end:
        raise JavaPeerError(f"the Java consumer printed no end event:\n{proc.stderr[-4000:]}")
    return JavaRun(records, events, end, proc.stderr)


class JavaConsumerProcess:
    """A Java consumer running in the background (group tests): events arrive on ``events``."""

    def __init__(self, bootstrap: str, **options) -> None:
        options.setdefault("print_records", True)
        self._start(_consume_args(bootstrap, **options), options.get("commands", False))

    def _start(self, args: list[str], commands: bool) -> None:
        self._commands = commands
        self.proc = subprocess.Popen(peer_command() + args,
                                     stdin=subprocess.PIPE if self._commands else subprocess.DEVNULL,
                                     stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.records: list[JavaRecord] = []
        self.events: "queue.Queue[dict]" = queue.Queue()
        self.end: dict = {}
        self.seen: list[dict] = []   # events wait_event() has taken off the queue, in order
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._err = threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True)
        self._err.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            o = json.loads(line)
            if "event" not in o:
                self.records.append(JavaRecord.from_json(o))
            elif o["event"] == "end":
                self.end = o
            else:
                self.events.put(o)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)

    def wait_event(self, name: str, timeout: float = 60.0, predicate=None) -> dict:
        """The next event called ``name`` (every event taken is kept in ``seen``); JavaPeerError on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and self.events.empty()):
                raise JavaPeerError(f"no {name!r} event from the Java consumer within {timeout} s "
                                    f"(exit {self.proc.poll()}):\n{self.stderr[-3000:]}")
            try:
                event = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self.seen.append(event)
            if event["event"] == name and (predicate is None or predicate(event)):
                return event

    def _command(self, command: dict, reply: str, timeout: float) -> dict:
        if not self._commands:
            raise ValueError("start the JavaConsumerProcess with commands=True to send it commands")
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        return self.wait_event(reply, timeout)

    def committed(self, partitions: Iterable[tuple[str, int]], timeout: float = 60.0
                  ) -> dict[tuple[str, int], tuple[int, str] | None]:
        """The running consumer's ``committed()`` (commands=True): (offset, metadata) or None."""
        event = self._command({"op": "committed", "partitions": [list(tp) for tp in partitions]}, "read", timeout)
        return {(t, p): None if o < 0 else (o, m) for t, p, o, m in event["offsets"]}

    def commit(self, offsets: dict[tuple[str, int], tuple[int, str]], timeout: float = 60.0) -> None:
        """``commitSync(offsets)`` with metadata on the running consumer (commands=True)."""
        self._command({"op": "commit", "offsets": [[t, p, o, m] for (t, p), (o, m) in offsets.items()]},
                      "commit_done", timeout)

    def stop(self, timeout: float = 60.0) -> dict:
        """SIGTERM (the peer stops polling, commits if asked, closes and leaves); its end event."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise JavaPeerError(f"the Java consumer did not stop within {timeout} s:\n{self.stderr[-3000:]}")
        self._reader.join(10)
        return self.end

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class JavaShareConsumerProcess(JavaConsumerProcess):
    """Java's KafkaShareConsumer (KIP-932) in share group ``group``, in the background: its records
    (with ``delivery_count``) on ``records``; ``stop()`` commits its acknowledgements and closes.
    Explicit mode acknowledges each record ACCEPT as it prints it; implicit leaves it to the next
    poll, as Java does."""

    def __init__(self, bootstrap: str, group: str, topics: Sequence[str], *, mode: str = "implicit",
                 max_records: int | None = None, sets: dict[str, str] | None = None,
                 verdicts: dict[tuple[int, int], str] | None = None) -> None:
        """``verdicts`` (explicit mode): {(partition, offset): "release" | "reject" | "renew" |
        "accept"}, the acknowledgement the first delivery of that record gets (any other record,
        and any later delivery, is accepted); each poll's verdicts are committed (commitSync)
        before the next poll, and each record carries ``poll`` and ``verdict``."""
        args = ["share", "--bootstrap", bootstrap, "--group", group, "--topics", ",".join(topics), "--mode", mode]
        if max_records is not None:
            args += ["--max-records", str(max_records)]
        if verdicts:
            args += ["--verdicts", ",".join(f"{p}:{o}:{kind}" for (p, o), kind in sorted(verdicts.items()))]
        for k, v in (sets or {}).items():
            args += ["--set", f"{k}={v}"]
        self._start(args, False)


def java_offsets_for_times(bootstrap: str, queries: Iterable[tuple[str, int, int]], *,
                           isolation: str = "read_uncommitted", timeout: float = 60.0) -> tuple[list[dict], dict]:
    """The Java consumer's ``offsetsForTimes`` per (topic, partition, timestamp), and the bounds
    event (``beginning`` / ``end`` offsets of the partitions asked about)."""
    cmd = peer_command() + ["times", "--bootstrap", bootstrap, "--isolation", isolation,
                            "--query", ",".join(f"{t}:{p}:{ts}" for t, p, ts in queries)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise JavaPeerError(f"the Java offsetsForTimes run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return [o for o in out if "event" not in o], next(o for o in out if o.get("event") == "bounds")


@dataclass(frozen=True)
class JavaAck:
    partition: int | None
    offset: int | None
    error: str | None = None


@dataclass
class JavaProduceOps:
    """What to send to the Java producer: records and transaction markers, in order."""

    lines: list[str] = field(default_factory=list)

    def record(self, key: bytes | None, value: bytes | None, *, partition: int | None = None,
               headers: Iterable[tuple[str, bytes | None]] = (), timestamp: int | None = None) -> None:
        self.lines.append(json.dumps({"partition": partition, "key": _b64(key), "value": _b64(value),
                                      "headers": [[k, _b64(v)] for k, v in headers],
                                      "timestamp": timestamp}))

    def begin(self) -> None:
        self.lines.append('{"txn": "begin"}')

    def commit(self) -> None:
        self.lines.append('{"txn": "commit"}')

    def abort(self) -> None:
        self.lines.append('{"txn": "abort"}')

    def flush(self) -> None:
        self.lines.append('{"flush": true}')

    def compression(self, codec: str) -> None:
        """From here on, a new (non-transactional) producer with ``codec``: one run, every codec."""
        self.lines.append(json.dumps({"compression": codec}))


def java_produce(bootstrap: str, topic: str, ops: JavaProduceOps, *, compression: str = "none",
                 transactional_id: str | None = None, settings: dict[str, str] | None = None,
                 timeout: float = 120.0) -> list[JavaAck]:
    """Send ``ops`` through the Java producer (acks=all); one acknowledgement per record, in order.
    Records of an aborted transaction come back with ``error`` set (TransactionAbortedException)
    or with their offsets if they were sent before the abort."""
    cmd = peer_command() + ["produce", "--bootstrap", bootstrap, "--topic", topic, "--compression", compression]
    if transactional_id:
        cmd += ["--transactional-id", transactional_id]
    for k, v in (settings or {}).items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, input="\n".join(ops.lines) + "\n", capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode:
        raise JavaPeerError(f"the Java producer exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    acks = []
    for line in proc.stdout.splitlines():
        o = json.loads(line)
        acks.append(JavaAck(o.get("partition"), o.get("offset"), o.get("error")))
    return acks


def java_bench(bootstrap: str, topic: str, expected: Sequence[int], mode: str, *, header: str = "type",
               value: str = "order.shipped", settings: dict[str, str] | None = None,
               max_seconds: float = 300.0, samples: bool = False,
               heap: str = "512m", timeout: float = 900.0) -> dict:
    """bench/consume's workload in the Java consumer (assigned from offset 0, until every
    partition had its ``expected`` count); the result object the peer prints, with
    bench/consume's field names (``records_per_s``, ``steady_cpu_s``, ``first_record_s``,
    ``rss_peak_mb``, ``counts``, ...) and the JVM's own costs (``construct_s``, ``jit_compile_s``,
    ``gc_s``).  ``samples=True`` adds ``samples``: [t, records, cpu_s, wait_s] after every poll."""
    cmd = peer_command(heap) + ["bench", "--bootstrap", bootstrap, "--mode", mode,
                                "--assign", ",".join(f"{topic}:{p}" for p in range(len(expected))),
                                "--expected", ",".join(str(n) for n in expected),
                                "--header", header, "--value", value, "--max-seconds", repr(float(max_seconds))]
    if samples:
        cmd.append("--samples")
    for k, v in (settings or {}).items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise JavaPeerError(f"the Java bench run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def java_share_bench(bootstrap: str, group: str, topic: str, expected: Sequence[int], mode: str, *,
                     ack: str = "implicit", header: str = "type", value: str = "order.shipped",
                     settings: dict[str, str] | None = None, max_seconds: float = 300.0,
                     heap: str = "512m", timeout: float = 900.0) -> dict:
    """``java_bench``'s workload through Java's KafkaShareConsumer (KafkaPeer.java ``share-bench``):
    subscribed to ``topic`` in share group ``group`` (its ``share.auto.offset.reset`` set by the
    caller), ``ack`` "implicit" or "explicit" (every record ACCEPTed as it is processed), until every
    partition had its ``expected`` count; a final commitSync inside the clock (``commit_s``).  The
    result has ``java_bench``'s field names."""
    cmd = peer_command(heap) + ["share-bench", "--bootstrap", bootstrap, "--group", group, "--topic", topic,
                                "--mode", mode, "--ack", ack, "--expected", ",".join(str(n) for n in expected),
                                "--header", header, "--value", value, "--max-seconds", repr(float(max_seconds))]
    for k, v in (settings or {}).items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise JavaPeerError(f"the Java share-bench run exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
