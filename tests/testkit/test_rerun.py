"""testkit.rerun: a failed test of an xdist group, recorded by a real ``pytest -n 2 --dist
loadgroup`` run, comes back as the id a plain run selects, and that run runs it alone."""

from __future__ import annotations

import json
import subprocess
import sys

from testkit.rerun import failed_tests, plain_id

SUITE = '''
import pytest

@pytest.mark.xdist_group("lane-a")
def test_grouped_fails():
    assert False

@pytest.mark.xdist_group("lane-a")
@pytest.mark.parametrize("x", ["a@b", "c"])
def test_grouped_param(x):
    assert x != "a@b"

def test_passes():
    pass
'''


def _pytest(cwd, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_the_failed_tests_of_a_grouped_run_are_rerun_alone(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    xdist_group: lane\n")
    first = _pytest(tmp_path, "-n", "2", "--dist", "loadgroup")
    assert first.returncode == 1, first.stdout

    recorded = json.loads((tmp_path / ".pytest_cache" / "v" / "cache" / "lastfailed").read_text())
    assert "test_suite.py::test_grouped_fails@lane-a" in recorded   # what a plain run does not collect
    failed = failed_tests(tmp_path / ".pytest_cache")
    assert failed == ["test_suite.py::test_grouped_fails", "test_suite.py::test_grouped_param[a@b]"]

    again = _pytest(tmp_path, "-p", "no:xdist", *failed)
    assert again.returncode == 1
    assert again.stdout.strip().splitlines()[-1].startswith("2 failed in"), again.stdout


def test_an_id_keeps_an_at_sign_of_its_own():
    assert plain_id("t.py::test_x[a@b]@lane-spark-slow-a") == "t.py::test_x[a@b]"
    assert plain_id("t.py::test_x[a@b]") == "t.py::test_x[a@b]"
    assert plain_id("t.py::test_y@tests.worker.test_pipeline_e2e") == "t.py::test_y"


def test_nothing_recorded_is_nothing_to_rerun(tmp_path):
    assert failed_tests(tmp_path / ".pytest_cache") == []
