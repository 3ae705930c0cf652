"""The chat completions routes (``/v1/chat/completions``, ``/calls/{id}/v1/chat/completions``):
parse, decide the route, forward (JSON or the stream chunk by chunk, asking for usage), answer,
record; in shadow mode Trinity's answer to the same request joins the recorded step.

A request of a call routed to Trinity goes through :meth:`.policy.PolicyUpstream.open` first:
when Trinity cannot answer it before any byte reached the client, production answers it
(``X-Trajstream-Upstream: production``, ``X-Trajstream-Fallback: <reason>``, the step recorded
with ``fallback``), and the rest of the call too (``sticky``). A Trinity stream that breaks
after its first bytes ends with an error event, and its step is recorded with ``error_type``.

May import: what :mod:`.state` imports, and :mod:`.state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Any

import aiohttp
import pydantic
from aiohttp import web

from ...errors import UpstreamFailed
from ...models import Completion, utcnow
from ..chat import StreamAssembler, llm_step, steps_of_request
from ..jobs import start_job, step_job
from .calls import CallState, Timing, one_step_end
from .policy import PolicyAnswer, PolicyFallback
from .requests import parse_messages
from .state import GatewayState
from .upstream import upstream_failed


class Answering:
    """Who answers one request: ``which`` upstream, Trinity's answer already opened (its first
    bytes read), or why production answers a call routed to Trinity (``fallback``)."""

    __slots__ = ("asked", "began", "fallback", "policy", "which")

    def __init__(
        self,
        which: str,
        policy: PolicyAnswer | None = None,
        fallback: str | None = None,
        asked: bool = True,
        began: float = 0.0,
    ) -> None:
        self.which = which
        self.policy = policy
        self.fallback = fallback
        self.asked = asked
        """Trinity's stream: whether the client asked for usage itself (else it is stripped)."""
        self.began = began
        """Trinity's answer: when it was asked for (``time.perf_counter()``)."""

    def marks(self) -> dict[str, Any] | None:
        """The step's ``policy_version`` or ``fallback`` (None: neither)."""
        if self.fallback is not None:
            return {"fallback": self.fallback}
        if self.policy is not None and self.policy.version is not None:
            return {"policy_version": self.policy.version}
        return None


def stream_error_event(message: str, code: str) -> bytes:
    """An error event in a chat completions stream (the openai SDK raises an APIError on it)."""
    error = {"message": message, "type": "server_error", "param": None, "code": code}
    return f"data: {json.dumps({'error': error})}\n\n".encode()

log = logging.getLogger(__name__)


