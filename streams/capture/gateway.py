"""The OpenAI-compatible gateway: routes selected calls to Trinity and records every step.

An agent goes behind it by changing its client's base URL to ``http://<gateway>/calls/<call_id>/v1``
(or ``http://<gateway>/v1`` for calls of one step). Routes:

=====================================  ====  ===================================================
``/v1/chat/completions``               POST  a call of one step (the gateway names it)
``/calls/{call_id}/v1/chat/completions`` POST  one step of the call ``call_id``
``/v1/models``, ``/calls/{id}/v1/models`` GET   the model list of the upstream that would answer
``/calls/{call_id}/end``               POST  ``{"status", "output", "error_type"}``: END
``/calls/{call_id}/feedback``          POST  rating, thumbs, correction or preference
``/healthz``                           GET   the gateway's and the publisher's state
=====================================  ====  ===================================================

Request headers (all optional): ``X-Trajstream-Agent-Name``, ``-Agent-Id``, ``-Agent-Version``,
``-Conversation-Id``, and ``X-Trajstream-Mark``: a JSON training mark (``{"labels": [...],
"task_id": "...", "run_id": 0, "metadata": {...}, "marked_at": "<ISO 8601>"}``, all optional).
Response headers: ``X-Trajstream-Call-Id``, ``X-Trajstream-Upstream`` (trinity or production),
``X-Trajstream-Selected`` and ``X-Trajstream-Seq`` (the step's seq).

Steps and their ``seq``: an LLM step's seq is the position of its answer in the conversation
(``len(messages)`` of its request); the ``tool`` messages that follow the last assistant message
of a request are TOOL steps at their own positions. So seq is the same on every replica, a
retried request keeps its seq (the workers keep the first), and seqs of one call never collide
while its requests extend one conversation. START is published the first time a process sees a
call (the workers keep the first START); END from ``/end`` carries the number of steps this
process recorded for the call (``gateway.count_steps``), so replicas must be sticky per call
(hash on the ``/calls/{call_id}`` path) or run with ``count_steps = false``.

The wiring: parse and validate (a bad request is an OpenAI-shaped 4xx and recorded nowhere),
decide the route (:mod:`.routing`), forward, answer the agent, then queue the records on the
:class:`~.publisher.Publisher`, which never makes the agent wait for Kafka.

Why one module of ~900 lines: the ``Gateway`` class is the HTTP surface, read route by route
(chat, streamed chat, models, end, feedback, OTLP), with its error shapes beside them; the pure
parts (OpenAI JSON to records, routing, the buffer) are in :mod:`.chat`, :mod:`.routing` and
:mod:`.publisher`.

May import: aiohttp, the models, settings, selection, :mod:`streams.io`, and its siblings in
``capture``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import signal
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pydantic
from aiohttp import web
from aiokafka import AIOKafkaProducer

from ..core.select import Strategy, build_strategy
from ..errors import BadRequest, UpstreamFailed
from ..io import kafka
from ..models import (
    AgentCall,
    CallPhase,
    CallStatus,
    Completion,
    FeedbackKind,
    TrainingMark,
    UserFeedback,
    utcnow,
)
from ..settings import GatewaySettings, Settings
from ..topics import Topics
from .auth import KeyRing, check_listen
from .chat import StreamAssembler, ask_usage, llm_step, steps_of_request, to_chat_message
from .gateway_apis import ApiRoutes
from .metrics import CONTENT_TYPE, GatewayMetrics
from .otlp_http import add_otlp_routes
from .publisher import Publisher
from .routing import RolloutStrategy, Route, ShareBook, check_routable, decide_route
from .routing_follow import ShareFollower

__all__ = [
    "BadRequest",
    "Gateway",
    "build_gateway",
    "openai_error",
    "parse_messages",
    "run_gateway",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

HEADER_AGENT_NAME = "X-Trajstream-Agent-Name"
HEADER_AGENT_ID = "X-Trajstream-Agent-Id"
HEADER_AGENT_VERSION = "X-Trajstream-Agent-Version"
HEADER_CONVERSATION = "X-Trajstream-Conversation-Id"
HEADER_MARK = "X-Trajstream-Mark"
_MAX_HEADER = 1024
_KEY_AGENT: Any = (
    web.RequestKey("trajstream_key_agent", str) if hasattr(web, "RequestKey") else "key_agent"
)
"""Where the auth middleware leaves the agent its key names (aiohttp >= 3.13: a RequestKey)."""
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
"""Routes served without a client key: the probes (no model is called, nothing recorded)."""
_CALL_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


def openai_error(
    status: int, message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> web.Response:
    """A response in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status)


ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
"""Anthropic's error type by status (any other: ``api_error``)."""


