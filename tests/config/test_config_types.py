"""Values of the wrong TOML type anywhere in a configuration are kdaemon's own ConfigError, one
line per problem: ``file: section.key: expected ..., found <TOML type> <value>``.

The property test takes etc/kdaemon.toml (the file operators copy), replaces one value, list
element or sub-table anywhere in it with a value of another TOML type, writes it back as TOML
and loads it.  Which types each key of that file takes is written out here by hand (ACCEPTS),
not read from kdaemon.config's schema, so a schema that accepted the wrong type would fail.
Keys inside a table the loader hands over whole (a sink's settings, a plugin's ``settings``)
belong to the sink or plugin: there the file must load and the plugins' own check must answer
in the same one-line form.
"""

from __future__ import annotations

import copy
import datetime
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, event, given, settings, strategies as st

from kdaemon.config import ConfigError, dump_toml, load
from kdaemon.settings import toml_type

EXAMPLE = Path(__file__).resolve().parents[2] / "etc" / "kdaemon.toml"
PYTHON_WORDS = ("object is not", "NoneType", "Traceback", "object has no attribute", "unhashable",
                "not supported between", "takes no", "argument")

# The TOML types each key of etc/kdaemon.toml takes ("[]" stands for any index).
ACCEPTS = {
    "plugins": {"array"}, "plugins[]": {"string"},
    "kafka": {"table"}, "kafka.bootstrap_servers": {"string", "array"}, "kafka.bootstrap_servers[]": {"string"},
    "kafka.group_id": {"string"}, "kafka.client_id": {"string"}, "kafka.auto_offset_reset": {"string"},
    "kafka.session_timeout_ms": {"integer"},
    "daemon": {"table"}, "daemon.topics": {"array"}, "daemon.topics[]": {"string"},
    "daemon.state_dir": {"string"},
    "filters": {"array"}, "filters[]": {"table"}, "filters[].header": {"string"}, "filters[].op": {"string"},
    "filters[].values": {"array"}, "filters[].values[]": {"string"}, "filters[].action": {"string"},
    "deserializer": {"table"}, "deserializer.key": {"string"}, "deserializer.value": {"string"},
    "interceptors": {"array"}, "interceptors[]": {"table"}, "interceptors[].name": {"string"},
    "interceptors[].settings": {"table"},
    "sink": {"table"}, "sink.type": {"string"}, "dlq": {"table"}, "dlq.type": {"string"},
}
# Handed over whole to a sink or plugin factory: the loader does not type what is inside.
OPAQUE = re.compile(r"^((sink|dlq)\.(?!type$)|.*\.settings\.)")
TYPE_LINE = re.compile(r"^(?P<file>.+?): (?P<where>[A-Za-z0-9_.\[\]-]+): expected (?P<expected>.+), "
                       r"found (?P<type>[a-z]+) (?P<value>.+)$")


def where_of(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out


def pattern_of(path: tuple) -> str:
    return re.sub(r"\[\d+\]", "[]", where_of(path))


def paths(tree, prefix=()):
    """Every value's path in the tree: table keys and list indexes, the root excluded."""
    items = tree.items() if isinstance(tree, dict) else enumerate(tree) if isinstance(tree, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from paths(v, prefix + (k,))


def replaced(tree, path, value):
    out = copy.deepcopy(tree)
    node = out
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return out


BASE = tomllib.loads(EXAMPLE.read_text())
PATHS = sorted(paths(BASE), key=where_of)

_keys = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e), min_size=1, max_size=6)
_scalars = st.one_of(
    st.text(max_size=12),
    st.integers(-2**63, 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.datetimes(min_value=datetime.datetime(1000, 1, 1)),
    st.dates(min_value=datetime.date(1000, 1, 1)),
    st.times(),
)
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3), st.dictionaries(_keys, _scalars, max_size=3))


def test_every_key_of_the_example_is_described_here():
    """A key added to etc/kdaemon.toml must be added to ACCEPTS (or be a sink's or plugin's)."""
    undescribed = [where_of(p) for p in PATHS
                   if pattern_of(p) not in ACCEPTS and not OPAQUE.match(where_of(p))]
    assert not undescribed
    assert load(EXAMPLE)   # and the example itself loads


