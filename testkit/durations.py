"""Where a test run's wall time goes: pytest's ``--durations=0`` report, broken down.

    .venv/bin/python -m testkit.durations run.log [--cpu cpu.jsonl]

``run.log`` is the output of a run with ``--durations=0`` (every test's setup, call and teardown
times).  The breakdown: time by phase; by folder (the package under test); the setups over 5 s,
which are fixture starts (an Apache Kafka cluster, a Schema Registry, a SparkSession) since a
test's own work is in its call; and the calls by what they wait on, from their names.

``--cpu`` adds what the tests computed: tests/conftest.py writes one JSON line per test
(``{"nodeid", "wall_s", "cpu_s", "end", "worker"}``: setup, call and teardown together; the CPU of the test process
and of the children it reaped: daemons, JVM peers, tools; not the shared brokers') when
``KDAEMON_TEST_CPU=path`` is set.  Wall time with no CPU
behind it is waiting: brokers' group timers, session timeouts, sleeps, polls.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")
FIXTURE_START_S = 5.0


def parse(text: str) -> list[tuple[float, str, str]]:
    """(seconds, phase, nodeid) for every line of the durations report."""
    return [(float(m[1]), m[2], m[3]) for m in map(LINE.match, text.splitlines()) if m]


def folder(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")
    return "/".join(parts[:3]) if len(parts) > 3 and parts[1] in ("sinks", "plugins") else "/".join(parts[:2])


def table(title: str, rows: dict[str, float], total: float, top: int = 40) -> list[str]:
    out = [f"{title}", f"{'':<48} {'seconds':>9} {'share':>6}"]
    for name, s in sorted(rows.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"{name:<48} {s:>9.1f} {100 * s / total if total else 0:>5.1f}%")
    return out + [""]


def breakdown(entries: list[tuple[float, str, str]], cpu: list[dict] | None = None) -> str:
    total = sum(s for s, _, _ in entries)
    by_phase: dict[str, float] = defaultdict(float)
    by_folder: dict[str, float] = defaultdict(float)
    for s, phase, nodeid in entries:
        by_phase[phase] += s
        by_folder[folder(nodeid)] += s
    starts = {f"{nodeid.split('::')[0]} ({phase})": s for s, phase, nodeid in entries
              if phase in ("setup", "teardown") and s >= FIXTURE_START_S}
    lines = [f"{len({n for _, _, n in entries})} tests, {total:.0f} s of test time "
             f"(the sum over workers; the run's wall time is pytest's last line)", ""]
    lines += table("by phase", dict(by_phase), total)
    lines += table("by folder", dict(by_folder), total)
    lines += table(f"setups and teardowns over {FIXTURE_START_S:.0f} s (fixture starts and stops)",
                   starts, total, top=30)
    if cpu:
        wall = sum(r["wall_s"] for r in cpu)
        used = sum(r["cpu_s"] for r in cpu)
        lines.append(f"CPU: {used:.0f} s of {wall:.0f} s of test time ({100 * used / wall:.0f}%); "
                     f"the rest, {wall - used:.0f} s, is waiting")
        waits: dict[str, float] = defaultdict(float)
        for r in cpu:
            waits[folder(r["nodeid"])] += r["wall_s"] - r["cpu_s"]
        lines += [""] + table("waiting (wall - CPU) by folder", dict(waits), wall - used)
        lines += workers(cpu)
    return "\n".join(lines)


def workers(cpu: list[dict]) -> list[str]:
    """Each xdist worker's busy time and when it finished, and each group's (a lane, a module
    with a cluster of its own) time and end, from the records' ``worker`` and ``end``: the run
    ends with its last worker, so this is where an unbalanced lane shows."""
    timed = [r for r in cpu if "end" in r and "worker" in r]
    if not timed:
        return []
    t0 = min(r["end"] - r["wall_s"] for r in timed)
    busy: dict[str, float] = defaultdict(float)
    last: dict[str, float] = defaultdict(float)
    groups: dict[str, list[float]] = {}
    for r in timed:
        busy[r["worker"]] += r["wall_s"]
        last[r["worker"]] = max(last[r["worker"]], r["end"] - t0)
        if "@" in r["nodeid"]:
            g = groups.setdefault(r["nodeid"].rsplit("@", 1)[1], [0.0, float("inf"), 0.0])
            g[0] += r["wall_s"]
            g[1] = min(g[1], r["end"] - r["wall_s"] - t0)
            g[2] = max(g[2], r["end"] - t0)
    out = ["", f"{'worker':<48} {'busy s':>9} {'ends at':>8}"]
    out += [f"{w:<48} {busy[w]:>9.0f} {last[w]:>8.0f}" for w in sorted(busy)]
    out += ["", f"{'group (lane or module unit)':<48} {'busy s':>9} {'from':>6} {'to':>6}"]
    for name, (b, start, end) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:20]:
        out.append(f"{name:<48} {b:>9.0f} {start:>6.0f} {end:>6.0f}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--cpu", type=Path)
    args = parser.parse_args(argv)
    entries = parse(args.log.read_text(errors="replace"))
    if not entries:
        print(f"{args.log}: no durations (run pytest with --durations=0)", file=sys.stderr)
        return 2
    cpu = [json.loads(line) for line in args.cpu.read_text().splitlines() if line] if args.cpu else None
    print(breakdown(entries, cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
