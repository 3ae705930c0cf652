"""What every translated API has in common: a request as the gateway needs it, a model's answer
as records need it, and the records of one exchange.

- :class:`ParsedRequest`: one request of the Responses or the Messages API, as the conversation
  it continues (``messages``, the records' form) and, when the chat completions API can express
  it, the same request as a chat completions body (``chat``, for Trinity); otherwise
  ``unsupported`` says what cannot be translated.
- :class:`Answer`: one model answer (the assistant message with its tool calls and reasoning,
  the response id, model, finish reasons, token usage), from whichever API answered:
  :func:`answer_of_chat` for a chat completion (Trinity's, whose ``id`` is the msg_id),
  :func:`.responses.answer_of_response`, :func:`.messages.answer_of_message`.
- :func:`llm_step` and :func:`tool_steps`: the records, as :mod:`streams.capture.chat` makes
  them for chat completions: the answer at seq ``len(messages)``, the tool results after the
  last assistant message at their positions.

Finish reasons are recorded in the chat completions' vocabulary (``stop``, ``tool_calls``,
``length``, ``content_filter``), whatever the API, so that rewards and exports read one set.

May import: the standard library, the models, :mod:`streams.capture.chat`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from ...errors import ApiRequestError
from ...models import ChatMessage, Completion, StepKind, ToolCall
from ..chat import reasoning_of, to_chat_message

__all__ = [
    "Answer",
    "ApiRequestError",
    "ParsedRequest",
    "answer_of_chat",
    "json_object",
    "llm_step",
    "tool_steps",
]


@dataclass
class ParsedRequest:
    """One request: what the records and Trinity need of it."""

    api: Literal["responses", "messages"]
    model: str | None
    stream: bool
    messages: list[ChatMessage]
    """The conversation the answer continues, as records (instructions or system first; for
    the Responses API with ``previous_response_id``, the stored history before the input)."""
    chat: dict[str, Any] | None
    """The same request as a chat completions body (Trinity serves only that API), or None."""
    unsupported: str | None = None
    """Why ``chat`` is None: what the chat completions API cannot express (a built-in tool,
    an item type, a stored prompt...)."""
    body: dict[str, Any] = field(default_factory=dict)
    """The request as the client sent it."""
    items: list[dict[str, Any]] = field(default_factory=list)
    """Responses API: the whole input as items (the stored history, then this request's), to
    be remembered with the answer's output items for a later ``previous_response_id``."""


@dataclass
class Answer:
    """One model answer, from any of the APIs."""

    message: ChatMessage
    response_id: str | None = None
    model: str | None = None
    finish_reasons: list[str] = field(default_factory=list)
    input_tokens: int | None = None
    output_tokens: int | None = None


def answer_of_chat(completion: dict[str, Any]) -> Answer:
    """A chat completion's answer (its first choice), e.g. Trinity's: ``response_id`` is its
    ``id``, the msg_id Trinity trains on."""
    choices = [c for c in completion.get("choices") or [] if isinstance(c, dict)]
    first = choices[0] if choices else {}
    raw = as_dict(first.get("message"))
    message = to_chat_message({**raw, "role": "assistant"})
    usage = as_dict(completion.get("usage"))
    return Answer(
        message=message,
        response_id=_str(completion.get("id")),
        model=_str(completion.get("model")),
        finish_reasons=[str(c["finish_reason"]) for c in choices if c.get("finish_reason")],
        input_tokens=_count(usage.get("prompt_tokens")),
        output_tokens=_count(usage.get("completion_tokens")),
    )


def llm_step(
    call_id: str,
    request: ParsedRequest,
    answer: Answer,
    *,
    upstream: str,
    latency_ms: float,
    now: datetime,
    provider: str | None = None,
    policy_version: int | None = None,
    fallback: str | None = None,
    error_type: str | None = None,
) -> Completion:
    """The LLM step of one exchange, at seq ``len(request.messages)`` (``policy_version``,
    ``fallback`` and ``error_type``: see :class:`~streams.models.Completion`)."""
    seq = len(request.messages)
    calls = answer.message.tool_calls
    return Completion(
        event_id=f"{call_id}/{seq}",
        call_id=call_id,
        seq=seq,
        event_time=now,
        provider_name=provider,
        request_model=request.model,
        response_model=answer.model,
        response_id=answer.response_id,
        finish_reasons=answer.finish_reasons,
        input_tokens=answer.input_tokens,
        output_tokens=answer.output_tokens,
        input_messages=request.messages,
        output_messages=[answer.message],
        tool_calls=[c.name for c in calls],
        tool_call_details=calls,
        latency_ms=latency_ms,
        upstream=upstream,
        policy_version=policy_version,
        fallback=fallback,
        error_type=error_type,
    )


def tool_steps(call_id: str, messages: list[ChatMessage], now: datetime) -> list[Completion]:
    """The TOOL steps a request reports: its tool messages after the last assistant message,
    each at its position, named after the assistant's tool call with the same id."""
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    if last < 0:
        return []
    names = {c.id: c.name for c in messages[last].tool_calls}
    steps = []
    for i in range(last + 1, len(messages)):
        message = messages[i]
        if message.role != "tool":
            continue
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


# -- helpers of the translators ---------------------------------------------------------------


def json_object(arguments: str) -> dict[str, Any]:
    """Tool-call arguments (a JSON string) as an object; anything else kept under ``"input"``
    (a model may produce arguments that are not a JSON object)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"input": arguments}
    return value if isinstance(value, dict) else {"input": value}


def chat_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def tool_call(call_id: str, name: str, arguments: str) -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments=arguments)


def chat_message_of(message: ChatMessage) -> dict[str, Any]:
    """A record's message as a chat completions message (for Trinity)."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [chat_tool_call(c.id, c.name, c.arguments) for c in message.tool_calls]
        if not message.content:
            out["content"] = None
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.reasoning:
        out["reasoning_content"] = message.reasoning
    return out


def chat_choice(completion: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The first choice's message (with ``reasoning_content`` when the server sent reasoning
    under another name) and its finish reason."""
    choices = [c for c in completion.get("choices") or [] if isinstance(c, dict)]
    first = choices[0] if choices else {}
    message = dict(as_dict(first.get("message")))
    reasoning = reasoning_of(message)
    if reasoning:
        message["reasoning_content"] = reasoning
    reason = first.get("finish_reason")
    return message, reason if isinstance(reason, str) else None


def usage_of(completion: dict[str, Any]) -> tuple[int, int]:
    usage = as_dict(completion.get("usage"))
    return _count(usage.get("prompt_tokens")) or 0, _count(usage.get("completion_tokens")) or 0


def as_dict(value: Any) -> dict[str, Any]:
    """``value`` when it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
