"""``kdaemon offsets --watch``: a group's lag judged over time, by Burrow's rules; pure (no I/O).
``watch_table`` draws one round for a terminal (rich); off a terminal ``offsets.py`` prints lines.

Burrow (linkedin/Burrow: ``core/internal/evaluator/caching.go``, the wiki page "Consumer Lag
Evaluation Rules") needs no lag threshold: it keeps each partition's last N commits (offset,
commit time, lag then) and asks how they moved.  Its rules, and what we made of them:

=========  ===================================================================================
status     when (first match wins; "lag now" is the last poll's)
=========  ===================================================================================
UNKNOWN    lag now is unknown (no end offset; no commit and auto_offset_reset = "none").
OK         lag now is 0 (Burrow: no error while the current lag is 0; the wiki: committed ==
           end is never stopped).
REWIND     the committed offset went backwards between two commits of the window (Burrow 2).
STOPPED    the commit window is full, and the time since the last commit exceeds the window's
           span (last commit - first; Burrow 3), and no poll since that commit saw lag 0
           (Burrow's recent-broker-offsets exception, PR #338: new data just arrived).
OK         a poll of the poll window saw lag 0 (Burrow 1).
STALLED    the offset did not move over the whole poll window and the lag stayed or grew
           (Burrow 4), and the commit window is not full yet (with a full one STOPPED judges),
           and, if two commits were seen, it has been still longer than the longest gap
           between them (a group that commits once a minute is not stalled after 50 s).
OK         a commit of the commit window had lag 0 (Burrow 1).
LAGGING    the commit window is full and the lag grew at every commit (Burrow 5, WARN).
OK         otherwise.
=========  ===================================================================================

How a sample is taken.  Burrow reads ``__consumer_offsets``: it sees every commit with its time,
also a commit that repeats the offset.  We poll OffsetFetch, which has no commit time.  So each
poll (its time, the committed offset, the lag from the end offset read with it) goes into a
*poll window* of the last N polls, and a *commit* (the poll's time, offset and lag) is recorded
only when the committed offset differs from the last one: the last N commits are Burrow's
window.  A commit's time is then when we first saw it (late by up to one interval), and an
unchanged re-commit is invisible, so Burrow's STALL ("commits that do not move") and STOP ("no
commits") cannot be told apart by the commits: STALLED is what the poll window shows before
there is a commit history to judge by, STOPPED what the group's own commit rhythm shows.

Two choices differ from Burrow's code.  Burrow 1 reads the commit window, whose zero can be
old once the offset stops moving; we also read the recent polls, and check STOPPED/STALLED before
the commits' zeros.  Burrow 5 warns when the lag never decreased; we ask that it grew at every
commit, because our lag is read together with the end offset: a healthy consumer of a steady
stream keeps a constant non-zero lag, which Burrow (whose stored lag is clamped to 0 when its
older broker offset is behind the commit) rarely sees.  Severity follows Burrow's order but for
STOPPED, ranked above STALLED here since ours escalates from STALLED to STOPPED.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol


class Status(str, Enum):
    UNKNOWN = "UNKNOWN"
    OK = "OK"
    LAGGING = "LAGGING"
    STALLED = "STALLED"
    STOPPED = "STOPPED"
    REWIND = "REWIND"

    @property
    def severity(self) -> int:
        return STATUSES[self][0]


STATUSES: dict[Status, tuple[int, str]] = {
    Status.UNKNOWN: (0, "lag unknown: no end offset, or no commit and nowhere to start"),
    Status.OK: (1, "caught up at some point of the window, or catching up"),
    Status.LAGGING: (2, "committing, but the lag grew at every commit of the window"),
    Status.STALLED: (3, "the committed offset did not move over the window while lag stayed or grew"),
    Status.STOPPED: (4, "no new commit for longer than the window's commits span"),
    Status.REWIND: (5, "the committed offset went backwards"),
}
"""Status -> (severity: the group shows its worst partition's, meaning)."""


class LagRow(Protocol):
    """What one poll says about a partition (``offsets.PartitionLag`` is one)."""
    topic: str
    partition: int
    committed: int | None
    lag: int | None


@dataclass(frozen=True)
class Poll:
    time: float               # seconds, any monotonic clock
    committed: int | None
    lag: int | None


@dataclass(frozen=True)
class Commit:
    time: float               # when a poll first saw this offset committed
    offset: int
    lag: int | None           # the lag at that poll


@dataclass(frozen=True)
class Verdict:
    status: Status
    reason: str


class PartitionWindow:
    """One partition's poll window and commit window, and Burrow's rules over them."""

    def __init__(self, size: int) -> None:
        if size < 2:
            raise ValueError(f"a window holds at least 2 samples, got {size}")
        self.size = size
        self.polls: deque[Poll] = deque(maxlen=size)
        self.commits: deque[Commit] = deque(maxlen=size)

    def observe(self, now: float, committed: int | None, lag: int | None) -> None:
        self.polls.append(Poll(now, committed, lag))
        if committed is not None and (not self.commits or self.commits[-1].offset != committed):
            self.commits.append(Commit(now, committed, lag))

    def evaluate(self, now: float) -> Verdict:
        """The status at ``now`` (the time of the last poll, or later: a test's "later")."""
        if not self.polls or self.polls[-1].lag is None:
            return Verdict(Status.UNKNOWN, "no end offset, or no commit and auto_offset_reset = none")
        lag = self.polls[-1].lag
        if lag == 0:
            return Verdict(Status.OK, "caught up")
        commits, polls, full = list(self.commits), list(self.polls), len(self.commits) == self.size
        for a, b in zip(commits, commits[1:]):
            if b.offset < a.offset:
                return Verdict(Status.REWIND, f"committed offset went back from {a.offset} to {b.offset}")
        last = commits[-1] if commits else None
        if full and last is not None:
            still, span = now - last.time, last.time - commits[0].time
            caught_up_since = any(p.lag == 0 for p in polls if p.time > last.time and p.committed == last.offset)
            if still > span and not caught_up_since:
                return Verdict(Status.STOPPED, f"no new commit for {still:.0f} s, longer than the "
                                               f"{span:.0f} s the last {len(commits)} commits took")
        if any(p.lag == 0 for p in polls):
            return Verdict(Status.OK, "caught up within the window")
        unmoved = len(polls) == self.size and len({p.committed for p in polls}) == 1
        lags = [p.lag for p in polls if p.lag is not None]
        if unmoved and not full and all(a <= b for a, b in zip(lags, lags[1:])):
            gap = max((b.time - a.time for a, b in zip(commits, commits[1:])), default=0.0)
            still = now - (last.time if last is not None else polls[0].time)
            if len(commits) < 2 or still > gap:
                return Verdict(Status.STALLED, f"committed offset unmoved over {len(polls)} polls, "
                                               f"lag {lags[0]} -> {lags[-1]}")
        known = [c.lag for c in commits if c.lag is not None]
        if 0 in known:
            return Verdict(Status.OK, "caught up within the window's commits")
        if full and len(known) >= 2 and all(a < b for a, b in zip(known, known[1:])):
            return Verdict(Status.LAGGING, f"lag grew at each of the last {len(commits)} commits: "
                                           f"{known[0]} -> {known[-1]}")
        return Verdict(Status.OK, "committing" if len(commits) > 1 else "window not full yet")


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    verdict: Verdict
    changed: bool             # differs from the previous round's status (True on the first)


@dataclass(frozen=True)
class GroupStatus:
    status: Status            # the worst partition's; UNKNOWN only when every partition is
    partitions: list[PartitionStatus]
    total_lag: int            # over the partitions whose lag is known

    def summary(self) -> str:
        """"2 partition(s) lagging, 1 stalled, total lag 1234"."""
        counts: dict[Status, int] = {}
        for p in self.partitions:
            counts[p.verdict.status] = counts.get(p.verdict.status, 0) + 1
        shown = sorted((s for s in counts if s.severity > Status.OK.severity), key=lambda s: -s.severity) \
            or [s for s in (Status.OK, Status.UNKNOWN) if s in counts]
        words = [f"{counts[s]} {'with lag unknown' if s is Status.UNKNOWN else s.value.lower()}" for s in shown]
        if words:
            words[0] = words[0].replace(" ", " partition(s) ", 1)
        return ", ".join(words + [f"total lag {self.total_lag}"])


class GroupWatch:
    """Every partition's window; ``observe`` one poll of the group, get its statuses."""

    def __init__(self, window: int) -> None:
        PartitionWindow(window)   # the size check, before any poll
        self.window = window
        self._partitions: dict[tuple[str, int], PartitionWindow] = {}
        self._last: dict[tuple[str, int], Status] = {}

    def observe(self, now: float, rows: Iterable[LagRow]) -> GroupStatus:
        out, total = [], 0
        for row in rows:
            key = (row.topic, row.partition)
            window = self._partitions.setdefault(key, PartitionWindow(self.window))
            window.observe(now, row.committed, row.lag)
            verdict = window.evaluate(now)
            out.append(PartitionStatus(row.topic, row.partition, verdict, self._last.get(key) != verdict.status))
            self._last[key] = verdict.status
            total += row.lag or 0
        worst = max((p.verdict.status for p in out), key=lambda s: s.severity, default=Status.UNKNOWN)
        return GroupStatus(worst, out, total)


# -- shown on a terminal ---------------------------------------------------------------------------

STYLES = {Status.UNKNOWN: "dim", Status.OK: "green", Status.LAGGING: "yellow", Status.STALLED: "yellow",
          Status.STOPPED: "red", Status.REWIND: "red"}


def watch_table(group: str, stamp: str, rows: list, seen: GroupStatus):
    """One round of ``offsets --watch`` as a rich table: per partition committed, end, lag,
    status and why; the group's status in the title.  ``rows`` are the round's ``LagRow``s,
    with ``end``, in the order of ``seen.partitions``."""
    from rich.table import Table
    from rich.text import Text

    def cell(v) -> str:
        return "-" if v is None else str(v)

    worst = seen.status
    title = Text.assemble(f"{stamp}  group {group}: ", (worst.value, STYLES[worst]), f" ({seen.summary()})")
    t = Table(title=title, title_justify="left")
    for name, justify in (("topic", "left"), ("partition", "right"), ("committed", "right"), ("end", "right"),
                          ("lag", "right"), ("status", "left"), ("why", "left")):
        t.add_column(name, justify=justify)
    for row, p in zip(rows, seen.partitions):
        v = p.verdict
        t.add_row(row.topic, str(row.partition), cell(row.committed), cell(row.end), cell(row.lag),
                  Text(v.status.value, style=STYLES[v.status]), v.reason)
    return t
