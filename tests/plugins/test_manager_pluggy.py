"""The manager calls the collecting hooks through pluggy, so pluggy's own features apply to them:
tryfirst/trylast order the calls, a ``wrapper=True`` implementation sees and changes the results,
and pluggy's tracing sees the call.  The errors still name the plugin at fault.

Each test registers in-process plugins on a real PluginManager (no built-ins where they would
only add noise) and calls the typed methods, as the worker does.
"""

from __future__ import annotations

import pytest

from kdaemon.plugins import hookimpl
from kdaemon.plugins.manager import PluginError, PluginManager


def _sink_plugin(name: str, calls: list[str], **marks):
    """A plugin offering the sink ``name`` whose hook records that it was called."""
    class Plugin:
        @hookimpl(**marks)
        def kdaemon_sinks(self):
            calls.append(name)
            return {name: lambda settings: name}
    return Plugin()


def test_tryfirst_and_trylast_order_the_calls():
    calls: list[str] = []
    pm = PluginManager(enabled=[], include_builtin=False)
    # Registered first-to-last: late, plain, early.  pluggy calls the most recently registered
    # plain implementation first, tryfirst before all of them and trylast after all of them.
    pm.register(_sink_plugin("late", calls, trylast=True), "late")
    pm.register(_sink_plugin("plain-1", calls), "plain-1")
    pm.register(_sink_plugin("early", calls, tryfirst=True), "early")
    pm.register(_sink_plugin("plain-2", calls), "plain-2")
    sinks = pm.sinks()
    assert calls == ["early", "plain-2", "plain-1", "late"]
    assert list(sinks) == calls          # merged in call order
    assert sinks["late"]({}) == "late"


def test_a_wrapper_sees_every_result_and_may_change_them():
    seen = []

    class Wrap:
        """Wraps every sink factory of every other plugin (e.g. to count what each sink writes)."""
        @hookimpl(wrapper=True)
        def kdaemon_sinks(self):
            results = yield
            seen.append([sorted(r) for r in results])
            return [{name: (lambda settings, f=f: ("wrapped", f(settings))) for name, f in r.items()}
                    for r in results] + [{"added-by-wrapper": lambda settings: "added"}]

    calls: list[str] = []
    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(_sink_plugin("a", calls), "a")
    pm.register(_sink_plugin("b", calls), "b")
    pm.register(Wrap(), "wrap")
    sinks = pm.sinks()
    assert seen == [[["b"], ["a"]]]                  # once, with both plugins' results
    assert sinks["a"]({}) == ("wrapped", "a") and sinks["b"]({}) == ("wrapped", "b")
    assert sinks["added-by-wrapper"]({}) == "added"


def test_pluggy_tracing_sees_the_call_and_its_result():
    lines: list[str] = []
    calls: list[str] = []
    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(_sink_plugin("traced", calls), "traced")
    stop = pm.enable_tracing(lines.append)
    pm.sinks()
    stop()
    pm.sinks()                                       # not traced any more
    assert calls == ["traced", "traced"]
    assert len([ln for ln in lines if ln.lstrip().startswith("kdaemon_sinks")]) == 1, lines
    assert any("finish kdaemon_sinks -->" in ln and "'traced'" in ln for ln in lines), lines


def test_a_raising_hook_is_named_even_behind_a_wrapper():
    class Raises:
        @hookimpl
        def kdaemon_interceptors(self):
            raise ValueError("no such thing")

    class Fine:
        @hookimpl
        def kdaemon_interceptors(self):
            return {"fine": lambda settings: None}

    class Wrap:
        @hookimpl(wrapper=True)
        def kdaemon_interceptors(self):
            return (yield)

    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(Fine(), "fine")
    pm.register(Raises(), "raiser")
    pm.register(Wrap(), "wrap")
    with pytest.raises(PluginError, match=r"^plugin 'raiser': kdaemon_interceptors raised "
                                          r"ValueError: no such thing$"):
        pm.interceptors()


def test_a_wrapper_raising_is_named():
    class Wrap:
        @hookimpl(wrapper=True)
        def kdaemon_sinks(self):
            yield
            raise RuntimeError("wrapper broke")

    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(_sink_plugin("a", []), "a")
    pm.register(Wrap(), "wrap")
    with pytest.raises(PluginError, match=r"^plugin 'wrap': kdaemon_sinks raised RuntimeError: wrapper broke"):
        pm.sinks()


def test_a_clash_names_both_plugins_with_other_plugins_around():
    calls: list[str] = []
    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(_sink_plugin("x", calls), "first")
    pm.register(_sink_plugin("other", calls), "bystander")
    pm.register(_sink_plugin("x", calls, tryfirst=True), "second")
    with pytest.raises(PluginError, match=r"^kdaemon_sinks: 'x' is offered by both 'first' and 'second'; "
                                          r"disable one of them$"):
        pm.sinks()


def test_a_clash_made_by_a_wrapper_says_so():
    class Twice:
        @hookimpl(wrapper=True)
        def kdaemon_sinks(self):
            results = yield
            return results + [{"a": lambda settings: None}]

    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(_sink_plugin("a", []), "a")
    pm.register(Twice(), "twice")
    with pytest.raises(PluginError, match=r"'a' is offered twice, though only 'a' offers it alone: "
                                          r"a wrapper=True implementation"):
        pm.sinks()


def test_a_result_that_is_not_a_mapping_is_named():
    class Listy:
        @hookimpl
        def kdaemon_header_filters(self):
            return ["rules"]

    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(_sink_plugin("a", []), "a")
    pm.register(Listy(), "listy")
    with pytest.raises(PluginError, match=r"^kdaemon_header_filters must return a mapping of names to "
                                          r"factories, got a list \(from 'listy'\)$"):
        pm.header_filters()


def test_none_offers_nothing():
    class Nothing:
        @hookimpl
        def kdaemon_deserializers(self):
            return None

    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(Nothing(), "nothing")
    assert pm.deserializers() == {}


def test_filtered_observers_name_their_plugin_and_skip_the_ones_that_answer_none():
    def seen(records):
        return None

    class Watches:
        @hookimpl
        def kdaemon_filtered_observer(self):
            return seen

    class Declines:
        @hookimpl
        def kdaemon_filtered_observer(self):
            return None

    class Broken:
        @hookimpl
        def kdaemon_filtered_observer(self):
            return "not callable"

    pm = PluginManager(enabled=[], include_builtin=False)
    pm.register(Declines(), "declines")
    pm.register(Watches(), "watches")
    assert pm.filtered_observers() == [("watches", seen)]
    pm.register(Broken(), "broken")
    with pytest.raises(PluginError, match="plugin 'broken': kdaemon_filtered_observer must return a callable or None"):
        pm.filtered_observers()