def error_for(
    request: web.Request,
    status: int,
    message: str,
    *,
    type_: str,
    param: str | None = None,
    code: str | None = None,
) -> web.Response:
    """An error in the shape of the API the client speaks: Anthropic's
    (``{"type": "error", "error": {"type", "message"}}``) on ``/v1/messages``, OpenAI's on
    every other route."""
    if request.path.endswith("/v1/messages"):
        kind = ANTHROPIC_ERRORS.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return web.json_response(body, status=status)
    return openai_error(status, message, type_=type_, param=param, code=code)


def parse_messages(body: Any) -> list[dict[str, Any]]:
    """The request's ``messages``, checked; raises BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise BadRequest(f"messages[{i}] must be an object with a role", f"messages[{i}]")
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("model must be a string", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("stream must be true or false", "stream")
    return messages


# -- per-process memory of calls (step counts; the decision itself needs none) ---------------


@dataclass(slots=True)
class CallState:
    route: Route  # shared between calls decided alike (see Gateway._route)
    seqs: set[int] = field(default_factory=set)
    pending: set[asyncio.Task[Any]] = field(default_factory=set)
    shadows: dict[int, asyncio.Future[tuple[dict[str, Any], float] | None]] = field(
        default_factory=dict
    )
    """shadow mode: Trinity's answer on its way, by the seq of the step it joins"""


