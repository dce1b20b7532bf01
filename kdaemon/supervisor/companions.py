"""Companion processes: what the configured sinks need beside the workers, run without knowing why.

The plugins describe them (``kdaemon_sink_companions`` -> ``CompanionSpec``); this module starts
them, restarts one that died with its own ``Backoff`` (reset after a run of
``STABLE_AFTER_S``) unless its exit code says a restart cannot help (``refused``: the daemon
stops instead), restarts one whose spec a reload changed, and stops them all — the
supervisor calls ``stop_all`` only after its last worker is gone, because stopping workers
flush their final batches to them.  ``kdaemon run --in-process`` uses the same class.

Who reaps: the supervisor reaps every child with ``waitpid(-1)`` and hands a companion's status
to ``reaped``; without a supervisor, ``poll`` reaps this module's own processes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ..backoff import Backoff
from ..config import DaemonConfig
from ..exit_codes import PERMANENT
from ..plugins.companion import CompanionSpec
from .companion_run import launch
from .parent import preexec
from .control import CompanionStatus

log = logging.getLogger("kdaemon.supervisor")

STABLE_AFTER_S = 60.0   # a process that ran this long starts its restart backoff from scratch


def specs_for(config: DaemonConfig, plugins) -> list[CompanionSpec]:
    """The companions the configured sink and dead-letter sink need, once each by name.

    ``plugins`` is a ``PluginManager``.  Raises ValueError for two different companions under
    one name (two sinks that would share a process but want different ones)."""
    from ..worker.build import sink_context
    context = sink_context(config)
    specs: dict[str, CompanionSpec] = {}
    for sink in (config.sink, config.dlq):
        if sink is None:
            continue
        for spec in plugins.sink_companions(sink.type, sink.settings, context):
            if spec.name in specs and specs[spec.name] != spec:
                raise ValueError(f"two sinks need a companion named {spec.name!r}, with different "
                                 f"settings: {specs[spec.name]} and {spec}")
            specs[spec.name] = spec
    return list(specs.values())


@dataclass
class _Companion:
    spec: CompanionSpec
    backoff: Backoff
    proc: subprocess.Popen | None = None
    started: float = 0.0
    next_start: float = 0.0
    replace_with: CompanionSpec | None = None   # stopped for a reload: start this when it has exited
    retired: bool = False                       # no longer wanted: do not start it again
    refused: int | None = None                  # exited with a code a restart does not cure


class Companions:
    """The companions of one daemon.  Not thread-safe: one loop drives it."""

    def __init__(self) -> None:
        self.log_level = "INFO"
        self.stop_timeout_s = 30.0   # for a spec without its own stop_timeout_s
        self._all: dict[str, _Companion] = {}
        self._stopping = False

    # -- what should run ------------------------------------------------------------------------

    def configure(self, specs: Sequence[CompanionSpec], *, log_level: str, stop_timeout_s: float) -> None:
        """Want exactly ``specs`` from now on (start-up and every reload).

        A companion whose spec is unchanged keeps running (or, if it waits out a crash backoff,
        starts at the next ``tick``: the reload may have fixed what made it crash); a changed
        one is stopped and started again with its new spec; one no longer wanted is stopped."""
        self.log_level, self.stop_timeout_s = log_level, stop_timeout_s
        wanted = {s.name: s for s in specs}
        for name, c in list(self._all.items()):
            new = wanted.pop(name, None)
            if new is None:
                if c.proc is None:
                    del self._all[name]
                else:
                    c.retired, c.replace_with = True, None
                    self._signal(c, "it is no longer needed")
            elif c.proc is None:
                if new != c.spec:
                    self._all[name] = _Companion(new, Backoff(*new.restart_backoff_s))
                else:
                    c.backoff.reset()
                    c.next_start = 0.0
            elif c.retired or c.replace_with is not None:
                c.retired, c.replace_with = False, new   # already stopping: start this once it exited
            elif new != c.spec:
                c.replace_with = new
                self._signal(c, "for the new configuration")
            else:
                c.backoff.reset()
        for name, spec in wanted.items():
            self._all[name] = _Companion(spec, Backoff(*spec.restart_backoff_s))

    def tick(self) -> None:
        """Start what should run and is not running (past its backoff)."""
        if self._stopping:
            return
        now = time.monotonic()
        for c in self._all.values():
            if c.proc is None and not c.retired and c.replace_with is None and c.refused is None \
                    and now >= c.next_start:
                self._start(c, now)

    def refused(self) -> tuple[str, int] | None:
        """(name, exit code) of a companion that exited with a code a restart does not cure
        (``exit_codes.PERMANENT``), never started again: the daemon stops with that code."""
        return next(((name, c.refused) for name, c in sorted(self._all.items()) if c.refused is not None), None)

    def pids(self) -> set[int]:
        return {c.proc.pid for c in self._all.values() if c.proc is not None}

    def states(self) -> list[CompanionStatus]:
        """Each companion, its pid (None while it waits to start again) and uptime, for
        ``kdaemon status``."""
        now = time.monotonic()
        return [CompanionStatus(name, None if c.proc is None else c.proc.pid,
                                None if c.proc is None else now - c.started) for name, c in sorted(self._all.items())]

    # -- processes ------------------------------------------------------------------------------

    def _stop_timeout(self, c: _Companion) -> float:
        return c.spec.stop_timeout_s if c.spec.stop_timeout_s is not None else self.stop_timeout_s

    def _start(self, c: _Companion, now: float) -> None:
        """Start ``c`` (from the main thread: the kernel's parent-death signal is tied to the
        thread that forks, ``parent.py``).  An entry companion watches this process itself
        (``companion_run``); a plain command gets only the kernel's stop signal."""
        me = os.getpid()
        argv, env = launch(c.spec, self.log_level, os.environ, parent=me, stop_timeout_s=self._stop_timeout(c))
        c.started = now
        try:
            c.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                      preexec_fn=preexec(me, c.spec.stop_signal) if c.spec.argv is not None else None)
        except OSError as exc:
            delay = c.backoff.failure()
            c.next_start = now + delay
            log.error("cannot start companion %s (%s): %s; trying again in %.1fs", c.spec.name, argv[0],
                      exc.strerror or exc, delay)
            return
        log.info("started companion %s (pid %d)", c.spec.name, c.proc.pid)

    def _signal(self, c: _Companion, why: str, sig: int | None = None) -> None:
        if c.proc is None:
            return
        log.info("stopping companion %s (pid %d) %s", c.spec.name, c.proc.pid, why)
        try:
            os.kill(c.proc.pid, c.spec.stop_signal if sig is None else sig)
        except ProcessLookupError:
            pass

    def reaped(self, pid: int, code: int) -> bool:
        """The supervisor reaped ``pid`` with exit ``code``: True if it was a companion."""
        c = next((c for c in self._all.values() if c.proc is not None and c.proc.pid == pid), None)
        if c is None:
            return False
        c.proc.returncode = code   # reaped by waitpid: Popen must not wait for it again
        c.proc = None
        name = c.spec.name
        if self._stopping or c.retired:
            log.info("companion %s stopped with code %d", name, code)
            if c.retired:
                del self._all[name]
            return True
        if c.replace_with is not None:
            log.info("companion %s stopped with code %d for the reload; starting it again", name, code)
            self._all[name] = _Companion(c.replace_with, Backoff(*c.replace_with.restart_backoff_s))
            return True
        if code in PERMANENT:
            # The uploader refusing a Spark its jars are not built for (EXIT_SINK_REFUSED), bad
            # settings: restarted with backoff it logged the same refusal for ever.
            c.refused = code
            log.error("companion %s exited with code %d, which a restart does not cure (its log above says why "
                      "and what to change): not restarting it; the daemon stops", name, code)
            return True
        now = time.monotonic()
        if now - c.started > STABLE_AFTER_S:
            c.backoff.reset()
        delay = c.backoff.failure()
        c.next_start = now + delay
        log.error("companion %s exited with code %d; restarting it in %.1fs", name, code, delay)
        return True

    def poll(self) -> None:
        """Reap this module's own processes (when no supervisor reaps every child)."""
        for pid in self.pids():
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done:
                self.reaped(pid, os.waitstatus_to_exitcode(status))

    def stop_all(self) -> None:
        """Stop every companion and wait for it (each up to its stop timeout, then SIGKILL).
        Call it last: after the workers, which flush their final batches to companions."""
        self._stopping = True
        for c in list(self._all.values()):
            self._signal(c, "(the daemon stops)")
        for c in list(self._all.values()):
            if c.proc is None:
                continue
            timeout = self._stop_timeout(c)
            pid = c.proc.pid
            try:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    done, status = os.waitpid(pid, os.WNOHANG)
                    if done:
                        self.reaped(pid, os.waitstatus_to_exitcode(status))
                        break
                    time.sleep(0.1)
                else:
                    log.warning("companion %s (pid %d) did not stop within %.0fs; killing it",
                                c.spec.name, pid, timeout)
                    os.kill(pid, signal.SIGKILL)
                    self.reaped(pid, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
            except (ProcessLookupError, ChildProcessError):
                c.proc = None

    def kill_all(self) -> None:
        """The supervisor itself fails: SIGKILL every companion, reap none (we are exiting)."""
        self._stopping = True
        for c in self._all.values():
            self._signal(c, "(the supervisor failed)", signal.SIGKILL)