def check_lines(text: str, file: str) -> list[str]:
    lines = text.splitlines()
    assert lines, "an error without a problem"
    for line in lines:
        assert line.startswith(f"{file}: "), line
        assert not any(w in line for w in PYTHON_WORDS), line
    return lines


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=_values)
def test_a_value_of_another_type_anywhere(tmp_path, path, value):
    original = BASE
    for p in path:
        original = original[p]
    assume(toml_type(value) != toml_type(original))   # same type: not a type confusion
    mutated = replaced(BASE, path, value)
    text = dump_toml(mutated)
    assert tomllib.loads(text) == mutated   # the writer wrote what we meant
    file = tmp_path / "variant.toml"
    file.write_text(text)
    where, pattern = where_of(path), pattern_of(path)
    event("inside a sink's or plugin's table" if OPAQUE.match(where) else "a key the loader types")
    try:
        config = load(file)
    except ConfigError as exc:
        lines = check_lines(str(exc), str(file))
        assert exc.problems == lines
        if pattern in ACCEPTS and toml_type(value) not in ACCEPTS[pattern]:
            # Only a type problem, naming the mutated key (or an element of it).
            for line in lines:
                m = TYPE_LINE.match(line)
                assert m, f"not an 'expected ..., found ...' line: {line}"
                assert m["where"] == where or m["where"].startswith((where + "[", where + ".")), line
            assert any(TYPE_LINE.match(line)["where"] == where and TYPE_LINE.match(line)["type"] == toml_type(value)
                       for line in lines), lines
        else:
            assert pattern in ACCEPTS, f"{where} is the sink's or a plugin's, yet the loader refused it: {lines}"
        return
    # Loaded: the type was one the key takes, or the key is a sink's or plugin's to check.
    assert OPAQUE.match(where) or toml_type(value) in ACCEPTS[pattern], \
        f"{where} = {value!r} ({toml_type(value)}) was accepted"
    if OPAQUE.match(where):
        _plugins_answer_in_lines(config)


def _plugins_answer_in_lines(config):
    from kdaemon.worker.build import check_against_plugins
    from kdaemon.worker.main import load_plugins
    problems = check_against_plugins(config, load_plugins(config, configure=False))
    if problems:
        check_lines("\n".join(problems), config.path)


# -- the cases the issue names, through the command line --------------------------------------------

MINIMAL = """\
[kafka]
bootstrap_servers = "127.0.0.1:9092"
group_id = "g"

[daemon]
topics = ["events"]
state_dir = "{state}"

[sink]
type = "jsonl"
path = "{state}/out"
"""

NAMED = [   # (id, line in MINIMAL, replaced by, the problems check-config must print)
    ("bootstrap_servers=5", 'bootstrap_servers = "127.0.0.1:9092"', "bootstrap_servers = 5",
     ["kafka.bootstrap_servers: expected a string or a list of strings (host:port), found integer 5"]),
    ("group_id=1.5", 'group_id = "g"', "group_id = 1.5", ["kafka.group_id: expected a string, found float 1.5"]),
    ("number-in-topics", 'topics = ["events"]', 'topics = ["events", 7]',
     ["daemon.topics[1]: expected a string, found integer 7"]),
    ("list-as-deserializer", "[sink]", '[deserializer]\nvalue = ["json"]\n\n[sink]',
     ['deserializer.value: expected a string, found array ["json"]']),
    ("table-for-a-number", 'topics = ["events"]', 'topics = ["events"]\nflush_interval_ms = { ms = 5 }',
     ["daemon.flush_interval_ms: expected an integer, found table { ms = 5 }"]),
    # several at once, one line each, booleans and integers kept apart
    ("several", 'group_id = "g"', 'group_id = "g"\ncheck_crcs = 1\nmax_poll_records = true\nclient_id = ["a", 2]',
     ["kafka.check_crcs: expected true or false, found integer 1",
      "kafka.max_poll_records: expected an integer, found boolean true",
      'kafka.client_id: expected a string, found array ["a", 2]']),
]


def kdaemon(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize(("old", "new", "expected"), [n[1:] for n in NAMED], ids=[n[0] for n in NAMED])
def test_check_config_prints_the_problems_only(tmp_path, old, new, expected):
    text = MINIMAL.format(state=tmp_path / "state")
    assert old in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"{path}: {line}" for line in expected]


