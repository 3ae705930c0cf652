"""Anthropic's Messages API (``POST /v1/messages``): requests and answers as records, and both
translated to and from chat completions (Trinity serves only that API).

What the gateway does with it::

    parsed = parse_request(body)                   # ApiRequestError: 400 error_body(str(e))
    steps = tool_steps(call_id, parsed.messages, now)                     # common.tool_steps
    # production, Anthropic (gateway.anthropic_url, its key; anthropic-version passed through):
    #   JSON:   answer = answer_of_message(message)
    #   stream: MessagesStreamAssembler().feed(chunk) for each chunk passed through;
    #           answer = answer_of_message(assembler.message())
    # Trinity: parsed.chat (None: parsed.unsupported says why)
    #   JSON:   client gets chat_to_message(completion, parsed); answer = answer_of_chat(completion)
    #   stream: s = ChatToMessagesStream(parsed); client gets s.feed(chunk) ... s.finish();
    #           answer = answer_of_chat(s.completion())
    step = llm_step(call_id, parsed, answer, upstream=..., latency_ms=..., now=now)

Recorded as chat completions are: ``system`` (a string or text blocks, and ``system`` role
messages) as the system message; ``text`` blocks as content; an assistant's ``tool_use`` blocks
as its tool calls (ids, names, ``input`` as JSON arguments); a user message's ``tool_result``
blocks as tool messages before its text (TOOL steps), named after the ``tool_use`` they
answer; ``thinking`` blocks as the message's ``reasoning`` (signatures and
``redacted_thinking`` are not kept: they only matter to Anthropic); the server tools'
``server_tool_use`` as a tool call and their ``*_tool_result`` blocks as tool messages; images
and documents are not recorded (records hold text) and passed to Trinity where chat can carry
them (a base64 or URL image); usage (input tokens include the cache's) and ``stop_reason`` as
the finish reason (``end_turn``/``stop_sequence``: ``stop``, ``tool_use``: ``tool_calls``,
``max_tokens``: ``length``, ``refusal``: ``content_filter``).

What the chat completions API cannot express makes ``ParsedRequest.chat`` None, naming it:
server tools and their blocks, tools other than custom ones (bash, text editor, computer,
web search...), documents other than plain text, a ``container``.

May import: the standard library, the models, :mod:`streams.capture.chat` and this package.
"""

from __future__ import annotations

import json
from typing import Any

from ...models import ChatMessage, ToolCall
from .common import (
    Answer,
    ApiRequestError,
    ParsedRequest,
    as_dict,
    chat_choice,
    chat_message_of,
    json_object,
    usage_of,
)

__all__ = [
    "STOP_REASONS",
    "answer_of_message",
    "chat_to_message",
    "error_body",
    "message_id_for",
    "parse_request",
    "stop_reason_of",
]

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}
"""Anthropic's stop reasons in the chat completions' vocabulary (others are kept as they are)."""

_TO_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


# -- requests ---------------------------------------------------------------------------------


