"""The shipped unit file: systemd accepts it, its sandbox is tight, and it starts on any host
a standard install (README.md, "Under systemd") produces, with or without SASL.

``systemd-analyze`` works on unit files without a running systemd (containers, CI).  The unit
is copied to a temporary directory with ExecStart pointing at this virtualenv's ``kdaemon`` so
``verify`` finds the executable, as it would on an installed system.

What ``verify`` cannot show: it does not open the files a unit names (a ``LoadCredential=`` of a
missing file verifies clean, and fails the unit only when systemd starts it).  So the files the
unit names are checked against the standard install's list, and the SASL credential, which only
some hosts have, lives in a drop-in (``kdaemon.service.d/sasl.conf``) verified with the unit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kdaemon.exit_codes import EXIT_CONFIG, PERMANENT
from testkit.daemon import kdaemon_command

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "kdaemon.service"
# The broker-side lag exporter's unit (kdaemon lag-exporter) beside it: the same checks apply.
LAG_EXPORTER_UNIT = ROOT / "systemd" / "kdaemon-lag-exporter.service"
UNITS = (UNIT, LAG_EXPORTER_UNIT)
SASL_DROP_IN = ROOT / "systemd" / "kdaemon.service.d" / "sasl.conf"
INSTALLED_COMMAND = "/opt/kdaemon/bin/kdaemon"
# What README.md's install steps put on every host (SASL or not), and what systemd creates for
# the unit (StateDirectory=, RuntimeDirectory=); plus the base system's /bin/kill.
STANDARD_INSTALL = {INSTALLED_COMMAND, "/etc/kdaemon/kdaemon.toml", "/etc/systemd/system/kdaemon.service"}
CREATED_BY_SYSTEMD = {"/var/lib/kdaemon", "%t/kdaemon/metrics"}
BASE_SYSTEM = {"/bin/kill"}
MAX_EXPOSURE = 2.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze is not installed (Debian/Ubuntu package 'systemd'; "
                                       ".ci/run installs it when it runs as root)")


@pytest.fixture(params=UNITS, ids=lambda p: p.name)
def unit(tmp_path, request) -> Path:
    shipped: Path = request.param
    command = kdaemon_command()
    assert len(command) == 1, f"no kdaemon script next to the interpreter ({command}); pip install -e ."
    text = shipped.read_text()
    assert f"ExecStart={INSTALLED_COMMAND} " in text
    path = tmp_path / shipped.name
    path.write_text(text.replace(f"ExecStart={INSTALLED_COMMAND} ", f"ExecStart={command[0]} "))
    return path


def _settings(text: str) -> list[tuple[str, str]]:
    return [tuple(line.split("=", 1)) for line in text.splitlines()
            if "=" in line and not line.lstrip().startswith(("#", ";"))]


def _analyze(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, SYSTEMD_COLORS="0", SYSTEMD_PAGER="", SYSTEMD_LOG_COLOR="0", **(env or {}))
    return subprocess.run(["systemd-analyze", "--no-pager", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def test_unit_verifies_without_warnings(unit):
    proc = _analyze("verify", str(unit))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr


def test_unit_exposure_level_is_low(unit):
    proc = _analyze("security", "--offline=true", str(unit))
    if proc.returncode != 0 and "offline" in proc.stderr:
        pytest.skip(f"this systemd-analyze has no --offline (systemd >= 250 needed): {proc.stderr.strip()}")
    out = _ANSI.sub("", proc.stdout)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out)
    assert m is not None, f"no exposure level in the output:\n{out}\n{proc.stderr}"
    assert float(m[1]) <= MAX_EXPOSURE, out


@pytest.mark.parametrize("shipped", UNITS, ids=lambda p: p.name)
def test_unit_names_only_files_a_standard_install_has(shipped: Path):
    """No host without SASL has /etc/kdaemon/sasl_password: a LoadCredential= of it in the unit
    made systemd refuse to start the service there (243/CREDENTIALS).  Every path the unit names
    must be one the README's install creates on every host, or one systemd creates."""
    text = shipped.read_text()
    named = set()
    for key, value in _settings(text):
        if key.startswith(("LoadCredential", "ImportCredential", "EnvironmentFile")):
            named.add(value.split(":", 1)[-1].lstrip("-"))
        named.update(re.findall(r"(?:^|[\s=:])((?:/|%t/)[\w./%-]+)", value))
    named.update("/var/lib/" + v for k, v in _settings(text) if k == "StateDirectory")
    allowed = STANDARD_INSTALL | CREATED_BY_SYSTEMD | BASE_SYSTEM
    assert named - allowed == set(), f"the unit names files a standard install does not have: {named - allowed}"
    assert not [k for k, _ in _settings(text) if "Credential" in k], "credentials belong in a drop-in"
    readme = (ROOT / "README.md").read_text()
    for path in STANDARD_INSTALL:
        assert path in readme, f"README.md's install steps do not create {path}"
    assert all(os.path.exists(p) for p in BASE_SYSTEM)


def test_sasl_drop_in_verifies_with_the_unit(unit):
    """On a SASL host the drop-in adds the credential: the unit and the drop-in together verify
    clean (systemd-analyze reads the drop-in from the unit's directory, as it reports problems in
    it by its path), and the drop-in passes what the configuration reads."""
    drop_in = unit.parent / f"{unit.name}.d" / SASL_DROP_IN.name
    drop_in.parent.mkdir()
    text = SASL_DROP_IN.read_text()
    assert [s for s in _settings(text)] == [("LoadCredential", "sasl_password:/etc/kdaemon/sasl_password")]
    drop_in.write_text(text)
    proc = _analyze("verify", str(unit), env={"SYSTEMD_UNIT_PATH": f"{unit.parent}:"})
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    # The same run does read the drop-in: a mistake in it is reported.
    drop_in.write_text(text + "NoSuchSetting=1\n")
    proc = _analyze("verify", str(unit), env={"SYSTEMD_UNIT_PATH": f"{unit.parent}:"})
    assert "NoSuchSetting" in proc.stderr, proc.stderr
    readme = (ROOT / "README.md").read_text()
    assert "systemd/kdaemon.service.d/sasl.conf /etc/systemd/system/kdaemon.service.d/sasl.conf" in readme


def test_unit_does_not_restart_what_a_restart_cannot_fix():
    """RestartPreventExitStatus= lists exactly the exit codes kdaemon calls permanent (bad
    configuration, a worker stopped on an error policy, a worker that cannot boot)."""
    values = [v for k, v in _settings(UNIT.read_text()) if k == "RestartPreventExitStatus"]
    assert len(values) == 1 and {int(c) for c in values[0].split()} == set(PERMANENT), values


def test_lag_exporter_unit_restarts_unless_its_configuration_is_wrong():
    """``kdaemon lag-exporter`` exits 2 for a configuration or command line it cannot use (no
    group_id, a topic_pattern, --listen taken), which a restart does not fix; anything else is
    restarted, and the unit starts it with the daemon's own configuration."""
    text = LAG_EXPORTER_UNIT.read_text()
    values = [v for k, v in _settings(text) if k == "RestartPreventExitStatus"]
    assert len(values) == 1 and {int(c) for c in values[0].split()} == {EXIT_CONFIG}, values
    assert ("ExecStart", f"{INSTALLED_COMMAND} lag-exporter -c /etc/kdaemon/kdaemon.toml --listen 127.0.0.1:9465 "
            "--interval 10") in _settings(text)
