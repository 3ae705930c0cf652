"""The model APIs agents call besides chat completions, translated: OpenAI's Responses API
(:mod:`.responses`, streamed in :mod:`.responses_stream`, ``previous_response_id`` in
:mod:`.responses_store`) and Anthropic's Messages API (:mod:`.messages`, streamed in
:mod:`.messages_stream`). Pure: no HTTP, no Kafka; the gateway is the edge.

Each API gives the gateway the same four things (:mod:`.common`):

1. ``parse_request(body) -> ParsedRequest``: the conversation as record messages
   (``.messages``; the answer's seq is their count), and the same request as a chat
   completions body for Trinity (``.chat``, or None with ``.unsupported`` saying why);
   a malformed body raises :class:`~.common.ApiRequestError` (400, naming ``.param``);
2. ``tool_steps(call_id, parsed.messages, now)``: the TOOL steps the request reports;
3. an :class:`~.common.Answer` from whichever upstream answered: the API's own JSON
   (``answer_of_response``, ``answer_of_message``), its stream put together
   (``ResponsesStreamAssembler``, ``MessagesStreamAssembler``), or Trinity's chat completion
   (``answer_of_chat``: its id is the msg_id);
4. Trinity's chat answer told back in the client's API: JSON (``chat_to_response``,
   ``chat_to_message``) or a stream (``ChatToResponsesStream``, ``ChatToMessagesStream``,
   fed the chat stream's bytes, each returning the bytes to send on);

and ``llm_step(call_id, parsed, answer, upstream=..., latency_ms=..., now=...)`` makes the
LLM step. Records are those of chat completions (:mod:`streams.capture.chat`), so a call mixing
APIs, or answered by either upstream, is one trajectory.
"""

from __future__ import annotations

from .common import Answer, ApiRequestError, ParsedRequest, answer_of_chat, llm_step, tool_steps
from .messages import answer_of_message, chat_to_message
from .messages_stream import ChatToMessagesStream, MessagesStreamAssembler
from .responses import answer_of_response, chat_to_response, output_items, previous_not_found
from .responses_store import ItemStore
from .responses_stream import ChatToResponsesStream, ResponsesStreamAssembler

__all__ = [
    "Answer",
    "ApiRequestError",
    "ChatToMessagesStream",
    "ChatToResponsesStream",
    "ItemStore",
    "MessagesStreamAssembler",
    "ParsedRequest",
    "ResponsesStreamAssembler",
    "answer_of_chat",
    "answer_of_message",
    "answer_of_response",
    "chat_to_message",
    "chat_to_response",
    "llm_step",
    "output_items",
    "previous_not_found",
    "tool_steps",
]
