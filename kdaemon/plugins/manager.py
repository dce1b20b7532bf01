"""The plugin manager facade: discovery, the allowlist, and typed access to what plugins offer.

Discovery lists every ``kdaemon`` entry point, but only those named in the configuration's
``plugins`` allowlist are *imported*: an installed plugin nobody asked for never runs any code.
An allowlist entry with a colon is a Python path instead (``"module:attr"``, or ``"module:"`` for
the module itself), imported as such: a plugin that is not an installed distribution.
kdaemon's own built-ins are registered the same way as any plugin, under the name
``builtin``; bundled plugins (the top-level ``plugins/`` folder) come through entry points like
third-party ones.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

import pluggy

from . import PROJECT, hookspecs
from .companion import CompanionSpec, SinkContext

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = PROJECT


class PluginError(Exception):
    """A plugin could not be loaded or offers something that clashes with another plugin."""


@dataclass(frozen=True)
class DiscoveredPlugin:
    name: str
    value: str          # "module" or "module:attr"
    distribution: str | None
    enabled: bool


def _import_ref(ref: str) -> object:
    """A plugin named in the allowlist by Python path instead of an entry point: ``"module:attr"``
    (the object ``attr`` of ``module``) or ``"module:"`` (the module itself) — for a plugin that
    is not installed as a distribution, e.g. a module put on ``PYTHONPATH`` by a benchmark."""
    module_name, _, attr = ref.partition(":")
    try:
        obj = importlib.import_module(module_name)
        for part in filter(None, attr.split(".")):
            obj = getattr(obj, part)
    except Exception as exc:
        raise PluginError(f"plugin {ref!r} failed to import: {type(exc).__name__}: {exc}") from exc
    return obj


class PluginManager:
    def __init__(self, enabled: Iterable[str], *, blocked: Iterable[str] = (),
                 include_builtin: bool = True) -> None:
        self._pm = pluggy.PluginManager(PROJECT)
        self._pm.add_hookspecs(hookspecs)
        enabled = list(enabled)
        blocked = set(blocked)
        self.discovered: list[DiscoveredPlugin] = []
        if include_builtin:
            from . import builtin
            self._pm.register(builtin, name="builtin")
        found = {}
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if getattr(ep, "dist", None) is not None else None
            is_enabled = ep.name in enabled and ep.name not in blocked
            self.discovered.append(DiscoveredPlugin(ep.name, ep.value, dist, is_enabled))
            if ep.name in found:
                raise PluginError(f"two installed plugins are both named {ep.name!r} "
                                  f"({found[ep.name]} and {ep.value}); uninstall one")
            found[ep.name] = ep.value
            if not is_enabled:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                raise PluginError(f"plugin {ep.name!r} ({ep.value}) failed to import: "
                                  f"{type(exc).__name__}: {exc}") from exc
            self._pm.register(plugin, name=ep.name)
        for ref in enabled:
            if ":" in ref and ref not in found and ref not in blocked:
                self._pm.register(_import_ref(ref), name=ref)
        missing = [n for n in enabled if n not in found and n not in blocked and ":" not in n]
        if missing:
            raise PluginError(f"plugin(s) {', '.join(missing)} are enabled in the configuration but not "
                              f"installed (installed: {', '.join(sorted(found)) or 'none'})")
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc)) from exc

    def register(self, plugin: object, name: str) -> None:
        """Register an in-process plugin object (tests, embedding)."""
        self._pm.register(plugin, name=name)
        self._pm.check_pending()

    # -- typed access ---------------------------------------------------------------------------

    def _collect(self, hook: pluggy.HookCaller, **kwargs: object) -> dict[str, object]:
        """Call a collecting hook once, through pluggy, and merge the mappings it returns.

        Through pluggy, never ``impl.function()``: tryfirst/trylast order the calls, a
        ``wrapper=True`` implementation sees (and may change) the list of results, and
        ``pm.trace`` / hook-call monitoring see the call.  pluggy does not say which plugin
        returned which result, so the errors that must name a plugin find it afterwards: a
        hook that raised from its traceback (the frame of an implementation's function); a
        name offered twice, or something that is not a mapping, by calling each plugin alone
        through a subset caller — on that error path only.
        """
        try:
            results = hook(**kwargs)
        except Exception as exc:
            raise PluginError(f"{self._raised_by(hook, exc)}: {hook.name} raised "
                              f"{type(exc).__name__}: {exc}") from exc
        merged: dict[str, object] = {}
        for offered in results:
            if not isinstance(offered, Mapping):
                culprits = self._returning(hook, lambda r: not isinstance(r, Mapping), kwargs)
                raise PluginError(f"{hook.name} must return a mapping of names to factories, got a "
                                  f"{type(offered).__name__} (from {self._names(culprits)})")
            for name, factory in offered.items():
                if name in merged:
                    raise PluginError(self._clash(hook, name, kwargs))
                merged[name] = factory
        return merged

    def _clash(self, hook: pluggy.HookCaller, name: str, kwargs: dict) -> str:
        owners = self._returning(hook, lambda r: isinstance(r, Mapping) and name in r, kwargs)
        if len(owners) >= 2:
            return (f"{hook.name}: {name!r} is offered by both {owners[0]!r} and {owners[1]!r}; "
                    "disable one of them")
        # One plugin offers it and a hookwrapper added it again (or a wrapper added it twice).
        return (f"{hook.name}: {name!r} is offered twice, though only {self._names(owners)} offers it "
                "alone: a wrapper=True implementation of this hook adds it again")

    def _each_alone(self, hook: pluggy.HookCaller) -> Iterator[tuple[str, pluggy.HookCaller]]:
        """(plugin name, a caller of that plugin's own implementation of ``hook`` alone, through
        pluggy) for each plain implementation, in registration order; wrappers are left out."""
        plugins = self._pm.list_name_plugin()
        for impl in hook.get_hookimpls():
            if impl.wrapper or impl.hookwrapper:
                continue
            yield impl.plugin_name, self._pm.subset_hook_caller(
                hook.name, remove_plugins=[p for n, p in plugins if n != impl.plugin_name])

    def _returning(self, hook: pluggy.HookCaller, test: Callable[[object], bool], kwargs: dict) -> list[str]:
        """The plugins (in registration order) whose own implementation of ``hook``, called
        alone through pluggy, returns something ``test`` accepts."""
        found: list[str] = []
        for name, alone in self._each_alone(hook):
            if name not in found and any(test(r) for r in alone(**kwargs)):
                found.append(name)
        return found

    @staticmethod
    def _raised_by(hook: pluggy.HookCaller, exc: BaseException) -> str:
        """``plugin 'name'``: whose implementation's frame is the innermost one in the traceback."""
        by_code: dict[object, list[str]] = {}
        for impl in hook.get_hookimpls():
            code = getattr(impl.function, "__code__", None)
            if code is not None:
                by_code.setdefault(code, []).append(impl.plugin_name)
        names = None
        tb = exc.__traceback__
        while tb is not None:
            names = by_code.get(tb.tb_frame.f_code, names)
            tb = tb.tb_next
        if names is None:
            return "one of the plugins " + ", ".join(repr(i.plugin_name) for i in hook.get_hookimpls())
        return "plugin " + " or ".join(repr(n) for n in names)

    @staticmethod
    def _names(names: list[str]) -> str:
        return " and ".join(repr(n) for n in names) or "no plugin"

    def enable_tracing(self, writer: Callable[[str], object]) -> Callable[[], None]:
        """Send pluggy's trace of every hook call (its arguments, then its result) to ``writer``,
        one line per call, until the returned function is called.  For finding out which plugin
        runs when while debugging a plugin; the hooks themselves are still called only through
        the typed methods."""
        self._pm.trace.root.setwriter(writer)
        undo = self._pm.enable_tracing()

        def stop() -> None:
            undo()
            self._pm.trace.root.setwriter(None)
        return stop

    def header_filters(self) -> dict[str, hookspecs.HeaderFilterFactory]:
        return self._collect(self._pm.hook.kdaemon_header_filters)  # type: ignore[return-value]

    def deserializers(self) -> dict:
        return self._collect(self._pm.hook.kdaemon_deserializers)

    def interceptors(self) -> dict[str, hookspecs.InterceptorFactory]:
        return self._collect(self._pm.hook.kdaemon_interceptors)  # type: ignore[return-value]

    def sinks(self, context: SinkContext | None = None) -> dict[str, hookspecs.SinkFactory]:
        return self._collect(self._pm.hook.kdaemon_sinks, context=context)  # type: ignore[return-value]

    def filtered_observers(self) -> list[tuple[str, Callable]]:
        """Every plugin's ``kdaemon_filtered_observer`` answer that is not None, with the
        plugin's name (a failing observer is named in the worker's log and metrics): each
        implementation called alone through pluggy, once per worker."""
        hook = self._pm.hook.kdaemon_filtered_observer
        out: list[tuple[str, Callable]] = []
        for name, alone in self._each_alone(hook):
            try:
                results = alone()
            except Exception as exc:
                raise PluginError(f"plugin {name!r}: {hook.name} raised {type(exc).__name__}: {exc}") from exc
            for observer in results:
                if observer is None:
                    continue
                if not callable(observer):
                    raise PluginError(f"plugin {name!r}: {hook.name} must return a callable or None, "
                                      f"got a {type(observer).__name__}")
                out.append((name, observer))
        return out

    def configure(self, config) -> None:
        self._pm.hook.kdaemon_configure(config=config)

    def sink_companions(self, sink_type: str, settings: dict, context: SinkContext) -> list[CompanionSpec]:
        """Every plugin's companions for this sink, in hook call order."""
        out: list[CompanionSpec] = []
        for offered in self._pm.hook.kdaemon_sink_companions(sink_type=sink_type, settings=settings,
                                                             context=context):
            for spec in offered or ():
                if not isinstance(spec, CompanionSpec):
                    raise PluginError(f"kdaemon_sink_companions must return CompanionSpec objects, got "
                                      f"{type(spec).__name__} for sink {sink_type!r}")
                out.append(spec)
        return out

    # -- the supervisor's process hooks (notifications to every plugin, through pluggy) ----------

    def pre_fork(self, index: int, config) -> None:
        self._pm.hook.kdaemon_pre_fork(index=index, config=config)

    def post_fork(self, index: int, config) -> None:
        self._pm.hook.kdaemon_post_fork(index=index, config=config)

    def worker_exit(self, index: int, exit_code: int) -> None:
        self._pm.hook.kdaemon_worker_exit(index=index, exit_code=exit_code)

    def offered(self, context: SinkContext) -> dict[str, dict[str, list[str]]]:
        """For ``kdaemon plugins``: plugin name → kind → the names it offers.  Calls the
        enabled plugins' offering hooks (which only return factories; nothing is built)."""
        out: dict[str, dict[str, list[str]]] = {}
        for kind, hook_name in OFFER_HOOKS.items():
            for impl in getattr(self._pm.hook, hook_name).get_hookimpls():
                if impl.wrapper or impl.hookwrapper:
                    continue   # offers nothing of its own: it changes what the others offer (otel's)
                kwargs = {"context": context} if "context" in impl.argnames else {}
                names = sorted(impl.function(**kwargs) or {})
                if names:
                    out.setdefault(impl.plugin_name, {})[kind] = names
        return out

    def describe(self) -> list[dict]:
        """For ``kdaemon plugins``: every plugin, whether enabled, its version, and the hooks it
        implements."""
        registered = {name: plugin for name, plugin in self._pm.list_name_plugin()}
        out = []
        names = ["builtin"] + [n for n in ("builtin-sinks",) if n in registered] + \
            [d.name for d in self.discovered] + [n for n in registered if ":" in n]
        for name in names:
            d = next((x for x in self.discovered if x.name == name), None)
            plugin = registered.get(name)
            hooks = sorted(h.name for h in self._pm.get_hookcallers(plugin) or []) if plugin is not None else []
            by_path = d is None and ":" in name
            distribution = d.distribution if d else None if by_path else "kdaemon"
            source = d.value if d else name if by_path else getattr(plugin, "__name__", "kdaemon.plugins.builtin")
            out.append({"name": name, "enabled": plugin is not None, "source": source,
                        "distribution": distribution, "version": _version(distribution), "hooks": hooks})
        return out


# The hooks through which plugins offer named things, by kind (``offered``).
OFFER_HOOKS = {"filters": "kdaemon_header_filters", "deserializers": "kdaemon_deserializers",
               "interceptors": "kdaemon_interceptors", "sinks": "kdaemon_sinks"}


def _version(distribution: str | None) -> str | None:
    if distribution is None:
        return None
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
