"""Unit tests of streams.core.spans: the span-resolution stage, fed trace fragments the ingest
made (streams.capture.otlp_trace) from traces of the real OpenTelemetry SDK, its output assembled
by the real assemble stage (tests.unit.core.harness).

Every export order of a trace's spans, duplicates, children exported after their agent span,
the settle time, the orphan bound, forgetting, the byte bound and a restart of the stage."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan

from streams.capture.otlp_trace import fragment_request
from streams.core.effects import Out, Source
from streams.core.spans import AGENT_EVENTS, ROOT, WAIT, SpanLimits, SpanResolver, call_of
from streams.core.store import MemoryStore
from streams.models import (
    AgentCall,
    CallPhase,
    Completion,
    SpanLink,
    StepKind,
    Tick,
    TraceFragment,
    Trajectory,
)
from tests.unit.capture.sdk_traces import agent_run, export
from tests.unit.core.harness import CODEC, EDGE, Core
from tests.unit.factories import T0

LIMITS = SpanLimits(
    settle=timedelta(seconds=5),
    orphan_after=timedelta(seconds=60),
    retention=timedelta(seconds=120),
)
NOW = T0 + timedelta(seconds=1)


class Pipeline:
    """Ingest fragments -> the span stage -> the assemble and reward stages, all in memory."""

    def __init__(self, limits: SpanLimits = LIMITS) -> None:
        self.store = MemoryStore()
        self.resolver = SpanResolver(limits=limits, store=self.store, codec=CODEC)
        self.core = Core()
        self.out = Out()
        self._offset = 0

    def fragments(self, spans: Sequence[ReadableSpan], now: datetime) -> list[TraceFragment]:
        return fragment_request(export(spans), now).fragments

    def send(self, spans: Sequence[ReadableSpan], now: datetime = NOW) -> Out:
        out = Out()
        for fragment in self.fragments(spans, now):
            self._offset += 1
            src = EDGE.read(
                Source("spans", 0, self._offset, fragment.trace_id.encode(), CODEC.encode(fragment))
            )
            out.extend(self._take(self.resolver.on_record(src, now), now))
        return out

    def tick(self, now: datetime) -> Out:
        out = self._take(self.resolver.on_tick(0, now), now)
        self.core.tick(now)
        return out

    def _take(self, out: Out, now: datetime) -> Out:
        self.out.extend(out)
        for emit in out.emits:
            assert emit.topic == AGENT_EVENTS
            assert emit.key == emit.record.call_id.encode()  # type: ignore[attr-defined]
            self.core.event(emit.record, now, key=emit.key)
        return out

    @property
    def events(self) -> list[AgentCall | Completion]:
        return [e.record for e in self.out.emits]  # type: ignore[misc]

    def trajectories(self) -> dict[str, Trajectory]:
        return {t.call_id: t for t in self.core.topic("trajectories")}


def kinds(t: Trajectory) -> list[str]:
    return [s.kind.value for s in t.steps]


def response_ids(t: Trajectory) -> list[str | None]:
    return [s.response_id for s in t.steps]


# -- the resolution rule ----------------------------------------------------------------------


def link(span: str, parent: str = "", role: Any = "plain", call: str | None = None) -> SpanLink:
    return SpanLink(span_id=span, parent_id=parent, role=role, call_id=call)


@pytest.mark.parametrize(
    ("links", "span", "expected"),
    [
        ([link("s", "w", "llm"), link("w", "a"), link("a", "", "agent", "c")], "s", "c"),
        ([link("s", "w", "llm"), link("w", "a")], "s", WAIT),
        ([link("s", "w", "llm"), link("w", "")], "s", ROOT),
        ([link("s", "w", "llm", "mine"), link("w", "a")], "s", "mine"),
        (
            [link("s", "w", "llm"), link("w", "a", call="bag"), link("a", "", "agent", "c")],
            "s",
            "bag",
        ),
        ([link("s", "w", "llm"), link("w", "s")], "s", ROOT),  # a cycle
    ],
    ids=["through-plain", "ancestor-missing", "root", "own-call-id", "baggage", "cycle"],
)
def test_a_span_belongs_to_the_call_of_its_nearest_ancestor_naming_one(
    links: list[SpanLink], span: str, expected: Any
) -> None:
    assert call_of(span, {x.span_id: x for x in links}) == expected


# -- export orders ----------------------------------------------------------------------------


def test_the_failure_of_resolving_per_export_is_what_the_stage_fixes() -> None:
    """One span per export (a SimpleSpanProcessor), a plain span between agent and steps: the
    per-export mapping opens a call named after the plain span and leaves the agent's empty."""
    from streams.capture.otlp import map_request

    run = agent_run()
    per_export = [map_request(export([s])) for s in run.spans]
    calls = {r.call_id for m in per_export for r in m.records}
    assert calls == {run.call_id(), run.call_id("workflow plan")}  # the stray call
    resolved = Pipeline()
    for span in run.spans:
        resolved.send([span])
    assert {r.call_id for r in resolved.events} == {run.call_id()}


