"""A minimal single-threaded future for request results.

Callbacks run on the thread that completes the future (the one driving the network client),
never concurrently with each other.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

log = logging.getLogger(__name__)

_PENDING = object()


class Future:
    __slots__ = ("_value", "_exception", "_callbacks", "_errbacks")

    def __init__(self) -> None:
        self._value: Any = _PENDING
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[Any], None]] = []
        self._errbacks: list[Callable[[BaseException], None]] = []

    @property
    def done(self) -> bool:
        return self._value is not _PENDING or self._exception is not None

    @property
    def failed(self) -> bool:
        return self._exception is not None

    @property
    def exception(self) -> BaseException | None:
        return self._exception

    def value(self) -> Any:
        if self._exception is not None:
            raise self._exception
        if self._value is _PENDING:
            raise RuntimeError("future is not done")
        return self._value

    def success(self, value: Any) -> "Future":
        if self.done:
            raise RuntimeError("future completed twice")
        self._value = value
        for cb in self._callbacks:
            _run(cb, value)
        self._callbacks.clear()
        self._errbacks.clear()
        return self

    def failure(self, exc: BaseException) -> "Future":
        if self.done:
            raise RuntimeError("future completed twice")
        self._exception = exc
        for eb in self._errbacks:
            _run(eb, exc)
        self._callbacks.clear()
        self._errbacks.clear()
        return self

    def add_callback(self, fn: Callable[[Any], None]) -> "Future":
        if self._exception is None:
            if self._value is not _PENDING:
                fn(self._value)
            else:
                self._callbacks.append(fn)
        return self

    def add_errback(self, fn: Callable[[BaseException], None]) -> "Future":
        if self._exception is not None:
            fn(self._exception)
        elif self._value is _PENDING:
            self._errbacks.append(fn)
        return self

    def add_both(self, fn: Callable[[Any], None]) -> "Future":
        self.add_callback(fn)
        self.add_errback(fn)
        return self

    def chain(self, other: "Future") -> "Future":
        self.add_callback(other.success)
        self.add_errback(other.failure)
        return self


def _run(fn: Callable[[Any], None], arg: Any) -> None:
    # One failing callback must not stop the others (nor unwind the network loop that
    # completed the future): log it and go on.
    try:
        fn(arg)
    except Exception:
        log.exception("future callback %r raised", fn)
