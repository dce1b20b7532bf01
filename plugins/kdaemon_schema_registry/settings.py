"""``[deserializer.settings.schema_registry]``: where the registry is and how to reach it.

Checked once, in the factory (so ``kdaemon check-config`` reports mistakes), by kdaemon's
settings checker (``kdaemon.settings.parse_settings``): every problem of the table at once,
each naming the key as ``schema_registry.<key>`` (the daemon says
``deserializer.settings.schema_registry.<key>``).  Nothing here opens a connection.

The password may be given inline, or as ``password_env`` (an environment variable) or
``password_file`` (a file; a relative path is looked up under ``$CREDENTIALS_DIRECTORY``, a
systemd credential), as the ``[kafka]`` section's ``sasl_password`` is.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from kdaemon.plugins import SettingsError, found, parse_settings, setting
from kdaemon.secrets import read_secret

TABLE = "schema_registry"
DEFAULT_TIMEOUT_MS = 5_000
DEFAULT_RETRY_BACKOFF_MS = 5_000
_GIVEN = r"(?s).+"   # a string that is not empty


@dataclass(frozen=True)
class RegistryTable:
    """The table as written (``RegistrySettings`` is what the client takes)."""

    url: str | tuple[str, ...] = setting(expected="a URL or a non-empty list of URLs",
                                         needs="the registry's base URL, e.g. \"https://registry:8081\"")
    username: str | None = setting(None, pattern=_GIVEN, expected="a non-empty string")
    password: str | None = setting(None, pattern=_GIVEN, expected="a non-empty string", repr=False)
    password_env: str | None = setting(None, pattern=_GIVEN, expected="an environment variable's name")
    password_file: str | None = setting(None, pattern=_GIVEN, expected="a file name")
    ca_file: str | None = setting(None, pattern=_GIVEN, expected="a file name")
    cert_file: str | None = setting(None, pattern=_GIVEN, expected="a file name")
    key_file: str | None = setting(None, pattern=_GIVEN, expected="a file name")
    verify: bool = True
    timeout_ms: int = setting(DEFAULT_TIMEOUT_MS, min=1, expected="an integer >= 1 (milliseconds)")
    retry_backoff_ms: int = setting(DEFAULT_RETRY_BACKOFF_MS, min=0, expected="an integer >= 0 (milliseconds)")


KEYS = tuple(RegistryTable.__dataclass_fields__)


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
            raise SettingsError(TABLE, [("ca_file", f"cannot load {self.ca_file}: {exc}")]) from None
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except (OSError, ssl.SSLError) as exc:
                raise SettingsError(TABLE, [("cert_file", f"cannot load the client certificate {self.cert_file} "
                                                          f"(key {self.key_file or 'in the same file'}): {exc}")]) \
                    from None
        return ctx


def registry_settings(settings: Mapping, env: Mapping[str, str] | None = None) -> RegistrySettings:
    """``settings["schema_registry"]`` checked; ``SettingsError`` naming every problem."""
    env = os.environ if env is None else env
    table = settings.get(TABLE)
    if table is None:
        raise SettingsError(TABLE, [("", f"required: a [deserializer.settings.{TABLE}] table with "
                                         "url = \"http(s)://host:port\" (the registry's base URL)")])
    secret: list[str] = []   # the password, once read from where the table says
    t = parse_settings(RegistryTable, table, TABLE, ignore=(), check=lambda t: _problems(t, env, secret))
    out = RegistrySettings(_urls(t.url), t.username, secret[0] if secret else None, t.ca_file, t.cert_file,
                           t.key_file, t.verify, t.timeout_ms / 1000, t.retry_backoff_ms / 1000)
    out.ssl_context()   # fail now on unreadable certificate files
    return out


def _urls(url: str | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(u.rstrip("/") for u in ((url,) if isinstance(url, str) else url))


def _problems(t: RegistryTable, env: Mapping[str, str], secret: list[str]) -> Iterator[tuple[str, str]]:
    """What the table's keys say together (and the files and variables they name)."""
    urls = (t.url,) if isinstance(t.url, str) else t.url
    if not urls:
        yield "url", f"expected a URL or a non-empty list of URLs, found {found(list(t.url))}"
    for u in urls:
        parts = urlsplit(u)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            yield "url", f"expected an http:// or https:// URL, found {found(u)}"
        elif parts.username is not None or parts.password is not None:
            yield "url", ("put credentials in username and password(_env/_file), not in the URL (URLs appear in "
                          "error messages)")
        elif parts.query or parts.fragment:
            yield "url", f"{u!r} has a query or fragment; give the base URL only"
    given = [k for k in ("password", "password_env", "password_file") if getattr(t, k) is not None]
    if len(given) > 1:
        yield "", f"give one of {', '.join(given)}, not several"
    elif given == ["password"]:
        secret.append(t.password)
    elif given:
        key = given[0]
        try:
            secret.append(read_secret(f"{TABLE}.{key}", key.rpartition("_")[2], getattr(t, key), env))
        except ValueError as exc:
            yield key, str(exc).partition(": ")[2]
    if given and t.username is None:
        yield "username", "required when a password is given (basic auth)"
    if t.username is not None and not given:
        yield "password", "basic auth needs one of password, password_env, password_file"
    for key in ("ca_file", "cert_file", "key_file"):
        value = getattr(t, key)
        if value is not None and not Path(value).is_file():
            yield key, f"{value} does not exist or is not a file"
    if t.key_file and not t.cert_file:
        yield "key_file", "given without cert_file (the client certificate)"
    if (t.ca_file or t.cert_file or not t.verify) and not any(u.startswith("https:") for u in urls):
        yield "", f"ca_file, cert_file and verify apply to https URLs only; url is {', '.join(urls)}"
