"""The one retry loop of the package, for every HTTP service (Trinity, the LLM judge).

:func:`retrying` awaits a call until it answers, retrying what the service's exception says is
retriable (:attr:`~streams.errors.TrajstreamError.retriable`: 5xx, 408, 429, a timeout, a
refused connection) with the delays and the give-up rule of
:class:`streams.core.retry.RetryPolicy`; any other error is raised at once. Giving up raises
the policy's ``gave_up`` class (:class:`~streams.errors.TrinityGaveUp`,
:class:`~streams.errors.JudgeGaveUp`) with the attempts made and the last answer's body.

The clock and the sleep are parameters (tests drive them); ``elapsed`` says how the age of the
request is counted: by default from the first attempt (``clock``), for the judge from the
request's own ``requested_at``.

Why not tenacity or stamina: both fit the loop, but the give-up rule is "the next attempt would
start after ``max_age``" (not a count or a deadline fixed at the start), the age may be counted
from a time before the first attempt, and the delays are the policy's own jittered sequence;
what is left for a library is the twelve lines below.

May import: :mod:`streams.core.retry`, :mod:`streams.errors`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..core.retry import GiveUp, RetryPolicy
from ..errors import ServiceError, ServiceGaveUp

__all__ = ["retrying"]

T = TypeVar("T")
log = logging.getLogger("trajstream.retry")


async def retrying(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    what: str,
    *,
    gave_up: type[ServiceGaveUp] = ServiceGaveUp,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    elapsed: Callable[[], float] | None = None,
    on_retry: Callable[[], None] | None = None,
) -> tuple[int, T]:
    """Await ``call()`` until it answers; returns the attempts and the answer.

    A :class:`~streams.errors.ServiceError` that is ``retriable`` is retried as ``policy``
    decides; giving up raises ``gave_up(reason, attempts, body=...)`` from the last error.
    Anything else (a rejection, an answer that makes no sense) is raised at once."""
    started = clock()
    age = elapsed if elapsed is not None else (lambda: clock() - started)
    attempts = 0
    for delay in policy.delays():
        attempts += 1
        try:
            return attempts, await call()
        except ServiceError as exc:
            if not exc.retriable:
                raise
            decision = policy.decide(attempts, age(), delay, str(exc))
            if isinstance(decision, GiveUp):
                raise gave_up(decision.reason, attempts, body=exc.body) from exc
            if attempts == 1 or attempts % 10 == 0:
                log.warning("%s: %s; retrying (attempt %d)", what, exc, attempts)
            if on_retry is not None:
                on_retry()
            await sleep(decision)
    raise AssertionError("unreachable")  # pragma: no cover
