"""A tiny loopback HTTP server for the official clients: it records every request body and
answers each with the next scripted answer (JSON, or server-sent event bytes).

So the translators are tested against what the real ``openai``, ``anthropic`` and
``openai-agents`` clients send, and their answers against what those clients accept.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Answer = dict[str, Any] | bytes | Callable[[dict[str, Any]], "dict[str, Any] | bytes"]


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Script:
    """Answers in order; each a JSON object, SSE bytes, or a function of the request body."""

    answers: list[Answer] = field(default_factory=list)
    requests: list[Recorded] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.requests.append(Recorded(request.path, dict(request.headers), body))
        answer = self.answers.pop(0) if self.answers else {"error": "no answer scripted"}
        if callable(answer):
            answer = answer(body)
        if isinstance(answer, bytes):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(0, len(answer), 97):  # in odd pieces, as a network delivers them
                await response.write(answer[i : i + 97])
            await response.write_eof()
            return response
        return web.json_response(answer)


@asynccontextmanager
async def serve(*answers: Answer) -> AsyncIterator[Script]:
    """Serve on a free loopback port until the block ends; ``script.url`` is the base URL."""
    script = Script(list(answers))
    app = web.Application()
    app.router.add_post("/{tail:.*}", script.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    script.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield script
    finally:
        await runner.cleanup()


def chat_completion(
    content: str | None = "Done.",
    *,
    tool_calls: list[tuple[str, str, str]] = (),  # type: ignore[assignment]
    reasoning: str | None = None,
    finish: str | None = None,
    chat_id: str = "chatcmpl-1",
    usage: tuple[int, int] = (11, 7),
) -> dict[str, Any]:
    """A chat completion as Trinity (vLLM) answers."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    return {
        "id": chat_id,
        "object": "chat.completion",
        "created": 1_767_225_600,
        "model": "policy-model",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish or ("tool_calls" if tool_calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


def chat_stream(completion: dict[str, Any], *, interleave: bool = False) -> bytes:
    """The chunks of a streamed chat completion that adds up to ``completion``: reasoning and
    content a few characters at a time, tool calls by index (``interleave``: their argument
    deltas alternate), a usage chunk, ``[DONE]``."""
    base = {k: completion[k] for k in ("id", "created", "model")}
    base["object"] = "chat.completion.chunk"
    choice = completion["choices"][0]
    message = choice["message"]
    chunks: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    for key in ("reasoning_content", "content"):
        text = message.get(key) or ""
        chunks += [{key: text[i : i + 3]} for i in range(0, len(text), 3)]
    calls = message.get("tool_calls") or []
    pieces: list[dict[str, Any]] = []
    for index, call in enumerate(calls):
        args = call["function"]["arguments"]
        head = {"index": index, "id": call["id"], "type": "function"}
        head["function"] = {"name": call["function"]["name"], "arguments": ""}
        parts = [
            {"index": index, "function": {"arguments": args[i : i + 4]}}
            for i in range(0, len(args), 4)
        ]
        pieces.append({"head": head, "parts": parts})
    if interleave:
        for p in pieces:
            chunks.append({"tool_calls": [p["head"]]})
        longest = max((len(p["parts"]) for p in pieces), default=0)
        for i in range(longest):
            for p in pieces:
                if i < len(p["parts"]):
                    chunks.append({"tool_calls": [p["parts"][i]]})
    else:
        for p in pieces:
            chunks.append({"tool_calls": [p["head"]]})
            chunks += [{"tool_calls": [part]} for part in p["parts"]]
    out = []
    for delta in chunks:
        out.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    out.append(
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]}
    )
    out.append({**base, "choices": [], "usage": completion["usage"]})
    body = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in out)
    return body + b"data: [DONE]\n\n"
