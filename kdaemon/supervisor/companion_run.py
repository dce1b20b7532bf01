"""How a companion given as ``entry = "module:function"`` is launched, and its process entry.

Both ends of the launch are here: ``launch`` (the supervisor's side) turns a ``CompanionSpec``
into a command line and environment; ``main`` (the companion's side, ``python -m
kdaemon.supervisor.companion_run module:function``) reads them back, sets up logging like the
daemon's, and calls ``function(**kwargs)``.  The entry stays on the command line, so ``ps``
shows which companion a process is; the keyword arguments travel in one environment variable
(settings may hold secrets, and a command line is readable by every user) that ``main``
removes before the function runs, so nothing it starts inherits them.

The function's return value is the exit code; an exception is logged with its traceback and
exits 1.

The launch also says who started it (``parent``, the supervisor's pid), its stop signal and
stop timeout: ``main`` watches that parent (``parent.CompanionWatch``), so a companion whose
supervisor died stops as if the supervisor had stopped it, and is ended after its stop timeout
if it has not (nobody else is left to).  A companion given as ``argv`` gets the kernel's part of
that only: the stop signal when the parent dies (``parent.preexec``, in ``Companions``).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Mapping

from ..plugins.companion import CompanionSpec
from .parent import CompanionWatch

ENV = "KDAEMON_COMPANION"
_NOT_INHERITED = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")   # only the supervisor talks to systemd

log = logging.getLogger("kdaemon.companion")


def launch(spec: CompanionSpec, log_level: str, environ: Mapping[str, str], *, parent: int | None = None,
           stop_timeout_s: float = 30.0) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that start ``spec`` from process ``parent`` (default:
    this one), which stops it with ``spec.stop_signal`` and kills it ``stop_timeout_s`` later."""
    env = {k: v for k, v in environ.items() if k not in _NOT_INHERITED and k != ENV}
    env.update(spec.env)
    if spec.argv is not None:
        return list(spec.argv), env
    env[ENV] = json.dumps({"name": spec.name, "log_level": log_level, "kwargs": dict(spec.kwargs),
                           "parent": os.getpid() if parent is None else parent,
                           "stop_signal": int(spec.stop_signal), "stop_timeout_s": stop_timeout_s})
    return [sys.executable, "-m", __name__, spec.entry], env


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    raw = os.environ.pop(ENV, None)
    if len(args) != 1 or raw is None:
        print(f"usage: {ENV}='{{...}}' python -m {__name__} module:function (started by the kdaemon "
              "supervisor for a companion process)", file=sys.stderr)
        return 2
    launched = json.loads(raw)
    logging.basicConfig(level=getattr(logging, launched["log_level"], logging.INFO), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s {launched['name']} %(name)s: %(message)s")
    # First, before the function's imports: its supervisor may die at any time from now on.
    watch = CompanionWatch(launched["parent"], launched["stop_signal"], launched["stop_timeout_s"])
    module_name, _, function_name = args[0].partition(":")
    try:
        function = getattr(importlib.import_module(module_name), function_name)
        return int(function(**launched["kwargs"]) or 0)
    except Exception:
        log.exception("companion %s (%s) failed", launched["name"], args[0])
        return 1
    finally:
        watch.finish()


if __name__ == "__main__":
    sys.exit(main())
