"""The gateway's routes for the Responses API and Anthropic's Messages API.

=========================================  ====  =============================================
``/v1/responses``                          POST  OpenAI's Responses API, a call of one step
``/calls/{call_id}/v1/responses``          POST  one step of the call ``call_id``
``/v1/messages``                           POST  Anthropic's Messages API, a call of one step
``/calls/{call_id}/v1/messages``           POST  one step of the call ``call_id``
=========================================  ====  =============================================

Both work as ``/v1/chat/completions`` does (:mod:`.gateway`): the same headers, the same call
decision (:meth:`.gateway.Gateway._route`), the same records (START, TOOL steps for the tool
results a request reports, the LLM step, END for a call of one step), streamed (the API's own
server-sent events) or not. The translations are the pure functions of :mod:`.apis`.

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

``previous_response_id`` works within a call: the gateway keeps the call's items
(:class:`.apis.ItemStore`, bounded by ``gateway.responses_calls``), whichever upstream
answered; a response it does not have is answered 400 ``previous_response_not_found``. On
``/v1/responses`` (no call id) a request continuing a response continues its conversation in a
new call of one step.

Errors are in the client's API's shape (OpenAI's ``{"error": {...}}``, Anthropic's
``{"type": "error", "error": {...}}``); a request that is not valid is recorded nowhere.

May import: what :mod:`.gateway` imports, and :mod:`.apis`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import aiohttp
import pydantic
from aiohttp import web

from ..errors import ApiRefused, ApiRequestError, UpstreamFailed
from ..models import AgentCall, CallPhase, CallStatus, ChatMessage, Completion, utcnow
from ..settings import GatewaySettings
from .apis import (
    Answer,
    ChatToMessagesStream,
    ChatToResponsesStream,
    ItemStore,
    MessagesStreamAssembler,
    ParsedRequest,
    ResponsesStreamAssembler,
    answer_of_chat,
    answer_of_message,
    answer_of_response,
    chat_to_message,
    chat_to_response,
    llm_step,
    output_items,
    previous_not_found,
    tool_steps,
)
from .apis import messages as messages_api
from .apis import responses as responses_api
from .apis.responses_json import error_body as responses_error
from .apis.sse import HoldLast, encode_event

if TYPE_CHECKING:
    from .gateway import CallState, Gateway

__all__ = ["ApiRoutes"]

log = logging.getLogger(__name__)

ANTHROPIC_VERSION = "2023-06-01"
"""Sent to Anthropic when the client sent no ``anthropic-version`` header."""

Which = Literal["trinity", "production"]


class _ChatStream(Protocol):
    def feed(self, data: bytes) -> bytes: ...
    def finish(self) -> bytes: ...
    def fail(self, message: str) -> bytes: ...
    def completion(self) -> dict[str, Any]: ...


class ApiRoutes:
    """The Responses and Messages routes of one :class:`.gateway.Gateway`."""

    def __init__(self, gateway: Gateway) -> None:
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
        return await self._handle(request, _Responses(self, request))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, _Messages(self, request))

    # -- the flow both share --------------------------------------------------------------------

    async def _handle(self, request: web.Request, api: _Api) -> web.StreamResponse:
        from .gateway import CallState

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
        state = gw.calls.get(call_id) if path_call else None
        records: list[AgentCall | Completion] = []
        if state is None:
            route = gw._route(start)
            state = CallState(route)
            if path_call:
                gw.calls.add(call_id, state)
            start.attributes.update(route.attributes())
            records.append(start)
        route = state.route
        if path_call:
            for step in tool_steps(call_id, parsed.messages, start.event_time):
                if step.seq not in state.seqs:
                    state.seqs.add(step.seq)
                    records.append(step)
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
        if route.shadow and parsed.chat is not None and seq not in state.seqs:
            # Trinity answers the translated request meanwhile; its answer joins the step
            state.shadows[seq] = asyncio.ensure_future(gw._shadow(call_id, parsed.chat))
        exchange = _Exchange(api, call_id, parsed, state, which, headers, path_call)
        if parsed.stream:
            return await self._stream(request, raw, exchange)
        return await self._json(raw, exchange)

    async def _post(self, exchange: _Exchange, raw: bytes) -> aiohttp.ClientResponse:
        """Through the gateway's one upstream send: Trinity gets the chat completions
        translation (a streamed one asking for usage), production the client's bytes."""
        gw = self.gateway
        if exchange.which == "trinity":
            assert exchange.parsed.chat is not None
            upstream, _ = await gw._send("trinity", exchange.parsed.chat)
            return upstream
        url, headers = exchange.api.production(exchange.request_headers)
        return await gw._post("production", url, headers, raw)

    def _not_durable(self, exchange: _Exchange) -> web.Response:
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

    def _failed(self, exchange: _Exchange, status: int, message: str, kind: str) -> web.Response:
        self.gateway.stats.upstream_errors += 1
        response = web.json_response(exchange.api.error(message, kind=kind), status=status)
        response.headers.update(exchange.headers)
        return response

    async def _refused_by_upstream(
        self, exchange: _Exchange, upstream: aiohttp.ClientResponse
    ) -> web.Response:
        """An upstream's non-200 answer: production's as it came, Trinity's in the API's shape."""
        try:
            data = await upstream.read()
        except (TimeoutError, aiohttp.ClientError):
            data = b""
        if exchange.which == "trinity":
            text = data[:300].decode(errors="replace")
            return self._failed(
                exchange,
                upstream.status,
                f"Trinity answered {upstream.status}: {text}",
                "api_error",
            )
        self.gateway.stats.upstream_errors += 1
        response = web.Response(status=upstream.status, body=data, headers=exchange.headers)
        response.headers["Content-Type"] = upstream.headers.get("Content-Type", "application/json")
        return response

    async def _json(self, raw: bytes, exchange: _Exchange) -> web.StreamResponse:
        from .gateway import upstream_failed

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
        latency = (time.perf_counter() - began) * 1000
        self.gateway.stats.answered[exchange.which] += 1
        try:
            answer_json = json.loads(data)
            if not isinstance(answer_json, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            if exchange.which == "trinity":
                return self._failed(
                    exchange, 502, f"Trinity's answer is not JSON: {exc}", "api_error"
                )
            answer_json = None
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
            if not await self.gateway._durable(ack):
                return self._not_durable(exchange)
        return response

    async def _stream(
        self, request: web.Request, raw: bytes, exchange: _Exchange
    ) -> web.StreamResponse:
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
            try:
                async for chunk in upstream.content.iter_any():
                    if translate is not None:
                        out = translate.feed(chunk)
                    else:
                        assembler.feed(chunk)  # type: ignore[union-attr]
                        out = hold.feed(chunk) if hold is not None else chunk
                    if out:
                        await response.write(out)
            except (TimeoutError, aiohttp.ClientError, ConnectionResetError) as exc:
                # the client saw a broken stream; nothing is recorded
                log.warning("stream of call %s broke off: %s", exchange.call_id, type(exc).__name__)
                if translate is not None:
                    with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
                        await response.write(translate.fail(f"the Trinity stream broke off: {exc}"))
                return response
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
                await response.write_eof()
        return response

    def _record(self, exchange: _Exchange, answer: Answer, latency_ms: float) -> Awaitable[Any]:
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
    ) -> Awaitable[Any]:
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
        )
        if step.seq in state.seqs and not one_step:
            # a retried request: the first answer is the step (on the broker with what is queued)
            return gw._on_broker(gw.publisher.position)
        state.seqs.add(step.seq)
        shadow = state.shadows.pop(step.seq, None)
        if shadow is None:
            return gw._on_broker(self._publish(step, one_step))
        task = gw._spawn(self._join_shadow(step, shadow, one_step))
        state.pending.add(task)
        task.add_done_callback(state.pending.discard)
        return gw._after(task)

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


