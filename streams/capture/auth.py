"""The gateway's client credentials: ``gateway.api_keys``, checked on every route.

A client sends its key as ``Authorization: Bearer <key>`` (what the ``openai`` client does with
``api_key``) or ``x-api-key: <key>`` (the ``anthropic`` client). A key may name the agent its calls
are recorded for and a request rate (a bucket of one second's worth, refilled continuously);
past it the answer is 429 with ``Retry-After``. Keys are held as SHA-256 digests, compared in
constant time, and never logged or recorded.

With no key configured the gateway listens only on a loopback address, unless
``gateway.allow_anonymous`` says otherwise (:func:`check_listen`).

This module imports the settings and the errors only.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..settings import GatewayKey

__all__ = ["KeyRing", "Verdict", "check_listen", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, has_keys: bool, allow_anonymous: bool) -> None:
    """Refuse to serve an open relay: no key and a host others can reach."""
    if has_keys or allow_anonymous or is_loopback(host):
        return
    raise ConfigError(
        f"gateway.host [TRAJSTREAM_GATEWAY__HOST] is {host or '(all addresses)'!r} and no "
        "gateway.api_keys [TRAJSTREAM_GATEWAY__API_KEYS] are set: anyone who reaches the gateway "
        "would spend the production key; set gateway.api_keys, or gateway.allow_anonymous "
        "[TRAJSTREAM_GATEWAY__ALLOW_ANONYMOUS] = true to serve without them"
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    status: int  # 200, 401 or 429
    message: str = ""
    agent: str | None = None
    retry_after_s: int = 0


class _Bucket:
    __slots__ = ("capacity", "rate", "tokens", "updated")

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.capacity = max(1.0, rate)
        self.tokens = self.capacity
        self.updated = now

    def take(self, now: float) -> float:
        """0 when a request may go now, else the seconds until it may."""
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(slots=True)
class _Entry:
    digest: bytes
    agent: str | None
    bucket: _Bucket | None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class KeyRing:
    """The configured keys; :meth:`check` is a request's verdict."""

    def __init__(
        self, keys: Sequence[GatewayKey], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        now = clock()
        self._entries = {
            (d := _digest(k.key.get_secret_value())): _Entry(
                d, k.agent, _Bucket(k.rate_per_s, now) if k.rate_per_s else None
            )
            for k in keys
        }

    def __bool__(self) -> bool:
        return bool(self._entries)

    def check(self, headers: Mapping[str, str]) -> Verdict:
        key = _presented(headers)
        if key is None:
            return Verdict(
                401,
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
            )
        digest = _digest(key)
        entry = self._entries.get(digest)
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            return Verdict(401, "Incorrect API key provided.")
        if entry.bucket is not None:
            wait = entry.bucket.take(self._clock())
            if wait > 0:
                return Verdict(
                    429,
                    f"Rate limit reached for this key: {entry.bucket.rate:g} requests per "
                    "second. Please try again later.",
                    retry_after_s=max(1, math.ceil(wait)),
                )
        return Verdict(200, agent=entry.agent)


def _presented(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None
