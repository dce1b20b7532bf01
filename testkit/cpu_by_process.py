"""Where a test run's CPU goes, by process: every process sampled from /proc once a second.

The suite is CPU-bound on two cores (docs/TESTING.md), and two thirds of its CPU is JVMs that
pytest's own records do not see (shared brokers, Spark sessions that outlive a test, daemons'
uploaders).  ``record`` samples every process's CPU (utime + stime of all its threads) until
stopped; ``report`` keeps the processes under the first ``make test`` (or the given root pid)
and sums them by kind: Spark drivers by who started them, Kafka nodes shared or of a suite's own
cluster, Kafka's tools, the Java peer, the archives being made, the daemons, the test workers.
A process that lived less than a sample is missed (they are the cheap ones).

    .venv/bin/python -m testkit.cpu_by_process record /tmp/procs.jsonl &   # beside the run
    make test; kill %1
    .venv/bin/python -m testkit.cpu_by_process report /tmp/procs.jsonl
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import time


def record(out: str, interval: float = 1.0) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    seen: dict[tuple[int, int], dict] = {}
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    me = os.getpid()
    while not stop:
        now = time.time()
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) == me:
                continue
            try:
                with open(f"/proc/{name}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            close = stat.rindex(")")
            fields = stat[close + 2:].split()
            key = (int(name), int(fields[19]))   # pid and start time: a reused pid is another process
            entry = seen.get(key)
            if entry is None:
                try:
                    with open(f"/proc/{name}/cmdline", "rb") as fh:
                        cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:4000]
                except OSError:
                    cmd = ""
                entry = seen[key] = {"pid": key[0], "ppid": int(fields[1]), "comm": stat[stat.index("(") + 1:close],
                                     "cmd": cmd, "first": now}
            entry["last"] = now
            entry["cpu"] = (int(fields[11]) + int(fields[12])) / tick
        time.sleep(interval)
    with open(out, "w") as fh:
        for entry in seen.values():
            fh.write(json.dumps(entry) + "\n")


def _tree(procs: list[dict], root_pid: int | None) -> tuple[list[dict], dict[int, dict]]:
    by_pid = collections.defaultdict(list)
    for p in procs:
        by_pid[p["pid"]].append(p)

    def parent(p: dict) -> dict | None:
        found = [q for q in by_pid.get(p["ppid"], []) if q["first"] <= p["first"] + 1]
        return found[-1] if found else None

    roots = [p for p in procs if (p["pid"] == root_pid if root_pid else p["cmd"].startswith("make test"))]
    if not roots:
        sys.exit("no root process in the record (make test, or the pid given)")
    inside = {id(roots[0])}
    grew = True
    while grew:
        grew = False
        for p in procs:
            if id(p) not in inside and (q := parent(p)) is not None and id(q) in inside:
                inside.add(id(p))
                grew = True
    return [p for p in procs if id(p) in inside], {id(p): parent(p) for p in procs}


def kind(p: dict, ancestry: str) -> str:
    cmd = p["cmd"]
    # (A Spark driver is first seen as the spark-class script it is exec'd from; a long class
    # path cuts a command line before its main class, so the log4j file names a Kafka node.)
    jvm = p["comm"] in ("java", "bash", "spark-submit") or "/java " in cmd[:40] or "spark-class" in cmd
    if "testkit.jvm_archive" in ancestry and jvm:
        return "JVM: class-data archives being made"
    if jvm and ("pyspark" in cmd or "spark-class" in cmd or "--add-opens" in cmd or p["comm"] == "spark-submit"):
        if "kdaemon" in ancestry and ("companion" in ancestry or " run " in ancestry):
            return "JVM: Spark drivers of daemons' uploaders"
        return "JVM: Spark sessions of the test processes (readers, writers)"
    if jvm and ("kafka.Kafka " in cmd or ("/node" in cmd and "log4j2.xml" in cmd)):
        return "JVM: Kafka nodes, shared by the run" if "shared-servers" in cmd else "JVM: Kafka nodes of suites' own clusters"
    if jvm and ("KafkaPeer" in cmd or "/peer/" in cmd):
        return "JVM: the Java peer (Java's consumers)"
    if jvm and "kafka-4" in cmd:
        return "JVM: Kafka's storage format and tools"
    if jvm:
        return "JVM: other (" + (cmd.split() or [p["comm"]])[-1][:40] + ")"
    if "execnet" in cmd or "exec(eval(sys.stdin" in cmd:
        return "Python: pytest workers (the tests)"
    if "kdaemon" in cmd and (" run" in cmd or "companion_run" in cmd):
        return "Python: daemons (supervisors, workers, uploaders)"
    if "python" in p["comm"] or "python" in cmd.split(" ")[0] or "tansu" in cmd:
        return "Python: other (tools, children of tests)"
    return "other: " + p["comm"]


def report(path: str, root_pid: int | None = None) -> None:
    procs = [json.loads(line) for line in open(path)]
    inside, parents = _tree(procs, root_pid)

    def ancestry(p: dict) -> str:
        out, q = [], parents.get(id(p))
        for _ in range(8):
            if q is None:
                break
            out.append(q["cmd"][:120])
            q = parents.get(id(q))
        return " | ".join(out)

    sums: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for p in inside:
        k = kind(p, ancestry(p))
        sums[k][0] += 1
        sums[k][1] += p["cpu"]
    total = sum(c for _, c in sums.values())
    print(f"{total:.0f} CPU-s in {len(inside)} processes")
    print(f"{'CPU-s':>8} {'share':>6} {'procs':>6} {'each':>6}  what")
    for k, (n, c) in sorted(sums.items(), key=lambda kv: -kv[1][1]):
        print(f"{c:8.0f} {c / total:6.1%} {n:6d} {c / n:6.1f}  {k}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "record":
        record(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "report":
        report(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
    else:
        sys.exit(__doc__)
