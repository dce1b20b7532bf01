"""The bundled plugins: header_rules (rules_file), ttl, json."""

from __future__ import annotations

import json
import logging

import pytest

import kdaemon_header_rules
import kdaemon_json
import kdaemon_ttl
from kdaemon.client.types import OffsetAndMetadata, TopicPartition
from kdaemon.plugins import SettingsError
from kdaemon.protocol.header_match import HeaderRules
from kdaemon.testing import make_record, make_records, run_plugin

# -- header_rules: rules_file ------------------------------------------------------------------


def rules(tmp_path, text: str) -> HeaderRules:
    p = tmp_path / "rules.toml"
    p.write_text(text)
    return kdaemon_header_rules.rules_file({"path": str(p)})


def test_rules_file_allowlist(tmp_path):
    keep = rules(tmp_path, """
        [[rules]]
        header = "tenant"
        op = "in"
        values = ["acme", "globex"]
        """)
    assert isinstance(keep, HeaderRules) and keep.native_rules is not None
    assert keep([("tenant", b"acme")]) and not keep([("tenant", b"x")]) and not keep([])


def test_rules_file_ordered_rules_and_explicit_default(tmp_path):
    keep = rules(tmp_path, """
        default = "keep"
        [[rules]]
        header = "debug"
        op = "exists"
        action = "drop"
        [[rules]]
        header = "type"
        value = "heartbeat"
        action = "drop"
        """)
    assert keep([])
    assert not keep([("debug", None)])
    assert not keep([("type", b"heartbeat")])
    assert keep([("type", b"order")])


def test_rules_file_default_is_the_opposite_of_the_last_action(tmp_path):
    drop_list = rules(tmp_path, '[[rules]]\nheader = "x"\nop = "exists"\naction = "drop"\n')
    assert drop_list.default is True
    keep_list = rules(tmp_path, '[[rules]]\nheader = "x"\nop = "exists"\n')
    assert keep_list.default is False
    assert rules(tmp_path, "").default is True  # no rules: keep everything


def test_rules_file_with_a_regex_is_evaluated_in_python(tmp_path):
    keep = rules(tmp_path, '[[rules]]\nheader = "k"\nop = "regex"\nvalues = ["^a.c$"]\n')
    assert keep.native_rules is None
    assert keep([("k", b"abc")]) and not keep([("k", b"abcd")])


@pytest.mark.parametrize("text, message", [
    ("[[rules]\n", "is not valid TOML"),
    ('rule = 1\n', r"unknown key\(s\) rule"),
    ('rules = "x"\n', "rules must be an array of tables"),
    ('default = "maybe"\n', "default must be one of keep, drop, auto, not 'maybe'"),
    ('[[rules]]\nop = "exists"\n', r"rules\[0\]\.header: required"),
    ('[[rules]]\nheader = "h"\nop = "like"\nvalues = ["a"]\n', r"rules\[0\]\.op: 'like' is not one of"),
    ('[[rules]]\nheader = "h"\nvalues = ["a", "b"]\n', r"rules\[0\]\.value: op 'equals' takes exactly one value"),
    ('[[rules]]\nheader = "h"\nop = "in"\n', r"needs at least one value"),
    ('[[rules]]\nheader = "h"\nvalues = [1]\n', r"values: must be a list of strings"),
    ('[[rules]]\nheader = "h"\nvalue = "a"\naction = "skip"\n', r"action: must be"),
    ('[[rules]]\nheader = "h"\nvalue = "a"\nvalues = ["b"]\n', "value or values, not both"),
    ('[[rules]]\nheader = "h"\nop = "regex"\nvalue = "(" \n', "not a valid regular expression"),
    ('[[rules]]\nheader = "h"\nvalue = "a"\ncolour = "red"\n', r"rules\[0\]\.colour: unknown key \(known: header, op, values, value, action\)"),
])
def test_rules_file_problems_are_value_errors_naming_the_file(tmp_path, text, message):
    with pytest.raises(ValueError, match=message) as info:
        rules(tmp_path, text)
    assert str(tmp_path / "rules.toml") in str(info.value)


