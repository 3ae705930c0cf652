"""What differs between the Responses API and Anthropic's Messages API on the gateway's
routes (:mod:`.api_routes`): how a request is parsed, where production is, how an answer is
read and told back, the API's error shapes, what a response leaves for the next request.

May import: what :mod:`.api_routes` imports but the routes, :mod:`.calls` and :mod:`.policy`.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from aiohttp import web

from ...errors import ApiRefused, ApiRequestError
from ...models import ChatMessage
from ...settings import GatewaySettings
from ..apis import (
    Answer,
    ChatToMessagesStream,
    ChatToResponsesStream,
    ItemStore,
    MessagesStreamAssembler,
    ParsedRequest,
    ResponsesStreamAssembler,
    answer_of_message,
    answer_of_response,
    chat_to_message,
    chat_to_response,
    output_items,
    previous_not_found,
)
from ..apis import messages as messages_api
from ..apis import responses as responses_api
from ..apis.responses_json import error_body as responses_error
from ..apis.sse import encode_event
from .calls import CallState
from .policy import PolicyAnswer

__all__ = ["Api", "Exchange", "Messages", "Responses", "Which"]

ANTHROPIC_VERSION = "2023-06-01"
"""Sent to Anthropic when the client sent no ``anthropic-version`` header."""

Which = Literal["trinity", "production"]


class _ChatStream(Protocol):
    def feed(self, data: bytes) -> bytes: ...
    def finish(self) -> bytes: ...
    def fail(self, message: str) -> bytes: ...
    def completion(self) -> dict[str, Any]: ...


class Routes(Protocol):
    """What an API's shape reads of the routes (:class:`.api_routes.ApiRoutes`)."""

    gateway: Any
    config: GatewaySettings
    items: ItemStore
    instructions: OrderedDict[str, str]
    _anthropic_key: str | None


@dataclass
class Exchange:
    """One request on its way: what every step of :class:`ApiRoutes` needs of it."""

    api: Api
    call_id: str
    parsed: ParsedRequest
    state: CallState
    which: Which
    headers: dict[str, str]
    path_call: str | None
    policy: PolicyAnswer | None = None
    """Trinity's answer, opened (its first bytes read) before anything reached the client."""
    fallback: str | None = None
    """Why production answers this request of a call routed to Trinity."""
    began: float = 0.0
    """When Trinity's answer was asked for (``time.perf_counter()``)."""

    @property
    def request_headers(self) -> Any:
        return self.api.request.headers

    def marks(self, error_type: str | None = None) -> dict[str, Any]:
        """The step's ``policy_version``, ``fallback`` and ``error_type`` (those set)."""
        out: dict[str, Any] = {}
        if self.fallback is not None:
            out["fallback"] = self.fallback
        if self.policy is not None and self.policy.version is not None:
            out["policy_version"] = self.policy.version
        if error_type is not None:
            out["error_type"] = error_type
        return out


class Api:
    """What differs between the two APIs."""

    provider = ""
    label = ""
    """The ``api`` label of the gateway's metrics."""
    no_production = ""

    def __init__(self, routes: Routes, request: web.Request) -> None:
        self.routes = routes
        self.request = request

    def error(self, message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, body: Any, path_call: str | None) -> tuple[str, ParsedRequest]:
        raise NotImplementedError

    def has_production(self) -> bool:
        raise NotImplementedError

    def production(self, headers: Any) -> tuple[str, dict[str, str]]:
        raise NotImplementedError

    def answer(self, told: dict[str, Any]) -> Answer:
        raise NotImplementedError

    def from_chat(self, completion: dict[str, Any], parsed: ParsedRequest) -> dict[str, Any]:
        raise NotImplementedError

    def chat_stream(self, parsed: ParsedRequest) -> _ChatStream:
        raise NotImplementedError

    def told_stream(self, stream: _ChatStream) -> dict[str, Any] | None:
        return None

    def assembler(self) -> Any:
        raise NotImplementedError

    def assembled(self, assembler: Any) -> dict[str, Any] | None:
        raise NotImplementedError

    def remember(self, exchange: Exchange, told: dict[str, Any]) -> None:
        return None

    def stream_error(self, message: str) -> bytes:
        """An ``error`` event of the API's stream, sent in place of the terminal event."""
        raise NotImplementedError


