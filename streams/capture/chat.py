"""OpenAI chat JSON to trajstream records: pure translation shared by the gateway and the
``openai`` client wrapper.

- :func:`to_chat_message`: one OpenAI message as a :class:`~streams.models.ChatMessage` (text
  content; content parts keep their text; tool calls with ids, names and JSON arguments;
  ``tool_call_id``);
- :func:`llm_step`: a request/response pair as an LLM :class:`~streams.models.Completion`, at
  seq ``len(messages)`` (the position of the answer in the conversation);
- :func:`steps_of_request`: the ``tool`` messages after a request's last assistant message, as
  TOOL steps at their positions;
- :class:`StreamAssembler`: the completion that server-sent chunks add up to; it can also hold
  back the usage chunk from a client that did not ask for it (:func:`ask_usage`).

This module imports only the models.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..models import ChatMessage, Completion, StepKind, ToolCall

__all__ = [
    "StreamAssembler",
    "ask_usage",
    "llm_step",
    "reasoning_of",
    "steps_of_request",
    "to_chat_message",
]


def ask_usage(body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """A streamed request as sent upstream, asking for the usage chunk, and whether the client
    asked for it itself (``stream_options.include_usage``): when not, the gateway strips it."""
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return body, True
    merged = (
        {**options, "include_usage": True} if isinstance(options, dict) else {"include_usage": True}
    )
    return {**body, "stream_options": merged}, False


# -- pure translation: OpenAI JSON -> records -------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _tool_calls(raw: Any) -> list[ToolCall]:
    out = []
    for call in raw if isinstance(raw, list) else []:
        if not isinstance(call, dict):
            continue
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        args = fn.get("arguments")
        out.append(
            ToolCall(
                id=str(call.get("id") or ""),
                name=str(fn.get("name") or ""),
                arguments=args if isinstance(args, str) else json.dumps(args or {}),
            )
        )
    return out


def to_chat_message(message: dict[str, Any]) -> ChatMessage:
    """One OpenAI message as a record (text content; tool calls with ids and arguments; the
    reasoning an OpenAI-compatible server returns as ``reasoning_content`` or ``reasoning``)."""
    name = message.get("name")
    call_id = message.get("tool_call_id")
    return ChatMessage(
        role=message["role"],
        content=_text(message.get("content")),
        name=name if isinstance(name, str) else None,
        tool_calls=_tool_calls(message.get("tool_calls")),
        tool_call_id=call_id if isinstance(call_id, str) else None,
        reasoning=reasoning_of(message),
    )


def reasoning_of(message: dict[str, Any]) -> str | None:
    """A chat message's reasoning: ``reasoning_content`` (vLLM, DeepSeek) or ``reasoning``."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if isinstance(value, str) and value:
            return value
    return None


def steps_of_request(call_id: str, messages: list[dict[str, Any]], now: Any) -> list[Completion]:
    """The TOOL steps a request reports: its ``tool`` messages after the last assistant one.

    Each is at its position in the conversation; its tool name comes from the assistant message's
    tool call with the same id.
    """
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    if last < 0:
        return []
    names = {c.id: c.name for c in _tool_calls(messages[last].get("tool_calls"))}
    steps = []
    for i in range(last + 1, len(messages)):
        m = messages[i]
        if m["role"] != "tool":
            continue
        message = to_chat_message(m)
        steps.append(
            Completion(
                event_id=f"{call_id}/{i}",
                call_id=call_id,
                seq=i,
                event_time=now,
                kind=StepKind.TOOL,
                operation_name="execute_tool",
                tool_name=message.name or names.get(message.tool_call_id or ""),
                tool_call_id=message.tool_call_id,
                output_messages=[message],
            )
        )
    return steps


def llm_step(
    call_id: str,
    request: dict[str, Any],
    response: dict[str, Any],
    *,
    upstream: str,
    latency_ms: float,
    now: Any,
    policy_version: int | None = None,
    fallback: str | None = None,
    error_type: str | None = None,
) -> Completion:
    """The LLM step of one request/response pair (``policy_version``, ``fallback`` and
    ``error_type``: see :class:`~streams.models.Completion`)."""
    messages = request["messages"]
    seq = len(messages)
    choices = [c for c in response.get("choices") or [] if isinstance(c, dict)]
    outputs = [
        to_chat_message({"role": "assistant", **c["message"]})
        for c in choices
        if isinstance(c.get("message"), dict)
    ]
    details = outputs[0].tool_calls if outputs else []
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
    tokens = {
        "input_tokens": usage.get("prompt_tokens"),
        "output_tokens": usage.get("completion_tokens"),
    }
    return Completion(
        event_id=f"{call_id}/{seq}",
        call_id=call_id,
        seq=seq,
        event_time=now,
        request_model=request.get("model") if isinstance(request.get("model"), str) else None,
        response_model=response.get("model") if isinstance(response.get("model"), str) else None,
        response_id=response.get("id") if isinstance(response.get("id"), str) else None,
        finish_reasons=[str(c["finish_reason"]) for c in choices if c.get("finish_reason")],
        **{k: v for k, v in tokens.items() if isinstance(v, int) and v >= 0},
        input_messages=[to_chat_message(m) for m in messages],
        output_messages=outputs,
        tool_calls=[c.name for c in details],
        tool_call_details=details,
        latency_ms=latency_ms,
        upstream=upstream,
        policy_version=policy_version,
        fallback=fallback,
        error_type=error_type,
    )


