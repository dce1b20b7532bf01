"""A child of the supervisor does not outlive it: how a child knows its supervisor is gone.

Under systemd the unit's cgroup is killed with the supervisor.  Anywhere else (a shell,
supervisord, a container whose PID 1 is not the daemon) nothing ended its children when it
died (the OOM killer, ``kill -9``): a worker was seen polling its broker half an hour later,
reparented to PID 1, keeping its static group membership, consuming and committing, and
fighting the restarted daemon's worker that took the same ``group_instance_id`` (and holding
the state directory's lock, so the restart was refused); the Spark uploader and its JVM lived
on too.

A child learns it three ways, any one enough (gunicorn's workers use the second):

* the kernel's parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``), asked right after the
  fork (a worker, ``child.detach_from_supervisor``) or first thing in a companion's fresh
  interpreter (``companion_run``): ``PARENT_GONE_SIGNAL`` arrives the moment the supervisor
  dies.  It fires when the *thread* that forked the child ends: the supervisor forks and
  starts companions from its main thread only, which lives as long as it does.  It is asked
  after the fork, so the parent may already be gone by then: hence the check that follows;
* the parent pid: ``os.getppid()`` is no longer the pid the child was started by (it was
  reparented to PID 1 or a subreaper).  A worker compares it on every turn of its loop (once
  per poll), a companion in a watcher thread;
* a worker's heartbeat pipe to the supervisor closing (EPIPE on the next beat,
  ``child.Heartbeat.closed``).

What the child does then is its own stop (a worker's: ``child.run_child``; a companion's: its
``stop_signal``), plus a deadline: nobody is left to kill it after ``shutdown_timeout_s``, so it
sets an alarm of its own (SIGALRM's default action ends the process, even one stuck in C code).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import signal
import sys
import threading

# The kernel's parent-death signal of a worker and of an entry companion: a signal of its own,
# so SIGTERM keeps its meaning (the supervisor's stop) and a handler can tell the two apart; a
# real-time one, since SIGUSR1 is the supervisor's poke (siblings.SIBLING_SIGNAL) and SIGUSR2 a
# stop that leaves the group (child.RETIRE_SIGNAL).
PARENT_GONE_SIGNAL = signal.SIGRTMIN + 1
# How often a companion's watcher thread compares its parent pid (the kernel's signal is the
# prompt way; this covers a platform without it).
WATCH_INTERVAL_S = 0.5

_PR_SET_PDEATHSIG = 1

log = logging.getLogger("kdaemon.companion")


def _prctl():
    """libc's ``prctl``, resolved now (before a fork: ``preexec`` only calls it), or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def ask_parent_death_signal(sig: int, prctl=None) -> bool:
    """Ask the kernel for ``sig`` when this process's parent (the thread that forked it) dies;
    False where it cannot (not Linux)."""
    prctl = prctl or _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


class Supervisor:
    """A child's view of the process that started it (``pid``: the supervisor, or ``kdaemon run
    --in-process`` for its companions)."""

    def __init__(self, pid: int, *, death_signal: int | None = PARENT_GONE_SIGNAL) -> None:
        """Asks for ``death_signal`` (None: do not ask) when the parent dies."""
        self.pid = pid
        asked = death_signal is not None and ask_parent_death_signal(death_signal)
        # Asked after the fork: if the parent died before that, no signal will ever come.
        self.kernel_signals = asked and os.getppid() == pid

    def gone(self) -> bool:
        """This process was reparented: its supervisor died (a cheap system call, fine once per poll)."""
        return os.getppid() != self.pid

    def line(self) -> str:
        """The one line a child logs when it stops for this reason."""
        return f"supervisor (pid {self.pid}) is gone: stopping"

    @staticmethod
    def deadline(seconds: float) -> None:
        """End this process ``seconds`` from now whatever it is doing (SIGALRM's default
        action): with the supervisor gone, nobody else will."""
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(max(1, math.ceil(seconds)))


def preexec(parent: int, sig: int):
    """A ``preexec_fn`` for a companion run as a plain command (``CompanionSpec.argv``), which
    has no Python of ours inside: the kernel sends it ``sig`` (its stop signal) when ``parent``
    dies, and sends it at once if ``parent`` is already gone."""
    prctl = _prctl()   # resolved before the fork

    def set_up() -> None:
        ask_parent_death_signal(sig, prctl)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)
    return set_up


class CompanionWatch:
    """A companion's side (``companion_run.main``, before its function runs): once ``parent`` is
    gone, say it once, send this process its own ``stop_signal`` (the stop its function
    handles, as from the supervisor) and end it ``stop_timeout_s`` later if it is still there.

    The kernel's signal wakes it at once; a watcher thread compares the parent pid every
    ``WATCH_INTERVAL_S`` (a parent gone before the signal was asked for, or no such signal).
    The signal's handler, in the main thread, only arms the deadline (``signal.signal`` is the
    main thread's) and wakes the watcher, which logs the line and then sends the stop: logging
    from a handler can re-enter a stream the main thread is writing, and the line comes before
    whatever the stop makes the function say."""

    def __init__(self, parent: int, stop_signal: int, stop_timeout_s: float) -> None:
        self.supervisor = Supervisor(parent)
        self._stop_signal = stop_signal
        self._stop_timeout_s = stop_timeout_s
        self._armed = False
        self._said = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        signal.signal(PARENT_GONE_SIGNAL, self._on_signal)
        self._thread = threading.Thread(target=self._watch, name="kdaemon-parent-watch", daemon=True)
        self._thread.start()

    def _on_signal(self, *_) -> None:
        """The handler (main thread).  Only for a parent that is gone: a stray PARENT_GONE_SIGNAL (an
        operator's) is not a reason to stop."""
        if self._armed or not self.supervisor.gone():
            return
        self._armed = True
        Supervisor.deadline(self._stop_timeout_s)
        try:
            os.write(self._wake_w, b"!")
        except OSError:
            pass

    def _watch(self) -> None:
        import select
        while not self.supervisor.gone():
            select.select([self._wake_r], [], [], WATCH_INTERVAL_S)
        if not self._armed:
            os.kill(os.getpid(), PARENT_GONE_SIGNAL)   # no kernel signal: the handler arms the deadline
        log.warning("%s", self.supervisor.line())
        self._said.set()
        os.kill(os.getpid(), self._stop_signal)

    def finish(self) -> None:
        """The companion's function returned: if its parent is gone, let the line be said before
        the process ends (the watcher is a daemon thread)."""
        if self.supervisor.gone():
            self._said.wait(WATCH_INTERVAL_S + 1)
