"""Unit tests of streams.capture.otlp: OTLP export requests -> agent events, statelessly."""

from __future__ import annotations

import base64
import itertools
import json
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st

from streams.capture.otlp import (
    Mapped,
    OtlpDecodeError,
    decode_json,
    decode_protobuf,
    encode_response,
    map_request,
    seq_of,
    spans_of,
)
from streams.core.assembly import (
    SEQ_SPACE,
    Limits,
    add_event,
    close,
    closed_reason,
    new_pending,
    step_order,
)
from streams.models import AgentCall, CallPhase, CallStatus, Completion, StepKind
from streams.select import SamplingRate
from tests.unit.factories import T0, step

from .otlp_spans import (
    AGENT,
    CHAT1,
    CHAT2,
    TOOL,
    TRACE,
    agent_call_spans,
    export,
    messages,
    span,
)

CALL = f"{TRACE}-{AGENT}"


def by_id(mapped: Mapped) -> dict[str, AgentCall | Completion]:
    return {r.event_id: r for r in mapped.records}


def trajectory_of(*exports: Mapped) -> Any:
    """Apply the records of the exports, in order, as the workers do: a call closes as soon as
    it is complete, and what arrives after that is late (left out)."""
    states: dict[str, Any] = {}
    closed: dict[str, Any] = {}
    limits = Limits()
    for mapped in exports:
        for record in mapped.records:
            if record.call_id in closed:
                continue
            state = states.setdefault(record.call_id, new_pending(record.call_id, T0))
            add_event(state, record, 100)
            reason = closed_reason(state, T0, limits)
            if reason is not None:
                closed[record.call_id] = close(state, SamplingRate(1.0), reason)[1]
    for call_id, state in states.items():
        if call_id not in closed:
            closed[call_id] = close(state, SamplingRate(1.0), "open")[1]
    return closed


# -- the mapping of one agent call ------------------------------------------------------------


def test_an_agent_call_becomes_start_steps_in_start_order_and_end() -> None:
    spans = agent_call_spans()
    mapped = map_request(export(*spans.values()))
    assert mapped.rejected == [] and mapped.ignored == 0 and mapped.spans == 4
    records = mapped.records
    assert [type(r).__name__ for r in records] == [
        "AgentCall",
        "Completion",
        "Completion",
        "Completion",
        "AgentCall",
    ]
    start, first, tool, second, end = records
    assert {r.call_id for r in records} == {CALL}
    assert isinstance(start, AgentCall) and start.phase is CallPhase.START
    assert (start.agent_name, start.agent_id, start.agent_version) == ("support", "agent-7", "3")
    assert start.conversation_id == "conv-1"
    assert [(m.role, m.content) for m in start.input_messages] == [("user", "Where is my order?")]
    assert start.event_time == T0
    assert start.attributes["app.tenant"] == "acme"
    assert start.attributes["service.name"] == "support-agent"
    assert start.attributes["otel.span_id"] == AGENT
    assert "gen_ai.agent.name" not in start.attributes  # mapped, not repeated
    assert start.mark is not None and start.mark.labels == ["gold", "reviewed"]
    assert start.mark.task_id == "task-9"
    assert isinstance(end, AgentCall) and end.phase is CallPhase.END
    assert end.status is CallStatus.OK and end.output == "It shipped."
    assert end.step_count is None  # the workers close the call at its END
    assert (end.event_time - T0).total_seconds() == pytest.approx(0.9)

    assert isinstance(first, Completion) and first.kind is StepKind.LLM
    assert first.response_id == "chatcmpl-1"
    assert (first.provider_name, first.request_model, first.response_model) == (
        "openai",
        "gpt-4o",
        "gpt-4o-2024-08-06",
    )
    assert first.finish_reasons == ["tool_calls"]
    assert (first.input_tokens, first.output_tokens) == (20, 5)
    assert [json.loads(c) for c in first.tool_calls] == [
        {"id": "call_1", "name": "lookup_order", "arguments": '{"order": 42}'}
    ]
    assert first.latency_ms == pytest.approx(290)
    assert isinstance(tool, Completion) and tool.kind is StepKind.TOOL
    assert tool.tool_name == "lookup_order" and tool.operation_name == "execute_tool"
    assert json.loads(tool.tool_calls[0]) == {
        "id": "call_1",
        "name": "lookup_order",
        "arguments": '{"order": 42}',
    }
    assert [(m.role, m.content, m.name) for m in tool.output_messages] == [
        ("tool", "shipped", "lookup_order")
    ]
    assert isinstance(second, Completion) and second.response_id == "chatcmpl-2"
    assert [s.seq for s in (first, tool, second)] == sorted(s.seq for s in (first, tool, second))


