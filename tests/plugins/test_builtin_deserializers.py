"""The built-in deserializers' settings (``bytes``, ``str``), and ``[deserializer.settings]``
shared by the key and the value deserializer: each checks its own keys and leaves the others'."""

from __future__ import annotations

import pytest

from kdaemon.config import dump_toml, load
from kdaemon.plugins import SettingsError, builtin
from kdaemon.worker.build import check_against_plugins
from kdaemon.worker.main import load_plugins

ENCODING = 'encoding: expected a text encoding ("utf-8", "latin-1", ...), found string'


def str_deserializer(**settings):
    return builtin.kdaemon_deserializers()["str"](settings)


def test_str_decodes_with_its_encoding_and_errors():
    assert str_deserializer()("t", [], "é".encode()) == "é"
    assert str_deserializer()("t", [], None) is None
    assert str_deserializer(encoding="latin-1")("t", [], b"\xe9") == "é"
    assert str_deserializer(encoding="UTF8", errors="replace")("t", [], b"a\xff") == "a\ufffd"
    assert str_deserializer(errors="surrogateescape")("t", [], b"a\xff") == "a\udcff"
    with pytest.raises(UnicodeDecodeError):
        str_deserializer()("t", [], b"a\xff")


@pytest.mark.parametrize("settings, problems", [
    ({"encoding": "klingon"}, [f'{ENCODING} "klingon"']),
    ({"encoding": "hex"}, [f'{ENCODING} "hex"']),          # a codec, but not of text: it would fail every record
    ({"encoding": 5}, ["encoding: expected a string, found integer 5"]),
    ({"errors": "xmlcharrefreplace"},                       # a handler that only encodes
     ['errors: expected one of strict, replace, ignore, backslashreplace, surrogateescape, surrogatepass, '
      'found string "xmlcharrefreplace"']),
    ({"errors": True, "encoding": ["utf-8"]},               # every problem at once
     ['encoding: expected a string, found array ["utf-8"]',
      "errors: expected one of strict, replace, ignore, backslashreplace, surrogateescape, surrogatepass, "
      "found boolean true"]),
])
def test_str_refuses_bad_settings(settings, problems):
    with pytest.raises(SettingsError) as info:
        str_deserializer(**settings)
    assert sorted(info.value.lines()) == sorted(problems)


def test_str_and_bytes_leave_the_other_deserializers_keys_alone():
    other = {"allow_nan": True, "schema_registry": {"url": "http://registry:8081"}, "colour": [1]}
    assert str_deserializer(**other)("t", [], b"x") == "x"
    assert builtin.kdaemon_deserializers()["bytes"]({**other, "encoding": 5})("t", [], b"x") == b"x"


def config(tmp_path, key: str, value: str, settings: dict):
    raw = {"kafka": {"bootstrap_servers": "127.0.0.1:9", "group_id": "g"},
           "daemon": {"topics": ["t"], "state_dir": str(tmp_path / "state")},
           "plugins": ["json"],
           "deserializer": {"key": key, "value": value, "settings": settings},
           "sink": {"type": "null"}}
    path = tmp_path / "kdaemon.toml"
    path.write_text(dump_toml(raw))
    loaded = load(path)
    return loaded, check_against_plugins(loaded, load_plugins(loaded, configure=False))


@pytest.mark.parametrize("encoding, problem", [("klingon", f'{ENCODING} "klingon"'),
                                               (5, "encoding: expected a string, found integer 5")])
def test_a_shared_key_both_refuse_is_one_line(tmp_path, encoding, problem):
    loaded, problems = config(tmp_path, "str", "json", {"encoding": encoding})
    assert problems == [f"{loaded.path}: deserializer.settings.{problem}"]


def test_each_deserializer_names_its_own_keys_problems(tmp_path):
    loaded, problems = config(tmp_path, "str", "json", {"errors": "loud", "allow_nan": 0})
    assert problems == [
        f'{loaded.path}: deserializer.settings.errors: expected one of strict, replace, ignore, backslashreplace, '
        'surrogateescape, surrogatepass, found string "loud"',
        f"{loaded.path}: deserializer.settings.allow_nan: expected true or false, found integer 0"]


def test_each_deserializer_takes_its_own_keys_of_the_shared_table(tmp_path):
    assert config(tmp_path, "str", "json", {"encoding": "latin-1", "errors": "replace", "allow_nan": True})[1] == []
    assert config(tmp_path, "bytes", "str", {"errors": "ignore"})[1] == []