@pytest.mark.parametrize("settings, problems", [
    ({}, ["path: required: the TOML file holding [[rules]]"]),
    ({"path": ""}, ['path: expected a file name, found string ""']),
    ({"path": 5}, ["path: expected a file name, found integer 5"]),
    ({"path": "x", "file": "y"}, ["file: unknown setting (known: path)"]),
    ({"file": "y"}, ["file: unknown setting (known: path)", "path: required: the TOML file holding [[rules]]"]),
])
def test_rules_file_refuses_bad_settings(settings, problems):
    with pytest.raises(SettingsError) as info:
        kdaemon_header_rules.rules_file(settings)
    assert info.value.lines() == problems


def test_rules_file_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="rules file .*nope.toml not found"):
        kdaemon_header_rules.rules_file({"path": str(tmp_path / "nope.toml")})


# -- ttl ------------------------------------------------------------------------------------------

NOW = 1_700_000_000_000


def ttl(max_age_ms=10_000) -> kdaemon_ttl.TtlInterceptor:
    return kdaemon_ttl.TtlInterceptor(max_age_ms, clock=lambda: NOW)


def test_ttl_drops_records_at_least_max_age_old():
    records = [make_record(b"", offset=i, timestamp=NOW - age)
               for i, age in enumerate([0, 9_999, 10_000, 50_000])]
    icpt = ttl()
    assert [r.offset for r in icpt.on_consume(records)] == [0, 1]
    assert icpt.dropped == 2


def test_ttl_keeps_records_of_unknown_age():
    no_timestamp = make_record(b"", timestamp=-1)
    future = make_record(b"", timestamp=NOW + 60_000)
    assert ttl().on_consume([no_timestamp, future]) == [no_timestamp, future]


def test_ttl_settings():
    assert kdaemon_ttl.TtlInterceptor.from_settings({"max_age_ms": 5}).max_age_ms == 5


@pytest.mark.parametrize("settings, problems", [
    ({}, ["max_age_ms: required: records older than this many milliseconds are dropped"]),
    ({"max_age_ms": 0}, ["max_age_ms: expected a positive integer, found integer 0"]),
    ({"max_age_ms": 1.5}, ["max_age_ms: expected a positive integer, found float 1.5"]),
    ({"max_age_ms": True}, ["max_age_ms: expected a positive integer, found boolean true"]),
    ({"max_age_ms": 1, "max_age": 2},
     ["max_age: unknown setting (did you mean 'max_age_ms'?) (known: max_age_ms)"]),
    ({"max_age_ms": 1, "type": "ttl"}, ["type: unknown setting (known: max_age_ms)"]),
    ({"max_age_ms": -5, "max_age": 2},   # every problem at once
     ["max_age: unknown setting (did you mean 'max_age_ms'?) (known: max_age_ms)",
      "max_age_ms: expected a positive integer, found integer -5"]),
])
def test_ttl_refuses_bad_settings(settings, problems):
    with pytest.raises(SettingsError) as info:
        kdaemon_ttl.TtlInterceptor.from_settings(settings)
    assert sorted(info.value.lines()) == sorted(problems)


def test_ttl_on_commit_logs_at_debug(caplog):
    icpt = ttl()
    icpt.on_consume([make_record(b"", timestamp=0)])
    with caplog.at_level(logging.DEBUG, logger="kdaemon_ttl"):
        icpt.on_commit({TopicPartition("t", 0): OffsetAndMetadata(5)})
    assert "t-0@5" in caplog.text and "1 expired" in caplog.text


def test_ttl_dropped_records_are_still_committed():
    class Clocked:  # run_plugin builds through the factory; give it a fixed clock
        @kdaemon_ttl.hookimpl
        def kdaemon_interceptors(self):
            return {"ttl-fixed": lambda settings: kdaemon_ttl.TtlInterceptor(
                settings["max_age_ms"], clock=lambda: NOW)}

    records = [make_record(b"old", offset=0, timestamp=NOW - 60_000),
               make_record(b"new", offset=1, timestamp=NOW),
               make_record(b"old", offset=2, timestamp=NOW - 60_000)]
    run = run_plugin(Clocked(), records, interceptors=[("ttl-fixed", {"max_age_ms": 10_000})])
    assert [r.offset for r in run.output] == [1]
    assert run.committed == {TopicPartition("test", 0): OffsetAndMetadata(3)}