def test_the_call_becomes_one_trajectory_with_its_msg_ids_in_order() -> None:
    trajectories = trajectory_of(map_request(export(*agent_call_spans().values())))
    assert list(trajectories) == [CALL]
    trajectory = trajectories[CALL]
    assert trajectory.closed_reason == "ended"
    assert trajectory.msg_ids == ["chatcmpl-1", "chatcmpl-2"]
    assert [s.kind for s in trajectory.steps] == [StepKind.LLM, StepKind.TOOL, StepKind.LLM]
    assert trajectory.task_id == "task-9" and trajectory.agent_name == "support"


# -- several exports, out of order, twice -----------------------------------------------------

SPLITS = [
    [[CHAT1, TOOL, CHAT2, AGENT]],
    [[CHAT1], [TOOL], [CHAT2], [AGENT]],
    [[CHAT1, TOOL], [CHAT2, AGENT]],
    [[TOOL, CHAT1], [AGENT, CHAT2]],  # spans out of order inside an export
    [[CHAT1, TOOL], [CHAT1, TOOL], [CHAT2, AGENT]],  # an export retried
    [[CHAT2], [CHAT1, TOOL], [AGENT], [AGENT]],  # exports out of order, the last one twice
]


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "|".join(",".join(x) for x in s))
def test_split_duplicated_and_reordered_exports_give_the_same_records(
    split: list[list[str]],
) -> None:
    spans = agent_call_spans()
    whole = by_id(map_request(export(*spans.values())))
    merged: dict[str, AgentCall | Completion] = {}
    for part in split:
        for event_id, record in by_id(map_request(export(*(spans[s] for s in part)))).items():
            assert merged.setdefault(event_id, record) == record  # a copy is identical
    assert merged == whole


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: "|".join(",".join(x) for x in s))
def test_exports_that_reach_the_workers_before_the_agent_span_give_the_same_trajectory(
    split: list[list[str]],
) -> None:
    spans = agent_call_spans()
    expected = trajectory_of(map_request(export(*spans.values())))[CALL]
    exports = [map_request(export(*(spans[s] for s in part))) for part in split]
    before_agent = [
        e for e in exports if not any(r.event_id.endswith(AGENT + ":end") for r in e.records)
    ]
    with_agent = [e for e in exports if e not in before_agent]
    # one exporter sends them in this order: children end, and are exported, first
    got = trajectory_of(*before_agent, *with_agent)[CALL]
    assert got == expected


def test_steps_exported_after_the_agent_span_come_too_late() -> None:
    """The limit of a stateless ingest, documented in docs/how-to/capture-otlp.md: the workers
    close a call at its END; a child span that reaches them after its agent span is a late
    event."""
    spans = agent_call_spans()
    late = trajectory_of(
        map_request(export(spans[CHAT1], spans[TOOL], spans[AGENT])),
        map_request(export(spans[CHAT2])),
    )[CALL]
    assert late.msg_ids == ["chatcmpl-1"]


# -- call ids ---------------------------------------------------------------------------------