class StreamAssembler:
    """Rebuilds a chat completion from its server-sent ``chat.completion.chunk`` events."""

    def __init__(self, *, strip_usage: bool = False, hold_done: bool = False) -> None:
        self.strip_usage = strip_usage
        """:meth:`feed` returns the events without the usage-only chunk (``choices: []``)."""
        self.hold_done = hold_done
        """:meth:`feed` keeps the ``data: [DONE]`` event back, in :attr:`done_event`."""
        self.done_event = b""
        self._buffer = b""
        self.done = False
        self.id: str | None = None
        self.model: str | None = None
        self.usage: dict[str, Any] | None = None
        self._choices: dict[int, dict[str, Any]] = {}

    def feed(self, data: bytes) -> bytes:
        """Read ``data`` (any slice of the stream); returns what the client is sent: ``data``
        itself, or with ``strip_usage`` the whole events read so far minus the usage chunk."""
        if not (self.strip_usage or self.hold_done):
            self._feed(data)
            return data
        return self._feed(data)

    def _feed(self, data: bytes) -> bytes:
        self._buffer += data.replace(b"\r\n", b"\n") if b"\r" in data else data
        out = []
        while b"\n\n" in self._buffer:
            event, self._buffer = self._buffer.split(b"\n\n", 1)
            payload = b"\n".join(
                line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")
            )
            if not payload:
                out.append(event + b"\n\n")
                continue
            if payload.strip() == b"[DONE]":
                self.done = True
                if self.hold_done:
                    self.done_event += event + b"\n\n"
                else:
                    out.append(event + b"\n\n")
                continue
            chunk: Any = None
            with contextlib.suppress(ValueError):
                chunk = json.loads(payload)
                self.add_chunk(chunk)
            if not (
                self.strip_usage
                and isinstance(chunk, dict)
                and not chunk.get("choices")
                and isinstance(chunk.get("usage"), dict)
            ):
                out.append(event + b"\n\n")
        return b"".join(out)

    def rest(self) -> bytes:
        """With ``strip_usage`` or ``hold_done``: what is left after the last whole event."""
        held = self.strip_usage or self.hold_done
        rest, self._buffer = (self._buffer, b"") if held else (b"", self._buffer)
        return rest

    def add_chunk(self, chunk: Any) -> None:
        """Apply one parsed chunk (a dict, as in the SSE ``data:`` JSON)."""
        if not isinstance(chunk, dict):
            return
        self.id = self.id or chunk.get("id")
        self.model = self.model or chunk.get("model")
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        for c in chunk.get("choices") or []:
            if not isinstance(c, dict):
                continue
            choice = self._choices.setdefault(
                int(c.get("index", 0)),
                {"content": "", "reasoning": "", "tool_calls": {}, "finish_reason": None},
            )
            delta = c.get("delta") if isinstance(c.get("delta"), dict) else {}
            if isinstance(delta.get("content"), str):
                choice["content"] += delta["content"]
            choice["reasoning"] += reasoning_of(delta) or ""
            for t in delta.get("tool_calls") or []:
                if not isinstance(t, dict):
                    continue
                call = choice["tool_calls"].setdefault(
                    int(t.get("index", 0)), {"id": "", "name": "", "arguments": ""}
                )
                call["id"] = t.get("id") or call["id"]
                fn = t.get("function") if isinstance(t.get("function"), dict) else {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
            if c.get("finish_reason"):
                choice["finish_reason"] = c["finish_reason"]

    def completion(self) -> dict[str, Any]:
        """The chat.completion the chunks add up to."""
        choices = []
        for index in sorted(self._choices):
            c = self._choices[index]
            message: dict[str, Any] = {"role": "assistant", "content": c["content"]}
            if c["reasoning"]:
                message["reasoning_content"] = c["reasoning"]
            if c["tool_calls"]:
                message["tool_calls"] = [
                    {
                        "id": t["id"],
                        "type": "function",
                        "function": {"name": t["name"], "arguments": t["arguments"]},
                    }
                    for _, t in sorted(c["tool_calls"].items())
                ]
            choices.append(
                {"index": index, "message": message, "finish_reason": c["finish_reason"]}
            )
        return {"id": self.id, "model": self.model, "choices": choices, "usage": self.usage}
