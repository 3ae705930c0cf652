"""The chat completions routes (``/v1/chat/completions``, ``/calls/{id}/v1/chat/completions``):
parse, decide the route, forward (JSON or the stream chunk by chunk, asking for usage), answer,
record; in shadow mode Trinity's answer to the same request joins the recorded step.

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
from .requests import parse_messages
from .state import GatewayState
from .upstream import upstream_failed

log = logging.getLogger(__name__)


class ChatRoutes(GatewayState):
    """The chat completions routes, on the gateway's shared state."""

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """OpenAI chat completions (JSON or streamed): routed to Trinity or production, the
        step recorded; without a call id in the path, a call of one step."""
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
        if body.get("stream"):
            return await self._forward_stream(
                raw, request, call_id, body, state, headers, path_call, timing
            )
        return await self._forward_json(raw, call_id, body, state, headers, path_call, timing)


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
    ) -> Awaitable[Any] | None:
        """Record the answer the client saw (in shadow mode once Trinity's answer joins it);
        returns what is done once it is on the broker."""
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
                one_step=one_step,
            )  # fmt: skip
            return self._on_broker(self.publisher.publish_job(call_id, job))
        parsed = json.loads(answer) if isinstance(answer, bytes) else answer
        if not isinstance(parsed, dict):
            raise ValueError("the answer is not a JSON object")
        step = llm_step(call_id, body, parsed, upstream=upstream, latency_ms=latency_ms, now=now)
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
                ack = self._record(  # the answer is read by the recorder
                    call_id,
                    body,
                    raw,
                    data,
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
            # the terminal event is held until the records are handed over (buffered) or on
            # the broker (acked)
            assembler = StreamAssembler(strip_usage=not asked, hold_done=True)
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
                        raw,
                        assembler.completion(),
                        state,
                        upstream=route.upstream,
                        latency_ms=latency,
                        one_step=path_call is None,
                    )
            # the stream's end only once its records are handed over (buffered) / acked
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

