"""A password given by reference (``kdaemon/secrets.py``), as the ``[kafka]`` section and the Schema
Registry plugin both read it: the same lookups and the same errors, named by the setting."""

from __future__ import annotations

import pytest

from kdaemon.config import ConfigError, load
from kdaemon.secrets import read_secret
from kdaemon_schema_registry.settings import registry_settings

CONFIG = """
[daemon]
topics = ["t"]

[kafka]
bootstrap_servers = "localhost:9092"
group_id = "g"
security_protocol = "SASL_PLAINTEXT"
sasl_mechanism = "PLAIN"
sasl_username = "u"
{secret}

[sink]
type = "null"
"""


def test_a_file_is_read_under_the_credentials_directory_and_loses_one_newline(tmp_path):
    (tmp_path / "pw").write_text("s3cret\n\n")
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    assert read_secret("x.password_file", "file", "pw", env) == "s3cret"   # rstrip("\n"): all trailing newlines
    assert read_secret("x.password_file", "file", str(tmp_path / "pw"), {}) == "s3cret"
    assert read_secret("x.password_env", "env", "PW", {"PW": "p\n"}) == "p\n"   # a variable is taken verbatim


@pytest.mark.parametrize("kind, value, env, message", [
    ("env", "PW", {}, "x.k: environment variable 'PW' is not set"),
    ("file", "nope", {}, "x.k: cannot read nope: No such file or directory"),
    ("env", "", {}, "x.k: must not be empty"),
    ("vault", "PW", {"PW": "p"}, "x.k: a secret is read from an environment variable or a file, not 'vault'"),
])
def test_what_is_missing_is_named_and_the_secret_never_is(kind, value, env, message):
    with pytest.raises(ValueError) as failed:
        read_secret("x.k", kind, value, env)
    assert str(failed.value) == message


def test_the_kafka_section_and_the_registry_plugin_read_the_same_way(tmp_path, monkeypatch):
    (tmp_path / "pw").write_text("from-file\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(tmp_path))
    config = tmp_path / "kdaemon.toml"
    config.write_text(CONFIG.format(secret='sasl_password_file = "pw"'))
    assert load(config, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)}).kafka["sasl_password"] == "from-file"
    registry = registry_settings({"schema_registry": {"url": "http://r:8081", "username": "u", "password_file": "pw"}})
    assert registry.password == "from-file"

    config.write_text(CONFIG.format(secret='sasl_password_file = "missing"'))
    with pytest.raises(ConfigError, match=r"kafka\.sasl_password_file: cannot read .*missing: No such file"):
        load(config, environ={"CREDENTIALS_DIRECTORY": str(tmp_path)})
    with pytest.raises(ValueError, match=r"^schema_registry\.password_file: cannot read .*missing: No such file"):
        registry_settings({"schema_registry": {"url": "http://r:8081", "username": "u", "password_file": "missing"}})
