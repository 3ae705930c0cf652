"""A stand-in for a Trinity-RFT explorer in serve mode, for tests, demos and local runs.

:class:`StandIn` is an aiohttp server that answers the routes of
Trinity-RFT's serve mode the way Trinity does, without a model or a trainer:

- ``POST /v1/chat/completions`` serves an OpenAI chat completion with a fresh
  ``chatcmpl-<uuid hex>`` id, the request's ``model`` echoed, a short deterministic reply derived
  from the last user message, fake ``prompt_token_ids``/``token_ids``/``logprobs`` (Trinity forces
  those on) and ``usage``; it stores one experience row per completion, keyed by the id.
  ``"stream": true`` answers server-sent events (a role chunk, a content chunk, a finish chunk,
  ``data: [DONE]``) with one id and stores the row likewise (a final usage chunk when
  ``stream_options.include_usage``). When the request offers ``tools`` and its last message is
  not a ``tool`` result, the answer is a call of the first tool (``finish_reason
  "tool_calls"``, arguments ``{"query": <last user text>}``; streamed as OpenAI does, id and
  name first, then the arguments in pieces), so a simulated agent loop calls one tool and then
  answers. It serves as a production model as well (``StandIn(model="production")``). A body
  without a ``messages`` list answers 400
  ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``.
- ``GET /v1/models``, ``GET /health`` (empty 200) and ``GET /metrics`` (Trinity's five keys; as
  in Trinity, ``rollout/ready_experience_count`` counts every experience ever made ready).
- ``POST /feedback`` with Trinity's exact 400 bodies; it rewards rows that exist and were not
  rewarded before and queues them ready; unknown ids and repeats answer 200 and do nothing.
  Unlike Trinity, a bool ``reward`` is "not a number" (Trinity's ``isinstance`` accepts it).
- ``POST /commit`` (body ignored) drains the ready rows into ``trained`` and advances the
  explore step by one, even when nothing is ready.

A body that is not JSON (or not a JSON object) answers 400 ``{"detail": "Invalid JSON: ..."}``,
the shape Trinity's chat route uses; Trinity's ``/feedback`` would answer a bare 500 instead.

It also serves as an LLM judge (the ``reward.judge`` settings: ``url = <stand-in>/judge/v1``):
``POST /judge/v1/chat/completions`` answers ``{"score": s, "reason": ...}`` as the message
content, ``s`` derived from the sha256 of the request's last user message (so the same
trajectory always gets the same score), and records every request (``judge`` in the state,
``judge_requests``/``judge_ok`` in ``/_standin/counts``; the ``x-trajstream-call-id`` header
names the call). ``POST /_standin/judge`` steers it, without touching the Trinity routes::

    {"mode": "ok"}
    {"mode": "garbage", "count": 1}                next answer is prose, not the JSON asked for
    {"mode": "error", "status": 503, "count": 2}   next 2 judge requests answer 503

For tests and people, ``/_standin/`` routes expose and steer it: ``GET /_standin/state`` (every
``/feedback`` body as received and every ``/commit``, in order, with monotonic timestamps; the
experience rows; the explore step; the fault), ``POST /_standin/reset`` and
``POST /_standin/fault`` with one of::

    {"mode": "ok"}
    {"mode": "error", "status": 503, "count": 5}   next 5 /feedback or /commit answer 503
    {"mode": "slow", "delay": 2.0, "count": 10}    next 10 sleep 2 s, then are served normally
    {"mode": "down", "seconds": 30}                listening socket closed for 30 s

``count`` may be omitted or null: the fault then lasts until changed. A slow request is applied
after its delay even if the client gave up waiting, as a real server would. ``down`` also closes
the open keep-alive connections, so clients see connection errors, and it cannot be lifted over
HTTP (nothing listens): it ends after ``seconds``, or in process via :meth:`StandIn.set_fault`.
Faults never affect ``/_standin/`` routes or the chat, models, health and metrics routes
(except ``down``, which affects everything).

Why one module (of some 950 lines, and a class, StandIn, of some 520): it is one server whose routes
share one state and one fault switch; the gateway work edits it in parallel, so it is split only
after that lands.

May import: anything; a dev tool, never imported by the product (core, runtime, io, capture).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import signal
import time
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, cast

import httpx
from aiohttp import web

__all__ = [
    "CommitRecord",
    "Experience",
    "Fault",
    "FaultMode",
    "FeedbackRecord",
    "JudgeCall",
    "JudgeFault",
    "StandIn",
    "StandInState",
    "fetch_state",
    "judge_score",
    "reset_state",
    "run",
    "set_fault",
]

logger = logging.getLogger(__name__)

FaultMode = Literal["ok", "error", "slow", "down"]
_FAULT_MODES: Final = ("ok", "error", "slow", "down")
_MAX_TASK_ID_LENGTH: Final = 64
_DEFAULT_PORT: Final = 8010  # Trinity's serve-mode default
_REPLY_SNIPPET: Final = 60


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Experience:
    """One served chat completion, as Trinity stores it (minus real tokens)."""

    msg_id: str
    model: str
    prompt: str
    completion: str
    served_at: float
    reward: float | None = None
    task_id: Any = None
    run_id: Any = None
    rewarded: bool = False
    committed_at_step: int | None = None
    """Explore step reached by the commit that drained this row into training."""


@dataclass
class FeedbackRecord:
    """One ``POST /feedback`` as received, whatever was answered."""

    at: float
    """``time.monotonic()`` on arrival (comparable across processes on one host)."""
    received_at: datetime
    body: Any
    """The parsed JSON body, or the raw text when it was not JSON."""
    status: int | None = None
    """The status answered; None while the request is still being served (slow fault)."""
    applied: list[str] = field(default_factory=list)
    """The msg_ids this request rewarded (served before and not rewarded yet)."""
    violations: list[str] = field(default_factory=list)
    """Contract breaches Trinity accepts silently (e.g. a 65-character task_id)."""


@dataclass
class CommitRecord:
    """One ``POST /commit`` as received."""

    at: float
    received_at: datetime
    status: int | None = None
    drained: int = 0
    step: int | None = None
    """The explore step after this commit; None if it was not applied."""
    msg_ids: list[str] = field(default_factory=list)


@dataclass
class Fault:
    """The injected fault; ``count`` is how many more requests it affects (None: no limit)."""

    mode: FaultMode = "ok"
    status: int = 503
    delay: float = 0.0
    count: int | None = None
    seconds: float = 0.0
    until: float | None = None
    """For ``down``: ``time.monotonic()`` when the server listens again."""

    @classmethod
    def from_json(cls, data: Any) -> Fault:
        """Build a fault from its JSON form; raises ValueError saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("fault must be a JSON object")
        mode = data.get("mode")
        if mode not in _FAULT_MODES:
            raise ValueError(f"mode must be one of {', '.join(_FAULT_MODES)}")
        count = data.get("count")
        if count is not None and (not _is_int(count) or count < 1):
            raise ValueError("count must be a positive integer or null")
        fault = cls(mode=cast(FaultMode, mode), count=count)
        if mode == "error":
            status = data.get("status", 503)
            if not _is_int(status) or not 400 <= status <= 599:
                raise ValueError("status must be an integer from 400 to 599")
            fault.status = status
        elif mode == "slow":
            fault.delay = _non_negative(data.get("delay", 1.0), "delay")
        elif mode == "down":
            fault.seconds = _non_negative(data.get("seconds", 5.0), "seconds")
            fault.count = None
        return fault

    def to_json(self) -> dict[str, Any]:
        """The JSON form, with only the fields that matter for the mode."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.mode == "error":
            out.update(status=self.status, count=self.count)
        elif self.mode == "slow":
            out.update(delay=self.delay, count=self.count)
        elif self.mode == "down":
            out.update(seconds=self.seconds, until=self.until)
        return out


@dataclass
class JudgeCall:
    """One ``POST /judge/v1/chat/completions`` as received."""

    at: float
    call_id: str | None
    """The ``x-trajstream-call-id`` header."""
    status: int
    score: float | None = None
    """The score answered (None: an error or a garbage answer)."""
    garbage: bool = False


@dataclass
class JudgeFault:
    """How the judge answers the next ``count`` requests (None: until changed)."""

    mode: Literal["ok", "garbage", "error"] = "ok"
    status: int = 503
    count: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> JudgeFault:
        if not isinstance(data, dict) or data.get("mode") not in ("ok", "garbage", "error"):
            raise ValueError("mode must be one of ok, garbage, error")
        count, status = data.get("count"), data.get("status", 503)
        if count is not None and (not _is_int(count) or count < 1):
            raise ValueError("count must be a positive integer or null")
        if not _is_int(status) or not 400 <= status <= 599:
            raise ValueError("status must be an integer from 400 to 599")
        return cls(mode=data["mode"], status=status, count=count)


def judge_score(text: str) -> float:
    """The stand-in judge's score of a prompt: from its sha256, in [0, 1], 3 decimals."""
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 1001 / 1000


