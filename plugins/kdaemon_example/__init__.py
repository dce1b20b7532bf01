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
   worker calls.  Check the settings there and raise ``ValueError`` with a message an operator
   can act on: it is shown as a configuration error before the daemon starts consuming.
3. The objects run in the hot loop, so keep per-record work small and never do I/O per record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kdaemon.plugins import hookimpl
from kdaemon.plugins.types import Record
from kdaemon.protocol.header_match import HeaderRule, HeaderRules


# -- header filter: "tenant" ---------------------------------------------------------------------

def tenant_filter(settings: dict) -> HeaderRules:
    """``tenants`` (required): tenant ids to keep.  ``header``: the header to read ("tenant").

    A header filter is any ``(headers) -> bool`` callable; ``headers`` is the record's raw
    ``[(str, bytes | None), ...]``.  This one returns ``HeaderRules`` instead of a function:
    the same thing, but the C decoder evaluates it without calling Python for each record, and
    records it drops are never turned into Python objects.  The plain-Python equivalent is::

        wanted = {t.encode() for t in tenants}
        def keep(headers):
            value = None
            for key, v in headers:          # the last occurrence wins, as in Kafka
                if key == header:
                    value = v
            return value in wanted
        return keep
    """
    _refuse_unknown("tenant", settings, {"tenants", "header"})
    tenants = settings.get("tenants")
    if not isinstance(tenants, list) or not tenants or not all(isinstance(t, str) for t in tenants):
        raise ValueError("tenant needs tenants: a non-empty list of tenant ids to keep")
    header = settings.get("header", "tenant")
    if not isinstance(header, str) or not header:
        raise ValueError(f"header must be a header name, not {header!r}")
    # One "in" rule; no match (other tenant, header missing or null) → drop.
    return HeaderRules([HeaderRule(header, "in", tuple(tenants))], default=False)


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


def redact_interceptor(settings: dict) -> RedactInterceptor:
    """``fields`` (required): top-level keys to mask.  ``mask``: the replacement ("***")."""
    _refuse_unknown("redact", settings, {"fields", "mask"})
    fields = settings.get("fields")
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields):
        raise ValueError("redact needs fields: a non-empty list of top-level field names")
    mask = settings.get("mask", "***")
    if not isinstance(mask, str):
        raise ValueError(f"mask must be a string, not {mask!r}")
    return RedactInterceptor(fields, mask)


def _refuse_unknown(what: str, settings: dict, known: set[str]) -> None:
    # A typo in a setting should stop the daemon at start-up, not be silently ignored.
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"unknown {what} setting(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")


# -- the hooks -------------------------------------------------------------------------------------

@hookimpl
def kdaemon_header_filters():
    return {"tenant": tenant_filter}


@hookimpl
def kdaemon_interceptors():
    return {"redact": redact_interceptor}
