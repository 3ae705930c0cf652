"""The async HTTP client for a Trinity-RFT explorer in serve mode.

:class:`TrinityClient` speaks the routes of Trinity-RFT's serve mode exactly:
``/feedback``, ``/commit``, ``/metrics``, ``/health`` and ``/v1/chat/completions``. It works
unchanged against a real Trinity server and against :mod:`streams.devtools.standin`. It validates a
feedback request locally before sending it (a request Trinity would silently mis-store is a bug
in the caller, not a transient failure), maps every failure onto the package's exception tree,
and never retries by itself: :func:`retrying` is the one retry loop of the package (the live
feedback stage and commits, and replay, use it), with the policy of
:class:`streams.core.retry.RetryPolicy`::

    4xx (except 408, 429)          -> TrinityRejected    (status, body)
    5xx, 408, 429                  -> TrinityUnavailable (status, body)
    timeout, connection error      -> TrinityUnavailable (raised ``from`` the httpx error)
    2xx whose body is not an object -> TrinityError

Example::

    async with TrinityClient("http://127.0.0.1:8010") as trinity:
        reply = await trinity.chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        await trinity.feedback([reply["id"]], 1.0, task_id="task-1", run_id=0)
        await trinity.commit()

May import: httpx, httpx-aiohttp, :mod:`streams.errors`, :mod:`streams.core.retry`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar

import httpx
from httpx_aiohttp import AiohttpTransport

from ..core.retry import RetryPolicy, backoff_delays
from ..errors import (
    ConfigError,
    TrinityError,
    TrinityGaveUp,
    TrinityRejected,
    TrinityUnavailable,
)
from ..settings import TrinitySettings
from .retrying import retrying as _retrying

T = TypeVar("T")
log = logging.getLogger("trajstream.trinity")


async def retrying(
    call: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    what: str,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_retry: Callable[[], None] | None = None,
) -> tuple[int, T]:
    """:func:`streams.io.retrying.retrying` for Trinity: retries :class:`TrinityUnavailable`,
    raises a :class:`TrinityRejected` (or any other :class:`TrinityError`) at once; giving up
    raises :class:`TrinityGaveUp`."""
    return await _retrying(
        call, policy, what, gave_up=TrinityGaveUp, sleep=sleep, clock=clock, on_retry=on_retry
    )


__all__ = [
    "MAX_TASK_ID_LENGTH",
    "TrinityClient",
    "TrinityGaveUp",
    "backoff_delays",
    "feedback_body",
    "retrying",
]

MAX_TASK_ID_LENGTH: Final = 64
"""Trinity stores ``task_id`` in a 64-character string column."""

_RUN_ID_MIN: Final = -(2**31)
_RUN_ID_MAX: Final = 2**31 - 1  # Trinity stores run_id in an SQL INTEGER column.

# 4xx answers that say "not now" rather than "never": a gateway in front of Trinity may send
# them, and treating them as final would drop feedback that a later retry would deliver.
_RETRIABLE_4XX: Final = frozenset({408, 429})
_BODY_IN_MESSAGE: Final = 300


def feedback_body(
    msg_ids: Sequence[str],
    reward: float,
    task_id: str | None = None,
    run_id: int | None = None,
) -> dict[str, Any]:
    """Validate one feedback and return the JSON body ``POST /feedback`` expects.

    ``None`` fields are omitted (Trinity then stores ``task_id`` as null and ``run_id`` as 0).
    Raises :class:`TrinityRejected` with ``status=None`` when the feedback breaks the contract:
    ``msg_ids`` must be a non-empty sequence of non-empty strings, ``reward`` a finite number
    (not a bool), ``task_id`` a string of at most 64 characters, ``run_id`` a 32-bit int.

    >>> feedback_body(["chatcmpl-1"], 1)
    {'msg_ids': ['chatcmpl-1'], 'reward': 1.0}
    """
    if isinstance(msg_ids, str | bytes) or not isinstance(msg_ids, Sequence):
        raise TrinityRejected(f"msg_ids must be a list of strings, got {type(msg_ids).__name__}")
    ids = list(msg_ids)
    if not ids:
        raise TrinityRejected("msg_ids must not be empty")
    for msg_id in ids:
        if not isinstance(msg_id, str) or not msg_id:
            raise TrinityRejected(f"every msg_id must be a non-empty string, got {msg_id!r}")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        raise TrinityRejected(f"reward must be a number, got {type(reward).__name__}")
    if not math.isfinite(reward):
        raise TrinityRejected(f"reward must be finite, got {reward!r}")
    body: dict[str, Any] = {"msg_ids": ids, "reward": float(reward)}
    if task_id is not None:
        if not isinstance(task_id, str):
            raise TrinityRejected(f"task_id must be a string, got {type(task_id).__name__}")
        if len(task_id) > MAX_TASK_ID_LENGTH:
            raise TrinityRejected(
                f"task_id must be at most {MAX_TASK_ID_LENGTH} characters, "
                f"got {len(task_id)}: {task_id[:80]!r}"
            )
        body["task_id"] = task_id
    if run_id is not None:
        if isinstance(run_id, bool) or not isinstance(run_id, int):
            raise TrinityRejected(f"run_id must be an int, got {type(run_id).__name__}")
        if not _RUN_ID_MIN <= run_id <= _RUN_ID_MAX:
            raise TrinityRejected(f"run_id must fit a 32-bit signed integer, got {run_id}")
        body["run_id"] = run_id
    return body


class TrinityClient:
    """Async client for one Trinity serve-mode endpoint, with pooled keep-alive connections.

    ``transport`` replaces the network (``httpx.MockTransport`` in unit tests); the pool limits
    apply only to the default transport. ``timeout`` applies to connect, read, write and waiting
    for a pooled connection alike. The client holds a connection pool: use it as an async
    context manager or call :meth:`aclose`. ``ca_file`` is the PEM file of the CAs that sign
    an https server's certificate (default: the system's); ``headers`` are sent with every
    request (e.g. ``Authorization`` for a proxy in front of Trinity) and never logged.
    :meth:`from_settings` builds one from the ``trinity`` settings.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 10.0,
        max_connections: int = 16,
        transport: httpx.AsyncBaseTransport | None = None,
        ca_file: str | Path | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        url = httpx.URL(base_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ConfigError(f"Trinity base_url must be an http(s) URL, got {base_url!r}")
        if timeout <= 0:
            raise ConfigError(f"Trinity timeout must be positive, got {timeout!r}")
        if max_connections < 1:
            raise ConfigError(f"Trinity max_connections must be >= 1, got {max_connections!r}")
        self._base_url = str(base_url).rstrip("/")
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        if transport is None:
            # httpx's API over aiohttp's I/O: about a sixth of the CPU per request of httpx's
            # own transport (measured: 0.38 ms against 2.2 ms per POST on loopback), which
            # is most of a worker's cost per trajectory
            verify: ssl.SSLContext | bool = True
            if ca_file is not None:
                try:
                    verify = ssl.create_default_context(cafile=str(ca_file))
                except (OSError, ssl.SSLError) as exc:
                    raise ConfigError(
                        f"bad setting trinity.ca_file [TRAJSTREAM_TRINITY__CA_FILE]: {exc}"
                    ) from exc
            transport = AiohttpTransport(limits=limits, verify=verify)
        self._http = httpx.AsyncClient(
            base_url=self._base_url,
            timeout=httpx.Timeout(timeout),
            limits=limits,
            transport=transport,
            headers={"user-agent": "trajstream", **(headers or {})},
        )

    @classmethod
    def from_settings(cls, settings: TrinitySettings) -> TrinityClient:
        """The client the ``trinity`` settings describe: url, timeout, pool, CA, headers."""
        return cls(
            settings.url,
            timeout=settings.timeout_s,
            max_connections=settings.max_connections,
            ca_file=settings.ca_file,
            headers={k: v.get_secret_value() for k, v in settings.headers.items()},
        )

    @property
    def base_url(self) -> str:
        """The server's base URL, without a trailing slash."""
        return self._base_url

    async def feedback(
        self,
        msg_ids: Sequence[str],
        reward: float,
        task_id: str | None = None,
        run_id: int | None = None,
    ) -> dict[str, Any]:
        """Reward the experiences ``msg_ids`` (``POST /feedback``); returns the JSON answer.

        Validated locally first (see :func:`feedback_body`). Trinity answers 200 for unknown
        and already rewarded ids too, so a retry after a lost answer is harmless.
        """
        return await self._call(
            "POST", "/feedback", feedback_body(msg_ids, reward, task_id, run_id)
        )

    async def commit(self) -> dict[str, Any]:
        """Drain the ready experiences into training (``POST /commit``).

        Every commit advances Trinity's explore step, even when nothing is ready.
        """
        return await self._call("POST", "/commit", {})

    async def metrics(self) -> dict[str, Any]:
        """Return ``GET /metrics``: request, experience and explore-step counters."""
        return await self._call("GET", "/metrics")

    async def health(self) -> bool:
        """Return True when ``GET /health`` answers 2xx, False on any error or no answer."""
        try:
            await self._send("GET", "/health")
        except TrinityError:
            return False
        return True

    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send an OpenAI chat completion request; return the completion JSON.

        The completion's ``id`` is the msg_id to reward later. Streaming is not supported
        here (the answer would be server-sent events): ``"stream": true`` is rejected locally.
        """
        if not isinstance(body, dict):
            raise TrinityRejected(f"chat body must be a dict, got {type(body).__name__}")
        if body.get("stream"):
            raise TrinityRejected("TrinityClient.chat does not support stream=true")
        reply = await self._call("POST", "/v1/chat/completions", body)
        if not isinstance(reply.get("id"), str) or not reply["id"]:
            raise TrinityError("chat completion has no string 'id' (the msg_id)", body=str(reply))
        return reply

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._http.aclose()

    async def __aenter__(self) -> TrinityClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"TrinityClient({self._base_url!r})"

    async def _call(
        self, method: str, path: str, payload: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        response = await self._send(method, path, payload)
        try:
            data = response.json()
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise TrinityError(
                f"{method} {path}: answer is not a JSON object: "
                f"{response.text[:_BODY_IN_MESSAGE]!r}",
                status=response.status_code,
                body=response.text,
            )
        return data

    async def _send(
        self, method: str, path: str, payload: dict[str, Any] | None = None
    ) -> httpx.Response:
        try:
            response = await self._http.request(method, path, json=payload)
        except httpx.TransportError as exc:
            cert = _certificate_error(exc)
            if cert is not None:
                raise TrinityUnavailable(
                    f"{method} {self._base_url}{path}: the server's certificate is not trusted "
                    f"({cert}): check trinity.ca_file [TRAJSTREAM_TRINITY__CA_FILE]"
                ) from exc
            if isinstance(exc, httpx.TimeoutException):
                raise TrinityUnavailable(
                    f"{method} {self._base_url}{path}: timed out ({type(exc).__name__})"
                ) from exc
            raise TrinityUnavailable(
                f"{method} {self._base_url}{path}: {type(exc).__name__}: {exc}"
            ) from exc
        status = response.status_code
        if response.is_success:
            return response
        text = response.text
        message = f"{method} {path} answered {status}: {text[:_BODY_IN_MESSAGE]}"
        if status >= 500 or status in _RETRIABLE_4XX:
            raise TrinityUnavailable(message, status=status, body=text)
        raise TrinityRejected(message, status=status, body=text)


def _certificate_error(exc: BaseException) -> str | None:
    """The certificate verification failure behind a transport error, if that is what it was.

    (httpx-aiohttp reports it as a ConnectTimeout; the cause says what really happened.)
    """
    seen: BaseException | None = exc
    while seen is not None:
        # aiohttp's ClientConnectorCertificateError holds the ssl error as certificate_error
        inner = getattr(seen, "certificate_error", seen)
        if isinstance(inner, ssl.SSLCertVerificationError):
            return getattr(inner, "verify_message", None) or str(inner)
        seen = seen.__cause__ or seen.__context__
    return None
