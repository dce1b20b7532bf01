"""What a forked worker process runs.

Runs in the child right after fork: signal handlers are reset, NOTIFY_SOCKET is dropped (only
the supervisor talks to systemd), and only then are the consumer, its threads and sockets, the
plugins and the sink created.  The worker reports liveness and readiness over a pipe to the
supervisor: one ``WorkerHeartbeat`` line per beat (``heartbeat.py``).

A worker does not outlive its supervisor (``parent.py``): the kernel's parent-death signal
(``PARENT_GONE_SIGNAL``), its parent pid compared on every turn of its loop, and its heartbeat
pipe closing each tell it the supervisor is gone.  It then logs one line, "supervisor (pid N)
is gone: stopping", and stops as a stop of the daemon stops it: it flushes, commits what the
sink took (never more: invariant 12), keeps or leaves its static membership as ``[daemon]
on_stop`` says (kept by default: the daemon started in its place reuses the instance ids and
gets the partitions back at once), and exits; ``shutdown_timeout_s`` later it is ended
whatever it is doing, since no supervisor is left to kill it.  Before its worker is built it
just stops.

Exit codes (``kdaemon.exit_codes``): 0 clean stop; 3 stopped by an error policy — the supervisor
stops the daemon rather than restart it into the same record; 4 could not boot (bad plugin,
credentials, configuration only the plugins could check) — not restarted either; 5 fenced; 6 the
sink or the DLQ refused for good (``Worker.run``) — neither restarted; 1 anything else
(restarted with backoff).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback

from ..config import ConfigError
from ..exit_codes import EXIT_BOOT_FAILURE, EXIT_FAILURE, EXIT_OK
from .heartbeat import HeldPartition, ShareFigures, WorkerHeartbeat
from .siblings import SIBLING_SIGNAL
from .parent import PARENT_GONE_SIGNAL, Supervisor

log = logging.getLogger(__name__)

# Each partition's position and lag go to the supervisor (for ``kdaemon status``) when they
# changed, at most this often unless the assignment itself changed: while records flow they
# change on every beat, and a worker with many partitions need not send them all twice a second.
HELD_EVERY_S = 2.0


class Heartbeat:
    """Writes ``WorkerHeartbeat`` lines to the supervisor, rate-limited; the line where ``ready``
    turns true, and any line of a ready worker whose partitions changed since the last it told,
    also carries ``generation`` and ``partitions``."""

    def __init__(self, fd: int, interval_s: float = 0.5) -> None:
        self.fd = fd
        self.interval = interval_s
        self._next = 0.0
        self._last_ready = None
        self._member_id = None    # the member id last told to the supervisor
        self._told: frozenset | None = None   # the partitions last told with ``partitions``
        self._epoch: int | None = None        # the generation (member epoch) last told
        self._held: tuple[HeldPartition, ...] | None = None   # the partitions last told, and when
        self._held_at = 0.0
        self.closed = False   # the pipe's reading end is gone (EPIPE): the supervisor is
        os.set_blocking(fd, False)

    def beat(self, worker) -> None:
        if getattr(worker, "share", False):
            self._beat_share(worker)
            return
        now = time.monotonic()
        consumer = worker.consumer
        ready = worker.ready
        member_now = consumer.group_member_id() or None
        # Under KIP-848 a member's partitions change without its readiness changing in
        # between (a revocation or a newly freed partition is reconciled within one poll).
        owned = frozenset(consumer.assignment()) if ready else None
        moved = ready and owned != self._told
        joined = consumer.group_generation()
        epoch_now = joined[0] if joined else None
        if now < self._next and ready == self._last_ready and member_now == self._member_id and not moved \
                and epoch_now == self._epoch:
            return
        self._next = now + self.interval
        newly_ready = ready and (not self._last_ready or moved)
        self._last_ready = ready
        m = consumer.metrics()
        lag = sum(p.records_lag or 0 for p in m.partitions.values())
        generation = partitions = None
        if newly_ready:
            # Once per (re)assignment, so the supervisor's log says who holds what since when:
            # that is how an operator (and a test, and bench/groups/spread.py) sees whether a
            # restart moved partitions, and when each worker got its share.
            self._told = owned
            group_generation = consumer.group_generation()
            generation = group_generation[0] if group_generation else None
            partitions = tuple(sorted(f"{tp.topic}-{tp.partition}" for tp in owned))
        # A new member id goes out at once (the first: before the worker joins, under KIP-848),
        # so a successor knows what to release even if this worker is killed while joining.
        member_id = member_now if member_now != self._member_id else None
        self._member_id = member_now
        # A new generation goes out at once too (a join, or the coordinator moved this member
        # to a new target): the supervisor pokes the other workers with it (siblings.py).
        epoch = epoch_now if epoch_now != self._epoch else None
        self._epoch = epoch_now
        self._send(WorkerHeartbeat(ready, len(m.partitions), lag, sum(worker.stats.delivered.values()),
                                   generation, partitions, member_id,
                                   consumer.config.group_protocol if member_id is not None else None,
                                   worker.sink_down_s, worker.problems, self._held_if_due(now, m), epoch))

    def _beat_share(self, worker) -> None:
        """A share-group member's beat: its member id once, its assignment when it changes (a
        share group assigns partitions too, shared among members), and its ``ShareFigures``
        instead of positions and lags (it has none)."""
        now = time.monotonic()
        consumer = worker.consumer
        ready = worker.ready
        member_now = consumer.member_id or None
        owned = frozenset(consumer.assignment()) if ready else None
        moved = ready and owned != self._told
        figures = ShareFigures(**worker.share_figures())
        if now < self._next and ready == self._last_ready and member_now == self._member_id and not moved:
            return
        self._next = now + self.interval
        partitions = None
        if moved:
            self._told = owned
            partitions = tuple(sorted(f"{tp.topic}-{tp.partition}" for tp in owned))
        self._last_ready = ready
        member_id = member_now if member_now != self._member_id else None
        self._member_id = member_now
        share = figures if figures != self._held or now - self._held_at >= HELD_EVERY_S else None
        if share is not None:
            self._held, self._held_at = figures, now
        self._send(WorkerHeartbeat(ready, len(owned or ()), 0, sum(worker.stats.delivered.values()),
                                   None, partitions, member_id, "share" if member_id is not None else None,
                                   worker.sink_down_s, worker.problems, None, None, share))

    def _held_if_due(self, now: float, m) -> tuple[HeldPartition, ...] | None:
        """The partitions held, with position and lag, if they are news (see ``HELD_EVERY_S``)."""
        held = tuple(sorted((HeldPartition(tp.topic, tp.partition, p.position, p.records_lag)
                             for tp, p in m.partitions.items()), key=lambda h: (h.topic, h.partition)))
        if held == self._held:
            return None
        moved = self._held is None or {(h.topic, h.partition) for h in held} != \
            {(h.topic, h.partition) for h in self._held}
        if not moved and now - self._held_at < HELD_EVERY_S:
            return None
        self._held, self._held_at = held, now
        return held

    def waiting(self, problems: tuple[str, ...] = ()) -> None:
        """Alive but not built yet (waiting for a broker before the worker exists)."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval
        self._last_ready = False
        self._send(WorkerHeartbeat(False, 0, 0, 0, problems=problems))

    def _send(self, beat: WorkerHeartbeat) -> None:
        try:
            os.write(self.fd, beat.encode())
        except BlockingIOError:
            pass
        except BrokenPipeError:
            self.closed = True   # nobody reads: the supervisor is gone