class ChatRoutes(GatewayState):
    """The chat completions routes, on the gateway's shared state."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """OpenAI chat completions (JSON or streamed): routed to Trinity or production (to
        production when Trinity cannot answer a call routed to it: ``X-Trajstream-Fallback``
        says why), the step recorded; without a call id in the path, a call of one step."""
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
        # validates the headers too; the recorder adds the messages (read from ``raw``)
        start = self._start_event(request, call_id, [])
        steps = steps_of_request(call_id, messages, start.event_time) if path_call else ()
        state, records = self._open_call(start, path_call, steps)
        route = state.route
        headers = {
            "X-Trajstream-Call-Id": call_id,
            "X-Trajstream-Upstream": route.upstream,
            "X-Trajstream-Selected": "true" if route.selection.selected else "false",
            "X-Trajstream-Seq": str(len(messages)),
        }
        for record in records:  # START and tool steps first: they happened before the answer
            if record is start:  # built and encoded by the recorder, its messages from raw
                self.publisher.publish_job(call_id, start_job(start, raw))
            else:
                self.publisher.publish(record)

        if route.shadow and not state.has(len(messages)):
            # Trinity answers the same request meanwhile; its answer joins the recorded step
            state.await_shadow(len(messages), asyncio.ensure_future(self._shadow(call_id, body)))
        stream = body.get("stream") is True
        answering = (
            await self._ask_policy(body, raw, state, headers, timing, stream)
            if route.upstream == "trinity"
            else Answering(route.upstream)
        )
        try:
            if stream:
                return await self._forward_stream(
                    raw, request, call_id, body, state, headers, path_call, timing, answering
                )
            return await self._forward_json(
                raw, call_id, body, state, headers, path_call, timing, answering
            )
        finally:  # a policy answer whose outcome was not told: its probe slot is free again
            if answering.policy is not None:
                self.policy.release(answering.policy)

    async def _ask_policy(
        self,
        body: dict[str, Any],
        raw: bytes,
        state: CallState,
        headers: dict[str, str],
        timing: Timing,
        stream: bool,
    ) -> Answering:
        """Trinity's answer opened, or production's turn: the call's fallback noted (sticky),
        the headers say so, the time spent on Trinity counted as the upstream's."""
        url, upstream_headers, data, asked = self._outgoing("trinity", body, raw)
        began = time.perf_counter()
        try:
            answer = await self.policy.open(
                state.fallback, url, upstream_headers, data, stream=stream
            )
        except PolicyFallback as exc:
            return self._fall_back(exc.reason, state, headers, "chat")
        finally:
            timing.upstream_s += time.perf_counter() - began
        return Answering("trinity", answer, asked=asked, began=began)

    def _fall_back(
        self, reason: str, state: CallState, headers: dict[str, str], api: str
    ) -> Answering:
        if state.fallback is None:
            state.fallback = reason
        self.policy.fell_back(reason, api)
        headers["X-Trajstream-Upstream"] = "production"
        headers["X-Trajstream-Fallback"] = reason
        return Answering("production", fallback=reason)


    def _record(
        self,
        call_id: str,
        body: dict[str, Any],
        raw: bytes,
        answer: bytes | dict[str, Any],
        state: CallState,
        *,
        upstream: str,
        latency_ms: float,
        one_step: bool,
        marks: dict[str, Any] | None = None,
    ) -> Awaitable[Any] | None:
        """Record the answer the client saw (in shadow mode once Trinity's answer joins it);
        returns what is done once it is on the broker. ``marks``: the step's
        ``policy_version``, ``fallback`` or ``error_type``."""
        now = utcnow()
        seq = len(body["messages"])  # llm_step's seq, known before the step is built
        if state.has(seq) and not one_step:
            # a retried request: the first answer is the step (on the broker with what is queued)
            return self._on_broker(self.publisher.position)
        state.add(seq)
        shadow = state.take_shadow(seq)
        if shadow is None:  # built and encoded by the recorder, after the answer was sent
            job = step_job(
                call_id, raw, answer, upstream=upstream, latency_ms=latency_ms, now=now,
                one_step=one_step, marks=marks,
            )  # fmt: skip
            return self._on_broker(self.publisher.publish_job(call_id, job))
        parsed = json.loads(answer) if isinstance(answer, bytes) else answer
        if not isinstance(parsed, dict):
            raise ValueError("the answer is not a JSON object")
        step = llm_step(
            call_id, body, parsed, upstream=upstream, latency_ms=latency_ms, now=now,
            **(marks or {}),
        )  # fmt: skip
        task = self._spawn(self._join_shadow(step, body, shadow, one_step))
        state.watch(task)
        return self._after(task) if self.acked else None  # nobody waits when buffered


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
            position = self.publisher.publish(one_step_end(step))
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
        answering: Answering,
    ) -> web.StreamResponse:
        which = answering.which
        opened = answering.policy
        if opened is not None:  # Trinity's answer, read whole within policy_timeout_s
            began = answering.began
            status, data, got = opened.status, opened.body, opened.headers
        else:
            began = time.perf_counter()
            try:
                upstream, _ = await self._send(which, body, raw)
                async with upstream:
                    data = await upstream.read()
            except UpstreamFailed as exc:
                return self._upstream_error(exc, headers)
            except (TimeoutError, aiohttp.ClientError) as exc:
                return self._upstream_error(upstream_failed(which, exc, "broke off"), headers)
            status, got = upstream.status, upstream.headers
            timing.upstream_s += time.perf_counter() - began
        latency = (time.perf_counter() - began) * 1000
        response = web.Response(status=status, body=data, headers=headers)
        response.headers["Content-Type"] = got.get("Content-Type", "application/json")
        if status == 200:
            self.stats.answered[which] += 1
            ack = None
            with contextlib.suppress(ValueError, TypeError, pydantic.ValidationError):
                ack = self._record(  # the answer is read by the recorder
                    call_id,
                    body,
                    raw,
                    data,
                    state,
                    upstream=which,
                    latency_ms=latency,
                    one_step=path_call is None,
                    marks=answering.marks(),
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
        answering: Answering,
    ) -> web.StreamResponse:
        which = answering.which
        opened = answering.policy
        began = answering.began if opened is not None else time.perf_counter()
        first = b""
        if opened is not None:  # Trinity's stream, its first bytes read within policy_timeout_s
            if opened.status != 200:  # a refusal that is no failure: as Trinity answered it
                self.stats.upstream_errors += 1
                refused = web.Response(status=opened.status, body=opened.body, headers=headers)
                refused.headers["Content-Type"] = opened.headers.get(
                    "Content-Type", "application/json"
                )
                return refused
            upstream, first, asked = opened.response, opened.body, answering.asked
        else:
            try:  # usage on every stream: asked for; stripped from a client that did not ask
                upstream, asked = await self._send(which, body, raw)
            except UpstreamFailed as exc:
                return self._upstream_error(exc, headers)
        async with upstream:
            if upstream.status != 200:
                self.stats.upstream_errors += 1
                try:
                    data = await upstream.read()
                except (TimeoutError, aiohttp.ClientError):
                    data = b""
                refused = web.Response(status=upstream.status, body=data, headers=headers)
                refused.headers["Content-Type"] = upstream.headers.get(
                    "Content-Type", "application/json"
                )
                return refused
            # the upstream's time: to its headers (Trinity's: counted already), ...
            waited = 0.0 if opened is not None else time.perf_counter() - began
            response = web.StreamResponse(status=200, headers=headers)
            response.headers["Content-Type"] = upstream.headers.get(
                "Content-Type", "text/event-stream"
            )
            response.headers["Cache-Control"] = "no-cache"
            await response.prepare(request)
            # the terminal event is held until the records are handed over (buffered) or on
            # the broker (acked)
            assembler = StreamAssembler(strip_usage=not asked, hold_done=True)
            broke: BaseException | None = None
            try:
                chunk, chunks = first, upstream.content.iter_any().__aiter__()
                while True:
                    if chunk:
                        forwarded = assembler.feed(chunk)
                        if forwarded:
                            await response.write(forwarded)
                    t = time.perf_counter()
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        waited += time.perf_counter() - t
                        break
                    except (TimeoutError, aiohttp.ClientError) as exc:  # the upstream's side
                        broke = exc
                        break
                    waited += time.perf_counter() - t  # ... and each wait for its next bytes
                if broke is None:
                    timing.upstream_s, timing.stream = timing.upstream_s + waited, True
                    rest = assembler.rest()
                    if rest:
                        await response.write(rest)
            except (aiohttp.ClientError, ConnectionResetError) as exc:  # the agent went away
                log.warning("the agent of call %s left its stream: %s", call_id, exc)
                return response
            if broke is not None:
                return await self._stream_broke(
                    broke, response, call_id, body, raw, state, path_call, answering, assembler,
                    began,
                )  # fmt: skip
            if opened is not None:
                self.policy.answered(opened)
            latency = (time.perf_counter() - began) * 1000
            self.stats.answered[which] += 1
            ack = None
            if assembler.done:
                with contextlib.suppress(pydantic.ValidationError):
                    ack = self._record(
                        call_id,
                        body,
                        raw,
                        assembler.completion(),
                        state,
                        upstream=which,
                        latency_ms=latency,
                        one_step=path_call is None,
                        marks=answering.marks(),
                    )
            # the stream's end only once its records are handed over (buffered) / acked
            with contextlib.suppress(ConnectionResetError):
                if await self._durable(ack):
                    await response.write(assembler.done_event)
                else:
                    await response.write(
                        stream_error_event(
                            "the answer could not be recorded (gateway.durability = acked; "
                            "the broker did not acknowledge)",
                            "recording_unavailable",
                        )
                    )
            with contextlib.suppress(ConnectionResetError):
                await response.write_eof()
        return response

    async def _stream_broke(
        self,
        exc: BaseException,
        response: web.StreamResponse,
        call_id: str,
        body: dict[str, Any],
        raw: bytes,
        state: CallState,
        path_call: str | None,
        answering: Answering,
        assembler: StreamAssembler,
        began: float,
    ) -> web.StreamResponse:
        """The upstream's stream broke after its first bytes reached the agent: no fallback is
        possible. The agent gets an error event; a Trinity step is recorded as it got that far,
        with ``error_type`` (its call is not trained)."""
        log.warning("stream of call %s broke off: %s", call_id, type(exc).__name__)
        with contextlib.suppress(ConnectionResetError, aiohttp.ClientError):
            await response.write(
                stream_error_event(
                    f"the {answering.which} model's stream broke off: {type(exc).__name__}",
                    "upstream_error",
                )
            )
        if answering.policy is None:
            return response  # production's broken stream: recorded nowhere, as before
        error_type = self.policy.broke(answering.policy, exc)
        ack = None
        with contextlib.suppress(ValueError, TypeError, pydantic.ValidationError):
            marks: dict[str, Any] = {"error_type": error_type}
            if answering.policy.version is not None:
                marks["policy_version"] = answering.policy.version
            ack = self._record(
                call_id,
                body,
                raw,
                assembler.completion(),
                state,
                upstream="trinity",
                latency_ms=(time.perf_counter() - began) * 1000,
                one_step=path_call is None,
                marks=marks,
            )
        await self._durable(ack)
        return response

    async def _shadow(
        self, call_id: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], float] | None:
        """The same request to Trinity (not streamed): its answer and latency, None on failure."""
        shadow_body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        began = time.perf_counter()
        try:  # bounded as a routed request is (policy_timeout_s), held back by the breaker
            url, headers, data, _ = self._outgoing("trinity", shadow_body)
            opened = await self.policy.open(None, url, headers, data, stream=False)
            if opened.status != 200:
                raise UpstreamFailed(
                    opened.status, opened.body[:200].decode(errors="replace"), ""
                )
            answer = json.loads(opened.body)
            if not isinstance(answer, dict):
                raise ValueError("the answer is not a JSON object")
            return answer, (time.perf_counter() - began) * 1000
        except asyncio.CancelledError:
            raise
        except PolicyFallback as exc:  # the breaker logs its changes, not each request
            self.stats.shadow_failures += 1
            log.debug("shadow request of call %s to Trinity failed: %s", call_id, exc)
            return None
        except Exception as exc:
            self.stats.shadow_failures += 1
            log.warning("shadow request of call %s to Trinity failed: %s", call_id, exc)
            return None

