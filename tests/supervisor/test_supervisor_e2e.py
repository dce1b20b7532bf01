"""The supervisor end to end: ``kdaemon run`` as a real process against Tansu, two workers in
group mode (static membership, instance ids ``kd-0`` and ``kd-1``), a topic of 4 partitions,
records produced with confluent-kafka while it runs, output read back from the jsonl sink.

How the group is observed:

* Which partitions a worker holds: each worker reports ``generation`` and ``partitions`` over
  its heartbeat pipe whenever it (re)gets an assignment, and the supervisor logs
  ``worker <i> (pid <p>) has its assignment: generation <g>, [...]``.
* Whether a member took part in a rebalance: every JoinGroup a worker completes is in its log
  (``worker-<i> ...: joined generation <g>``).  "No rebalance" is asserted as: during and after
  a restart of worker <i>, the other worker completes no JoinGroup (waiting until the restarted
  incarnation's predecessor would have passed its session timeout, which is when Tansu would
  otherwise have asked the others to rejoin), and every assignment reported since equals the
  one that index had before.
* Generation ids are reported and compared too, but prove little on Tansu 0.6: it keeps 0
  through rounds in which members do rejoin.

Static membership on Tansu only holds while a restart completes within the session timeout;
see ``SESSION_TIMEOUT_MS`` in the harness for why the tests use 12 s rather than 6 s.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import uuid
from collections import Counter


from kdaemon.config import dump_toml
from testkit.daemon import SESSION_TIMEOUT_MS, Daemon, daemon_config, free_port, wait_for
from testkit.produce import committed_offsets as read_committed_offsets, create_topic, produce

PARTITIONS = 4


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce_tagged(bootstrap: str, topic: str, tag: str, per_partition: int,
                   kind=lambda i: None) -> list[dict]:
    """``per_partition`` records into every partition; value ``<tag>-<p>-<i>``, header
    ``type=<kind(i)>`` unless None.  Returns what was produced, with partition and offset."""
    out = []
    for p in range(PARTITIONS):
        kinds = [kind(i) for i in range(per_partition)]
        records = [{"key": str(p).encode(), "value": f"{tag}-{p}-{i}".encode(),
                    "headers": [("type", k.encode())] if k else []} for i, k in enumerate(kinds)]
        for i, report in enumerate(produce(bootstrap, topic, records, partition=p)):
            out.append({"partition": report.partition, "offset": report.offset,
                        "value": f"{tag}-{p}-{i}", "kind": kinds[i]})
    return out


def positions(records) -> set[tuple[int, int]]:
    return {(r["partition"], r["offset"]) for r in records}


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    return read_committed_offsets(bootstrap, group, topic, PARTITIONS)


def partitions_of(d: Daemon, after: int = 0) -> dict[int, list[str]]:
    """Worker index -> the last assignment it reported (from log position ``after``)."""
    return {r["index"]: r["partitions"] for r in d.ready_lines(after)}


# -- a worker dies ---------------------------------------------------------------------------------

def test_killed_worker_is_replaced_without_moving_partitions_and_nothing_is_lost(broker, tmp_path):
    """SIGKILL a worker while records arrive: the supervisor forks a new worker for the same
    index, which takes the same static instance id and the same partitions; the other worker
    keeps its pid and its partitions.  Every produced record ends up in the sink; duplicates
    only in the killed worker's partitions (what it wrote after its last commit).  Then SIGTERM:
    exit 0 within shutdown_timeout_s, and every partition committed up to its end."""
    topic, group = _name("kill"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    config = daemon_config(tmp_path, broker.bootstrap, topic, group)
    shutdown_timeout = config["daemon"]["shutdown_timeout_s"]
    produced: list[dict] = []
    with Daemon(tmp_path, config) as d:
        d.wait_all_ready()
        before = partitions_of(d)
        workers = d.workers()
        assert set(before) == set(workers) == {0, 1}, d.log_tail()
        assert sorted(p for ps in before.values() for p in ps) == sorted(f"{topic}-{p}" for p in range(PARTITIONS))

        produced += produce_tagged(broker.bootstrap, topic, "first", 50)
        wait_for(lambda: positions(produced) <= positions(d.output()), 30, "the first records in the sink",
                 d.log_tail)
        generations = {r["index"]: r["generation"] for r in d.ready_lines()}

        # Keep producing while one worker is killed.
        victim, survivor = 1, 0
        started_chunks = threading.Semaphore(0)
        errors: list[BaseException] = []

        def keep_producing() -> None:
            try:
                for chunk in range(8):
                    produced.extend(produce_tagged(broker.bootstrap, topic, f"during{chunk}", 10))
                    started_chunks.release()
                    time.sleep(0.1)
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                started_chunks.release()

        producer = threading.Thread(target=keep_producing, daemon=True)
        producer.start()
        assert started_chunks.acquire(timeout=30)
        assert started_chunks.acquire(timeout=30)
        log_mark = len(d.log())
        os.kill(workers[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        # What the killed worker had committed: its replacement needs seconds to join, so
        # nobody commits these partitions in between.
        committed_at_kill = committed_offsets(broker.bootstrap, group, topic)

        def replacement():
            pid = d.workers().get(victim)
            return pid if pid not in (None, workers[victim]) else None

        new_pid = wait_for(replacement, 15, "a new worker for the killed index", d.log_tail)
        assert re.search(rf"worker {victim} \(pid {workers[victim]}\) exited with code -9; restarting", d.log())
        d.wait_log(rf"worker {victim} \(pid {new_pid}\) has its assignment", 45, after=log_mark)
        producer.join(60)
        assert not producer.is_alive() and not errors, errors
        wait_for(lambda: positions(produced) <= positions(d.output()), 60, "every produced record in the sink",
                 d.log_tail)

        # Past the point where the killed incarnation's session would have expired: a broker
        # that was going to rebalance the survivor has told it by now (heartbeats every 0.5 s).
        time.sleep(max(0.0, killed_at + SESSION_TIMEOUT_MS / 1000 + 2 - time.monotonic()))
        after = d.ready_lines(log_mark)
        assert d.workers()[survivor] == workers[survivor], "the other worker was restarted"
        assert d.joins(survivor, log_mark) == [], f"the survivor was rebalanced:\n{d.log_tail()}"
        assert [r["pid"] for r in after] == [new_pid], after  # only the replacement (re)got partitions
        assert after[0]["partitions"] == before[victim], (after, before)
        assert after[0]["generation"] == generations[victim]
        assert d.joins(victim, log_mark) == [generations[victim]]

        started = time.monotonic()
        d.signal(signal.SIGTERM)
        assert d.wait_exit(shutdown_timeout + 5) == 0, d.log_tail()
        took = time.monotonic() - started
        assert took < shutdown_timeout, f"SIGTERM took {took:.1f}s"
        assert "did not stop within" not in d.log()
        output = d.output()

    # Every partition committed to one past its last record: nothing left to redeliver.
    ends = {p: max(r["offset"] for r in produced if r["partition"] == p) + 1 for p in range(PARTITIONS)}
    assert committed_offsets(broker.bootstrap, group, topic) == ends

    seen = Counter((r["partition"], r["offset"]) for r in output)
    assert set(seen) == positions(produced), (positions(produced) - set(seen), set(seen) - positions(produced))
    by_position = {(r["partition"], r["offset"]): r["value"] for r in produced}
    assert all(by_position[(r["partition"], r["offset"])] == r["value"] for r in output)
    victim_partitions = {int(tp.rsplit("-", 1)[1]) for tp in before[victim]}
    duplicated = {k for k, n in seen.items() if n > 1}
    assert {p for p, _ in duplicated} <= victim_partitions, \
        f"duplicates outside the killed worker's partitions {victim_partitions}: {sorted(duplicated)[:20]}"
    redelivered_committed = sorted((p, o) for p, o in duplicated if o < committed_at_kill[p])
    assert redelivered_committed == [], f"committed records delivered again (committed {committed_at_kill})"


# -- reload, metrics, resize -------------------------------------------------------------------------

def _filters(kind: str) -> list[dict]:
    return [{"header": "type", "op": "equals", "value": kind, "action": "keep"}]


def test_reload_metrics_and_resize(broker, tmp_path):
    """One daemon through: invalid configurations on SIGHUP (refused, same workers); a new
    [[filters]] rule on SIGHUP (workers replaced one at a time, each index keeps its partitions,
    records produced afterwards follow the new rule); /metrics against the sink; TTIN / TTOU."""
    topic, group = _name("reload"), _name("g")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    config = daemon_config(tmp_path, broker.bootstrap, topic, group, filters=_filters("a"))
    kind = lambda i: "a" if i % 2 == 0 else "b"   # noqa: E731
    with Daemon(tmp_path, config) as d:
        d.wait_all_ready()
        before = partitions_of(d)
        generations = {r["index"]: r["generation"] for r in d.ready_lines()}
        workers = d.workers()
        first = produce_tagged(broker.bootstrap, topic, "first", 20, kind)
        wait_for(lambda: positions(r for r in first if r["kind"] == "a") <= positions(d.output()), 30,
                 "the first 'a' records in the sink", d.log_tail)

        # 1. Configurations that cannot be used: the running workers stay.
        for broken, why in ((dump_toml(config).replace("[daemon]", "[daemon\n", 1), "not valid TOML"),
                            (dump_toml({**config, "sink": {"type": "no-such-sink"}}), "no sink named 'no-such-sink'")):
            mark = len(d.log())
            d.write_config(broken)
            d.signal(signal.SIGHUP)
            d.wait_log(r"reload refused, keeping the running configuration", 20, after=mark)
            d.wait_log(re.escape(why), 5, after=mark)
            time.sleep(1.0)  # a reload that went ahead anyway would be stopping a worker by now
            assert d.workers() == workers
            assert "reloading" not in d.log()[mark:] and "started worker" not in d.log()[mark:]

        # 2. A new rule: keep "b" instead of "a"; a new metrics_addr, which takes a restart: said, not
        # applied (/metrics stays where it was, as the checks below show).
        mark = roll_mark = len(d.log())
        moved = f"127.0.0.1:{free_port()}"
        d.write_config({**config, "filters": _filters("b"), "daemon": {**config["daemon"], "metrics_addr": moved}})
        d.signal(signal.SIGHUP)
        d.wait_log(r"reloading .*: rolling 2 worker\(s\) one at a time", 20, after=mark)
        assert re.search(rf"reload: \[daemon\] metrics_addr = '{re.escape(moved)}' is not applied \(the /metrics "
                         rf"endpoint is bound at start\); the daemon keeps '{re.escape(d.metrics_addr)}' until it "
                         "restarts", d.log()[mark:]), d.log_tail()
        d.wait_all_ready(60, after=mark)
        rolled_at = time.monotonic()
        rolled = d.workers()
        assert set(rolled) == {0, 1} and not set(rolled.values()) & set(workers.values()), (workers, rolled)
        stopped = re.findall(r"worker (\d) \(pid (\d+)\) stopped with code (-?\d+)", d.log()[mark:])
        assert sorted(stopped) == sorted((str(i), str(p), "0") for i, p in workers.items()), stopped
        # Static members: each new incarnation joined once, took its predecessor's partitions,
        # and nobody else rejoined (one "has its assignment" per new pid, none for the others).
        after = d.ready_lines(mark)
        assert sorted((r["index"], r["pid"]) for r in after) == sorted(rolled.items()), after
        for r in after:
            assert r["partitions"] == before[r["index"]] and r["generation"] == generations[r["index"]], (r, before)

        second = produce_tagged(broker.bootstrap, topic, "second", 20, lambda i: "b" if i % 2 == 0 else "a")
        # Now every partition ends with an "a" record: wait for all "b" records; the "a" ones
        # before them in the same partitions have been through the filter by then.
        wait_for(lambda: positions(r for r in second if r["kind"] == "b") <= positions(d.output()), 30,
                 "the second batch's 'b' records in the sink", d.log_tail)
        expected = [r for r in first if r["kind"] == "a"] + [r for r in second if r["kind"] == "b"]

        def settled_metrics():
            # Workers publish their counters at most once a second; the old workers' counters
            # stay in the aggregate after they exited (their live gauges do not).
            m = d.metrics()
            delivered = sum(v for (name, _), v in m.items() if name == "kdaemon_records_delivered_total")
            return m if delivered == len(expected) else None

        metrics = wait_for(settled_metrics, 20, "kdaemon_records_delivered_total to reach the sink's count",
                           lambda: f"{d.metrics()}\n{d.log_tail()}", interval=0.3)
        output = d.output()
        assert Counter(r["value"] for r in output) == Counter(r["value"] for r in expected)
        assert sum(v for (name, _), v in metrics.items() if name == "kdaemon_records_delivered_total") == len(output)
        per_partition = {int(dict(labels)["partition"]): v for (name, labels), v in metrics.items()
                         if name == "kdaemon_records_delivered_total"}
        assert per_partition == dict(Counter(r["partition"] for r in output))
        assert {dict(labels)["partition"] for (name, labels) in metrics if name == "kdaemon_records_lag"} == \
            {str(p) for p in range(PARTITIONS)}
        rss = {dict(labels)["worker"]: v for (name, labels), v in metrics.items() if name == "kdaemon_worker_rss_bytes"}
        peak = {dict(labels)["worker"]: v for (name, labels), v in metrics.items()
                if name == "kdaemon_worker_peak_rss_bytes"}
        assert rss and set(peak) == set(rss) and all(peak[w] >= rss[w] > 0 for w in rss), (rss, peak)
        import kdaemon
        build = [dict(labels) for (name, labels), v in metrics.items() if name == "kdaemon_build_info" and v == 1]
        assert len(build) == 1 and build[0]["version"] == kdaemon.__version__, build
        # Per partition: what was committed (the sink's count here: nothing filtered) and the log end.
        committed_ = {int(dict(labels)["partition"]): v for (name, labels), v in metrics.items()
                      if name == "kdaemon_committed_offset"}
        ends = {int(dict(labels)["partition"]): v for (name, labels), v in metrics.items()
                if name == "kdaemon_log_end_offset"}
        assert set(ends) == set(range(PARTITIONS)) and all(committed_.get(p, 0) <= ends[p] for p in ends), \
            (committed_, ends)

        # Nobody rejoined, including when the last replaced incarnation would have expired.
        time.sleep(max(0.0, rolled_at + 3 - time.monotonic()))
        assert d.joins(0, roll_mark) == [generations[0]] and d.joins(1, roll_mark) == [generations[1]], \
            d.log_tail()

        # 3. TTIN: a third worker; TTOU: it goes again.  The first two are untouched.
        mark = len(d.log())
        d.signal(signal.SIGTTIN)
        third = wait_for(lambda: d.workers().get(2), 15, "a third worker", d.log_tail)
        assert {i: p for i, p in d.workers().items() if i != 2} == rolled
        d.wait_log(r"worker-2 kdaemon\.client", 20, after=mark)  # it is up and talking to the broker

        def worker_series(index: str) -> set[str]:
            return {name for (name, labels) in d.metrics() if dict(labels).get("worker") == index}
        resources = {"kdaemon_worker_rss_bytes", "kdaemon_worker_peak_rss_bytes", "kdaemon_worker_cpu_percent"}
        wait_for(lambda: worker_series("2") >= resources, 15, "the third worker's resource gauges (5-s samples)",
                 lambda: f"{sorted(d.metrics())}\n{d.log_tail()}", interval=0.5)
        d.signal(signal.SIGTTOU)
        wait_for(lambda: third not in d.worker_pids(), 20, "the third worker to exit", d.log_tail)
        assert d.workers() == rolled
        # The process is gone once it is a zombie; the supervisor logs it when it has reaped it.
        d.wait_log(rf"worker 2 \(pid {third}\) stopped with code 0", 15, after=mark)
        # Reaped (the line above comes after): a removed worker leaves no stale series behind,
        # and the remaining ones keep theirs.
        assert not worker_series("2") & resources, sorted(d.metrics())
        assert worker_series("0") >= resources and worker_series("1") >= resources, sorted(d.metrics())
        assert "one worker more: 3" in d.log()[mark:] and "one worker less: 2" in d.log()[mark:]

        d.signal(signal.SIGTERM)
        assert d.wait_exit(config["daemon"]["shutdown_timeout_s"] + 5) == 0, d.log_tail()


# -- a worker that cannot boot -------------------------------------------------------------------------

def test_worker_that_cannot_boot_stops_the_daemon_with_exit_4(tmp_path):
    """The sink directory cannot be created (its parent is a regular file): `check-config` cannot
    see that (it does not build sinks: that may create files), every worker fails while building
    its pipeline.  The supervisor must stop with exit code 4 and say why, not restart-loop."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = daemon_config(tmp_path, "127.0.0.1:1", "t", "g")  # never reached
    config["sink"]["path"] = str(blocker / "out")
    with Daemon(tmp_path, config) as d:
        code = d.wait_exit(30)
        log = d.log()
    assert code == 4, log
    assert re.search(r"worker \d \(pid \d+\) cannot boot \(exit 4\); see its log above\. Stopping every worker "
                     r"instead of restarting it in a loop", log), log
    assert "cannot use directory" in log and "Not a directory" in log, log
    assert "restarting in" not in log
    assert len(re.findall(r"started worker \d", log)) == 2, log
    assert "supervisor exiting with code 4" in log
