"""A plugin sink's settings (issue #19): ``check-config`` runs its factory's ``validate(settings)``
and lists what it refuses with the file's other problems; a sink without ``validate`` is named in
a note; and a worker whose plugin sink refuses its settings stops the daemon with exit code 4 and
the plugin's message on one line, not a traceback (on Apache Kafka)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from kdaemon.exit_codes import EXIT_BOOT_FAILURE, EXIT_CONFIG
from testkit.produce import create_topic

PLUGIN = textwrap.dedent('''
    from kdaemon.plugins import hookimpl

    class Sink:
        def write(self, records): pass
        def flush(self): pass
        def close(self): pass

    def check(settings):
        unknown = set(settings) - {"type", "url"}
        if unknown:
            raise ValueError(f"unknown setting(s) {', '.join(sorted(unknown))}; the checked sink takes url")
        if not str(settings.get("url", "")).startswith("https://"):
            raise ValueError(f"url must start with https://, not {settings.get('url')!r}")

    def make_checked(settings):
        check(settings)
        return Sink()

    make_checked.validate = check

    def make_unchecked(settings):
        if "url" not in settings:
            raise ValueError("the unchecked sink needs url")
        return Sink()

    def make_buggy(settings):
        return Sink()

    def buggy_validate(settings):
        return settings["url"].lower()   # AttributeError on a number: a plugin bug

    make_buggy.validate = buggy_validate

    from dataclasses import dataclass
    from kdaemon.plugins import parse_settings, setting

    @dataclass(frozen=True)
    class TypedSettings:
        url: str = setting(pattern=r"https://.+", expected="an https:// URL", needs="where records go")
        batch: int = setting(100, min=1)

    def check_typed(settings):
        return parse_settings(TypedSettings, settings, "sink")

    def make_typed(settings):
        check_typed(settings)
        return Sink()

    make_typed.validate = check_typed

    @hookimpl
    def kdaemon_sinks(context):
        return {"checked": make_checked, "unchecked": make_unchecked, "buggy": make_buggy, "typed": make_typed}
''')


def kdaemon(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(cwd), os.getcwd()]))
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


def config(tmp_path: Path, bootstrap: str, sink: str, topic: str = "t") -> Path:
    (tmp_path / "kd_cli_sinks.py").write_text(PLUGIN)
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(f"""
        plugins = ["kd_cli_sinks:"]

        [daemon]
        topics = ["{topic}"]
        state_dir = "{tmp_path / 'state'}"
        workers = 1

        [kafka]
        bootstrap_servers = "{bootstrap}"
        group_id = "g-{uuid.uuid4().hex[:8]}"

        [sink]
        {sink}
    """))
    return path


def test_check_config_runs_a_plugin_sinks_validate(tmp_path):
    path = config(tmp_path, "127.0.0.1:9", 'type = "checked"\nurl = "http://x"\ncolour = 1')
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert proc.stderr.strip() == (f"{path}: sink.type: sink 'checked' refused its settings: unknown setting(s) "
                                   "colour; the checked sink takes url"), proc.stderr

    path = config(tmp_path, "127.0.0.1:9", 'type = "checked"\nurl = "https://x"')
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"{path}: OK", proc.stderr
    assert proc.stderr == ""


def test_a_plugin_sink_checked_with_parse_settings_words_its_problems_as_the_daemon_does(tmp_path):
    """Every problem of the table on its own line, under the table the sink was given: [sink],
    or [dlq] when the same sink is the dead-letter queue."""
    path = config(tmp_path, "127.0.0.1:9", 'type = "typed"\nurl = "http://x"\nbatch = 0\nbatchh = 1')
    with open(path, "a") as f:
        f.write('\n[dlq]\ntype = "typed"\nbatch = true\n')
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert proc.stderr.splitlines() == [
        f'{path}: sink.url: expected an https:// URL, found string "http://x"',
        f"{path}: sink.batch: expected a positive integer, found integer 0",
        f"{path}: sink.batchh: unknown setting (did you mean 'batch'?) (known: batch, url)",
        f"{path}: dlq.batch: expected a positive integer, found boolean true",
        f"{path}: dlq.url: required: where records go"], proc.stderr


def test_a_validate_that_raises_a_plugin_bug_is_named(tmp_path):
    path = config(tmp_path, "127.0.0.1:9", 'type = "buggy"\nurl = 5')
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"{path}: sink.type: sink 'buggy': validate(settings) failed with "
                                   "AttributeError: 'int' object has no attribute 'lower'"), proc.stderr


@pytest.mark.kafka
def test_a_sink_without_validate_is_noted_and_stops_its_worker_in_one_line(kafka, tmp_path):
    topic = f"plugin-sink-{uuid.uuid4().hex[:8]}"
    create_topic(kafka.bootstrap, topic, 1)
    path = config(tmp_path, kafka.bootstrap, 'type = "unchecked"', topic)
    proc = kdaemon("check-config", "-c", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == (f"note: {path}: sink.type: sink 'unchecked' offers no validate(settings); "
                                   "its settings are checked only when a worker builds it"), proc.stderr

    proc = kdaemon("run", "-c", str(path), cwd=tmp_path, timeout=180)
    assert proc.returncode == EXIT_BOOT_FAILURE, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "cannot boot" in line]
    assert lines and lines[0].endswith(f"worker 0 cannot boot: {path}: sink.type: sink 'unchecked' refused its "
                                       "settings: the unchecked sink needs url"), proc.stderr[-3000:]