def test_nested_steps_find_their_agent_through_parents_in_the_export() -> None:
    spans = agent_call_spans()
    loop = span("4444444444444444", parent=AGENT, name="event loop cycle", start_ms=5, end_ms=890)
    chat = span(
        "5555555555555555",
        parent="4444444444444444",
        start_ms=20,
        attrs={"gen_ai.operation.name": "chat", "gen_ai.response.id": "r"},
    )
    mapped = map_request(export(spans[AGENT], loop, chat))
    assert {r.call_id for r in mapped.records} == {CALL}
    assert mapped.ignored == 1  # the loop span


def test_a_step_whose_parent_is_not_in_the_export_belongs_to_that_parent() -> None:
    mapped = map_request(export(agent_call_spans()[CHAT1]))
    assert [(type(r).__name__, r.call_id) for r in mapped.records] == [("Completion", CALL)]


def test_missing_parent_own_makes_such_a_step_a_call_of_its_own() -> None:
    mapped = map_request(export(agent_call_spans()[CHAT1]), missing_parent="own")
    assert {r.call_id for r in mapped.records} == {f"{TRACE}-{CHAT1}"}
    assert len(mapped.records) == 3


def test_a_trace_without_an_agent_span_gives_one_call_per_chat_span() -> None:
    root = span("6666666666666666", name="POST /ask", start_ms=0, end_ms=1000)
    chats = [
        span(
            CHAT1,
            parent="6666666666666666",
            start_ms=10,
            attrs={
                "gen_ai.operation.name": "chat",
                "gen_ai.response.id": "chatcmpl-1",
                "gen_ai.input.messages": messages(("user", "hi")),
                "gen_ai.output.messages": messages(("assistant", "hello")),
                "gen_ai.agent.name": "helper",
                "trajstream.mark.labels": "a, b",
            },
        ),
        span(
            CHAT2,
            parent="6666666666666666",
            start_ms=500,
            error="boom",
            attrs={
                "gen_ai.operation.name": "chat",
                "gen_ai.response.id": "chatcmpl-2",
                "error.type": "RateLimitError",
            },
        ),
        span(
            TOOL,
            parent="6666666666666666",
            start_ms=300,
            attrs={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "t",
            },
        ),
    ]
    mapped = map_request(export(root, *chats))
    assert mapped.ignored == 2  # the root, and the tool outside any agent call
    trajectories = trajectory_of(mapped)
    assert set(trajectories) == {f"{TRACE}-{CHAT1}", f"{TRACE}-{CHAT2}"}
    one = trajectories[f"{TRACE}-{CHAT1}"]
    assert one.msg_ids == ["chatcmpl-1"] and one.closed_reason == "ended"
    assert [(m.role, m.content) for m in one.input_messages] == [("user", "hi")]
    assert one.output == "hello" and one.agent_name == "helper"
    assert one.mark is not None and one.mark.labels == ["a", "b"]
    two = trajectories[f"{TRACE}-{CHAT2}"]
    assert (two.status, two.error_type) == (CallStatus.ERROR, "RateLimitError")


def test_trajstream_call_id_attribute_names_the_call() -> None:
    spans = agent_call_spans()
    agent = span(
        AGENT, attrs={"gen_ai.operation.name": "invoke_agent", "trajstream.call_id": "c-1"}
    )
    mapped = map_request(export(agent, spans[CHAT1]))
    assert {r.call_id for r in mapped.records} == {"c-1"}
    tagged = span(
        CHAT2,
        parent="7777777777777777",
        attrs={"gen_ai.operation.name": "chat", "trajstream.call_id": "c-2"},
    )
    assert {r.call_id for r in map_request(export(tagged)).records} == {"c-2"}


# -- attribute names of older instrumentations ------------------------------------------------

