"""Streamed Messages API answers: Anthropic's server-sent events put back together, and a
streamed chat completion (Trinity's) told to the client as those events.

- :class:`MessagesStreamAssembler`: feed the bytes of a ``stream: true`` answer as they pass
  through; :meth:`~MessagesStreamAssembler.message` is the final Message. Events:
  ``message_start`` (the message, its input usage), ``content_block_start`` (a block at its
  index), ``content_block_delta`` with ``text_delta``, ``input_json_delta`` (a tool input's
  JSON, parsed at ``content_block_stop``), ``thinking_delta``, ``signature_delta``,
  ``citations_delta``, ``content_block_stop``, ``message_delta`` (``stop_reason``, the output
  usage; its counts are totals), ``message_stop`` (the answer is whole); ``ping`` changes
  nothing; ``error`` is kept in :attr:`~MessagesStreamAssembler.error`.
- :class:`ChatToMessagesStream`: feed the bytes of a streamed chat completion; each
  :meth:`~ChatToMessagesStream.feed` returns the Messages events to send on: ``message_start``,
  a ``thinking`` block for reasoning and a ``text`` block, streamed as they come, then each
  tool call as a ``tool_use`` block (once the chat stream ends: its deltas may interleave),
  ``message_delta`` with the stop reason and usage, ``message_stop``.

May import: the standard library and this package, :mod:`streams.capture.chat`.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ..chat import StreamAssembler
from .common import ParsedRequest, as_dict, json_object
from .messages import message_id_for, stop_reason_of
from .sse import Event, SseParser, encode_event

__all__ = ["ChatToMessagesStream", "MessagesStreamAssembler"]


class MessagesStreamAssembler:
    """Rebuilds a Message from the events of a streamed Messages API answer."""

    def __init__(self) -> None:
        self._parser = SseParser()
        self.snapshot: dict[str, Any] | None = None
        self._json: dict[int, str] = {}
        self.done = False
        self.error: dict[str, Any] | None = None

    def feed(self, data: bytes) -> None:
        for event in self._parser.feed(data):
            self.add(event)

    def add(self, event: Event | dict[str, Any]) -> None:
        """Apply one event (parsed SSE, or its JSON data as a dict)."""
        data = event.json() if isinstance(event, Event) else event
        if not isinstance(data, dict):
            return
        kind = data.get("type")
        if kind == "message_start":
            self.snapshot = copy.deepcopy(as_dict(data.get("message")))
            self.snapshot.setdefault("content", [])
            return
        if kind == "error":
            self.error = as_dict(data.get("error"))
            return
        if kind == "message_stop":
            self.done = True
            return
        message = self.snapshot
        if message is None:
            return
        content: list[dict[str, Any]] = message["content"]
        index = data.get("index")
        if kind == "content_block_start" and isinstance(index, int):
            while len(content) <= index:
                content.append({})
            content[index] = copy.deepcopy(as_dict(data.get("content_block")))
        elif kind == "content_block_delta" and isinstance(index, int) and index < len(content):
            self._delta(content[index], index, as_dict(data.get("delta")))
        elif kind == "content_block_stop" and isinstance(index, int) and index in self._json:
            if index < len(content):
                content[index]["input"] = json_object(self._json.pop(index))
        elif kind == "message_delta":
            delta = as_dict(data.get("delta"))
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    message[key] = delta[key]
            usage = message.setdefault("usage", {})
            for key, value in as_dict(data.get("usage")).items():
                if value is not None:
                    usage[key] = value  # totals: they replace, they do not add

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + str(delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = str(delta.get("signature") or "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def message(self) -> dict[str, Any]:
        """The Message the events added up to (so far, without ``message_stop``)."""
        message = copy.deepcopy(self.snapshot) if self.snapshot is not None else {}
        for index, raw in self._json.items():  # a block never stopped: its JSON so far
            if index < len(message.get("content", [])):
                message["content"][index]["input"] = json_object(raw)
        return message


class ChatToMessagesStream:
    """A streamed chat completion told as Messages API events; see the module docstring."""

    def __init__(self, request: ParsedRequest, *, message_id: str | None = None) -> None:
        self.request = request
        self.chat = StreamAssembler()
        self._parser = SseParser()
        self.message_id = message_id
        self._started = False
        self._finished = False
        self._index = -1
        self._open: str | None = None

    def feed(self, data: bytes) -> bytes:
        """Chat completion chunks in (any split), Messages events out."""
        out = bytearray()
        for event in self._parser.feed(data):
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
                if isinstance(reasoning, str) and reasoning and self._open != "text":
                    out += self._block("thinking", {"thinking": "", "signature": ""})
                    out += self._delta({"type": "thinking_delta", "thinking": reasoning})
                content = delta.get("content")
                if isinstance(content, str) and content:
                    out += self._block("text", {"text": ""})
                    out += self._delta({"type": "text_delta", "text": content})
        return bytes(out)

    def finish(self) -> bytes:
        """After the chat stream's last byte: the tool calls, the stop reason, the end."""
        if self._finished:
            return b""
        self._finished = True
        out = bytearray(self._start())
        completion = self.chat.completion()
        choice = (completion.get("choices") or [{}])[0]
        message = as_dict(choice.get("message"))
        for call in message.get("tool_calls") or []:
            function = as_dict(call.get("function"))
            arguments = str(function.get("arguments") or "")
            out += self._close()
            self._index += 1
            block = {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": {},
            }
            out += self._event("content_block_start", index=self._index, content_block=block)
            partial = json.dumps(json_object(arguments))
            out += self._delta({"type": "input_json_delta", "partial_json": partial})
            self._open = "tool_use"
        out += self._close()
        usage = as_dict(completion.get("usage"))
        out += self._event(
            "message_delta",
            delta={
                "stop_reason": stop_reason_of(choice.get("finish_reason")),
                "stop_sequence": None,
            },
            usage={
                "input_tokens": int(usage.get("prompt_tokens") or 0),
                "output_tokens": int(usage.get("completion_tokens") or 0),
            },
        )
        out += self._event("message_stop")
        return bytes(out)

    def fail(self, message: str) -> bytes:
        """The chat stream broke off: an ``error`` event for the client."""
        if self._finished:
            return b""
        self._finished = True
        error = {"type": "api_error", "message": message}
        return bytes(self._start()) + self._event("error", error=error)

    def completion(self) -> dict[str, Any]:
        """The chat completion the chunks added up to (Trinity's: its ``id`` is the msg_id)."""
        return self.chat.completion()

    # -- the Messages side ---------------------------------------------------------------------

    def _event(self, kind: str, **fields: Any) -> bytes:
        return encode_event({"type": kind, **fields})

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        if self.message_id is None:
            self.message_id = message_id_for(self.chat.id)
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.chat.model or self.request.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return self._event("message_start", message=message)

    def _block(self, kind: str, fields: dict[str, Any]) -> bytes:
        """Open a block of ``kind`` unless it is the one open."""
        if self._open == kind:
            return b""
        out = self._close()
        self._index += 1
        self._open = kind
        block = {"type": kind, **fields}
        return out + self._event("content_block_start", index=self._index, content_block=block)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=self._index, delta=delta)

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return self._event("content_block_stop", index=self._index)
