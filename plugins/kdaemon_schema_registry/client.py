"""A Schema Registry client: fetch schemas by id (and referenced schemas by subject version).

Only what a consumer needs: ``GET /schemas/ids/{id}`` and ``GET /subjects/{subject}/versions/{v}``
of the Confluent REST API (Apicurio serves it under ``/apis/ccompat/v7``), over the standard
library's urllib (no HTTP dependency), with basic auth and TLS from ``RegistrySettings``.

Caching, and why it is safe:

* A schema id, and a subject's numbered version, never change meaning: they are cached for the
  life of the process and a record whose schema is cached never waits for the registry.
* A 404 for an id is remembered for ``retry_backoff_s``: a topic full of records with an unknown
  id costs one request per backoff, not one per record.
* Any other failure (no connection, timeout, TLS, 5xx, 401/403) is about the registry, not the
  id: for ``retry_backoff_s`` every schema not cached fails at once with the last error, so an
  outage costs at most one ``timeout_s`` wait per backoff and never stalls a partition for long.

Every error is a ``kdaemon_schema_registry.errors.SchemaRegistryError`` naming what was asked
(``schema id 7``), the URL and the status.  One client per process and settings, used by the
worker's thread only (the worker deserializes on one thread), so no locking.
"""

from __future__ import annotations

import base64
import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.error import HTTPError, URLError
from urllib.parse import quote
from urllib.request import HTTPSHandler, ProxyHandler, Request, build_opener

from .errors import RegistryError, RegistryUnavailable, SchemaNotFound
from .settings import RegistrySettings

ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"
MAX_DETAIL = 200                   # characters of the registry's error message kept in ours
NOT_FOUND_CODES = {40401, 40402, 40403}   # subject, version, schema not found
RETRYABLE_STATUS = {408, 429}      # and every 5xx


