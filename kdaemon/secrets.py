"""A secret given by reference: the name of an environment variable, or a file.

One definition for every setting that takes a password as ``<key>_env`` or ``<key>_file``
(``[kafka] sasl_password_env``/``_file``, the Schema Registry plugin's ``password_env``/``_file``):
a relative file is looked up under ``$CREDENTIALS_DIRECTORY`` first, where systemd's
``LoadCredential=`` puts it, and one trailing newline is dropped (``echo secret > file``).
A leaf: it imports nothing from kdaemon, so the configuration and the plugins both use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def read_secret(where: str, kind: str, value: str, env: Mapping[str, str]) -> str:
    """The secret named by ``value``: an environment variable (``kind`` ``"env"``) or a file
    (``"file"``).  ``ValueError`` starting with ``where`` (the setting's name) says what is
    missing; the secret itself is never in a message."""
    if not value:
        raise ValueError(f"{where}: must not be empty")
    if kind == "env":
        if value not in env:
            raise ValueError(f"{where}: environment variable {value!r} is not set")
        return env[value]
    if kind != "file":
        raise ValueError(f"{where}: a secret is read from an environment variable or a file, not {kind!r}")
    p = Path(value)
    if not p.is_absolute() and "CREDENTIALS_DIRECTORY" in env:
        p = Path(env["CREDENTIALS_DIRECTORY"]) / p
    try:
        return p.read_text().rstrip("\n")
    except OSError as exc:
        raise ValueError(f"{where}: cannot read {p}: {exc.strerror}") from None
