"""The gateway's aiohttp application: its routes mounted, its middleware (client keys, every
refusal in the client's API's error shape), start and stop, and the small routes (models, END,
feedback, health, metrics).

May import: what :mod:`.chat_routes` imports, :mod:`.chat_routes`, :mod:`.api_routes`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import pydantic
from aiohttp import web

from ...core.select import Strategy
from ...errors import BadRequest
from ...models import (
    AgentCall,
    CallPhase,
    CallStatus,
    Completion,
    FeedbackKind,
    UserFeedback,
    utcnow,
)
from ...settings import Settings
from ..auth import KeyRing, check_listen
from ..metrics import CONTENT_TYPE, GatewayMetrics
from ..otlp_http import add_otlp_routes
from ..publisher import Publisher
from ..recorder import RecorderProcess
from ..routing import decide_route
from ..routing_follow import ShareFollower
from .api_routes import ApiRoutes
from .chat_routes import ChatRoutes
from .requests import _KEY_AGENT, OPEN_PATHS, error_for
from .upstream import upstream_failed

log = logging.getLogger(__name__)


class Gateway(ChatRoutes):
    """The aiohttp application; :meth:`start` listens, :meth:`stop` drains and stops."""

    def __init__(
        self, settings: Settings, strategy: Strategy, publisher: Publisher | RecorderProcess
    ) -> None:
        super().__init__(settings, strategy, publisher)
        self._runner: web.AppRunner | None = None
        self.keys = KeyRing(self.config.api_keys)
        self.metrics = GatewayMetrics(self)
        self.preflight: Callable[[], Awaitable[None]] | None = None
        """Run before listening: checks the cluster (see :func:`.build.build_gateway`)."""
        self.otlp_options: dict[str, Any] = {}
        """Options of the OTLP ingest mounted at ``POST /v1/traces`` (settings.otlp)."""
        self.apis = ApiRoutes(self)  # /v1/responses and /v1/messages (api_routes)
        self.url = ""
        self.follower: ShareFollower | None = None
        """With ``gateway.rollout``: the reader of ``<p>.routing`` (started and stopped here)."""

    # -- lifecycle ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes, middlewares=[self._errors, self._auth]
        )
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/calls/{call_id}/v1/chat/completions", self._chat)
        r.add_get("/v1/models", self._models)
        r.add_get("/calls/{call_id}/v1/models", self._models)
        r.add_post("/calls/{call_id}/end", self._end)
        r.add_post("/calls/{call_id}/feedback", self._feedback)
        r.add_get("/healthz", self._health)
        r.add_get("/metrics", self._metrics)
        # OpenTelemetry GenAI spans, the second way in: same records, same durable buffer
        add_otlp_routes(app, self._publish_spans, **self.otlp_options)
        self.apis.mount(app)  # the Responses and Messages APIs: same records, same decisions
        return app

    async def _publish_spans(self, records: Sequence[AgentCall | Completion]) -> None:
        for record in records:
            self.publisher.publish(record)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        check_listen(host, bool(self.config.api_keys), self.config.allow_anonymous)
        if self.preflight is not None:  # before anything is opened: it may stop the start
            await self.preflight()
        # no total limit (a long stream is fine); an upstream silent for timeout_s is a 504
        timeout = aiohttp.ClientTimeout(
            total=None,
            sock_connect=self.config.connect_timeout_s,
            sock_read=self.config.timeout_s,
        )
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit_per_host=self.config.max_connections),
            auto_decompress=False,
        )
        await self.publisher.start()
        self.policy.start()  # the policy's version, read in the background
        if self.follower is not None:  # gateway.rollout: the shares in force before any call
            await self.follower.start()
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.url = f"http://{bound[0]}:{bound[1]}"
        log.info(
            "gateway listening on %s (mode=%s, trinity=%s, production=%s)",
            self.url, self.config.mode, self.trinity_url, self.production_url,
        )  # fmt: skip
        return self.url

    async def stop(self, flush_timeout: float = 10.0) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._background:
            await asyncio.wait(self._background, timeout=self.config.timeout_s)
        await self.policy.stop()
        if self._session is not None:
            await self._session.close()
        if self.follower is not None:
            await self.follower.stop()
        await self.publisher.stop(flush_timeout)

    # -- middleware: every error in OpenAI's shape ---------------------------------------------

    @web.middleware
    async def _errors(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as exc:
            self.stats.rejected += 1
            return error_for(
                request, exc.status, str(exc), type_="invalid_request_error", param=exc.param
            )
        except web.HTTPRequestEntityTooLarge:
            self.stats.rejected += 1
            return error_for(
                request,
                413,
                f"request body larger than {self.config.max_body_bytes} bytes",
                type_="invalid_request_error",
                code="request_too_large",
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return error_for(request, exc.status, exc.reason, type_="invalid_request_error")

    @web.middleware
    async def _auth(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Every route but the probes needs a configured key (when any is configured)."""
        if not self.keys or request.path in OPEN_PATHS:
            return await handler(request)
        verdict = self.keys.check(request.headers)
        if verdict.status == 401:
            self.stats.unauthorized += 1
            return error_for(
                request,
                401,
                verdict.message,
                type_="invalid_request_error",
                code="invalid_api_key",
            )
        if verdict.status == 429:
            self.stats.rate_limited += 1
            response = error_for(
                request, 429, verdict.message, type_="requests", code="rate_limit_exceeded"
            )
            response.headers["Retry-After"] = str(verdict.retry_after_s)
            return response
        if verdict.agent is not None:
            request[_KEY_AGENT] = verdict.agent
        return await handler(request)


    async def _models(self, request: web.Request) -> web.StreamResponse:
        """The model list of the upstream that would answer the call (production without a
        call id, or while the call's requests fall back), as that upstream answers it."""
        call_id = self._call_id(request)
        which = "production"
        if call_id is not None:
            state = self.calls.get(call_id)
            route = (
                state.route
                if state
                else decide_route(
                    self.strategy, self._start_event(request, call_id, []), self.config.mode
                )
            )
            which = route.upstream
            if which == "trinity" and (
                (state is not None and state.fallback is not None) or not self.policy.available
            ):
                which = "production"
        assert self._session is not None
        if which == "trinity":
            url, headers = f"{self.trinity_url}/v1/models", {}
        else:
            url, headers = f"{self.production_url}/models", {}
            if self._production_key:
                headers["Authorization"] = f"Bearer {self._production_key}"
        try:
            async with self._session.get(url, headers=headers) as upstream:
                data = await upstream.read()
                response = web.Response(status=upstream.status, body=data)
                response.headers["Content-Type"] = upstream.headers.get(
                    "Content-Type", "application/json"
                )
                response.headers["X-Trajstream-Upstream"] = which
                return response
        except (TimeoutError, aiohttp.ClientError) as exc:
            return self._upstream_error(upstream_failed(which, exc, "could not be reached"), {})

    async def _end(self, request: web.Request) -> web.Response:
        """The call's END: body ``{"status": "OK"|"ERROR"|"CANCELLED", "output", "error_type"}``
        (all optional); 202 with the step count this process recorded."""
        call_id = self._call_id(request)
        assert call_id is not None
        body = await self._json_body(request, required=False)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        start = self._start_event(request, call_id, [])
        status = body.get("status", "OK")
        if status not in CallStatus.__members__:
            raise BadRequest("status must be OK, ERROR or CANCELLED", "status")
        for name in ("output", "error_type"):
            if body.get(name) is not None and not isinstance(body[name], str):
                raise BadRequest(f"{name} must be a string", name)
        unknown = set(body) - {"status", "output", "error_type"}
        if unknown:
            raise BadRequest(f"unknown fields: {', '.join(sorted(unknown))}", sorted(unknown)[0])
        state = self.calls.get(call_id)
        if state is not None and state.pending:  # shadow steps still on their way
            await asyncio.wait(state.pending, timeout=self.config.timeout_s)
        step_count = state.steps if state is not None and self.config.count_steps else None
        position = self.publisher.publish(
            start.model_copy(
                update={
                    "event_id": f"{call_id}/end",
                    "phase": CallPhase.END,
                    "input_messages": [],
                    "status": CallStatus(status),
                    "output": body.get("output"),
                    "error_type": body.get("error_type"),
                    "step_count": step_count,
                }
            )
        )
        self.calls.pop(call_id)
        self.apis.items.forget(call_id)
        if state is not None:
            state.cancel_shadows()  # answers no recorded step waits for
        if not await self._durable(self._on_broker(position)):
            return self._not_durable()
        return web.json_response(
            {"status": "accepted", "call_id": call_id, "step_count": step_count}, status=202
        )

    async def _feedback(self, request: web.Request) -> web.Response:
        """A user feedback on the call: ``rating``, ``thumbs_up``, ``correction`` or
        ``preferred_response_id`` (or ``kind``), as a UserFeedback; 202 with its event id."""
        call_id = self._call_id(request)
        assert call_id is not None
        body = await self._json_body(request)
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        kind = body.get("kind")
        if kind is None:
            for name, inferred in (
                ("rating", "RATING"),
                ("thumbs_up", "THUMBS"),
                ("correction", "CORRECTION"),
                ("preferred_response_id", "PREFERENCE"),
            ):
                if body.get(name) is not None:
                    kind = inferred
                    break
        if kind not in FeedbackKind.__members__:
            raise BadRequest(
                "feedback needs rating, thumbs_up, correction or preferred_response_id "
                "(or kind: RATING, THUMBS, CORRECTION, PREFERENCE)",
                "kind",
            )
        fields = {k: v for k, v in body.items() if k != "kind"}
        try:
            record = UserFeedback.model_validate(
                {
                    "event_id": fields.pop("event_id", None) or uuid.uuid4().hex,
                    "call_id": call_id,
                    "event_time": utcnow(),
                    "kind": kind,
                    **fields,
                }
            )
        except pydantic.ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"]))
            raise BadRequest(f"{where}: {first['msg']}", where) from None
        position = self.publisher.publish(record)
        if not await self._durable(self._on_broker(position)):
            return self._not_durable()
        return web.json_response(
            {"status": "accepted", "call_id": call_id, "event_id": record.event_id}, status=202
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        """The gateway's metrics in the Prometheus text format (no client key needed)."""
        await self.publisher.refresh()  # the recorder process's counts as of now
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _health(self, request: web.Request) -> web.Response:
        """The gateway's counters, its publisher's state and the policy's (``policy``: the
        circuit breaker's state, since when and why, the last error, the version, fallbacks
        by reason) as JSON: ``status`` ok, or degraded while Kafka is unreachable (still
        serving); a policy that fails changes no status (production answers); no client key
        needed."""
        await self.publisher.refresh()
        kafka_down = self.publisher.unreachable_since is not None
        return web.json_response(
            {
                # still serving (and spilling) while Kafka is unreachable: degraded, not down
                "status": "degraded" if kafka_down else "ok",
                "mode": self.config.mode,
                "strategy": self.strategy.name,
                "open_calls": len(self.calls),
                "requests": self.stats.requests,
                "rejected": self.stats.rejected,
                "unauthorized": self.stats.unauthorized,
                "rate_limited": self.stats.rate_limited,
                "upstream_errors": self.stats.upstream_errors,
                "answered": self.stats.answered,
                "shadow_failures": self.stats.shadow_failures,
                "durability": self.config.durability,
                "ack_timeouts": self.stats.ack_timeouts,
                "handover_timeouts": self.stats.handover_timeouts,
                "publisher": self.publisher.health(),
                "policy": self.policy.health(),
            }
        )