def test_the_minimal_config_passes_check_config(tmp_path):
    path = tmp_path / "minimal.toml"
    path.write_text(MINIMAL.format(state=tmp_path / "state"))
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"{path}: OK"
    config = load(path)
    assert config.daemon.on_deserialize_error == "dlq"
    assert config.dlq is not None and config.dlq.implicit
    assert config.dlq.type == "jsonl" and config.dlq.settings["path"] == str(tmp_path / "state" / "dlq")


def test_an_explicit_dlq_or_no_dlq_policy_means_no_default(tmp_path):
    base = tomllib.loads(MINIMAL.format(state=tmp_path / "state"))
    explicit = load_raw(tmp_path, {**base, "dlq": {"type": "jsonl", "path": str(tmp_path / "mine")}})
    assert not explicit.dlq.implicit and explicit.dlq.settings["path"] == str(tmp_path / "mine")
    skipping = load_raw(tmp_path, {**base, "daemon": {**base["daemon"], "on_deserialize_error": "skip"}})
    assert skipping.dlq is None
    sink_dlq = load_raw(tmp_path, {**base, "daemon": {**base["daemon"], "on_deserialize_error": "stop",
                                                       "on_sink_error": "dlq"}})
    assert sink_dlq.dlq.implicit


def load_raw(tmp_path: Path, raw: dict):
    path = tmp_path / "c.toml"
    path.write_text(dump_toml(raw))
    return load(path)


# -- every option the consumer and [daemon] take, one wrong type at a time -----------------------

def _options(cls, skip=()):
    import dataclasses
    return [f for f in dataclasses.fields(cls) if f.name not in skip]


def _consumer_options():
    from kdaemon.client.config import ConsumerConfig
    from kdaemon.config import DAEMON_OWNED
    return [f.name for f in _options(ConsumerConfig, DAEMON_OWNED)]


def _daemon_options():
    from kdaemon.config import DaemonSection
    return [f.name for f in _options(DaemonSection)]


def _problems(raw: dict) -> list[str]:
    from kdaemon.config import parse
    with pytest.raises(ConfigError) as exc:
        parse(raw, "f.toml")
    check_lines(str(exc.value), "f.toml")
    return exc.value.problems


def _minimal_raw(**sections) -> dict:
    raw = {"kafka": {"bootstrap_servers": "127.0.0.1:9092", "group_id": "g"},
           "daemon": {"topics": ["t"]}, "sink": {"type": "null"}}
    for name, extra in sections.items():
        raw[name] = {**raw[name], **extra}
    return raw


@pytest.mark.parametrize("option", _consumer_options())
def test_a_table_for_any_consumer_option(option):
    """A table is the wrong type for every option [kafka] passes to the consumer."""
    problems = _problems(_minimal_raw(kafka={option: {"x": 1}}))
    assert len(problems) == 1 and re.fullmatch(rf"f\.toml: kafka\.{option}: expected .+, found table \{{ x = 1 \}}",
                                               problems[0]), problems


@pytest.mark.parametrize("option", _daemon_options())
def test_a_table_for_any_daemon_option(option):
    problems = _problems(_minimal_raw(daemon={option: {"x": 1}}))
    assert len(problems) == 1 and re.fullmatch(rf"f\.toml: daemon\.{option}: expected .+, found table \{{ x = 1 \}}",
                                               problems[0]), problems


def _by_default_type(cls, skip=()):
    out = {}
    for f in _options(cls, skip):
        if isinstance(f.default, bool):
            out[f.name] = (1, "expected true or false, found integer 1")
        elif isinstance(f.default, int):
            out[f.name] = (True, "expected an integer, found boolean true")
    return out


def test_booleans_and_integers_are_not_taken_for_each_other():
    from kdaemon.client.config import ConsumerConfig
    from kdaemon.config import DAEMON_OWNED, DaemonSection
    for section, cls, skip in (("kafka", ConsumerConfig, DAEMON_OWNED), ("daemon", DaemonSection, ())):
        cases = _by_default_type(cls, skip)
        assert cases, cls
        problems = _problems(_minimal_raw(**{section: {k: v for k, (v, _) in cases.items()}}))
        assert sorted(problems) == sorted(f"f.toml: {section}.{k}: {text}" for k, (_, text) in cases.items())
