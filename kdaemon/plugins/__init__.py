"""kdaemon's plugin system (pluggy, project name ``kdaemon``).

Plugins implement hooks from ``hookspecs.py`` with the ``hookimpl`` marker exported here and
are found through the ``kdaemon`` entry-point group.  Hooks are called once, at start-up, to
obtain named factories (header filters, deserializers, interceptors, sinks); the worker calls
the objects they build directly, never a hook per record.

A factory checks its settings table with the daemon's own checker, exported here from
``kdaemon.settings``: ``parse_settings(Dataclass, table, where)`` with ``setting(...)`` for a
field's bounds and choices, raising ``SettingsError`` (docs/PLUGINS.md, "Factories and
settings").
"""

import pluggy

from ..settings import SettingsError, found, parse_settings, setting, settings_table

PROJECT = "kdaemon"
hookimpl = pluggy.HookimplMarker(PROJECT)
hookspec = pluggy.HookspecMarker(PROJECT)

__all__ = ["PROJECT", "SettingsError", "found", "hookimpl", "hookspec", "parse_settings", "setting",
           "settings_table"]