def parse_request(body: Any) -> ParsedRequest:
    """One request of the Messages API."""
    if not isinstance(body, dict):
        raise ApiRequestError("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiRequestError("model: must be a non-empty string", "model")
    raw = body.get("messages")
    if not isinstance(raw, list):
        raise ApiRequestError("messages: must be an array of messages", "messages")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ApiRequestError("stream: must be a boolean", "stream")
    unsupported: list[str] = []
    convo = _Conversation(unsupported)
    system = body.get("system")
    if system is not None:
        convo.system(system, "system")
    for i, message in enumerate(raw):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiRequestError(f"messages.{i}: must be an object with a role", f"messages.{i}")
        convo.add(message, i)
    chat = _chat_request(body, convo.chat, unsupported)
    return ParsedRequest(
        api="messages",
        model=model,
        stream=bool(stream),
        messages=convo.messages,
        chat=None if unsupported else chat,
        unsupported="; ".join(dict.fromkeys(unsupported)) or None,
        body=body,
    )


class _Conversation:
    """Messages -> record messages and chat messages, side by side."""

    def __init__(self, unsupported: list[str]) -> None:
        self.unsupported = unsupported
        self.messages: list[ChatMessage] = []
        self.chat: list[dict[str, Any]] = []
        self._names: dict[str, str] = {}

    def system(self, content: Any, where: str) -> None:
        if not isinstance(content, str | list):
            raise ApiRequestError(f"{where}: must be a string or an array of text blocks", where)
        text = content if isinstance(content, str) else _text(_blocks(content, where))
        self.messages.append(ChatMessage(role="system", content=text))
        self.chat.append({"role": "system", "content": text})

    def add(self, message: dict[str, Any], i: int) -> None:
        role = message["role"]
        where = f"messages.{i}.content"
        if role == "system":
            self.system(message.get("content"), where)
            return
        content = message.get("content")
        blocks = (
            [{"type": "text", "text": content}]
            if isinstance(content, str)
            else _blocks(content, where)
        )
        if role == "assistant":
            self._assistant(blocks)
        else:
            self._user(role, blocks)

    def _assistant(self, blocks: list[dict[str, Any]]) -> None:
        texts, calls, reasoning, results = [], [], [], []
        for block in blocks:
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text") or ""))
            elif kind in ("tool_use", "server_tool_use"):
                call_id, name = str(block.get("id") or ""), str(block.get("name") or "")
                self._names[call_id] = name
                arguments = json.dumps(block.get("input") or {})
                calls.append(ToolCall(id=call_id, name=name, arguments=arguments))
                if kind == "server_tool_use":
                    self.unsupported.append(f"{name} (a server tool)")
            elif kind == "thinking":
                reasoning.append(str(block.get("thinking") or ""))
            elif kind == "redacted_thinking":
                continue
            elif isinstance(kind, str) and kind.endswith("_tool_result"):
                self.unsupported.append(f"content block of type {kind}")
                results.append(block)
            else:
                self.unsupported.append(f"assistant content block of type {kind}")
        message = ChatMessage(
            role="assistant",
            content="".join(texts),
            tool_calls=calls,
            reasoning="\n\n".join(r for r in reasoning if r) or None,
        )
        self.messages.append(message)
        self.chat.append(chat_message_of(message))
        for block in results:  # a server tool's result: a tool message after the call
            self._tool_result(block)

    def _user(self, role: str, blocks: list[dict[str, Any]]) -> None:
        texts: list[str] = []
        parts: list[dict[str, Any]] = []
        for block in blocks:  # tool results first: chat wants them right after the call
            if block.get("type") == "tool_result":
                self._tool_result(block)
        for block in blocks:
            kind = block.get("type")
            if kind == "tool_result":
                continue
            if kind == "text":
                texts.append(str(block.get("text") or ""))
                parts.append({"type": "text", "text": texts[-1]})
            elif kind == "image":
                image = _image_url(block)
                if image is None:
                    self.unsupported.append("image by file id")
                else:
                    parts.append({"type": "image_url", "image_url": {"url": image}})
            elif kind == "document":
                source = as_dict(block.get("source"))
                if source.get("type") == "text":
                    texts.append(str(source.get("data") or ""))
                    parts.append({"type": "text", "text": texts[-1]})
                else:
                    self.unsupported.append(f"document of source type {source.get('type')}")
            elif kind == "search_result":
                text = _text(_blocks(block.get("content") or [], "search_result"))
                texts.append(text)
                parts.append({"type": "text", "text": text})
            else:
                self.unsupported.append(f"user content block of type {kind}")
        if not parts:
            return  # only tool results
        self.messages.append(ChatMessage(role=role, content="\n".join(texts)))
        content: Any = parts
        if all(p["type"] == "text" for p in parts):
            content = "\n".join(p["text"] for p in parts)
        self.chat.append({"role": role, "content": content})

    def _tool_result(self, block: dict[str, Any]) -> None:
        call_id = str(block.get("tool_use_id") or "")
        content = block.get("content")
        if isinstance(content, list):
            blocks = _blocks(content, "tool_result.content")
            if any(b.get("type") != "text" for b in blocks):
                if block.get("type") == "tool_result":
                    self.unsupported.append("tool_result with images or documents")
                text = json.dumps(content, sort_keys=True)
            else:
                text = _text(blocks)
        elif isinstance(content, str):
            text = content
        else:
            text = "" if content is None else json.dumps(content, sort_keys=True)
        message = ChatMessage(
            role="tool", content=text, name=self._names.get(call_id), tool_call_id=call_id
        )
        self.messages.append(message)
        self.chat.append({"role": "tool", "tool_call_id": call_id, "content": text})


def _chat_request(
    body: dict[str, Any], messages: list[dict[str, Any]], unsupported: list[str]
) -> dict[str, Any]:
    if body.get("container") is not None:
        unsupported.append("container")
    chat: dict[str, Any] = {"model": body["model"], "messages": messages}
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    for src, dst in (
        ("max_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("stop_sequences", "stop"),
    ):
        if body.get(src) is not None:
            chat[dst] = body[src]
    user = as_dict(body.get("metadata")).get("user_id")
    if isinstance(user, str) and user:
        chat["user"] = user
    tools = []
    for tool in body.get("tools") or []:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or kind not in (None, "custom"):
            unsupported.append(f"tool of type {kind}")
            continue
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {}}
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = tool["strict"]
        tools.append({"type": "function", "function": function})
    if tools:
        chat["tools"] = tools
    choice = as_dict(body.get("tool_choice"))
    kind = choice.get("type")
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False
    return chat


# -- answers ----------------------------------------------------------------------------------


def answer_of_message(message: dict[str, Any]) -> Answer:
    """A Messages API answer as a record's assistant message, usage, id and finish reason."""
    texts, calls, reasoning = [], [], []
    for block in message.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind in ("tool_use", "server_tool_use"):
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                ToolCall(
                    id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=arguments,
                )
            )
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking") or ""))
    usage = as_dict(message.get("usage"))
    tokens = [usage.get(k) for k in ("input_tokens", "cache_creation_input_tokens")]
    tokens.append(usage.get("cache_read_input_tokens"))
    counted = [t for t in tokens if isinstance(t, int) and not isinstance(t, bool) and t >= 0]
    output = usage.get("output_tokens")
    reason = message.get("stop_reason")
    return Answer(
        message=ChatMessage(
            role="assistant",
            content="".join(texts),
            tool_calls=calls,
            reasoning="\n\n".join(r for r in reasoning if r) or None,
        ),
        response_id=_str(message.get("id")),
        model=_str(message.get("model")),
        finish_reasons=[STOP_REASONS.get(reason, reason)] if isinstance(reason, str) else [],
        input_tokens=sum(counted) if counted else None,
        output_tokens=output if isinstance(output, int) and output >= 0 else None,
    )