LEGACY = [
    pytest.param(
        {  # OpenLLMetry (traceloop): flattened prompts and completions, llm.request.type
            "llm.request.type": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.model": "gpt-4o-mini",
            "gen_ai.response.id": "chatcmpl-x",
            "gen_ai.prompt.0.role": "system",
            "gen_ai.prompt.0.content": "Be brief.",
            "gen_ai.prompt.1.role": "user",
            "gen_ai.prompt.1.content": "Weather?",
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "",
            "gen_ai.completion.0.finish_reason": "tool_calls",
            "gen_ai.completion.0.tool_calls.0.id": "call_9",
            "gen_ai.completion.0.tool_calls.0.name": "weather",
            "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
            "gen_ai.usage.prompt_tokens": 11,
            "gen_ai.usage.completion_tokens": 4,
            "llm.usage.total_tokens": 15,
        },
        {
            "provider_name": "openai",
            "request_model": "gpt-4o",
            "response_model": "gpt-4o-mini",
            "response_id": "chatcmpl-x",
            "finish_reasons": ["tool_calls"],
            "input_tokens": 11,
            "output_tokens": 4,
            "inputs": [("system", "Be brief."), ("user", "Weather?")],
            "outputs": [("assistant", "")],
            "tool_calls": [{"id": "call_9", "name": "weather", "arguments": '{"city": "Paris"}'}],
        },
        id="openllmetry",
    ),
    pytest.param(
        {  # older OpenLLMetry: llm.* names
            "llm.request.type": "completion",
            "llm.vendor": "Anthropic",
            "llm.request.model": "claude-2",
            "llm.prompts.0.role": "user",
            "llm.prompts.0.content": "Hi",
            "llm.completions.0.role": "assistant",
            "llm.completions.0.content": "Hello",
            "llm.usage.prompt_tokens": 1,
            "llm.usage.completion_tokens": 2,
        },
        {
            "provider_name": "Anthropic",
            "request_model": "claude-2",
            "operation_name": "text_completion",
            "input_tokens": 1,
            "output_tokens": 2,
            "inputs": [("user", "Hi")],
            "outputs": [("assistant", "Hello")],
        },
        id="llm-star",
    ),
    pytest.param(
        {  # opentelemetry-instrumentation-openai-v2 before the parts form: role/content JSON
            "gen_ai.operation.name": "chat",
            "gen_ai.system": "openai",
            "gen_ai.request.model": "gpt-4o",
            "gen_ai.response.id": "chatcmpl-y",
            "gen_ai.input.messages": json.dumps([{"role": "user", "content": "hello world"}]),
        },
        {"provider_name": "openai", "inputs": [("user", "hello world")], "outputs": []},
        id="role-content-json",
    ),
    pytest.param(
        {  # OpenInference (Arize)
            "openinference.span.kind": "LLM",
            "llm.model_name": "gpt-4o",
            "llm.provider": "openai",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": "Hi",
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": "Hey",
            "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "f",
            "llm.token_count.prompt": 3,
            "llm.token_count.completion": 1,
        },
        {
            "provider_name": "openai",
            "request_model": "gpt-4o",
            "input_tokens": 3,
            "inputs": [("user", "Hi")],
            "outputs": [("assistant", "Hey")],
            "tool_calls": [{"name": "f"}],
        },
        id="openinference",
    ),
    pytest.param(
        {  # structured (not JSON-string) messages and system instructions
            "gen_ai.operation.name": "generate_content",
            "gen_ai.provider.name": "gcp.gemini",
            "gen_ai.system_instructions": json.dumps([{"type": "text", "content": "Be kind."}]),
            "gen_ai.input.messages": [
                {"role": "user", "parts": [{"type": "text", "content": "Q"}]}
            ],
            "gen_ai.output.messages": [
                {
                    "role": "assistant",
                    "parts": [{"type": "text", "content": "A"}],
                    "finish_reason": "stop",
                }
            ],
        },
        {
            "provider_name": "gcp.gemini",
            "operation_name": "generate_content",
            "finish_reasons": ["stop"],
            "inputs": [("system", "Be kind."), ("user", "Q")],
            "outputs": [("assistant", "A")],
        },
        id="structured",
    ),
]


