"""A request's parts, read and checked: the JSON body, the call id of the path, the headers
that make a call's START, and the error shapes a refusal is answered in (OpenAI's; Anthropic's
on ``/v1/messages``). Pure functions of the request; nothing is recorded here.

May import: aiohttp, the models, :mod:`streams.errors`, :mod:`..chat`.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pydantic
from aiohttp import web

from ...errors import BadRequest
from ...models import AgentCall, CallPhase, TrainingMark, utcnow
from ..chat import to_chat_message

HEADER_AGENT_NAME = "X-Trajstream-Agent-Name"
HEADER_AGENT_ID = "X-Trajstream-Agent-Id"
HEADER_AGENT_VERSION = "X-Trajstream-Agent-Version"
HEADER_CONVERSATION = "X-Trajstream-Conversation-Id"
HEADER_MARK = "X-Trajstream-Mark"
_MAX_HEADER = 1024
_KEY_AGENT: Any = (
    web.RequestKey("trajstream_key_agent", str) if hasattr(web, "RequestKey") else "key_agent"
)
"""Where the auth middleware leaves the agent its key names (aiohttp >= 3.13: a RequestKey)."""
OPEN_PATHS = frozenset({"/healthz", "/metrics"})
"""Routes served without a client key: the probes (no model is called, nothing recorded)."""
_CALL_ID = re.compile(r"^[A-Za-z0-9._:@-]{1,200}$")


def openai_error(
    status: int, message: str, *, type_: str, param: str | None = None, code: str | None = None
) -> web.Response:
    """A response in OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status)


ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}
"""Anthropic's error type by status (any other: ``api_error``)."""


def error_for(
    request: web.Request,
    status: int,
    message: str,
    *,
    type_: str,
    param: str | None = None,
    code: str | None = None,
) -> web.Response:
    """An error in the shape of the API the client speaks: Anthropic's
    (``{"type": "error", "error": {"type", "message"}}``) on ``/v1/messages``, OpenAI's on
    every other route."""
    if request.path.endswith("/v1/messages"):
        kind = ANTHROPIC_ERRORS.get(status, "api_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
        return web.json_response(body, status=status)
    return openai_error(status, message, type_=type_, param=param, code=code)


def parse_messages(body: Any) -> list[dict[str, Any]]:
    """The request's ``messages``, checked; raises BadRequest naming what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty array", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
            raise BadRequest(f"messages[{i}] must be an object with a role", f"messages[{i}]")
    if "model" in body and not isinstance(body["model"], str):
        raise BadRequest("model must be a string", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("stream must be true or false", "stream")
    return messages


async def json_body(request: web.Request, *, required: bool = True) -> Any:
    raw = await request.read()
    if not raw and not required:
        return {}
    return parse_json(raw)


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None


def call_id_of(request: web.Request) -> str | None:
    call_id = request.match_info.get("call_id")
    if call_id is not None and not _CALL_ID.match(call_id):
        raise BadRequest(
            "the call id in the path must be 1 to 200 characters of A-Z a-z 0-9 . _ : @ -",
            "call_id",
        )
    return call_id


def start_event(request: web.Request, call_id: str, messages: list[dict[str, Any]]) -> AgentCall:
    """The call's START from the request's headers (checked) and the key's agent."""
    fields: dict[str, Any] = {}
    for header, name in (
        (HEADER_AGENT_NAME, "agent_name"),
        (HEADER_AGENT_ID, "agent_id"),
        (HEADER_AGENT_VERSION, "agent_version"),
        (HEADER_CONVERSATION, "conversation_id"),
    ):
        value = request.headers.get(header)
        if value is None:
            continue
        if not value or len(value) > _MAX_HEADER or not value.isprintable():
            raise BadRequest(
                f"header {header} must be 1 to {_MAX_HEADER} printable characters", header
            )
        fields[name] = value
    if request.get(_KEY_AGENT) is not None:  # the key names its agent
        fields["agent_name"] = request[_KEY_AGENT]
    raw_mark = request.headers.get(HEADER_MARK)
    now = utcnow()
    if raw_mark is not None:
        try:
            data = json.loads(raw_mark)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            fields["mark"] = TrainingMark.model_validate({"marked_at": now, **data})
        except (ValueError, pydantic.ValidationError) as exc:
            detail = (
                "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
                if isinstance(exc, pydantic.ValidationError)
                else str(exc)
            )
            raise BadRequest(
                f"header {HEADER_MARK} must be a JSON training mark "
                '({"labels": [...], "task_id": "...", "run_id": 0, "metadata": {...}, '
                f'"marked_at": "..."}}): {detail}',
                HEADER_MARK,
            ) from None
    return AgentCall(
        event_id=f"{call_id}/start",
        call_id=call_id,
        phase=CallPhase.START,
        event_time=now,
        input_messages=[to_chat_message(m) for m in messages],
        **fields,
    )
