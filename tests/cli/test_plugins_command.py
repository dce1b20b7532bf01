"""``kdaemon plugins`` (issue #19): works without -c and with a configuration that has problems,
and shows each plugin's version and the names it offers per kind."""

from __future__ import annotations

import subprocess
import sys

from kdaemon import __version__


def plugins(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kdaemon.cli", "plugins", *args], capture_output=True,
                          text=True, timeout=60)


def rows(proc) -> dict[str, str]:
    assert proc.returncode == 0, proc.stderr
    return {line.split()[1]: line for line in proc.stdout.splitlines()}


def test_without_a_configuration_the_built_in_plugins_and_what_they_offer():
    got = rows(plugins())
    assert got["builtin-sinks"].split()[:3] == ["enabled", "builtin-sinks", __version__]
    assert got["builtin-sinks"].endswith("[sinks: jsonl, kafka, null, spark, stdout]"), got["builtin-sinks"]
    assert got["json"].startswith("enabled") and got["json"].endswith("[deserializers: json]")
    assert got["ttl"].endswith("[interceptors: ttl]") and got["header_rules"].endswith("[filters: rules_file]")
    # Installed but not in the allowlist: listed, not imported.
    assert got["example"].startswith("disabled") and "(not imported)" in got["example"]


def test_all_imports_every_installed_plugin_to_list_its_names():
    got = rows(plugins("--all"))
    assert got["example"].startswith("enabled") and "[" in got["example"], got["example"]


def test_a_broken_configuration_still_lists_them(tmp_path):
    path = tmp_path / "kdaemon.toml"
    path.write_text('plugins = ["json"]\n[daemon]\nworker = 2\n')
    proc = plugins("-c", str(path))
    got = rows(proc)
    assert proc.stderr.startswith(f"note: {path} has "), proc.stderr
    assert "its plugins list is used" in proc.stderr
    assert got["json"].startswith("enabled") and got["ttl"].startswith("disabled")
    path.write_text("[daemon\n")
    proc = plugins("-c", str(path))
    assert rows(proc)["ttl"].startswith("enabled") and "showing the default plugins" in proc.stderr
