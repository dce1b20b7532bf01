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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from kdaemon.plugins import hookimpl
from kdaemon.plugins.types import Record

log = logging.getLogger(__name__)


class TtlInterceptor:
    """Keeps records younger than ``max_age_ms``.  ``clock`` returns epoch milliseconds."""

    def __init__(self, max_age_ms: int, *, clock: Callable[[], float] | None = None) -> None:
        self.max_age_ms = max_age_ms
        self._clock = clock or (lambda: time.time() * 1000.0)
        self.dropped = 0   # total, for logs and tests

    @classmethod
    def from_settings(cls, settings: dict) -> TtlInterceptor:
        unknown = sorted(set(settings) - {"max_age_ms"})
        if unknown:
            raise ValueError(f"unknown ttl setting(s): {', '.join(unknown)} (known: max_age_ms)")
        if "max_age_ms" not in settings:
            raise ValueError("ttl needs max_age_ms: records older than this many milliseconds are dropped")
        max_age = settings["max_age_ms"]
        if not isinstance(max_age, int) or isinstance(max_age, bool) or max_age <= 0:
            raise ValueError(f"max_age_ms must be a positive integer, not {max_age!r}")
        return cls(max_age)

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
