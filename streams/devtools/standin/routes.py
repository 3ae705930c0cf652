"""The stand-in's routes: Trinity's serve-mode routes (chat completions, models, health,
metrics, feedback, commit), the LLM judge's, and the ``/_standin/`` routes that show and steer
it (see :mod:`streams.devtools.standin`).

May import: anything; a dev tool, never imported by the product.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any, Final

from aiohttp import web

from .journal import Journal
from .state import (
    _MAX_TASK_ID_LENGTH,
    ChatFault,
    CommitRecord,
    Experience,
    Fault,
    FeedbackRecord,
    JudgeCall,
    JudgeFault,
    StandInState,
    _is_int,
    _is_number,
    _utcnow,
    judge_score,
)

__all__ = [
    "Routes",
]


class _Cut(Exception):
    """A ``cut`` chat fault: the stream stops here."""


_RECORD: Any = (
    web.RequestKey("standin_record", object) if hasattr(web, "RequestKey") else "standin_record"
)
"""The ``/feedback`` or ``/commit`` record of a request, for the journal."""


class Routes:
    """The stand-in's route handlers over its state; :class:`.server.StandIn` serves them (and
    owns the state, the fault switch and the listening socket)."""

    model: str
    _state: StandInState
    _created: int
    _journal: Journal | None
    sync_interval: int
    _released: asyncio.Event

    async def set_fault(self, fault: Fault) -> None:
        raise NotImplementedError

    def set_chat_fault(self, fault: ChatFault) -> None:
        raise NotImplementedError

    async def reset(self) -> None:
        raise NotImplementedError

    def _add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/feedback", self._feedback)
        app.router.add_post("/commit", self._commit)
        app.router.add_post("/judge/v1/chat/completions", self._judge)
        app.router.add_post("/_standin/judge", self._post_judge)
        app.router.add_get("/_standin/state", self._get_state)
        app.router.add_get("/_standin/counts", self._get_counts)
        app.router.add_post("/_standin/fault", self._post_fault)
        app.router.add_post("/_standin/chat-fault", self._post_chat_fault)
        app.router.add_post("/_standin/version", self._post_version)
        app.router.add_post("/_standin/reset", self._post_reset)

    def _take_fault(self) -> Fault:
        """The fault that applies to this /feedback or /commit; counts it down."""
        fault = self._state.fault
        if fault.mode in ("error", "slow") and fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                self._state.fault = Fault()
        return fault

    def _take_chat_fault(self) -> ChatFault:
        """The chat fault that applies to this chat request; counts it down."""
        fault = self._state.chat_fault
        if fault.mode != "ok":
            self._state.chat_faulted += 1
            if fault.count is not None:
                fault.count -= 1
                if fault.count <= 0:
                    self._state.chat_fault = ChatFault()
        return fault

    @staticmethod
    def _drop(request: web.Request) -> web.Response:
        """Drop the connection without another byte, as a process that died would."""
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)  # never sent: the connection is gone

    @staticmethod
    def _fault_response(fault: Fault) -> web.Response:
        return web.json_response(
            {"error": f"stand-in fault: status {fault.status}"}, status=fault.status
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, error = _parse_json(await _read_text(request))
        if error is not None:
            return web.json_response({"detail": error}, status=400)
        fault = self._take_chat_fault()
        if fault.mode == "error":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else None
            return web.json_response(
                {
                    "error": {
                        "message": f"stand-in chat fault: status {fault.status}",
                        "type": "server_error",
                        "code": fault.status,
                    }
                },
                status=fault.status,
                headers=headers,
            )
        if fault.mode == "hang":
            await self._released.wait()
            return self._drop(request)
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay)
            if request.transport is None or request.transport.is_closing():
                return self._drop(request)  # the client gave up waiting: nobody to answer
        if fault.mode == "cut" and not body.get("stream"):
            return self._drop(request)
        cut_after = fault.after if fault.mode == "cut" else None
        self._state.request_count += 1
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return web.json_response(
                {
                    "error": {
                        "message": "messages must be a non-empty list",
                        "type": "BadRequestError",
                        "param": "messages",
                        "code": 400,
                    }
                },
                status=400,
            )
        model = body.get("model") if isinstance(body.get("model"), str) else self.model
        prompt = " ".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        question = _last_user_text(messages)
        snippet = " ".join(question.split())[:_REPLY_SNIPPET] or "(no user message)"
        reply = f"stand-in reply to: {snippet}"
        msg_id = f"chatcmpl-{uuid.uuid4().hex}"
        tool_call = _tool_call_for(body, messages, question, msg_id)
        row = self._state.experiences[msg_id] = Experience(
            msg_id=msg_id,
            model=str(model),
            prompt=question,
            completion=reply,
            served_at=time.monotonic(),
            model_version=self._state.model_version,
        )
        if self._journal is not None:
            self._journal.served(row)
        if body.get("stream"):
            include_usage = isinstance(body.get("stream_options"), dict) and bool(
                body["stream_options"].get("include_usage")
            )
            return await self._stream(
                request, msg_id, str(model), prompt, reply, tool_call, include_usage, cut_after
            )
        prompt_ids, reply_ids = _token_ids(prompt), _token_ids(reply)
        message: dict[str, Any] = {"role": "assistant", "content": reply, "tool_calls": []}
        if tool_call is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [tool_call]}
        return web.json_response(
            {
                "id": msg_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "prompt_token_ids": prompt_ids,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": {"content": _logprobs(reply)},
                        "finish_reason": "stop" if tool_call is None else "tool_calls",
                        "token_ids": reply_ids,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt_ids),
                    "completion_tokens": len(reply_ids),
                    "total_tokens": len(prompt_ids) + len(reply_ids),
                },
            }
        )

    async def _stream(
        self,
        request: web.Request,
        msg_id: str,
        model: str,
        prompt: str,
        reply: str,
        tool_call: dict[str, Any] | None = None,
        include_usage: bool = False,
        cut_after: int | None = None,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = int(time.time())
        sent = 0

        async def write(data: bytes) -> None:  # every chunk, until a cut fault drops the rest
            nonlocal sent
            if cut_after is not None and sent >= cut_after:
                raise _Cut
            await response.write(data)
            sent += 1
            if cut_after is not None:
                await asyncio.sleep(0.01)  # each chunk apart, as a model streams

        try:
            await self._stream_chunks(
                write, msg_id, model, created, prompt, reply, tool_call, include_usage
            )
        except _Cut:
            return self._drop(request)
        await response.write_eof()
        return response

    async def _stream_chunks(
        self,
        write: Callable[[bytes], Awaitable[None]],
        msg_id: str,
        model: str,
        created: int,
        prompt: str,
        reply: str,
        tool_call: dict[str, Any] | None,
        include_usage: bool,
    ) -> None:

        def event(choice: dict[str, Any], **top: Any) -> bytes:
            data = {
                "id": msg_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, **choice}],
                **top,
            }
            return f"data: {json.dumps(data)}\n\n".encode()

        await write(
            event(
                {"delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                prompt_token_ids=_token_ids(prompt),
            )
        )
        if tool_call is None:
            await write(
                event(
                    {
                        "delta": {"content": reply},
                        "logprobs": {"content": _logprobs(reply)},
                        "finish_reason": None,
                        "token_ids": _token_ids(reply),
                    }
                )
            )
        else:  # as OpenAI streams a tool call: id and name first, then the arguments in pieces
            fn = tool_call["function"]
            head = {"index": 0, "id": tool_call["id"], "type": "function"}
            await write(
                event(
                    {
                        "delta": {"tool_calls": [{**head, "function": {"name": fn["name"]}}]},
                        "finish_reason": None,
                    }
                )
            )
            args = fn["arguments"]
            for piece in (args[: len(args) // 2], args[len(args) // 2 :]):
                delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                await write(event({"delta": delta, "finish_reason": None}))
        finish = "stop" if tool_call is None else "tool_calls"
        await write(event({"delta": {}, "finish_reason": finish}))
        if include_usage:
            prompt_n, reply_n = len(_token_ids(prompt)), len(_token_ids(reply))
            usage = {
                "prompt_tokens": prompt_n,
                "completion_tokens": reply_n,
                "total_tokens": prompt_n + reply_n,
            }
            data = {
                "id": msg_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            await write(f"data: {json.dumps(data)}\n\n".encode())
        await write(b"data: [DONE]\n\n")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model,
                        "object": "model",
                        "created": self._created,
                        "owned_by": "trajstream-standin",
                    }
                ],
            }
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.json_response(self._state.metrics())

    async def _feedback(self, request: web.Request) -> web.Response:
        response = await self._feedback_inner(request)
        if self._journal is not None and _RECORD in request:
            self._journal.feedback(request[_RECORD])
        return response

    async def _feedback_inner(self, request: web.Request) -> web.Response:
        text = await _read_text(request)
        body, error = _parse_json(text)
        record = FeedbackRecord(time.monotonic(), _utcnow(), text if error else body)
        self._state.feedback.append(record)
        request[_RECORD] = record
        fault = self._take_fault()
        if fault.mode == "error":
            record.status = fault.status
            return self._fault_response(fault)
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay)
        if error is not None:
            record.status = 400
            return web.json_response({"detail": error}, status=400)
        reward = body.get("reward")
        msg_ids = body.get("msg_ids")
        task_id = body.get("task_id")
        run_id = body.get("run_id", 0)
        if msg_ids is None or reward is None:
            record.status = 400
            return web.json_response({"error": "msg_ids and reward are required"}, status=400)
        if not isinstance(msg_ids, list) or not _is_number(reward):
            record.status = 400
            return web.json_response(
                {"error": "msg_ids must be a list and reward must be a number"}, status=400
            )
        record.violations = _violations(msg_ids, task_id, run_id)
        state = self._state
        for msg_id in msg_ids:
            row = state.experiences.get(msg_id) if isinstance(msg_id, str) else None
            if row is None or row.rewarded:
                continue
            row.reward, row.task_id, row.run_id, row.rewarded = float(reward), task_id, run_id, True
            state.ready.append(msg_id)
            record.applied.append(msg_id)
        state.ready_count_total += len(record.applied)
        record.status = 200
        return web.json_response({"status": "success"})

    async def _commit(self, request: web.Request) -> web.Response:
        response = await self._commit_inner(request)
        if self._journal is not None and _RECORD in request:
            self._journal.commit(request[_RECORD], self._state.model_version)
        return response

    async def _commit_inner(self, request: web.Request) -> web.Response:
        record = CommitRecord(time.monotonic(), _utcnow())
        self._state.commits.append(record)
        request[_RECORD] = record
        fault = self._take_fault()
        if fault.mode == "error":
            record.status = fault.status
            return self._fault_response(fault)
        if fault.mode == "slow":
            await asyncio.sleep(fault.delay)
        state = self._state
        drained, state.ready = state.ready, []
        state.explore_step += 1
        for msg_id in drained:
            state.experiences[msg_id].committed_at_step = state.explore_step
        state.trained.extend(drained)
        record.status, record.drained, record.step = 200, len(drained), state.explore_step
        record.msg_ids = drained
        if self.sync_interval and state.explore_step % self.sync_interval == 0:
            state.model_version += 1  # the trainer's new weights, synced to the explorer
        return web.json_response({"status": "success"})

    async def _judge(self, request: web.Request) -> web.Response:
        """The LLM judge: a deterministic score of the last user message, or the fault."""
        body, error = _parse_json(await _read_text(request))
        state = self._state
        call = JudgeCall(time.monotonic(), request.headers.get("x-trajstream-call-id"), 200)
        state.judge.append(call)
        fault = state.judge_fault
        if fault.mode != "ok" and fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                state.judge_fault = JudgeFault()
        if fault.mode == "error":
            call.status = fault.status
            return web.json_response(
                {"error": {"message": "stand-in judge fault", "code": fault.status}},
                status=fault.status,
            )
        messages = body.get("messages") if error is None else None
        if not isinstance(messages, list) or not messages:
            call.status = 400
            return web.json_response({"error": {"message": "messages required"}}, status=400)
        if fault.mode == "garbage":
            call.garbage = True
            content = "This answer looks quite good to me, I would rate it highly!"
        else:
            call.score = judge_score(_last_user_text(messages))
            content = json.dumps({"score": call.score, "reason": "stand-in judge"})
        return web.json_response(
            {
                "id": f"chatcmpl-judge-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "standin-judge"),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
            }
        )

    async def _post_judge(self, request: web.Request) -> web.Response:
        data, error = _parse_json(await _read_text(request))
        if error is not None:
            return web.json_response({"detail": error}, status=400)
        try:
            self._state.judge_fault = JudgeFault.from_json(data)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"status": "success", "judge": asdict(self._state.judge_fault)})

    async def _get_counts(self, request: web.Request) -> web.Response:
        """Small and cheap, for polling: how much was received so far."""
        s = self._state
        return web.json_response(
            {
                "feedback_requests": len(s.feedback),
                "feedback_ok": sum(1 for f in s.feedback if f.status == 200),
                "msg_ids_applied": sum(len(f.applied) for f in s.feedback),
                "commits": len(s.commits),
                "trained": len(s.trained),
                "explore_step": s.explore_step,
                "model_version": s.model_version,
                "chat_requests": s.request_count,
                "chat_faulted": s.chat_faulted,
                "last_feedback_at": s.feedback[-1].at if s.feedback else None,
                "judge_requests": len(s.judge),
                "judge_ok": sum(1 for j in s.judge if j.score is not None),
            }
        )

    async def _get_state(self, request: web.Request) -> web.Response:
        return web.json_response(self._state.to_json())

    async def _post_fault(self, request: web.Request) -> web.StreamResponse:
        data, error = _parse_json(await _read_text(request))
        if error is not None:
            return web.json_response({"detail": error}, status=400)
        try:
            fault = Fault.from_json(data)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if fault.mode != "down":
            await self.set_fault(fault)
            return web.json_response({"status": "success", "fault": fault.to_json()})
        # Answer first: going down closes this very connection.
        fault.until = time.monotonic() + fault.seconds
        response = web.json_response({"status": "success", "fault": fault.to_json()})
        response.force_close()
        await response.prepare(request)
        await response.write_eof()
        await self.set_fault(fault)
        return response

    async def _post_chat_fault(self, request: web.Request) -> web.Response:
        data, error = _parse_json(await _read_text(request))
        if error is not None:
            return web.json_response({"detail": error}, status=400)
        try:
            fault = ChatFault.from_json(data)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.set_chat_fault(fault)
        return web.json_response({"status": "success", "chat_fault": fault.to_json()})

    async def _post_version(self, request: web.Request) -> web.Response:
        data, error = _parse_json(await _read_text(request))
        if error is not None:
            return web.json_response({"detail": error}, status=400)
        version = data.get("model_version")
        if not _is_int(version) or version < 0:
            return web.json_response(
                {"error": "model_version must be a non-negative integer"}, status=400
            )
        self._state.model_version = version
        if self._journal is not None:
            self._journal.version(version)
        return web.json_response({"status": "success", "model_version": version})

    async def _post_reset(self, request: web.Request) -> web.Response:
        await self.reset()
        return web.json_response({"status": "success"})


# -- pure helpers ------------------------------------------------------------------------------


_REPLY_SNIPPET: Final = 60


async def _read_text(request: web.Request) -> str:
    try:
        return await request.text()
    except UnicodeDecodeError:
        return (await request.read()).decode("utf-8", errors="replace")


def _parse_json(text: str) -> tuple[Any, str | None]:
    """Return (object, None), or (None, error message) when ``text`` is not a JSON object."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        return None, f"Invalid JSON: {exc}"
    if not isinstance(data, dict):
        return None, "Invalid JSON: the body must be a JSON object"
    return data, None


