"""Builders of OTLP export requests for the tests: spans as keyword arguments, ids as hex."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

T0_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z
TRACE = "0af7651916cd43dd8448eb211c80319c"


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, str):
        return AnyValue(string_value=value)
    if isinstance(value, list | tuple):
        out = AnyValue()
        out.array_value.values.extend(any_value(v) for v in value)
        return out
    if isinstance(value, dict):
        out = AnyValue()
        out.kvlist_value.values.extend(
            KeyValue(key=k, value=any_value(v)) for k, v in value.items()
        )
        return out
    raise TypeError(value)


def kvs(attrs: dict[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attrs.items()]


def span(
    span_id: str,
    *,
    parent: str = "",
    trace: str = TRACE,
    name: str = "span",
    start_ms: float = 0,
    end_ms: float | None = None,
    attrs: dict[str, Any] | None = None,
    error: str | None = None,
    events: list[tuple[str, dict[str, Any]]] = (),  # type: ignore[assignment]
) -> Span:
    start = T0_NS + int(start_ms * 1_000_000)
    end = T0_NS + int((end_ms if end_ms is not None else start_ms + 10) * 1_000_000)
    out = Span(
        trace_id=bytes.fromhex(trace),
        span_id=bytes.fromhex(span_id),
        parent_span_id=bytes.fromhex(parent),
        name=name,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=kvs(attrs or {}),
    )
    if error is not None:
        out.status.code = Status.STATUS_CODE_ERROR
        out.status.message = error
    else:
        out.status.code = Status.STATUS_CODE_OK
    for event_name, event_attrs in events:
        e = out.events.add()
        e.name = event_name
        e.time_unix_nano = start
        e.attributes.extend(kvs(event_attrs))
    return out


def export(*spans: Span, service: str = "support-agent") -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(kvs({"service.name": service}))
    ss = rs.scope_spans.add()
    ss.scope.name = "tests"
    ss.spans.extend(spans)
    return request


def messages(*pairs: tuple[str, str]) -> str:
    """``gen_ai.input.messages`` / ``gen_ai.output.messages`` JSON, parts form."""
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": c}]} for r, c in pairs])


AGENT = "00f067aa0ba902b7"
CHAT1 = "1111111111111111"
TOOL = "2222222222222222"
CHAT2 = "3333333333333333"


def agent_call_spans(trace: str = TRACE) -> dict[str, Span]:
    """An agent call: chat (asks for a tool), the tool, chat (answers); by span id."""
    return {
        AGENT: span(
            AGENT,
            trace=trace,
            name="invoke_agent support",
            start_ms=0,
            end_ms=900,
            attrs={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": "support",
                "gen_ai.agent.id": "agent-7",
                "gen_ai.agent.version": "3",
                "gen_ai.conversation.id": "conv-1",
                "gen_ai.input.messages": messages(("user", "Where is my order?")),
                "gen_ai.output.messages": messages(("assistant", "It shipped.")),
                "app.tenant": "acme",
                "trajstream.mark.labels": ["gold", "reviewed"],
                "trajstream.mark.task_id": "task-9",
            },
        ),
        CHAT1: span(
            CHAT1,
            trace=trace,
            parent=AGENT,
            name="chat gpt-4o",
            start_ms=10,
            end_ms=300,
            attrs={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.response.model": "gpt-4o-2024-08-06",
                "gen_ai.response.id": "chatcmpl-1",
                "gen_ai.response.finish_reasons": ["tool_calls"],
                "gen_ai.usage.input_tokens": 20,
                "gen_ai.usage.output_tokens": 5,
                "gen_ai.input.messages": messages(("user", "Where is my order?")),
                "gen_ai.output.messages": json.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [
                                {
                                    "type": "tool_call",
                                    "id": "call_1",
                                    "name": "lookup_order",
                                    "arguments": {"order": 42},
                                }
                            ],
                            "finish_reason": "tool_call",
                        }
                    ]
                ),
            },
        ),
        TOOL: span(
            TOOL,
            trace=trace,
            parent=AGENT,
            name="execute_tool lookup_order",
            start_ms=310,
            end_ms=400,
            attrs={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "lookup_order",
                "gen_ai.tool.call.id": "call_1",
                "gen_ai.tool.call.arguments": '{"order": 42}',
                "gen_ai.tool.call.result": "shipped",
            },
        ),
        CHAT2: span(
            CHAT2,
            trace=trace,
            parent=AGENT,
            name="chat gpt-4o",
            start_ms=410,
            end_ms=880,
            attrs={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": "gpt-4o",
                "gen_ai.response.id": "chatcmpl-2",
                "gen_ai.response.finish_reasons": ["stop"],
                "gen_ai.output.messages": messages(("assistant", "It shipped.")),
            },
        ),
    }
