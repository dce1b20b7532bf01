"""Bundled plugin ``ttl``: drop records older than ``max_age_ms`` (the ConsumerInterceptorTTL
of the Kafka consumer books, as a kdaemon interceptor)::

    [[interceptors]]
    name = "ttl"
    settings = { max_age_ms = 10000 }

Age is "now" minus the record timestamp (CreateTime or LogAppendTime, whichever the topic
uses); a record is kept while ``now - timestamp < max_age_ms``.  Records without a timestamp
(-1, from pre-0.10 message formats) and records stamped in the future are kept: their age is
unknown, and dropping data on a guess is worse than delivering it.

A dropped record is simply not returned: the worker still commits its offset, exactly as
Java does for records an interceptor filters out.  Nothing is re-delivered later.

The settings are checked by the daemon's checker (``parse_settings``), so a problem reads as
the daemon's own: ``interceptors[0].settings.max_age_ms: expected a positive integer, found
integer 0``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kdaemon.plugins import hookimpl, parse_settings, setting
from kdaemon.plugins.types import Record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TtlSettings:
    """The ``settings`` of an ``[[interceptors]]`` entry naming ``ttl``."""

    max_age_ms: int = setting(min=1, needs="records older than this many milliseconds are dropped")


class TtlInterceptor:
    """Keeps records younger than ``max_age_ms``.  ``clock`` returns epoch milliseconds."""

    def __init__(self, max_age_ms: int, *, clock: Callable[[], float] | None = None) -> None:
        self.max_age_ms = max_age_ms
        self._clock = clock or (lambda: time.time() * 1000.0)
        self.dropped = 0   # total, for logs and tests

    @classmethod
    def from_settings(cls, settings: Mapping) -> TtlInterceptor:
        """``SettingsError`` naming every problem of ``settings`` (each key relative to it: the
        daemon puts the entry's ``interceptors[i].settings`` in front).  ``ignore=()``: no key
        of this table is skipped (the default skips a sink table's ``type``)."""
        return cls(parse_settings(TtlSettings, settings, "", ignore=()).max_age_ms)

    def on_consume(self, records: list[Record]) -> list[Record]:
        oldest_kept = self._clock() - self.max_age_ms  # keep while now - ts < max_age
        kept = [r for r in records if r.timestamp < 0 or r.timestamp > oldest_kept]
        self.dropped += len(records) - len(kept)
        return kept

    def on_commit(self, offsets: Mapping) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("ttl: committed %s; %d expired record(s) dropped so far",
                      ", ".join(f"{tp}@{om.offset}" for tp, om in offsets.items()), self.dropped)


@hookimpl
def kdaemon_interceptors():
    return {"ttl": TtlInterceptor.from_settings}
