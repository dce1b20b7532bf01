"""The supervisor's configurations: checking one without running plugin code in the process
workers are forked from, and what a reload (SIGHUP) can and cannot change."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass, replace

from ..config import ConfigError, DaemonConfig, load
from ..plugins.manager import PluginManager
from .companions import specs_for

log = logging.getLogger(__name__)

# [daemon] settings the supervisor takes at start only, and why.
RESTART_ONLY = {
    "metrics_addr": "the /metrics endpoint is bound at start",
    "state_dir": "the daemon's lock, metrics files and sink state live there",
}


def validate_in_subprocess(config_path: str) -> list[str]:
    """Run ``kdaemon check-config`` in a fresh process and return its problems.

    Checking what the plugins think of a configuration means running plugin code (factories);
    doing it in the supervisor would leave whatever it creates (threads, sockets) in the
    process every worker is forked from.
    """
    proc = subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", config_path],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 0:
        return []
    return [line for line in proc.stderr.splitlines() if line.strip()] or \
        [f"{config_path}: check-config exited with {proc.returncode}"]


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
    problems = validate_in_subprocess(config_path)
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
