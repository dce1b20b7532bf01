"""``[deserializer.settings.schema_registry]``: where the registry is and how to reach it.

Checked once, in the factory (so ``kdaemon check-config`` reports mistakes), with messages
naming the key as ``schema_registry.<key>``.  Nothing here opens a connection.

The password may be given inline, or as ``password_env`` (an environment variable) or
``password_file`` (a file; a relative path is looked up under ``$CREDENTIALS_DIRECTORY``, a
systemd credential), as the ``[kafka]`` section's ``sasl_password`` is.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from kdaemon.secrets import read_secret

TABLE = "schema_registry"
KEYS = ("url", "username", "password", "password_env", "password_file", "ca_file", "cert_file",
        "key_file", "verify", "timeout_ms", "retry_backoff_ms")
DEFAULT_TIMEOUT_MS = 5_000
DEFAULT_RETRY_BACKOFF_MS = 5_000


@dataclass(frozen=True)
class RegistrySettings:
    """The validated table.  Hashable: equal settings share one client (and its caches)."""

    urls: tuple[str, ...]
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000
    retry_backoff_s: float = DEFAULT_RETRY_BACKOFF_MS / 1000

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for https URLs (None when every URL is http).  Reads the files now,
        so a missing or wrong one fails at start-up, naming the key."""
        if not any(u.startswith("https:") for u in self.urls):
            return None
        try:
            ctx = ssl.create_default_context(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{TABLE}.ca_file: cannot load {self.ca_file}: {exc}") from None
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"{TABLE}.cert_file/key_file: cannot load the client certificate "
                                 f"{self.cert_file} (key {self.key_file or 'in the same file'}): {exc}") from None
        return ctx


def registry_settings(settings: Mapping, env: Mapping[str, str] | None = None) -> RegistrySettings:
    """Validate ``settings["schema_registry"]``; raises ``ValueError`` naming the bad key."""
    env = os.environ if env is None else env
    table = settings.get(TABLE)
    if table is None:
        raise ValueError(f"needs a [deserializer.settings.{TABLE}] table with url = \"http(s)://host:port\" "
                         "(the registry's base URL)")
    if not isinstance(table, Mapping):
        raise ValueError(f"{TABLE} must be a table (url = ..., username = ..., ...), not {table!r}")
    unknown = sorted(set(table) - set(KEYS))
    if unknown:
        raise ValueError(f"{TABLE}: unknown key(s) {', '.join(unknown)} (known: {', '.join(KEYS)})")

    urls = _urls(table.get("url"))
    username = _optional_str(table, "username")
    password = _password(table, env)
    if password is not None and username is None:
        raise ValueError(f"{TABLE}.username: required when a password is given (basic auth)")
    if username is not None and password is None:
        raise ValueError(f"{TABLE}.password: basic auth needs one of password, password_env, password_file")
    ca_file, cert_file, key_file = (_optional_path(table, k) for k in ("ca_file", "cert_file", "key_file"))
    if key_file and not cert_file:
        raise ValueError(f"{TABLE}.key_file: given without cert_file (the client certificate)")
    verify = table.get("verify", True)
    if not isinstance(verify, bool):
        raise ValueError(f"{TABLE}.verify must be true or false, not {verify!r}")
    if (ca_file or cert_file or not verify) and not any(u.startswith("https:") for u in urls):
        raise ValueError(f"{TABLE}: ca_file, cert_file and verify apply to https URLs only; url is "
                         f"{', '.join(urls)}")
    out = RegistrySettings(urls, username, password, ca_file, cert_file, key_file, verify,
                           _millis(table, "timeout_ms", DEFAULT_TIMEOUT_MS, minimum=1) / 1000,
                           _millis(table, "retry_backoff_ms", DEFAULT_RETRY_BACKOFF_MS, minimum=0) / 1000)
    out.ssl_context()   # fail now on unreadable certificate files
    return out


def _urls(value) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if value is None:
        raise ValueError(f"{TABLE}.url: required: the registry's base URL, e.g. \"https://registry:8081\"")
    if not isinstance(items, list) or not items or not all(isinstance(u, str) for u in items):
        raise ValueError(f"{TABLE}.url must be a URL or a non-empty list of URLs, not {value!r}")
    out = []
    for u in items:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{TABLE}.url: {u!r} is not an http:// or https:// URL")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"{TABLE}.url: put credentials in username and password(_env/_file), "
                             "not in the URL (URLs appear in error messages)")
        if parts.query or parts.fragment:
            raise ValueError(f"{TABLE}.url: {u!r} has a query or fragment; give the base URL only")
        out.append(u.rstrip("/"))
    return tuple(out)


def _optional_str(table: Mapping, key: str) -> str | None:
    value = table.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"{TABLE}.{key} must be a non-empty string, not {value!r}")
    return value


def _optional_path(table: Mapping, key: str) -> str | None:
    value = _optional_str(table, key)
    if value is not None and not Path(value).is_file():
        raise ValueError(f"{TABLE}.{key}: {value} does not exist or is not a file")
    return value


def _password(table: Mapping, env: Mapping[str, str]) -> str | None:
    given = [k for k in ("password", "password_env", "password_file") if k in table]
    if len(given) > 1:
        raise ValueError(f"{TABLE}: give one of {', '.join(given)}, not several")
    if not given:
        return None
    key = given[0]
    value = _optional_str(table, key)
    if key == "password":
        return value
    return read_secret(f"{TABLE}.{key}", key.rpartition("_")[2], value, env)


def _millis(table: Mapping, key: str, default: int, minimum: int) -> int:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{TABLE}.{key} must be an integer >= {minimum} (milliseconds), not {value!r}")
    return value
