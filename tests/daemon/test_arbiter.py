"""The arbiter's signal handlers, called directly (no fork, no broker): what they tell systemd
and what they start, in the cases the end-to-end tests cannot time reliably."""

from __future__ import annotations

import pytest

from kdaemon.config import dump_toml, load
from kdaemon.supervisor import arbiter as arbiter_module
from kdaemon.supervisor.arbiter import Arbiter
from tests.daemon.harness import daemon_config


@pytest.fixture
def arbiter(tmp_path, monkeypatch):
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(daemon_config(tmp_path, "127.0.0.1:1", "t", "g")))
    sent: list[str] = []
    monkeypatch.setattr(arbiter_module.sdnotify, "notify", lambda message, **kw: sent.append(message) or True)
    a = Arbiter(str(path), load(path))
    a.sent = sent
    return a


def test_sighup_after_sigterm_is_ignored(arbiter, monkeypatch):
    def must_not_validate(path):
        raise AssertionError("a reload was attempted while stopping")
    monkeypatch.setattr(arbiter_module, "validate_in_subprocess", must_not_validate)
    arbiter.handle_term()
    config = arbiter.config
    arbiter.handle_hup()
    assert arbiter.sent == ["STOPPING=1"]
    assert arbiter.config is config and arbiter._rolling == [] and arbiter._roll_waiting is None


def test_sighup_with_a_broken_file_changes_nothing(arbiter, caplog):
    config = arbiter.config
    with open(arbiter.config_path, "a") as fh:
        fh.write("[daemon\n")
    arbiter.handle_hup()
    assert arbiter.sent == []
    assert arbiter.config is config and arbiter._rolling == []
    assert "reload refused, keeping the running configuration" in caplog.text
    assert "not valid TOML" in caplog.text