ORDERS = list(itertools.permutations(range(5)))


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "".join(map(str, o)))
def test_every_export_order_of_single_span_exports_gives_one_call_with_every_step(
    order: tuple[int, ...],
) -> None:
    run = agent_run()
    assert [s.name for s in run.spans] == [
        "chat 1",
        "lookup",
        "chat 2",
        "workflow plan",
        "invoke_agent planner",
    ]
    p = Pipeline()
    for i, index in enumerate(order):
        p.send([run.spans[index]], NOW + timedelta(milliseconds=10 * i))
    assert not p.trajectories()  # the END waits out the settle time
    p.tick(NOW + timedelta(seconds=6))
    (t,) = p.trajectories().values()
    assert t.call_id == run.call_id() and t.closed_reason == "ended"
    assert kinds(t) == ["LLM", "TOOL", "LLM"]
    assert response_ids(t) == ["chatcmpl-1", None, "chatcmpl-2"]
    assert {r.call_id for r in p.events} == {run.call_id()}
    assert not p.core.rejects() and not p.out.rejects
    phases = [r.phase for r in p.events if isinstance(r, AgentCall)]
    assert phases == [CallPhase.START, CallPhase.END] and isinstance(p.events[-1], AgentCall)


@pytest.mark.parametrize(
    "batches",
    [[[0, 1, 2, 3, 4]], [[0, 1, 2], [3, 4]], [[4], [0, 1, 2, 3]], [[3], [4], [0, 2], [1]]],
    ids=["one-export", "children-first", "agent-first", "scattered"],
)
def test_exports_of_several_spans_in_any_split(batches: list[list[int]]) -> None:
    run = agent_run()
    p = Pipeline()
    for batch in batches:
        p.send([run.spans[i] for i in batch])
    p.tick(NOW + timedelta(seconds=6))
    (t,) = p.trajectories().values()
    assert kinds(t) == ["LLM", "TOOL", "LLM"] and t.call_id == run.call_id()


def test_every_span_exported_twice_is_applied_once() -> None:
    run = agent_run(late_child=True)
    rng = random.Random(7)
    for _ in range(20):
        spans = run.spans * 2
        rng.shuffle(spans)
        p = Pipeline()
        for span in spans:
            p.send([span])
        p.send(run.spans)  # and the whole trace once more
        p.tick(NOW + timedelta(seconds=6))
        (t,) = p.trajectories().values()
        assert kinds(t) == ["LLM", "TOOL", "LLM", "TOOL"]
        ids = [r.event_id for r in p.events]
        assert len(ids) == len(set(ids)) == 6  # START, four steps, END: none twice
        assert p.out.stats["spans.duplicate"] == len(run.spans) + len(run.spans)


# -- children after their agent span ---------------------------------------------------------


def test_a_child_exported_after_its_agent_span_joins_within_the_settle_time() -> None:
    run = agent_run(late_child=True)
    assert [s.name for s in run.spans][-2:] == ["invoke_agent planner", "audit"]
    p = Pipeline()
    for i, span in enumerate(run.spans):
        p.send([span], NOW + timedelta(seconds=i))  # the audit span 1 s after the agent span
    p.tick(NOW + timedelta(seconds=4))  # not settled yet
    assert not p.trajectories()
    p.tick(NOW + timedelta(seconds=20))
    (t,) = p.trajectories().values()
    assert kinds(t) == ["LLM", "TOOL", "LLM", "TOOL"] and t.steps[-1].tool_name == "audit"


def test_a_child_later_than_the_settle_time_reaches_its_call_and_is_recorded_as_late() -> None:
    run = agent_run(late_child=True)
    p = Pipeline()
    p.send(run.spans[:-1])
    p.tick(NOW + timedelta(seconds=6))
    (t,) = p.trajectories().values()
    assert kinds(t) == ["LLM", "TOOL", "LLM"]
    p.send(run.spans[-1:], NOW + timedelta(seconds=30))
    (late,) = p.core.rejects("late")
    assert run.call_id() in late[1]  # on its own call, after it closed: no stray call
    assert {r.call_id for r in p.events} == {run.call_id()}


# -- steps outside agent spans, orphans -------------------------------------------------------


def test_a_step_under_plain_spans_only_is_a_call_of_its_own_once_the_root_arrives() -> None:
    run = agent_run(plain_root=True, with_agent=False)
    spans = run.spans
    p = Pipeline()
    p.send(spans[:3])  # chat, tool, chat: their ancestors are not there yet
    assert not p.events
    p.send(spans[3:])  # the workflow, a task and the root: no agent ancestor
    chats = {f"{run.trace_id}-{run.span_id(n)}" for n in ("chat 1", "chat 2")}
    assert set(p.trajectories()) == chats
    assert all(kinds(t) == ["LLM"] for t in p.trajectories().values())
    assert p.out.stats["spans.tool_without_call"] == 1 and p.out.stats["calls.own"] == 2


