"""kdaemon's layer contract, and the checker that enforces it on the source tree.

The layers, lowest first (``LAYERS``).  A module may import from its own layer, from any lower
layer and from the leaves; never from a higher layer, and from a sibling on the same line only
where ``SIDEWAYS`` allows it.  A module belongs to the layer of its top-level package or module
under ``kdaemon/`` (``kdaemon/client/group/state.py`` is ``client``), so a new module inside an
existing package falls into place by itself, and a new top-level package or module must be
added to the table before the contract passes.

Every import counts, wherever it is written: at module level, inside a function (a lazy import
is still a dependency), under ``if TYPE_CHECKING:``, relative or absolute, and
``importlib.import_module("kdaemon...")`` with a literal name.

Run ``python -m testkit.layers`` for a report of the real tree.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "kdaemon"

# Lowest first; the layers of one entry are siblings.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("protocol",),                  # bytes only: no sockets, nothing above
    ("client",),                    # the Kafka client: the only layer with sockets
    ("plugins", "sinks"),           # the plugin API (hooks, Record, Sink protocol) and the sinks
    ("config",),                    # the TOML configuration: names plugins and sinks, imports neither
    ("worker",),                    # one consumer process: configuration + plugins -> pipeline
    ("supervisor",),                # the pre-fork arbiter and what a forked child runs
    ("cli", "demo", "embedded", "testing"),   # entry points and tools
)
# Sibling imports that are allowed (importer, imported).  Sinks are written against the plugin
# API (``hookimpl``, ``Record``, ``SinkWriteError``); the plugin API never knows a sink.  The CLI
# starts the demo and (``kdaemon broker``) the embedded broker; the demo starts it too.
SIDEWAYS: frozenset[tuple[str, str]] = frozenset({
    ("sinks", "plugins"),
    ("cli", "demo"),
    ("cli", "embedded"),
    ("demo", "embedded"),
})
# Leaves every layer may import; they import nothing from kdaemon themselves.
LEAVES: frozenset[str] = frozenset({
    "",           # kdaemon/__init__.py (``__version__``)
    "backoff",    # the one Backoff type
    "exit_codes", # the exit codes workers and the supervisor share
    "durations",  # how long, as log lines and STATUS= word it
    "secrets",    # a password named by an environment variable or a file
    "settings",   # the one settings checker: TOML tables into typed dataclasses, "did you mean" included
})

RANK: dict[str, int] = {name: i for i, names in enumerate(LAYERS) for name in names}


@dataclass(frozen=True, order=True)
class Import:
    """One import statement's edge: ``module`` (in ``path`` at ``line``) imports ``target``."""

    path: str
    line: int
    module: str
    target: str
    module_level: bool   # executed when the module is imported (not in a function, not TYPE_CHECKING)


@dataclass(frozen=True, order=True)
class Violation:
    path: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text}"


