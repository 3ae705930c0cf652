"""Streamed Responses API answers: the typed server-sent events of a streamed response put back
together, and a streamed chat completion (Trinity's) told to the client as those events.

- :class:`ResponsesStreamAssembler`: feed the bytes of a ``stream: true`` answer as they pass
  through; :meth:`~ResponsesStreamAssembler.response` is the final Response object. It takes the
  response of the terminal event (``response.completed``, ``.incomplete``, ``.failed``) and,
  where that lacks output, the items the stream built: ``response.output_item.added`` /
  ``.done``, ``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
  ``response.refusal.delta``, ``response.function_call_arguments.delta`` / ``.done``,
  ``response.reasoning_summary_part.added``, ``response.reasoning_summary_text.delta``,
  ``response.reasoning_text.delta`` and the ``*.done`` events that repeat a final value. Every
  other event type (``response.created``, ``.in_progress``, ``.queued``, the built-in tools'
  progress events, annotations, audio) changes nothing it needs. ``error`` events are kept in
  :attr:`~ResponsesStreamAssembler.error`.
- :class:`ChatToResponsesStream`: feed the bytes of a streamed chat completion; each
  :meth:`~ChatToResponsesStream.feed` returns the Responses events to send on, in the order the
  official ``openai`` client's stream accumulator checks: ``response.created``,
  ``response.in_progress``; per output item ``response.output_item.added``, its content part,
  deltas, ``*.done``, ``response.output_item.done``; last ``response.completed`` (or
  ``response.incomplete`` for a completion cut at its token limit). Reasoning and text are sent
  as they come; tool calls once the chat stream ends (a chat stream may interleave the deltas of
  parallel calls), each as one arguments delta. :meth:`~ChatToResponsesStream.completion` is the
  chat completion the stream added up to (the record, and Trinity's msg_id), and
  :meth:`~ChatToResponsesStream.response` the Response object the client was told.

May import: the standard library and this package, :mod:`streams.capture.chat`.
"""

from __future__ import annotations

import copy
import time
from typing import Any

from ..chat import StreamAssembler
from .common import ParsedRequest, as_dict
from .responses_json import (
    function_call_item,
    item_ids,
    message_item,
    reasoning_item,
    response_id_for,
    response_object,
)
from .sse import Event, SseParser, encode_event

__all__ = ["TERMINAL", "ChatToResponsesStream", "ResponsesStreamAssembler"]

TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesStreamAssembler:
    """Rebuilds a Response object from the typed events of a streamed answer."""

    def __init__(self) -> None:
        self._parser = SseParser()
        self.base: dict[str, Any] = {}
        self.final: dict[str, Any] | None = None
        self.items: dict[int, dict[str, Any]] = {}
        self.error: dict[str, Any] | None = None
        self.events = 0

    @property
    def done(self) -> bool:
        """A terminal event arrived (the answer is whole)."""
        return self.final is not None

    def feed(self, data: bytes) -> None:
        for event in self._parser.feed(data):
            self.add(event)

    def add(self, event: Event | dict[str, Any]) -> None:
        """Apply one event (parsed SSE, or its JSON data as a dict)."""
        data = event.json() if isinstance(event, Event) else event
        if not isinstance(data, dict):
            return
        self.events += 1
        kind = str(data.get("type") or (event.name if isinstance(event, Event) else ""))
        if kind in ("response.created", "response.in_progress", "response.queued"):
            self.base = dict(as_dict(data.get("response")))
        elif kind in TERMINAL:
            self.final = dict(as_dict(data.get("response")))
        elif kind == "error":
            self.error = {k: data.get(k) for k in ("code", "message", "param")}
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = data.get("item")
            if isinstance(item, dict):
                self.items[int(data.get("output_index") or 0)] = copy.deepcopy(item)
        else:
            self._delta(kind, data)

    def _delta(self, kind: str, data: dict[str, Any]) -> None:
        item = self.items.get(int(data.get("output_index") or 0))
        if item is None:
            return
        index = data.get("content_index", data.get("summary_index"))
        index = index if isinstance(index, int) else 0
        if kind == "response.content_part.added":
            _put(item.setdefault("content", []), index, dict(as_dict(data.get("part"))))
        elif kind == "response.reasoning_summary_part.added":
            _put(item.setdefault("summary", []), index, dict(as_dict(data.get("part"))))
        elif kind == "response.output_text.delta":
            _part(item, "content", index, "output_text")["text"] += str(data.get("delta") or "")
        elif kind == "response.output_text.done":
            _part(item, "content", index, "output_text")["text"] = str(data.get("text") or "")
        elif kind == "response.refusal.delta":
            part = _part(item, "content", index, "refusal", "refusal")
            part["refusal"] += str(data.get("delta") or "")
        elif kind == "response.refusal.done":
            _part(item, "content", index, "refusal", "refusal")["refusal"] = str(
                data.get("refusal") or ""
            )
        elif kind == "response.function_call_arguments.delta":
            item["arguments"] = str(item.get("arguments") or "") + str(data.get("delta") or "")
        elif kind == "response.function_call_arguments.done":
            item["arguments"] = str(data.get("arguments") or "")
        elif kind == "response.reasoning_summary_text.delta":
            part = _part(item, "summary", index, "summary_text")
            part["text"] += str(data.get("delta") or "")
        elif kind == "response.reasoning_summary_text.done":
            _part(item, "summary", index, "summary_text")["text"] = str(data.get("text") or "")
        elif kind == "response.reasoning_text.delta":
            _part(item, "content", index, "reasoning_text")["text"] += str(data.get("delta") or "")
        elif kind == "response.reasoning_text.done":
            _part(item, "content", index, "reasoning_text")["text"] = str(data.get("text") or "")

    def response(self) -> dict[str, Any]:
        """The final Response object (the terminal event's, its output filled in from the
        items when it has none; without a terminal event, what arrived so far)."""
        out = dict(self.final if self.final is not None else self.base)
        if not out.get("output"):
            out["output"] = [self.items[i] for i in sorted(self.items)]
        if self.final is None and self.error is not None:
            out.setdefault("error", self.error)
        return out


