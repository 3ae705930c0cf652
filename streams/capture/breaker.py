"""The policy's circuit breaker: when the gateway stops sending requests to Trinity, and when it
tries again. A pure state machine over an injected clock (no I/O, no asyncio); the gateway's
:class:`~.gateway.policy.PolicyUpstream` asks it before each request and tells it each outcome.

=============  ===========================================================================
state          what a request of a call routed to the policy does
=============  ===========================================================================
``closed``     goes to Trinity. The breaker opens after ``failures`` consecutive failures,
               or when at least ``min_requests`` requests of the last ``window_s`` seconds
               were made and ``failure_rate`` of them failed, or at once on a failure that
               carries a ``Retry-After`` (Trinity said when to come back).
``open``       goes to production, at no added latency, for ``cooldown_s`` (at least the
               ``Retry-After`` Trinity gave, at most ``max_cooldown_s``); then half-open.
``half_open``  up to ``probes`` requests go to Trinity (the others to production): once
               ``probes`` of them succeeded the breaker closes; one failure opens it again.
=============  ===========================================================================

An outcome counts only in the stretch of state its request was admitted in (each admission
returns a ticket that names it): an answer that arrives after the breaker moved on says
nothing about the state it is in now. The one exception: while open, a late failure that carries
a longer ``Retry-After`` lengthens the cool-down.

The failure rate is counted in ten buckets over ``window_s``, so a success is O(1) and a
failure O(10). Each gateway replica has its own breaker and decides alone.

May import: the standard library only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "Breaker", "BreakerConfig", "Transition"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

_BUCKETS = 10


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    """The thresholds (``gateway.breaker``, :class:`streams.settings.BreakerSettings`)."""

    failures: int = 5
    failure_rate: float = 0.5
    window_s: float = 30.0
    min_requests: int = 20
    cooldown_s: float = 10.0
    max_cooldown_s: float = 300.0
    probes: int = 3

    def __post_init__(self) -> None:
        if self.failures < 1 or self.min_requests < 1 or self.probes < 1:
            raise ValueError("failures, min_requests and probes must be at least 1")
        if not 0 < self.failure_rate <= 1:
            raise ValueError("failure_rate must be in (0, 1]")
        if self.window_s <= 0 or self.cooldown_s <= 0 or self.max_cooldown_s < self.cooldown_s:
            raise ValueError("window_s, cooldown_s > 0 and max_cooldown_s >= cooldown_s")


@dataclass(frozen=True, slots=True)
class Transition:
    """One change of state: from ``before`` to ``after`` at clock time ``at``, and why."""

    before: str
    after: str
    at: float
    why: str
    cooldown_s: float | None = None
    """Opening: how long until half-open."""


class Breaker:
    """The breaker of one gateway process (see the module docstring).

    >>> t = [0.0]
    >>> b = Breaker(BreakerConfig(failures=2, cooldown_s=5, probes=1), clock=lambda: t[0])
    >>> for _ in range(2):
    ...     b.failure(b.admit(), "connect")
    >>> b.state, b.admit()
    ('open', None)
    >>> t[0] = 5.0
    >>> probe = b.admit()
    >>> b.state, b.admit()
    ('half_open', None)
    >>> b.success(probe)
    >>> b.state
    'closed'
    """

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[Transition], None] | None = None,
    ) -> None:
        self.config = config or BreakerConfig()
        self.clock = clock
        self.on_change = on_change
        self.state = CLOSED
        self.since = clock()
        """Clock time of the last transition."""
        self.why = ""
        """Why the last transition happened."""
        self.open_until = 0.0
        """While open: when it turns half-open."""
        self.consecutive = 0
        self._epoch = 0
        self._probes_out = 0
        self._probes_ok = 0
        self._width = self.config.window_s / _BUCKETS
        self._buckets: deque[list[float]] = deque()  # [start, requests, failures]

    # -- asked before each request -------------------------------------------------------------

    def admit(self) -> int | None:
        """May a request go to Trinity now? A ticket to hand back with its outcome, or None:
        send it to production. Open past its cool-down turns half-open here."""
        state = self.state
        if state == CLOSED:
            return self._epoch << 1
        if state == OPEN:
            if self.clock() < self.open_until:
                return None
            self._move(HALF_OPEN, "cool-down over: probing")
        if self._probes_out + self._probes_ok >= self.config.probes:
            return None
        self._probes_out += 1
        return self._epoch << 1 | 1

    # -- told after each request ---------------------------------------------------------------

    def success(self, ticket: int | None) -> None:
        """The request of ``ticket`` was answered (a first byte, a status that is no failure)."""
        if ticket is None or ticket >> 1 != self._epoch:
            return
        if self.state == CLOSED:
            self.consecutive = 0
            self._count(False)
        elif ticket & 1:  # a probe of this half-open stretch
            self._probes_out = max(0, self._probes_out - 1)
            self._probes_ok += 1
            if self._probes_ok >= self.config.probes:
                self._move(CLOSED, f"{self._probes_ok} probe(s) answered")

    def failure(self, ticket: int | None, why: str, retry_after_s: float | None = None) -> None:
        """The request of ``ticket`` failed (``why``: reason and detail); ``retry_after_s``:
        the ``Retry-After`` Trinity answered with, if any."""
        if self.state == OPEN:
            if retry_after_s is not None:  # even a late one: Trinity said when to come back
                until = self.clock() + min(retry_after_s, self.config.max_cooldown_s)
                self.open_until = max(self.open_until, until)
            return
        if ticket is None or ticket >> 1 != self._epoch:
            return
        if self.state == HALF_OPEN:
            if ticket & 1:
                self._open(f"probe failed: {why}", retry_after_s)
            return
        self.consecutive += 1
        requests, failures = self._count(True)
        c = self.config
        if retry_after_s is not None:
            self._open(f"Trinity asked to retry after {retry_after_s:g}s: {why}", retry_after_s)
        elif self.consecutive >= c.failures:
            self._open(f"{self.consecutive} consecutive failures, the last: {why}", None)
        elif requests >= c.min_requests and failures >= c.failure_rate * requests:
            self._open(
                f"{failures:.0f} of {requests:.0f} requests failed in {c.window_s:g}s, the "
                f"last: {why}",
                None,
            )

    def release(self, ticket: int | None) -> None:
        """The request of ``ticket`` ended without an outcome (the client went away): its
        probe slot, if it had one, is free again."""
        if ticket is not None and ticket & 1 and ticket >> 1 == self._epoch:
            self._probes_out = max(0, self._probes_out - 1)

    # -- inside --------------------------------------------------------------------------------

    def _open(self, why: str, retry_after_s: float | None) -> None:
        c = self.config
        cooldown = c.cooldown_s if retry_after_s is None else max(c.cooldown_s, retry_after_s)
        cooldown = min(cooldown, c.max_cooldown_s)
        self.open_until = self.clock() + cooldown
        self._move(OPEN, why, cooldown)

    def _move(self, state: str, why: str, cooldown: float | None = None) -> None:
        before, self.state, self.why = self.state, state, why
        self._epoch += 1
        self._probes_out = self._probes_ok = 0
        self.since = self.clock()
        if state == CLOSED:
            self.consecutive = 0
            self._buckets.clear()
        if self.on_change is not None:
            self.on_change(Transition(before, state, self.since, why, cooldown))

    def _count(self, failed: bool) -> tuple[float, float]:
        """Count one outcome in the window; the window's (requests, failures) after a failure
        (after a success: nothing summed, (0, 0))."""
        now = self.clock()
        buckets = self._buckets
        horizon = now - self.config.window_s
        while buckets and buckets[0][0] <= horizon:
            buckets.popleft()
        if not buckets or now >= buckets[-1][0] + self._width:
            buckets.append([now, 0.0, 0.0])
        last = buckets[-1]
        last[1] += 1
        if not failed:
            return 0.0, 0.0
        last[2] += 1
        return sum(b[1] for b in buckets), sum(b[2] for b in buckets)
