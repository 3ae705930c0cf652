"""OTLP spans in, trace fragments out: the ingest's side of span resolution (``otlp.resolve =
trace``).

With ``otlp.resolve = export`` (:func:`.otlp.map_request`) the ingest finds a step's call among
the ancestors in the step's own export, and guesses when the chain leaves the export. With
``trace``, it does not guess: every span of an export is published, grouped by trace, as a
:class:`~streams.models.TraceFragment` keyed by trace id on ``<p>.spans``, and the
span-resolution stage (:mod:`streams.core.spans`) joins the fragments of a trace and emits each
call's records. A fragment holds, per span:

- its ``span_id``, ``parent_id`` and role: ``agent``, ``llm``, ``tool``, or ``plain`` for a span
  without GenAI attributes (a workflow, chain, task or HTTP span: only its link is used, so that
  the steps below it find their agent span);
- ``call_id``: an agent span's call, or the ``trajstream.call_id`` attribute of any span;
- the records it maps to, exactly as in the export mode: an agent span's START and END; a step
  span's Completion (its ``call_id`` that of the call of one step it would be), and for an LLM
  span the START and END of that call of one step (the START's input messages left empty:
  they are the step's).

A GenAI span that cannot be mapped is rejected (named in ``partial_success``) and published as
a plain link, so that the tree stays connected. Fragments are cut to about ``max_bytes`` (the
JSON size of their spans, above their Avro size), so that each is one Kafka record.

May import: what :mod:`.otlp` imports.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import pydantic
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..models import StepKind, TraceFragment, TraceSpan
from .otlp import (
    AGENT_OPERATIONS,
    LLM_OPERATIONS,
    Mapped,
    agent_events,
    check_ids,
    operation_of,
    own_call_id,
    seq_of,
    single_call_events,
    step_of,
)
from .otlp_decode import SpanView, spans_of
from .otlp_vocab import short

__all__ = ["MAX_FRAGMENT_BYTES", "fragment_request", "fragment_spans", "trace_span"]

MAX_FRAGMENT_BYTES = 512 * 1024
"""About the largest fragment (well under ``kafka.max_record_bytes``' default of 1 MB)."""


def fragment_request(
    request: ExportTraceServiceRequest,
    received_at: datetime,
    *,
    max_bytes: int = MAX_FRAGMENT_BYTES,
) -> Mapped:
    """The fragments of one export request (in ``Mapped.fragments``)."""
    return fragment_spans(spans_of(request), received_at, max_bytes=max_bytes)


def fragment_spans(
    spans: Iterable[SpanView], received_at: datetime, *, max_bytes: int = MAX_FRAGMENT_BYTES
) -> Mapped:
    """Every span of one export, as fragments per trace (see the module docstring)."""
    out = Mapped()
    unique: dict[tuple[str, str], SpanView] = {}
    for span in spans:
        out.spans += 1
        unique.setdefault(span.key, span)  # a span twice in one export counts once
    traces: dict[str, list[TraceSpan]] = {}
    for span in unique.values():
        op = operation_of(span.attributes)
        problem = check_ids(span)
        if problem:
            if op is None:
                out.ignored += 1
            else:
                out.rejected.append(f"{span.ref}: {problem}")
            continue
        if op is None:
            out.ignored += 1
        try:
            mapped = trace_span(span, op)
        except (pydantic.ValidationError, ValueError, TypeError) as exc:
            out.rejected.append(f"{span.ref}: {short(exc)}")
            mapped = TraceSpan(
                span_id=span.span_id, parent_id=span.parent_id, call_id=_explicit(span)
            )
        traces.setdefault(span.trace_id, []).append(mapped)
    for trace_id in sorted(traces):
        for part in _cut(traces[trace_id], max_bytes):
            out.fragments.append(
                TraceFragment(trace_id=trace_id, received_at=received_at, spans=part)
            )
    return out


def trace_span(span: SpanView, op: str | None) -> TraceSpan:
    """One span as the span-resolution stage takes it; ``op`` is :func:`.otlp.operation_of`."""
    explicit = _explicit(span)
    base: dict[str, Any] = {"span_id": span.span_id, "parent_id": span.parent_id}
    if op is None:
        return TraceSpan(**base, call_id=explicit)
    if op in AGENT_OPERATIONS:
        call_id = own_call_id(span)
        start, end = agent_events(span, call_id, op)
        return TraceSpan(**base, role="agent", call_id=call_id, start=start, end=end)
    kind = StepKind.LLM if op in LLM_OPERATIONS else StepKind.TOOL
    alone = f"{span.trace_id}-{span.span_id}"
    step = step_of(span, alone, kind, op, seq_of(span))
    if kind is StepKind.TOOL:
        return TraceSpan(**base, role="tool", call_id=explicit, step=step)
    start, end = single_call_events(span, alone, step)
    start = start.model_copy(update={"input_messages": []})  # the step's: not sent twice
    return TraceSpan(**base, role="llm", call_id=explicit, step=step, start=start, end=end)


def _explicit(span: SpanView) -> str | None:
    value = span.attributes.get("trajstream.call_id")
    return value if isinstance(value, str) and value else None


def _cut(spans: list[TraceSpan], max_bytes: int) -> list[list[TraceSpan]]:
    """Consecutive parts of about ``max_bytes`` each (a larger span is a part of its own)."""
    parts: list[list[TraceSpan]] = [[]]
    size = 0
    for span in spans:
        n = len(span.model_dump_json())
        if parts[-1] and size + n > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(span)
        size += n
    return parts
