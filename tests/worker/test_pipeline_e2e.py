"""The daemon end to end: ``kdaemon`` driven as a subprocess against a real broker (Tansu).

What the pipeline promises, checked from the outside:

1. Delivery: 200,000 records written by confluent-kafka (4 partitions, lz4, a ``type`` header,
   JSON values, explicit timestamps, some older than the TTL) go through a header rule, the
   json deserializer, the ttl interceptor and the jsonl sink.  The sink then holds exactly the
   records that should pass, with their decoded values; the committed offsets are the end of
   every partition (from the delivery reports) even where a partition ends with records that
   were filtered; and a second run writes nothing again.
2. Faults: an interceptor raising in ``on_consume``/``on_commit``, values that are not JSON, and a
   sink that fails and then recovers.  Per policy nothing is lost: every record the filter kept
   is in the sink or the dead-letter queue, the DLQ holds exactly the failed records (raw bytes,
   ``kdaemon.error``/``kdaemon.stage`` headers), and no payload reaches the daemon's log.
3. Configuration: several problems are all reported at once (exit 2); an installed plugin that
   ``plugins`` does not list is never imported.
4. The other commands: ``tail``, ``offsets``, and ``--help`` of every command.

Every run is ``python -m kdaemon.cli run -c FILE --in-process`` in its own temporary directory,
stopped with SIGTERM once the committed offsets reached the partitions' ends.  Ends come from
the producer's delivery reports (last offset + 1), never from Tansu's high watermark, which is
the last batch's base offset + 1.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from kdaemon.client import Consumer, TopicPartition
from kdaemon.config import dump_toml
from kdaemon.sinks.encoding import decode_data
from testkit.produce import create_topic, produce

pytestmark = [pytest.mark.broker, pytest.mark.slow]

PARTITIONS = 4
# Only payloads (values and keys) contain this; it must never show up in the daemon's output.
MARKER = "PAYLOAD-7Qx9-do-not-log"
KEEP_TYPES = ("order.created", "order.shipped")
OTHER_TYPES = ("order.paid", "user.login", "cart.updated")
TTL_MS = 3_600_000                       # one hour
OLD_MS = 2 * 24 * 3_600_000              # "old" records are two days old
RUN_TIMEOUT = 90.0
PLUGIN_SRC = Path(__file__).parent / "plugins_src"
FAST_PRODUCE = {"linger.ms": 20, "batch.num.messages": 10_000, "batch.size": 1_000_000,
                "queue.buffering.max.messages": 1_000_000}


# -- configuration files ------------------------------------------------------------------------

def base_config(root: Path, bootstrap: str, topic: str, group: str, **daemon) -> dict:
    """Everything under ``root``; short session timeout (Tansu joins are slow otherwise)."""
    return {
        "plugins": ["header_rules", "ttl", "json"],
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group, "auto_offset_reset": "earliest",
                  "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000, "fetch_max_wait_ms": 100,
                  "retry_backoff_ms": 50, "max_poll_records": 2000},
        "daemon": {"topics": [topic], "state_dir": str(root / "state"), "flush_interval_ms": 100,
                   "poll_timeout_ms": 100, "on_deserialize_error": "dlq", "on_sink_error": "retry",
                   "sink_retry_backoff_ms": 50, "sink_retry_backoff_max_ms": 400, **daemon},
        "filters": [{"header": "type", "op": "in", "values": list(KEEP_TYPES), "action": "keep"}],
        "deserializer": {"key": "str", "value": "json"},
        "interceptors": [{"name": "ttl", "settings": {"max_age_ms": TTL_MS}}],
        "sink": {"type": "jsonl", "path": str(root / "out")},
        "dlq": {"type": "jsonl", "path": str(root / "dlq")},
    }


def write_config(root: Path, config: Mapping, name: str = "kdaemon.toml") -> Path:
    path = root / name
    path.write_text(dump_toml(config))
    return path


# -- data ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: bytes
    value: bytes
    type: str
    timestamp: int

    @property
    def where(self) -> tuple[int, int]:
        return (self.partition, self.offset)


def record(i: int, partition: int, kind: str, timestamp: int, value: bytes | None = None,
           **fields) -> tuple:
    """(key, value, headers, timestamp) for testkit.produce; the value is JSON unless given."""
    if value is None:
        value = json.dumps({"id": i, "partition": partition, "type": kind, "note": MARKER, **fields},
                           separators=(",", ":")).encode()
    key = f"k-{i}-{MARKER}".encode()
    return (key, value, (("type", kind.encode()), ("trace", f"{i:08x}".encode())), timestamp)


def produce_partition(bootstrap: str, topic: str, partition: int, records: list[tuple]) -> list[Produced]:
    reports = produce(bootstrap, topic, records, compression="lz4", partition=partition, **FAST_PRODUCE)
    out = []
    for (key, value, headers, ts), d in zip(records, reports):
        assert d.partition == partition
        out.append(Produced(partition, d.offset, key, value, headers[0][1].decode(), ts))
    return out


def ends_of(produced: Iterable[Produced]) -> dict[int, int]:
    """Per partition: the last delivered offset + 1."""
    ends: dict[int, int] = {}
    for r in produced:
        ends[r.partition] = max(ends.get(r.partition, 0), r.offset + 1)
    return ends


# -- running the daemon ---------------------------------------------------------------------------

def kdaemon_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kdaemon.cli", *args]


def child_env(extra_path: Path | None = None, **env: str) -> dict:
    out = dict(os.environ, **env)
    if extra_path is not None:
        out["PYTHONPATH"] = os.pathsep.join([str(extra_path)] + [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p])
    return out


def offset_reader(bootstrap: str, group: str) -> Consumer:
    """A kdaemon Consumer that only reads the group's committed offsets (OffsetFetch); it never
    joins the group."""
    return Consumer(bootstrap, group_id=group, enable_auto_commit=False, request_timeout_ms=10_000)


def read_committed(consumer: Consumer, topic: str) -> dict[int, int]:
    found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout_ms=10_000)
    return {tp.partition: om.offset for tp, om in found.items() if om is not None}


def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    consumer = offset_reader(bootstrap, group)
    try:
        return read_committed(consumer, topic)
    finally:
        consumer.close()


class DaemonRun:
    """``kdaemon run --in-process`` as a child process; stdout and stderr go to one log file."""

    def __init__(self, config_path: Path, *, env: Mapping[str, str] | None = None, name: str = "run") -> None:
        self.log_path = config_path.parent / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(kdaemon_cmd("run", "-c", str(config_path), "--in-process"),
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=config_path.parent, env=dict(env or os.environ))

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_committed(self, bootstrap: str, group: str, topic: str, ends: Mapping[int, int],
                       timeout: float = RUN_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        got: dict = {}
        reader = offset_reader(bootstrap, group)
        try:
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(f"kdaemon exited with {self.proc.returncode} before committing "
                                         f"{dict(ends)} (committed {got}); log:\n{self.tail()}")
                got = read_committed(reader, topic)
                if got == dict(ends):
                    return
                if any(got.get(p, 0) > e for p, e in ends.items()):
                    raise AssertionError(f"committed {got} beyond the ends {dict(ends)}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"committed offsets {got} did not reach {dict(ends)} in {timeout} s; "
                                         f"log:\n{self.tail()}")
                time.sleep(0.2)
        finally:
            reader.close()

    def wait_exit(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"kdaemon did not exit within {timeout} s; log:\n{self.tail()}") from None
        finally:
            self._log.close()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait: the worker flushes, commits and leaves the group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def daemons():
    """Start runs through this; whatever is still running at the end of the test is killed."""
    started: list[DaemonRun] = []

    def start(config_path: Path, **kw) -> DaemonRun:
        run = DaemonRun(config_path, **kw)
        started.append(run)
        return run

    yield start
    for run in started:
        run.kill()


def read_jsonl(directory: Path) -> list[dict]:
    """Every line of the published files; a clean shutdown leaves no ``.jsonl.open`` behind."""
    if not directory.exists():
        return []
    left_open = sorted(p.name for p in directory.glob("*.jsonl.open"))
    assert not left_open, f"files still open after the daemon exited: {left_open}"
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        with open(path) as f:
            out += [json.loads(line) for line in f]
    return out


def where(obj: Mapping) -> tuple[int, int]:
    return (obj["partition"], obj["offset"])


def header(obj: Mapping, name: str) -> bytes | None:
    values = [decode_data(v) for k, v in obj["headers"] if k == name]
    return values[-1] if values else None


# -- 1. delivery: 200k records, exactly the expected ones, exactly once ---------------------------

@pytest.fixture(scope="module")
def dataset(broker) -> dict:
    """200,000 records over 4 partitions, and which of them should reach the sink.

    Each partition ends differently, on purpose: p0 with a separate batch that the header rule
    drops entirely, p1 with header-dropped records inside its last batch, p2 with records the
    ttl interceptor drops (right type, too old), p3 with a record that is delivered.
    """
    topic = f"e2e-pipeline-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    rng = random.Random(1234)
    now = int(time.time() * 1000)
    n_body, n_tail = 49_900, 100
    produced: list[Produced] = []
    i = 0
    for p in range(PARTITIONS):
        body = []
        for _ in range(n_body if p < 3 else n_body + n_tail):
            kind = rng.choice(KEEP_TYPES + OTHER_TYPES)
            old = rng.random() < 0.1
            ts = now - (OLD_MS if old else rng.randrange(600_000))
            body.append(record(i, p, kind, ts, amount=rng.randrange(10_000)))
            i += 1
        tail = []
        for _ in range(n_tail if p < 3 else 0):
            if p == 2:
                tail.append(record(i, p, KEEP_TYPES[0], now - OLD_MS))     # kept by the rule, expired
            else:
                tail.append(record(i, p, "user.login", now - 1000))        # dropped by the rule
            i += 1
        if p == 3:
            body[-1] = record(i - 1, p, KEEP_TYPES[1], now - 1000)         # ends with a delivered record
        if p == 0:
            produced += produce_partition(broker.bootstrap, topic, p, body)
            produced += produce_partition(broker.bootstrap, topic, p, tail)  # its own batch
        else:
            produced += produce_partition(broker.bootstrap, topic, p, body + tail)
    assert len(produced) == 200_000
    expected = {r.where: r for r in produced if r.type in KEEP_TYPES and r.timestamp > now - TTL_MS}
    return {"topic": topic, "produced": produced, "ends": ends_of(produced), "expected": expected}


@pytest.fixture(scope="module")
def delivery(broker, dataset, tmp_path_factory) -> dict:
    """Two runs over the dataset: the first delivers everything, the second must add nothing."""
    root = tmp_path_factory.mktemp("delivery")
    group = f"e2e-delivery-{uuid.uuid4().hex[:8]}"
    topic, ends = dataset["topic"], dataset["ends"]
    config_path = write_config(root, base_config(root, broker.bootstrap, topic, group))

    first = DaemonRun(config_path, name="first")
    try:
        first.wait_committed(broker.bootstrap, group, topic, ends)
        code = first.stop()
    finally:
        first.kill()
    lines_first = read_jsonl(root / "out")
    committed_first = committed(broker.bootstrap, group, topic)

    # Second run: nothing new but one header-dropped record per partition, whose committed
    # offsets prove the run read everything after the first run's commits.
    sentinels = []
    second = DaemonRun(config_path, name="second")
    try:
        now = int(time.time() * 1000)
        for p in range(PARTITIONS):
            sentinels += produce_partition(broker.bootstrap, topic, p, [record(900_000 + p, p, "user.login", now)])
        ends_second = {**ends, **ends_of(sentinels)}
        second.wait_committed(broker.bootstrap, group, topic, ends_second)
        code_second = second.stop()
    finally:
        second.kill()
    return {"root": root, "group": group, "config": config_path, "code": code,
            "lines": lines_first, "committed": committed_first, "log": first.log(),
            "code_second": code_second, "lines_after_second": read_jsonl(root / "out"),
            "ends_second": ends_second, "log_second": second.log()}


def test_delivers_exactly_the_expected_records(dataset, delivery):
    expected = dataset["expected"]
    lines = delivery["lines"]
    assert delivery["code"] == 0, delivery["log"][-3000:]
    got = Counter(where(obj) for obj in lines)
    duplicates = {k: n for k, n in got.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} record(s) delivered more than once, e.g. {list(duplicates)[:5]}"
    missing = set(expected) - set(got)
    extra = set(got) - set(expected)
    assert not missing and not extra, (f"{len(missing)} missing (e.g. {sorted(missing)[:5]}), "
                                       f"{len(extra)} unexpected (e.g. {sorted(extra)[:5]})")
    for obj in lines:
        want = expected[where(obj)]
        assert obj["topic"] == dataset["topic"]
        assert obj["value"] == json.loads(want.value)           # decoded by the json deserializer
        assert obj["key"] == want.key.decode()                  # the str deserializer
        assert obj["timestamp"] == want.timestamp
        assert header(obj, "type") == want.type.encode()
    # Roughly 40% pass the rule and 90% of those the TTL: a sanity check on the data itself.
    assert 60_000 < len(expected) < 80_000
    assert read_jsonl(delivery["root"] / "dlq") == []


def test_commits_the_end_of_every_partition_even_after_a_filtered_tail(dataset, delivery):
    produced = dataset["produced"]
    ends = dataset["ends"]
    assert delivery["committed"] == ends
    # The tails really were filtered: none of the last 100 records of p0-p2 is expected.
    for p in range(3):
        tail = [r for r in produced if r.partition == p][-100:]
        assert not any(r.where in dataset["expected"] for r in tail)
    last_p3 = [r for r in produced if r.partition == 3][-1]
    assert last_p3.where in dataset["expected"]


def test_second_run_delivers_nothing_again(delivery):
    assert delivery["code_second"] == 0, delivery["log_second"][-3000:]
    # The fixture waited for the second run to commit past the sentinels, so it read everything.
    assert len(delivery["lines_after_second"]) == len(delivery["lines"])
    assert [where(o) for o in delivery["lines_after_second"]] == [where(o) for o in delivery["lines"]]


def test_payloads_never_reach_the_log(delivery):
    for log in (delivery["log"], delivery["log_second"]):
        assert "joined generation" in log  # the log is the daemon's, and not empty
        assert MARKER not in log


# -- 2. faults --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """A directory to put on PYTHONPATH: the test plugins and a dist-info naming them as
    ``kdaemon`` entry points (what ``pip install`` would leave behind)."""
    root = tmp_path_factory.mktemp("plugins")
    for name in ("kd_e2e_faults.py", "kd_e2e_marker.py"):
        shutil.copy(PLUGIN_SRC / name, root / name)
    dist = root / "kd_e2e_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kd-e2e-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kdaemon]\ne2e_faults = kd_e2e_faults\ne2e_marker = kd_e2e_marker\n")
    return root


@pytest.fixture(scope="module")
def fault_data(broker) -> dict:
    """8,000 records per topic: JSON values, a tenth not JSON (a third of those in records the
    header rule drops, which must never be deserialized), and a few with ``"reject": true`` that
    the flaky sink refuses.  Two identical topics, one per policy run."""
    now = int(time.time() * 1000)
    rng = random.Random(99)
    plan = []
    for p in range(PARTITIONS):
        rows = []
        for j in range(2000):
            i = p * 10_000 + j
            kind = KEEP_TYPES[j % 2] if j % 3 else OTHER_TYPES[j % 3]
            if j % 10 == 7:
                bad = rng.choice([f'{{"id": {i}, "note": "{MARKER}'.encode(),           # truncated
                                  b"\xff\xfe" + MARKER.encode(),                          # not UTF-8
                                  f"NaN-{MARKER}".encode()])
                rows.append(record(i, p, kind, now, value=bad))
            else:
                rows.append(record(i, p, kind, now, reject=(j % 97 == 5)))
        plan.append(rows)
    topics = {}
    for policy in ("retry", "dlq"):
        topic = f"e2e-faults-{policy}-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap, topic, PARTITIONS)
        produced = []
        for p in range(PARTITIONS):
            produced += produce_partition(broker.bootstrap, topic, p, plan[p])
        topics[policy] = (topic, produced)
    return topics


def is_json(value: bytes) -> bool:
    try:
        json.loads(value.decode("utf-8"))
    except ValueError:
        return False
    return True


def journal(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("policy", ["retry", "dlq"])
def test_faults_lose_nothing(broker, fault_data, plugin_path, tmp_path, daemons, policy):
    """Interceptor raising, undecodable values, a sink failing then recovering: every kept record
    ends up in the sink or the DLQ, the DLQ holds exactly the failed ones, the log no payload."""
    topic, produced = fault_data[policy]
    group = f"e2e-faults-{policy}-{uuid.uuid4().hex[:8]}"
    journal_path = tmp_path / "journal.jsonl"
    config = base_config(tmp_path, broker.bootstrap, topic, group, on_sink_error=policy, log_level="DEBUG")
    config["plugins"] = ["header_rules", "json", "e2e_faults"]       # e2e_marker: installed, not listed
    config["interceptors"] = [{"name": "explode", "settings": {"every": 3, "commit_every": 1}}]
    sink = {"type": "flaky", "path": str(tmp_path / "out"), "journal": str(journal_path),
            "reject_field": "reject"}
    if policy == "retry":
        # Writes 2-4 fail (one batch, retried three times); write 20 fails and takes the records
        # accepted since the last flush along; flushes 2 and 5 fail and lose theirs.  The last
        # two rewind to the last commit: duplicates are allowed there, losses are not.
        sink.update(fail_writes=[2, 3, 4], break_writes=[20], fail_flushes=[2, 5])
    else:
        sink.update(fail_writes=[2, 3, 9])   # three batches to the DLQ
    config["sink"] = sink
    config["kafka"]["max_poll_records"] = 200
    config_path = write_config(tmp_path, config)
    marker = tmp_path / "marker-imported"

    run = daemons(config_path, env=child_env(plugin_path, KD_E2E_MARKER_FILE=str(marker)))
    run.wait_committed(broker.bootstrap, group, topic, ends_of(produced))
    assert run.stop() == 0, run.tail()
    log = run.log()

    kept = {r.where: r for r in produced if r.type in KEEP_TYPES}
    undecodable = {w for w, r in kept.items() if not is_json(r.value)}
    refused = {w for w, r in kept.items() if w not in undecodable and json.loads(r.value).get("reject")}
    assert undecodable and refused

    sink_lines = read_jsonl(tmp_path / "out")
    dlq_lines = read_jsonl(tmp_path / "dlq")
    in_sink = {where(o) for o in sink_lines}
    in_dlq = {where(o) for o in dlq_lines}
    events = journal(journal_path)
    count = Counter(e["event"] for e in events)
    failed_writes = {tuple(w) for e in events if e["event"] == "write_failed" for w in e["records"]}
    lost = {tuple(w) for e in events if e["event"] in ("lost", "flush_failed") for w in e["records"]}
    assert count["write_failed"] == 3 and failed_writes, events

    # Nothing lost, nothing invented: the records the rule kept are exactly sink + DLQ.
    assert in_sink | in_dlq == set(kept)
    # The DLQ holds exactly the failed records (as a set: after a rewind a record may be
    # dead-lettered again), with their raw bytes and what failed where.
    by_stage: dict[str, set] = {}
    for o in dlq_lines:
        stage = header(o, "kdaemon.stage").decode()
        error = header(o, "kdaemon.error").decode()
        by_stage.setdefault(stage, set()).add(where(o))
        r = kept[where(o)]
        assert decode_data(o["value"]) == r.value and decode_data(o["key"]) == r.key   # raw bytes
        assert MARKER not in error
        if stage == "deserialize":
            assert error.startswith("ValueError: ")   # the json deserializer: what and where, no data
    assert set(by_stage) == {"deserialize", "sink"}
    assert by_stage["deserialize"] == undecodable
    if policy == "retry":
        # A failed write is retried (the same batch, after a pause), never dead-lettered.
        assert by_stage["sink"] == refused
        assert not (in_sink & in_dlq)
        for o in sink_lines:
            assert o["value"] == json.loads(kept[where(o)].value)
        assert failed_writes - refused <= in_sink   # retried until stored
        assert count["write_broke"] == 1 and count["flush_failed"] == 2 and lost, events
        assert lost <= in_sink                      # consumed again after the rewinds
        assert log.count("sink rebuilt; consuming again from the last committed offsets") == 3
        assert "sink available again after" in log
    else:
        # A failed write sends that batch to the DLQ; the refused records too.  No rewinds here,
        # so every record is in exactly one place, exactly once.
        assert by_stage["sink"] == refused | failed_writes
        assert not (in_sink & in_dlq)
        assert len(sink_lines) == len(in_sink) and len(dlq_lines) == len(in_dlq)

    # The interceptor's failures were logged and consumption went on.
    assert "interceptor 'explode' raised in on_consume" in log
    assert "interceptor 'explode' raised in on_commit" in log
    assert MARKER not in log, "a payload reached the daemon's log"
    assert not marker.exists(), "an installed plugin that `plugins` does not list was imported"


def test_deserialize_error_policy_stop(broker, tmp_path, daemons):
    """``stop``: the worker commits what came before the bad record, then exits 3."""
    topic = f"e2e-stop-{uuid.uuid4().hex[:8]}"
    group = f"e2e-stop-{uuid.uuid4().hex[:8]}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    now = int(time.time() * 1000)
    produced = []
    bad_offset = 3000
    for p in range(PARTITIONS):
        rows = [record(p * 10_000 + j, p, KEEP_TYPES[0], now) for j in range(4000)]
        if p == 1:
            rows[bad_offset] = record(p * 10_000 + bad_offset, p, KEEP_TYPES[0], now, value=MARKER.encode())
        produced += produce_partition(broker.bootstrap, topic, p, rows)
    config = base_config(tmp_path, broker.bootstrap, topic, group, on_deserialize_error="stop")
    config["kafka"]["max_poll_records"] = 500
    run = daemons(write_config(tmp_path, config))
    code = run.wait_exit()
    log = run.log()
    assert code == 3, log[-3000:]
    assert "worker stopping: deserialization failed at" in log and MARKER not in log
    got = committed(broker.bootstrap, group, topic)
    assert got.get(1, 0) <= bad_offset
    lines = read_jsonl(tmp_path / "out")
    assert (1, bad_offset) not in {where(o) for o in lines}
    # Everything committed is in the sink (what was flushed before the stop).
    in_sink = {where(o) for o in lines}
    for p, off in got.items():
        assert all((p, o) in in_sink for o in range(off))

    # tail, with the same configuration, reports the bad record and goes on.
    proc = subprocess.run(kdaemon_cmd("tail", topic, "-c", str(tmp_path / "kdaemon.toml"), "-p", "1",
                                      "-o", str(bad_offset - 1), "-n", "2"),
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert [where(json.loads(line)) for line in proc.stdout.splitlines()] == [(1, bad_offset - 1), (1, bad_offset + 1)]
    assert f"# {topic}-1@{bad_offset}: could not deserialize" in proc.stderr
    assert MARKER not in proc.stderr


# -- 3. configuration ---------------------------------------------------------------------------

BAD_CONFIG = """\
plugins = ["header_rules", "json"]
colour = "blue"