@dataclass
class _Exchange:
    """One request on its way: what every step of :class:`ApiRoutes` needs of it."""

    api: _Api
    call_id: str
    parsed: ParsedRequest
    state: CallState
    which: Which
    headers: dict[str, str]
    path_call: str | None

    @property
    def request_headers(self) -> Any:
        return self.api.request.headers


class _Api:
    """What differs between the two APIs."""

    provider = ""
    no_production = ""

    def __init__(self, routes: ApiRoutes, request: web.Request) -> None:
        self.routes = routes
        self.request = request

    def error(self, message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, body: Any, path_call: str | None) -> tuple[str, ParsedRequest]:
        raise NotImplementedError

    def has_production(self) -> bool:
        raise NotImplementedError

    def production(self, headers: Any) -> tuple[str, dict[str, str]]:
        raise NotImplementedError

    def answer(self, told: dict[str, Any]) -> Answer:
        raise NotImplementedError

    def from_chat(self, completion: dict[str, Any], parsed: ParsedRequest) -> dict[str, Any]:
        raise NotImplementedError

    def chat_stream(self, parsed: ParsedRequest) -> _ChatStream:
        raise NotImplementedError

    def told_stream(self, stream: _ChatStream) -> dict[str, Any] | None:
        return None

    def assembler(self) -> Any:
        raise NotImplementedError

    def assembled(self, assembler: Any) -> dict[str, Any] | None:
        raise NotImplementedError

    def remember(self, exchange: _Exchange, told: dict[str, Any]) -> None:
        return None

    def stream_error(self, message: str) -> bytes:
        """An ``error`` event of the API's stream, sent in place of the terminal event."""
        raise NotImplementedError


