"""OTLP steps across export boundaries, with the real OpenTelemetry SDK: one export per span
(``SimpleSpanProcessor`` + ``OTLPSpanExporter``), a plain intermediate span without GenAI
attributes between the agent span and its model and tool spans (the workflow, chain and task
spans of LangChain, CrewAI and the Agents SDK), and a tool span exported after its agent span.

- ``test_steps_join_their_agent_call_whatever_the_export_boundaries``: ``trajstream otlp`` and
  a worker with their default settings (``otlp.resolve = trace``: the worker's span-resolution
  stage joins the trace): one call with every step, the late audit span included, no stray
  call, and one /feedback naming exactly the chat completions the stand-in served.
- ``test_the_trace_mode_ingest_publishes_fragments_that_resolve_to_one_call``: the ingest with
  ``otlp.resolve = trace`` publishes every span to ``<p>.spans`` keyed by trace id; the
  fragments read back from the broker, run through the span-resolution stage and the assemble
  stage (in process, as a runner would), give that one call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from streams.codec import SchemaRegistry
from streams.core.spans import AGENT_EVENTS, SpanLimits, SpanResolver
from streams.core.store import MemoryStore
from streams.envelope import Edge
from streams.io.kafka import create_topics
from streams.models import AgentCall, Completion, TraceFragment, TraceHead, Trajectory, utcnow
from streams.standin import StandIn
from streams.topics import Topics
from tests.unit.core.harness import Core

from .conftest import read_topic, wait_for
from .test_otlp import otlp_process

pytestmark = pytest.mark.integration


class NestedAgent:
    """invoke_agent > workflow (plain) > chat, tool, chat; and an audit tool span that ends
    after the agent span. Each span is exported on its own, when it ends."""

    def __init__(self, endpoint: str, standin: StandIn | None = None) -> None:
        self.provider = TracerProvider(resource=Resource.create({"service.name": "nested"}))
        self.provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("nested-agent")
        self.standin = standin
        self.call_id = ""

    async def _chat(self, http: httpx.AsyncClient, n: int) -> str:
        with self.tracer.start_as_current_span(f"chat {n}") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.request.model", "standin-model")
            messages = [{"role": "user", "content": f"question {n}"}]
            span.set_attribute("gen_ai.input.messages", json.dumps(messages))
            if self.standin is not None:
                reply = await http.post(
                    f"{self.standin.url}/v1/chat/completions",
                    json={"model": "standin-model", "messages": messages},
                )
                reply_id = str(reply.json()["id"])
            else:
                reply_id = f"chatcmpl-{n}"
            span.set_attribute("gen_ai.response.id", reply_id)
            return reply_id

    async def run(
        self, before_agent_ends: Callable[[], Awaitable[None]] | None = None
    ) -> list[str]:
        """The agent's run; ``before_agent_ends`` is awaited once the workflow span (and the
        steps under it) are exported, before the agent span ends."""
        ids = []
        async with httpx.AsyncClient(timeout=10) as http:
            agent = self.tracer.start_span(
                "invoke_agent nested",
                attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "nested"},
            )
            context = agent.get_span_context()
            self.call_id = f"{context.trace_id:032x}-{context.span_id:016x}"
            with trace.use_span(agent, end_on_exit=False):
                with self.tracer.start_as_current_span("workflow plan"):  # no GenAI attributes
                    ids.append(await self._chat(http, 1))
                    with self.tracer.start_as_current_span("execute_tool lookup") as tool:
                        tool.set_attribute("gen_ai.operation.name", "execute_tool")
                        tool.set_attribute("gen_ai.tool.name", "lookup")
                    ids.append(await self._chat(http, 2))
                audit = self.tracer.start_span("execute_tool audit")  # outlives its agent span
                audit.set_attribute("gen_ai.operation.name", "execute_tool")
                audit.set_attribute("gen_ai.tool.name", "audit")
            if before_agent_ends is not None:
                await before_agent_ends()
            await asyncio.to_thread(agent.end)
            await asyncio.to_thread(audit.end)
        await asyncio.to_thread(self.provider.shutdown)
        return ids


async def test_steps_join_their_agent_call_whatever_the_export_boundaries(
    kafka_bootstrap: str, prefix: str, standin: StandIn, workers: Any, tmp_path: Path
) -> None:
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=600,
    )
    topics = Topics(prefix, 4)
    with otlp_process(kafka_bootstrap, prefix, tmp_path) as url:
        agent = NestedAgent(url, standin)
        ids = await agent.run()

    def has_call(records: list[Any]) -> bool:
        return any(isinstance(r, Trajectory) and r.call_id == agent.call_id for r in records)

    found = await read_topic(kafka_bootstrap, topics.trajectories, until=has_call, timeout=90)
    (t,) = [r for r in found if isinstance(r, Trajectory) and r.call_id == agent.call_id]
    events = [
        r
        for r in await read_topic(kafka_bootstrap, topics.agent_events)
        if isinstance(r, AgentCall | Completion)
    ]
    assert {e.call_id for e in events} == {agent.call_id}  # no stray call
    assert [s.kind.value for s in t.steps] == ["LLM", "TOOL", "LLM", "TOOL"]
    assert [s.tool_name for s in t.steps if s.tool_name] == ["lookup", "audit"]
    state = standin.state
    await wait_for(lambda: bool(state.feedback), timeout=60, what="the call's /feedback")
    assert [f.body["msg_ids"] for f in state.feedback] == [ids]


async def held_steps(bootstrap: str, changelog: str, links: int, timeout: float) -> None:
    """Until the stage's table holds a trace with ``links`` spans (read from its changelog)."""
    codec = SchemaRegistry.default()
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while changelog not in await consumer.topics():
            assert loop.time() < deadline, f"{changelog} never appeared"
            await asyncio.sleep(0.5)
        consumer.subscribe([changelog])
        while True:
            assert loop.time() < deadline, f"no trace with {links} spans in {changelog}"
            batch = await consumer.getmany(timeout_ms=500)
            for messages in batch.values():
                for m in messages:
                    if m.value is None:
                        continue
                    with contextlib.suppress(Exception):
                        head = codec.decode_as(m.value, TraceHead)
                        if len(head.links) >= links:
                            return
    finally:
        await consumer.stop()


