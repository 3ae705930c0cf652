"""Trinity's chat completion told as a Responses API object, and the API's error bodies.

:func:`chat_to_response` is what a client of the Responses API gets when Trinity answered: its
output items (a reasoning item for ``reasoning_content``, a message item, one function-call item
per tool call, ids derived from the response id), the request's settings echoed, usage, and
``status`` ``incomplete`` for a completion cut at its token limit. The item builders are shared
with :mod:`.responses_stream`, which tells the same answer as events.

May import: the standard library and this package.
"""

from __future__ import annotations

import time
from typing import Any

from .common import ParsedRequest, chat_choice, usage_of

__all__ = [
    "chat_to_response",
    "error_body",
    "function_call_item",
    "item_ids",
    "message_item",
    "previous_not_found",
    "reasoning_item",
    "response_id_for",
    "response_object",
]


def response_id_for(chat_id: str | None) -> str:
    """The Responses id given to the client for a chat completion (Trinity's ``chatcmpl-...``
    id stays recognisable in it)."""
    return f"resp_{chat_id or 'trajstream'}"


def item_ids(response_id: str) -> tuple[str, str, str]:
    """The ids of the reasoning, message and function-call items of a translated response."""
    base = response_id.removeprefix("resp_")
    return f"rs_{base}", f"msg_{base}", f"fc_{base}"


def chat_to_response(
    completion: dict[str, Any],
    request: ParsedRequest,
    *,
    response_id: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    """A chat completion (Trinity's answer) as the Responses API object the client expects."""
    message, reason = chat_choice(completion)
    response_id = response_id or response_id_for(_str(completion.get("id")))
    rs_id, msg_id, fc_id = item_ids(response_id)
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        output.append(reasoning_item(rs_id, reasoning))
    content = message.get("content")
    text = content if isinstance(content, str) else _text(content)
    if text or not message.get("tool_calls"):
        output.append(message_item(msg_id, text))
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") or {}
        output.append(
            function_call_item(
                f"{fc_id}_{i}",
                str(call.get("id") or f"call_{i}"),
                str(function.get("name") or ""),
                str(function.get("arguments") or ""),
            )
        )
    prompt, completion_tokens = usage_of(completion)
    created = completion.get("created")
    return response_object(
        request,
        response_id,
        created_at if created_at is not None else (created if isinstance(created, int) else None),
        model=_str(completion.get("model")) or request.model,
        output=output,
        finish_reason=reason,
        usage=(prompt, completion_tokens),
    )


def response_object(
    request: ParsedRequest,
    response_id: str,
    created_at: int | None,
    *,
    model: str | None,
    output: list[dict[str, Any]],
    finish_reason: str | None,
    usage: tuple[int, int] | None,
    status: str | None = None,
) -> dict[str, Any]:
    """A Response object with the request's settings echoed, as the API returns it."""
    body = request.body
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}
    if status is None:
        status = "incomplete" if finish_reason in incomplete else "completed"
    out: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at if created_at is not None else int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": {"reason": incomplete[str(finish_reason)]}
        if status == "incomplete"
        else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "metadata": body.get("metadata") or {},
        "user": body.get("user"),
        "usage": None,
    }
    if usage is not None:
        out["usage"] = {
            "input_tokens": usage[0],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage[1],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage[0] + usage[1],
        }
    return out


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str = "completed"
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


# -- errors -----------------------------------------------------------------------------------


def error_body(
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    kind: str = "invalid_request_error",
) -> dict[str, Any]:
    """OpenAI's error shape, as the official client reads it."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def previous_not_found(response_id: str) -> dict[str, Any]:
    """The 400 body for a ``previous_response_id`` the gateway does not know (any more)."""
    return error_body(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(
        str(p.get("text") or "") for p in content if isinstance(p, dict) and p.get("type") == "text"
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
