"""The LLM judge's edge: an OpenAI-compatible chat endpoint, asked once per judge request.

:class:`JudgeClient` posts one :class:`~streams.models.JudgeRequest` to
``<reward.judge.url>/chat/completions`` (``{"model", "messages": [rubric, prompt],
"temperature": 0}``, the key as a bearer token, the call id in an ``x-trajstream-call-id``
header) and maps failures onto the package's exceptions::

    4xx (except 408, 429)           -> JudgeRejected    (never retried: a dead letter)
    5xx, 408, 429                   -> JudgeUnavailable (retried with backoff)
    timeout, connection error       -> JudgeUnavailable (raised ``from`` the httpx error)

:func:`judge` is the one loop both runners use (as the judge stage's port,
:func:`judge_port`): it retries an unavailable judge as
:class:`~streams.core.retry.RetryPolicy` says, with the age counted from the request's
``requested_at`` (so a restart does not start the clock again), and always returns a
:class:`~streams.models.JudgeVerdict`: scored, or with the error (garbage answer, rejected,
unavailable past ``reward.judge.max_age_s``). It never raises for what the judge answered.

May import: httpx, the core, :mod:`streams.errors`, :mod:`streams.settings`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx

from ..core.judge import JudgePort, expired, failed_verdict, messages, verdict_of
from ..core.retry import RetryPolicy
from ..errors import ConfigError, JudgeGaveUp, JudgeRejected, JudgeUnavailable
from ..models import JudgeRequest, JudgeVerdict, utcnow
from ..settings import JudgeSettings
from .retrying import retrying

__all__ = ["JudgeClient", "judge", "judge_port", "policy_of"]

log = logging.getLogger("trajstream.judge")

_RETRIABLE_4XX = frozenset({408, 429})
_BODY_IN_MESSAGE = 300


class JudgeClient:
    """Async client of one OpenAI-compatible chat endpoint; ``transport`` replaces the network
    in tests (``httpx.MockTransport``). Close it with :meth:`aclose`."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_connections: int = 8,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"bad setting reward.judge.url: not an http(s) URL: {base_url!r}")
        headers = {"user-agent": "trajstream"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout),
            limits=limits,
            transport=transport,
            headers=headers,
        )

    @classmethod
    def from_settings(cls, settings: JudgeSettings) -> JudgeClient:
        if settings.url is None:
            raise ConfigError("reward.judge.url [TRAJSTREAM_REWARD__JUDGE__URL] is not set")
        key = settings.api_key.get_secret_value() if settings.api_key is not None else None
        return cls(
            settings.url,
            api_key=key,
            timeout=settings.timeout_s,
            max_connections=settings.max_connections,
        )

    async def ask(self, request: JudgeRequest) -> tuple[Any, str]:
        """Post ``request``; the answer's JSON (None if it is not JSON) and its text."""
        body = {"model": request.model, "messages": messages(request), "temperature": 0}
        try:
            response = await self._http.post(
                "/chat/completions", json=body, headers={"x-trajstream-call-id": request.call_id}
            )
        except httpx.TimeoutException as exc:
            raise JudgeUnavailable(f"judge at {self.base_url}: timed out") from exc
        except httpx.TransportError as exc:
            raise JudgeUnavailable(
                f"judge at {self.base_url}: {type(exc).__name__}: {exc}"
            ) from exc
        text = response.text
        status = response.status_code
        if status >= 500 or status in _RETRIABLE_4XX:
            raise JudgeUnavailable(
                f"judge answered {status}: {text[:_BODY_IN_MESSAGE]}", status=status, body=text
            )
        if not response.is_success:
            raise JudgeRejected(
                f"judge answered {status}: {text[:_BODY_IN_MESSAGE]}", status=status, body=text
            )
        try:
            return response.json(), text
        except ValueError:
            return None, text

    async def aclose(self) -> None:
        await self._http.aclose()


def policy_of(settings: JudgeSettings) -> RetryPolicy:
    """The judge's retry policy: ``retry_base_s`` doubling to ``retry_cap_s``, ``max_age_s``."""
    return RetryPolicy(
        max_age=settings.max_age_s,
        base=settings.retry_base_s,
        cap=max(settings.retry_cap_s, settings.retry_base_s),
        service="the judge",
    )


async def judge(
    client: JudgeClient,
    request: JudgeRequest,
    policy: RetryPolicy,
    *,
    clock: Callable[[], datetime] = utcnow,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_retry: Callable[[], None] | None = None,
) -> JudgeVerdict:
    """Ask until the judge answers or ``policy.max_age`` after ``request.requested_at``."""
    reason = expired(request, clock(), timedelta(seconds=policy.max_age))
    if reason is not None:
        return failed_verdict(request, reason, "", 0, clock())
    asked = 0

    async def ask() -> tuple[Any, str]:
        nonlocal asked
        asked += 1
        return await client.ask(request)

    try:
        attempts, (body, raw) = await retrying(
            ask,
            policy,
            f"judge for {request.call_id}",
            gave_up=JudgeGaveUp,
            sleep=sleep,
            elapsed=lambda: (clock() - request.requested_at).total_seconds(),
            on_retry=on_retry,
        )
    except JudgeGaveUp as exc:
        return failed_verdict(request, str(exc), exc.body or "", exc.attempts, clock())
    except JudgeRejected as exc:
        reason = f"the judge rejected the request: {exc}"
        return failed_verdict(request, reason, exc.body or "", asked, clock())
    return verdict_of(request, body, raw, attempts, clock())


def judge_port(
    client: Callable[[], JudgeClient],
    policy: RetryPolicy,
    *,
    clock: Callable[[], datetime] = utcnow,
    on_retry: Callable[[], None] | None = None,
    slots: asyncio.Semaphore | None = None,
) -> JudgePort:
    """The judge stage's port (:data:`streams.core.judge.JudgePort`) over HTTP: :func:`judge`
    with ``client()`` (made when first asked), at most ``slots`` requests at once."""

    async def ask(request: JudgeRequest) -> JudgeVerdict:
        if slots is None:
            return await judge(client(), request, policy, clock=clock, on_retry=on_retry)
        async with slots:
            return await judge(client(), request, policy, clock=clock, on_retry=on_retry)

    return ask