@dataclass(frozen=True)
class SchemaReference:
    """A named type the schema uses, defined by another subject's version."""

    name: str
    subject: str
    version: int


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry returns it; ``schema_type`` is AVRO when the registry omits it."""

    schema: str
    schema_type: str = "AVRO"
    references: tuple[SchemaReference, ...] = ()


class SchemaRegistryClient:
    def __init__(self, settings: RegistrySettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        handlers: list = [ProxyHandler({})]   # environment proxies are not used
        ctx = settings.ssl_context()
        if ctx is not None:
            handlers.append(HTTPSHandler(context=ctx))
        self._opener = build_opener(*handlers)
        self._headers = {"Accept": ACCEPT}
        if settings.username is not None:
            token = base64.b64encode(f"{settings.username}:{settings.password}".encode()).decode("ascii")
            self._headers["Authorization"] = f"Basic {token}"
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_version: dict[tuple[str, int], RegisteredSchema] = {}
        self._not_found: dict[object, tuple[float, str]] = {}   # key -> (until, message)
        self._down: tuple[float, str, type] | None = None       # (until, message, error class)
        self._next_url = 0      # index of the URL that answered last
        self.requests = 0       # HTTP requests sent (for tests and metrics)

    # -- the two lookups --------------------------------------------------------------------

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        found = self._by_id.get(schema_id)
        if found is None:
            found = self._fetch(schema_id, f"/schemas/ids/{schema_id}", f"schema id {schema_id}")
            self._by_id[schema_id] = found
        return found

    def schema_by_version(self, subject: str, version: int) -> RegisteredSchema:
        key = (subject, version)
        found = self._by_version.get(key)
        if found is None:
            found = self._fetch(key, f"/subjects/{quote(subject, safe='')}/versions/{version}",
                                f"subject {subject!r} version {version}")
            self._by_version[key] = found
        return found

    # -- fetching, with the negative caches -------------------------------------------------

    def _fetch(self, key: object, path: str, what: str) -> RegisteredSchema:
        now = self._clock()
        missing = self._not_found.get(key)
        if missing is not None:
            if now < missing[0]:
                raise SchemaNotFound(f"{missing[1]} (remembered; asking again in "
                                     f"{missing[0] - now:.1f} s)", 404)
            del self._not_found[key]
        if self._down is not None:
            until, message, error = self._down
            if now < until:
                raise error(f"{what}: not asked, the registry failed "
                            f"{now - (until - self.settings.retry_backoff_s):.1f} s ago "
                            f"({message}); asking again in {until - now:.1f} s")
            self._down = None
        backoff = self.settings.retry_backoff_s
        try:
            body, url = self._get(path, what)
            return _registered(body, what, url)
        except SchemaNotFound as exc:
            if backoff:
                self._not_found[key] = (self._clock() + backoff, str(exc))
            raise
        except (RegistryUnavailable, RegistryError) as exc:
            if backoff:
                self._down = (self._clock() + backoff, str(exc), type(exc))
            raise

    def _get(self, path: str, what: str) -> tuple[object, str]:
        """The decoded JSON answer and the URL that gave it; tries each URL in turn while
        they give no answer (a 4xx is an answer and is raised at once)."""
        urls = self.settings.urls
        unavailable: list[str] = []
        for i in range(len(urls)):
            index = (self._next_url + i) % len(urls)
            try:
                body = self._request(urls[index] + path, what)
            except RegistryUnavailable as exc:
                unavailable.append(str(exc))
                continue
            self._next_url = index
            return body
        if len(unavailable) == 1:
            raise RegistryUnavailable(unavailable[0])
        raise RegistryUnavailable(f"{what}: no registry URL answered: " + "; ".join(unavailable))

    def _request(self, url: str, what: str) -> tuple[object, str]:
        self.requests += 1
        request = Request(url, headers=self._headers)
        try:
            with self._opener.open(request, timeout=self.settings.timeout_s) as response:
                raw = response.read()
        except HTTPError as exc:
            raise _status_error(exc, url, what) from None
        except (URLError, OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, URLError) else exc
            if isinstance(reason, TimeoutError) or "timed out" in str(reason):
                reason = f"no answer within {self.settings.timeout_s:g} s (timeout_ms)"
            raise RegistryUnavailable(f"{what}: GET {url} failed: {reason}") from None
        try:
            return json.loads(raw), url
        except ValueError:
            raise RegistryError(f"{what}: GET {url} answered HTTP 200 with a body that is not JSON: "
                                "is url the registry's base URL?", 200) from None


def _status_error(exc: HTTPError, url: str, what: str) -> Exception:
    status = exc.code
    try:
        raw = exc.read()
    except (OSError, http.client.HTTPException):
        raw = b""
    code, message = _error_body(raw)
    detail = f" (error_code {code}: {message})" if code is not None else \
        (f" ({message})" if message else "")
    head = f"{what}: GET {url} answered HTTP {status}"
    if status == 404 and (code in NOT_FOUND_CODES or (code is None and message)):
        return SchemaNotFound(f"{what}: not found in the registry: GET {url} answered HTTP 404{detail}", 404, code)
    if status == 404:
        return RegistryError(f"{head} without a registry error: is url the registry's base URL "
                             "(Apicurio: http://host:port/apis/ccompat/v7)?", 404)
    if status >= 500 or status in RETRYABLE_STATUS:
        return RegistryUnavailable(f"{head}{detail}")
    if status in (401, 403):
        return RegistryError(f"{head}{detail}: check schema_registry.username and password", status, code)
    return RegistryError(f"{head}{detail}", status, code)


def _error_body(raw: bytes) -> tuple[int | None, str]:
    """(error_code, message) of a registry error body; (None, '') when it is not one."""
    try:
        body = json.loads(raw)
    except ValueError:
        return None, ""
    if not isinstance(body, dict):
        return None, ""
    code = body.get("error_code")
    message = str(body.get("message") or "")[:MAX_DETAIL]
    return (code if isinstance(code, int) else None), message


def _registered(body: object, what: str, url: str) -> RegisteredSchema:
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(f"{what}: GET {url} answered without a \"schema\" string: "
                            "is url the registry's base URL?", 200)
    refs = []
    for ref in body.get("references") or ():
        try:
            refs.append(SchemaReference(str(ref["name"]), str(ref["subject"]), int(ref["version"])))
        except (KeyError, TypeError, ValueError):
            raise RegistryError(f"{what}: GET {url} answered with a malformed reference {ref!r}", 200) from None
    return RegisteredSchema(body["schema"], str(body.get("schemaType") or "AVRO").upper(), tuple(refs))
