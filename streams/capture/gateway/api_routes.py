"""The gateway's routes for the Responses API and Anthropic's Messages API.

=========================================  ====  =============================================
``/v1/responses``                          POST  OpenAI's Responses API, a call of one step
``/calls/{call_id}/v1/responses``          POST  one step of the call ``call_id``
``/v1/messages``                           POST  Anthropic's Messages API, a call of one step
``/calls/{call_id}/v1/messages``           POST  one step of the call ``call_id``
=========================================  ====  =============================================

Both work as ``/v1/chat/completions`` does (:mod:`.chat_routes`): the same headers, the same
call decision (:meth:`.state.GatewayState._route`), the same records (START, TOOL steps for the
tool results a request reports, the LLM step, END for a call of one step), streamed (the API's
own server-sent events) or not, the same upstream send and ``gateway.durability``. The
translations are the pure functions of :mod:`..apis`; what differs between the two APIs is in
:mod:`.api_shapes`.

Which upstream answers:

- a call routed to Trinity (``gateway.mode = route``, selected): the request translated to
  chat completions (Trinity serves only that API) and Trinity's answer translated back, as JSON
  or as the API's typed events; the step's ``response_id`` is Trinity's chat completion id (the
  msg_id of ``/feedback``). A request the chat completions API cannot express (a built-in tool,
  a server tool, a stored prompt...) is answered by production instead, and said so in the log
  and ``X-Trajstream-Upstream``;
- otherwise production, with the client's bytes as they came: ``gateway.production_url`` +
  ``/responses`` (bearer ``gateway.production_api_key``), or ``gateway.anthropic_url`` +
  ``/v1/messages`` (``x-api-key`` from ``gateway.anthropic_api_key``, the client's
  ``anthropic-version`` and ``anthropic-beta`` headers passed through); its answer passes through
  unchanged and is recorded; in shadow mode the translated request also goes to Trinity (not
  streamed) and Trinity's answer joins the recorded step (``Completion.shadow_*``: its
  ``shadow_response_id`` is the msg_id), as on the chat route.

A request of a call routed to Trinity that Trinity cannot answer before any byte reached the
client (refused, reset, 5xx, 429, 408, no first byte within ``gateway.policy_timeout_s``, the
circuit breaker open, an earlier fallback of the call) is answered by production instead, with
the client's bytes, as on the chat route (:mod:`.policy`); without a production upstream for
the API (``gateway.anthropic_url`` unset) Trinity's failure reaches the client in the API's
shape.

``previous_response_id`` works within a call: the gateway keeps the call's items
(:class:`.apis.ItemStore`, bounded by ``gateway.responses_calls``), whichever upstream
answered; a response it does not have is answered 400 ``previous_response_not_found``. On
``/v1/responses`` (no call id) a request continuing a response continues its conversation in a
new call of one step.

Errors are in the client's API's shape (OpenAI's ``{"error": {...}}``, Anthropic's
``{"type": "error", "error": {...}}``); a request that is not valid is recorded nowhere.

May import: what :mod:`.chat_routes` imports, :mod:`.chat_routes`, :mod:`.api_shapes`,
:mod:`..apis`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pydantic
from aiohttp import web

from ...errors import ApiRefused, UpstreamFailed
from ...models import AgentCall, CallPhase, CallStatus, Completion, utcnow
from ...settings import GatewaySettings
from ..apis import Answer, ItemStore, ParsedRequest, answer_of_chat, llm_step, tool_steps
from ..apis.sse import HoldLast
from .api_shapes import Api, Exchange, Messages, Responses, Which
from .calls import CallState
from .chat_routes import ChatRoutes
from .policy import PolicyFallback
from .upstream import upstream_failed

__all__ = ["ApiRoutes"]

log = logging.getLogger(__name__)


class ApiRoutes:
    """The Responses and Messages routes of one :class:`.app.Gateway`."""

    def __init__(self, gateway: ChatRoutes) -> None:
        self.gateway = gateway
        self.config: GatewaySettings = gateway.config
        key = self.config.anthropic_api_key
        self._anthropic_key = key.get_secret_value() if key is not None else None
        self.items = ItemStore(max_calls=self.config.responses_calls)
        self.instructions: OrderedDict[str, str] = OrderedDict()
        """Response id -> the instructions its request had (or inherited), bounded."""

    def mount(self, app: web.Application) -> None:
        r = app.router
        r.add_post("/v1/responses", self.responses)
        r.add_post("/calls/{call_id}/v1/responses", self.responses)
        r.add_post("/v1/messages", self.messages)
        r.add_post("/calls/{call_id}/v1/messages", self.messages)

    # -- the two APIs ---------------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """OpenAI's Responses API (JSON or streamed), routed, falling back and recorded like
        chat completions (``previous_response_id`` resolved from the items the gateway
        keeps)."""
        return await self._handle(request, Responses(self, request))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API (JSON or streamed), routed, falling back and recorded like
        chat completions (production: ``gateway.anthropic_url``)."""
        return await self._handle(request, Messages(self, request))

    # -- the flow both share --------------------------------------------------------------------

    async def _handle(self, request: web.Request, api: Api) -> web.StreamResponse:
        gw = self.gateway
        gw.stats.requests += 1
        path_call = gw._call_id(request)
        raw = await request.read()
        try:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise ApiRefused(
                    400, api.error(f"the request body is not valid JSON: {exc}")
                ) from None
            call_id, parsed = api.parse(body, path_call)
        except ApiRefused as exc:
            gw.stats.rejected += 1
            return web.json_response(exc.body, status=exc.status)
        start = gw._start_event(request, call_id, [])  # validates the headers too
        start = start.model_copy(update={"input_messages": parsed.messages})
        steps = tool_steps(call_id, parsed.messages, start.event_time) if path_call else ()
        state, records = gw._open_call(start, path_call, steps)
        route = state.route
        which: Which = "trinity" if route.upstream == "trinity" else "production"
        if which == "trinity" and parsed.chat is None:
            log.warning(
                "call %s: answered by production, Trinity cannot take it (%s)",
                call_id,
                parsed.unsupported,
            )
            which = "production"
        headers = {
            "X-Trajstream-Call-Id": call_id,
            "X-Trajstream-Upstream": which,
            "X-Trajstream-Selected": "true" if route.selection.selected else "false",
            "X-Trajstream-Seq": str(len(parsed.messages)),
        }
        if which == "production" and not api.has_production():
            gw.stats.rejected += 1
            response = web.json_response(api.error(api.no_production, kind="api_error"), status=503)
            response.headers.update(headers)
            return response
        for record in records:  # START and tool steps first: they happened before the answer
            gw.publisher.publish(record)
        seq = len(parsed.messages)
        if route.shadow and parsed.chat is not None and not state.has(seq):
            # Trinity answers the translated request meanwhile; its answer joins the step
            state.await_shadow(seq, asyncio.ensure_future(gw._shadow(call_id, parsed.chat)))
        exchange = Exchange(api, call_id, parsed, state, which, headers, path_call)
        try:
            if parsed.stream:
                return await self._stream(request, raw, exchange)
            return await self._json(raw, exchange)
        finally:  # a policy answer whose outcome was not told: its probe slot is free again
            if exchange.policy is not None:
                gw.policy.release(exchange.policy)

    async def _post(self, exchange: Exchange, raw: bytes) -> aiohttp.ClientResponse:
        """Production, through the gateway's one upstream send, with the client's bytes."""
        url, headers = exchange.api.production(exchange.request_headers)
        return await self.gateway._post("production", url, headers, raw)

    async def _ask_policy(self, exchange: Exchange, *, stream: bool) -> web.Response | None:
        """Trinity's answer to the chat completions translation (a streamed one asking for
        usage), opened into ``exchange.policy``; or production's turn (``exchange.which``,
        the headers and the call's fallback say so); or, without a production upstream for
        this API, Trinity's failure in the API's shape (returned)."""
        gw = self.gateway
        assert exchange.parsed.chat is not None
        url, headers, data, _ = gw._outgoing("trinity", exchange.parsed.chat)
        exchange.began = time.perf_counter()
        try:
            exchange.policy = await gw.policy.open(
                exchange.state.fallback, url, headers, data, stream=stream, verify=True
            )
        except PolicyFallback as exc:
            return self._fall_back(exchange, exc)
        return None

    def _fall_back(self, exchange: Exchange, exc: PolicyFallback) -> web.Response | None:
        """Production answers this request (None), or cannot: the failure (returned)."""
        exchange.policy = None
        if not exchange.api.has_production():
            status = 504 if exc.reason == "timeout" else 502 if exc.reason == "connect" else 503
            return self._failed(
                exchange, status, f"the trinity model cannot answer ({exc})", "api_error"
            )
        gw = self.gateway
        if exchange.state.fallback is None:
            exchange.state.fallback = exc.reason
        gw.policy.fell_back(exc.reason, exchange.api.label)
        exchange.which, exchange.fallback = "production", exc.reason
        exchange.headers["X-Trajstream-Upstream"] = "production"
        exchange.headers["X-Trajstream-Fallback"] = exc.reason
        return None

    def _not_durable(self, exchange: Exchange) -> web.Response:
        """acked mode, the broker silent: 503 in the API's shape (the client retries)."""
        message = self._not_recorded()
        response = web.json_response(exchange.api.error(message, kind="api_error"), status=503)
        response.headers.update(exchange.headers)
        return response

    def _not_recorded(self) -> str:
        return (
            f"the answer could not be recorded within {self.gateway.config.ack_timeout_s:g}s "
            "(gateway.durability = acked; the broker did not acknowledge); retry the request"
        )

    def _failed(self, exchange: Exchange, status: int, message: str, kind: str) -> web.Response:
        self.gateway.stats.upstream_errors += 1
        response = web.json_response(exchange.api.error(message, kind=kind), status=status)
        response.headers.update(exchange.headers)
        return response

    async def _refused_by_upstream(
        self, exchange: Exchange, upstream: aiohttp.ClientResponse
    ) -> web.Response:
        """Production's non-200 answer, as it came."""
        try:
            data = await upstream.read()
        except (TimeoutError, aiohttp.ClientError):
            data = b""
        self.gateway.stats.upstream_errors += 1
        response = web.Response(status=upstream.status, body=data, headers=exchange.headers)
        response.headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
        return response

    def _refused_by_trinity(self, exchange: Exchange, status: int, data: bytes) -> web.Response:
        """Trinity's non-200 answer that is no failure (the request's own fault, a 4xx), in
        the API's shape."""
        text = data[:300].decode(errors="replace")
        return self._failed(exchange, status, f"Trinity answered {status}: {text}", "api_error")

    async def _json(self, raw: bytes, exchange: Exchange) -> web.StreamResponse:
        gw = self.gateway
        answer_json: dict[str, Any] | None = None
        if exchange.which == "trinity":
            refused = await self._ask_policy(exchange, stream=False)
            if refused is not None:
                return refused
        opened = exchange.policy
        if opened is not None:
            if opened.status != 200:
                return self._refused_by_trinity(exchange, opened.status, opened.body)
            try:
                parsed = json.loads(opened.body)
                if not isinstance(parsed, dict):
                    raise ValueError("not a JSON object")
                answer_json = parsed
                gw.policy.answered(opened)
            except ValueError as exc:
                refused = self._fall_back(
                    exchange, gw.policy.bad_answer(opened, f"the answer is not JSON: {exc}")
                )
                if refused is not None:
                    return refused
        data = b""
        if exchange.policy is not None:  # Trinity answered: told in the API's shape below
            began = exchange.began
        else:
            began = time.perf_counter()
            try:
                upstream = await self._post(exchange, raw)
                async with upstream:
                    if upstream.status != 200:
                        return await self._refused_by_upstream(exchange, upstream)
                    data = await upstream.read()
            except UpstreamFailed as exc:
                return self._failed(exchange, exc.status, str(exc), exc.type_)
            except (TimeoutError, aiohttp.ClientError) as exc:
                failed = upstream_failed(exchange.which, exc, "broke off")
                return self._failed(exchange, failed.status, str(failed), failed.type_)
            try:
                production_json = json.loads(data)
                if isinstance(production_json, dict):
                    answer_json = production_json
            except ValueError:
                pass
        latency = (time.perf_counter() - began) * 1000
        gw.stats.answered[exchange.which] += 1
        told: dict[str, Any] | None
        if exchange.which == "trinity":
            assert answer_json is not None
            told = exchange.api.from_chat(answer_json, exchange.parsed)
            answer: Answer | None = answer_of_chat(answer_json)
            response = web.json_response(told, headers=exchange.headers)
        else:
            told = answer_json
            answer = exchange.api.answer(answer_json) if answer_json is not None else None
            response = web.Response(status=200, body=data, headers=exchange.headers)
            response.headers["Content-Type"] = "application/json"
        if told is not None and answer is not None:
            exchange.api.remember(exchange, told)
            ack = self._record(exchange, answer, latency)
            if not await gw._durable(ack):
                return self._not_durable(exchange)
        return response

    async def _stream(
        self, request: web.Request, raw: bytes, exchange: Exchange
    ) -> web.StreamResponse:
        if exchange.which == "trinity":
            refused = await self._ask_policy(exchange, stream=True)
            if refused is not None:
                return refused
        opened = exchange.policy
        first = b""
        if opened is not None:  # Trinity's stream, its first bytes read
            if opened.status != 200:
                return self._refused_by_trinity(exchange, opened.status, opened.body)
            began, upstream, first = exchange.began, opened.response, opened.body
        else:
            began = time.perf_counter()
            try:
                upstream = await self._post(exchange, raw)
            except UpstreamFailed as exc:
                return self._failed(exchange, exc.status, str(exc), exc.type_)
        api = exchange.api
        async with upstream:
            if upstream.status != 200:
                return await self._refused_by_upstream(exchange, upstream)
            response = web.StreamResponse(status=200, headers=exchange.headers)
            response.headers["Content-Type"] = "text/event-stream"
            response.headers["Cache-Control"] = "no-cache"
            await response.prepare(request)
            translate = api.chat_stream(exchange.parsed) if exchange.which == "trinity" else None
            assembler = api.assembler() if translate is None else None
            acked = self.gateway.acked
            hold = HoldLast() if acked and translate is None else None  # the terminal event
            broke: BaseException | None = None
            try:
                chunk, chunks = first, upstream.content.iter_any().__aiter__()
                while True:
                    if chunk:
                        if translate is not None:
                            out = translate.feed(chunk)
                        else:
                            assembler.feed(chunk)  # type: ignore[union-attr]
                            out = hold.feed(chunk) if hold is not None else chunk
                        if out:
                            await response.write(out)
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                    except (TimeoutError, aiohttp.ClientError) as exc:  # the upstream's side
                        broke = exc
                        break
            except (aiohttp.ClientError, ConnectionResetError) as exc:  # the agent went away
                log.warning("the agent of call %s left its stream: %s", exchange.call_id, exc)
                return response
            if broke is not None:
                # the client saw a broken stream; a Trinity step is recorded as failed
                log.warning(
                    "stream of call %s broke off: %s", exchange.call_id, type(broke).__name__
                )
                if translate is not None:
                    with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                        await response.write(
                            translate.fail(f"the Trinity stream broke off: {broke}")
                        )
                    assert opened is not None
                    error_type = self.gateway.policy.broke(opened, broke)
                    ack = None
                    with contextlib.suppress(ValueError, TypeError, pydantic.ValidationError):
                        ack = self._record(
                            exchange,
                            answer_of_chat(translate.completion()),
                            (time.perf_counter() - began) * 1000,
                            error_type=error_type,
                        )
                    await self.gateway._durable(ack)
                return response
            if opened is not None:
                self.gateway.policy.answered(opened)
            tail = translate.finish() if translate is not None else b""
            if hold is not None:
                tail = hold.release()
            if not acked:  # buffered: the client has it all before anything is recorded
                await response.write(tail)
            latency = (time.perf_counter() - began) * 1000
            self.gateway.stats.answered[exchange.which] += 1
            ack = None
            with contextlib.suppress(pydantic.ValidationError):
                answer: Answer | None = None
                if translate is not None:
                    answer = answer_of_chat(translate.completion())
                    told = api.told_stream(translate)
                else:
                    assert assembler is not None
                    told = api.assembled(assembler)
                    answer = api.answer(told) if told is not None else None
                if told is not None and answer is not None:
                    api.remember(exchange, told)
                    ack = self._record(exchange, answer, latency)
            with contextlib.suppress(ConnectionResetError):
                if acked:  # the stream's end only once its records are on the broker
                    if not await self.gateway._durable(ack):
                        tail = api.stream_error(self._not_recorded())
                    await response.write(tail)
                else:  # buffered: the stream closes once they are handed to the recorder
                    await self.gateway._durable(ack)
                await response.write_eof()
        return response

    def _record(
        self,
        exchange: Exchange,
        answer: Answer,
        latency_ms: float,
        *,
        error_type: str | None = None,
    ) -> Awaitable[Any] | None:
        """Record the step; returns what is done once it is on the broker."""
        return self._publish_step(
            exchange.call_id,
            exchange.parsed,
            answer,
            exchange.state,
            upstream=exchange.which,
            latency_ms=latency_ms,
            one_step=exchange.path_call is None,
            provider=exchange.api.provider if exchange.which == "production" else None,
            marks=exchange.marks(error_type),
        )

    def _publish_step(
        self,
        call_id: str,
        parsed: ParsedRequest,
        answer: Answer,
        state: CallState,
        *,
        upstream: str,
        latency_ms: float,
        one_step: bool,
        provider: str | None = None,
        marks: dict[str, Any] | None = None,
    ) -> Awaitable[Any] | None:
        gw = self.gateway
        now = utcnow()
        step = llm_step(
            call_id,
            parsed,
            answer,
            upstream=upstream,
            latency_ms=latency_ms,
            now=now,
            provider=provider,
            **(marks or {}),
        )
        if state.has(step.seq) and not one_step:
            # a retried request: the first answer is the step (on the broker with what is queued)
            return gw._on_broker(gw.publisher.position)
        state.add(step.seq)
        shadow = state.take_shadow(step.seq)
        if shadow is None:
            return gw._on_broker(self._publish(step, one_step))
        task = gw._spawn(self._join_shadow(step, shadow, one_step))
        state.watch(task)
        return gw._after(task) if gw.acked else None  # nobody waits when buffered

    async def _join_shadow(
        self,
        step: Completion,
        shadow: asyncio.Future[tuple[dict[str, Any], float] | None],
        one_step: bool,
    ) -> int:
        """The step as the client saw it, with Trinity's answer to the translated request beside
        it (as the gateway's chat route does)."""
        got = await shadow
        if got is not None:
            completion, latency = got
            with contextlib.suppress(pydantic.ValidationError):
                theirs = answer_of_chat(completion)
                step = step.model_copy(
                    update={
                        "shadow_response_id": theirs.response_id,
                        "shadow_output_messages": [theirs.message],
                        "shadow_tool_call_details": theirs.message.tool_calls,
                        "shadow_latency_ms": latency,
                    }
                )
        return self._publish(step, one_step)

    def _publish(self, step: Completion, one_step: bool) -> int:
        """The step, and the END of a call of one step; the position of the last."""
        publish = self.gateway.publisher.publish
        position = publish(step)
        if one_step:
            output = step.output_messages[0].content if step.output_messages else None
            position = publish(
                AgentCall(
                    event_id=f"{step.call_id}/end",
                    call_id=step.call_id,
                    phase=CallPhase.END,
                    event_time=step.event_time,
                    status=CallStatus.OK,
                    output=output,
                    step_count=1,
                )
            )
        return position