@pytest.mark.parametrize(("attrs", "expected"), LEGACY)
def test_attribute_names_of_widely_used_instrumentations(
    attrs: dict[str, Any], expected: dict[str, Any]
) -> None:
    mapped = map_request(export(span(CHAT1, parent=AGENT, attrs=attrs)))
    assert mapped.ignored == 0 and mapped.rejected == []
    (record,) = mapped.records
    assert isinstance(record, Completion) and record.kind is StepKind.LLM
    want = dict(expected)
    assert [(m.role, m.content) for m in record.input_messages] == want.pop("inputs")
    assert [(m.role, m.content) for m in record.output_messages] == want.pop("outputs")
    if "tool_calls" in want:
        assert [json.loads(c) for c in record.tool_calls] == want.pop("tool_calls")
    for name, value in want.items():
        assert getattr(record, name) == value, name


@pytest.mark.parametrize(
    ("events", "inputs", "outputs"),
    [
        (
            [
                (
                    "gen_ai.content.prompt",
                    {"gen_ai.prompt": json.dumps([{"role": "user", "content": "P"}])},
                ),
                (
                    "gen_ai.content.completion",
                    {"gen_ai.completion": json.dumps([{"role": "assistant", "content": "C"}])},
                ),
            ],
            [("user", "P")],
            [("assistant", "C")],
        ),
        (
            [
                ("gen_ai.system.message", {"content": "S"}),
                ("gen_ai.user.message", {"content": "U"}),
                ("gen_ai.choice", {"message": json.dumps({"role": "assistant", "content": "A"})}),
            ],
            [("system", "S"), ("user", "U")],
            [("assistant", "A")],
        ),
        (
            [
                (
                    "gen_ai.client.inference.operation.details",
                    {
                        "gen_ai.input.messages": messages(("user", "I")),
                        "gen_ai.output.messages": messages(("assistant", "O")),
                    },
                )
            ],
            [("user", "I")],
            [("assistant", "O")],
        ),
    ],
    ids=["content-events", "message-events", "operation-details"],
)
def test_messages_recorded_as_span_events(
    events: list[tuple[str, dict[str, Any]]], inputs: list[Any], outputs: list[Any]
) -> None:
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai"}
    (record,) = map_request(export(span(CHAT1, parent=AGENT, attrs=attrs, events=events))).records
    assert isinstance(record, Completion)
    assert [(m.role, m.content) for m in record.input_messages] == inputs
    assert [(m.role, m.content) for m in record.output_messages] == outputs


def test_traceloop_agent_and_tool_spans() -> None:
    agent = span(
        AGENT,
        attrs={
            "traceloop.span.kind": "agent",
            "traceloop.entity.name": "planner",
            "traceloop.entity.output": "done",
        },
    )
    tool = span(
        TOOL,
        parent=AGENT,
        start_ms=5,
        attrs={
            "traceloop.span.kind": "tool",
            "traceloop.entity.name": "search",
            "traceloop.entity.input": '{"q": 1}',
            "traceloop.entity.output": "found",
        },
    )
    start, step_, end = map_request(export(agent, tool)).records
    assert isinstance(start, AgentCall) and start.agent_name == "planner"
    assert isinstance(end, AgentCall) and end.output == "done"
    assert isinstance(step_, Completion) and step_.tool_name == "search"
    assert step_.output_messages[0].content == "found"
    assert json.loads(step_.tool_calls[0])["arguments"] == '{"q": 1}'


# -- what is ignored, what is rejected --------------------------------------------------------


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"http.method": "GET", "http.route": "/ask"},
        {"gen_ai.operation.name": "embeddings", "gen_ai.request.model": "e"},
        {"gen_ai.system": "openai"},  # a provider but no model, id or operation
        {"traceloop.span.kind": "workflow"},
    ],
    ids=["bare", "http", "embeddings", "provider-only", "workflow"],
)
def test_spans_without_genai_attributes_are_ignored_and_counted(attrs: dict[str, Any]) -> None:
    mapped = map_request(export(span(CHAT1, parent=AGENT, attrs=attrs)))
    assert (mapped.records, mapped.ignored, mapped.rejected, mapped.spans) == ([], 1, [], 1)


