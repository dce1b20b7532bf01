"""An example kdaemon plugin: copy this package to start your own.

It offers two things:

* a header filter ``tenant`` — keep only records whose ``tenant`` header is one of
  ``settings.tenants``;
* an interceptor ``redact`` — replace chosen top-level fields of dict values with ``"***"``.

Configuration that uses both (the plugin's entry-point name, ``example``, must be listed in
``plugins``: kdaemon never imports a plugin the configuration did not ask for)::

    plugins = ["json", "example"]

    [[filters]]
    plugin = "tenant"
    settings = { tenants = ["acme", "globex"] }

    [deserializer]
    value = "json"

    [[interceptors]]
    name = "redact"
    settings = { fields = ["email", "card_number"] }

How a plugin works, in three rules:

1. Hooks are plain functions marked with ``@hookimpl``.  kdaemon calls them *once* at start-up
   and they return ``{name: factory}``; a module-level function is enough, no class needed.
2. A factory receives its ``settings`` table (a dict of TOML values) and returns the object the
   worker calls.  Check the settings there with the daemon's own checker: declare the table as
   a frozen dataclass (the annotations say what each key takes, ``setting(...)`` the default,
   the bounds and why a key is required) and call
   ``parse_settings(Dataclass, settings, "", ignore=())`` (``tenant_filter`` says what ``""`` and ``ignore=()`` mean).  It
   returns the typed settings or raises one ``SettingsError`` listing every problem, unknown
   keys included, in the daemon's words (``tenants: expected a non-empty list of tenant ids,
   found string "acme"``); kdaemon shows them under the entry's table
   (``filters[0].settings.tenants: ...``) before the daemon starts consuming.  What the types
   cannot say (here: a list must not be empty) goes in ``check=``.
3. The objects run in the hot loop, so keep per-record work small and never do I/O per record.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from kdaemon.plugins import found, hookimpl, parse_settings, setting
from kdaemon.plugins.types import Record
from kdaemon.protocol.header_match import HeaderRule, HeaderRules


# -- header filter: "tenant" ---------------------------------------------------------------------

@dataclass(frozen=True)
class TenantSettings:
    """The ``settings`` of a ``[[filters]]`` entry naming ``tenant``."""

    tenants: tuple[str, ...] = setting(expected="a non-empty list of tenant ids",   # no default: required
                                       needs="the tenant ids whose records are kept")
    header: str = setting("tenant", pattern=r"(?s).+", expected="a header name")     # not empty


def _tenant_problems(s: TenantSettings) -> Iterator[tuple[str, str]]:
    # Runs once every key has its type: what the types cannot say, as (key, text).
    if not s.tenants:
        yield "tenants", f"expected a non-empty list of tenant ids, found {found([])}"


def tenant_filter(settings: Mapping) -> HeaderRules:
    """``tenants`` (required): tenant ids to keep.  ``header``: the header to read ("tenant").

    A header filter is any ``(headers) -> bool`` callable; ``headers`` is the record's raw
    ``[(str, bytes | None), ...]``.  This one returns ``HeaderRules`` instead of a function:
    the same thing, but the C decoder evaluates it without calling Python for each record, and
    records it drops are never turned into Python objects.  The plain-Python equivalent is::

        wanted = {t.encode() for t in s.tenants}
        def keep(headers):
            value = None
            for key, v in headers:          # the last occurrence wins, as in Kafka
                if key == s.header:
                    value = v
            return value in wanted
        return keep
    """
    # "": the problems' keys are relative to this table (kdaemon puts filters[i].settings in
    # front).  ignore=(): refuse every key the dataclass lacks (the default skips ``type``,
    # which in a [sink] table names the sink).
    s = parse_settings(TenantSettings, settings, "", ignore=(), check=_tenant_problems)
    # One "in" rule; no match (other tenant, header missing or null) → drop.
    return HeaderRules([HeaderRule(s.header, "in", s.tenants)], default=False)


# -- interceptor: "redact" -----------------------------------------------------------------------

class RedactInterceptor:
    """Replaces ``fields`` of dict values with ``mask``.

    Interceptors follow Java's ConsumerInterceptor: ``on_consume`` gets each poll batch before
    the sink and returns the records to pass on (it may drop, change or add records);
    ``on_commit`` is told what was committed.  Return new ``Record`` objects rather than
    mutating the ones you were given: if this interceptor raises halfway through, the next
    one receives the *previous* output, which must still be intact.
    """

    def __init__(self, fields: list[str], mask: str = "***") -> None:
        self.fields = frozenset(fields)
        self.mask = mask

    def on_consume(self, records: list[Record]) -> list[Record]:
        out = []
        for r in records:
            value = r.value
            if isinstance(value, dict) and not self.fields.isdisjoint(value):
                value = {k: (self.mask if k in self.fields else v) for k, v in value.items()}
                r = replace(r, value=value)
            out.append(r)
        return out

    def on_commit(self, offsets: Mapping) -> None:
        pass  # nothing to do; a metrics or audit plugin would look at ``offsets`` here


@dataclass(frozen=True)
class RedactSettings:
    """The ``settings`` of an ``[[interceptors]]`` entry naming ``redact``."""

    fields: tuple[str, ...] = setting(expected="a non-empty list of top-level field names",
                                      needs="the top-level fields of dict values to mask")
    mask: str = "***"


def _redact_problems(s: RedactSettings) -> Iterator[tuple[str, str]]:
    if not s.fields:
        yield "fields", f"expected a non-empty list of top-level field names, found {found([])}"


def redact_interceptor(settings: Mapping) -> RedactInterceptor:
    """``fields`` (required): top-level keys to mask.  ``mask``: the replacement ("***")."""
    s = parse_settings(RedactSettings, settings, "", ignore=(), check=_redact_problems)
    return RedactInterceptor(list(s.fields), s.mask)


# -- the hooks -------------------------------------------------------------------------------------

@hookimpl
def kdaemon_header_filters():
    return {"tenant": tenant_filter}


@hookimpl
def kdaemon_interceptors():
    return {"redact": redact_interceptor}
