"""tests/ and bench/ share testkit/ and never import each other: a benchmark that imported a test
module (or the reverse) would tie a measurement to a test's fixtures, and testkit/ would no
longer be the one place the harness lives.  Lazy imports inside functions count too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# folder -> the top-level packages its modules may not import
FORBIDDEN = {"bench": {"tests"}, "testkit": {"tests", "bench"}, "tests": {"bench"}}


def imported_tops(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in ``path``, at any depth of the module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def offending(folder: str) -> list[str]:
    return [f"{path.relative_to(REPO)}:{line} imports {top}"
            for path in sorted((REPO / folder).rglob("*.py"))
            for line, top in imported_tops(path) if top in FORBIDDEN[folder]]


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_no_import_across_tests_and_bench(folder):
    assert (REPO / folder).is_dir()
    assert not offending(folder)


def test_the_check_sees_lazy_and_from_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\ndef f():\n    from bench.consume import x\n    import tests.worker\n")
    assert imported_tops(module) == [(1, "os"), (3, "bench"), (4, "tests")]
