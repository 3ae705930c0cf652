"""Traces made with the real OpenTelemetry SDK, encoded by its own OTLP encoder, for the tests
of span resolution: an agent span, a plain intermediate span without GenAI attributes (the
workflow/chain/task span frameworks put there), and the model and tool spans under it.

Times are fixed (from :data:`tests.unit.factories.T0`), so seqs and event times are too.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.factories import T0

T0_NS = int(T0.timestamp()) * 1_000_000_000
MS = 1_000_000


@dataclass
class SdkTrace:
    """The finished spans of one traced agent run, by name, in the order the SDK ended them."""

    spans: list[ReadableSpan]

    def __getitem__(self, name: str) -> ReadableSpan:
        (found,) = [s for s in self.spans if s.name == name]
        return found

    @property
    def trace_id(self) -> str:
        return format(self.spans[0].context.trace_id, "032x")

    def span_id(self, name: str) -> str:
        return format(self[name].context.span_id, "016x")

    def call_id(self, name: str = "invoke_agent planner") -> str:
        return f"{self.trace_id}-{self.span_id(name)}"


def export(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """An export request of these spans, as the SDK's OTLP exporters encode it."""
    return encode_spans(list(spans))


def _chat(tracer: trace.Tracer, name: str, start: int, end: int, reply_id: str) -> None:
    span = tracer.start_span(
        name,
        start_time=T0_NS + start * MS,
        attributes={
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": "policy",
            "gen_ai.response.id": reply_id,
            "gen_ai.input.messages": json.dumps([{"role": "user", "content": "where is 42?"}]),
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": reply_id}]),
        },
    )
    span.end(T0_NS + end * MS)


def _tool(tracer: trace.Tracer, name: str, start: int, end: int, **attrs: str) -> None:
    span = tracer.start_span(
        name,
        start_time=T0_NS + start * MS,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, **attrs},
    )
    span.end(T0_NS + end * MS)


def agent_run(
    *,
    late_child: bool = False,
    plain_root: bool = False,
    workflow_call_id: str | None = None,
    sub_agent: bool = False,
    with_agent: bool = True,
) -> SdkTrace:
    """``invoke_agent planner`` > ``workflow plan`` (plain) > chat, tool, chat.

    ``late_child``: a tool span under the agent span that ends after it (so a span processor
    exports it after its agent span). ``plain_root``: the agent span sits under a plain root
    span (an HTTP server span). ``workflow_call_id``: the workflow span carries
    ``trajstream.call_id``. ``sub_agent``: the second chat runs under a nested agent span.
    """
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "sdk-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test-agent")
    root = tracer.start_span("POST /ask", start_time=T0_NS) if plain_root else None
    outer = trace.set_span_in_context(root) if root is not None else None
    agent = tracer.start_span(
        "invoke_agent planner" if with_agent else "plain task",
        context=outer,
        start_time=T0_NS + 1 * MS,
        attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "planner"}
        if with_agent
        else {},
    )
    with trace.use_span(agent, end_on_exit=False):
        workflow = tracer.start_span("workflow plan", start_time=T0_NS + 2 * MS)
        if workflow_call_id is not None:
            workflow.set_attribute("trajstream.call_id", workflow_call_id)
        with trace.use_span(workflow, end_on_exit=False):
            _chat(tracer, "chat 1", 3, 10, "chatcmpl-1")
            _tool(tracer, "lookup", 11, 12, **{"gen_ai.tool.call.id": "call_1"})
            if sub_agent:
                sub = tracer.start_span(
                    "invoke_agent helper",
                    start_time=T0_NS + 13 * MS,
                    attributes={
                        "gen_ai.operation.name": "invoke_agent",
                        "gen_ai.agent.name": "helper",
                    },
                )
                with trace.use_span(sub, end_on_exit=False):
                    _chat(tracer, "chat 2", 14, 19, "chatcmpl-2")
                sub.end(T0_NS + 19 * MS + MS // 2)
            else:
                _chat(tracer, "chat 2", 14, 20, "chatcmpl-2")
        workflow.end(T0_NS + 21 * MS)
    late = None
    if late_child:
        late = tracer.start_span(
            "audit",
            context=trace.set_span_in_context(agent),
            start_time=T0_NS + 21 * MS + MS // 2,
            attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "audit"},
        )
    agent.end(T0_NS + 22 * MS)
    if late is not None:
        late.end(T0_NS + 30 * MS)
    if root is not None:
        root.end(T0_NS + 40 * MS)
    provider.shutdown()
    return SdkTrace(list(memory.get_finished_spans()))
