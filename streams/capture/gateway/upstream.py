"""The upstream models: where a request goes (Trinity's chat completions, production's), the
one send every route uses, and the failures it answers with (502, 504). Trinity's side, which
may fail and then hands the request to production, is :class:`.policy.PolicyUpstream`.

May import: aiohttp, settings, :mod:`streams.errors`, :mod:`..chat`, :mod:`.requests`,
:mod:`.policy`.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from ...errors import UpstreamFailed
from ...settings import GatewaySettings, Settings
from ..chat import ask_usage
from .policy import PolicyUpstream
from .requests import openai_error


def production_url_of(g: GatewaySettings) -> str:
    """``gateway.production_url``, required: the upstream of every call not routed to Trinity."""
    if not g.production_url:
        from ...errors import ConfigError

        raise ConfigError(
            "gateway.production_url [TRAJSTREAM_GATEWAY__PRODUCTION_URL] is not set: the "
            "base URL of the production model, e.g. https://api.openai.com/v1"
        )
    return g.production_url


def upstream_failed(which: str, exc: BaseException, what: str) -> UpstreamFailed:
    """The OpenAI-shaped failure for an upstream that timed out (504) or failed on the
    connection (502); ``what`` says what the connection did ("could not be reached", ...)."""
    if isinstance(exc, TimeoutError):
        return UpstreamFailed(504, f"the {which} model did not answer in time", "upstream_timeout")
    return UpstreamFailed(502, f"the {which} model {what}: {type(exc).__name__}", "upstream_error")


class Upstreams:
    """The gateway's two upstreams and its HTTP client session (opened by ``start``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.config: GatewaySettings = settings.gateway  # validated: mode, durability, URLs
        self.production_url = production_url_of(self.config)
        self.trinity_url = settings.trinity.url.rstrip("/")
        key = self.config.production_api_key
        self._production_key = key.get_secret_value() if key is not None else None
        self._session: aiohttp.ClientSession | None = None
        self.policy = PolicyUpstream(settings, lambda: self._session)
        """Trinity as an upstream that may fail: fallback, circuit breaker, version."""

    def _upstream(
        self, which: str, body: dict[str, Any], raw: bytes | None = None
    ) -> tuple[str, dict[str, str], bytes]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if which == "trinity":
            url = f"{self.trinity_url}/v1/chat/completions"
            if self.config.trinity_model:
                body, raw = {**body, "model": self.config.trinity_model}, None
        else:
            url = f"{self.production_url}/chat/completions"
            if self._production_key:
                headers["Authorization"] = f"Bearer {self._production_key}"
        # the agent's bytes as they came, unless something had to change
        return url, headers, raw if raw is not None else json.dumps(body).encode()

    async def _post(
        self, which: str, url: str, headers: dict[str, str], data: bytes
    ) -> aiohttp.ClientResponse:
        """The one way a request reaches an upstream model (every route, either upstream): a
        connection that fails is an :class:`~streams.errors.UpstreamFailed` (502, 504)."""
        assert self._session is not None
        try:
            return await self._session.post(url, data=data, headers=headers)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise upstream_failed(which, exc, "could not be reached") from None

    def _outgoing(
        self, which: str, body: dict[str, Any], raw: bytes | None = None
    ) -> tuple[str, dict[str, str], bytes, bool]:
        """A chat completions request to ``which``: its URL, headers and bytes; a streamed one
        asks for the usage chunk (usage on every stream). The last item says whether the client
        asked for usage itself: when not, the route strips that chunk from what it is sent."""
        asked = True
        if body.get("stream") is True:
            sent, asked = ask_usage(body)
            if not asked:
                body, raw = sent, None
        url, headers, data = self._upstream(which, body, raw)
        return url, headers, data, asked

    async def _send(
        self, which: str, body: dict[str, Any], raw: bytes | None = None
    ) -> tuple[aiohttp.ClientResponse, bool]:
        """A chat completions request to ``which`` (see :meth:`_outgoing`): the answer, and
        whether the client asked for usage itself."""
        url, headers, data, asked = self._outgoing(which, body, raw)
        return await self._post(which, url, headers, data), asked

    def _upstream_error(self, exc: UpstreamFailed, headers: dict[str, str]) -> web.Response:
        self.stats.upstream_errors += 1
        response = openai_error(exc.status, str(exc), type_=exc.type_, code=exc.type_)
        response.headers.update(headers)
        return response