def test_bad_genai_spans_are_rejected_by_name_and_the_others_kept() -> None:
    good = agent_call_spans()[CHAT1]
    negative = span(
        "8888888888888888",
        parent=AGENT,
        name="bad tokens",
        attrs={"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": -3},
    )
    no_id = span(
        CHAT2,
        parent=AGENT,
        name="zero trace",
        trace="0" * 32,
        attrs={"gen_ai.operation.name": "chat"},
    )
    text_tokens = span(
        "9999999999999999",
        parent=AGENT,
        name="text tokens",
        attrs={"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": "many"},
    )
    mapped = map_request(export(good, negative, no_id, text_tokens))
    assert [r.event_id for r in mapped.records] == [f"otlp:{TRACE}:{CHAT1}:step"]
    assert len(mapped.rejected) == 3
    message = mapped.error_message()
    assert "'bad tokens'" in message and "input_tokens" in message
    assert "'zero trace'" in message and "trace id" in message
    assert "'text tokens'" in message and "gen_ai.usage.output_tokens" in message


# -- seq --------------------------------------------------------------------------------------


def test_steps_that_start_in_one_millisecond_get_distinct_seqs_in_start_order() -> None:
    attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}
    # tie bits: span ids ending in f, 0, 7 started 0.1 ms apart
    parallel = [
        span(f"aaaaaaaaaaaaaaa{last}", parent=AGENT, start_ms=100 + i * 0.1, attrs=attrs)
        for i, last in enumerate("f07")
    ]
    mapped = map_request(export(*parallel))
    seqs = [r.seq for r in mapped.records if isinstance(r, Completion)]
    assert len(set(seqs)) == 3
    ordered = step_order([r for r in mapped.records if isinstance(r, Completion)])
    assert [r.event_id.split(":")[2][-1] for r in ordered] == ["f", "0", "7"]


def test_seq_wraps_and_the_workers_keep_the_order() -> None:
    period_ms = SEQ_SPACE >> 4
    before = span(
        CHAT1, parent=AGENT, start_ms=period_ms - 1, attrs={"gen_ai.operation.name": "chat"}
    )
    after = span(
        CHAT2, parent=AGENT, start_ms=period_ms + 1, attrs={"gen_ai.operation.name": "chat"}
    )
    one = map_request(export(before)).records
    two = map_request(export(after)).records
    state = new_pending(CALL, T0)
    for record in two + one:
        add_event(state, record, 10)
    assert [s.event_id for s in state.steps] == [one[0].event_id, two[0].event_id]