def layer_of(module: str) -> str:
    """``kdaemon.client.group.state`` -> ``client``; ``kdaemon`` -> ``""`` (the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (the directory ``kdaemon/``), by dotted name."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str], path: str) -> None:
        self.module, self.known, self.path = module, known, path
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0          # functions and TYPE_CHECKING blocks we are inside
        self.found: list[Import] = []

    def _add(self, node: ast.AST, target: str) -> None:
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            self.found.append(Import(self.path, node.lineno, self.module, target, self.depth == 0))

    def _nested(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            self.depth += 1
            for child in node.body:
                self.visit(child)
            self.depth -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package.split(".")
            if node.level - 1 > len(base) - 1:
                raise ValueError(f"{self.path}:{node.lineno}: relative import beyond the package")
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        for alias in node.names:
            # ``from kdaemon.x import y``: the submodule kdaemon.x.y if there is one, else a name
            # defined in kdaemon.x.
            sub = f"{source}.{alias.name}"
            self._add(node, sub if sub in self.known else source)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("import_module", "__import__") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            self._add(node, node.args[0].value)
        self.generic_visit(node)


def collect_imports(root: Path) -> list[Import]:
    """Every import of a ``kdaemon`` module by a module under ``root``."""
    mods = modules(root)
    known = set(mods)
    found: list[Import] = []
    for module, path in mods.items():
        rel = str(path.relative_to(root.parent))
        tree = ast.parse(path.read_text(), filename=rel)
        c = _Collector(module, path.name == "__init__.py", known, rel)
        c.visit(tree)
        found += c.found
    return sorted(found)


# Third-party Kafka clients: peers the tests and benchmarks measure kdaemon against, never used
# inside it (kdaemon speaks Kafka with its own client; the demo too).
PEER_CLIENTS: frozenset[str] = frozenset({"confluent_kafka", "kafka", "aiokafka"})


def peer_client_imports(root: Path, peers: frozenset[str] = PEER_CLIENTS) -> list[Violation]:
    """Every import of a third-party Kafka client (``peers``, by top-level name) under ``root``,
    wherever it is written (in a function, under TYPE_CHECKING, by ``import_module``)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
                    isinstance(node.args[0].value, str) and \
                    getattr(node.func, "attr", getattr(node.func, "id", "")) in ("import_module", "__import__"):
                names = [node.args[0].value]
            else:
                continue
            for name in names:
                if name.split(".")[0] in peers:
                    out.append(Violation(rel, node.lineno, f"imports {name}: a third-party Kafka client "
                                                           f"inside {PACKAGE} (use {PACKAGE}.client)"))
    return sorted(out)


def check_layers(imports: list[Import]) -> list[Violation]:
    """Each import that breaks the contract, by file:line."""
    out = []
    for imp in imports:
        src, dst = layer_of(imp.module), layer_of(imp.target)
        if src == dst and src:
            continue
        where = f"{imp.module} ({src or 'package root'}) imports {imp.target}"
        if src in LEAVES:
            out.append(Violation(imp.path, imp.line,
                                 f"{where}: {imp.module} is a leaf and imports nothing from {PACKAGE}"))
        elif src not in RANK:
            out.append(Violation(imp.path, imp.line, f"{where}: layer {src!r} is not in the layer table "
                                                     "(testkit/layers.py LAYERS)"))
        elif dst in LEAVES:
            continue
        elif dst not in RANK:
            out.append(Violation(imp.path, imp.line, f"{where}: layer {dst!r} is not in the layer table "
                                                     "(testkit/layers.py LAYERS)"))
        elif RANK[dst] > RANK[src]:
            out.append(Violation(imp.path, imp.line,
                                 f"{where} ({dst}): a lower layer imports a higher one"))
        elif RANK[dst] == RANK[src] and (src, dst) not in SIDEWAYS:
            out.append(Violation(imp.path, imp.line,
                                 f"{where} ({dst}): siblings {src} and {dst} may not import each other "
                                 "(SIDEWAYS)"))
    return sorted(set(out))


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (or a self-loop), each sorted:
    every import cycle of the graph ``edges`` is inside one of them (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1 or (node, node) in edges:
                    out.append(sorted(comp))
    return sorted(out)


def layer_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles between layers, counting every import (lazy ones too)."""
    return cycles({(layer_of(i.module), layer_of(i.target)) for i in imports
                   if layer_of(i.module) != layer_of(i.target)})


def module_cycles(imports: list[Import]) -> list[list[str]]:
    """Cycles between modules through the imports that run when a module is imported.  A
    package's ``__init__`` importing its own submodules is counted like any other import."""
    return cycles({(i.module, i.target) for i in imports if i.module_level and i.module != i.target})


def report(root: Path) -> list[str]:
    imports = collect_imports(root)
    lines = [str(v) for v in check_layers(imports)]
    lines += [f"cycle between layers: {' <-> '.join(c)}" for c in layer_cycles(imports)]
    lines += [f"import cycle between modules: {' <-> '.join(c)}" for c in module_cycles(imports)]
    return lines


if __name__ == "__main__":
    problems = report(Path(__file__).resolve().parents[1] / PACKAGE)
    print("\n".join(problems) or "the layer contract holds")
    sys.exit(1 if problems else 0)