@dataclass
class StandInState:
    """Everything the stand-in knows; tests in the same process read it directly."""

    experiences: dict[str, Experience] = field(default_factory=dict)
    ready: list[str] = field(default_factory=list)
    """Rewarded msg_ids waiting for the next commit."""
    trained: list[str] = field(default_factory=list)
    """msg_ids drained by commits, in order."""
    feedback: list[FeedbackRecord] = field(default_factory=list)
    commits: list[CommitRecord] = field(default_factory=list)
    explore_step: int = 0
    request_count: int = 0
    ready_count_total: int = 0
    model_version: int = 0
    fault: Fault = field(default_factory=Fault)
    judge: list[JudgeCall] = field(default_factory=list)
    judge_fault: JudgeFault = field(default_factory=JudgeFault)

    def metrics(self) -> dict[str, int]:
        """The ``/metrics`` JSON, with Trinity's keys for its single model."""
        return {
            "rollout/model_0/total_request_count": self.request_count,
            "rollout/model_0/model_version": self.model_version,
            "rollout/total_experience_count": len(self.experiences),
            "rollout/ready_experience_count": self.ready_count_total,
            "explore_step_num": self.explore_step,
        }

    def to_json(self) -> dict[str, Any]:
        """The ``/_standin/state`` JSON (datetimes as ISO 8601 strings)."""

        def record(obj: FeedbackRecord | CommitRecord) -> dict[str, Any]:
            data = asdict(obj)
            data["received_at"] = obj.received_at.isoformat()
            return data

        return {
            "explore_step": self.explore_step,
            "fault": self.fault.to_json(),
            "metrics": self.metrics(),
            "feedback": [record(r) for r in self.feedback],
            "commits": [record(c) for c in self.commits],
            "experiences": [asdict(e) for e in self.experiences.values()],
            "ready": list(self.ready),
            "trained": list(self.trained),
            "judge": [asdict(j) for j in self.judge],
            "judge_fault": asdict(self.judge_fault),
        }