class CallTable:
    """The calls this process has seen, least recently used dropped past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._calls: OrderedDict[str, CallState] = OrderedDict()

    def get(self, call_id: str) -> CallState | None:
        state = self._calls.get(call_id)
        if state is not None:
            self._calls.move_to_end(call_id)
        return state

    def add(self, call_id: str, state: CallState) -> CallState:
        self._calls[call_id] = state
        while len(self._calls) > self.limit:
            self._calls.popitem(last=False)
        return state

    def pop(self, call_id: str) -> CallState | None:
        return self._calls.pop(call_id, None)

    def __len__(self) -> int:
        return len(self._calls)


# -- the server ---------------------------------------------------------------------------------


def production_url_of(g: GatewaySettings) -> str:
    """``gateway.production_url``, required: the upstream of every call not routed to Trinity."""
    if not g.production_url:
        from ..errors import ConfigError

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


@dataclass(slots=True)
class Timing:
    """A request's time waiting on its upstream (the rest is the gateway's overhead)."""

    upstream_s: float = 0.0
    stream: bool = False


@dataclass
class GatewayStats:
    requests: int = 0
    rejected: int = 0
    upstream_errors: int = 0
    answered: dict[str, int] = field(default_factory=lambda: {"trinity": 0, "production": 0})
    shadow_failures: int = 0
    unauthorized: int = 0
    rate_limited: int = 0
    ack_timeouts: int = 0


class Gateway:
    """The aiohttp application; :meth:`start` listens, :meth:`stop` drains and stops."""

    def __init__(self, settings: Settings, strategy: Strategy, publisher: Publisher) -> None:
        check_routable(strategy)
        self.settings = settings
        self.config: GatewaySettings = settings.gateway  # validated: mode, durability, URLs
        self.production_url = production_url_of(self.config)
        self.trinity_url = settings.trinity.url.rstrip("/")
        key = self.config.production_api_key
        self._production_key = key.get_secret_value() if key is not None else None
        self.acked = self.config.durability == "acked"
        config = self.config
        self.strategy = strategy
        self.publisher = publisher
        self.calls = CallTable(config.max_open_calls)
        self.stats = GatewayStats()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._routes: dict[tuple[bool, str, str], Route] = {}
        self.keys = KeyRing(config.api_keys)
        self.metrics = GatewayMetrics(self)
        self.preflight: Callable[[], Awaitable[None]] | None = None
        """Run before listening: checks the cluster (see :func:`build_gateway`)."""
        self.otlp_options: dict[str, Any] = {}
        """Options of the OTLP ingest mounted at ``POST /v1/traces`` (settings.otlp)."""
        self.apis = ApiRoutes(self)  # /v1/responses and /v1/messages (gateway_apis)
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

    # -- parsing --------------------------------------------------------------------------------

    async def _json_body(self, request: web.Request, *, required: bool = True) -> Any:
        raw = await request.read()
        if not raw and not required:
            return {}
        return self._parse_json(raw)

    @staticmethod
    def _parse_json(raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise BadRequest(f"the request body is not valid JSON: {exc}") from None

    @staticmethod
    def _call_id(request: web.Request) -> str | None:
        call_id = request.match_info.get("call_id")
        if call_id is not None and not _CALL_ID.match(call_id):
            raise BadRequest(
                "the call id in the path must be 1 to 200 characters of A-Z a-z 0-9 . _ : @ -",
                "call_id",
            )
        return call_id

    @staticmethod
    def _start_event(
        request: web.Request, call_id: str, messages: list[dict[str, Any]]
    ) -> AgentCall:
        fields: dict[str, Any] = {}
        for header, name in (
            (HEADER_AGENT_NAME, "agent_name"),
            (HEADER_AGENT_ID, "agent_id"),
            (HEADER_AGENT_VERSION, "agent_version"),
            (HEADER_CONVERSATION, "conversation_id"),
        ):
            value = request.headers.get(header)
            if value is None:
                continue
            if not value or len(value) > _MAX_HEADER or not value.isprintable():
                raise BadRequest(
                    f"header {header} must be 1 to {_MAX_HEADER} printable characters", header
                )
            fields[name] = value
        if request.get(_KEY_AGENT) is not None:  # the key names its agent
            fields["agent_name"] = request[_KEY_AGENT]
        raw_mark = request.headers.get(HEADER_MARK)
        now = utcnow()
        if raw_mark is not None:
            try:
                data = json.loads(raw_mark)
                if not isinstance(data, dict):
                    raise ValueError("not a JSON object")
                fields["mark"] = TrainingMark.model_validate({"marked_at": now, **data})
            except (ValueError, pydantic.ValidationError) as exc:
                detail = (
                    "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                    if isinstance(exc, pydantic.ValidationError)
                    else str(exc)
                )
                raise BadRequest(
                    f"header {HEADER_MARK} must be a JSON training mark "
                    '({"labels": [...], "task_id": "...", "run_id": 0, "metadata": {...}, '
                    f'"marked_at": "..."}}): {detail}',
                    HEADER_MARK,
                ) from None
        return AgentCall(
            event_id=f"{call_id}/start",
            call_id=call_id,
            phase=CallPhase.START,
            event_time=now,
            input_messages=[to_chat_message(m) for m in messages],
            **fields,
        )

    # -- routes ---------------------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        began = time.perf_counter()
        timing = Timing()  # the forwarders note the time spent waiting on the upstream
        response = await self._chat_inner(request, timing)
        if response.status == 200:
            self.metrics.overhead.labels("stream" if timing.stream else "chat").observe(
                max(0.0, time.perf_counter() - began - timing.upstream_s)
            )
        return response

    async def _chat_inner(self, request: web.Request, timing: Timing) -> web.StreamResponse:
        self.stats.requests += 1
        path_call = self._call_id(request)
        raw = await request.read()
        body = self._parse_json(raw)
        messages = parse_messages(body)
        call_id = path_call or f"gw-{uuid.uuid4().hex}"
        start = self._start_event(request, call_id, messages)  # validates the headers too
        state = self.calls.get(call_id) if path_call else None
        records: list[AgentCall | Completion] = []
        if state is None:
            route = self._route(start)
            state = CallState(route)
            if path_call:
                self.calls.add(call_id, state)
            start.attributes.update(route.attributes())
            records.append(start)
        route = state.route
        if path_call:
            for step in steps_of_request(call_id, messages, start.event_time):
                if step.seq not in state.seqs:
                    state.seqs.add(step.seq)
                    records.append(step)
        headers = {
            "X-Trajstream-Call-Id": call_id,
            "X-Trajstream-Upstream": route.upstream,
            "X-Trajstream-Selected": "true" if route.selection.selected else "false",
            "X-Trajstream-Seq": str(len(messages)),
        }
        for record in records:  # START and tool steps first: they happened before the answer
            self.publisher.publish(record)

        if route.shadow and len(messages) not in state.seqs:
            # Trinity answers the same request meanwhile; its answer joins the recorded step
            state.shadows[len(messages)] = asyncio.ensure_future(self._shadow(call_id, body))
        if body.get("stream"):
            return await self._forward_stream(
                raw, request, call_id, body, state, headers, path_call, timing
            )
        return await self._forward_json(raw, call_id, body, state, headers, path_call, timing)

    def _route(self, start: AgentCall) -> Route:
        """The call's decision; one shared object per distinct decision (memory per call)."""
        route = decide_route(self.strategy, start, self.config.mode)
        s = route.selection
        key = (s.selected, s.strategy, s.reason)
        shared = self._routes.get(key)
        if shared is None:
            if len(self._routes) > 1024:  # reasons from a plugin may vary: keep this bounded
                self._routes.clear()
            shared = self._routes[key] = route
        return shared

    def _spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

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

    async def _send(
        self, which: str, body: dict[str, Any], raw: bytes | None = None
    ) -> tuple[aiohttp.ClientResponse, bool]:
        """A chat completions request to ``which``; a streamed one asks for the usage chunk
        (usage on every stream). Returns the answer and whether the client asked for usage
        itself: when not, the route strips that chunk from what the client is sent."""
        asked = True
        if body.get("stream") is True:
            sent, asked = ask_usage(body)
            if not asked:
                body, raw = sent, None
        url, headers, data = self._upstream(which, body, raw)
        return await self._post(which, url, headers, data), asked

    def _upstream_error(self, exc: UpstreamFailed, headers: dict[str, str]) -> web.Response:
        self.stats.upstream_errors += 1
        response = openai_error(exc.status, str(exc), type_=exc.type_, code=exc.type_)
        response.headers.update(headers)
        return response

    def _record(
        self,
        call_id: str,
        body: dict[str, Any],
        answer: dict[str, Any],
        state: CallState,
        *,
        upstream: str,
        latency_ms: float,
        one_step: bool,
    ) -> Awaitable[Any]:
        """Record the answer the client saw (in shadow mode once Trinity's answer joins it);
        returns what is done once it is on the broker."""
        now = utcnow()
        seq = len(body["messages"])  # llm_step's seq, known before the step is built
        if seq in state.seqs and not one_step:
            # a retried request: the first answer is the step (on the broker with what is queued)
            return self._on_broker(self.publisher.position)
        state.seqs.add(seq)
        shadow = state.shadows.pop(seq, None)
        build = _Once(
            lambda: llm_step(
                call_id, body, answer, upstream=upstream, latency_ms=latency_ms, now=now
            )
        )
        if shadow is None:  # built and encoded by the publisher, after the answer was sent
            position = self.publisher.publish_lazy(call_id, build)
            if one_step:
                position = self.publisher.publish_lazy(call_id, lambda: _one_step_end(build()))
            return self._on_broker(position)
        task = self._spawn(self._join_shadow(build(), body, shadow, one_step))
        state.pending.add(task)
        task.add_done_callback(state.pending.discard)
        return self._after(task)

    async def _after(self, task: asyncio.Task[int]) -> None:
        await self._on_broker(await asyncio.shield(task))

    def _on_broker(self, position: int) -> Awaitable[None]:
        return self.publisher.acked(position)

    async def _durable(self, ack: Awaitable[Any] | None) -> bool:
        """acked mode: wait (up to ack_timeout_s) for the broker; False when it did not ack."""
        if not self.acked or ack is None:
            return True
        try:
            await asyncio.wait_for(ack, self.config.ack_timeout_s)
        except TimeoutError:
            self.stats.ack_timeouts += 1
            return False
        return True

    def _not_durable(self, headers: dict[str, str] | None = None) -> web.Response:
        response = openai_error(
            503,
            f"the answer could not be recorded within {self.config.ack_timeout_s:g}s "
            "(gateway.durability = acked; the broker did not acknowledge); retry the request",
            type_="server_error",
            code="recording_unavailable",
        )
        response.headers.update(headers or {})
        return response

    async def _join_shadow(
        self,
        step: Completion,
        body: dict[str, Any],
        shadow: asyncio.Future[tuple[dict[str, Any], float] | None],
        one_step: bool,
    ) -> int:
        """The step as the client saw it, with Trinity's answer to the same request beside it."""
        got = await shadow
        if got is not None:
            answer, latency = got
            with contextlib.suppress(pydantic.ValidationError):
                theirs = llm_step(
                    step.call_id, body, answer, upstream="trinity", latency_ms=latency, now=utcnow()
                )
                step = step.model_copy(
                    update={
                        "shadow_response_id": theirs.response_id,
                        "shadow_output_messages": theirs.output_messages,
                        "shadow_tool_call_details": theirs.tool_call_details,
                        "shadow_latency_ms": latency,
                    }
                )
        return self._publish_step(step, one_step)

    def _publish_step(self, step: Completion, one_step: bool) -> int:
        position = self.publisher.publish(step)
        if one_step:
            position = self.publisher.publish(_one_step_end(step))
        return position

    async def _forward_json(
        self,
        raw: bytes,
        call_id: str,
        body: dict[str, Any],
        state: CallState,
        headers: dict[str, str],
        path_call: str | None,
        timing: Timing,
    ) -> web.StreamResponse:
        route = state.route
        began = time.perf_counter()
        try:
            upstream, _ = await self._send(route.upstream, body, raw)
            async with upstream:
                data = await upstream.read()
            timing.upstream_s = time.perf_counter() - began
        except UpstreamFailed as exc:
            return self._upstream_error(exc, headers)
        except (TimeoutError, aiohttp.ClientError) as exc:
            return self._upstream_error(upstream_failed(route.upstream, exc, "broke off"), headers)
        latency = (time.perf_counter() - began) * 1000
        content_type = upstream.headers.get("Content-Type", "application/json")
        response = web.Response(status=upstream.status, body=data, headers=headers)
        response.headers["Content-Type"] = content_type
        if upstream.status == 200:
            self.stats.answered[route.upstream] += 1
            ack = None
            with contextlib.suppress(ValueError, TypeError, pydantic.ValidationError):
                answer = json.loads(data)
                if isinstance(answer, dict):
                    ack = self._record(
                        call_id,
                        body,
                        answer,
                        state,
                        upstream=route.upstream,
                        latency_ms=latency,
                        one_step=path_call is None,
                    )
            if not await self._durable(ack):
                return self._not_durable(headers)
        else:
            self.stats.upstream_errors += 1
        return response

    async def _forward_stream(
        self,
        raw: bytes,
        request: web.Request,
        call_id: str,
        body: dict[str, Any],
        state: CallState,
        headers: dict[str, str],
        path_call: str | None,
        timing: Timing,
    ) -> web.StreamResponse:
        route = state.route
        began = time.perf_counter()
        try:  # usage on every stream: asked for; stripped from a client that did not ask
            upstream, asked = await self._send(route.upstream, body, raw)
        except UpstreamFailed as exc:
            return self._upstream_error(exc, headers)
        async with upstream:
            if upstream.status != 200:
                self.stats.upstream_errors += 1
                try:
                    data = await upstream.read()
                except (TimeoutError, aiohttp.ClientError):
                    data = b""
                response = web.Response(status=upstream.status, body=data, headers=headers)
                response.headers["Content-Type"] = upstream.headers.get(
                    "Content-Type", "application/json"
                )
                return response
            waited = time.perf_counter() - began  # the upstream's time: to its headers, ...
            response = web.StreamResponse(status=200, headers=headers)
            response.headers["Content-Type"] = upstream.headers.get(
                "Content-Type", "text/event-stream"
            )
            response.headers["Cache-Control"] = "no-cache"
            await response.prepare(request)
            assembler = StreamAssembler(strip_usage=not asked, hold_done=self.acked)
            try:
                chunks = upstream.content.iter_any().__aiter__()
                while True:
                    t = time.perf_counter()
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        waited += time.perf_counter() - t
                        break
                    waited += time.perf_counter() - t  # ... and each wait for its next bytes
                    forwarded = assembler.feed(chunk)
                    if forwarded:
                        await response.write(forwarded)
                timing.upstream_s, timing.stream = waited, True
                rest = assembler.rest()
                if rest:
                    await response.write(rest)
            except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as exc:
                # the agent saw a broken stream; nothing is recorded
                log.warning("stream of call %s broke off: %s", call_id, type(exc).__name__)
                return response
            latency = (time.perf_counter() - began) * 1000
            self.stats.answered[route.upstream] += 1
            ack = None
            if assembler.done:
                with contextlib.suppress(pydantic.ValidationError):
                    ack = self._record(
                        call_id,
                        body,
                        assembler.completion(),
                        state,
                        upstream=route.upstream,
                        latency_ms=latency,
                        one_step=path_call is None,
                    )
            if self.acked:  # the end of the stream only once its records are on the broker
                with contextlib.suppress(ConnectionResetError):
                    if await self._durable(ack):
                        await response.write(assembler.done_event)
                    else:
                        error = {
                            "error": {
                                "message": "the answer could not be recorded (gateway."
                                "durability = acked; the broker did not acknowledge)",
                                "type": "server_error",
                                "param": None,
                                "code": "recording_unavailable",
                            }
                        }
                        await response.write(f"data: {json.dumps(error)}\n\n".encode())
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        return response

    async def _shadow(
        self, call_id: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], float] | None:
        """The same request to Trinity (not streamed): its answer and latency, None on failure."""
        shadow_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        began = time.perf_counter()
        try:
            upstream, _ = await self._send("trinity", shadow_body)
            async with upstream:
                data = await upstream.read()
                if upstream.status != 200:
                    raise UpstreamFailed(upstream.status, data[:200].decode(errors="replace"), "")
            answer = json.loads(data)
            if not isinstance(answer, dict):
                raise ValueError("the answer is not a JSON object")
            return answer, (time.perf_counter() - began) * 1000
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.stats.shadow_failures += 1
            log.warning("shadow request of call %s to Trinity failed: %s", call_id, exc)
            return None

    async def _models(self, request: web.Request) -> web.StreamResponse:
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
        step_count = len(state.seqs) if state is not None and self.config.count_steps else None
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
            for shadow in state.shadows.values():  # answers no recorded step waits for
                shadow.cancel()
        if not await self._durable(self._on_broker(position)):
            return self._not_durable()
        return web.json_response(
            {"status": "accepted", "call_id": call_id, "step_count": step_count}, status=202
        )

    async def _feedback(self, request: web.Request) -> web.Response:
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
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

    async def _health(self, request: web.Request) -> web.Response:
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
                "publisher": self.publisher.health(),
            }
        )


