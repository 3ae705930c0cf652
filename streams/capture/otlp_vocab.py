"""The GenAI attribute vocabularies of OTLP spans: messages in their several forms, training
marks, and the attributes left over.

A span says what its model was asked and answered in one of several forms, depending on the
instrumentation and the version of the semantic conventions it follows: the structured
``gen_ai.input.messages`` / ``gen_ai.output.messages`` (parts, or role/content), the flattened
``gen_ai.prompt.N.*`` (OpenLLMetry), ``llm.input_messages.N.message.*`` (OpenInference), or span
events (``gen_ai.content.prompt``, ``gen_ai.user.message`` ... ``gen_ai.choice``,
``gen_ai.client.inference.operation.details``). :func:`input_messages` and
:func:`output_messages` read whichever is there, first found wins. :class:`Attrs` reads a span's
attributes by their names in the current and the deprecated conventions and remembers what it
read, so that :func:`leftover` keeps the rest.

Names here are the mapping's (:mod:`.otlp`) helpers, not a public API.

May import: the standard library, pydantic, the package's models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic

from ..models import ChatMessage, TrainingMark
from .otlp_decode import SpanView

STEP_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.system",
    "llm.vendor",
    "llm.provider",
    "llm.system",
    "gen_ai.request.model",
    "llm.request.model",
    "gen_ai.response.model",
    "llm.response.model",
    "llm.model_name",
    "gen_ai.response.id",
    "gen_ai.response.finish_reasons",
    "llm.response.finish_reason",
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.usage.prompt_tokens",
    "llm.token_count.prompt",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.usage.completion_tokens",
    "llm.token_count.completion",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "llm.request.type",
    "gen_ai.request.type",
    "openinference.span.kind",
)
STEP_PREFIXES = (
    "gen_ai.prompt.",
    "gen_ai.completion.",
    "llm.prompts.",
    "llm.completions.",
    "llm.input_messages.",
    "llm.output_messages.",
)
"""What a step span's mapping reads (a call of one step leaves them out of its attributes)."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def span_time(ns: int) -> datetime:
    """A span's Unix-nanosecond time as a UTC datetime."""
    return _EPOCH + timedelta(microseconds=ns // 1000)


# -- messages ---------------------------------------------------------------------------------


def input_messages(span: SpanView, attrs: Attrs) -> tuple[list[ChatMessage], list[str]]:
    system = attrs.get("gen_ai.system_instructions")
    prefix: list[ChatMessage] = []
    if system is not None:
        text = _parts_text(_json(system))
        if text:
            prefix.append(ChatMessage(role="system", content=text))
    structured = attrs.get("gen_ai.input.messages")
    if structured is not None:
        messages, calls, _ = _structured(_json(structured), "user")
        return prefix + messages, calls
    for flat in ("gen_ai.prompt.", "llm.prompts.", "llm.input_messages."):
        messages, calls, _ = _flattened(attrs, flat, "user")
        if messages:
            return prefix + messages, calls
    messages, calls = _from_events(span, output=False)
    return prefix + messages, calls


def output_messages(span: SpanView, attrs: Attrs) -> tuple[list[ChatMessage], list[str], list[str]]:
    structured = attrs.get("gen_ai.output.messages")
    if structured is not None:
        return _structured(_json(structured), "assistant")
    for flat in ("gen_ai.completion.", "llm.completions.", "llm.output_messages."):
        messages, calls, reasons = _flattened(attrs, flat, "assistant")
        if messages or calls:
            return messages, calls, reasons
    messages, calls = _from_events(span, output=True)
    return messages, calls, []


def _structured(data: Any, default_role: str) -> tuple[list[ChatMessage], list[str], list[str]]:
    """Messages in the GenAI JSON form: ``[{"role", "parts": [...]}]`` or ``[{"role",
    "content"}]`` (older instrumentations), or a bare string."""
    if isinstance(data, str):
        return [ChatMessage(role=default_role, content=data)], [], []
    if isinstance(data, dict):
        data = data.get("messages", [data])
    if not isinstance(data, list):
        return [], [], []
    messages, calls, reasons = [], [], []
    for item in data:
        if isinstance(item, str):
            messages.append(ChatMessage(role=default_role, content=item))
            continue
        if not isinstance(item, dict):
            continue
        nested = item.get("message")
        inner: dict[str, Any] = nested if isinstance(nested, dict) else item
        role = str(inner.get("role") or default_role)
        content = inner.get("parts", inner.get("content"))
        text = _parts_text(content)
        calls.extend(_tool_calls_of(content))
        calls.extend(_tool_calls_of(inner.get("tool_calls")))
        if role == "tool" and not text:
            text = _parts_text(inner.get("result"))
        name = inner.get("name")
        messages.append(
            ChatMessage(role=role, content=text, name=name if isinstance(name, str) else None)
        )
        reason = item.get("finish_reason")
        if isinstance(reason, str) and reason:
            reasons.append(reason)
    return messages, calls, reasons


def _parts_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, dict):
        content = [content]
    if not isinstance(content, list):
        return json.dumps(content, sort_keys=True)
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict):
            kind = part.get("type", "text")
            if kind == "text":
                texts.append(_parts_text(part.get("content", part.get("text"))))
            elif kind in ("tool_call_response", "tool_result"):
                texts.append(_parts_text(part.get("result", part.get("response"))))
            elif kind == "reasoning":
                continue
    return "\n".join(t for t in texts if t)