def test_a_step_whose_ancestors_never_arrive_is_an_orphan_after_the_bound() -> None:
    run = agent_run()
    p = Pipeline()
    p.send([run["chat 1"], run["lookup"]])  # the workflow and agent spans never come
    p.tick(NOW + timedelta(seconds=59))
    assert not p.events
    p.tick(NOW + timedelta(seconds=61))
    (t,) = p.trajectories().values()
    assert t.call_id == f"{run.trace_id}-{run.span_id('chat 1')}" and kinds(t) == ["LLM"]
    assert t.input_messages[0].content == "where is 42?"  # the START has the step's prompt
    (late,) = [r for r in p.out.rejects if r.late]
    assert "lookup" not in late.reason and run.span_id("workflow plan") in late.reason
    assert p.out.stats["calls.orphan"] == 1 and p.out.stats["spans.orphan_tool"] == 1


def test_a_call_id_on_a_plain_span_names_the_call_of_its_descendants() -> None:
    run = agent_run(workflow_call_id="run-7")
    p = Pipeline()
    for span in run.spans[:3]:
        p.send([span])
    p.send(run.spans[3:4])  # the workflow span with trajstream.call_id: steps join run-7
    assert {r.call_id for r in p.events} == {"run-7"}
    assert [r.seq for r in p.events if isinstance(r, Completion)] == sorted(
        r.seq for r in p.events if isinstance(r, Completion)
    )


def test_steps_of_a_nested_agent_join_the_nearest_agent() -> None:
    run = agent_run(sub_agent=True)
    p = Pipeline()
    for span in reversed(run.spans):  # parents first this time
        p.send([span])
    p.tick(NOW + timedelta(seconds=6))
    outer, inner = (
        p.trajectories()[run.call_id()],
        p.trajectories()[run.call_id("invoke_agent helper")],
    )
    assert kinds(outer) == ["LLM", "TOOL"] and kinds(inner) == ["LLM"]
    assert inner.agent_name == "helper" and outer.agent_name == "planner"


# -- bounds, forgetting, restarts, bad input --------------------------------------------------


def test_a_trace_holding_too_many_bytes_dead_letters_the_next_step() -> None:
    run = agent_run()
    p = Pipeline(SpanLimits(settle=LIMITS.settle, orphan_after=LIMITS.orphan_after, max_bytes=1200))
    p.send([run["chat 1"]])
    p.send([run["chat 2"]])
    (reject,) = p.out.rejects
    assert reject.stage == "spans" and "larger than 1200 bytes" in reject.reason
    p.send(run.spans[1:2] + run.spans[3:])
    p.tick(NOW + timedelta(seconds=6))
    (t,) = p.trajectories().values()
    assert response_ids(t) == ["chatcmpl-1", None]  # chat 2 was left out, nothing else


def test_traces_are_forgotten_after_their_retention_and_plain_ones_soon() -> None:
    run = agent_run()
    p = Pipeline()
    plain = agent_run(plain_root=True)["POST /ask"]
    p.send([plain])
    p.send(run.spans)
    assert len(p.resolver.open_traces()) == 2
    p.tick(NOW + timedelta(seconds=6))  # the END settles; the plain-only trace is forgotten
    assert p.resolver.open_traces() == [run.trace_id]
    p.tick(NOW + timedelta(seconds=119))
    assert p.resolver.open_traces() == [run.trace_id]
    p.tick(NOW + timedelta(seconds=122))
    assert p.resolver.open_traces() == [] and len(p.store) == 0


def test_a_restarted_stage_rebuilds_its_deadlines_from_the_store() -> None:
    run = agent_run()
    p = Pipeline()
    for span in run.spans:
        p.send([span])
    p.resolver = SpanResolver(limits=LIMITS, store=p.store, codec=CODEC)  # a new worker
    p.tick(NOW + timedelta(seconds=6))
    (t,) = p.trajectories().values()
    assert kinds(t) == ["LLM", "TOOL", "LLM"]


def test_same_millisecond_steps_resolved_together_keep_distinct_seqs() -> None:
    run = agent_run()
    fragments = fragment_request(export(run.spans), NOW).fragments
    (fragment,) = fragments
    steps = [s for s in fragment.spans if s.step is not None]
    for s in steps:
        assert s.step is not None
        s.step.seq = 1000  # as if they started in the same millisecond with equal tie bits
    store = MemoryStore()
    resolver = SpanResolver(limits=LIMITS, store=store, codec=CODEC)
    out = resolver.on_fragment(fragment, 0, NOW)
    emitted = [r for r in out.records(AGENT_EVENTS) if isinstance(r, Completion)]
    assert len({r.seq for r in emitted}) == 3
    assert all(r.seq >> 4 == 1000 >> 4 for r in emitted)  # still that millisecond