class _Responses(_Api):
    provider = "openai"
    no_production = "gateway.production_url is not set"

    def error(self, message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
        return responses_error(message, kind=kind)

    def parse(self, body: Any, path_call: str | None) -> tuple[str, ParsedRequest]:
        items = self.routes.items
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is not None and not isinstance(previous, str):
            raise ApiRefused(
                400,
                responses_error(
                    "previous_response_id must be a string", param="previous_response_id"
                ),
            )
        owner = path_call or (items.call_of(previous) if previous else None)
        history = items.history(owner, previous) if owner else ([] if not previous else None)
        if history is None:
            assert previous is not None
            raise ApiRefused(400, previous_not_found(previous))
        try:
            parsed = responses_api.parse_request(body, history)
        except ApiRequestError as exc:
            raise ApiRefused(400, responses_error(str(exc), param=exc.param)) from None
        inherited = self.routes.instructions.get(previous) if previous else None
        if inherited and not body.get("instructions"):
            # instructions do not carry over to a request that continues a response, but the
            # records keep them: the conversation, and the seqs in it, stay one
            parsed.messages.insert(0, ChatMessage(role="system", content=inherited))
        return path_call or f"gw-{uuid.uuid4().hex}", parsed

    def has_production(self) -> bool:
        return bool(self.routes.gateway.production_url)

    def production(self, headers: Any) -> tuple[str, dict[str, str]]:
        gateway = self.routes.gateway
        out = {"Content-Type": "application/json"}
        if gateway._production_key:
            out["Authorization"] = f"Bearer {gateway._production_key}"
        return f"{gateway.production_url}/responses", out

    def answer(self, told: dict[str, Any]) -> Answer:
        return answer_of_response(told)

    def stream_error(self, message: str) -> bytes:
        error = {"type": "error", "code": "recording_unavailable", "message": message}
        return encode_event({**error, "param": None})

    def from_chat(self, completion: dict[str, Any], parsed: ParsedRequest) -> dict[str, Any]:
        return chat_to_response(completion, parsed)

    def chat_stream(self, parsed: ParsedRequest) -> _ChatStream:
        return ChatToResponsesStream(parsed)

    def told_stream(self, stream: _ChatStream) -> dict[str, Any] | None:
        assert isinstance(stream, ChatToResponsesStream)
        return stream.response()

    def assembler(self) -> ResponsesStreamAssembler:
        return ResponsesStreamAssembler()

    def assembled(self, assembler: Any) -> dict[str, Any] | None:
        assert isinstance(assembler, ResponsesStreamAssembler)
        return assembler.response() if assembler.done else None

    def remember(self, exchange: _Exchange, told: dict[str, Any]) -> None:
        response_id = told.get("id")
        if isinstance(response_id, str) and response_id:
            self.routes.items.remember(
                exchange.call_id, response_id, exchange.parsed.items + output_items(told)
            )
            kept = self.routes.instructions
            body = exchange.parsed.body
            own, previous = body.get("instructions"), body.get("previous_response_id")
            if isinstance(own, str) and own:
                kept[response_id] = own
            elif isinstance(previous, str) and previous in kept:
                kept[response_id] = kept[previous]
            while len(kept) > 8 * self.routes.config.responses_calls:
                kept.popitem(last=False)


class _Messages(_Api):
    provider = "anthropic"
    no_production = (
        "gateway.anthropic_url [TRAJSTREAM_GATEWAY__ANTHROPIC_URL] is not set: this request is "
        "not routed to Trinity and there is no Anthropic upstream"
    )

    def error(self, message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
        return messages_api.error_body(message, kind)

    def parse(self, body: Any, path_call: str | None) -> tuple[str, ParsedRequest]:
        try:
            parsed = messages_api.parse_request(body)
        except ApiRequestError as exc:
            raise ApiRefused(400, messages_api.error_body(str(exc))) from None
        return path_call or f"gw-{uuid.uuid4().hex}", parsed

    def has_production(self) -> bool:
        return bool(self.routes.config.anthropic_url)

    def production(self, headers: Any) -> tuple[str, dict[str, str]]:
        config = self.routes.config
        out = {
            "Content-Type": "application/json",
            "anthropic-version": headers.get("anthropic-version") or ANTHROPIC_VERSION,
        }
        if headers.get("anthropic-beta"):
            out["anthropic-beta"] = headers["anthropic-beta"]
        if self.routes._anthropic_key:
            out["x-api-key"] = self.routes._anthropic_key
        return f"{config.anthropic_url}/v1/messages", out

    def answer(self, told: dict[str, Any]) -> Answer:
        return answer_of_message(told)

    def stream_error(self, message: str) -> bytes:
        return encode_event(messages_api.error_body(message, "api_error"))

    def from_chat(self, completion: dict[str, Any], parsed: ParsedRequest) -> dict[str, Any]:
        return chat_to_message(completion, parsed)

    def chat_stream(self, parsed: ParsedRequest) -> _ChatStream:
        return ChatToMessagesStream(parsed)

    def told_stream(self, stream: _ChatStream) -> dict[str, Any] | None:
        return {}  # nothing to remember: the Messages API keeps no server-side state

    def assembler(self) -> MessagesStreamAssembler:
        return MessagesStreamAssembler()

    def assembled(self, assembler: Any) -> dict[str, Any] | None:
        assert isinstance(assembler, MessagesStreamAssembler)
        return assembler.message() if assembler.done else None
