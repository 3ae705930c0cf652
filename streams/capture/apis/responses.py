"""OpenAI's Responses API (``POST /v1/responses``): requests and answers as records, and both
translated to and from chat completions (Trinity serves only that API).

What the gateway does with it (``store`` is a :class:`.responses_store.ItemStore` it holds)::

    history = store.history(call_id, body.get("previous_response_id"))   # [] without one
    if history is None: answer 400 previous_not_found(...)                # unknown or forgotten
    parsed = parse_request(body, history)          # ApiRequestError: 400 error_body(e, e.param)
    steps = tool_steps(call_id, parsed.messages, now)                     # common.tool_steps
    # production, an OpenAI-compatible Responses endpoint: the body as sent
    #   JSON:   response = answer;                 answer = answer_of_response(response)
    #   stream: ResponsesStreamAssembler().feed(chunk) for each chunk passed through;
    #           response = assembler.response();   answer = answer_of_response(response)
    # Trinity: parsed.chat (None: parsed.unsupported says why; answer from production or 400)
    #   JSON:   response = chat_to_response(completion, parsed); answer = answer_of_chat(completion)
    #   stream: s = ChatToResponsesStream(parsed); client gets s.feed(chunk) ... s.finish();
    #           response = s.response();           answer = answer_of_chat(s.completion())
    step = llm_step(call_id, parsed, answer, upstream=..., latency_ms=..., now=now)
    store.remember(call_id, response["id"], parsed.items + output_items(response))

Recorded as chat completions are: the input items as messages (``instructions`` first, as the
system message; a ``developer`` message keeps its role), ``function_call`` items as the
assistant's tool calls with their ``call_id``\\ s and JSON arguments (consecutive
assistant-side items, as one response produces them, are one assistant message),
``function_call_output`` items as tool messages (TOOL steps), reasoning items as the next
assistant message's ``reasoning`` (summary and reasoning text; encrypted content is not kept),
usage, and the response id (Trinity's msg_id when Trinity answered). Items of the built-in tools
(``web_search_call``, ``computer_call``, ``mcp_call``, ...) are kept as data: a ``*_call`` item
as a tool call named after its type, a ``*_output`` item as a tool message, any other item as a
message whose role is its type and whose content is its JSON. Images and files are not
recorded (records hold text); they are passed to Trinity as chat content parts.

What the chat completions API cannot express makes ``ParsedRequest.chat`` None, naming it:
built-in tools and their items, ``item_reference``, a stored ``prompt``, a server-side
``conversation``, ``background``, ``allowed_tools``, images or files by ``file_id``.

May import: the standard library, the models, :mod:`streams.capture.chat` and this package.
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ChatMessage, ToolCall
from .common import Answer, ApiRequestError, ParsedRequest, as_dict, chat_message_of
from .responses_json import (
    chat_to_response,
    error_body,
    item_ids,
    previous_not_found,
    response_id_for,
)

__all__ = [
    "answer_of_response",
    "chat_to_response",
    "error_body",
    "item_ids",
    "output_items",
    "parse_request",
    "previous_not_found",
    "response_id_for",
]

_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})


# -- requests ---------------------------------------------------------------------------------


def parse_request(body: Any, history: list[dict[str, Any]] | None = None) -> ParsedRequest:
    """One request (``history``: the stored items ``previous_response_id`` names)."""
    if not isinstance(body, dict):
        raise ApiRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiRequestError("model must be a non-empty string", "model")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiRequestError("stream must be a boolean", "stream")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiRequestError("instructions must be a string", "instructions")
    items = list(history or []) + _input_items(body.get("input"))
    unsupported: list[str] = []
    convo = _Conversation(unsupported)
    for item in items:
        convo.add(item)
    messages, chat_messages = convo.done()
    if instructions:
        messages.insert(0, ChatMessage(role="system", content=instructions))
        chat_messages.insert(0, {"role": "system", "content": instructions})
    chat = _chat_request(body, chat_messages, unsupported)
    return ParsedRequest(
        api="responses",
        model=model,
        stream=bool(stream),
        messages=messages,
        chat=None if unsupported else chat,
        unsupported="; ".join(dict.fromkeys(unsupported)) or None,
        body=body,
        items=items,
    )


def _input_items(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ApiRequestError("input must be a string or an array of items", "input")
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ApiRequestError("each input item must be an object", f"input[{i}]")
        if item.get("type", "message") == "message" and not isinstance(item.get("role"), str):
            raise ApiRequestError("a message item needs a role", f"input[{i}].role")
    return list(raw)


class _Conversation:
    """Input items -> record messages and chat messages, side by side."""

    def __init__(self, unsupported: list[str]) -> None:
        self.unsupported = unsupported
        self.messages: list[ChatMessage] = []
        self.chat: list[dict[str, Any]] = []
        self._texts: list[str] = []
        self._calls: list[ToolCall] = []
        self._reasoning: list[str] = []
        self._open = False
        self._names: dict[str, str] = {}

    def add(self, item: dict[str, Any]) -> None:
        kind = str(item.get("type") or "message")
        role = item.get("role")
        if kind == "message" and role == "assistant":
            self._open = True
            self._texts.append(_text(item.get("content")))
        elif kind == "function_call":
            self._open = True
            call_id = str(item.get("call_id") or item.get("id") or "")
            name = str(item.get("name") or "")
            self._names[call_id] = name
            self._calls.append(ToolCall(id=call_id, name=name, arguments=_arguments(item)))
        elif kind == "reasoning":
            self._open = True
            self._reasoning.append(reasoning_text(item))
        elif kind == "message":
            self._flush()
            self._message(item, str(role))
        elif kind == "function_call_output":
            self._flush()
            self._tool_result(item, kind)
        elif kind.endswith("_output") and "call_id" in item:
            self._flush()
            self.unsupported.append(f"input item of type {kind}")
            self._tool_result(item, kind)
        elif kind.endswith("_call") or kind == "program":
            self._open = True
            self.unsupported.append(f"input item of type {kind}")
            call_id = str(item.get("call_id") or item.get("id") or "")
            name = str(item.get("name") or kind)
            self._calls.append(ToolCall(id=call_id, name=name, arguments=_arguments(item)))
        else:
            self._flush()
            self.unsupported.append(f"input item of type {kind}")
            data = json.dumps(item, sort_keys=True)
            self.messages.append(ChatMessage(role=kind, content=data))

    def done(self) -> tuple[list[ChatMessage], list[dict[str, Any]]]:
        self._flush()
        return self.messages, self.chat

    def _flush(self) -> None:
        if not self._open:
            return
        message = ChatMessage(
            role="assistant",
            content="\n".join(t for t in self._texts if t),
            tool_calls=self._calls,
            reasoning="\n\n".join(r for r in self._reasoning if r) or None,
        )
        self.messages.append(message)
        self.chat.append(chat_message_of(message))
        self._texts, self._calls, self._reasoning, self._open = [], [], [], False

    def _message(self, item: dict[str, Any], role: str) -> None:
        content = item.get("content")
        self.messages.append(ChatMessage(role=role, content=_text(content)))
        chat_role = "system" if role == "developer" else role
        self.chat.append({"role": chat_role, "content": self._chat_content(content)})

    def _tool_result(self, item: dict[str, Any], kind: str) -> None:
        call_id = str(item.get("call_id") or "")
        output = item.get("output")
        if isinstance(output, list) and any(
            isinstance(p, dict) and p.get("type") not in _TEXT_PARTS for p in output
        ):
            self.unsupported.append(f"{kind} with images or files")
        text = output if isinstance(output, str) else _text(output)
        if not isinstance(output, str | list):
            text = json.dumps(output, sort_keys=True)
        name = item.get("name") if isinstance(item.get("name"), str) else None
        message = ChatMessage(
            role="tool", content=text, name=name or self._names.get(call_id), tool_call_id=call_id
        )
        self.messages.append(message)
        self.chat.append({"role": "tool", "tool_call_id": call_id, "content": text})

    def _chat_content(self, content: Any) -> Any:
        if isinstance(content, str) or not isinstance(content, list):
            return content if isinstance(content, str) else ""
        parts: list[dict[str, Any]] = []
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind in _TEXT_PARTS:
                parts.append({"type": "text", "text": str(part.get("text") or "")})
            elif kind == "input_image":
                if part.get("image_url"):
                    image = {"url": part["image_url"], "detail": part.get("detail") or "auto"}
                    parts.append({"type": "image_url", "image_url": image})
                else:
                    self.unsupported.append("input_image by file_id")
            elif kind == "input_file":
                if part.get("file_data"):
                    file = {"file_data": part["file_data"], "filename": part.get("filename")}
                    parts.append({"type": "file", "file": {k: v for k, v in file.items() if v}})
                else:
                    self.unsupported.append("input_file by file_id or file_url")
            elif kind == "refusal":
                parts.append({"type": "text", "text": str(part.get("refusal") or "")})
            else:
                self.unsupported.append(f"content part of type {kind}")
        if all(p["type"] == "text" for p in parts):
            return "".join(p["text"] for p in parts)
        return parts


def _chat_request(
    body: dict[str, Any], messages: list[dict[str, Any]], unsupported: list[str]
) -> dict[str, Any]:
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            unsupported.append(f"{name} (server-side state)")
    if body.get("background"):
        unsupported.append("background")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for src, dst in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("max_output_tokens", "max_tokens"),
        ("parallel_tool_calls", "parallel_tool_calls"),
        ("user", "user"),
        ("safety_identifier", "user"),
    ):
        if body.get(src) is not None:
            chat[dst] = body[src]
    if isinstance(body.get("top_logprobs"), int):
        chat["logprobs"], chat["top_logprobs"] = True, body["top_logprobs"]
    tools = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            unsupported.append(f"tool of type {kind}")
            continue
        function = {"name": tool.get("name"), "parameters": tool.get("parameters") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        tools.append({"type": "function", "function": function})
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if isinstance(choice, str):
        chat["tool_choice"] = choice
    elif isinstance(choice, dict):
        if choice.get("type") == "function" and choice.get("name"):
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        else:
            unsupported.append(f"tool_choice of type {choice.get('type')}")
    text = as_dict(body.get("text"))
    fmt = as_dict(text.get("format"))
    if fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    elif fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    reasoning = as_dict(body.get("reasoning"))
    if reasoning.get("effort"):
        chat["reasoning_effort"] = reasoning["effort"]
    return chat


# -- answers ----------------------------------------------------------------------------------


def answer_of_response(response: dict[str, Any]) -> Answer:
    """A Responses API answer as a record's assistant message, usage, id and finish reason."""
    texts, calls, reasoning = [], [], []
    for item in output_items(response):
        kind = str(item.get("type") or "")
        if kind == "message":
            texts.append(_text(item.get("content")))
        elif kind == "function_call":
            call_id = str(item.get("call_id") or item.get("id") or "")
            calls.append(
                ToolCall(id=call_id, name=str(item.get("name") or ""), arguments=_arguments(item))
            )
        elif kind == "reasoning":
            reasoning.append(reasoning_text(item))
        elif kind.endswith("_call"):
            call_id = str(item.get("call_id") or item.get("id") or "")
            calls.append(
                ToolCall(id=call_id, name=str(item.get("name") or kind), arguments=_arguments(item))
            )
    usage = as_dict(response.get("usage"))
    message = ChatMessage(
        role="assistant",
        content="\n".join(t for t in texts if t),
        tool_calls=calls,
        reasoning="\n\n".join(r for r in reasoning if r) or None,
    )
    return Answer(
        message=message,
        response_id=_str(response.get("id")),
        model=_str(response.get("model")),
        finish_reasons=[_finish_reason(response, calls)],
        input_tokens=_count(usage.get("input_tokens")),
        output_tokens=_count(usage.get("output_tokens")),
    )


def _finish_reason(response: dict[str, Any], calls: list[ToolCall]) -> str:
    status = response.get("status")
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return {"max_output_tokens": "length", "content_filter": "content_filter"}.get(
            str(reason), str(reason or "incomplete")
        )
    if status in (None, "completed"):
        return "tool_calls" if calls else "stop"
    return str(status)


def output_items(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The response's output items (to remember for ``previous_response_id``)."""
    output = response.get("output")
    return [dict(i) for i in output if isinstance(i, dict)] if isinstance(output, list) else []


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's readable text: its summary, then its reasoning text."""
    texts = []
    for key in ("summary", "content"):
        for part in item.get(key) or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return "\n".join(t for t in texts if t)


# -- helpers ----------------------------------------------------------------------------------


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            if part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                texts.append(part["refusal"])
    return "".join(texts)


def _arguments(item: dict[str, Any]) -> str:
    for key in ("arguments", "input"):
        value = item.get(key)
        if isinstance(value, str):
            return value
    rest = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status", "name")}
    return json.dumps(rest, sort_keys=True)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