class StandIn:
    """The stand-in server. ``await start()`` returns its URL; ``await stop()`` ends it.

    Example::

        standin = StandIn()
        url = await standin.start()          # http://127.0.0.1:<free port>
        ...                                   # point a TrinityClient at url
        assert standin.state.explore_step == 1
        await standin.stop()
    """

    def __init__(self, *, model: str = "standin-model", shutdown_timeout: float = 1.0) -> None:
        self.model = model
        self._shutdown_timeout = shutdown_timeout
        self._state = StandInState()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._host = "127.0.0.1"
        self._port = 0
        self._reopen_task: asyncio.Task[None] | None = None
        self._created = int(time.time())

    @property
    def state(self) -> StandInState:
        """The live state (not a copy)."""
        return self._state

    @property
    def url(self) -> str:
        """The base URL; valid after :meth:`start`."""
        if self._runner is None:
            raise RuntimeError("the stand-in is not started")
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    @property
    def is_down(self) -> bool:
        """True while the listening socket is closed by a ``down`` fault."""
        return self._runner is not None and self._site is None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0 picks a free port) and return the base URL."""
        if self._runner is not None:
            raise RuntimeError("the stand-in is already started")
        app = web.Application(middlewares=[self._middleware])
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
        app.router.add_post("/_standin/reset", self._post_reset)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=self._shutdown_timeout)
        await runner.setup()
        self._runner = runner
        self._host, self._port = host, port
        try:
            await self._open()
        except BaseException:
            self._runner = None
            await runner.cleanup()
            raise
        return self.url

    async def stop(self) -> None:
        """Stop listening, close every connection and cancel a pending reopen."""
        task = self._cancel_reopen()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()

    async def set_fault(self, fault: Fault) -> None:
        """Inject ``fault`` (replacing the current one); ``Fault()`` clears it.

        ``down`` closes the listening socket and the open connections now and reopens after
        ``fault.seconds``; any other mode reopens at once if the server is down.
        """
        self._cancel_reopen()
        if fault.mode == "down":
            fault.until = time.monotonic() + fault.seconds
            self._state.fault = fault
            await self._close_listener()
            self._reopen_task = asyncio.create_task(self._reopen_after(fault.seconds))
        else:
            self._state.fault = fault
            if self.is_down:
                await self._open()
        logger.info("stand-in fault set to %s", fault.to_json())

    async def reset(self) -> None:
        """Forget every experience, request and commit, and clear the fault."""
        self._state = StandInState()
        await self.set_fault(Fault())

    def run(self, host: str = "127.0.0.1", port: int = _DEFAULT_PORT) -> None:
        """Serve until SIGINT or SIGTERM (blocking); logs one line with the URL."""
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO, format="%(message)s")
        asyncio.run(self._serve_forever(host, port))

    # -- wiring ---------------------------------------------------------------------------

    async def _serve_forever(self, host: str, port: int) -> None:
        url = await self.start(host, port)
        logger.info("Trinity stand-in listening on %s (Ctrl-C to stop)", url)
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM)
        for sig in signals:
            loop.add_signal_handler(sig, stopping.set)
        try:
            await stopping.wait()
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.stop()

    async def _open(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self._host, self._port)
        await site.start()
        self._site = site
        if self._port == 0:
            self._port = int(self._runner.addresses[0][1])

    async def _close_listener(self) -> None:
        site, self._site = self._site, None
        if site is not None:
            await site.stop()
        # Keep-alive connections would outlive the listening socket: drop them all, as a dead
        # server would, so pooled clients reconnect and are refused. (The answer to the
        # fault request itself is already flushed; transport.close() sends buffered data.)
        if self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                handler.force_close()

    async def _reopen_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        self._state.fault = Fault()
        while self._runner is not None and self._site is None:
            try:
                await self._open()
            except OSError as exc:  # the port may be briefly taken; keep trying
                logger.warning("stand-in cannot listen again yet: %s", exc)
                await asyncio.sleep(0.1)
        self._reopen_task = None
        logger.info("stand-in listening again on %s", self.url)

    def _cancel_reopen(self) -> asyncio.Task[None] | None:
        task, self._reopen_task = self._reopen_task, None
        if task is None or task is asyncio.current_task():
            return None
        task.cancel()
        return task

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.is_down:
            # A request on a keep-alive connection that raced the close: drop it unanswered.
            request.protocol.force_close()
            return web.Response(status=503)
        return await handler(request)

    def _take_fault(self) -> Fault:
        """The fault that applies to this /feedback or /commit; counts it down."""
        fault = self._state.fault
        if fault.mode in ("error", "slow") and fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                self._state.fault = Fault()
        return fault

    @staticmethod
    def _fault_response(fault: Fault) -> web.Response:
        return web.json_response(
            {"error": f"stand-in fault: status {fault.status}"}, status=fault.status
        )

    # -- Trinity routes -------------------------------------------------------------------

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body, error = _parse_json(await _read_text(request))
        if error is not None:
            return web.json_response({"detail": error}, status=400)
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
        self._state.experiences[msg_id] = Experience(
            msg_id=msg_id,
            model=str(model),
            prompt=question,
            completion=reply,
            served_at=time.monotonic(),
        )
        if body.get("stream"):
            include_usage = isinstance(body.get("stream_options"), dict) and bool(
                body["stream_options"].get("include_usage")
            )
            return await self._stream(
                request, msg_id, str(model), prompt, reply, tool_call, include_usage
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
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        created = int(time.time())

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

        await response.write(
            event(
                {"delta": {"role": "assistant", "content": ""}, "finish_reason": None},
                prompt_token_ids=_token_ids(prompt),
            )
        )
        if tool_call is None:
            await response.write(
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
            await response.write(
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
                await response.write(event({"delta": delta, "finish_reason": None}))
        finish = "stop" if tool_call is None else "tool_calls"
        await response.write(event({"delta": {}, "finish_reason": finish}))
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
            await response.write(f"data: {json.dumps(data)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

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
        text = await _read_text(request)
        body, error = _parse_json(text)
        record = FeedbackRecord(time.monotonic(), _utcnow(), text if error else body)
        self._state.feedback.append(record)
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
        record = CommitRecord(time.monotonic(), _utcnow())
        self._state.commits.append(record)
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

    # -- introspection --------------------------------------------------------------------

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

    async def _post_reset(self, request: web.Request) -> web.Response:
        await self.reset()
        return web.json_response({"status": "success"})


# -- helpers for tests in other processes ----------------------------------------------------


async def fetch_state(base_url: str, *, http_timeout: float = 5.0) -> dict[str, Any]:
    """Return ``GET /_standin/state`` of the stand-in at ``base_url``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.get("/_standin/state")
        response.raise_for_status()
        return cast(dict[str, Any], response.json())


async def set_fault(base_url: str, fault: dict[str, Any], *, http_timeout: float = 5.0) -> None:
    """``POST /_standin/fault``; e.g. ``{"mode": "error", "status": 503, "count": 2}``."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.post("/_standin/fault", json=fault)
        response.raise_for_status()


async def reset_state(base_url: str, *, http_timeout: float = 5.0) -> None:
    """``POST /_standin/reset``: forget everything and clear the fault."""
    async with httpx.AsyncClient(base_url=base_url, timeout=http_timeout) as http:
        response = await http.post("/_standin/reset")
        response.raise_for_status()


def run(
    host: str = "127.0.0.1", port: int = _DEFAULT_PORT, *, model: str = "standin-model"
) -> None:
    """Blocking entry point for ``trajstream standin``: serve until SIGINT or SIGTERM."""
    StandIn(model=model).run(host, port)


# -- pure helpers ------------------------------------------------------------------------------


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _non_negative(value: Any, name: str) -> float:
    if not _is_number(value) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number")
    return float(value)


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