def test_steps_started_in_one_millisecond_are_ordered_by_their_end() -> None:
    """The tie bits come from the span ids (random): a tool span and the chat right after it,
    started in one millisecond, must not swap (as test_otlp saw with the real SDK)."""
    run = agent_run()
    (fragment,) = fragment_request(export(run.spans), NOW).fragments
    steps = [s.step for s in fragment.spans if s.step is not None]
    ended = [s.event_time for s in steps]
    assert ended == sorted(ended) and len(set(ended)) == len(ended)
    for tie, step in zip((9, 3, 1), steps, strict=True):  # tie bits against the end order
        assert step is not None
        step.seq = (500 << 4) | tie
    resolver = SpanResolver(limits=LIMITS, store=MemoryStore(), codec=CODEC)
    out = resolver.on_fragment(fragment, 0, NOW)
    emitted = [r for r in out.records(AGENT_EVENTS) if isinstance(r, Completion)]
    by_seq = sorted(emitted, key=lambda r: r.seq)
    assert [r.event_time for r in by_seq] == ended
    assert [r.seq for r in by_seq] == [500 << 4, (500 << 4) | 1, (500 << 4) | 2]


def test_the_tie_bits_are_those_of_the_ingest() -> None:
    from streams.capture import otlp
    from streams.core import spans

    assert spans.TIE_BITS == otlp._TIE_BITS


def test_bad_records_on_the_spans_topic_are_dead_letters_and_ticks_move_the_clock() -> None:
    run = agent_run()
    (fragment,) = fragment_request(export(run.spans), NOW).fragments
    resolver = SpanResolver(limits=LIMITS, store=MemoryStore(), codec=CODEC)
    wrong_key = resolver.on_record(EDGE.open("spans", 0, 1, b"other", CODEC.encode(fragment)), NOW)
    (reject,) = wrong_key.rejects
    assert "is not its trace_id" in reject.reason and reject.stage == "spans"
    step = fragment.spans[0].step
    assert step is not None
    wrong_type = resolver.on_record(EDGE.read(Source("spans", 0, 2, b"k", CODEC.encode(step))), NOW)
    assert "does not belong on spans" in wrong_type.rejects[0].reason
    garbage = resolver.on_record(EDGE.read(Source("spans", 0, 3, b"k", b"\x00garbage")), NOW)
    assert garbage.rejects and garbage.rejects[0].stage == "spans"
    ok = resolver.on_record(
        EDGE.read(Source("spans", 0, 4, fragment.trace_id.encode(), CODEC.encode(fragment))), NOW
    )
    assert len(ok.records(AGENT_EVENTS)) == 4  # START and three steps; the END waits
    tick = Tick(at=NOW + timedelta(seconds=6), source="test")
    ended = resolver.on_record(EDGE.read(Source("ticks", 0, 5, None, CODEC.encode(tick))), NOW)
    (end,) = ended.records(AGENT_EVENTS)
    assert isinstance(end, AgentCall) and end.phase is CallPhase.END
    future = Tick(at=NOW + timedelta(hours=1), source="test")
    assert resolver.on_record(EDGE.open("ticks", 0, 6, None, CODEC.encode(future)), NOW).rejects


def test_the_ingest_publishes_every_span_with_its_link_and_records() -> None:
    run = agent_run(plain_root=True, late_child=True)
    mapped = fragment_request(export(run.spans), NOW)
    (fragment,) = mapped.fragments
    assert fragment.trace_id == run.trace_id and mapped.ignored == 2  # workflow, root
    by_name = {s.name: s for s in run.spans}
    spans = {s.span_id: s for s in fragment.spans}
    assert set(spans) == {run.span_id(n) for n in by_name}
    agent = spans[run.span_id("invoke_agent planner")]
    assert agent.role == "agent" and agent.call_id == run.call_id()
    assert agent.start and agent.end and agent.parent_id == run.span_id("POST /ask")
    chat = spans[run.span_id("chat 1")]
    assert chat.role == "llm" and chat.call_id is None and chat.step is not None
    assert chat.step.kind is StepKind.LLM and chat.start and not chat.start.input_messages
    assert chat.parent_id == run.span_id("workflow plan")
    assert spans[run.span_id("workflow plan")].role == "plain"
    assert spans[run.span_id("lookup")].role == "tool"
    small = fragment_request(export(run.spans), NOW, max_bytes=2000).fragments
    assert len(small) > 1 and sum(len(f.spans) for f in small) == len(run.spans)