@given(
    st.lists(st.integers(0, SEQ_SPACE - 1), min_size=1, max_size=20, unique=True),
    st.integers(0, SEQ_SPACE - 1),
)
def test_step_order_is_the_order_of_a_rotated_counter(offsets: list[int], base: int) -> None:
    """Seqs within half the space of each other, shifted anywhere (also across the wrap),
    come out in the order of their offsets."""
    offsets = sorted(o % (SEQ_SPACE // 2) for o in offsets)
    offsets = sorted(set(offsets))
    steps = [step(seq=(base + o) % SEQ_SPACE, event_id=f"e{o}") for o in offsets]
    assert [s.event_id for s in step_order(steps[::-1])] == [f"e{o}" for o in offsets]


def test_sdk_seqs_keep_their_numeric_order() -> None:
    steps = [step(seq=s, event_id=f"e{s}") for s in (3, 0, 2, 1)]
    assert [s.seq for s in step_order(steps)] == [0, 1, 2, 3]


def test_seq_is_a_function_of_the_span_alone() -> None:
    spans = list(agent_call_spans().values())
    views = list(spans_of(export(*spans)))
    assert [seq_of(v) for v in views] == [seq_of(v) for v in spans_of(export(*spans))]
    assert all(0 <= seq_of(v) < SEQ_SPACE for v in views)


# -- decoding ---------------------------------------------------------------------------------


def otlp_json(request: Any) -> bytes:
    """The OTLP JSON encoding, as an OTLP/JSON exporter writes it: hex ids, int enums."""
    data = json_format.MessageToDict(request, use_integers_for_enums=True)
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in s:
                        s[key] = base64.b64decode(s[key]).hex()
    return json.dumps(data).encode()


def test_protobuf_and_json_bodies_decode_to_the_same_request() -> None:
    request = export(*agent_call_spans().values())
    body = otlp_json(request)
    assert b'"traceId": "' + TRACE.encode() in body and b'"startTimeUnixNano": "' in body
    assert decode_json(body) == request
    assert decode_protobuf(request.SerializeToString()) == request


def test_json_with_unknown_fields_and_numeric_int64_is_accepted() -> None:
    body = json.dumps(
        {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "traceId": TRACE,
                                    "spanId": CHAT1,
                                    "parentSpanId": AGENT,
                                    "name": "chat",
                                    "kind": 3,
                                    "startTimeUnixNano": 1767225600000000000,
                                    "endTimeUnixNano": "1767225601000000000",
                                    "status": {"code": 1},
                                    "attributes": [
                                        {
                                            "key": "gen_ai.operation.name",
                                            "value": {"stringValue": "chat"},
                                        },
                                        {
                                            "key": "gen_ai.usage.input_tokens",
                                            "value": {"intValue": "7"},
                                        },
                                    ],
                                    "futureField": {"x": 1},
                                }
                            ]
                        }
                    ]
                }
            ],
        }
    ).encode()
    (record,) = map_request(decode_json(body)).records
    assert isinstance(record, Completion) and record.input_tokens == 7
    assert record.call_id == CALL


@pytest.mark.parametrize(
    "body",
    [
        b"\x0a\xff\xff\xff\xff\x0f",  # a length beyond the body
        b"\xff\xff\xff",
        b"\x0a\x05hello",  # resource_spans holding garbage
    ],
)
def test_malformed_protobuf_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(OtlpDecodeError, match="not a protobuf ExportTraceServiceRequest"):
        decode_protobuf(body)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"{", "not JSON"),
        (b"[]", "not an OTLP JSON object"),
        (json.dumps({"resourceSpans": {}}).encode(), "must be an array"),
        (
            json.dumps(
                {"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "xyz"}]}]}]}
            ).encode(),
            "not a hex string",
        ),
        (
            json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 5}]}]}]}).encode(),
            "OTLP JSON",
        ),
    ],
)
def test_malformed_json_is_a_decode_error(body: bytes, match: str) -> None:
    with pytest.raises(OtlpDecodeError, match=match):
        decode_json(body)


def test_response_names_rejections_in_both_encodings() -> None:
    assert encode_response(0, "", as_json=False) == b""
    assert json.loads(encode_response(0, "", as_json=True)) == {}
    assert json.loads(encode_response(2, "span x: bad", as_json=True)) == {
        "partialSuccess": {"rejectedSpans": "2", "errorMessage": "span x: bad"}
    }


def test_every_split_of_the_call_closes_one_trajectory() -> None:
    """All 2-way splits of the four spans, children first: one trajectory, the same one."""
    spans = agent_call_spans()
    expected = trajectory_of(map_request(export(*spans.values())))[CALL]
    children = [CHAT1, TOOL, CHAT2]
    for n in range(len(children) + 1):
        for first in itertools.combinations(children, n):
            rest = [c for c in children if c not in first]
            got = trajectory_of(
                map_request(export(*(spans[c] for c in first))),
                map_request(export(*(spans[c] for c in rest), spans[AGENT])),
            )[CALL]
            assert got == expected