def stop_reason_of(finish_reason: str | None) -> str:
    """A chat completion's finish reason as a Messages API ``stop_reason``."""
    if finish_reason == "content_filter":
        return "refusal"
    return _TO_STOP.get(str(finish_reason), "end_turn")


def message_id_for(chat_id: str | None) -> str:
    """The Messages id given to the client for a chat completion (Trinity's id inside)."""
    return f"msg_{chat_id or 'trajstream'}"


def chat_to_message(
    completion: dict[str, Any], request: ParsedRequest, *, message_id: str | None = None
) -> dict[str, Any]:
    """A chat completion (Trinity's answer) as the Messages API object the client expects."""
    message, reason = chat_choice(completion)
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = as_dict(call.get("function"))
        content.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": json_object(str(function.get("arguments") or "")),
            }
        )
    prompt, output = usage_of(completion)
    return {
        "id": message_id or message_id_for(_str(completion.get("id"))),
        "type": "message",
        "role": "assistant",
        "model": _str(completion.get("model")) or request.model,
        "content": content,
        "stop_reason": stop_reason_of(reason),
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": output},
    }


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    """Anthropic's error shape, as the official client reads it."""
    return {"type": "error", "error": {"type": kind, "message": message}}


# -- helpers ----------------------------------------------------------------------------------


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise ApiRequestError(f"{where}: must be a string or an array of content blocks", where)
    out = []
    for j, block in enumerate(content):
        if isinstance(block, str):
            block = {"type": "text", "text": block}
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ApiRequestError(f"{where}.{j}: a content block needs a type", f"{where}.{j}")
        out.append(block)
    return out


def _text(blocks: list[dict[str, Any]]) -> str:
    return "".join(str(b.get("text") or "") for b in blocks if b.get("type") == "text")


def _image_url(block: dict[str, Any]) -> str | None:
    source = as_dict(block.get("source"))
    if source.get("type") == "base64" and source.get("data"):
        return f"data:{source.get('media_type') or 'image/png'};base64,{source['data']}"
    if source.get("type") == "url" and source.get("url"):
        return str(source["url"])
    return None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
