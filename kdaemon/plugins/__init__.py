"""kdaemon's plugin system (pluggy, project name ``kdaemon``).

Plugins implement hooks from ``hookspecs.py`` with the ``hookimpl`` marker exported here and
are found through the ``kdaemon`` entry-point group.  Hooks are called once, at start-up, to
obtain named factories (header filters, deserializers, interceptors, sinks); the worker calls
the objects they build directly, never a hook per record.
"""

import pluggy

PROJECT = "kdaemon"
hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)

__all__ = ["PROJECT", "hookimpl", "hookspec"]
