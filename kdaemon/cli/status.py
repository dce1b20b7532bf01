"""``kdaemon status``: what the running daemon says about itself, over its control socket.

The daemon is found by its configuration's ``[daemon] state_dir`` (the socket is
``supervisor.control.socket_path``, one definition for both ends).  The answer is the
supervisor's own view, no broker is asked: its workers (pid, state, uptime, restarts and the
last one's reason), the partitions each holds with position and lag as the worker last reported
them (every two seconds at most while they change), and the sinks' companion processes.  A
share-group daemon (``[kafka] group_type = "share"``) has no positions: each member's records
are shown instead (acquired, accepted, released, rejected, in flight now).  For
the group's view from Kafka (committed offsets, members seen by the coordinator) there is
``kdaemon offsets``.
"""

from __future__ import annotations

import json
from datetime import datetime

import click

from ..durations import duration
from ..supervisor.control import ControlError, DaemonStatus, request_status
from .common import config_option, fail, load_or_exit

# rich is imported where it is used: ``kdaemon run`` imports this package too, and every
# worker is forked from that process (its imports are in each worker's memory budget).


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's answer as one JSON object (for scripts).")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              metavar="SECONDS", help="How long to wait for the daemon's answer.")
def status(config_path: str, as_json: bool, timeout: float) -> None:
    """Ask the running daemon (kdaemon run with this configuration) for its workers, the
    partitions each holds with their lag, its restarts and companions.  Exit 1 when no daemon
    answers on the configuration's [daemon] state_dir."""
    config = load_or_exit(config_path)
    try:
        answer = request_status(config.daemon.state_dir, timeout_s=timeout)
    except ControlError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(answer.to_dict(), indent=2))
        return
    from .progress import console
    console().print(render(answer))


def render(s: DaemonStatus):
    """The answer as a heading, a table of workers and one of partitions (a rich ``Group``)."""
    from rich.console import Group
    from rich.table import Table
    started = datetime.fromtimestamp(s.started_at).isoformat(sep=" ", timespec="seconds")
    live = [w for w in s.workers if w.pid is not None]
    share = any(w.share is not None for w in live)
    held = f"{sum(w.share.in_flight for w in live if w.share is not None)} record(s) in flight" if share else \
        f"{sum(len(w.partitions) for w in live)} partitions, lag {sum(w.lag for w in live)}"
    heading = (f"kdaemon pid {s.pid}, started {started}, config {s.config_path}: "
               f"{sum(w.state == 'ready' for w in live)}/{s.target_workers} workers ready, {held}"
               + (", stopping" if s.stopping else ""))
    workers = Table(title="workers", title_justify="left")
    for name, justify in (("worker", "right"), ("pid", "right"), ("state", "left"), ("uptime", "right"),
                          ("partitions", "right"), ("lag", "right"), ("delivered", "right"),
                          ("restarts", "right"), ("last restart", "left"), ("problems", "left")):
        workers.add_column(name, justify=justify)
    for w in s.workers:
        workers.add_row(str(w.index), "-" if w.pid is None else str(w.pid), w.state,
                        "-" if w.uptime_s is None else duration(w.uptime_s), str(len(w.partitions)), str(w.lag),
                        str(w.delivered), str(w.restarts), w.last_restart_reason or "-", ", ".join(w.problems) or "-")
    shown = [heading, workers, _share_members(live) if share else _partitions(live)]
    if s.companions:
        companions = Table(title="companions", title_justify="left")
        for name, justify in (("name", "left"), ("pid", "right"), ("uptime", "right")):
            companions.add_column(name, justify=justify)
        for c in s.companions:
            companions.add_row(c.name, "-" if c.pid is None else str(c.pid),
                               "-" if c.uptime_s is None else duration(c.uptime_s))
        shown.append(companions)
    return Group(*shown)


def _partitions(live):
    from rich.table import Table
    parts = Table(title="partitions", title_justify="left")
    for name, justify in (("topic", "left"), ("partition", "right"), ("worker", "right"), ("position", "right"),
                          ("lag", "right")):
        parts.add_column(name, justify=justify)
    held = sorted(((p, w) for w in live for p in w.partitions), key=lambda pw: (pw[0].topic, pw[0].partition))
    for p, w in held:
        parts.add_row(p.topic, str(p.partition), str(w.index), "-" if p.position is None else str(p.position),
                      "-" if p.lag is None else str(p.lag))
    return parts


def _share_members(live):
    """A share group's members: what each acquired and settled since it started (a record is
    handed to one member at a time; released ones come back, maybe to another)."""
    from rich.table import Table
    members = Table(title="share group members (records since the worker started)", title_justify="left")
    for name in ("worker", "acquired", "accepted", "released", "rejected", "in flight"):
        members.add_column(name, justify="right")
    for w in live:
        f = w.share
        if f is None:
            members.add_row(str(w.index), "-", "-", "-", "-", "-")
        else:
            members.add_row(str(w.index), str(f.acquired), str(f.accepted), str(f.released), str(f.rejected),
                            str(f.in_flight))
    return members
