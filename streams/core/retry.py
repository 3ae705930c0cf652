"""The retry policy of every call to Trinity (and to the LLM judge), as data: backoff delays
and when to give up.

Trinity being unavailable (5xx, 408, 429, a timeout, a refused connection) is retried with
capped exponential backoff until ``max_age`` seconds have passed since the first attempt; a
rejection (4xx) is never retried. :meth:`RetryPolicy.decide` is that decision for one failed
attempt; the one loop that applies it is :func:`streams.io.retrying.retrying`, used by the live
feedback stage, the live commits and replay alike.

May import: the standard library only.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["GiveUp", "RetryPolicy", "backoff_delays"]


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Stop retrying: why, for the dead letter or the error."""

    reason: str


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Backoff from ``base`` doubling to ``cap`` seconds, for at most ``max_age`` seconds."""

    max_age: float = 3600.0
    base: float = 0.2
    cap: float = 10.0
    service: str = "Trinity"
    """Who is unavailable, in the reason of giving up."""

    def delays(self) -> Iterator[float]:
        return backoff_delays(base=self.base, cap=self.cap)

    def decide(self, attempts: int, elapsed: float, delay: float, error: str) -> float | GiveUp:
        """After failed attempt ``attempts`` (``elapsed`` seconds after the first began): the
        delay to sleep before the next one, or :class:`GiveUp` when the next would start after
        ``max_age``."""
        if elapsed + delay > self.max_age:
            return GiveUp(
                f"{self.service} unavailable for {self.max_age:g}s ({attempts} attempts): {error}"
            )
        return delay


def backoff_delays(
    base: float = 0.2,
    factor: float = 2.0,
    cap: float = 10.0,
    jitter: float = 0.1,
    rng: random.Random | None = None,
) -> Iterator[float]:
    """Yield the delays, in seconds, to sleep before retry 1, 2, 3, ... (endless).

    The n-th delay is ``min(cap, base * factor**n)`` scaled by a uniform factor in
    ``[1 - jitter, 1 + jitter]`` and capped again, so no delay ever exceeds ``cap``. Pass a
    seeded ``random.Random`` for reproducible output; ``jitter=0`` makes it exact.

    >>> from itertools import islice
    >>> list(islice(backoff_delays(base=1, factor=2, cap=5, jitter=0), 5))
    [1.0, 2.0, 4.0, 5.0, 5.0]
    """
    if base <= 0 or not math.isfinite(base):
        raise ValueError(f"base must be a positive number, got {base!r}")
    if factor < 1 or not math.isfinite(factor):
        raise ValueError(f"factor must be >= 1, got {factor!r}")
    if cap < base or not math.isfinite(cap):
        raise ValueError(f"cap must be >= base, got {cap!r}")
    if not 0 <= jitter < 1:
        raise ValueError(f"jitter must be in [0, 1), got {jitter!r}")
    draw = rng if rng is not None else random.Random()
    raw = float(base)
    while True:
        delay = raw * (1.0 + draw.uniform(-jitter, jitter)) if jitter else raw
        yield float(min(cap, delay))
        # Multiply step by step rather than base * factor**n: the power overflows for large n.
        raw = min(cap, raw * factor)
