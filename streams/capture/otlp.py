"""OTLP GenAI spans in, agent events out: the pure mapping behind ``POST /v1/traces``.

An agent instrumented with OpenTelemetry already describes its calls as spans: an
``invoke_agent`` span around the call, ``chat`` (``text_completion``, ``generate_content``)
spans for the model calls, ``execute_tool`` spans for the tools. This module decodes an OTLP
``ExportTraceServiceRequest`` (protobuf, or OTLP JSON) and maps its spans to the records the
SDK publishes (:class:`~streams.models.AgentCall` START/END and
:class:`~streams.models.Completion` steps, keyed by ``call_id``). It holds no state between
exports, so any number of ingest processes may receive the spans of one trace:

- every ``event_id`` is derived from the span's trace and span id, so a span exported twice
  (an exporter's retry) gives the same records and the workers drop the second copy;
- a step's ``seq`` is derived from the span's start time (milliseconds, modulo 2**27, times
  16, plus 4 bits of the span id as a tie-break), so steps exported in different requests,
  in any order, take their place in the call without anyone counting them. The workers read
  ``seq`` as a wrapping counter (:func:`streams.core.assembly.step_order`);
- the agent span ends, and is exported, after its children; its END says no ``step_count``
  (the workers close the call at its END with the steps that arrived before it).

A span is mapped by ``gen_ai.operation.name`` or, for instrumentations that predate it, by the
attributes they emit (``llm.request.type``, ``traceloop.span.kind``, ``openinference.span.kind``,
``gen_ai.system`` with a model). Spans without GenAI attributes are ignored and counted; a
GenAI span that cannot be mapped (bad ids, invalid values) is rejected and named, for the
response's ``partial_success``.

Why one module of ~950 lines: decoding (protobuf and OTLP JSON), the attribute vocabularies of
the current and the deprecated conventions, and the span-to-record mapping are read together
when a span maps wrongly; each part is a set of small pure functions tested on its own.

May import: the standard library, protobuf and ``opentelemetry-proto``, pydantic, and the
package's models and join rules. No HTTP server, no Kafka.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pydantic
from google.protobuf import json_format
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from ..core.assembly import SEQ_SPACE
from ..errors import DecodeError
from ..models import (
    AgentCall,
    CallPhase,
    CallStatus,
    ChatMessage,
    Completion,
    StepKind,
    TrainingMark,
)

__all__ = [
    "AGENT_OPERATIONS",
    "LLM_OPERATIONS",
    "TOOL_OPERATIONS",
    "Mapped",
    "MissingParent",
    "OtlpDecodeError",
    "SpanView",
    "decode_json",
    "decode_protobuf",
    "encode_response",
    "map_request",
    "map_spans",
    "seq_of",
    "spans_of",
]

AGENT_OPERATIONS = frozenset({"invoke_agent"})
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATIONS = frozenset({"execute_tool"})

MissingParent = Literal["agent", "own"]
"""What a step span whose parent is not in the same export belongs to: ``agent`` (the call of
that parent, taken to be the agent span that ends later) or ``own`` (a call of one step)."""

_TIE_BITS = 4
_TIME_SPACE = SEQ_SPACE >> _TIE_BITS  # 2**27 ms: a wrap every 37 hours
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class OtlpDecodeError(DecodeError):
    """The body is not an OTLP ExportTraceServiceRequest (answered with 400)."""


# -- decoding ---------------------------------------------------------------------------------


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """An ``application/x-protobuf`` body."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (ProtobufDecodeError, ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"not a protobuf ExportTraceServiceRequest: {exc}") from exc
    return request


def decode_json(body: bytes) -> ExportTraceServiceRequest:
    """An ``application/json`` body in the OTLP JSON encoding.

    OTLP JSON is protobuf's JSON mapping (lowerCamelCase keys, enums as integers, 64-bit
    integers as strings or numbers) except that trace and span ids are hex strings, not
    base64; unknown fields are ignored, as the specification asks of receivers.
    """
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise OtlpDecodeError("not an OTLP JSON object (an ExportTraceServiceRequest)")
    try:
        for resource_spans in _items(data, "resourceSpans", "resource_spans"):
            for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
                for span in _items(scope_spans, "spans"):
                    _hex_ids_to_base64(span)
                    for link in _items(span, "links"):
                        _hex_ids_to_base64(link)
        request = ExportTraceServiceRequest()
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except (json_format.ParseError, TypeError, ValueError, AttributeError) as exc:
        raise OtlpDecodeError(f"not an OTLP JSON ExportTraceServiceRequest: {exc}") from exc
    return request


