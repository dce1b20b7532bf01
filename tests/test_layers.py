"""The layer contract (testkit/layers.py): nothing lower imports anything higher, no cycle
between layers or between modules, and every module of kdaemon imports on its own.

The first tests hold the real tree to the contract; the ones after them run the checker on small
synthetic trees, so it is shown to find each kind of offending import by file:line (a checker
that reports nothing would make the first tests pass for nothing).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit.layers import (LEAVES, RANK, SIDEWAYS, Import, check_layers, collect_imports,
                                  layer_cycles, layer_of, module_cycles, modules, peer_client_imports)

ROOT = Path(__file__).resolve().parents[1] / "kdaemon"


# -- the real tree -------------------------------------------------------------------------------

def test_no_lower_layer_imports_a_higher_one():
    violations = check_layers(collect_imports(ROOT))
    assert not violations, "layer contract broken:\n" + "\n".join(map(str, violations))


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in modules(ROOT) if layer_of(m) not in RANK and layer_of(m) not in LEAVES)
    assert not unplaced, f"add these to LAYERS in testkit/layers.py: {unplaced}"


def test_no_cycle_between_layers_or_modules():
    imports = collect_imports(ROOT)
    between_layers, between_modules = layer_cycles(imports), module_cycles(imports)
    assert not between_layers, f"layers importing each other (lazy imports count): {between_layers}"
    assert not between_modules, f"modules importing each other at import time: {between_modules}"


def test_no_third_party_kafka_client_inside_kdaemon():
    """kdaemon speaks Kafka with its own client, the demo included; confluent-kafka, kafka-python
    and aiokafka are peers for the tests and benchmarks only."""
    found = peer_client_imports(ROOT)
    assert not found, "third-party Kafka clients imported:\n" + "\n".join(map(str, found))


def test_the_checker_sees_the_real_lazy_imports():
    """A guard on the collector itself: lazy imports the daemon really has are found (a checker
    that only saw module-level imports would miss exactly the upward imports people hide in
    functions)."""
    found = {(i.module, i.target, i.module_level) for i in collect_imports(ROOT)}
    assert ("kdaemon.cli", "kdaemon.supervisor.arbiter", False) in found
    assert ("kdaemon.plugins.manager", "kdaemon.plugins.builtin", False) in found
    assert ("kdaemon.worker.build", "kdaemon.config", True) in found


@pytest.mark.slow
def test_every_module_imports_alone():
    """An import cycle the static check cannot see (e.g. through ``sys.modules`` tricks) fails
    here: each module is the first kdaemon module its process imports (testkit/import_alone.py:
    a fork per module of a process that loaded only the third-party libraries)."""
    proc = subprocess.run([sys.executable, "-m", "testkit.import_alone", "kdaemon", *sorted(modules(ROOT))],
                          capture_output=True, text=True, timeout=600, cwd=ROOT.parent)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_import_alone_names_a_module_that_fails_to_import(tmp_path):
    """The check above on a tree with an import cycle that only shows at run time: it fails,
    naming the module."""
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from cyc.b import B\nA = 1\n")
    (pkg / "b.py").write_text("from cyc.a import A\nB = 2\n")
    (pkg / "ok.py").write_text("X = 1\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tmp_path}:{ROOT.parent}"}
    proc = subprocess.run([sys.executable, "-m", "testkit.import_alone", "cyc", "cyc.ok", "cyc.a"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT.parent, env=env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "FAILED cyc.a" in proc.stdout and "ImportError" in proc.stdout, proc.stdout
    assert "FAILED cyc.ok" not in proc.stdout


# -- the checker, on synthetic trees --------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "kdaemon"
    for rel, text in {"__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(root).parents:
            init = root / parent / "__init__.py"
            if not init.exists():
                init.write_text("")
        path.write_text(textwrap.dedent(text))
    return root


def _violations(root: Path) -> list[str]:
    return [str(v) for v in check_layers(collect_imports(root))]


def test_one_upward_import_is_reported_exactly(tmp_path):
    root = _tree(tmp_path, {
        "protocol/codec.py": "import json\n",
        "client/metadata.py": """\
            from ..protocol import codec


            def refresh():
                from ..supervisor import arbiter   # lazy, relative, and upward
                return arbiter
            """,
        "supervisor/arbiter.py": "from ..client import metadata\nfrom kdaemon.protocol.codec import json\n",
    })
    assert _violations(root) == [
        "kdaemon/client/metadata.py:5: kdaemon.client.metadata (client) imports kdaemon.supervisor.arbiter "
        "(supervisor): a lower layer imports a higher one"]


def test_every_kind_of_import_is_seen(tmp_path):
    root = _tree(tmp_path, {
        "protocol/a.py": """\
            from typing import TYPE_CHECKING
            import kdaemon.client.b
            if TYPE_CHECKING:
                from kdaemon import worker
            def f():
                import importlib
                return importlib.import_module("kdaemon.config")
            class C:
                def m(self):
                    from .. import supervisor
            """,
        "client/b.py": "",
        "worker/__init__.py": "from . import main\n",
        "worker/main.py": "",
        "config.py": "",
        "supervisor/__init__.py": "",
    })
    assert [v.split(": ", 1)[0] + ": " + v.split(" imports ")[1].split(" ")[0] for v in _violations(root)] == [
        "kdaemon/protocol/a.py:2: kdaemon.client.b",
        "kdaemon/protocol/a.py:4: kdaemon.worker",
        "kdaemon/protocol/a.py:7: kdaemon.config",
        "kdaemon/protocol/a.py:10: kdaemon.supervisor",
    ]
    lazy = {i.line: i.module_level for i in collect_imports(root) if i.module == "kdaemon.protocol.a"}
    assert lazy == {2: True, 4: False, 7: False, 10: False}


def test_siblings_leaves_and_unknown_layers(tmp_path):
    root = _tree(tmp_path, {
        "plugins/types.py": "from ..sinks import jsonl\n",           # the plugin API knowing a sink
        "sinks/jsonl.py": "from ..plugins.types import x\nfrom ..backoff import Backoff\n",  # allowed
        "backoff.py": "from .protocol import errors\n",              # a leaf importing kdaemon
        "protocol/errors.py": "",
        "gadgets/thing.py": "from ..client import y\n",              # a package not in the table
        "client/__init__.py": "from .. import __version__\n",        # the root is a leaf: allowed
    })
    assert ("sinks", "plugins") in SIDEWAYS and ("plugins", "sinks") not in SIDEWAYS
    assert _violations(root) == [
        "kdaemon/backoff.py:1: kdaemon.backoff (backoff) imports kdaemon.protocol.errors: kdaemon.backoff is "
        "a leaf and imports nothing from kdaemon",
        "kdaemon/gadgets/thing.py:1: kdaemon.gadgets.thing (gadgets) imports kdaemon.client: layer 'gadgets' "
        "is not in the layer table (testkit/layers.py LAYERS)",
        "kdaemon/plugins/types.py:1: kdaemon.plugins.types (plugins) imports kdaemon.sinks.jsonl (sinks): "
        "siblings plugins and sinks may not import each other (SIDEWAYS)",
    ]


def test_peer_client_imports_are_found_wherever_written(tmp_path):
    root = _tree(tmp_path, {
        "demo.py": """\
            import json
            from kafkaesque import x        # not a Kafka client: a name that only starts alike
            def seed():
                from confluent_kafka.admin import AdminClient
                import importlib
                return importlib.import_module("aiokafka")
            """,
        "client/x.py": "from . import kafka\nimport kafka.producer as kp\n",   # relative: ours
    })
    assert [str(v) for v in peer_client_imports(root)] == [
        "kdaemon/client/x.py:2: imports kafka.producer: a third-party Kafka client inside kdaemon (use kdaemon.client)",
        "kdaemon/demo.py:4: imports confluent_kafka.admin: a third-party Kafka client inside kdaemon (use kdaemon.client)",
        "kdaemon/demo.py:6: imports aiokafka: a third-party Kafka client inside kdaemon (use kdaemon.client)",
    ]


def test_cycles_are_found(tmp_path):
    root = _tree(tmp_path, {
        "worker/a.py": "from . import b\n",
        "worker/b.py": "def f():\n    from . import a\n",                # lazy: not a module cycle
        "worker/c.py": "from . import d\n",
        "worker/d.py": "from .c import x\n",                             # c <-> d at import time
        "config.py": "def f():\n    from .worker import a\n",            # config -> worker (upward)
        "sinks/s.py": "",
    })
    imports = collect_imports(root)
    assert module_cycles(imports) == [["kdaemon.worker.c", "kdaemon.worker.d"]]
    assert layer_cycles(imports) == []
    (root / "worker" / "b.py").write_text("from ..config import X\n")
    imports = collect_imports(root)
    assert layer_cycles(imports) == [["config", "worker"]]
    assert [i for i in imports if i.module == "kdaemon.config"] == [
        Import("kdaemon/config.py", 2, "kdaemon.config", "kdaemon.worker.a", False)]