def _tool_calls_of(content: Any) -> list[str]:
    if not isinstance(content, list):
        return []
    out = []
    for part in content:
        if not isinstance(part, dict):
            continue
        nested = part.get("function")
        function: dict[str, Any] = nested if isinstance(nested, dict) else part
        if part.get("type", "tool_call") not in ("tool_call", "function") or not function.get(
            "name"
        ):
            continue
        call: dict[str, Any] = {"name": str(function["name"])}
        if part.get("id"):
            call["id"] = str(part["id"])
        arguments = function.get("arguments")
        if arguments is not None:
            call["arguments"] = arguments if isinstance(arguments, str) else json.dumps(arguments)
        out.append(json.dumps(call, sort_keys=True))
    return out


def _flattened(
    attrs: Attrs, prefix: str, default_role: str
) -> tuple[list[ChatMessage], list[str], list[str]]:
    """Messages flattened into indexed attributes: ``gen_ai.prompt.0.role`` /
    ``gen_ai.prompt.0.content`` (OpenLLMetry), ``llm.input_messages.0.message.role``
    (OpenInference), with tool calls under ``.tool_calls.N.``."""
    rows: dict[int, dict[str, Any]] = {}
    for key, value in attrs.with_prefix(prefix).items():
        head, _, rest = key.partition(".")
        if not head.isdigit():
            continue
        rest = rest.removeprefix("message.")
        rows.setdefault(int(head), {})[rest] = value
    messages, calls, reasons = [], [], []
    for index in sorted(rows):
        row = rows[index]
        role = str(row.get("role") or default_role)
        content = row.get("content")
        text = content if isinstance(content, str) else _parts_text(_json(content))
        messages.append(ChatMessage(role=role, content=text or "", name=_str(row.get("name"))))
        reason = row.get("finish_reason")
        if isinstance(reason, str) and reason:
            reasons.append(reason)
        tools: dict[int, dict[str, Any]] = {}
        for key, value in row.items():
            if key.startswith("tool_calls."):
                number, _, field_name = key[len("tool_calls.") :].partition(".")
                if number.isdigit():
                    field_name = field_name.removeprefix("tool_call.").removeprefix("function.")
                    tools.setdefault(int(number), {})[field_name] = value
        for n in sorted(tools):
            tool = tools[n]
            if tool.get("name"):
                call = {"name": str(tool["name"])}
                if tool.get("id"):
                    call["id"] = str(tool["id"])
                if tool.get("arguments") is not None:
                    call["arguments"] = str(tool["arguments"])
                calls.append(json.dumps(call, sort_keys=True))
    return messages, calls, reasons


