"""One thread at a time in a consumer, as Java's KafkaConsumer and KafkaShareConsumer insist.

Both consumers take their owner lock without blocking on every public call: a second thread
fails at once with the reason instead of interleaving requests on shared state.  The lock is
re-entrant, so the owning thread may call in again from a callback (a rebalance listener's
``commit()`` inside ``poll()``, as Java allows); ``wakeup()`` never takes it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager


@contextmanager
def owned(lock: threading.RLock, what: str):
    """Hold ``lock`` for the call, or raise at once: ``what`` (the class's name) is not safe for
    use by several threads."""
    if not lock.acquire(blocking=False):
        raise RuntimeError(f"{what} is not safe for use by several threads at once "
                           "(only wakeup() may be called from another thread)")
    try:
        yield
    finally:
        lock.release()