[kafka]
bootstrap_servers = "127.0.0.1:9"
group_id = "g"
session_timeout_ms = 0
auto_offset_reset = "sometimes"
fetch_max_wait = 100

[daemon]
topics = ["t"]
workers = "two"
topic_pattern = 5
on_sink_error = "ignore"
on_deserialize_error = "dlq"

[[filters]]
header = "type"
op = "like"
values = ["x"]

[deserializer]
value = "json"
extra = 1

[sink]
path = "/tmp/nowhere"
"""

BAD_PROBLEMS = [
    ("colour", "unknown section or key"),
    ("kafka.fetch_max_wait", "unknown consumer option"),
    ("kafka.session_timeout_ms", "must be positive"),
    ("kafka.auto_offset_reset", "'sometimes' is not one of earliest, latest, none"),
    ("daemon.workers", 'expected an integer, found string "two"'),
    ("daemon.topic_pattern", "expected a string, found integer 5"),
    ("daemon.on_sink_error", "'ignore' is not one of retry, dlq, stop"),
    ("filters[0].op", "'like' is not one of"),
    ("deserializer.extra", "unknown key"),
    ("sink.type", "required"),
]


# (``kdaemon plugins`` lists the plugins even then: tests/cli/test_plugins_command.py.)
@pytest.mark.parametrize("command", [("check-config",), ("run", "--in-process"), ("run",), ("tail", "t"),
                                     ("offsets",)])
def test_bad_config_lists_every_problem(tmp_path, command):
    path = tmp_path / "bad.toml"
    path.write_text(BAD_CONFIG)
    proc = subprocess.run(kdaemon_cmd(*command[:1], "-c", str(path), *command[1:]), capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
    for where_, what in BAD_PROBLEMS:
        prefix = f"{path}: {where_}: "
        assert any(line.startswith(prefix) and what in line[len(prefix):] for line in lines), \
            f"no line {prefix}...{what}... in:\n{proc.stderr}"
    assert all(line.startswith(f"{path}: ") for line in lines), proc.stderr


def test_plugin_problems_are_config_problems(tmp_path):
    """Names only the plugins can check (a deserializer, an interceptor, a sink setting), all at
    once, in the same form; and a listed plugin that is not installed."""
    config = base_config(tmp_path, "127.0.0.1:9", "t", "g")
    config["deserializer"] = {"key": "str", "value": "avro"}
    config["interceptors"] = [{"name": "ttl", "settings": {"max_age_ms": -5}}, {"name": "nope"}]
    path = write_config(tmp_path, config)
    proc = subprocess.run(kdaemon_cmd("check-config", "-c", str(path)), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    for where_ in ("deserializer.value: no deserializer named 'avro'",
                   "interceptors[0].settings.max_age_ms: expected a positive integer, found integer -5",
                   "interceptors[1].name: no interceptor named 'nope'"):
        assert f"{path}: {where_}" in proc.stderr, proc.stderr
    # Sink settings are checked when the sink is built: `run` reports them the same way.
    config["deserializer"] = {"key": "str", "value": "json"}
    config["interceptors"] = []
    config["sink"] = {"type": "jsonl", "path": str(tmp_path / "out"), "colour": "blue"}
    path = write_config(tmp_path, config)
    proc = subprocess.run(kdaemon_cmd("run", "-c", str(path), "--in-process"), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"{path}: sink.colour: unknown setting (known: "), proc.stderr
    config["plugins"] = ["json", "not_installed"]
    path = write_config(tmp_path, config)
    proc = subprocess.run(kdaemon_cmd("check-config", "-c", str(path)), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"{path}: plugins: plugin(s) not_installed are enabled"), proc.stderr


def test_unlisted_plugin_is_not_imported(tmp_path, plugin_path):
    marker = tmp_path / "marker-imported"
    env = child_env(plugin_path, KD_E2E_MARKER_FILE=str(marker))
    config = base_config(tmp_path, "127.0.0.1:9", "t", "g")
    path = write_config(tmp_path, config)

    for command in (("plugins",), ("check-config",)):
        proc = subprocess.run(kdaemon_cmd(*command, "-c", str(path)), capture_output=True, text=True,
                              timeout=60, env=env)
        assert proc.returncode == 0, proc.stderr
        assert not marker.exists(), f"`kdaemon {command[0]}` imported an unlisted plugin"
        if command == ("plugins",):
            rows = {line.split()[1]: line for line in proc.stdout.splitlines()}
            assert rows["e2e_marker"].startswith("disabled") and "(not imported)" in rows["e2e_marker"]
            assert rows["e2e_faults"].startswith("disabled")
            assert rows["json"].startswith("enabled")

    # The control: listed, the same plugin is imported (so the marker does work).
    config["plugins"] = ["header_rules", "ttl", "json", "e2e_marker"]
    path = write_config(tmp_path, config)
    proc = subprocess.run(kdaemon_cmd("plugins", "-c", str(path)), capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[1]: line for line in proc.stdout.splitlines()}
    assert rows["e2e_marker"].startswith("enabled") and "kdaemon_deserializers" in rows["e2e_marker"]
    assert marker.exists()


# -- 4. tail, offsets, --help -----------------------------------------------------------------------

def test_tail_prints_records_through_filter_and_deserializer(broker, dataset, delivery):
    proc = subprocess.run(kdaemon_cmd("tail", dataset["topic"], "-c", str(delivery["config"]),
                                      "-o", "beginning", "-n", "10"),
                          capture_output=True, text=True, timeout=60, cwd=delivery["root"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 10, proc.stdout
    for line in lines:
        obj = json.loads(line)
        want = dataset["expected"].get(where(obj))
        assert want is not None, f"tail printed a record the filter/ttl should drop: {where(obj)}"
        assert obj["value"] == json.loads(want.value) and obj["key"] == want.key.decode()
    assert MARKER not in proc.stderr
    # It never joined the group nor committed: the group's offsets are the second run's.
    assert committed(broker.bootstrap, delivery["group"], dataset["topic"]) == delivery["ends_second"]


def test_offsets_prints_committed_and_lag(dataset, delivery):
    proc = subprocess.run(kdaemon_cmd("offsets", "-c", str(delivery["config"])), capture_output=True,
                          text=True, timeout=60, cwd=delivery["root"])
    assert proc.returncode == 0, proc.stderr
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 8 and parts[0] == dataset["topic"]:
            rows[int(parts[1])] = parts[:5]
            assert parts[5:] == ["-", "-", "-"], line   # the daemon stopped: nobody holds it
    # The daemon joined with the default protocol ("auto": the consumer protocol on Kafka 4).
    assert re.match(rf"consumer group \((consumer|classic) protocol[^)]*\) {delivery['group']}: Empty, 0 member\(s\)",
                    proc.stdout), proc.stdout
    assert sorted(rows) == list(range(PARTITIONS)), proc.stdout
    for p, (_, _, committed_, end, lag) in rows.items():
        assert int(committed_) == delivery["ends_second"][p]
        assert lag == "0"
    assert proc.stdout.splitlines()[-1] == "total lag: 0"


def test_every_command_has_help():
    from kdaemon.cli import main
    names = sorted(main.commands)
    assert {"run", "check-config", "plugins", "offsets", "tail", "demo"} <= set(names)
    for args in [()] + [(name,) for name in names]:
        proc = subprocess.run(kdaemon_cmd(*args, "--help"), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (args, proc.stderr)
        assert proc.stdout.startswith("Usage: "), (args, proc.stdout)
        assert not proc.stderr
