"""What `make demo` installs, and what `make test` adds: the demo gets a JDK (for Spark) from
the system and the ``spark`` and ``demo`` extras in .venv, never Maven, openssl, systemd or
Debian's prometheus package (which starts a Prometheus server on :9090 on a systemd host), and
nothing from the system for ``--sink jsonl``.  The venv's stamp records the extras installed, so
`make test` after `make demo` adds what the tests need and `make demo` after `make test` installs
nothing.

Nothing is installed here: ``.ci/system-deps --list`` / ``--dry-run`` only print, and the
Makefile runs on a copy whose .venv python only records the pip commands it is given.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_DEPS = ROOT / ".ci" / "system-deps"
TEST_ONLY = {"maven", "openssl", "systemd", "prometheus"}


def system_deps(*args: str, path: str | None = None) -> list[str]:
    env = None if path is None else {"PATH": path}
    proc = subprocess.run([shutil.which("bash") or "/bin/bash", str(SYSTEM_DEPS), *args], capture_output=True,
                          text=True, timeout=30, env=env, check=True)
    return proc.stdout.split()


def test_the_demo_profile_is_a_jdk_and_nothing_else(tmp_path):
    assert system_deps("demo", "--list") == ["openjdk-17-jdk-headless"]
    assert TEST_ONLY | {"openjdk-17-jdk-headless"} == set(system_deps("test", "--list")) == set(system_deps("--list"))
    # On a machine with none of the commands, what each profile would install.
    nothing = str(tmp_path)
    assert system_deps("demo", "--dry-run", path=nothing) == ["openjdk-17-jdk-headless"]
    assert set(system_deps("test", "--dry-run", path=nothing)) == TEST_ONLY | {"openjdk-17-jdk-headless"}


FAKE_PYTHON = """#!/usr/bin/env bash
case "$*" in *"pip install"*) echo "$*" >> "$(dirname "$0")/pip.log" ;; esac
exit 0
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The Makefile and pyproject.toml in a directory whose .venv python records pip's arguments."""
    if shutil.which("make") is None:
        pytest.skip("no make here")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def make(checkout: Path, *args: str) -> str:
    return subprocess.run(["make", "-s", *args], cwd=checkout, capture_output=True, text=True, timeout=60,
                          check=True).stdout


def pip_installs(checkout: Path) -> list[str]:
    log = checkout / ".venv" / "bin" / "pip.log"
    return [line.split()[-1] for line in log.read_text().splitlines()] if log.exists() else []


def test_make_demo_installs_the_demos_extras_and_make_test_adds_the_rest(checkout):
    make(checkout, "venv-demo")
    assert pip_installs(checkout) == [".[demo,spark]"]
    make(checkout, "venv")
    assert pip_installs(checkout) == [".[demo,spark]", ".[bench,demo,spark,test]"]
    make(checkout, "venv-demo")   # after make test: nothing new
    make(checkout, "venv")
    assert pip_installs(checkout) == [".[demo,spark]", ".[bench,demo,spark,test]"]


def test_make_demo_asks_the_system_for_the_demo_profile_only(checkout):
    spark = make(checkout, "-n", "demo")
    assert "system-deps demo" in spark and "system-deps test" not in spark, spark
    jsonl = make(checkout, "-n", "demo", "DEMO_ARGS=--sink jsonl")
    assert "system-deps" not in jsonl and "kdaemon demo --sink jsonl" in jsonl, jsonl
    assert "system-deps test" in make(checkout, "-n", "test")