class Responses(Api):
    provider = "openai"
    label = "responses"
    no_production = "gateway.production_url is not set"

    def error(self, message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
        return responses_error(message, kind=kind)

    def parse(self, body: Any, path_call: str | None) -> tuple[str, ParsedRequest]:
        items = self.routes.items
        previous = body.get("previous_response_id") if isinstance(body, dict) else None
        if previous is not None and not isinstance(previous, str):
            raise ApiRefused(
                400,
                responses_error(
                    "previous_response_id must be a string", param="previous_response_id"
                ),
            )
        owner = path_call or (items.call_of(previous) if previous else None)
        history = items.history(owner, previous) if owner else ([] if not previous else None)
        if history is None:
            assert previous is not None
            raise ApiRefused(400, previous_not_found(previous))
        try:
            parsed = responses_api.parse_request(body, history)
        except ApiRequestError as exc:
            raise ApiRefused(400, responses_error(str(exc), param=exc.param)) from None
        inherited = self.routes.instructions.get(previous) if previous else None
        if inherited and not body.get("instructions"):
            # instructions do not carry over to a request that continues a response, but the
            # records keep them: the conversation, and the seqs in it, stay one
            parsed.messages.insert(0, ChatMessage(role="system", content=inherited))
        return path_call or f"gw-{uuid.uuid4().hex}", parsed

    def has_production(self) -> bool:
        return bool(self.routes.gateway.production_url)

    def production(self, headers: Any) -> tuple[str, dict[str, str]]:
        gateway = self.routes.gateway
        out = {"Content-Type": "application/json"}
        if gateway._production_key:
            out["Authorization"] = f"Bearer {gateway._production_key}"
        return f"{gateway.production_url}/responses", out

    def answer(self, told: dict[str, Any]) -> Answer:
        return answer_of_response(told)

    def stream_error(self, message: str) -> bytes:
        # the Responses API's error event; its "error" object beside makes the openai SDK
        # raise an APIError with this message (it raises on an event whose data has "error")
        error = {"type": "error", "code": "recording_unavailable", "message": message}
        detail = {"type": "server_error", "code": "recording_unavailable", "message": message}
        return encode_event({**error, "param": None, "error": detail})

    def from_chat(self, completion: dict[str, Any], parsed: ParsedRequest) -> dict[str, Any]:
        return chat_to_response(completion, parsed)

    def chat_stream(self, parsed: ParsedRequest) -> _ChatStream:
        return ChatToResponsesStream(parsed)

    def told_stream(self, stream: _ChatStream) -> dict[str, Any] | None:
        assert isinstance(stream, ChatToResponsesStream)
        return stream.response()

    def assembler(self) -> ResponsesStreamAssembler:
        return ResponsesStreamAssembler()

    def assembled(self, assembler: Any) -> dict[str, Any] | None:
        assert isinstance(assembler, ResponsesStreamAssembler)
        return assembler.response() if assembler.done else None

    def remember(self, exchange: Exchange, told: dict[str, Any]) -> None:
        response_id = told.get("id")
        if isinstance(response_id, str) and response_id:
            self.routes.items.remember(
                exchange.call_id, response_id, exchange.parsed.items + output_items(told)
            )
            kept = self.routes.instructions
            body = exchange.parsed.body
            own, previous = body.get("instructions"), body.get("previous_response_id")
            if isinstance(own, str) and own:
                kept[response_id] = own
            elif isinstance(previous, str) and previous in kept:
                kept[response_id] = kept[previous]
            while len(kept) > 8 * self.routes.config.responses_calls:
                kept.popitem(last=False)


class Messages(Api):
    provider = "anthropic"
    label = "messages"
    no_production = (
        "gateway.anthropic_url [TRAJSTREAM_GATEWAY__ANTHROPIC_URL] is not set: this request is "
        "not routed to Trinity and there is no Anthropic upstream"
    )

    def error(self, message: str, *, kind: str = "invalid_request_error") -> dict[str, Any]:
        return messages_api.error_body(message, kind)

    def parse(self, body: Any, path_call: str | None) -> tuple[str, ParsedRequest]:
        try:
            parsed = messages_api.parse_request(body)
        except ApiRequestError as exc:
            raise ApiRefused(400, messages_api.error_body(str(exc))) from None
        return path_call or f"gw-{uuid.uuid4().hex}", parsed

    def has_production(self) -> bool:
        return bool(self.routes.config.anthropic_url)

    def production(self, headers: Any) -> tuple[str, dict[str, str]]:
        config = self.routes.config
        out = {
            "Content-Type": "application/json",
            "anthropic-version": headers.get("anthropic-version") or ANTHROPIC_VERSION,
        }
        if headers.get("anthropic-beta"):
            out["anthropic-beta"] = headers["anthropic-beta"]
        if self.routes._anthropic_key:
            out["x-api-key"] = self.routes._anthropic_key
        return f"{config.anthropic_url}/v1/messages", out

    def answer(self, told: dict[str, Any]) -> Answer:
        return answer_of_message(told)

    def stream_error(self, message: str) -> bytes:
        return encode_event(messages_api.error_body(message, "api_error"))

    def from_chat(self, completion: dict[str, Any], parsed: ParsedRequest) -> dict[str, Any]:
        return chat_to_message(completion, parsed)

    def chat_stream(self, parsed: ParsedRequest) -> _ChatStream:
        return ChatToMessagesStream(parsed)

    def told_stream(self, stream: _ChatStream) -> dict[str, Any] | None:
        return {}  # nothing to remember: the Messages API keeps no server-side state

    def assembler(self) -> MessagesStreamAssembler:
        return MessagesStreamAssembler()

    def assembled(self, assembler: Any) -> dict[str, Any] | None:
        assert isinstance(assembler, MessagesStreamAssembler)
        return assembler.message() if assembler.done else None