# -- json -------------------------------------------------------------------------------------------

def deserialize(data, **settings):
    return kdaemon_json.json_deserializer(settings)("t", [], data)


def test_json_values():
    assert deserialize(b'{"a": [1, 2.5, null, true, "\\u00e9"]}') == {"a": [1, 2.5, None, True, "é"]}
    assert deserialize(b'"text"') == "text"
    assert deserialize(b"3") == 3
    assert deserialize(None) is None


@pytest.mark.parametrize("text", [' {"a": 1}', '{"a": 1} ', '\n{"a": 1}\r\n', '\t {"a": 1}\t'])
def test_json_surrounding_whitespace_is_accepted_as_by_json_loads(text):
    # The fast path scans from the first byte and must leave such input to the full decoder.
    assert deserialize(text.encode()) == json.loads(text) == {"a": 1}


@pytest.mark.parametrize("text", ['{"a": 1}{"b": 2}', '1 2', '[1] x', '"a" "b"'])
def test_json_trailing_data_is_refused_as_by_json_loads(text):
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(ValueError, match="Extra data"):
        deserialize(text.encode())


def test_json_encoding():
    assert deserialize('"é"'.encode("latin-1"), encoding="latin-1") == "é"
    assert deserialize('"é"'.encode("utf-16"), encoding="utf-16") == "é"


def test_json_encoding_is_spelled_as_python_does():
    with pytest.raises(ValueError, match="not valid utf-8: "):
        deserialize(b"\xff", encoding="UTF8")


@pytest.mark.parametrize("settings, problems", [
    ({"encoding": "klingon"}, ['encoding: expected a text encoding ("utf-8", "latin-1", ...), found string "klingon"']),
    ({"encoding": "base64"}, ['encoding: expected a text encoding ("utf-8", "latin-1", ...), found string "base64"']),
    ({"encoding": 8}, ["encoding: expected a string, found integer 8"]),
    ({"allow_nan": 1}, ["allow_nan: expected true or false, found integer 1"]),
    ({"allow_nan": "yes", "encoding": 8},   # every problem at once
     ['allow_nan: expected true or false, found string "yes"', "encoding: expected a string, found integer 8"]),
])
def test_json_refuses_bad_settings(settings, problems):
    with pytest.raises(SettingsError) as info:
        kdaemon_json.json_deserializer(settings)
    assert sorted(info.value.lines()) == sorted(problems)


SECRET = "4111-1111-1111-1111"


@pytest.mark.parametrize("data, message", [
    (f'{{"card": "{SECRET}"'.encode(), r"not valid JSON: Expecting ',' delimiter at line 1 column \d+"),
    (f'{{"card": "{SECRET}"}} trailing'.encode(), "not valid JSON: Extra data"),
    (b"", "not valid JSON: Expecting value at line 1 column 1"),
    (SECRET.encode() + b"\xff", r"not valid utf-8: invalid start byte at byte 19"),
])
def test_json_errors_are_short_and_never_contain_the_payload(data, message):
    with pytest.raises(ValueError, match=message) as info:
        deserialize(data)
    assert SECRET not in str(info.value) and len(str(info.value)) < 100
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_json_nan_is_refused_unless_allowed():
    with pytest.raises(ValueError, match="NaN is not JSON"):
        deserialize(b"[NaN]")
    assert deserialize(b"[Infinity]", allow_nan=True) == [float("inf")]


def test_json_ignores_settings_meant_for_the_other_deserializer():
    # [deserializer.settings] is shared by key and value: "errors" belongs to "str".
    assert deserialize(b"1", errors="replace") == 1


def test_json_errors_through_run_plugin():
    records = make_records([b'{"ok": 1}', b"{broken", None])
    run = run_plugin(kdaemon_json, records, deserializer="json")
    assert run.values == [{"ok": 1}, None]
    [(failed, exc)] = run.deserialize_errors
    assert failed.offset == 1 and isinstance(exc, ValueError)