def _items(obj: Any, *keys: str) -> list[Any]:
    if not isinstance(obj, dict):
        raise OtlpDecodeError(f"expected an object holding {keys[0]!r}, got {type(obj).__name__}")
    for key in keys:
        value = obj.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise OtlpDecodeError(f"{key!r} must be an array")
        return value
    return []


def _hex_ids_to_base64(obj: Any) -> None:
    if not isinstance(obj, dict):
        raise OtlpDecodeError("a span or link must be an object")
    for camel, snake in (
        ("traceId", "trace_id"),
        ("spanId", "span_id"),
        ("parentSpanId", "parent_span_id"),
    ):
        for key in (camel, snake):
            value = obj.get(key)
            if isinstance(value, str):
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raise OtlpDecodeError(f"{key} {value!r} is not a hex string") from None
                obj[key] = base64.b64encode(raw).decode()


def encode_response(rejected: int, message: str, *, as_json: bool) -> bytes:
    """An ExportTraceServiceResponse, with ``partial_success`` when spans were rejected."""
    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message
    if as_json:
        return str(json_format.MessageToJson(response, indent=None)).encode()
    return bytes(response.SerializeToString())


# -- a span, as plain values ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanView:
    """One span with its ids in hex and its attributes as Python values."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    status: int = Status.STATUS_CODE_UNSET
    status_message: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[tuple[str, int, Mapping[str, Any]], ...] = ()
    resource: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return self.trace_id, self.span_id

    @property
    def ref(self) -> str:
        """How a rejection names the span."""
        return f"span {self.span_id or '?'} of trace {self.trace_id or '?'} ({self.name!r})"


def spans_of(request: ExportTraceServiceRequest) -> Iterator[SpanView]:
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield _view(span, resource)


def _view(span: PbSpan, resource: Mapping[str, Any]) -> SpanView:
    return SpanView(
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        name=span.name,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        status=span.status.code,
        status_message=span.status.message,
        attributes=_attributes(span.attributes),
        events=tuple((e.name, e.time_unix_nano, _attributes(e.attributes)) for e in span.events),
        resource=resource,
    )


def _attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return getattr(value, kind)


# -- the mapping ------------------------------------------------------------------------------


@dataclass
class Mapped:
    """What one export became: records to publish, and what was left out and why."""

    records: list[AgentCall | Completion] = field(default_factory=list)
    spans: int = 0
    ignored: int = 0
    """Spans without GenAI attributes (or GenAI operations trajstream does not map)."""
    rejected: list[str] = field(default_factory=list)
    """GenAI spans that could not be mapped, each named with the reason."""
    calls: set[str] = field(default_factory=set)

    def error_message(self, limit: int = 5) -> str:
        if not self.rejected:
            return ""
        shown = "; ".join(self.rejected[:limit])
        more = len(self.rejected) - limit
        return shown + (f"; and {more} more" if more > 0 else "")


def map_request(
    request: ExportTraceServiceRequest, *, missing_parent: MissingParent = "agent"
) -> Mapped:
    """Map every span of one export request."""
    return map_spans(spans_of(request), missing_parent=missing_parent)


def map_spans(spans: Iterable[SpanView], *, missing_parent: MissingParent = "agent") -> Mapped:
    """Map the spans of one export.

    The call a step belongs to is, in this order: the span's ``trajstream.call_id``
    attribute; the nearest ancestor in this export that is an agent span (its call id) or
    carries ``trajstream.call_id``; when the chain of parents leaves this export, the call of
    the first parent not in it (``missing_parent="agent"``: taken to be the agent span, which
    ends and is exported later); when the chain reaches a root, a call of its own (a chat
    span outside any agent span; a tool span there is ignored).
    """
    out = Mapped()
    unique: dict[tuple[str, str], SpanView] = {}
    for span in spans:
        out.spans += 1
        unique.setdefault(span.key, span)  # a span twice in one export counts once
    steps: dict[str, list[tuple[SpanView, StepKind, str]]] = {}
    heads: dict[str, list[AgentCall]] = {}
    for span in unique.values():
        op = operation_of(span.attributes)
        if op is None:
            out.ignored += 1
            continue
        problem = _check_ids(span)
        if problem:
            out.rejected.append(f"{span.ref}: {problem}")
            continue
        try:
            if op in AGENT_OPERATIONS:
                call_id = _own_call_id(span)
                heads.setdefault(call_id, []).extend(_agent_events(span, call_id, op))
                continue
            kind = StepKind.LLM if op in LLM_OPERATIONS else StepKind.TOOL
            call_id, own = _step_call(span, unique, missing_parent)
            if own:
                if kind is StepKind.TOOL:
                    out.ignored += 1  # a tool outside any agent call trains nothing
                    continue
                step = _step(span, call_id, kind, op, seq_of(span))
                heads.setdefault(call_id, []).extend(_single_call_events(span, call_id, step))
            steps.setdefault(call_id, []).append((span, kind, op))
        except (pydantic.ValidationError, ValueError, TypeError) as exc:
            out.rejected.append(f"{span.ref}: {_short(exc)}")
    for call_id in sorted(set(heads) | set(steps)):
        events = heads.get(call_id, [])
        starts = [e for e in events if e.phase is CallPhase.START]
        ends = [e for e in events if e.phase is CallPhase.END]
        out.records.extend(starts)
        for step in _sequenced(call_id, steps.get(call_id, []), out):
            out.records.append(step)
        out.records.extend(ends)
        out.calls.add(call_id)
    return out


def operation_of(attrs: Mapping[str, Any]) -> str | None:
    """The GenAI operation a span records, or None for a span trajstream does not map."""
    op = attrs.get("gen_ai.operation.name")
    if isinstance(op, str) and op:
        return op if op in AGENT_OPERATIONS | LLM_OPERATIONS | TOOL_OPERATIONS else None
    traceloop = attrs.get("traceloop.span.kind")
    if traceloop == "agent":
        return "invoke_agent"
    if traceloop == "tool":
        return "execute_tool"
    request_type = attrs.get("llm.request.type") or attrs.get("gen_ai.request.type")
    if request_type == "chat":
        return "chat"
    if request_type == "completion":
        return "text_completion"
    openinference = attrs.get("openinference.span.kind")
    if openinference == "LLM":
        return "chat"
    if openinference == "TOOL":
        return "execute_tool"
    if openinference == "AGENT":
        return "invoke_agent"
    if _first(attrs, "gen_ai.system", "gen_ai.provider.name") and _first(
        attrs, "gen_ai.request.model", "gen_ai.response.model", "gen_ai.response.id"
    ):
        return "chat"  # an LLM span of an instrumentation that predates operation.name
    return None


def seq_of(span: SpanView) -> int:
    """The step's seq: its start time in ms (wrapping) times 16, plus 4 bits of its span id."""
    millis = (span.start_ns // 1_000_000) % _TIME_SPACE
    tie = int(span.span_id[-1], 16) if span.span_id else 0
    return (millis << _TIE_BITS) | tie


def _sequenced(
    call_id: str, spans: list[tuple[SpanView, StepKind, str]], out: Mapped
) -> list[Completion]:
    """The call's steps in this export, by start time; two that got one seq are moved apart."""
    spans.sort(key=lambda t: (t[0].start_ns, t[0].span_id))
    steps: list[Completion] = []
    previous: int | None = None
    for span, kind, op in spans:
        seq = seq_of(span)
        if previous is not None and not 0 < (seq - previous) % SEQ_SPACE < SEQ_SPACE // 2:
            seq = (previous + 1) % SEQ_SPACE  # same millisecond, tie bits out of time order
        try:
            steps.append(_step(span, call_id, kind, op, seq))
        except (pydantic.ValidationError, ValueError, TypeError) as exc:
            out.rejected.append(f"{span.ref}: {_short(exc)}")
            continue
        previous = seq
    return steps


def _check_ids(span: SpanView) -> str | None:
    if len(span.trace_id) != 32 or span.trace_id == "0" * 32:
        return "trace id must be 16 bytes, not all zero"
    if len(span.span_id) != 16 or span.span_id == "0" * 16:
        return "span id must be 8 bytes, not all zero"
    if span.parent_id and len(span.parent_id) != 16:
        return "parent span id must be 8 bytes or empty"
    if span.start_ns <= 0:
        return "no start time"
    if span.end_ns < span.start_ns:
        return "ends before it starts"
    return None


def _own_call_id(span: SpanView) -> str:
    explicit = span.attributes.get("trajstream.call_id")
    if isinstance(explicit, str) and explicit:
        return explicit
    return f"{span.trace_id}-{span.span_id}"


def _step_call(
    span: SpanView, spans: Mapping[tuple[str, str], SpanView], missing_parent: MissingParent
) -> tuple[str, bool]:
    """The step's call id, and whether the step is a call of its own."""
    explicit = span.attributes.get("trajstream.call_id")
    if isinstance(explicit, str) and explicit:
        return explicit, False
    current, seen = span, {span.span_id}
    while current.parent_id:
        parent = spans.get((span.trace_id, current.parent_id))
        if parent is None:
            if missing_parent == "own":
                break
            return f"{span.trace_id}-{current.parent_id}", False
        if parent.span_id in seen:  # a cycle: ids are not to be trusted
            break
        seen.add(parent.span_id)
        pid = parent.attributes.get("trajstream.call_id")
        if isinstance(pid, str) and pid:
            return pid, False
        if operation_of(parent.attributes) in AGENT_OPERATIONS:
            return _own_call_id(parent), False
        current = parent
    return f"{span.trace_id}-{span.span_id}", True


# -- records ----------------------------------------------------------------------------------


def _time(ns: int) -> datetime:
    return _EPOCH + timedelta(microseconds=ns // 1000)


def _status(span: SpanView, attrs: _Attrs) -> tuple[CallStatus, str | None]:
    error_type = attrs.text("error.type")
    if span.status == Status.STATUS_CODE_ERROR or error_type:
        error = error_type or span.status_message or "error"
        if "cancel" in error.lower():
            return CallStatus.CANCELLED, None
        return CallStatus.ERROR, error[:200]
    return CallStatus.OK, None


def _agent_events(span: SpanView, call_id: str, op: str) -> list[AgentCall]:
    attrs = _Attrs(span.attributes)
    common: dict[str, Any] = {
        "call_id": call_id,
        "operation_name": op,
        "agent_id": attrs.text("gen_ai.agent.id", "agent.id"),
        "agent_name": attrs.text("gen_ai.agent.name", "agent.name", "traceloop.entity.name"),
        "agent_version": attrs.text("gen_ai.agent.version", "agent.version"),
        "conversation_id": attrs.text(
            "gen_ai.conversation.id", "session.id", "traceloop.association.properties.session_id"
        ),
        "mark": _mark(span, attrs),
    }
    inputs, _ = _input_messages(span, attrs)
    outputs, _, _ = _output_messages(span, attrs)
    status, error = _status(span, attrs)
    output = _assistant_text(outputs) or attrs.text("traceloop.entity.output", "output.value")
    attrs.consume("gen_ai.operation.name", "traceloop.span.kind", "openinference.span.kind")
    attrs.consume("traceloop.entity.input", "input.value")
    extra = _leftover(span, attrs)
    start = AgentCall(
        event_id=f"otlp:{span.trace_id}:{span.span_id}:start",
        phase=CallPhase.START,
        event_time=_time(span.start_ns),
        input_messages=inputs,
        attributes=extra,
        **common,
    )
    end = AgentCall(
        event_id=f"otlp:{span.trace_id}:{span.span_id}:end",
        phase=CallPhase.END,
        event_time=_time(span.end_ns),
        output=output,
        status=status,
        error_type=error,
        step_count=None,  # unknown here: children may have been exported before
        **common,
    )
    return [start, end]


def _single_call_events(span: SpanView, call_id: str, step: Completion) -> list[AgentCall]:
    """START and END of a call of one chat step (a chat span outside any agent span)."""
    attrs = _Attrs(span.attributes)
    for name in _STEP_KEYS:
        attrs.consume(name)
    attrs.consume_prefix(*_STEP_PREFIXES)
    common: dict[str, Any] = {
        "call_id": call_id,
        "agent_id": attrs.text("gen_ai.agent.id"),
        "agent_name": attrs.text("gen_ai.agent.name"),
        "agent_version": attrs.text("gen_ai.agent.version"),
        "conversation_id": attrs.text("gen_ai.conversation.id", "session.id"),
        "mark": _mark(span, attrs),
    }
    status, error = _status(span, attrs)
    return [
        AgentCall(
            event_id=f"otlp:{span.trace_id}:{span.span_id}:start",
            phase=CallPhase.START,
            event_time=_time(span.start_ns),
            input_messages=step.input_messages,
            attributes=_leftover(span, attrs),
            **common,
        ),
        AgentCall(
            event_id=f"otlp:{span.trace_id}:{span.span_id}:end",
            phase=CallPhase.END,
            event_time=_time(span.end_ns),
            output=_assistant_text(step.output_messages) or None,
            status=status,
            error_type=error,
            step_count=1,
            **common,
        ),
    ]


_STEP_KEYS = (
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
_STEP_PREFIXES = (
    "gen_ai.prompt.",
    "gen_ai.completion.",
    "llm.prompts.",
    "llm.completions.",
    "llm.input_messages.",
    "llm.output_messages.",
)


def _step(span: SpanView, call_id: str, kind: StepKind, op: str, seq: int) -> Completion:
    attrs = _Attrs(span.attributes)
    common: dict[str, Any] = {
        "event_id": f"otlp:{span.trace_id}:{span.span_id}:step",
        "call_id": call_id,
        "seq": seq,
        "event_time": _time(span.end_ns),
        "kind": kind,
        "operation_name": op,
        "latency_ms": (span.end_ns - span.start_ns) / 1e6,
    }
    if kind is StepKind.TOOL:
        name = attrs.text("gen_ai.tool.name", "tool.name", "traceloop.entity.name") or span.name
        arguments = attrs.text(
            "gen_ai.tool.call.arguments", "tool.parameters", "traceloop.entity.input", "input.value"
        )
        result = attrs.text("gen_ai.tool.call.result", "traceloop.entity.output", "output.value")
        call = {"name": name}
        tool_call_id = attrs.text("gen_ai.tool.call.id", "tool_call.id")
        if tool_call_id:
            call["id"] = tool_call_id
        if arguments is not None:
            call["arguments"] = arguments
        return Completion(
            tool_name=name,
            tool_calls=[json.dumps(call, sort_keys=True)],
            output_messages=[ChatMessage(role="tool", content=result or "", name=name)],
            **common,
        )
    inputs, _ = _input_messages(span, attrs)
    outputs, tool_calls, reasons = _output_messages(span, attrs)
    finish = attrs.get("gen_ai.response.finish_reasons", "llm.response.finish_reason")
    if isinstance(finish, str):
        finish = [finish]
    return Completion(
        provider_name=attrs.text(
            "gen_ai.provider.name", "gen_ai.system", "llm.vendor", "llm.provider", "llm.system"
        ),
        request_model=attrs.text("gen_ai.request.model", "llm.request.model", "llm.model_name"),
        response_model=attrs.text("gen_ai.response.model", "llm.response.model", "llm.model_name"),
        response_id=attrs.text("gen_ai.response.id"),
        finish_reasons=[str(r) for r in finish] if isinstance(finish, list) else reasons,
        input_tokens=attrs.integer(
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.prompt_tokens",
            "llm.usage.prompt_tokens",
            "llm.token_count.prompt",
        ),
        output_tokens=attrs.integer(
            "gen_ai.usage.output_tokens",
            "gen_ai.usage.completion_tokens",
            "llm.usage.completion_tokens",
            "llm.token_count.completion",
        ),
        input_messages=inputs,
        output_messages=outputs,
        tool_calls=tool_calls,
        **common,
    )


# -- messages ---------------------------------------------------------------------------------


def _input_messages(span: SpanView, attrs: _Attrs) -> tuple[list[ChatMessage], list[str]]:
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


def _output_messages(
    span: SpanView, attrs: _Attrs
) -> tuple[list[ChatMessage], list[str], list[str]]:
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
    attrs: _Attrs, prefix: str, default_role: str
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


def _assistant_text(messages: list[ChatMessage]) -> str | None:
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


def _mark(span: SpanView, attrs: _Attrs) -> TrainingMark | None:
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
        when = _time(marked_at)
    elif isinstance(marked_at, str) and marked_at:
        when = datetime.fromisoformat(marked_at.replace("Z", "+00:00"))
    else:
        when = _time(span.end_ns)
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


def _leftover(span: SpanView, attrs: _Attrs) -> dict[str, str]:
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


def _first(attrs: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        value = attrs.get(name)
        if value is not None and value != "":
            return value
    return None


def _short(exc: Exception) -> str:
    if isinstance(exc, pydantic.ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"invalid {where}: {err['msg']}"
    return str(exc)[:200]


class _Attrs:
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
        return _first(self._attrs, *names)

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
