"""How the commands show progress and tables: rich, live only on a terminal.

One rule for every command (``live``): a live display (a progress bar or a table redrawn in
place) only when stdout is a terminal and ``--no-progress`` was not given.  Anywhere else (CI,
a pipe, systemd's journal) the same figures come as plain lines at a slow pace, and tables
without colour or cursor movement, so a log never fills with control codes.  Tests reach the
terminal path through ``console(force_terminal=True)``, or by running a command on a
pseudo-terminal.
"""

from __future__ import annotations

import time
from collections import deque
from typing import IO

from rich import box
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..demo import DemoProgress, DemoSummary

PLAIN_EVERY_S = 5.0     # a plain progress line at most this often
RATE_OVER_S = 5.0       # the rate shown is over this many seconds (not since the start: the join takes seconds)
PLAIN_WIDTH = 200       # off a terminal rich would wrap at 80 columns: wide lines read better in a log


def console(*, stderr: bool = False, file: IO[str] | None = None, force_terminal: bool | None = None) -> Console:
    """The console a command writes to: stdout (or stderr), rich's own terminal detection."""
    c = Console(stderr=stderr, file=file, force_terminal=force_terminal, highlight=False)
    if not c.is_terminal:
        c = Console(stderr=stderr, file=file, force_terminal=False, highlight=False, width=PLAIN_WIDTH,
                    no_color=True)
    return c


def live(c: Console, no_progress: bool) -> bool:
    """Whether to draw in place: a terminal, and not ``--no-progress``."""
    return c.is_terminal and not no_progress


# -- kdaemon demo --------------------------------------------------------------------------------

class DemoDisplay:
    """``demo.DemoReport``: a progress bar of the sample's records the daemon consumed, with its
    rate, what it delivered, filtered and dead-lettered, and the group's lag; the summary table
    and the read-back command at the end."""

    def __init__(self, c: Console, *, no_progress: bool = False) -> None:
        self.console = c
        self._live = live(c, no_progress)
        self._progress: Progress | None = None
        self._task = None
        self._next_line = 0.0
        self._seen: deque[tuple[float, int]] = deque()   # (time, consumed) over the last RATE_OVER_S

    def say(self, text: str) -> None:
        self.console.print(text, markup=False)

    def error(self, text: str) -> None:
        self.console.print(f"[bold red]error:[/] {_escape(text)}" if self._live else f"error: {text}",
                           markup=self._live)

    def begin(self, total: int) -> None:
        if self._live:
            self._progress = Progress(
                TextColumn("consumed"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[rate]}"),
                TextColumn("delivered {task.fields[delivered]}, filtered {task.fields[filtered]}, "
                           "dead-lettered {task.fields[dlq]}, lag {task.fields[lag]}"),
                TimeElapsedColumn(), console=self.console, transient=False)
            self._task = self._progress.add_task("demo", total=total, rate="- rec/s", delivered=0, filtered=0,
                                                 dlq=0, lag=total)
            self._progress.start()

    def progress(self, sample: DemoProgress) -> None:
        now = time.monotonic()
        self._seen.append((now, sample.consumed))
        while now - self._seen[0][0] > RATE_OVER_S:
            self._seen.popleft()
        (then, before) = self._seen[0]
        rate = _rate(sample.consumed - before, now - then)
        if self._progress is not None:
            self._progress.update(self._task, completed=min(sample.consumed, sample.total), rate=rate,
                                  delivered=sample.delivered, filtered=sample.filtered, dlq=sample.dead_lettered,
                                  lag=sample.lag)
            return
        if now >= self._next_line or sample.lag == 0:
            self._next_line = now + PLAIN_EVERY_S
            self.console.print(f"  consumed {sample.consumed} / {sample.total} ({rate}), delivered {sample.delivered}, "
                               f"filtered {sample.filtered}, dead-lettered {sample.dead_lettered}, lag {sample.lag}",
                               markup=False)

    def end(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def summary(self, s: DemoSummary) -> None:
        c = self.console
        c.print()
        c.print(summary_table(s))
        if s.dropped_by_interceptors:
            c.print(f"dropped by interceptors (the ttl plugin: records older than its max_age_ms): "
                    f"{s.dropped_by_interceptors}", markup=False)
        c.print("(the header rule in etc/kdaemon.toml keeps only order.created and order.shipped)", markup=False)
        if s.output_records is not None:
            c.print(f"output: {s.output_records} records read back from {s.output}", markup=False)
        else:
            c.print(f"output: {s.output}", markup=False)
        c.print(f"metrics were served at {s.metrics_url} while the daemon ran", markup=False)
        c.print("read it back with:", markup=False)
        # Never wrapped or highlighted: it must run exactly as printed (copy and paste).
        c.print(s.read_back, markup=False, highlight=False, soft_wrap=True)


def summary_table(s: DemoSummary) -> Table:
    t = Table(title="what the daemon did (its own counters)", box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("partition", "records", "consumed", "filtered", "delivered", "dead-lettered"):
        t.add_column(name, justify="right")
    for p in s.partitions:
        t.add_row(str(p.partition), str(p.end), str(p.consumed), str(p.filtered), str(p.delivered),
                  str(p.dead_lettered))
    t.add_section()
    t.add_row("total", *(str(s.total(f)) for f in ("end", "consumed", "filtered", "delivered", "dead_lettered")))
    return t


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} rec/s" if seconds > 0 else "- rec/s"


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)


# -- kdaemon offsets --watch ---------------------------------------------------------------------

class LiveTable:
    """A table redrawn in place each round (``Live``); ``show`` takes the next one."""

    def __init__(self, c: Console) -> None:
        self._live = Live(console=c, auto_refresh=False, transient=False)

    def __enter__(self) -> "LiveTable":
        self._live.start()
        return self

    def show(self, renderable) -> None:
        self._live.update(renderable, refresh=True)

    def __exit__(self, *exc) -> None:
        self._live.stop()
