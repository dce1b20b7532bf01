"""``kdaemon.config.dump_toml``: what the demo, the tests and the benchmarks write must read back
(``tomllib``) to the same mapping, and ``load`` must accept it."""

from __future__ import annotations

import tomllib

import pytest

from kdaemon.config import dump_toml, load

SAMPLE = {
    "plugins": [],
    "kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g", "session_timeout_ms": 6000,
              "check_crcs": False},
    "daemon": {"topics": ["a", "b.c"], "workers": 2, "state_dir": "/tmp/kd \"quoted\" é",
               "shutdown_timeout_s": 15.5, "on_deserialize_error": "skip"},
    "filters": [{"header": "type", "op": "in", "values": ["order.created", "order.shipped"], "action": "keep"},
                {"header": "source", "op": "exists", "action": "drop"}],
    "interceptors": [{"name": "ttl", "settings": {"max_age_ms": 60_000, "dotted.key": "x", "nested": {"a": [1, 2]}}}],
    "deserializer": {"key": "str", "value": "json"},
    "sink": {"type": "jsonl", "path": "/tmp/out"},
}


def test_round_trip_through_tomllib():
    assert tomllib.loads(dump_toml(SAMPLE)) == SAMPLE


@pytest.mark.parametrize("text", ["\U0001F600 beyond the BMP", "control \x00\x1f\x7f\t\n", 'quote " and \\'])
def test_strings_toml_escapes_differently_from_json(text):
    # JSON writes U+1F600 as a surrogate pair of escapes, which TOML refuses.
    assert tomllib.loads(dump_toml({"daemon": {"daemon_id": text}}))["daemon"]["daemon_id"] == text


def test_empty_list_is_kept_as_a_value():
    # ``plugins = []`` means "no plugins", which differs from leaving the key out (the defaults).
    assert tomllib.loads(dump_toml({"plugins": [], "kafka": {"group_id": "g"}}))["plugins"] == []


def test_the_daemon_loads_what_it_wrote(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(SAMPLE))
    config = load(path)
    assert list(config.daemon.topics) == ["a", "b.c"]
    assert config.daemon.state_dir == SAMPLE["daemon"]["state_dir"]
    assert [f.header for f in config.filters] == ["type", "source"]


@pytest.mark.parametrize("bad", [None, object(), {"k": {1, 2}}])
def test_values_toml_cannot_hold_are_refused(bad):
    with pytest.raises(TypeError, match="as TOML"):
        dump_toml({"daemon": {"x": bad}})