class _Once:
    """A record built at most once (the step, and the END of a one-step call made from it)."""

    __slots__ = ("_build", "_value")

    def __init__(self, build: Callable[[], Completion]) -> None:
        self._build: Callable[[], Completion] | None = build
        self._value: Completion | None = None

    def __call__(self) -> Completion:
        if self._build is not None:
            self._value, self._build = self._build(), None
        assert self._value is not None
        return self._value


def _one_step_end(step: Completion) -> AgentCall:
    """The END of a call of one step (``/v1/chat/completions``), made from its step."""
    return AgentCall(
        event_id=f"{step.call_id}/end",
        call_id=step.call_id,
        phase=CallPhase.END,
        event_time=step.event_time,
        status=CallStatus.OK,
        output=step.output_messages[0].content if step.output_messages else None,
        step_count=1,
    )


# -- building it from the settings -------------------------------------------------------------


def build_gateway(
    settings: Settings, *, producer_factory: Callable[[], AIOKafkaProducer] | None = None
) -> Gateway:
    """A gateway from the settings; bad settings fail here, naming the setting."""
    from datetime import timedelta

    producer_factory_given = producer_factory
    production_url_of(settings.gateway)  # before anything else: the one setting it needs
    spec = settings.selection.strategy
    strategy = build_strategy(
        spec,
        rate=settings.selection.rate,
        mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
    )
    check_routable(strategy, spec)
    bootstrap = settings.bootstrap_servers
    book = ShareBook() if settings.gateway.rollout.enabled else None
    if book is not None:  # the share the ledger owner decides; the strategy for new agents
        strategy = RolloutStrategy(strategy, book)
    if producer_factory is None:
        if not bootstrap:
            from ..errors import ConfigError

            raise ConfigError(
                "kafka.bootstrap_servers [TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS] is not set"
            )

        def producer_factory() -> AIOKafkaProducer:
            return kafka.producer(
                bootstrap,
                settings.kafka.security,
                request_timeout_ms=int(settings.gateway.flush_timeout_s * 1000),
            )

    topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)

    async def prepare() -> None:
        if bootstrap:
            await kafka.create_topics(
                bootstrap,
                topics.all(),
                settings.kafka.replication_factor,
                security=settings.kafka.security,
                configs=topics.configs(),
                min_insync_replicas=settings.kafka.min_insync,
            )

    publisher = Publisher(
        producer_factory,
        topics,
        spill_dir=Path(settings.gateway.spill_dir),
        max_buffered=settings.gateway.buffer_records,
        prepare=prepare,
    )
    gateway = Gateway(settings, strategy, publisher)
    if book is not None and bootstrap:

        async def routing_topic() -> None:  # the follower may start before the workers
            await kafka.create_topics(
                bootstrap,
                {topics.routing: 1},
                settings.kafka.replication_factor,
                security=settings.kafka.security,
                configs=topics.configs(),
                min_insync_replicas=settings.kafka.min_insync,
            )

        gateway.follower = ShareFollower(
            bootstrap, topics.routing, book, security=settings.kafka.security, prepare=routing_topic
        )

    async def preflight() -> None:
        """A cluster that cannot be reached (refused, timed out) is no reason not to serve: the
        records spill until it is back. What retrying cannot fix stops the start: credentials,
        TLS (ConfigError from the check, naming the setting), topics that cannot be made."""
        from ..errors import BrokerError, ConfigError
        from ..io.security import check_kafka

        if not bootstrap:
            return
        try:
            await check_kafka(bootstrap, settings.kafka.security, timeout_s=5.0)
        except BrokerError as exc:
            log.warning("starting without Kafka: %s; serving on and spilling to %s", exc,
                        settings.gateway.spill_dir)  # fmt: skip
            return
        try:
            await publisher.prepare_now()
        except (BrokerError, ConfigError):
            raise
        except Exception as exc:
            raise ConfigError(
                f"the topics of kafka.topic_prefix [TRAJSTREAM_KAFKA__TOPIC_PREFIX] "
                f"{settings.kafka.topic_prefix!r} cannot be used: {type(exc).__name__}: {exc} "
                "(may this principal create and write them? kafka.security.username)"
            ) from exc

    if producer_factory_given is None:
        gateway.preflight = preflight
    otlp = settings.otlp
    gateway.otlp_options = {
        "max_body": otlp.max_body_bytes,
        "publish_timeout": otlp.publish_timeout_s,
        "missing_parent": otlp.missing_parent,
    }
    return gateway


async def run_gateway(settings: Settings, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM, then publish what is queued and stop."""
    gateway = build_gateway(settings)
    url = await gateway.start(settings.gateway.host, settings.gateway.port)
    if ready is not None:
        ready(url)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        await gateway.stop(settings.gateway.flush_timeout_s)
