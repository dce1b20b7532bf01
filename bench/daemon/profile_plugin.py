"""bench/daemon's ``--profile``: cProfile around each forked worker's whole life, through the
supervisor's process hooks (kdaemon/plugins/hookspecs.py).

Enabled by Python path in the daemon's configuration (``plugins = [..., "bench.daemon.profile_plugin:"]``,
the repository root on the daemon's ``PYTHONPATH``), with the directory for the profiles in
``KDAEMON_BENCH_PROFILE_DIR``.  ``kdaemon_post_fork`` starts the profiler in the child before
anything of the worker is built (the group join and the first fetches are in the profile, as the
whole ``run_child`` was before); ``kdaemon_worker_exit``, the worker's last Python code (a forked
worker leaves with ``os._exit``, so ``atexit`` would never run), writes
``worker-<index>-<pid>.prof``.  A worker killed by SIGKILL writes nothing: the bench reports
"(no profile written)".
"""

from __future__ import annotations

import os

from kdaemon.plugins import hookimpl

PROFILE_ENV = "KDAEMON_BENCH_PROFILE_DIR"

_profile = None   # this worker's profiler, set after fork


@hookimpl
def kdaemon_post_fork(index: int, config) -> None:
    global _profile
    if not os.environ.get(PROFILE_ENV):
        raise RuntimeError(f"bench.daemon.profile_plugin is enabled but {PROFILE_ENV} is not set: "
                           "no directory to write the worker's profile to")
    import cProfile
    _profile = cProfile.Profile()
    _profile.enable()


@hookimpl
def kdaemon_worker_exit(index: int, exit_code: int) -> None:
    if _profile is None:
        return
    _profile.disable()
    _profile.dump_stats(os.path.join(os.environ[PROFILE_ENV], f"worker-{index}-{os.getpid()}.prof"))
