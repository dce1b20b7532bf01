"""``supervisor.configs.validate_in_child``: the configuration check ``kdaemon run`` and a SIGHUP
reload make, in a forked child so plugin code never runs in the process workers are forked from.
Real files and the real check; the faults (a check that hangs, dies or raises) are made by
replacing ``check_file`` before the fork, which the child inherits."""

from __future__ import annotations

import os
import time

import pytest

from kdaemon.config import dump_toml
from kdaemon.supervisor.configs import validate_in_child
from kdaemon.worker import main as worker_main
from testkit.daemon import daemon_config


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g")))
    return path


def test_a_good_file_has_no_problems_and_the_check_runs_in_another_process(config_file, monkeypatch):
    seen: list[int] = []
    real = worker_main.check_file

    def check(path):
        seen.append(os.getpid())
        assert os.getpid() != parent, "the check ran in the supervisor's process"
        return real(path)

    parent = os.getpid()
    monkeypatch.setattr(worker_main, "check_file", check)
    assert validate_in_child(str(config_file)) == []
    assert seen == []   # appended in the child only


def test_the_files_and_the_plugins_problems_come_back_as_the_cli_prints_them(tmp_path):
    config = daemon_config(tmp_path, "127.0.0.1:1", "t", "g", workers="many")
    config["deserializer"]["value"] = "no-such-deserializer"
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(config))
    problems = validate_in_child(str(path))
    assert problems == worker_main.check_file(str(path)).problems
    joined = "\n".join(problems)
    # One from the file, one only the plugins can find.
    assert "daemon.workers" in joined and "no-such-deserializer" in joined, problems


def test_a_file_that_is_not_toml_is_named(config_file):
    config_file.write_text("[daemon\n")
    problems = validate_in_child(str(config_file))
    assert len(problems) == 1 and str(config_file) in problems[0] and "TOML" in problems[0], problems


def test_a_check_that_raises_is_a_problem_naming_the_exception(config_file, monkeypatch):
    def check(path):
        raise RuntimeError("a plugin's factory broke")
    monkeypatch.setattr(worker_main, "check_file", check)
    problems = validate_in_child(str(config_file))
    assert len(problems) == 1 and "RuntimeError: a plugin's factory broke" in problems[0], problems


def test_a_check_that_dies_is_a_problem_with_its_exit_code(config_file, monkeypatch):
    monkeypatch.setattr(worker_main, "check_file", lambda path: os._exit(7))
    problems = validate_in_child(str(config_file))
    assert problems == [f"{config_file}: the configuration check ended with exit code 7 before it reported"]


def test_a_check_that_hangs_is_killed_at_the_timeout(config_file, monkeypatch):
    monkeypatch.setattr(worker_main, "check_file", lambda path: time.sleep(60))
    t0 = time.monotonic()
    problems = validate_in_child(str(config_file), timeout_s=0.5)
    assert time.monotonic() - t0 < 10
    assert len(problems) == 1 and "did not finish within 0.5 s" in problems[0], problems
