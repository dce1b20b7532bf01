"""``kdaemon stop``: stop the running daemon and wait until it has exited.

The daemon is found as ``kdaemon status`` finds it, over the control socket of the
configuration's ``[daemon] state_dir`` (``supervisor.control.request_status``); its answer names
the supervisor's pid and start time, so the signal goes to that process and no other (a pid
reused meanwhile has another start time).  The signal is the supervisor's own interface, as for
``systemctl stop`` (SIGTERM) and ``systemctl reload`` (SIGHUP):

* SIGTERM: every worker finishes its batch, flushes and commits, and what it does with its static
  group membership is ``[daemon] on_stop``'s ("keep_membership", the default: the coordinator
  keeps it for a restart until the session times out, and meanwhile an offset reset is refused);
* ``--leave-group``: ``RETIRE_SIGNAL``, the same stop with every worker leaving the group for good
  (Java's ``close(CloseOptions.groupMembershipOperation(LEAVE_GROUP))``: a KIP-848 heartbeat
  with epoch -1, a classic LeaveGroup naming the instance id), whatever ``on_stop`` says.  Once
  the daemon has exited the group is asked, and the command says whether any member of this
  daemon is left.

Without a control socket (``kdaemon run --in-process``) there is nothing to ask: ``kill -USR2``
its pid does the same.
"""

from __future__ import annotations

import signal
import time

import click

from ..supervisor.control import ControlError, request_status
from .common import config_option, fail, load_or_exit

POLL_S = 0.1


@click.command()
@config_option
@click.option("--leave-group", is_flag=True,
              help="Every worker leaves the consumer group for good (its partitions are free at once, an offset "
                   "reset works right after), instead of staying a static member for a restart until the "
                   "session times out; whatever [daemon] on_stop says.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="How long to wait for the daemon to exit [default: twice [daemon] shutdown_timeout_s, plus 30].")
@click.option("--no-wait", is_flag=True, help="Signal the daemon and return at once.")
def stop(config_path: str, leave_group: bool, timeout: float | None, no_wait: bool) -> None:
    """Stop the running daemon (kdaemon run with this configuration) as SIGTERM does: its workers
    finish their batches, flush and commit; then wait until it has exited.  With --leave-group
    its workers also leave the group for good.  Exit 1 when no daemon answers on the
    configuration's [daemon] state_dir, or it is still running after --timeout."""
    import psutil

    from ..supervisor.child import RETIRE_SIGNAL
    config = load_or_exit(config_path)
    try:
        answer = request_status(config.daemon.state_dir)
    except ControlError as exc:
        fail(str(exc))
    leaving = leave_group or config.daemon.on_stop == "leave_group"
    try:
        process = psutil.Process(answer.pid)
        if abs(process.create_time() - answer.started_at) > 1.0:
            raise psutil.NoSuchProcess(answer.pid)
        process.send_signal(RETIRE_SIGNAL if leave_group else signal.SIGTERM)
    except psutil.NoSuchProcess:
        click.echo(f"kdaemon pid {answer.pid} has exited already")
        return
    except psutil.AccessDenied:
        fail(f"not allowed to signal kdaemon pid {answer.pid} (it runs as another user; try as that user or root)")
    how = "leave the group for good" if leaving else "keep their static group memberships for a restart"
    if no_wait:
        click.echo(f"asked kdaemon pid {answer.pid} to stop; its workers {how}")
        return
    wait_s = timeout if timeout is not None else 2 * config.daemon.shutdown_timeout_s + 30
    deadline = time.monotonic() + wait_s
    while _running(process):
        if time.monotonic() > deadline:
            fail(f"kdaemon pid {answer.pid} is still running {wait_s:g} s after it was asked to stop; its log "
                 "says what it waits for (a worker is killed shutdown_timeout_s after the stop)")
        time.sleep(POLL_S)
    click.echo(f"kdaemon pid {answer.pid} stopped; its workers {'left' if leaving else 'keep'} "
               + ("the group for good" if leaving else
                  "their static group memberships for a restart until the session times out (offsets cannot "
                  "be reset meanwhile; kdaemon stop --leave-group leaves for good)"))
    if leaving:
        _report_left(config)


def _running(process) -> bool:
    import psutil
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _report_left(config) -> None:
    """After a stop that left the group: the members of this daemon the coordinator still has
    (a leave that did not reach it), which would keep an offset reset refused."""
    from ..client import ConsumerConfig
    from ..client.errors import KafkaClientError
    from ..client.group.describe import describe_group
    from ..protocol.errors import BrokerError
    from ..worker.main import daemon_id, daemon_of
    opts = config.consumer_options()
    if not opts.get("group_id") or config.daemon.assignment != "group":
        return
    me = daemon_id(config)
    try:
        group = describe_group(ConsumerConfig.from_options(**opts))
    except (KafkaClientError, BrokerError) as exc:
        fail(f"stopped, but group {opts['group_id']} could not be described to check that its workers left: "
             f"{type(exc).__name__}: {exc}")
    mine = sorted(m.instance_id for m in group.members if daemon_of(m.instance_id) == me)
    if mine:
        fail(f"stopped, but group {group.group_id} still has static member(s) {', '.join(mine)} of daemon {me}: "
             "their leave did not reach the coordinator (see the daemon's log); Kafka drops them when their "
             "session times out")
    others = len(group.members)
    click.echo(f"group {group.group_id} has no member of daemon {me} left; it is {group.state} with "
               f"{others} member(s)" + ("" if others else ": its offsets can be reset now"))