# The supervisor's "stop and do not come back" (a smaller pool): drain and commit as on SIGTERM,
# then leave the group for good (Worker.request_stop(leave_group=True)).  Before the worker is
# built it keeps its default action, as SIGTERM does: the process ends before it joined.
RETIRE_SIGNAL = signal.SIGUSR2


def detach_from_supervisor(supervisor: int) -> Supervisor:
    """What any child forked from the supervisor (pid ``supervisor``, taken before the fork)
    does first: the supervisor's signal handlers would only wake *its* loop (the child must
    stop on SIGTERM like any process), only the supervisor talks to systemd, and the child must
    not outlive it: the kernel sends it ``PARENT_GONE_SIGNAL`` (default action: end) when the
    supervisor dies.  The returned ``Supervisor`` tells whether it is gone (it may have died
    before the signal was asked for)."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU,
                signal.SIGCHLD, RETIRE_SIGNAL, PARENT_GONE_SIGNAL):
        signal.signal(sig, signal.SIG_DFL)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        os.environ.pop(name, None)
    return Supervisor(supervisor)


class SupervisorGone(BaseException):
    """Raised out of a worker's build (by the parent-death signal's handler, or the wait for a
    broker) once its supervisor is gone.  A BaseException, as KeyboardInterrupt: a plugin's
    ``except Exception`` must not take it for its own failure."""


def run_child(config, index: int, workers: int, heartbeat_fd: int, plugins=None,
              predecessor=None, supervisor: int | None = None) -> int:
    """Build and run one worker; never returns to the supervisor's code (the caller _exit()s).

    ``plugins`` is the supervisor's ``PluginManager``: its ``kdaemon_post_fork`` hook runs here,
    once logging is set up and before anything of the worker is built; a failing hook is a
    boot failure (the worker would run without what the plugin meant to set up).
    ``predecessor``: what the supervisor knew of this index's previous worker (a
    ``heartbeat.Predecessor``); a static membership it left behind is released first.
    ``supervisor``: its pid, taken before the fork (default: the parent now)."""
    parent = detach_from_supervisor(os.getppid() if supervisor is None else supervisor)
    # Ignored until the worker exists to hear it: its default action would end the process.
    signal.signal(SIBLING_SIGNAL, signal.SIG_IGN)
    logging.getLogger().handlers.clear()
    logging.basicConfig(level=getattr(logging, config.daemon.log_level, logging.INFO),
                        format=f"%(asctime)s %(levelname)s worker-{index} %(name)s: %(message)s",
                        stream=sys.stderr)
    heartbeat = Heartbeat(heartbeat_fd)
    built: list = []   # the worker, once it exists

    def supervisor_gone(*_) -> None:
        """``PARENT_GONE_SIGNAL``'s handler, and the loop's check: stop as a stop of the daemon
        would (``[daemon] on_stop``), with a deadline of its own.  Sets flags only (a handler)."""
        if not (parent.gone() or heartbeat.closed):
            return   # a stray signal: the supervisor is there
        if not built:
            raise SupervisorGone()
        worker = built[0]
        if worker.stop_reason is None:   # once: the loop's check and the signal both come
            parent.deadline(config.daemon.shutdown_timeout_s)
            worker.request_stop(leave_group=config.daemon.on_stop == "leave_group", reason=parent.line())

    try:
        signal.signal(PARENT_GONE_SIGNAL, supervisor_gone)
        supervisor_gone()   # it may have died between the fork and the signal's request
        return _build_and_run(config, index, workers, heartbeat, plugins, predecessor, built, supervisor_gone)
    except SupervisorGone:
        log.warning("%s", parent.line())
        return EXIT_OK


def _build_and_run(config, index: int, workers: int, heartbeat: Heartbeat, plugins, predecessor,
                   built: list, supervisor_gone) -> int:
    """``run_child`` once the child is set up: ``built`` receives the worker; ``supervisor_gone``
    is called on every turn of the loop (and while waiting for a broker)."""
    try:
        if plugins is not None:
            plugins.post_fork(index, config)
    except Exception:
        log.error("worker %d cannot boot: a plugin's kdaemon_post_fork failed:\n%s", index,
                  traceback.format_exc())
        return EXIT_BOOT_FAILURE
    try:
        from ..worker.main import make_worker
        from ..worker.health import FIRST_WARNING_S
        from ..worker.metrics import WorkerMetrics
        metrics = WorkerMetrics(config.daemon.metrics_interval_ms / 1000)

        def on_tick(worker) -> None:
            heartbeat.beat(worker)
            if getattr(worker, "share", False):
                worker.update_metrics(metrics)
            else:
                metrics.update(worker)
            supervisor_gone()   # once per poll: gunicorn's getppid() check, and the heartbeat pipe

        # Waiting for a broker (to choose the group protocol) beats meanwhile, so the supervisor
        # does not take it for a hang; only a refused login fails there, a boot failure anyway.
        # Past the first warning, the beats and the metrics say the broker is unreachable.
        waiting_since = time.monotonic()

        def on_wait() -> None:
            problems = ("broker_unreachable",) if time.monotonic() - waiting_since >= FIRST_WARNING_S else ()
            heartbeat.waiting(problems)
            metrics.problems(problems)
            supervisor_gone()

        worker = make_worker(config, index=index, workers=workers, static_members=True, on_tick=on_tick,
                             on_wait=on_wait, predecessor=predecessor)
        built.append(worker)
    except ConfigError as exc:
        # A factory refused its settings (a plugin sink without validate(), which check-config
        # could not check): what is wrong, not a traceback.
        log.error("worker %d cannot boot: %s", index, "; ".join(exc.problems))
        return EXIT_BOOT_FAILURE
    except Exception:
        log.error("worker %d cannot boot:\n%s", index, traceback.format_exc())
        return EXIT_BOOT_FAILURE
    heartbeat.beat(worker)   # its member id, before it joins (see Heartbeat.beat)
    # Everything built so far lives as long as the worker: keep the collector from walking it
    # on every cycle (a measurable share of a busy worker's time).
    import gc
    gc.freeze()
    # A poll of 500 json records makes a few thousand short-lived containers; with the default
    # threshold (700) the young generation is scanned several times per poll while they are
    # all still alive.  Cycles are rare here; refcounting frees the records.
    gc.set_threshold(10_000, 10, 10)
    signal.signal(signal.SIGTERM, lambda *_: worker.request_stop())
    signal.signal(signal.SIGINT, lambda *_: worker.request_stop())
    signal.signal(RETIRE_SIGNAL, lambda *_: worker.request_stop(leave_group=True))
    signal.signal(SIBLING_SIGNAL, lambda *_: worker.group_news())
    from ..client.errors import AuthenticationError
    try:
        code = worker.run()
    except AuthenticationError as exc:
        log.error("worker %d cannot authenticate: %s", index, exc)
        code = EXIT_BOOT_FAILURE
    except Exception:
        log.error("worker %d failed:\n%s", index, traceback.format_exc())
        code = EXIT_FAILURE
    try:
        if getattr(worker, "share", False):
            worker.update_metrics(metrics, force=True)
        else:
            metrics.update(worker, force=True)
    except Exception:
        pass
    return code