async def test_a_worker_sigkilled_while_it_holds_a_trace_s_steps_loses_none(
    kafka_bootstrap: str, prefix: str, standin: StandIn, workers: Any, tmp_path: Path
) -> None:
    """The steps wait in the stage's table for their agent span; the worker holding them is
    SIGKILLed; its successor restores the table from its changelog, the agent span arrives, and
    the call comes out whole, once."""
    settings = {
        "TRAJSTREAM_TRINITY__URL": standin.url,
        "TRAJSTREAM_SELECTION__STRATEGY": "sampling:1",
        "TRAJSTREAM_COMMIT__INTERVAL_S": 600,
        "BROKER_SESSION_TIMEOUT": 10,  # the group drops the killed worker sooner (Faust's own)
    }
    first = workers(**settings)
    topics = Topics(prefix, 4)
    with otlp_process(kafka_bootstrap, prefix, tmp_path) as url:
        agent = NestedAgent(url, standin)

        async def kill_the_holder() -> None:
            # chat, tool, chat and the workflow span: held, their agent span not seen yet
            await held_steps(kafka_bootstrap, f"{prefix}-traces-changelog", 4, timeout=90)
            first.kill()
            second = workers(**settings)
            # the agent span is exported once the successor is up (not while it starts: on a
            # loaded machine the exporter's retries could run out before Kafka answers)
            await wait_for(
                lambda: "Worker ready" in second.log.read_text(errors="replace"),
                timeout=90,
                what="the second worker to be ready",
            )

        ids = await agent.run(before_agent_ends=kill_the_holder)

    def has_call(records: list[Any]) -> bool:
        return any(isinstance(r, Trajectory) and r.call_id == agent.call_id for r in records)

    found = await read_topic(kafka_bootstrap, topics.trajectories, until=has_call, timeout=120)
    (t,) = [r for r in found if isinstance(r, Trajectory)]
    assert t.call_id == agent.call_id
    assert [s.kind.value for s in t.steps] == ["LLM", "TOOL", "LLM", "TOOL"]
    state = standin.state
    await wait_for(lambda: bool(state.feedback), timeout=60, what="the call's /feedback")
    await asyncio.sleep(2)  # time for a second, wrong, feedback to show up
    assert [f.body["msg_ids"] for f in state.feedback] == [ids]


async def test_the_trace_mode_ingest_publishes_fragments_that_resolve_to_one_call(
    kafka_bootstrap: str, prefix: str, tmp_path: Path
) -> None:
    topics = Topics(prefix, 4)
    await create_topics(kafka_bootstrap, {topics.spans: 4})
    with otlp_process(kafka_bootstrap, prefix, tmp_path, TRAJSTREAM_OTLP__RESOLVE="trace") as url:
        agent = NestedAgent(url)
        await agent.run()
    codec = SchemaRegistry.default()
    consumer = AIOKafkaConsumer(
        topics.spans,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    fragments: list[tuple[int, int, bytes, bytes]] = []
    try:
        while len(fragments) < 6:  # one export per span: six spans, six fragments
            batch = await asyncio.wait_for(consumer.getmany(timeout_ms=500), 30)
            for messages in batch.values():
                for m in messages:
                    assert m.key is not None and m.value is not None
                    fragments.append((m.partition, m.offset, m.key, m.value))
    finally:
        await consumer.stop()
    decoded = [codec.decode_as(value, TraceFragment) for _, _, _, value in fragments]
    trace_id = agent.call_id.split("-")[0]
    assert {f.trace_id for f in decoded} == {trace_id}
    assert {key for _, _, key, _ in fragments} == {trace_id.encode()}
    assert [len(f.spans) for f in decoded] == [1] * 6
    assert len({p for p, _, _, _ in fragments}) == 1  # a trace's fragments on one partition

    resolver = SpanResolver(limits=SpanLimits(), store=MemoryStore(), codec=codec)
    core = Core()
    now = utcnow()
    for partition, offset, key, value in sorted(fragments, key=lambda f: f[1]):
        out = resolver.on_record(Edge(codec).open(topics.spans, partition, offset, key, value), now)
        for emit in out.emits:
            assert emit.topic == AGENT_EVENTS
            core.event(emit.record, now, key=emit.key)
    for emit in resolver.on_tick(fragments[0][0], now + timedelta(seconds=6)).emits:
        core.event(emit.record, now, key=emit.key)
    (t,) = core.topic("trajectories")
    assert t.call_id == agent.call_id and t.closed_reason == "ended"
    assert [s.kind.value for s in t.steps] == ["LLM", "TOOL", "LLM", "TOOL"]
    assert [s.response_id for s in t.steps if s.response_id] == ["chatcmpl-1", "chatcmpl-2"]
    assert not core.rejects()
    events = await read_topic(kafka_bootstrap, topics.agent_events)
    assert events == []  # nothing on agent-events: the stage emits the records