def _put(parts: list[dict[str, Any]], index: int, part: dict[str, Any]) -> None:
    while len(parts) <= index:
        parts.append({})
    parts[index] = part


def _part(
    item: dict[str, Any], key: str, index: int, kind: str, field: str = "text"
) -> dict[str, Any]:
    parts = item.setdefault(key, [])
    while len(parts) <= index:
        parts.append({"type": kind, field: ""})
    part = parts[index]
    if not isinstance(part.get(field), str):
        part[field] = ""
    part.setdefault("type", kind)
    return part  # type: ignore[no-any-return]


class ChatToResponsesStream:
    """A streamed chat completion told as Responses API events; see the module docstring."""

    def __init__(
        self,
        request: ParsedRequest,
        *,
        response_id: str | None = None,
        created_at: int | None = None,
    ) -> None:
        self.request = request
        self.chat = StreamAssembler()
        self._chat_parser = SseParser()
        self.response_id = response_id
        self.created_at = created_at if created_at is not None else int(time.time())
        self._seq = 0
        self._started = False
        self._finished = False
        self._output: list[dict[str, Any]] = []
        self._reasoning: dict[str, Any] | None = None
        self._message: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None

    # -- the chat side -------------------------------------------------------------------------

    def feed(self, data: bytes) -> bytes:
        """Chat completion chunks in (any split), Responses events out."""
        out = bytearray()
        for event in self._chat_parser.feed(data):
            if event.data.strip() == "[DONE]":
                continue
            chunk = event.json()
            if not isinstance(chunk, dict):
                continue
            self.chat.add_chunk(chunk)
            out += self._start()
            for choice in chunk.get("choices") or []:
                if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                    continue
                delta = as_dict(choice.get("delta"))
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
                if isinstance(reasoning, str) and reasoning and self._message is None:
                    out += self._reason(reasoning)
                content = delta.get("content")
                if isinstance(content, str) and content:
                    out += self._text(content)
        return bytes(out)

    def finish(self) -> bytes:
        """After the chat stream's last byte: close the items, send the tool calls and the
        terminal event."""
        if self._finished:
            return b""
        self._finished = True
        out = bytearray(self._start())
        out += self._close_reasoning()
        completion = self.chat.completion()
        choice = (completion.get("choices") or [{}])[0]
        message = as_dict(choice.get("message"))
        calls = message.get("tool_calls") or []
        if self._message is None and not calls:
            out += self._text("")  # an empty answer is still one message
        out += self._close_message()
        _, _, fc_id = item_ids(self._id)
        for i, call in enumerate(calls):
            function = as_dict(call.get("function"))
            item = function_call_item(
                f"{fc_id}_{i}",
                str(call.get("id") or f"call_{i}"),
                str(function.get("name") or ""),
                "",
                status="in_progress",
            )
            index = len(self._output)
            self._output.append(item)
            arguments = str(function.get("arguments") or "")
            out += self._event("response.output_item.added", output_index=index, item=dict(item))
            out += self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            )
            out += self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=arguments,
            )
            item.update(arguments=arguments, status="completed")
            out += self._event("response.output_item.done", output_index=index, item=dict(item))
        usage = completion.get("usage")
        tokens = None
        if isinstance(usage, dict):
            tokens = (
                int(usage.get("prompt_tokens") or 0),
                int(usage.get("completion_tokens") or 0),
            )
        final = response_object(
            self.request,
            self._id,
            self.created_at,
            model=self.chat.model or self.request.model,
            output=copy.deepcopy(self._output),
            finish_reason=choice.get("finish_reason"),
            usage=tokens,
        )
        self._final = final
        terminal = (
            "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        )
        out += self._event(terminal, response=final)
        return bytes(out)

    def fail(self, message: str) -> bytes:
        """The chat stream broke off: a ``response.failed`` event for the client."""
        if self._finished:
            return b""
        self._finished = True
        out = bytearray(self._start())
        final = self._lifecycle("failed")
        final["error"] = {"code": "server_error", "message": message}
        self._final = final
        out += self._event("response.failed", response=final)
        return bytes(out)

    def completion(self) -> dict[str, Any]:
        """The chat completion the chunks added up to (Trinity's: its ``id`` is the msg_id)."""
        return self.chat.completion()

    def response(self) -> dict[str, Any]:
        """The Response object the client was told (after :meth:`finish`)."""
        return self._final if self._final is not None else self._lifecycle("in_progress")

    # -- the Responses side --------------------------------------------------------------------

    @property
    def _id(self) -> str:
        if self.response_id is None:
            self.response_id = response_id_for(self.chat.id)
        return self.response_id

    def _lifecycle(self, status: str) -> dict[str, Any]:
        return response_object(
            self.request,
            self._id,
            self.created_at,
            model=self.chat.model or self.request.model,
            output=[],
            finish_reason=None,
            usage=None,
            status=status,
        )

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return encode_event(data)

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        response = self._lifecycle("in_progress")
        return self._event("response.created", response=response) + self._event(
            "response.in_progress", response=response
        )

    def _reason(self, delta: str) -> bytes:
        out = b""
        if self._reasoning is None:
            rs_id, _, _ = item_ids(self._id)
            self._reasoning = reasoning_item(rs_id, "", status="in_progress")
            self._reasoning["_index"] = len(self._output)
            self._output.append(self._reasoning)
            index = self._reasoning["_index"]
            item = {k: v for k, v in self._reasoning.items() if k != "_index"}
            item["content"] = []
            out += self._event("response.output_item.added", output_index=index, item=item)
            out += self._event(
                "response.content_part.added",
                item_id=rs_id,
                output_index=index,
                content_index=0,
                part={"type": "reasoning_text", "text": ""},
            )
        self._reasoning["content"][0]["text"] += delta
        return out + self._event(
            "response.reasoning_text.delta",
            item_id=self._reasoning["id"],
            output_index=self._reasoning["_index"],
            content_index=0,
            delta=delta,
        )

    def _close_reasoning(self) -> bytes:
        item = self._reasoning
        if item is None or item["status"] == "completed":
            return b""
        index = item.pop("_index")
        item["status"] = "completed"
        text = item["content"][0]["text"]
        return (
            self._event(
                "response.reasoning_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
            )
            + self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part={"type": "reasoning_text", "text": text},
            )
            + self._event("response.output_item.done", output_index=index, item=dict(item))
        )

    def _text(self, delta: str) -> bytes:
        out = b""
        if self._message is None:
            out += self._close_reasoning()
            _, msg_id, _ = item_ids(self._id)
            self._message = message_item(msg_id, "", status="in_progress")
            self._message["_index"] = len(self._output)
            self._output.append(self._message)
            index = self._message["_index"]
            item = {k: v for k, v in self._message.items() if k != "_index"}
            item["content"] = []
            out += self._event("response.output_item.added", output_index=index, item=item)
            out += self._event(
                "response.content_part.added",
                item_id=msg_id,
                output_index=index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
            )
        self._message["content"][0]["text"] += delta
        if not delta:
            return out
        return out + self._event(
            "response.output_text.delta",
            item_id=self._message["id"],
            output_index=self._message["_index"],
            content_index=0,
            delta=delta,
            logprobs=[],
        )

    def _close_message(self) -> bytes:
        item = self._message
        if item is None or item["status"] == "completed":
            return b""
        index = item.pop("_index")
        item["status"] = "completed"
        part = item["content"][0]
        return (
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            + self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            )
            + self._event("response.output_item.done", output_index=index, item=copy.deepcopy(item))
        )