def _violations(msg_ids: list[Any], task_id: Any, run_id: Any) -> list[str]:
    found = []
    if any(not isinstance(m, str) for m in msg_ids):
        found.append("msg_ids must be strings")
    if task_id is not None and (not isinstance(task_id, str) or len(task_id) > _MAX_TASK_ID_LENGTH):
        found.append(f"task_id must be a string of at most {_MAX_TASK_ID_LENGTH} characters")
    if not _is_int(run_id):
        found.append("run_id must be an integer")
    return found


def _text_of(content: Any) -> str:
    """The text of an OpenAI message ``content``: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _tool_call_for(
    body: dict[str, Any], messages: list[Any], question: str, msg_id: str
) -> dict[str, Any] | None:
    """A tool call to the request's first tool when tools are offered and the last message is
    not a tool result (so an agent loop ends: call a tool, get its result, answer)."""
    tools = body.get("tools")
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    if last.get("role") == "tool" or body.get("tool_choice") == "none":
        return None
    fn = tools[0].get("function") if isinstance(tools[0].get("function"), dict) else {}
    return {
        "id": f"call_{msg_id[-12:]}",
        "type": "function",
        "function": {
            "name": str(fn.get("name") or "tool"),
            "arguments": json.dumps({"query": question}),
        },
    }


def _last_user_text(messages: list[Any]) -> str:
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            return _text_of(message.get("content"))
    return ""


def _token_ids(text: str) -> list[int]:
    """Fake but deterministic token ids: one per whitespace-separated word."""
    return [zlib.crc32(word.encode()) % 32000 for word in text.split()]


def _logprobs(text: str) -> list[dict[str, Any]]:
    return [
        {
            "token": word,
            "logprob": -(zlib.crc32(word.encode()) % 1000) / 1000,
            "bytes": list(word.encode()),
            "top_logprobs": [],
        }
        for word in text.split()
    ]
