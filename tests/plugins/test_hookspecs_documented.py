"""Every hook specification is documented (as datasette checks its own).

A hookspec is the whole contract a plugin author gets: when it is called, what each parameter
is, and what the return value means.  This fails when one lacks a docstring, a ``:return:``
line, or a ``:param <name>:`` line for one of its parameters.
"""

from __future__ import annotations

import inspect

import pytest

from kdaemon.plugins import PROJECT, hookspecs
from kdaemon.plugins.manager import PluginManager

SPECS = sorted(name for name, obj in vars(hookspecs).items()
               if inspect.isfunction(obj) and hasattr(obj, f"{PROJECT}_spec"))

# Known gaps in hookspecs.py, each with what to add.  strict: the day it is fixed this xfail
# turns into a failure, so the entry cannot outlive the gap.
KNOWN_GAPS: dict[str, str] = {}


def test_specs_are_found():
    assert SPECS, "no hookspecs found: is the marker attribute still '<project>_spec'?"
    assert set(SPECS) == set(hookspecs.ALL_HOOKS), "ALL_HOOKS and the specs disagree"


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_GAPS[n], strict=True)) if n in KNOWN_GAPS else n
    for n in SPECS
])
def test_hookspec_is_documented(name):
    fn = getattr(hookspecs, name)
    doc = inspect.getdoc(fn)
    assert doc, f"hookspec {name} has no docstring"
    lines = [line.strip() for line in doc.splitlines()]
    assert any(line.startswith(":return:") for line in lines), \
        f"hookspec {name}: docstring has no ':return:' line saying what the return value means"
    for param in inspect.signature(fn).parameters:
        assert any(line.startswith(f":param {param}:") for line in lines), \
            f"hookspec {name}: docstring does not document parameter {param!r} (':param {param}:')"


def test_every_collecting_hook_has_a_typed_method():
    # Callers use manager.sinks() etc., never pm.hook.<name>(...) by string.
    methods = {"kdaemon_header_filters": "header_filters", "kdaemon_deserializers": "deserializers",
               "kdaemon_interceptors": "interceptors", "kdaemon_sinks": "sinks",
               "kdaemon_sink_companions": "sink_companions", "kdaemon_filtered_observer": "filtered_observers",
               "kdaemon_configure": "configure", "kdaemon_pre_fork": "pre_fork",
               "kdaemon_post_fork": "post_fork", "kdaemon_worker_exit": "worker_exit"}
    assert set(methods) == set(SPECS), "a new hook needs a typed PluginManager method (and a row here)"
    for method in methods.values():
        assert callable(getattr(PluginManager, method))
