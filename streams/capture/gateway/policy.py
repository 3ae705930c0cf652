"""The policy as an upstream that may fail: every request of a call routed to Trinity goes
through :meth:`PolicyUpstream.open`, which either hands back Trinity's answer with its first
bytes read (nothing has reached the client yet) or raises :class:`PolicyFallback` naming why
production must answer instead (:mod:`..fallback`).

What it composes, each with one job:

- the circuit breaker (:class:`~..breaker.Breaker`, pure): asked before each request, told each
  outcome; a WARNING line and a metric per change of state, never per request;
- the bound on Trinity's first byte (``gateway.policy_timeout_s``): the headers and, streamed,
  the first chunk; non-streamed, the whole answer (its first byte is its last);
- the policy's version (:class:`~..policy_version.VersionBook`): Trinity's ``/metrics`` read in
  the background every ``gateway.policy_version_poll_s`` (each read bounded by
  ``gateway.policy_timeout_s``; a failed read affects no request), or the answer's own
  ``X-Model-Version``;
- the counts ``/healthz`` and ``/metrics`` show.

The decision per request, in this order: the call fell back before (``sticky``: a call stays
with one upstream from its first fallback on), the breaker is open (``breaker_open``), then the
request itself: refused, reset or unreachable (``connect``), no first byte in time
(``timeout``), 5xx, 429 or 408 (``status_*``). Any other status is the request's own fault and
reaches the client as Trinity answered it.

May import: aiohttp, settings, :mod:`..breaker`, :mod:`..fallback`, :mod:`..policy_version`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp

from ...settings import Settings
from ..breaker import CLOSED, HALF_OPEN, OPEN, Breaker, BreakerConfig, Transition
from ..fallback import (
    BAD_ANSWER,
    BREAKER_OPEN,
    CONNECT,
    STICKY,
    TIMEOUT,
    reason_of_status,
    retry_after_s,
)
from ..policy_version import VERSION_HEADER, VersionBook, version_of_header, version_of_metrics

__all__ = ["PolicyAnswer", "PolicyFallback", "PolicyUpstream"]

log = logging.getLogger(__name__)


class PolicyFallback(Exception):
    """Trinity does not answer this request: production does (``reason``: see
    :mod:`..fallback`)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class Deadline:
    """The bound on one request's wait for Trinity: when it passes, the waiting task is
    cancelled (and :meth:`expired` says the cancellation was this deadline's). It does what
    ``asyncio.timeout`` does, with one timer handle and no state machine: on the gateway's loop
    that is about 10 us less a request (``asyncio.timeout`` cost 9-12 us, a bare timer handle
    1-5 us, measured on uvloop), on the path every request routed to the policy takes."""

    __slots__ = ("_cancelling", "_fired", "_handle", "_task")

    def __init__(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        self._task = task
        self._cancelling = task.cancelling()
        self._fired = False
        self._handle = loop.call_at(loop.time() + delay, self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._task.cancel()

    @property
    def fired(self) -> bool:
        """Whether the deadline passed (and cancelled the task)."""
        return self._fired

    def expired(self) -> bool:
        """A CancelledError was caught: whether it is this deadline's alone. Then it is taken
        back (a cancellation someone else requested as well is not)."""
        return self._fired and self._task.uncancel() <= self._cancelling

    def close(self) -> bool:
        """The wait is over; True when the deadline passed just as it ended (or a library turned
        its cancellation into another error): the task is cancelled all the same, and
        :meth:`settle` must take that back before the caller's next await."""
        self._handle.cancel()
        return self._fired and self._task.cancelling() > self._cancelling

    async def settle(self) -> None:
        try:
            await asyncio.sleep(0)  # a cancellation still due is delivered here
        except asyncio.CancelledError:
            if self._task.uncancel() > self._cancelling:
                raise
        else:
            self._task.uncancel()


@dataclass(slots=True)
class PolicyAnswer:
    """Trinity's answer to one request, before any of it reached the client."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    """Non-streamed (or any status but 200): the whole body; streamed: its first bytes."""
    response: aiohttp.ClientResponse
    """Streamed with status 200: still open, the rest of the stream is read from it."""
    version: int | None
    """The policy's version as known when the answer arrived (None: not known)."""
    ticket: int | None
    """The breaker's ticket of this request, until its outcome is told (:meth:`PolicyUpstream.
    answered`, :meth:`~PolicyUpstream.broke`, :meth:`~PolicyUpstream.bad_answer`,
    :meth:`~PolicyUpstream.release`); None once it was."""


class PolicyUpstream:
    """Trinity as the upstream of the calls routed to the policy, for one gateway process."""

    def __init__(
        self,
        settings: Settings,
        session: Callable[[], aiohttp.ClientSession | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        g = settings.gateway
        b = g.breaker
        self.url = settings.trinity.url.rstrip("/")
        self.timeout_s = g.policy_timeout_s
        self.poll_s = g.policy_version_poll_s
        self._session = session
        self.breaker = Breaker(
            BreakerConfig(
                failures=b.failures,
                failure_rate=b.failure_rate,
                window_s=b.window_s,
                min_requests=b.min_requests,
                cooldown_s=b.cooldown_s,
                max_cooldown_s=b.max_cooldown_s,
                probes=b.probes,
            ),
            clock=clock,
            on_change=self._changed,
        )
        self.versions = VersionBook(3 * self.poll_s + self.timeout_s, clock=clock)
        self.fallbacks: dict[tuple[str, str], int] = {}
        """(reason, api) -> requests production answered instead."""
        self.transitions: dict[str, int] = {CLOSED: 0, OPEN: 0, HALF_OPEN: 0}
        """State -> how many times the breaker moved to it."""
        self.stream_errors = 0
        """Trinity's streams that broke after their first bytes reached the client."""
        self.since = datetime.now(UTC)
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        self.polls = {"ok": 0, "failed": 0}
        self._poll_failing = False
        self._poller: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- a request -------------------------------------------------------------------------------

    async def open(
        self,
        sticky: str | None,
        url: str,
        headers: dict[str, str],
        data: bytes,
        *,
        stream: bool,
        verify: bool = False,
    ) -> PolicyAnswer:
        """Send one request to Trinity and read up to its first byte (``stream``) or its whole
        answer, within ``gateway.policy_timeout_s``; raises :class:`PolicyFallback` when
        production must answer it (``sticky``: the call's earlier fallback, if any).

        A streamed answer with status 200 (or one the caller reads first, ``verify``) is not
        an outcome yet: the caller tells it, once it knows, to :meth:`answered`,
        :meth:`broke` or :meth:`bad_answer`, and calls :meth:`release` on every way out (a
        no-op once told), so that a broken stream counts as the failed request it is."""
        if sticky is not None:
            raise PolicyFallback(STICKY, f"the call fell back earlier ({sticky})")
        breaker = self.breaker
        ticket = breaker.admit()
        if ticket is None:
            raise PolicyFallback(BREAKER_OPEN, breaker.why)
        session = self._session()
        assert session is not None
        response: aiohttp.ClientResponse | None = None
        reason = detail = None
        retry: float | None = None
        body = b""
        deadline = Deadline(self.timeout_s)
        try:
            try:
                response = await session.post(url, data=data, headers=headers)
                if response.status == 200 and stream:
                    body = await response.content.readany()
                    if not body:
                        reason, detail = CONNECT, "the stream ended before its first byte"
                else:  # the whole answer: non-streamed, or a refusal (small)
                    body = await response.read()
                    reason = reason_of_status(response.status)
                    if reason is not None:
                        retry = retry_after_s(response.headers.get("Retry-After"))
                        text = body[:200].decode(errors="replace")
                        detail = f"Trinity answered {response.status}: {text}"
            except asyncio.CancelledError:
                if not deadline.expired():  # someone else's: the client went away
                    raise
                reason, detail = TIMEOUT, f"no first byte within {self.timeout_s:g}s"
            except (aiohttp.ClientError, OSError) as exc:  # aiohttp's own timeouts too
                reason = TIMEOUT if deadline.fired else CONNECT
                detail = f"{type(exc).__name__}: {exc}"
            finally:
                if deadline.close():
                    await deadline.settle()
        except BaseException:  # cancelled: the client went away; the probe slot is free again
            breaker.release(ticket)
            if response is not None:
                response.close()
            raise
        if reason is not None:
            if response is not None:
                response.close()
            self.failed(ticket, reason, detail or "", retry)
            raise PolicyFallback(reason, detail or "")
        assert response is not None
        pending: int | None = None
        if response.status == 200 and (stream or verify):
            pending = ticket  # its outcome is the caller's to tell
        else:
            breaker.success(ticket)
        version = version_of_header(response.headers.get(VERSION_HEADER))
        return PolicyAnswer(
            response.status,
            response.headers,
            body,
            response,
            self.versions.current if version is None else version,
            pending,
        )

    def answered(self, answer: PolicyAnswer) -> None:
        """The answer reached the client whole (a stream's end, a body that was read)."""
        ticket, answer.ticket = answer.ticket, None
        if ticket is not None:
            self.breaker.success(ticket)

    def release(self, answer: PolicyAnswer) -> None:
        """The answer ended without an outcome (the client went away); a no-op once told."""
        ticket, answer.ticket = answer.ticket, None
        if ticket is not None:
            self.breaker.release(ticket)

    def bad_answer(self, answer: PolicyAnswer, detail: str) -> PolicyFallback:
        """Trinity answered 200 with something that is no answer: a failure, and production
        answers instead (raise what this returns)."""
        ticket, answer.ticket = answer.ticket, None
        self.failed(ticket, BAD_ANSWER, detail, None)
        return PolicyFallback(BAD_ANSWER, detail)

    def broke(self, answer: PolicyAnswer, exc: BaseException) -> str:
        """Trinity's stream broke after its first bytes reached the client (no fallback is
        possible): a failure; returns the step's ``error_type``."""
        self.stream_errors += 1
        ticket, answer.ticket = answer.ticket, None
        error_type = "timeout" if isinstance(exc, TimeoutError) else "stream_broken"
        self.failed(ticket, CONNECT, f"{error_type}: {type(exc).__name__}", None)
        return error_type

    def failed(self, ticket: int | None, reason: str, detail: str, retry: float | None) -> None:
        self.last_error = f"{reason}: {detail}" if detail else reason
        self.last_error_at = datetime.now(UTC)
        self.breaker.failure(ticket, self.last_error, retry)

    def fell_back(self, reason: str, api: str) -> None:
        """Production answered (or is answering) a request of ``api`` because of ``reason``."""
        key = (reason, api)
        self.fallbacks[key] = self.fallbacks.get(key, 0) + 1

    @property
    def available(self) -> bool:
        """Whether a new request would be sent to Trinity now (closed, or a probe is free)."""
        b = self.breaker
        if b.state == CLOSED:
            return True
        return b.state == OPEN and b.clock() >= b.open_until

    # -- the breaker's changes -----------------------------------------------------------------

    def _changed(self, change: Transition) -> None:
        self.transitions[change.after] += 1
        self.since = datetime.now(UTC)
        if change.after == OPEN:
            self.versions.forget()  # it may come back with other weights
            log.warning(
                "policy circuit breaker open: %s; calls routed to the policy go to production "
                "for %.1fs",
                change.why,
                change.cooldown_s or 0.0,
            )
        elif change.after == HALF_OPEN:
            self._wake.set()  # its version, before the probes' answers are stamped
            log.warning("policy circuit breaker half-open: %s", change.why)
        else:
            self._wake.set()
            log.warning("policy circuit breaker closed: %s; the policy answers again", change.why)

    # -- the policy's version, in the background -------------------------------------------------

    def start(self) -> None:
        """Start reading Trinity's version (on the running loop; the session must be open)."""
        if self._poller is None:
            self._poller = asyncio.ensure_future(self._poll_forever())

    async def stop(self) -> None:
        task, self._poller = self._poller, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _poll_forever(self) -> None:
        floor = min(1.0, self.poll_s)  # a wake-up never reads faster than this
        while True:
            self._wake.clear()
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            await asyncio.sleep(floor if self._wake.is_set() else 0)

    async def poll(self) -> int | None:
        """Read Trinity's ``/metrics`` once; the version it gives (None: none, or not read).
        Never raises: a failed read leaves the version to age out."""
        session = self._session()
        if session is None:
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(f"{self.url}/metrics") as r:
                    if r.status != 200:
                        raise ValueError(f"status {r.status}")
                    data: Any = await r.json(content_type=None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.polls["failed"] += 1
            if not self._poll_failing:  # once per outage, not per read
                self._poll_failing = True
                log.warning(
                    "cannot read the policy's version from %s/metrics: %s: %s (steps are "
                    "stamped with no version until it is read again)",
                    self.url,
                    type(exc).__name__,
                    exc,
                )
            return None
        version = version_of_metrics(data)
        self.versions.observe(version)
        self.polls["ok"] += 1
        if self._poll_failing:
            self._poll_failing = False
            log.info("the policy's version is read again: %s", version)
        return version

    # -- what health and metrics show ------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """The ``policy`` object of ``/healthz``."""
        b = self.breaker
        out: dict[str, Any] = {
            "state": b.state,
            "since": self.since.isoformat(),
            "why": b.why or None,
            "last_error": self.last_error,
            "last_error_at": self.last_error_at.isoformat() if self.last_error_at else None,
            "version": self.versions.current,
            "fallbacks": self.fallback_counts(),
            "stream_errors": self.stream_errors,
        }
        if b.state == OPEN:
            out["probe_in_s"] = round(max(0.0, b.open_until - b.clock()), 3)
        return out

    def fallback_counts(self) -> dict[str, int]:
        """Fallbacks by reason (every API)."""
        out: dict[str, int] = {}
        for (reason, _), n in self.fallbacks.items():
            out[reason] = out.get(reason, 0) + n
        return out
