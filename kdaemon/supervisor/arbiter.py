"""The arbiter: a pre-fork supervisor after gunicorn's.

Signal handlers only enqueue the signal and write to a wake-up pipe; the main loop dispatches
(``handle_term``, ``handle_hup``, ...) and on every tick reaps children, checks heartbeats,
restarts crashed workers with backoff, keeps the worker count, and talks to systemd.  The
sinks' companion processes (``companions.py``) start before the workers and stop after them.

The supervisor itself never creates a Kafka client, a thread or a plugin's objects: those exist
only in workers, after fork.  It does import the allowlisted plugins, to call their process
hooks (``kdaemon_pre_fork`` here, ``kdaemon_post_fork`` and ``kdaemon_worker_exit`` in the
child, see ``kdaemon.plugins.hookspecs``) and to ask which companions the sinks need; their
factories run only in workers.  It serves ``/metrics`` (``metrics_http.py``, aggregating the
files the workers write in prometheus-client's multiprocess mode) and the control socket
(``control.py``) from its own select loop, no thread, each client a non-blocking connection
that can never hold the loop (``connections.py``).  Worker heartbeats are
``heartbeat.WorkerHeartbeat`` lines on a pipe.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

from ..backoff import Backoff
from ..config import ConfigError, DaemonConfig
from ..durations import duration
from ..exit_codes import (EXIT_BOOT_FAILURE, EXIT_CONFIG, EXIT_FAILURE, EXIT_FENCED, EXIT_OK,
                          EXIT_SINK_REFUSED, EXIT_STOPPED_ON_ERROR)
from . import sdnotify
from .siblings import Pokes
from .child import RETIRE_SIGNAL, run_child
from .companions import STABLE_AFTER_S, Companions, specs_for
from .configs import load_plugins, prepare_reload
from .control import ControlServer, daemon_status, describe_restart
from .heartbeat import HeartbeatReader, Predecessor
from .metrics_http import MetricsEndpoint
from .resources import ResourceSampler

log = logging.getLogger("kdaemon.supervisor")

# A worker's exit that a restart does not cure: (what happened, why not restart).  The daemon
# stops instead, the other workers draining and committing as on SIGTERM, and exits with it.
_STOPS_THE_DAEMON = {
    EXIT_STOPPED_ON_ERROR: ("stopped on an error policy", "into the same record"),
    EXIT_BOOT_FAILURE: ("cannot boot", "in a loop"),
    EXIT_FENCED: ("was fenced by Kafka: another consumer has its static member id",
                  "to fence that one in turn"),
    EXIT_SINK_REFUSED: ("was refused for good by its sink or dead-letter queue (the line above names the "
                        "topic or table and the fix)", "into the same refusal"),
}

# RETIRE_SIGNAL (SIGUSR2) to the supervisor: stop as on SIGTERM, every worker leaving the group for
# good (``kdaemon stop --leave-group``), whatever ``[daemon] on_stop`` says.
_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
            RETIRE_SIGNAL)
_RESTART_BACKOFF_MAX = 30.0
_BOOT_CRASHES = 5  # a worker that dies this many times in a row before ever being ready: stop


@dataclass
class WorkerProc:
    index: int
    pid: int
    heartbeat_fd: int
    started: float
    last_heartbeat: float
    ready: bool = False
    assigned: int = 0
    lag: int = 0
    delivered: int = 0
    sink_down_s: float = 0.0          # from its heartbeats: how long its sink has been down
    problems: tuple[str, ...] = ()    # from its heartbeats: why it consumes nothing (health.CONDITIONS)
    stopping: bool = False
    retiring: bool = False     # stopping for good (the pool shrank): it leaves the group for good
    stop_sent_at: float | None = None
    generation: int = 0  # the config generation it was started with
    reader: HeartbeatReader | None = None
    member_id: str | None = None       # its group member id and protocol, from its heartbeat
    group_protocol: str | None = None
    held: tuple = ()                   # heartbeat.HeldPartition: its partitions, positions, lags
    share: object = None               # heartbeat.ShareFigures: a share-group member's records
    replaced_for: str | None = None    # the supervisor's reason to kill or recycle it: the restart's reason label

    def __post_init__(self) -> None:
        self.reader = HeartbeatReader(f"worker {self.index} (pid {self.pid})")


def _restart_backoff() -> Backoff:
    return Backoff(0.5, _RESTART_BACKOFF_MAX)


@dataclass
class Slot:
    """Restart bookkeeping per worker index."""

    backoff: Backoff = field(default_factory=_restart_backoff)
    next_start: float = 0.0
    crashes_before_ready: int = 0
    restarts: int = 0
    last_restart_reason: str | None = None   # metrics.restart_reason of the last restart, for kdaemon status
    # The last worker's group membership, for its successor to release what it left behind.
    predecessor: Predecessor | None = None


class Arbiter:
    def __init__(self, config_path: str, config: DaemonConfig, *, workers_override: int | None = None) -> None:
        self.config_path = config_path
        self.config = config
        self.plugins = load_plugins(config)
        self._workers_override = workers_override
        self.target = workers_override if workers_override is not None else (config.daemon.workers or os.cpu_count() or 1)
        self.workers: dict[int, WorkerProc] = {}   # pid -> proc
        self.slots: dict[int, Slot] = {}
        self._signals: list[int] = []
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopping = False
        self._leaving = False      # stopping, and the workers leave the group for good
        self._exit_code = EXIT_OK
        self._ready_sent = False
        self._config_generation = 0
        self._rolling: list[int] = []
        self._roll_waiting: int | None = None
        self._metrics_http: MetricsEndpoint | None = None
        self._metrics_dir: str | None = None
        self._next_sample = 0.0
        self._next_status = 0.0
        self._watchdog = sdnotify.watchdog_interval_s()
        self._next_watchdog = 0.0
        self._prom = None
        self.companions = Companions()
        self._resources = ResourceSampler()
        # Relaying one worker's group news to the others (siblings.py): the workers that told
        # their member id and are not stopping.
        self._pokes = Pokes(lambda: [w.pid for w in self.workers.values() if w.member_id and not w.stopping])
        self._control = ControlServer(config.daemon.state_dir, lambda: daemon_status(   # kdaemon status's answer
            self.workers.values(), self.slots, self.target, stopping=self._stopping,
            companions=self.companions.states(), config_path=self.config_path, state_dir=self.config.daemon.state_dir),
            request_timeout_s=config.daemon.endpoint_request_timeout_s, max_clients=config.daemon.endpoint_max_clients)

    # -- set-up ---------------------------------------------------------------------------------

    def _setup_metrics(self) -> None:
        d = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.path.join(self.config.daemon.state_dir, "metrics")
        shutil.rmtree(d, ignore_errors=True)   # stale files from a previous run would add up
        os.makedirs(d, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = d
        self._metrics_dir = d
        from . import metrics as supervisor_metrics  # imported only now: the env var must be set
        self._prom = supervisor_metrics
        daemon = self.config.daemon
        self._metrics_http = MetricsEndpoint(daemon.metrics_addr, self._prom.render,
                                             request_timeout_s=daemon.endpoint_request_timeout_s,
                                             max_clients=daemon.endpoint_max_clients)

    def _install_signals(self) -> None:
        for sig in _HANDLED:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self._signals.append(signum)
        try:
            os.write(self._wake_w, b"s")
        except BlockingIOError:
            pass

    # -- the main loop --------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._configure_companions(self.config, specs_for(self.config, self.plugins))
        except ValueError as exc:
            log.error("%s: sink companions: %s", self.config_path, exc)
            return EXIT_CONFIG
        self._setup_metrics()
        self._control.open()
        self._install_signals()
        log.info("kdaemon supervisor %s starting %d worker(s)", os.getpid(), self.target)
        sdnotify.notify(f"STATUS=starting {self.target} worker(s)")
        try:
            while True:
                self._manage_workers()
                self._sleep()
                self._dispatch_signals()
                self._reap()
                if self._stopping and not self.workers:
                    # Companions go last: stopping workers flush their final batches to them.
                    self.companions.stop_all()
                    break
                self._check_liveness()
                if not self._stopping:
                    self._pokes.tick(time.monotonic())
                self._sample_resources()
                self._step_rolling()
                self._report()
        except Exception:
            log.exception("supervisor failure; stopping workers")
            self._exit_code = EXIT_FAILURE
            self._terminate_all(graceful=False)
            self.companions.kill_all()
        finally:
            if self._metrics_http is not None:
                self._metrics_http.close()
            self._control.close()
        log.info("supervisor exiting with code %d", self._exit_code)
        return self._exit_code

    def _endpoints(self) -> list:
        """The endpoints served from this loop (``connections.py``: non-blocking, never waited on)."""
        return [e for e in (self._metrics_http, self._control) if e is not None]

    def _sleep(self) -> None:
        reading = [self._wake_r] + [w.heartbeat_fd for w in self.workers.values()]
        writing: list[int] = []
        endpoints = self._endpoints()
        for e in endpoints:
            r, w = e.waiting()
            reading += r
            writing += w
        due = self._pokes.due_in(time.monotonic())
        try:
            readable, writable, _ = select.select(reading, writing, [], 0.5 if due is None else min(0.5, due))
        except InterruptedError:
            return
        for e in endpoints:
            readable = e.serve(readable, writable)
        for fd in readable:
            if fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            else:
                self._read_heartbeat(fd)

    def _read_heartbeat(self, fd: int) -> None:
        proc = next((w for w in self.workers.values() if w.heartbeat_fd == fd), None)
        if proc is None:
            return
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            return  # EOF: the worker is exiting; the reaper handles it
        now = time.monotonic()
        for beat in proc.reader.feed(data):
            proc.last_heartbeat = now
            proc.assigned, proc.lag, proc.delivered = beat.assigned, beat.lag, beat.delivered
            proc.sink_down_s = beat.sink_down_s
            proc.problems = beat.problems
            if beat.held is not None:
                proc.held = beat.held
            if beat.share is not None:
                proc.share = beat.share
            if beat.member_id is not None:
                proc.member_id, proc.group_protocol = beat.member_id, beat.group_protocol
            if beat.epoch is not None or beat.partitions is not None:
                self._pokes.news(proc.pid)   # it joined, moved to a new target, took or gave partitions
            if beat.partitions is not None:
                log.info("worker %d (pid %d) has its assignment: generation %s, [%s]", proc.index, proc.pid,
                         "-" if beat.generation is None else beat.generation, ", ".join(beat.partitions))
            if beat.ready and not proc.ready:
                proc.ready = True
                self.slots[proc.index].crashes_before_ready = 0

    # -- signals --------------------------------------------------------------------------------

    def _dispatch_signals(self) -> None:
        while self._signals:
            sig = self._signals.pop(0)
            handler = {signal.SIGTERM: self.handle_term, signal.SIGINT: self.handle_term,
                       signal.SIGHUP: self.handle_hup, signal.SIGTTIN: self.handle_ttin,
                       signal.SIGTTOU: self.handle_ttou, RETIRE_SIGNAL: self.handle_retire}.get(sig)
            if handler is not None:
                handler()

    def handle_term(self) -> None:
        """Stop (SIGTERM, SIGINT, or a worker's exit that stops the daemon); what the workers do
        with their static group memberships is ``[daemon] on_stop``'s."""
        self._stop(leave_group=self.config.daemon.on_stop == "leave_group")

    def handle_retire(self) -> None:
        """``RETIRE_SIGNAL`` (``kdaemon stop --leave-group``): stop, every worker leaving the group
        for good, so the group has no member of this daemon left once it exited (an offset reset
        works at once).  During a stop already under way, the workers still running are told to
        leave for good after all."""
        self._stop(leave_group=True)

    def _stop(self, *, leave_group: bool) -> None:
        if self._stopping:
            if leave_group and not self._leaving:
                log.info("stopping: the %d worker(s) still running leave the group for good after all",
                         len(self.workers))
                self._leaving = True
                self._terminate_all(graceful=True)
            return
        log.info("stopping: asking %d worker(s) to finish, flush and commit, then %s", len(self.workers),
                 "leave the group for good" if leave_group or self.config.group_type == "share" else
                 "keep their static group membership for a restart (until the session times out)")
        sdnotify.notify("STOPPING=1")
        self._stopping = True
        self._leaving = leave_group
        self._terminate_all(graceful=True)

    def handle_hup(self) -> None:
        if self._stopping:
            # Too late: a roll would start workers we are stopping, and systemd must not see
            # RELOADING=1 after STOPPING=1.
            log.info("ignoring SIGHUP: stopping")
            return
        try:
            reload = prepare_reload(self.config_path, self.config)
        except ConfigError as exc:
            log.error("reload refused, keeping the running configuration:\n%s", exc)
            return
        except Exception as exc:
            log.error("reload refused, keeping the running configuration: %s", exc)
            return
        sdnotify.notify(f"RELOADING=1\nMONOTONIC_USEC={sdnotify.monotonic_usec()}")
        log.info("reloading %s: rolling %d worker(s) one at a time", self.config_path, len(self.workers))
        old, self.config, self.plugins = self.config, reload.config, reload.plugins
        new = reload.config
        level = getattr(logging, new.daemon.log_level, None)
        if level is not None:
            logging.getLogger().setLevel(level)
        self._config_generation += 1
        self._rolling = sorted({w.index for w in self.workers.values() if not w.stopping})
        self._roll_waiting = None
        self._ready_sent = False
        self._configure_companions(new, reload.companions)
        for e in self._endpoints():
            e.set_limits(new.daemon.endpoint_request_timeout_s, new.daemon.endpoint_max_clients)
        if self._workers_override is None and old.daemon.workers != new.daemon.workers:
            self.target = new.daemon.workers or os.cpu_count() or 1
            log.info("worker count from the new configuration: %d", self.target)
            self._retire_beyond_target()
            self._rolling = [i for i in self._rolling if i < self.target]

    def handle_ttin(self) -> None:
        self.target += 1
        log.info("one worker more: %d", self.target)
        self._after_resize()

    def handle_ttou(self) -> None:
        if self.target <= 1:
            return
        self.target -= 1
        log.info("one worker less: %d", self.target)
        self._retire_beyond_target()
        self._after_resize()

    def _retire_beyond_target(self) -> None:
        """Stop the workers the smaller pool has no slot for, for good: each leaves the group as
        a member that is not coming back, so its partitions move to the others at once instead
        of waiting out the session timeout kept for a static member's successor."""
        for w in self.workers.values():
            if w.index >= self.target and not w.stopping:
                self._stop_worker(w, for_good=True)

    def _after_resize(self) -> None:
        if self.config.daemon.assignment == "static":
            # Subsets depend on the worker count: every worker takes its new share.
            self._rolling = sorted({w.index for w in self.workers.values()
                                    if not w.stopping and w.index < self.target})
            self._roll_waiting = None

    # -- workers --------------------------------------------------------------------------------

    def _live_indexes(self) -> set[int]:
        return {w.index for w in self.workers.values()}

    def _configure_companions(self, config: DaemonConfig, specs) -> None:
        self.companions.configure(specs, log_level=config.daemon.log_level,
                                  stop_timeout_s=config.daemon.shutdown_timeout_s)

    def _manage_workers(self) -> None:
        self.companions.tick()
        if self._stopping:
            return
        now = time.monotonic()
        live = self._live_indexes()
        for index in range(self.target):
            if index in live:
                continue
            if self._roll_waiting is not None and index != self._roll_waiting and index in self._rolling:
                continue
            slot = self.slots.setdefault(index, Slot())
            if now < slot.next_start:
                continue
            self._spawn(index)

    def _spawn(self, index: int) -> None:
        try:
            self.plugins.pre_fork(index, self.config)
        except Exception:
            log.exception("a plugin's kdaemon_pre_fork failed for worker %d; stopping", index)
            self._exit_code = EXIT_BOOT_FAILURE
            self.handle_term()
            return
        r, w = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        supervisor = os.getpid()   # the child checks it is still its parent (child.py, parent.py)
        pid = os.fork()
        if pid == 0:  # the child
            code = EXIT_FAILURE
            try:
                os.close(r)
                os.close(self._wake_r)
                os.close(self._wake_w)
                if self._metrics_http is not None:
                    self._metrics_http.close()
                self._control.close_in_child()
                for other in self.workers.values():
                    try:
                        os.close(other.heartbeat_fd)
                    except OSError:
                        pass
                code = run_child(self.config, index, self.target, w, self.plugins,
                                 self.slots.setdefault(index, Slot()).predecessor, supervisor)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = EXIT_FAILURE
            finally:
                # os._exit skips atexit: this hook is a plugin's last chance in the worker.
                try:
                    self.plugins.worker_exit(index, code)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(w)
        os.set_blocking(r, False)
        now = time.monotonic()
        self.workers[pid] = WorkerProc(index, pid, r, now, now, generation=self._config_generation)
        log.info("started worker %d (pid %d)", index, pid)
        if self._prom is not None:
            self._prom.worker_started(index)

    def _stop_worker(self, proc: WorkerProc, *, for_good: bool = False) -> None:
        """SIGTERM: drain, commit and stop, keeping the static membership for a successor;
        ``for_good``: ``RETIRE_SIGNAL``, the same but leaving the group for good (also to a
        worker already stopping: it leaves for good if its consumer is not closed yet).  The
        deadline of ``shutdown_timeout_s`` runs from the first signal."""
        if not proc.stopping:
            proc.stop_sent_at = time.monotonic()
        proc.stopping = True
        proc.retiring = proc.retiring or for_good
        try:
            os.kill(proc.pid, RETIRE_SIGNAL if for_good else signal.SIGTERM)
        except ProcessLookupError:
            pass

    def _terminate_all(self, graceful: bool) -> None:
        for proc in list(self.workers.values()):
            if graceful:
                if not proc.stopping or (self._leaving and not proc.retiring):
                    self._stop_worker(proc, for_good=self._leaving)
            else:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.companions.reaped(pid, os.waitstatus_to_exitcode(status)):
                refused = self.companions.refused()
                if refused is not None and not self._stopping:
                    # As a worker's exit a restart cannot cure (_STOPS_THE_DAEMON): its line said why.
                    if self._exit_code == EXIT_OK:
                        self._exit_code = refused[1]
                    self.handle_term()
                continue
            proc = self.workers.pop(pid, None)
            if proc is None:
                continue
            try:
                os.close(proc.heartbeat_fd)
            except OSError:
                pass
            self._resources.forget(pid)
            if self._prom is not None:
                self._prom.mark_dead(pid)
                self._prom.WORKER_RESOURCES.forget(proc.index, pid)
            code = os.waitstatus_to_exitcode(status)
            self._pokes.news(None)   # what it held is free now, or soon (a static member's session)
            self._on_exit(proc, code)

    def _on_exit(self, proc: WorkerProc, code: int) -> None:
        slot = self.slots.setdefault(proc.index, Slot())
        now = time.monotonic()
        if proc.retiring and code == 0:
            slot.predecessor = None      # it left the group for good: nothing for a successor to release
        elif proc.member_id is not None:   # one that never joined leaves the one before it standing
            slot.predecessor = Predecessor(proc.member_id, proc.group_protocol, clean=code == 0)
        why = _STOPS_THE_DAEMON.get(code)
        if why is not None and not proc.stopping:
            log.error("worker %d (pid %d) %s (exit %d); see its log above. Stopping every worker instead of "
                      "restarting it %s", proc.index, proc.pid, why[0], code, why[1])
            if self._exit_code == EXIT_OK:
                self._exit_code = code
            slot.next_start = now
            self.handle_term()
            return
        if proc.stopping or self._stopping:
            log.info("worker %d (pid %d) stopped with code %d", proc.index, proc.pid, code)
            if proc.replaced_for is not None and not self._stopping and self._prom is not None:
                self._prom.worker_restarted(proc.index, code, proc.replaced_for)   # recycled for memory
            if self._stopping and self._exit_code == EXIT_OK and code not in (0, -signal.SIGTERM, -RETIRE_SIGNAL):
                # A worker that failed or had to be killed while stopping: not a clean stop.
                self._exit_code = code if code > 0 else EXIT_FAILURE
            slot.next_start = now
            return
        if not proc.ready:
            slot.crashes_before_ready += 1
            if slot.crashes_before_ready >= _BOOT_CRASHES:
                log.error("worker %d died %d times before ever getting its assignment; stopping",
                          proc.index, slot.crashes_before_ready)
                self._exit_code = EXIT_BOOT_FAILURE
                self.handle_term()
                return
        if now - proc.started > STABLE_AFTER_S:
            slot.backoff.reset()
        backoff = slot.backoff.failure()
        slot.restarts += 1
        slot.next_start = now + backoff
        if self._prom is not None:
            self._prom.worker_restarted(proc.index, code, proc.replaced_for)
            slot.last_restart_reason = describe_restart(self._prom.restart_reason(code, proc.replaced_for), code)
        log.warning("worker %d (pid %d) exited with code %d; restarting in %.1fs", proc.index, proc.pid,
                    code, backoff)

    def _check_liveness(self) -> None:
        now = time.monotonic()
        deadline = self.config.daemon.heartbeat_timeout_s
        for proc in list(self.workers.values()):
            if proc.stopping:
                if proc.stop_sent_at is not None and now - proc.stop_sent_at > self.config.daemon.shutdown_timeout_s:
                    log.warning("worker %d (pid %d) did not stop within %.0fs; killing it", proc.index,
                                proc.pid, self.config.daemon.shutdown_timeout_s)
                    try:
                        os.kill(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.stop_sent_at = now + 3600
                continue
            if now - proc.last_heartbeat > deadline:
                log.error("worker %d (pid %d) missed its heartbeat for %.0fs; killing and replacing it",
                          proc.index, proc.pid, now - proc.last_heartbeat)
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.last_heartbeat = now  # one kill per deadline
                proc.replaced_for = "heartbeat_timeout"

    def _sample_resources(self) -> None:
        now = time.monotonic()
        if now < self._next_sample:
            return
        self._next_sample = now + 5.0
        limit = self.config.daemon.max_worker_rss_mb
        for proc in list(self.workers.values()):
            usage = self._resources.sample(proc.pid)
            if usage is None:
                continue
            rss_mb = usage.rss_bytes / 1048576
            if self._prom is not None:
                self._prom.WORKER_RESOURCES.set(proc.index, proc.pid, usage.rss_bytes, usage.peak_rss_bytes,
                                                usage.cpu_percent)
            # One replacement at a time: not while a roll is under way or still waiting for the
            # last replaced worker's successor (resetting _roll_waiting would take a second one down).
            idle = not self._rolling and self._roll_waiting is None
            if limit and rss_mb > limit and not proc.stopping and idle:
                log.warning("worker %d (pid %d) uses %.0f MB > max_worker_rss_mb=%d; recycling it",
                            proc.index, proc.pid, rss_mb, limit)
                self._rolling = [proc.index]
                proc.replaced_for = "memory"
                self._roll_waiting = None

    def _step_rolling(self) -> None:
        """Replace workers one at a time (reload, resize, recycle): stop one, wait until its
        successor has its assignment, go on."""
        if self._stopping:
            return
        if self._roll_waiting is not None:
            index = self._roll_waiting
            succ = next((w for w in self.workers.values() if w.index == index and not w.stopping), None)
            if succ is None or not succ.ready:
                return
            self._roll_waiting = None
        if not self._rolling:
            return
        index = self._rolling.pop(0)
        old = next((w for w in self.workers.values() if w.index == index and not w.stopping), None)
        if old is not None:
            self._stop_worker(old)
            self.slots.setdefault(index, Slot()).next_start = 0.0
        self._roll_waiting = index

    # -- reporting ------------------------------------------------------------------------------

    def _all_ready(self) -> bool:
        running = [w for w in self.workers.values() if not w.stopping]
        return len(running) >= self.target and all(w.ready for w in running) and not self._rolling \
            and self._roll_waiting is None

    def _report(self) -> None:
        now = time.monotonic()
        if self._stopping:
            return
        all_ready = self._all_ready()
        if all_ready and not self._ready_sent:
            self._ready_sent = True
            log.info("all %d worker(s) have their assignment", self.target)
            sdnotify.notify("READY=1")
        if now >= self._next_status:
            self._next_status = now + 5.0
            running = [w for w in self.workers.values() if not w.stopping]
            lag = sum(w.lag for w in running)
            down = [w.sink_down_s for w in running if w.sink_down_s]
            stalled = (f", sink down {duration(max(down))} on {len(down)} worker(s), partitions paused"
                       if down else "")
            problems = Counter(p for w in running for p in w.problems)
            said = "".join(f", {name.replace('_', ' ')} on {n} worker(s)" for name, n in sorted(problems.items()))
            sdnotify.notify(f"STATUS={sum(w.ready for w in running)}/{self.target} workers ready, "
                            f"{sum(w.assigned for w in running)} partitions, lag {lag}{stalled}{said}")
        if self._watchdog is not None and now >= self._next_watchdog:
            live = all(now - w.last_heartbeat <= self.config.daemon.heartbeat_timeout_s
                       for w in self.workers.values() if not w.stopping)
            if live:
                self._next_watchdog = now + self._watchdog
                sdnotify.notify("WATCHDOG=1")
