"""One exponential backoff for every "wait, then try again" in kdaemon.

The sink retry and rewind in the worker, the supervisor's restarts of workers and side
processes, the client's reconnects and commit retries all wait ``initial * multiplier ** n``
seconds after the n-th consecutive failure, capped at ``maximum``, and start again from
``initial`` after a success.  Writing that formula once keeps their behaviour the same and
their log lines honest (the delay logged is the delay taken).

A leaf module: it imports nothing from kdaemon, so every layer may use it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Exponential backoff with an optional symmetric jitter.

    ``failure()`` records one more failure and returns the delay to wait before the next
    attempt; ``reset()`` forgets the failures after a success.  ``jitter`` of 0.2 spreads each
    delay over [0.8, 1.2] of its nominal value (the Java client's reconnect jitter), so many
    clients that failed together do not retry together.
    """

    initial: float
    maximum: float
    multiplier: float = 2.0
    jitter: float = 0.0
    failures: int = field(default=0)

    def __post_init__(self) -> None:
        if self.initial < 0 or self.maximum < 0:
            raise ValueError(f"backoff delays must not be negative (initial={self.initial}, "
                             f"maximum={self.maximum})")
        if self.multiplier < 1:
            raise ValueError(f"backoff multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {self.jitter}")

    def delay(self, failures: int | None = None) -> float:
        """The nominal delay after ``failures`` consecutive failures (default: the current
        count); no jitter, no change of state.  0 failures means no wait."""
        n = self.failures if failures is None else failures
        if n <= 0:
            return 0.0
        # Cap the exponent so a long outage cannot overflow the float.
        return min(self.maximum, self.initial * self.multiplier ** min(n - 1, 64))

    def failure(self) -> float:
        """Count one more failure and return the (jittered) delay before the next attempt."""
        self.failures += 1
        d = self.delay()
        if self.jitter:
            d *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return d

    def reset(self) -> None:
        """A success: the next failure waits ``initial`` again."""
        self.failures = 0
