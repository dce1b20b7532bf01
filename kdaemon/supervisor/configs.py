"""The supervisor's configurations: checking one without running plugin code in the process
workers are forked from, and what a reload (SIGHUP) can and cannot change."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass, replace

from ..config import ConfigError, DaemonConfig, load
from ..plugins.manager import PluginManager
from .child import detach_from_supervisor
from .companions import specs_for

log = logging.getLogger(__name__)

# [daemon] settings the supervisor takes at start only, and why.
RESTART_ONLY = {
    "metrics_addr": "the /metrics endpoint is bound at start",
    "state_dir": "the daemon's lock, metrics files and sink state live there",
}


# How long a configuration check may take (plugin factories run in it) before it is killed.
CHECK_TIMEOUT_S = 120.0


def validate_in_child(config_path: str, timeout_s: float = CHECK_TIMEOUT_S) -> list[str]:
    """``worker.main.check_file``'s problems, found in a forked child; [] if there are none.

    Checking what the plugins think of a configuration means running plugin code (factories);
    doing it in the supervisor would leave whatever it creates (threads, sockets) in the
    process every worker is forked from.  A fork rather than a fresh interpreter: the child
    already has every module imported, so the check costs milliseconds instead of the 0.4 s of
    starting ``kdaemon check-config`` (paid before every start and every SIGHUP roll), and it
    checks with exactly the code the workers are forked with.  The problems come back as JSON
    over a pipe; a child that fails, dies or outlives ``timeout_s`` is a problem itself.
    """
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:   # the child: never returns
        code = 1
        try:
            os.close(r)
            detach_from_supervisor(supervisor)
            from ..worker.main import check_file
            try:
                problems = check_file(config_path).problems
            except Exception as exc:
                traceback.print_exc()
                problems = [f"{config_path}: the configuration check failed ({type(exc).__name__}: {exc}); "
                            "the traceback is in the log"]
            data = json.dumps(problems).encode()
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            try:
                ready, _, _ = select.select([r], [], [], left)
            except InterruptedError:
                continue
            if ready:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
        if timed_out:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    if timed_out:
        return [f"{config_path}: the configuration check (the plugins' factories) did not finish within "
                f"{timeout_s:g} s"]
    code = os.waitstatus_to_exitcode(status)
    try:
        problems = json.loads(b"".join(chunks)) if code == 0 else None
    except ValueError:
        problems = None
    if not isinstance(problems, list):
        return [f"{config_path}: the configuration check ended with exit code {code} before it reported"]
    return [str(p) for p in problems]


def load_plugins(config: DaemonConfig) -> PluginManager:
    """The allowlisted plugins, imported but not configured: no factory and no
    ``kdaemon_configure`` runs here (see ``arbiter``'s docstring)."""
    from ..worker.main import load_plugins as load_
    return load_(config, configure=False)


@dataclass(frozen=True)
class Reload:
    config: DaemonConfig
    plugins: PluginManager
    companions: list


def prepare_reload(config_path: str, running: DaemonConfig) -> Reload:
    """The configuration a SIGHUP asks for, checked; ConfigError (or another exception) if it
    cannot be used.  Settings a reload cannot apply keep their running values, each change
    said in the log: a reload that ignored them quietly left operators looking at the old port."""
    new = load(config_path)
    problems = validate_in_child(config_path)
    if problems:
        raise ConfigError(problems)
    plugins = load_plugins(new)
    companions = specs_for(new, plugins)
    kept = {}
    for name, why in RESTART_ONLY.items():
        was, wanted = getattr(running.daemon, name), getattr(new.daemon, name)
        if was != wanted:
            log.warning("reload: [daemon] %s = %r is not applied (%s); the daemon keeps %r until it restarts",
                        name, wanted, why, was)
            kept[name] = was
    if kept:
        new = replace(new, daemon=replace(new.daemon, **kept))
    return Reload(new, plugins, companions)
