"""``[daemon] on_stop``: what a stop does with the workers' static group memberships, checked
like the other word settings (one line naming the key, the value and the choices), also when
it comes from the environment (``KDAEMON_DAEMON_ON_STOP``)."""

from __future__ import annotations

import pytest

from kdaemon.config import ON_STOP, ConfigError, parse
from kdaemon.config.env import read_overrides
from kdaemon.config.loader import ENV_LAYOUT

BASE = {"kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"}, "daemon": {"topics": ["t"]}}


def _with(value) -> dict:
    return {**BASE, "daemon": {**BASE["daemon"], "on_stop": value}}


def test_the_default_keeps_the_memberships_for_a_restart():
    assert parse(BASE).daemon.on_stop == "keep_membership" == ON_STOP[0]


@pytest.mark.parametrize("value", ON_STOP)
def test_each_choice_loads(value):
    assert parse(_with(value)).daemon.on_stop == value


@pytest.mark.parametrize("value, problem", [
    ("leave", "kdaemon.toml: daemon.on_stop: 'leave' is not one of keep_membership, leave_group"),
    (True, "kdaemon.toml: daemon.on_stop: expected a string, found boolean true"),
])
def test_a_wrong_value_is_one_line(value, problem):
    with pytest.raises(ConfigError) as exc:
        parse(_with(value), "kdaemon.toml")
    assert exc.value.problems == [problem]


def test_from_the_environment():
    env = {"KDAEMON_DAEMON_ON_STOP": "leave_group"}
    assert parse(BASE, environ=env, overrides=read_overrides(env, ENV_LAYOUT, BASE)).daemon.on_stop == "leave_group"
