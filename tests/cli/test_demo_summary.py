"""``kdaemon demo`` end to end (its own embedded broker): the summary's figures are the daemon's
and agree with the output the test reads back itself; the printed read-back command runs, through
a shell, exactly as printed; a terminal gets the live progress bar, a pipe gets none of its
control codes.  The display's two modes are also checked through rich's ``force_terminal`` seam."""

from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from kdaemon.cli.progress import DemoDisplay, console
from kdaemon.demo import DemoProgress, DemoSummary, PartitionCounts
from tests.cli.terminal import ANSI, plain, run_on_pty

pytestmark = pytest.mark.slow

RECORDS, PARTITIONS = 1500, 3
KEPT = {"order.created", "order.shipped"}   # etc/kdaemon.toml's header rule


def demo_command(state: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "kdaemon.cli", "demo", "--records", str(RECORDS), "--partitions", str(PARTITIONS),
            "--state-dir", str(state), *extra]


def summary_rows(stdout: str) -> dict[str, list[int]]:
    """The summary table: partition (or "total") -> records, consumed, filtered, delivered,
    dead-lettered."""
    rows = {}
    for line in stdout.splitlines():
        m = re.fullmatch(r"\s*(\d+|total)((?:\s+\d+){5})\s*", line)
        if m:
            rows[m[1]] = [int(x) for x in m[2].split()]
    return rows


def read_back_line(stdout: str) -> str:
    lines = stdout.splitlines()
    return lines[lines.index("read it back with:") + 1]


def output_records(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_demo_summary_is_the_daemons_and_its_read_back_command_runs(tmp_path):
    state = tmp_path / "demo state"   # a space: the printed command must quote the path
    proc = subprocess.run(demo_command(state), capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "\x1b" not in proc.stdout, "control codes in piped output"

    rows = summary_rows(proc.stdout)
    assert set(rows) == {str(p) for p in range(PARTITIONS)} | {"total"}, proc.stdout
    written = output_records(state / "out")
    delivered = Counter(r["partition"] for r in written)
    assert len({(r["partition"], r["offset"]) for r in written}) == len(written)
    assert {r["value"]["type"] for r in written} <= KEPT
    for p in range(PARTITIONS):
        records, consumed, filtered, delivered_p, dlq = rows[str(p)]
        assert consumed == records, (p, rows)          # a clean run reads every record once
        assert delivered_p == delivered[p], (p, rows, delivered)
        assert filtered + delivered_p + dlq == consumed, (p, rows)
        assert filtered > 0 and dlq == 0
    assert rows["total"] == [sum(r[i] for k, r in rows.items() if k != "total") for i in range(5)]
    assert rows["total"][0] == RECORDS
    assert f"output: {len(written)} records read back from {state / 'out'}" in proc.stdout

    command = read_back_line(proc.stdout)
    assert command.startswith(shlex.quote(sys.executable) + " "), command
    shown = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60, cwd="/")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{len(written)} records"
    assert len(lines) == 6 and all("'topic': 'demo.events'" in line for line in lines[1:]), shown.stdout


def test_demo_on_a_terminal_draws_a_live_bar(tmp_path):
    state = tmp_path / "demo"
    code, text = run_on_pty(demo_command(state), tmp_path, timeout=600)
    assert code == 0, text[-3000:]
    assert ANSI.search(text), "no control codes on a terminal"
    assert "━" in text and f"/{RECORDS}" in plain(text)      # the bar and its M/N column
    shown = plain(text)
    assert "consumed 0 / " not in shown                       # the plain lines are for pipes only
    rows = summary_rows(shown)
    assert rows["total"][0] == RECORDS and rows["total"][3] == len(output_records(state / "out"))
    command = read_back_line(shown)
    ran = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0 and ran.stdout.startswith(f"{rows['total'][3]} records"), (command, ran)


def _display(force_terminal: bool, no_progress: bool = False) -> tuple[DemoDisplay, io.StringIO]:
    buf = io.StringIO()
    return DemoDisplay(console(file=buf, force_terminal=force_terminal), no_progress=no_progress), buf


def _drive(display: DemoDisplay) -> None:
    display.begin(100)
    display.progress(DemoProgress(100, 40, 20, 20, 0, 60))
    display.progress(DemoProgress(100, 100, 55, 45, 0, 0))
    display.end()
    display.summary(DemoSummary((PartitionCounts(0, 100, 100, 45, 55, 0),), 0, Path("/o"), 55, "cmd 'x'", "http://m"))


def test_display_is_live_only_on_a_terminal_and_without_no_progress():
    live, live_out = _display(force_terminal=True)
    _drive(live)
    piped, piped_out = _display(force_terminal=False)
    _drive(piped)
    quiet, quiet_out = _display(force_terminal=True, no_progress=True)
    _drive(quiet)
    assert "━" in live_out.getvalue() and ANSI.search(live_out.getvalue())
    assert "consumed 40 / 100" not in plain(live_out.getvalue())
    for out in (piped_out.getvalue(), plain(quiet_out.getvalue())):
        assert "━" not in out
        assert "consumed 40 / 100" in out and "consumed 100 / 100" in out
    assert "\x1b" not in piped_out.getvalue()
    for out in (live_out, piped_out, quiet_out):
        assert "cmd 'x'" in plain(out.getvalue()).splitlines()
