"""``KDAEMON_<SECTION>_<KEY>`` environment variables set configuration values over the file, for
containers (kdaemon/config/env.py has the rules).  An environment value gets exactly the file's
checks; its problems name the variable instead of the file.  ``check-config`` lists the values
taken from the environment (secrets hidden) and fails on a bad one with the lines ``run`` prints.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from kdaemon.cli import main
from kdaemon.config import ConfigError, load, load_for_check
from kdaemon.config.env import NOT_CONFIGURATION, NOT_CONFIGURATION_PREFIXES, Layout, parse_value, read_overrides
from kdaemon.exit_codes import EXIT_CONFIG

ROOT = Path(__file__).resolve().parents[2]

FILE = """
    [kafka]
    bootstrap_servers = "127.0.0.1:9"
    group_id = "g"

    [daemon]
    topics = ["t"]
    workers = 2

    [sink]
    type = "jsonl"
    path = "{out}"
"""


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(FILE.format(out=tmp_path / "out")))
    return path


def problems_of(path: Path, environ: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load(path, environ=environ)
    return exc.value.problems


# -- values ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ("4", 4), ("-1", -1), ("true", True), ("false", False), ("1.5", 1.5),
    ('["a", "b"]', ["a", "b"]), ('"x"', "x"), ('"4"', "4"), ("'lit'", "lit"),
    ("{ a = 1 }", {"a": 1}),
    # Not a TOML value: the text itself.
    ("/data/out", "/data/out"), ("INFO", "INFO"), ("host:9092,other:9092", "host:9092,other:9092"),
    ("", ""), ("^events\\..*", "^events\\..*"),
    # More than one value is not a value: no way to slip a second key in.
    ("1\nx = 2", "1\nx = 2"), ("1\n[daemon]\nworkers = 9", "1\n[daemon]\nworkers = 9"),
])
def test_a_value_is_toml_when_it_is_one_else_the_text(text, value):
    assert parse_value(text) == value
    assert type(parse_value(text)) is type(value)


# -- precedence and names -------------------------------------------------------------------------

def test_the_environment_wins_over_the_file_and_leaves_the_rest(config_file, tmp_path):
    assert load(config_file, environ={}).daemon.workers == 2
    config = load(config_file, environ={"KDAEMON_DAEMON_WORKERS": "4",
                                        "KDAEMON_SINK_PATH": "/data/out",      # unquoted: a string
                                        "KDAEMON_KAFKA_CLIENT_ID": "from-env",  # not in the file
                                        "PATH": "/usr/bin"})
    assert config.daemon.workers == 4
    assert config.daemon.topics == ("t",)
    assert config.sink.settings == {"type": "jsonl", "path": "/data/out"}
    assert config.kafka["client_id"] == "from-env" and config.kafka["group_id"] == "g"
    assert config.raw["daemon"] == {"topics": ["t"], "workers": 4}   # the effective mapping


def test_plugins_is_set_whole_and_a_required_key_may_come_from_the_environment(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:9"\n[daemon]\ntopics = ["t"]\n')
    assert any("kafka.group_id: required" in p for p in problems_of(path, {}))
    config = load(path, environ={"KDAEMON_KAFKA_GROUP_ID": "g", "KDAEMON_PLUGINS": '["json"]'})
    assert config.kafka["group_id"] == "g" and config.plugins == ("json",)


def test_the_longest_known_section_that_leaves_a_key_is_taken():
    layout = Layout(tables={"sink": frozenset({"type"}), "sink_retry": frozenset({"max"})},
                    table_arrays=frozenset(), values=frozenset())
    found = read_overrides({"KDAEMON_SINK_RETRY_MAX": "3", "KDAEMON_SINK_RETRY": "x",
                            "KDAEMON_SINK_PATH": "/p"}, layout, {})
    assert {o.variable: o.where for o in found.applied} == {
        "KDAEMON_SINK_RETRY_MAX": "sink_retry.max",   # not sink.retry_max
        "KDAEMON_SINK_RETRY": "sink.retry",           # [sink_retry] would leave no key
        "KDAEMON_SINK_PATH": "sink.path",
    }
    assert found.problems == ()
    merged = found.over({"sink": {"type": "jsonl"}})
    assert merged == {"sink": {"type": "jsonl", "retry": "x", "path": "/p"}, "sink_retry": {"max": 3}}


# -- problems name the variable -------------------------------------------------------------------

def test_a_wrong_type_is_the_files_problem_under_the_variables_name(config_file):
    problems = problems_of(config_file, {"KDAEMON_DAEMON_WORKERS": "four"})
    assert problems == ['environment KDAEMON_DAEMON_WORKERS: daemon.workers: expected an integer, '
                        'found string "four"']
    # The file's wording for the same value in the file, for comparison.
    text = config_file.read_text().replace("workers = 2", 'workers = "four"')
    config_file.write_text(text)
    assert problems_of(config_file, {}) == [f'{config_file}: daemon.workers: expected an integer, '
                                            'found string "four"']


def test_a_value_check_beyond_the_type_names_the_variable_too(config_file):
    problems = problems_of(config_file, {"KDAEMON_DAEMON_LOG_LEVEL": "LOUD",
                                         "KDAEMON_KAFKA_SESSION_TIMEOUT_MS": "-5",
                                         "KDAEMON_DAEMON_TOPICS": '["t", 7]'})
    assert "environment KDAEMON_DAEMON_LOG_LEVEL: daemon.log_level: 'LOUD' is not one of DEBUG, INFO, " \
           "WARNING, ERROR" in problems
    assert any(p.startswith("environment KDAEMON_KAFKA_SESSION_TIMEOUT_MS: kafka.session_timeout_ms: ")
               for p in problems), problems
    assert "environment KDAEMON_DAEMON_TOPICS: daemon.topics[1]: expected a string, found integer 7" in problems
    assert not any(p.startswith(str(config_file)) for p in problems), problems


def test_the_trap_says_how_to_quote(config_file):
    problems = problems_of(config_file, {"KDAEMON_KAFKA_GROUP_ID": "1234", "KDAEMON_DAEMON_TOPICS": "a, b"})
    assert ("environment KDAEMON_KAFKA_GROUP_ID: kafka.group_id: expected a string, found integer 1234; "
            "the value reads as a TOML integer: quote it to give a string, "
            """KDAEMON_KAFKA_GROUP_ID='"1234"'""") in problems
    assert ('environment KDAEMON_DAEMON_TOPICS: daemon.topics: expected a list of strings, found string "a, b"; '
            """a list is written as a TOML array: KDAEMON_DAEMON_TOPICS='["a", "b"]'""") in problems
    assert load(config_file, environ={"KDAEMON_KAFKA_GROUP_ID": '"1234"'}).kafka["group_id"] == "1234"


def test_an_unknown_key_is_the_files_problem_and_an_open_table_takes_any(config_file):
    problems = problems_of(config_file, {"KDAEMON_DAEMON_WORKER": "3", "KDAEMON_KAFKA_SESION_TIMEOUT_MS": "1"})
    assert sorted(problems) == [
        "environment KDAEMON_DAEMON_WORKER: daemon.worker: unknown option (did you mean 'workers'?)",
        "environment KDAEMON_KAFKA_SESION_TIMEOUT_MS: kafka.sesion_timeout_ms: unknown consumer option "
        "(did you mean 'session_timeout_ms'?)",
    ]
    # [sink] is the sink's own table: the loader takes any key there, from the file or from here
    # (the sink's check, in check-config and at start, judges it).
    assert load(config_file, environ={"KDAEMON_SINK_FSYNC": "false"}).sink.settings["fsync"] is False


def test_an_unknown_section_is_a_problem_with_a_guess(config_file):
    problems = problems_of(config_file, {"KDAEMON_DEAMON_WORKERS": "3", "KDAEMON_ZZZ": "1"})
    assert problems[0] == ("environment KDAEMON_DEAMON_WORKERS: unknown section (did you mean "
                           "'KDAEMON_DAEMON_WORKERS'?): KDAEMON_<SECTION>_<KEY> takes one of the sections "
                           "daemon, deserializer, dlq, kafka, otel, share, sink; or KDAEMON_PLUGINS")
    assert problems[1].startswith("environment KDAEMON_ZZZ: unknown section: "), problems
    assert len(problems) == 2


@pytest.mark.parametrize("variable, text", [
    ("KDAEMON_FILTERS_HEADER", "[[filters]] is an array of tables, which environment variables cannot set"),
    ("KDAEMON_INTERCEPTORS", "[[interceptors]] is an array of tables"),
    ("KDAEMON_SINK_CONF__SPARK_DRIVER_MEMORY", "nested keys cannot be set one by one ('__'): set the key's "
                                               "whole table as a TOML inline table"),
    ("KDAEMON_DAEMON", "names [daemon] but no key: write KDAEMON_DAEMON_<KEY>"),
    ("KDAEMON_PLUGINS_EXTRA", "plugins is a top-level key, not a table: set it whole"),
])
def test_what_a_variable_cannot_set_is_refused_by_name(config_file, variable, text):
    problems = problems_of(config_file, {variable: "1"})
    assert len(problems) == 1 and problems[0].startswith(f"environment {variable}: {text}"), problems


def test_a_table_value_is_given_whole_as_an_inline_table(config_file):
    config = load(config_file, environ={"KDAEMON_DESERIALIZER_SETTINGS": '{ encoding = "latin-1" }'})
    assert config.deserializer.settings == {"encoding": "latin-1"}


def test_two_spellings_of_one_key_are_refused(config_file):
    problems = problems_of(config_file, {"KDAEMON_DAEMON_WORKERS": "3", "KDAEMON_daemon_workers": "4"})
    assert problems == ["environment KDAEMON_daemon_workers: sets daemon.workers, as KDAEMON_DAEMON_WORKERS "
                        "does: keep one"]


# -- what is not an override ----------------------------------------------------------------------

def test_kdaemons_own_variables_and_a_secrets_source_are_not_overrides(config_file):
    text = config_file.read_text().replace('group_id = "g"',
                                           'group_id = "g"\nsasl_password_env = "KDAEMON_SASL_PASSWORD"')
    config_file.write_text(text)
    environ = {"KDAEMON_SASL_PASSWORD": "pw", "KDAEMON_CACHE": "/cache", "KDAEMON_PURE_PYTHON": "1",
               "KDAEMON_BENCH_PROFILE_DIR": "/tmp/p", "KDAEMON_FUZZ_SECRET": "s"}
    assert load(config_file, environ=environ).kafka["sasl_password"] == "pw"
    # Without the file naming it, the same variable is a misspelt override, and the guess says which.
    config_file.write_text(text.replace('sasl_password_env = "KDAEMON_SASL_PASSWORD"\n', ""))
    assert problems_of(config_file, environ) == [
        "environment KDAEMON_SASL_PASSWORD: unknown section (did you mean 'KDAEMON_KAFKA_SASL_PASSWORD'?): "
        "KDAEMON_<SECTION>_<KEY> takes one of the sections daemon, deserializer, dlq, kafka, otel, share, sink; or KDAEMON_PLUGINS"]


def test_every_kdaemon_variable_the_code_reads_is_left_alone():
    """A KDAEMON_ variable that kdaemon, the benchmarks, the fuzzers or the test harness use for themselves would
    be refused as an unknown section if NOT_CONFIGURATION did not list it."""
    constants = {"KDAEMON_FILTER_RUNS"}   # bench/consume: a Python tuple's name, not a variable
    used = set()
    for top in ("kdaemon", "bench", "fuzz", "testkit"):
        for path in (ROOT / top).rglob("*.py"):
            if path.name != "env.py":
                used |= set(re.findall(r"\bKDAEMON_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert {"KDAEMON_CACHE", "KDAEMON_BENCH_PROFILE_DIR", "KDAEMON_TEST_SERVERS_RUN"} <= used   # the scan sees them
    uncovered = {v for v in used - constants
                 if v not in NOT_CONFIGURATION and not v.startswith(NOT_CONFIGURATION_PREFIXES)}
    assert not uncovered, f"add these to kdaemon.config.env.NOT_CONFIGURATION: {sorted(uncovered)}"


def test_a_variable_the_file_names_as_a_secrets_source_is_read_once(config_file):
    """``sasl_password_env = "KDAEMON_KAFKA_SASL_PASSWORD"``: the variable is the source the file
    names, not also an override (which would give sasl_password twice)."""
    text = config_file.read_text().replace('group_id = "g"',
                                           'group_id = "g"\nsasl_password_env = "KDAEMON_KAFKA_SASL_PASSWORD"')
    config_file.write_text(text)
    assert load(config_file, environ={"KDAEMON_KAFKA_SASL_PASSWORD": "pw"}).kafka["sasl_password"] == "pw"


def test_a_secret_is_taken_as_it_is(config_file):
    for text in ("12345", '"quoted"', "true", "a = b"):
        config = load(config_file, environ={"KDAEMON_KAFKA_SASL_PASSWORD": text})
        assert config.kafka["sasl_password"] == text


def test_without_the_environment_load_for_check_is_as_before(config_file):
    problems: list[str] = []
    overrides: list = []
    config = load_for_check(config_file, problems, environ={}, overrides=overrides)
    assert config is not None and not problems and not overrides and config.daemon.workers == 2


# -- check-config and run -------------------------------------------------------------------------

def invoke(args: list[str], env: dict):
    return CliRunner().invoke(main, args, env=env)


def test_check_config_lists_each_value_from_the_environment_secrets_hidden(config_file):
    env = {"KDAEMON_DAEMON_WORKERS": "4", "KDAEMON_KAFKA_SASL_PASSWORD": "hunter2-secret"}
    result = invoke(["check-config", "-c", str(config_file)], env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "environment: daemon.workers = 4   # KDAEMON_DAEMON_WORKERS",
        'environment: kafka.sasl_password = "***"   # KDAEMON_KAFKA_SASL_PASSWORD',
        f"{config_file}: OK",
    ]
    assert "hunter2" not in result.output


def test_check_config_show_prints_the_effective_configuration_marked(config_file):
    env = {"KDAEMON_DAEMON_WORKERS": "4", "KDAEMON_KAFKA_SASL_PASSWORD": "hunter2-secret"}
    result = invoke(["check-config", "-c", str(config_file), "--show"], env)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "workers = 4   # KDAEMON_DAEMON_WORKERS" in lines
    assert 'sasl_password = "***"   # KDAEMON_KAFKA_SASL_PASSWORD' in lines
    assert 'topics = ["t"]' in lines and 'group_id = "g"' in lines   # the file's, unmarked
    assert "hunter2" not in result.output


def test_check_config_and_run_refuse_a_bad_value_with_the_same_lines(config_file):
    env = {"KDAEMON_DAEMON_WORKERS": "four", "KDAEMON_DEAMON_ID": "x"}
    checked = invoke(["check-config", "-c", str(config_file)], env)
    ran = invoke(["run", "-c", str(config_file)], env)
    assert checked.exit_code == ran.exit_code == EXIT_CONFIG
    expected = problems_of(config_file, env)
    assert len(expected) == 2
    assert checked.stderr.splitlines() == ran.stderr.splitlines() == expected


def test_a_reload_applies_the_environment_again(config_file, monkeypatch):
    """SIGHUP goes through ``load`` (and the forked configuration check inherits the environment)."""
    from kdaemon.supervisor.configs import prepare_reload
    running = load(config_file, environ={})
    monkeypatch.setenv("KDAEMON_DAEMON_WORKERS", "3")
    assert prepare_reload(str(config_file), running).config.daemon.workers == 3
    monkeypatch.setenv("KDAEMON_DAEMON_WORKERS", "three")
    with pytest.raises(ConfigError, match="environment KDAEMON_DAEMON_WORKERS: daemon.workers: expected an integer"):
        prepare_reload(str(config_file), running)
