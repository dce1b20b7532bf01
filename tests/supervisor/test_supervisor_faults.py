"""The supervisor against workers that fail, end to end: ``kdaemon run`` as a real process,
Tansu for the records and the commits, the jsonl sink for the output.

The faults come from a plugin written into the test's directory (enabled by Python path, as in
test_supervisor_hooks.py): a deserializer and a sink, both named ``faulty``, driven by the
record's value:

* ``poison`` raises (a record that cannot be deserialized);
* ``grow`` allocates ``KD_FAULT_GROW_MB`` and keeps it (a worker whose memory runs away);
* ``sink-fail`` makes the ``faulty`` sink refuse the batch;
* ``hang`` blocks for ever, once: the first worker to see it creates ``KD_FAULT_FLAG`` and hangs
  (no heartbeat, SIGTERM not honoured); a successor finds the flag and reads it as a value.

and a ``kdaemon_post_fork`` hook that SIGKILLs the fresh worker when ``KD_FAULT_CRASH_AT_BOOT`` is
set (a crash before the worker is ready: not a boot failure the worker could report).

All daemons here use static assignment (no group): what is under test is the supervisor, and a
worker that needs no JoinGroup is ready at once and beats without the pauses a join has.

Covered elsewhere: a SIGKILLed worker replaced without moving partitions (test_supervisor_e2e
``test_killed_worker_is_replaced_...``), a worker that cannot boot stopping the daemon with 4
(``test_worker_that_cannot_boot_stops_the_daemon_with_exit_4``), and the SIGTERM path of a
clean stop within shutdown_timeout_s (same file).
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from datetime import datetime
from pathlib import Path

from kdaemon.exit_codes import EXIT_BOOT_FAILURE, EXIT_FAILURE, EXIT_OK, EXIT_STOPPED_ON_ERROR
from testkit.daemon import Daemon, daemon_config, wait_for
from testkit.produce import committed_offsets, create_topic, produce

PLUGIN = '''
import os, signal, time
from kdaemon.plugins import hookimpl

_KEPT = []


def faulty(settings):
    def deserialize(topic, headers, data):
        if data == b"poison":
            raise ValueError("a poison record")
        if data == b"grow":
            _KEPT.append(b"\\x01" * (int(os.environ["KD_FAULT_GROW_MB"]) << 20))   # resident: written
        elif data == b"hang":
            flag = os.environ["KD_FAULT_FLAG"]
            if not os.path.exists(flag):
                open(flag, "w").close()
                while True:          # SIGTERM's handler runs and returns: the sleep goes on
                    time.sleep(1)
        return data.decode()
    return deserialize


@hookimpl
def kdaemon_deserializers():
    return {"faulty": faulty}


class FaultySink:
    """Refuses any batch holding the value ``sink-fail``; what it takes it appends to
    ``KD_FAULT_SINK_OUT`` as "partition offset" lines on flush."""

    def __init__(self):
        self.pending = []

    def write(self, records):
        if any(r.value == "sink-fail" for r in records):
            raise RuntimeError("the sink refuses")
        self.pending += [f"{r.partition} {r.offset}\\n" for r in records]

    def flush(self):
        with open(os.environ["KD_FAULT_SINK_OUT"], "a") as fh:
            fh.writelines(self.pending)
        self.pending = []

    def close(self):
        pass


@hookimpl
def kdaemon_sinks(context):
    return {"faulty": lambda settings: FaultySink()}


@hookimpl
def kdaemon_post_fork(index, config):
    if os.environ.get("KD_FAULT_CRASH_AT_BOOT"):
        os.kill(os.getpid(), signal.SIGKILL)
'''

_STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})"


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _when(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _daemon(tmp_path: Path, bootstrap: str, topic: str, *, env: dict | None = None, **daemon) -> Daemon:
    module = f"kd_faults_{uuid.uuid4().hex[:8]}"
    (tmp_path / "pyplugins").mkdir()
    (tmp_path / "pyplugins" / f"{module}.py").write_text(PLUGIN)
    daemon.setdefault("assignment", "static")
    config = daemon_config(tmp_path, bootstrap, topic, _name("g"), **daemon)
    config["plugins"] = [f"{module}:"]
    config["deserializer"] = {"key": "str", "value": "faulty"}
    pythonpath = os.pathsep.join(p for p in (str(tmp_path / "pyplugins"), os.environ.get("PYTHONPATH")) if p)
    return Daemon(tmp_path, config, env={"PYTHONPATH": pythonpath, "KD_FAULT_FLAG": str(tmp_path / "hung"),
                                         **(env or {})})


def _produce(bootstrap: str, topic: str, partition: int, values: list[str]) -> list[int]:
    """The offsets of ``values``, produced in order into ``partition``."""
    return [r.offset for r in produce(bootstrap, topic, [{"value": v.encode()} for v in values],
                                      partition=partition)]


def _positions(d: Daemon) -> list[tuple[int, int]]:
    return sorted((r["partition"], r["offset"]) for r in d.output())


def _committed(d: Daemon, bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    return committed_offsets(bootstrap, d.config["kafka"]["group_id"], topic, partitions)


def _wait_committed(d: Daemon, bootstrap: str, topic: str, partitions: int, want: dict[int, int],
                    timeout: float = 30) -> None:
    wait_for(lambda: _committed(d, bootstrap, topic, partitions) == want, timeout,
             f"committed offsets {want}", lambda: f"{_committed(d, bootstrap, topic, partitions)}\n{d.log_tail()}",
             interval=0.3)


# -- on_*_error = "stop" ---------------------------------------------------------------------------

def test_a_worker_stopped_by_its_error_policy_stops_the_daemon_with_exit_3(broker, tmp_path):
    """on_deserialize_error = "stop" and a poison record in partition 0: its worker commits what
    came before and exits 3; the supervisor does not restart it into the same record but stops
    the other worker gracefully (it drains and commits) and exits 3.  The poison record's offset
    is the committed one: nothing at or after it was committed or written."""
    topic = _name("poison")
    create_topic(broker.bootstrap, topic, partitions=2)
    with _daemon(tmp_path, broker.bootstrap, topic, workers=2, on_deserialize_error="stop") as d:
        d.wait_all_ready()
        first = {p: _produce(broker.bootstrap, topic, p, [f"first-{p}-{i}" for i in range(5)]) for p in (0, 1)}
        _wait_committed(d, broker.bootstrap, topic, 2, {0: 5, 1: 5})
        poison, *after = _produce(broker.bootstrap, topic, 0, ["poison", "after-0", "after-1"])
        other = _produce(broker.bootstrap, topic, 1, [f"second-1-{i}" for i in range(5)])
        code = d.wait_exit(60)
        log = d.log()
        output = _positions(d)
    assert code == EXIT_STOPPED_ON_ERROR, log
    assert "deserialization failed" in log and "a poison record" in log, log
    assert re.search(r"worker 0 \(pid \d+\) stopped on an error policy \(exit 3\); see its log above\. "
                     r"Stopping every worker instead of restarting it", log), log
    assert "restarting in" not in log, log
    assert len(re.findall(r"started worker \d", log)) == 2, log   # nothing was restarted
    assert re.search(r"worker 1 \(pid \d+\) stopped with code 0", log), log
    assert "supervisor exiting with code 3" in log, log
    committed = _committed(d, broker.bootstrap, topic, 2)
    assert committed[0] == poison == 5, committed
    # The other worker may have stopped before it saw the second records; what it wrote, it committed.
    written_1 = [o for p, o in output if p == 1]
    assert written_1 == list(range(len(written_1))) and set(first[1]) <= set(written_1) <= set(first[1] + other)
    assert committed[1] == len(written_1), (committed, written_1)
    assert [o for p, o in output if p == 0] == first[0], output
    assert not {poison, *after} & {o for p, o in output if p == 0}


def test_a_sink_failure_under_stop_stops_the_daemon_with_exit_3(broker, tmp_path):
    """on_sink_error = "stop": a batch the sink refuses stops its worker (exit 3) and the daemon
    with it (exit 3), the records before it written and committed, none from that batch on."""
    topic = _name("sinkstop")
    create_topic(broker.bootstrap, topic, partitions=1)
    sink_out = tmp_path / "sink-out"
    d = _daemon(tmp_path, broker.bootstrap, topic, workers=1, on_sink_error="stop",
                env={"KD_FAULT_SINK_OUT": str(sink_out)})
    d.write_config({**d.config, "sink": {"type": "faulty"}})
    with d:
        d.wait_all_ready()
        first = _produce(broker.bootstrap, topic, 0, [f"first-{i}" for i in range(4)])
        _wait_committed(d, broker.bootstrap, topic, 1, {0: 4})
        failing = _produce(broker.bootstrap, topic, 0, ["sink-fail", "after"])
        code = d.wait_exit(60)
        log = d.log()
    assert code == EXIT_STOPPED_ON_ERROR, log
    assert "sink write failed: RuntimeError: the sink refuses" in log, log
    assert re.search(r"worker 0 \(pid \d+\) stopped on an error policy \(exit 3\)", log), log
    assert "restarting in" not in log and len(re.findall(r"started worker \d", log)) == 1, log
    assert _committed(d, broker.bootstrap, topic, 1) == {0: failing[0]}
    assert sink_out.read_text().split("\n")[:-1] == [f"0 {o}" for o in first]


# -- crashes before ready, and the restart backoff --------------------------------------------------

def test_crash_loop_before_ready_backs_off_then_gives_up_with_exit_4(tmp_path):
    """A worker that dies right after fork, every time (no broker needed: it never gets that far):
    the supervisor restarts it after delays that grow by the backoff's factor (0.5 s, 1 s, 2 s,
    ...), each restart coming no sooner than the delay it announced, and after the fifth death
    before ever being ready it stops with exit code 4 rather than loop for ever."""
    with _daemon(tmp_path, "127.0.0.1:1", "t", workers=1, env={"KD_FAULT_CRASH_AT_BOOT": "1"}) as d:
        code = d.wait_exit(90)
        log = d.log()
    assert code == EXIT_BOOT_FAILURE, log
    starts = [_when(m[1]) for m in re.finditer(_STAMP + r" .*started worker 0 \(pid \d+\)", log)]
    exits = [(_when(m[1]), float(m[2])) for m in
             re.finditer(_STAMP + r" .*worker 0 \(pid \d+\) exited with code -9; restarting in ([\d.]+)s", log)]
    assert len(starts) == 5 and len(exits) == 4, log
    delays = [delay for _, delay in exits]
    assert delays[0] > 0 and all(b == 2 * a for a, b in zip(delays, delays[1:])), delays
    for (exited_at, delay), started_at in zip(exits, starts[1:]):
        assert started_at - exited_at >= delay - 0.002, (exited_at, delay, started_at)   # ms log stamps
    assert "worker 0 died 5 times before ever getting its assignment; stopping" in log, log
    assert "supervisor exiting with code 4" in log, log


def _restarts(d, worker: str) -> dict[str, float]:
    """kdaemon_worker_restarts_total of one worker, by reason."""
    return {dict(labels)["reason"]: value for (name, labels), value in d.metrics().items()
            if name == "kdaemon_worker_restarts_total" and dict(labels)["worker"] == worker}


# -- a hung worker -----------------------------------------------------------------------------------

def test_hung_worker_is_killed_after_heartbeat_timeout_and_replaced(broker, tmp_path):
    """A record whose deserializer blocks: the worker stops beating.  After heartbeat_timeout_s
    the supervisor SIGKILLs it and starts another for the same index, which reads on from the
    last commit: the records before the hang are not written again, the hang record and the
    ones after it are written once."""
    topic = _name("hang")
    create_topic(broker.bootstrap, topic, partitions=1)
    timeout_s = 3.0
    with _daemon(tmp_path, broker.bootstrap, topic, workers=1, heartbeat_timeout_s=timeout_s) as d:
        d.wait_all_ready()
        first = _produce(broker.bootstrap, topic, 0, [f"first-{i}" for i in range(5)])
        _wait_committed(d, broker.bootstrap, topic, 1, {0: 5})
        hung_pid = d.workers()[0]
        mark = len(d.log())
        rest = _produce(broker.bootstrap, topic, 0, ["hang", "after-0", "after-1"])
        wait_for((tmp_path / "hung").exists, 30, "the worker to hang", d.log_tail)
        killed = d.wait_log(rf"worker 0 \(pid {hung_pid}\) missed its heartbeat for (\d+)s; killing and "
                            r"replacing it", 30, after=mark)
        assert float(killed[1]) >= timeout_s - 1, killed[0]   # "%.0f": rounded
        d.wait_log(rf"worker 0 \(pid {hung_pid}\) exited with code -9; restarting in", 15, after=mark)
        new = d.wait_log(r"started worker 0 \(pid (\d+)\)", 15, after=mark)
        assert int(new[1]) != hung_pid
        assert _restarts(d, "0") == {"exit": 0, "signal": 0, "heartbeat_timeout": 1, "memory": 0}, d.metrics()
        _wait_committed(d, broker.bootstrap, topic, 1, {0: rest[-1] + 1})
        assert d.stop(30) == EXIT_OK, d.log_tail()
        output = _positions(d)
    assert output == [(0, o) for o in first + rest], output


# -- recycling at max_worker_rss_mb -------------------------------------------------------------------

def test_worker_above_max_rss_is_recycled_gracefully(broker, tmp_path):
    """A record makes the worker allocate past max_worker_rss_mb: the supervisor's 5-s sample sees
    it, stops that worker with SIGTERM (it flushes and commits: exit 0) and starts a successor,
    which starts at the committed offsets.  Every record is written exactly once; the successor,
    back to a normal size, is not recycled again."""
    topic = _name("rss")
    create_topic(broker.bootstrap, topic, partitions=2)
    limit_mb = 400
    with _daemon(tmp_path, broker.bootstrap, topic, workers=1, max_worker_rss_mb=limit_mb,
                 env={"KD_FAULT_GROW_MB": str(limit_mb + 200)}) as d:
        d.wait_all_ready()
        old_pid = d.workers()[0]
        mark = len(d.log())
        produced = {0: _produce(broker.bootstrap, topic, 0, ["a-0", "grow", "a-1"]),
                    1: _produce(broker.bootstrap, topic, 1, [f"b-{i}" for i in range(3)])}
        recycled = d.wait_log(rf"worker 0 \(pid {old_pid}\) uses (\d+) MB > max_worker_rss_mb={limit_mb}; "
                              r"recycling it", 40, after=mark)
        assert int(recycled[1]) > limit_mb
        d.wait_log(rf"worker 0 \(pid {old_pid}\) stopped with code 0", 30, after=mark)
        new_pid = int(d.wait_log(r"started worker 0 \(pid (\d+)\)", 15, after=mark)[1])
        d.wait_log(rf"worker 0 \(pid {new_pid}\) has its assignment", 30, after=mark)
        assert _restarts(d, "0") == {"exit": 0, "signal": 0, "heartbeat_timeout": 0, "memory": 1}, d.metrics()
        # Committed by the old worker as it stopped, and not moved since.
        assert _committed(d, broker.bootstrap, topic, 2) == {0: 3, 1: 3}
        more = {p: _produce(broker.bootstrap, topic, p, [f"c-{p}-{i}" for i in range(3)]) for p in (0, 1)}
        _wait_committed(d, broker.bootstrap, topic, 2, {0: 6, 1: 6})
        # The old worker's resource series went when it was reaped: one for index 0 now is a
        # sample of the successor, which the supervisor would have recycled on that very sample.
        rss = wait_for(lambda: {v for (name, labels), v in d.metrics().items()
                                if name == "kdaemon_worker_rss_bytes" and dict(labels)["worker"] == "0"},
                       30, "a resource sample of the successor", d.log_tail, interval=0.5)
        assert max(rss) < limit_mb << 20, rss
        assert d.log().count("recycling it") == 1, d.log_tail()
        assert d.workers() == {0: new_pid}
        assert d.stop(30) == EXIT_OK, d.log_tail()
        output = _positions(d)
    assert output == sorted((p, o) for p in (0, 1) for o in produced[p] + more[p]), output


# -- SIGKILL after shutdown_timeout_s -----------------------------------------------------------------

def test_worker_that_does_not_stop_is_killed_after_shutdown_timeout(broker, tmp_path):
    """SIGTERM while one worker hangs in its pipeline (it cannot honour the stop): the other one
    stops cleanly (exit 0, everything committed); the hung one is SIGKILLed once
    shutdown_timeout_s has passed, its partition committed only up to the record it hung on, and
    the daemon exits 1 (not a clean stop: that record comes again)."""
    topic = _name("shutdown")
    create_topic(broker.bootstrap, topic, partitions=2)
    shutdown_s = 3.0
    with _daemon(tmp_path, broker.bootstrap, topic, workers=2, shutdown_timeout_s=shutdown_s,
                 heartbeat_timeout_s=120.0) as d:
        d.wait_all_ready()
        workers = d.workers()
        # Static assignment: worker i takes every 2nd partition from i on, so partition p is worker p's.
        for p in (0, 1):
            _produce(broker.bootstrap, topic, p, [f"first-{p}-{i}" for i in range(3)])
        _wait_committed(d, broker.bootstrap, topic, 2, {0: 3, 1: 3})
        hang, *_ = _produce(broker.bootstrap, topic, 0, ["hang", "after"])
        second = _produce(broker.bootstrap, topic, 1, ["second-1-0", "second-1-1"])
        wait_for((tmp_path / "hung").exists, 30, "worker 0 to hang", d.log_tail)
        _wait_committed(d, broker.bootstrap, topic, 2, {0: 3, 1: second[-1] + 1})
        mark = len(d.log())
        d.signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = d.wait_exit(shutdown_s + 60)
        took = time.monotonic() - signalled
        log = d.log()[mark:]
    assert code == EXIT_FAILURE, log
    assert took >= shutdown_s, took
    assert re.search(rf"worker 0 \(pid {workers[0]}\) did not stop within {shutdown_s:.0f}s; killing it", log), log
    assert re.search(rf"worker 0 \(pid {workers[0]}\) stopped with code -9", log), log
    assert re.search(rf"worker 1 \(pid {workers[1]}\) stopped with code 0", log), log
    assert "supervisor exiting with code 1" in log, log
    assert _committed(d, broker.bootstrap, topic, 2) == {0: hang, 1: second[-1] + 1}
