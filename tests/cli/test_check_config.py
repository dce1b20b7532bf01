"""``kdaemon check-config`` lists every problem of a file in one run (issue #19): the file's own
(each unknown key with the known one it most likely meant) and, in the same run, what the
plugins' factories say about their settings, so an operator fixes a file in one go."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from kdaemon.exit_codes import EXIT_CONFIG


def check(tmp_path, text: str) -> subprocess.CompletedProcess:
    path = tmp_path / "kdaemon.toml"
    path.write_text(textwrap.dedent(text))
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", "check-config", "-c", str(path)],
                          capture_output=True, text=True, timeout=60)


def test_every_problem_in_one_run_with_did_you_mean(tmp_path):
    proc = check(tmp_path, f"""
        [daemon]
        topics = ["t"]
        worker = 2

        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "g"
        sesion_timeout_ms = 1000

        [[filters]]
        header = "type"
        vaule = "x"

        [sink]
        type = "jsonl"
        path = "{tmp_path / 'out'}"
        pth = 1
        colour = "blue"
    """)
    path = tmp_path / "kdaemon.toml"
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert f"{path}: kafka.sesion_timeout_ms: unknown consumer option (did you mean 'session_timeout_ms'?)" in lines
    assert f"{path}: daemon.worker: unknown option (did you mean 'workers'?)" in lines
    assert any(line.startswith(f"{path}: filters[0].vaule: unknown key (did you mean 'value'?)") for line in lines), lines
    # The sink's own check, in the same run as the file's problems.
    assert f"{path}: sink.pth: unknown setting (did you mean 'path'?) (known: dedupe, fsync, max_age_s, max_bytes, " \
           "path, prefix)" in lines, lines
    assert any(line.startswith(f"{path}: sink.colour: unknown setting (known: ") for line in lines), lines
    assert "Traceback" not in proc.stderr


def test_a_key_nothing_resembles_gets_no_guess(tmp_path):
    proc = check(tmp_path, """
        [daemon]
        topics = ["t"]
        zzz = 1
        [kafka]
        bootstrap_servers = "127.0.0.1:9"
        group_id = "g"
    """)
    assert proc.returncode == EXIT_CONFIG
    lines = proc.stderr.strip().splitlines()
    assert f"{tmp_path / 'kdaemon.toml'}: daemon.zzz: unknown option" in lines, lines
    # No [sink]: the default jsonl sink's own check says what it misses, in the same run.
    assert f"{tmp_path / 'kdaemon.toml'}: sink.path: required: the directory to write files into (created if " \
           "missing)" in lines, lines


def test_an_unreadable_file_is_one_line(tmp_path):
    proc = check(tmp_path, "[daemon\n")
    assert proc.returncode == EXIT_CONFIG
    assert len(proc.stderr.strip().splitlines()) == 1 and "not valid TOML" in proc.stderr, proc.stderr
