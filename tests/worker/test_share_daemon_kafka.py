"""``kdaemon run`` as a share-group member (``[kafka] group_type = "share"``, KIP-932) on Apache
Kafka 4.4, through the run's shared broker (``kafka`` fixture).

Each test has its own topic and share group; the group's own settings come from the daemon's
``[share]`` table, which worker 0 sets when it starts (``share.auto.offset.reset`` = earliest,
a lock of a few seconds, a small delivery count limit where the test needs one).  What the
broker has left to settle is read back with DescribeShareGroupOffsets (``share_lag``): lag 0 is
every record accepted or rejected.

* more workers than partitions (4 on 2), a header rule and the jsonl sink: every kept record is
  in the output, none the rule drops, each member acquired records, Kafka's kafka-share-groups
  lists the four workers as members; the duplicates are counted (none expected: no lock
  expires, nothing crashes);
* a mixed group: the daemon's two workers and Java's KafkaShareConsumer on one partition, each
  record to exactly one member;
* a worker SIGKILLed while it holds records: they come back to the others once its lock runs
  out, and none is lost;
* a sink whose flush fails: the poll's records are RELEASEd and come back (none lost); records
  that do not deserialize under ``on_deserialize_error = "skip"`` are REJECTed (the broker
  settles them; none reaches the sink);
* a [share] value the broker refuses: the daemon stops (exit 4) naming it;
* ``check-config`` connected: what the group has now beside what the daemon sets;
* poison records (an interceptor that kills its worker on them): each delivery kills a worker
  (which the supervisor restarts) until the group's delivery count limit, where the last
  delivery goes to the DLQ with the reason instead of to the plugins, and is accepted.

The jsonl sink runs as a user's would, its dedupe on: in a share group it keeps which offsets
it stored (invariant 50), so records out of order are all written; the tests also count
duplicates from the files.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path

import pytest

from kdaemon.exit_codes import EXIT_BOOT_FAILURE
from kdaemon.supervisor.control import request_status
from testkit.daemon import Daemon, kdaemon_command, wait_for
from testkit.group_configs import set_group_configs
from testkit.java_peer import JavaShareConsumerProcess
from testkit.kafka_tools import kafka_share_groups
from testkit.produce import create_topic, produce
from testkit.share_daemon import plugin_dir, share_daemon_config
from testkit.share_groups import share_lag, share_members

pytestmark = pytest.mark.kafka

WAIT = 60.0   # bound of every wait for an event; never a duration a test relies on
KEEP = ("order.created", "order.shipped")
DROP = ("order.paid", "user.login")
PLUGINS = Path(__file__).parent / "plugins_src"


def names() -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    return f"share-d-{tag}", f"share-d-{tag}"


def typed_records(partition: int, count: int, start: int = 0, extra_headers=lambda i: ()) -> list[tuple]:
    """(key, value, headers): a ``type`` header cycling through kept and dropped types."""
    kinds = KEEP + DROP
    return [(b"k%d" % i, json.dumps({"p": partition, "i": i}).encode(),
             (("type", kinds[i % len(kinds)].encode()), *extra_headers(i)))
            for i in range(start, start + count)]


def write(bootstrap: str, topic: str, partitions: int, per_partition: int, **kw) -> dict[tuple[int, int], str]:
    """Produce; {(partition, offset): type}."""
    out = {}
    for p in range(partitions):
        rows = typed_records(p, per_partition, **kw)
        for (key, value, headers), d in zip(rows, produce(bootstrap, topic, rows, partition=p)):
            out[(d.partition, d.offset)] = headers[0][1].decode()
    return out


def output(daemon: Daemon) -> list[tuple[int, int]]:
    return [(o["partition"], o["offset"]) for o in daemon.output()]


def wait_settled(kafka, group: str, topic: str, partitions: int, daemon: Daemon) -> None:
    """Until the broker has nothing left to settle on any partition (lag 0)."""
    host, port = kafka.bootstrap.split(":")

    def settled():
        lag = share_lag(host, int(port), group)
        return all(lag.get((topic, p), (0, 1))[1] == 0 for p in range(partitions))
    wait_for(settled, WAIT, f"share group {group} settled every record", daemon.log_tail, interval=0.3)


def share_figures(daemon: Daemon) -> dict[int, object]:
    status = request_status(daemon.config["daemon"]["state_dir"], timeout_s=10)
    return {w.index: w.share for w in status.workers if w.pid is not None}


def test_more_workers_than_partitions_header_rules_jsonl(kafka, tmp_path):
    topic, group = names()
    create_topic(kafka.bootstrap, topic, 2)
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=4,
                                 filters=[{"header": "type", "op": "in", "values": list(KEEP), "action": "keep"}],
                                 share={"record_lock_duration_ms": 15_000})
    config["kafka"]["max_poll_records"] = 50
    with Daemon(tmp_path, config) as daemon:
        daemon.wait_all_ready(WAIT)
        written: dict[tuple[int, int], str] = {}
        for round_ in range(4):   # while every member fetches, so each gets its share
            written.update(write(kafka.bootstrap, topic, 2, 500, start=round_ * 500))
        kept = {where for where, kind in written.items() if kind in KEEP}
        dropped = set(written) - kept
        wait_for(lambda: kept <= set(output(daemon)), WAIT, f"{len(kept)} kept records in the output",
                 daemon.log_tail, interval=0.3)
        wait_settled(kafka, group, topic, 2, daemon)
        # The figures reach kdaemon status with each worker's next heartbeat: wait for the count.
        figures = wait_for(lambda: (f := share_figures(daemon)) and all(v is not None for v in f.values())
                           and sum(v.acquired for v in f.values()) >= len(kept) and f,
                           WAIT, "every kept record acquired, in kdaemon status's share figures")

        def delivered_metric():
            return sum(v for (name, _), v in daemon.metrics().items() if name == "kdaemon_records_delivered_total")
        wait_for(lambda: delivered_metric() >= len(kept), WAIT, "kdaemon_records_delivered_total on /metrics",
                 daemon.log_tail, interval=0.3)
        got = output(daemon)
        # Kafka's own kafka-share-groups sees the four workers as the group's members.
        status = request_status(daemon.config["daemon"]["state_dir"], timeout_s=10)
        pids = {w.pid for w in status.workers if w.pid is not None}
        members = kafka_share_groups(kafka.bootstrap, "--describe", "--group", group, "--members")
        assert daemon.stop() == 0
    assert members[0][:4] == ["GROUP", "CONSUMER-ID", "HOST", "CLIENT-ID"], members
    assert {row[3] for row in members[1:]} == {f"kdaemon-{pid}" for pid in pids}, (members, pids)
    assert not set(got) & dropped, "records the header rule drops reached the sink"
    duplicates = len(got) - len(set(got))
    print(f"{len(kept)} kept records, {len(got)} lines, {duplicates} duplicate(s); members: "
          + ", ".join(f"worker {i}: acquired {f.acquired}, accepted {f.accepted}" for i, f in sorted(figures.items())))
    assert duplicates == 0, "a duplicate without a lock expiry or a crash"
    assert sum(f.acquired for f in figures.values()) >= len(kept)
    # More useful workers than partitions: at least three of the four members got records.
    assert sum(1 for f in figures.values() if f.acquired) >= 3, figures
    assert 'group_type = "share"' in daemon.config_path.read_text()
    log = daemon.log()
    assert "share.auto.offset.reset=earliest" in log and "share.record.lock.duration.ms=15000" in log


def test_a_share_group_of_daemon_workers_and_java_splits_the_records(kafka, tmp_path):
    """``kdaemon run`` (2 workers) and Java's KafkaShareConsumer in one share group on one
    partition: each record goes to exactly one of the three members (no lock expires: 15 s), and
    both kinds of member get records."""
    topic, group = names()
    create_topic(kafka.bootstrap, topic, 1)
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=2,
                                 share={"record_lock_duration_ms": 15_000})
    config["kafka"]["max_poll_records"] = 5
    config["kafka"]["share_acquire_mode"] = "record_limit"
    host, port = kafka.bootstrap.split(":")
    java = JavaShareConsumerProcess(kafka.bootstrap, group, [topic], mode="explicit",
                                    sets={"share.acquire.mode": "record_limit", "max.poll.records": "5"})
    try:
        with Daemon(tmp_path, config) as daemon:
            daemon.wait_all_ready(WAIT)
            wait_for(lambda: len(share_members(host, int(port), group)) == 3, WAIT,
                     "the two workers and the Java member in the group", daemon.log_tail, interval=0.3)
            # In rounds of 100 until both sides have some (at most 10): a JVM slowed by a busy
            # machine once fetched nothing before the two workers had taken all 300 records.
            offsets: list[int] = []
            for _ in range(10):
                start = len(offsets)
                offsets += [d.offset for d in produce(kafka.bootstrap, topic,
                                                      [(b"k%d" % i, b"v%d" % i, ()) for i in range(start, start + 100)],
                                                      partition=0)]
                wait_for(lambda: len(output(daemon)) + len(java.records) >= len(offsets), WAIT,
                         "every record at one member or another", daemon.log_tail, interval=0.3)
                if output(daemon) and java.records:
                    break
            wait_settled(kafka, group, topic, 1, daemon)
            ours = [o for _, o in output(daemon)]
            assert daemon.stop() == 0
        java.stop()
    finally:
        java.kill()
    theirs = [r.offset for r in java.records]
    print(f"{len(offsets)} records: {len(ours)} to the daemon's workers, {len(theirs)} to Java")
    assert ours and theirs, (len(ours), len(theirs))
    assert len(ours) == len(set(ours)) and len(theirs) == len(set(theirs))
    assert not set(ours) & set(theirs), sorted(set(ours) & set(theirs))[:10]
    assert set(ours) | set(theirs) == set(offsets)


def test_sigkilled_worker_records_come_back_to_others(kafka, tmp_path):
    topic, group = names()
    create_topic(kafka.bootstrap, topic, 1)
    plugins = plugin_dir(tmp_path / "plugins", {"share_poison": PLUGINS / "kd_share_faults.py"})
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=3,
                                 share={"record_lock_duration_ms": 2_000})
    config["plugins"] = ["share_poison"]
    config["interceptors"] = [{"name": "hold_on", "settings": {"header": "hold", "flag": str(tmp_path / "held")}}]
    config["kafka"]["max_poll_records"] = 20
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    with Daemon(tmp_path, config, env=env) as daemon:
        daemon.wait_all_ready(WAIT)
        # One batch of 20 with a "hold" record: the worker that takes it writes its pid to the
        # flag file and waits there for ever, holding the batch's locks.
        rows = [(b"k%d" % i, b"v%d" % i, (("type", b"order.created"),) + ((("hold", b"1"),) if i == 5 else ()))
                for i in range(200)]
        offsets = [d.offset for d in produce(kafka.bootstrap, topic, rows, partition=0)]
        flag = tmp_path / "held"
        holder = int(wait_for(lambda: flag.exists() and flag.read_text().strip(), WAIT,
                              "a worker holding the 'hold' record", daemon.log_tail))
        os.kill(holder, signal.SIGKILL)
        wait_for(lambda: set(offsets) <= {o for _, o in output(daemon)}, WAIT,
                 "every record in the output after the kill", daemon.log_tail, interval=0.3)
        wait_settled(kafka, group, topic, 1, daemon)
        got = output(daemon)
        assert daemon.stop() == 0
    counts = Counter(o for _, o in got)
    print(f"{len(offsets)} records, {len(got)} lines, {len(got) - len(counts)} duplicate(s)")
    assert set(counts) == set(offsets)
    # The killed worker wrote nothing durable of its batch (it never flushed): no duplicates.
    assert len(got) == len(counts)
    assert f"(pid {holder})" in daemon.log()


def test_a_failed_flush_releases_and_a_skipped_record_is_rejected(kafka, tmp_path):
    topic, group = names()
    create_topic(kafka.bootstrap, topic, 1)
    plugins = plugin_dir(tmp_path / "plugins", {"share_faults": PLUGINS / "kd_share_faults.py"})
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=2,
                                 share={"record_lock_duration_ms": 15_000}, on_deserialize_error="skip",
                                 sink_retry_backoff_ms=50, sink_retry_backoff_max_ms=200)
    config["plugins"] = ["json", "share_faults"]
    config["deserializer"] = {"key": "str", "value": "json"}
    config["sink"] = {"type": "fail_flush", "path": str(tmp_path / "out"), "fail_flushes": [2, 3]}
    config["kafka"]["max_poll_records"] = 20
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    with Daemon(tmp_path, config, env=env) as daemon:
        daemon.wait_all_ready(WAIT)
        rows = [(b"k%d" % i, b"not json" if i % 50 == 7 else json.dumps({"i": i}).encode(), ()) for i in range(300)]
        offsets = [d.offset for d in produce(kafka.bootstrap, topic, rows, partition=0)]
        bad = {offsets[i] for i in range(300) if i % 50 == 7}
        wait_for(lambda: set(offsets) - bad <= {o for _, o in output(daemon)}, WAIT,
                 "every good record in the output", daemon.log_tail, interval=0.3)
        wait_settled(kafka, group, topic, 1, daemon)
        figures = wait_for(lambda: (f := share_figures(daemon)) and sum(v.rejected for v in f.values() if v) == len(bad)
                           and f, WAIT, "the rejected records in kdaemon status", daemon.log_tail)
        got = output(daemon)
        assert daemon.stop() == 0
    assert {o for _, o in got} == set(offsets) - bad
    assert sum(f.released for f in figures.values()) >= 1
    assert "flush failed: OSError: fail_flush: injected flush failure" in daemon.log()
    print(f"{len(got)} lines for {len(offsets) - len(bad)} records; "
          + ", ".join(f"worker {i}: {f}" for i, f in sorted(figures.items())))


def test_poison_records_reach_the_dlq_after_the_delivery_count_limit(kafka, tmp_path):
    topic, group = names()
    create_topic(kafka.bootstrap, topic, 1)
    plugins = plugin_dir(tmp_path / "plugins", {"share_poison": PLUGINS / "kd_share_faults.py"})
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=2,
                                 share={"record_lock_duration_ms": 1_000, "delivery_count_limit": 3})
    config["plugins"] = ["share_poison"]
    config["interceptors"] = [{"name": "crash_on", "settings": {"header": "poison"}}]
    config["kafka"]["max_poll_records"] = 1   # the poison record alone in its batch, mostly
    config["dlq"] = {"type": "jsonl", "path": str(tmp_path / "dlq"), "fsync": False}
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    with Daemon(tmp_path, config, env=env) as daemon:
        daemon.wait_all_ready(WAIT)
        # One record a batch (a produce each): a share group hands out whole batches, and every
        # record of a batch that kills its worker comes back with its delivery count raised.
        rows = [(b"k%d" % i, b"v%d" % i, (("poison", b"1"),) if i in (3, 7) else ()) for i in range(10)]
        offsets = [produce(kafka.bootstrap, topic, [row], partition=0)[0].offset for row in rows]
        poison = {offsets[3], offsets[7]}
        dlq_dir = tmp_path / "dlq"

        def dead_letters():
            out = []
            for path in sorted(dlq_dir.glob("*.jsonl*")) if dlq_dir.exists() else ():
                out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            return out
        wait_for(lambda: {d["offset"] for d in dead_letters()} >= poison, WAIT, "both poison records in the DLQ",
                 daemon.log_tail, interval=0.3)
        wait_for(lambda: set(offsets) - poison <= {o for _, o in output(daemon)}, WAIT,
                 "every other record in the output", daemon.log_tail, interval=0.3)
        wait_settled(kafka, group, topic, 1, daemon)
        letters = dead_letters()
        got = output(daemon)
        assert daemon.stop() == 0
    assert {o for _, o in got} == set(offsets) - poison, "a poison record reached the sink"
    assert {d["offset"] for d in letters} == poison
    for d in letters:
        headers = {k: base64.b64decode(v["base64"]).decode() if isinstance(v, dict) else v for k, v in d["headers"]}
        assert headers["kdaemon.error"] == "delivery count limit reached: 3 deliveries", d
        assert headers["kdaemon.stage"] == "delivery", d
    # Every delivery of a poison record but its last killed the worker that got it.
    assert daemon.count("exited with code 70") >= 2


def test_a_share_setting_the_broker_refuses_stops_the_daemon(kafka, tmp_path):
    """A [share] value outside the broker's bounds (the shared broker's lock is 1 s at least) is
    permanent: worker 0 cannot start, the daemon stops with exit 4 naming the setting."""
    topic, group = names()
    create_topic(kafka.bootstrap, topic, 1)
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, workers=2,
                                 share={"record_lock_duration_ms": 500})
    with Daemon(tmp_path, config) as daemon:
        assert daemon.wait_exit(WAIT) == EXIT_BOOT_FAILURE
    log = daemon.log()
    assert "worker 0 cannot start: the [share] settings: " in log, daemon.log_tail()
    assert "share.record.lock.duration.ms" in log


def test_check_config_says_what_the_group_has_now(kafka, tmp_path):
    """Connected, ``check-config`` names each share setting the daemon sets and what the group
    has now (DescribeConfigs on the GROUP resource)."""
    topic, group = names()
    set_group_configs(kafka.bootstrap, group, {"share.record.lock.duration.ms": "2000"})
    config = share_daemon_config(tmp_path, kafka.bootstrap, topic, group, share={"record_lock_duration_ms": 5000})
    daemon = Daemon(tmp_path, config)   # only its configuration file: never started
    proc = subprocess.run(kdaemon_command() + ["check-config", "-c", str(daemon.config_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"share group {group}: share.record.lock.duration.ms set to 5000 at start ([share] " \
           "record_lock_duration_ms)" in lines
    assert f"share group {group} has now: share.record.lock.duration.ms = 2000 (the daemon sets 5000 at start)" \
        in lines, proc.stdout
    assert any(line.startswith(f"share group {group} has now: share.delivery.count.limit = ") for line in lines)
