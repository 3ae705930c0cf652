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

The module reads in the order a span is handled: the operation a span records
(:func:`operation_of`), the call it belongs to, its records. Decoding the request is
:mod:`.otlp_decode`; reading messages, marks and the other attributes is :mod:`.otlp_vocab`.

May import: the standard library, protobuf and ``opentelemetry-proto``, pydantic, and the
package's models and join rules. No HTTP server, no Kafka.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pydantic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from ..core.assembly import SEQ_SPACE
from ..models import (
    AgentCall,
    CallPhase,
    CallStatus,
    ChatMessage,
    Completion,
    StepKind,
    TraceFragment,
)
from .otlp_decode import (
    OtlpDecodeError,
    SpanView,
    decode_json,
    decode_protobuf,
    encode_response,
    spans_of,
)
from .otlp_vocab import (
    STEP_KEYS,
    STEP_PREFIXES,
    Attrs,
    assistant_text,
    first,
    input_messages,
    leftover,
    mark_of,
    output_messages,
    short,
    span_time,
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
    "operation_of",
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
    fragments: list[TraceFragment] = field(default_factory=list)
    """With ``otlp.resolve = trace`` (:func:`.otlp_trace.fragment_request`): the export's
    spans per trace, for the span-resolution stage, instead of ``records``."""

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
        problem = check_ids(span)
        if problem:
            out.rejected.append(f"{span.ref}: {problem}")
            continue
        try:
            if op in AGENT_OPERATIONS:
                call_id = own_call_id(span)
                heads.setdefault(call_id, []).extend(agent_events(span, call_id, op))
                continue
            kind = StepKind.LLM if op in LLM_OPERATIONS else StepKind.TOOL
            call_id, own = _step_call(span, unique, missing_parent)
            if own:
                if kind is StepKind.TOOL:
                    out.ignored += 1  # a tool outside any agent call trains nothing
                    continue
                step = step_of(span, call_id, kind, op, seq_of(span))
                heads.setdefault(call_id, []).extend(single_call_events(span, call_id, step))
            steps.setdefault(call_id, []).append((span, kind, op))
        except (pydantic.ValidationError, ValueError, TypeError) as exc:
            out.rejected.append(f"{span.ref}: {short(exc)}")
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
    if first(attrs, "gen_ai.system", "gen_ai.provider.name") and first(
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
            steps.append(step_of(span, call_id, kind, op, seq))
        except (pydantic.ValidationError, ValueError, TypeError) as exc:
            out.rejected.append(f"{span.ref}: {short(exc)}")
            continue
        previous = seq
    return steps


def check_ids(span: SpanView) -> str | None:
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


def own_call_id(span: SpanView) -> str:
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
            return own_call_id(parent), False
        current = parent
    return f"{span.trace_id}-{span.span_id}", True


# -- records ----------------------------------------------------------------------------------


def _status(span: SpanView, attrs: Attrs) -> tuple[CallStatus, str | None]:
    error_type = attrs.text("error.type")
    if span.status == Status.STATUS_CODE_ERROR or error_type:
        error = error_type or span.status_message or "error"
        if "cancel" in error.lower():
            return CallStatus.CANCELLED, None
        return CallStatus.ERROR, error[:200]
    return CallStatus.OK, None


def agent_events(span: SpanView, call_id: str, op: str) -> list[AgentCall]:
    attrs = Attrs(span.attributes)
    common: dict[str, Any] = {
        "call_id": call_id,
        "operation_name": op,
        "agent_id": attrs.text("gen_ai.agent.id", "agent.id"),
        "agent_name": attrs.text("gen_ai.agent.name", "agent.name", "traceloop.entity.name"),
        "agent_version": attrs.text("gen_ai.agent.version", "agent.version"),
        "conversation_id": attrs.text(
            "gen_ai.conversation.id", "session.id", "traceloop.association.properties.session_id"
        ),
        "mark": mark_of(span, attrs),
    }
    inputs, _ = input_messages(span, attrs)
    outputs, _, _ = output_messages(span, attrs)
    status, error = _status(span, attrs)
    output = assistant_text(outputs) or attrs.text("traceloop.entity.output", "output.value")
    attrs.consume("gen_ai.operation.name", "traceloop.span.kind", "openinference.span.kind")
    attrs.consume("traceloop.entity.input", "input.value")
    extra = leftover(span, attrs)
    start = AgentCall(
        event_id=f"otlp:{span.trace_id}:{span.span_id}:start",
        phase=CallPhase.START,
        event_time=span_time(span.start_ns),
        input_messages=inputs,
        attributes=extra,
        **common,
    )
    end = AgentCall(
        event_id=f"otlp:{span.trace_id}:{span.span_id}:end",
        phase=CallPhase.END,
        event_time=span_time(span.end_ns),
        output=output,
        status=status,
        error_type=error,
        step_count=None,  # unknown here: children may have been exported before
        **common,
    )
    return [start, end]


def single_call_events(span: SpanView, call_id: str, step: Completion) -> list[AgentCall]:
    """START and END of a call of one chat step (a chat span outside any agent span)."""
    attrs = Attrs(span.attributes)
    for name in STEP_KEYS:
        attrs.consume(name)
    attrs.consume_prefix(*STEP_PREFIXES)
    common: dict[str, Any] = {
        "call_id": call_id,
        "agent_id": attrs.text("gen_ai.agent.id"),
        "agent_name": attrs.text("gen_ai.agent.name"),
        "agent_version": attrs.text("gen_ai.agent.version"),
        "conversation_id": attrs.text("gen_ai.conversation.id", "session.id"),
        "mark": mark_of(span, attrs),
    }
    status, error = _status(span, attrs)
    return [
        AgentCall(
            event_id=f"otlp:{span.trace_id}:{span.span_id}:start",
            phase=CallPhase.START,
            event_time=span_time(span.start_ns),
            input_messages=step.input_messages,
            attributes=leftover(span, attrs),
            **common,
        ),
        AgentCall(
            event_id=f"otlp:{span.trace_id}:{span.span_id}:end",
            phase=CallPhase.END,
            event_time=span_time(span.end_ns),
            output=assistant_text(step.output_messages) or None,
            status=status,
            error_type=error,
            step_count=1,
            **common,
        ),
    ]


def step_of(span: SpanView, call_id: str, kind: StepKind, op: str, seq: int) -> Completion:
    attrs = Attrs(span.attributes)
    common: dict[str, Any] = {
        "event_id": f"otlp:{span.trace_id}:{span.span_id}:step",
        "call_id": call_id,
        "seq": seq,
        "event_time": span_time(span.end_ns),
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
    inputs, _ = input_messages(span, attrs)
    outputs, tool_calls, reasons = output_messages(span, attrs)
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
