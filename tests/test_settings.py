"""The one settings checker (kdaemon/settings.py): a TOML table into a frozen dataclass, every
problem of the table worded ``where.key: expected <kind>, found <TOML type> <value>``, or raised
together in one ``SettingsError``."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from typing import Callable, Literal

import pytest

from kdaemon.settings import SettingsError, did_you_mean, parse_settings, setting, settings_table


@dataclass(frozen=True)
class Example:
    path: str = setting(pattern=r"(?s).+", expected="a directory path", needs="where the files go")
    count: int = setting(10, min=1)
    age_s: float = setting(1.5, above=0)
    ratio: float = setting(0.5, min=0, max=1)
    fsync: bool = True
    mode: Literal["fast", "safe"] = "safe"
    codec: str = setting("none", choices=("none", "gzip"))
    columns: tuple[str, ...] = setting(("topic",), choices=("topic", "date"))
    tags: list[str] = field(default_factory=list)
    conf: dict[str, str | int] = field(default_factory=dict)
    servers: str | tuple[str, ...] | None = None
    name: str | None = None


def problems(table, cls=Example, **kwargs) -> list[str]:
    with pytest.raises(SettingsError) as info:
        parse_settings(cls, table, "sink", **kwargs)
    assert str(info.value).splitlines() == info.value.lines()
    return info.value.lines()


def test_a_table_becomes_a_frozen_typed_instance_with_the_defaults_filled_in():
    s = parse_settings(Example, tomllib.loads('type = "x"\npath = "/out"\nage_s = 2\ncolumns = ["date"]\n'
                                              'tags = ["a"]\nconf = { a = "b", n = 1 }\nservers = ["h:1", "h:2"]'),
                       "sink")
    assert s == Example(path="/out", age_s=2.0, columns=("date",), tags=["a"], conf={"a": "b", "n": 1},
                        servers=("h:1", "h:2"))
    assert isinstance(s.age_s, float) and isinstance(s.columns, tuple) and isinstance(s.servers, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.count = 3


def test_every_problem_of_the_table_at_once_each_on_its_line():
    assert problems({"path": "", "count": 0, "age_s": "x", "ratio": 1.5, "fsync": 1, "mode": "turbo",
                     "codec": "brotli", "columns": ["key", 7], "tags": "a", "conf": {"a": [1]}, "servers": 5,
                     "pth": 1}) == [
        'sink.path: expected a directory path, found string ""',
        "sink.count: expected a positive integer, found integer 0",
        'sink.age_s: expected a positive number, found string "x"',
        "sink.ratio: expected a number >= 0 and <= 1, found float 1.5",
        "sink.fsync: expected true or false, found integer 1",
        'sink.mode: expected one of fast, safe, found string "turbo"',
        'sink.codec: expected one of none, gzip, found string "brotli"',
        'sink.columns[0]: expected one of topic, date, found string "key"',
        "sink.columns[1]: expected one of topic, date, found integer 7",
        'sink.tags: expected a list of strings, found string "a"',
        "sink.conf.a: expected a string or an integer, found array [1]",
        "sink.servers: expected a string or a list of strings, found integer 5",
        "sink.pth: unknown setting (did you mean 'path'?) (known: age_s, codec, columns, conf, count, fsync, mode, "
        "name, path, ratio, servers, tags)",
    ]


def test_booleans_and_numbers_are_never_taken_for_each_other():
    assert problems({"path": "p", "count": True}) == ["sink.count: expected a positive integer, found boolean true"]
    assert problems({"path": "p", "age_s": False}) == ["sink.age_s: expected a positive number, found boolean false"]
    assert problems({"path": "p", "fsync": 0}) == ["sink.fsync: expected true or false, found integer 0"]
    assert problems({"path": "p", "count": 2.0}) == ["sink.count: expected a positive integer, found float 2.0"]
    assert problems({"path": "p", "age_s": float("inf")}) == ["sink.age_s: expected a positive number, found float inf"]


def test_required_retired_ignored_and_not_a_table():
    assert problems({}) == ["sink.path: required: where the files go"]
    assert problems({"path": "p", "table": "t"}, retired={"table": "no longer supported: use path"}) == \
        ["sink.table: no longer supported: use path"]
    assert problems({"path": "p", "type": "x"}, ignore=()) == [
        "sink.type: unknown setting (known: age_s, codec, columns, conf, count, fsync, mode, name, path, ratio, "
        "servers, tags)"]
    assert problems("/out") == ['sink: expected a table, found string "/out"']
    assert problems({"path": "p", "a\nb": 1})[0].startswith('sink."a\\nb": unknown setting')   # one line


def test_checks_between_fields_run_once_every_value_fits_and_are_raised_with_the_rest():
    def check(s: Example):
        if s.codec == "gzip" and s.mode == "fast":
            yield "codec", "gzip is not fast"
        yield "", "and the table as a whole"

    assert problems({"path": "p", "codec": "gzip", "mode": "fast"}, check=check) == \
        ["sink.codec: gzip is not fast", "sink: and the table as a whole"]
    assert problems({"path": "p", "count": 0}, check=check) == \
        ["sink.count: expected a positive integer, found integer 0"]   # the check never saw a wrong value


def test_problems_are_worded_under_another_name_for_the_table():
    with pytest.raises(SettingsError) as info:
        parse_settings(Example, {"count": -1}, "sink")
    assert info.value.lines("dlq") == ["dlq.count: expected a positive integer, found integer -1",
                                       "dlq.path: required: where the files go"]
    joined = SettingsError.joined([info.value, SettingsError("avro", [("x", "y")])])
    assert joined.lines() == ["sink.count: expected a positive integer, found integer -1",
                              "sink.path: required: where the files go", "avro.x: y"]
    assert joined.lines("deserializer.settings")[-1] == "deserializer.settings.avro.x: y"


def test_settings_go_over_the_wire_as_the_table_that_parses_back_to_them():
    s = parse_settings(Example, {"path": "/out", "columns": ["date", "topic"], "conf": {"k": 1}}, "sink")
    wire = json.loads(json.dumps(settings_table(s)))
    assert "name" not in wire and "servers" not in wire   # None: absent, as TOML has no null
    assert parse_settings(Example, wire, "sink") == s


def test_a_field_no_table_can_hold_is_a_programming_error():
    @dataclass(frozen=True)
    class Bad:
        callback: Callable | None = None

    with pytest.raises(TypeError, match="callback"):
        parse_settings(Bad, {}, "x")


def test_did_you_mean():
    assert did_you_mean("pth", ["path", "prefix"]) == " (did you mean 'path'?)"
    assert did_you_mean("zzz", ["path"]) == ""
