"""PluginManager: the allowlist (proven with throwaway installed distributions), name clashes,
missing plugins, bad hooks, and describe()."""

from __future__ import annotations

import itertools
import sys
import textwrap

import pytest

import kdaemon

from kdaemon.plugins import hookimpl
from kdaemon.plugins.manager import PluginError, PluginManager

_ids = itertools.count()

PROBE_MODULE = """\
import pathlib
pathlib.Path(__file__).with_suffix(".imported").write_text("imported")
{extra}
"""

PROBE_HOOKS = """\
from kdaemon.plugins import hookimpl

@hookimpl
def kdaemon_sinks():
    return {{"{sink}": lambda settings: None}}
"""


@pytest.fixture
def install(tmp_path, monkeypatch):
    """Install a throwaway distribution: a dist-info with a ``kdaemon`` entry point and the
    module it names, in a directory put on sys.path.  Returns (module name, flag path): the
    flag file exists once the module was imported."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    created = []

    def install(entry_name: str, body: str = "", sink: str | None = None) -> tuple[str, object]:
        n = next(_ids)
        module = f"kdaemon_probe_{n}_{entry_name}"
        extra = body + (PROBE_HOOKS.format(sink=sink) if sink else "")
        (site / f"{module}.py").write_text(PROBE_MODULE.format(extra=extra))
        dist = site / f"kdaemon_probe_dist_{n}-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kdaemon-probe-dist-{n}\nVersion: 1.0\n")
        (dist / "entry_points.txt").write_text(f"[kdaemon]\n{entry_name} = {module}\n")
        created.append(module)
        return module, site / f"{module}.imported"

    yield install
    for module in created:
        sys.modules.pop(module, None)


def test_installed_but_unlisted_plugin_is_never_imported(install):
    module, flag = install("probe", body="raise RuntimeError('an unlisted plugin ran code')")
    pm = PluginManager(enabled=[])
    assert not flag.exists() and module not in sys.modules
    [found] = [d for d in pm.discovered if d.name == "probe"]
    assert (found.value, found.enabled) == (module, False)
    assert found.distribution.startswith("kdaemon-probe-dist-")


def test_listed_plugin_is_imported_and_used(install):
    module, flag = install("probe", sink="probe-sink")
    pm = PluginManager(enabled=["probe"])
    assert flag.exists() and module in sys.modules
    assert "probe-sink" in pm.sinks()


def test_blocked_plugin_is_not_imported_even_when_listed(install):
    module, flag = install("probe", sink="probe-sink")
    pm = PluginManager(enabled=["probe"], blocked=["probe"])
    assert not flag.exists() and module not in sys.modules
    assert "probe-sink" not in pm.sinks()


def test_plugin_failing_to_import_is_named(install):
    install("broken", body="raise RuntimeError('boom')")
    with pytest.raises(PluginError, match=r"plugin 'broken' \(kdaemon_probe_\d+_broken\) failed to import: "
                                          r"RuntimeError: boom"):
        PluginManager(enabled=["broken"])


def test_missing_enabled_plugin_is_named():
    with pytest.raises(PluginError, match=r"plugin\(s\) not_installed_anywhere are enabled in the "
                                          r"configuration but not installed \(installed: .*ttl"):
        PluginManager(enabled=["ttl", "not_installed_anywhere"])


def test_two_installed_plugins_with_one_name(install):
    install("twin")
    install("twin")
    with pytest.raises(PluginError, match="two installed plugins are both named 'twin'"):
        PluginManager(enabled=[])


def test_same_factory_name_from_two_plugins(install):
    install("first", sink="shared")
    install("second", sink="shared")
    pm = PluginManager(enabled=["first", "second"])
    with pytest.raises(PluginError, match=r"kdaemon_sinks: 'shared' is offered by both "
                                          r"'(first' and 'second|second' and 'first)'; disable one"):
        pm.sinks()


def test_in_process_plugin_clashing_with_a_builtin():
    class Clash:
        @hookimpl
        def kdaemon_deserializers(self):
            return {"bytes": lambda settings: None}

    pm = PluginManager(enabled=[])
    pm.register(Clash(), "clash")
    with pytest.raises(PluginError, match="'bytes' is offered by both 'builtin' and 'clash'"):
        pm.deserializers()


def test_misspelt_hook_is_refused(install):
    install("typo", body=textwrap.dedent("""\
        from kdaemon.plugins import hookimpl

        @hookimpl
        def kdaemon_sink():
            return {}
        """))
    with pytest.raises(PluginError, match="kdaemon_sink"):
        PluginManager(enabled=["typo"])


def test_hook_raising_is_named():
    class Raises:
        @hookimpl
        def kdaemon_interceptors(self):
            raise KeyError("oops")

    pm = PluginManager(enabled=[])
    pm.register(Raises(), "raiser")
    with pytest.raises(PluginError, match="plugin 'raiser': kdaemon_interceptors raised KeyError"):
        pm.interceptors()


def test_bundled_plugins_come_through_entry_points():
    pm = PluginManager(enabled=["header_rules", "ttl", "json", "example"])
    assert {"rules_file", "tenant"} <= set(pm.header_filters())
    assert {"bytes", "str", "json"} <= set(pm.deserializers())
    assert {"ttl", "redact"} <= set(pm.interceptors())


def test_describe(install):
    install("probe", sink="probe-sink")
    pm = PluginManager(enabled=["ttl", "probe"])
    rows = {row["name"]: row for row in pm.describe()}
    version = kdaemon.__version__
    assert rows["builtin"] == {"name": "builtin", "enabled": True, "source": "kdaemon.plugins.builtin",
                               "distribution": "kdaemon", "version": version, "hooks": ["kdaemon_deserializers"]}
    assert rows["ttl"] == {"name": "ttl", "enabled": True, "source": "kdaemon_ttl",
                           "distribution": "kdaemon", "version": version, "hooks": ["kdaemon_interceptors"]}
    assert rows["json"] == {"name": "json", "enabled": False, "source": "kdaemon_json",
                            "distribution": "kdaemon", "version": version, "hooks": []}
    assert rows["probe"]["enabled"] is True and rows["probe"]["hooks"] == ["kdaemon_sinks"]
    assert rows["probe"]["distribution"].startswith("kdaemon-probe-dist-")
    assert list(rows)[0] == "builtin"