_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def _from_events(span: SpanView, *, output: bool) -> tuple[list[ChatMessage], list[str]]:
    """Messages recorded as span events: ``gen_ai.content.prompt`` / ``.completion`` (with
    ``gen_ai.prompt`` / ``gen_ai.completion`` JSON), the per-message events
    (``gen_ai.user.message``, ``gen_ai.choice``...), or
    ``gen_ai.client.inference.operation.details``."""
    messages: list[ChatMessage] = []
    calls: list[str] = []
    for name, _, attrs in span.events:
        if name == "gen_ai.client.inference.operation.details":
            key = "gen_ai.output.messages" if output else "gen_ai.input.messages"
            if key in attrs:
                found, found_calls, _ = _structured(
                    _json(attrs[key]), "assistant" if output else "user"
                )
                messages.extend(found)
                calls.extend(found_calls)
        elif name == ("gen_ai.content.completion" if output else "gen_ai.content.prompt"):
            key = "gen_ai.completion" if output else "gen_ai.prompt"
            if key in attrs:
                found, found_calls, _ = _structured(
                    _json(attrs[key]), "assistant" if output else "user"
                )
                messages.extend(found)
                calls.extend(found_calls)
        elif output and name == "gen_ai.choice":
            body = _json(attrs.get("message", attrs.get("content", "")))
            if isinstance(body, dict):
                found, found_calls, _ = _structured([body], "assistant")
                messages.extend(found)
                calls.extend(found_calls)
            elif body:
                messages.append(ChatMessage(role="assistant", content=_parts_text(body)))
        elif not output and name in _EVENT_ROLES:
            content = _json(attrs.get("content", ""))
            messages.append(ChatMessage(role=_EVENT_ROLES[name], content=_parts_text(content)))
    return messages, calls


def assistant_text(messages: list[ChatMessage]) -> str | None:
    texts = [m.content for m in messages if m.role == "assistant" and m.content]
    return "\n".join(texts) if texts else None


def _json(value: Any) -> Any:
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


# -- marks and attributes ---------------------------------------------------------------------


def mark_of(span: SpanView, attrs: Attrs) -> TrainingMark | None:
    """A training mark from ``trajstream.mark.*``: ``labels`` (array or comma-separated),
    ``task_id``, ``run_id``, ``marked_at`` (ISO 8601 or Unix nanoseconds; default: the span's
    end) and ``metadata.<key>``."""
    found = attrs.with_prefix("trajstream.mark.")
    if not found:
        return None
    labels = found.get("labels", [])
    if isinstance(labels, str):
        labels = [s.strip() for s in labels.split(",") if s.strip()]
    marked_at = found.get("marked_at")
    if isinstance(marked_at, int):
        when = span_time(marked_at)
    elif isinstance(marked_at, str) and marked_at:
        when = datetime.fromisoformat(marked_at.replace("Z", "+00:00"))
    else:
        when = span_time(span.end_ns)
    run_id = found.get("run_id")
    return TrainingMark(
        labels=[str(x) for x in labels] if isinstance(labels, list) else [],
        metadata={
            k.removeprefix("metadata."): _text(v)
            for k, v in found.items()
            if k.startswith("metadata.")
        },
        task_id=_str(found.get("task_id")),
        run_id=int(run_id) if run_id is not None and str(run_id).isdigit() else None,
        marked_at=when,
    )


def leftover(span: SpanView, attrs: Attrs) -> dict[str, str]:
    """The span's attributes trajstream has no field for, and where the span came from."""
    out = {k: _text(v) for k, v in span.attributes.items() if k not in attrs.consumed}
    out = {k: v for k, v in out.items() if not k.startswith(("trajstream.mark.",))}
    out.pop("trajstream.call_id", None)
    service = span.resource.get("service.name")
    if isinstance(service, str) and service:
        out.setdefault("service.name", service)
    out["otel.trace_id"] = span.trace_id
    out["otel.span_id"] = span.span_id
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def first(attrs: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = attrs.get(name)
        if value is not None and value != "":
            return value
    return None


def short(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"invalid {where}: {err['msg']}"
    return str(exc)[:200]


class Attrs:
    """A span's attributes, remembering which ones were read (the rest are kept as-is)."""

    def __init__(self, attrs: Mapping[str, Any]):
        self._attrs = attrs
        self.consumed: set[str] = set()

    def consume(self, *names: str) -> None:
        self.consumed.update(names)

    def consume_prefix(self, *prefixes: str) -> None:
        self.consumed.update(k for k in self._attrs if k.startswith(prefixes))

    def get(self, *names: str) -> Any:
        self.consumed.update(names)
        return first(self._attrs, *names)

    def text(self, *names: str) -> str | None:
        value = self.get(*names)
        if value is None:
            return None
        return value if isinstance(value, str) else json.dumps(value, sort_keys=True)

    def integer(self, *names: str) -> int | None:
        value = self.get(*names)
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return int(value)
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
        raise ValueError(f"{names[0]} must be an integer, got {value!r}")

    def with_prefix(self, prefix: str) -> dict[str, Any]:
        found = {k[len(prefix) :]: v for k, v in self._attrs.items() if k.startswith(prefix)}
        self.consumed.update(prefix + k for k in found)
        return found
