"""OTLP ingest end to end: an agent traced with the real OpenTelemetry SDK and its OTLP/HTTP
exporters (protobuf, and JSON) -> ``trajstream otlp`` (a real process) -> the real broker ->
a real worker -> the Trinity stand-in.

The chat spans carry the ids of chat completions the stand-in really served, so the one
/feedback of each call must name exactly those msg_ids, in step order. Exports are split
(children flushed before their agent span), one is sent twice, the whole trace again after the
call closed; a malformed body is answered 400 and spans without GenAI attributes publish
nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.exporter.otlp.json.http.trace_exporter import (
    OTLPSpanExporter as JsonSpanExporter,
)
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streams.models import AgentCall, Completion, DeadLetter, Trajectory
from streams.standin import StandIn
from streams.topics import Topics

from .conftest import REPO_ROOT, read_topic, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def otlp_url(kafka_bootstrap: str, prefix: str, tmp_path: Path) -> Iterator[str]:
    """``trajstream otlp`` as a process, on a free port, mapping per export (``otlp.resolve =
    export``: a trace sent again after its call closed is recorded as late); its URL. The
    default, ``trace``, is tested in ``test_otlp_spans``."""
    with otlp_process(kafka_bootstrap, prefix, tmp_path, TRAJSTREAM_OTLP__RESOLVE="export") as url:
        yield url


@contextmanager
def otlp_process(bootstrap: str, prefix: str, tmp_path: Path, **settings: str) -> Iterator[str]:
    """``trajstream otlp`` with these settings (``TRAJSTREAM_...`` variables), until the block
    ends; its URL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAJSTREAM_")}
    env.update(
        TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        TRAJSTREAM_KAFKA__TOPIC_PREFIX=prefix,
        PYTHONUNBUFFERED="1",
        **settings,
    )
    out, log = tmp_path / "otlp.out", tmp_path / "otlp.log"
    with out.open("wb") as stdout, log.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streams.cli", "otlp", "--port", "0"],
            env=env,
            stdout=stdout,
            stderr=stderr,
            cwd=REPO_ROOT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while "/v1/traces" not in out.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"trajstream otlp did not start:\n{log.read_text()}")
            time.sleep(0.1)
        yield out.read_text().strip().splitlines()[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # a graceful stop: exit 0 at once
            try:
                assert proc.wait(15) == 0, log.read_text()[-2000:]
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


class Agent:
    """A tiny agent: chat (asks for a tool), the tool, chat (answers); traced with the SDK."""

    def __init__(self, exporter: SpanExporter, standin: StandIn, name: str):
        self.provider = TracerProvider(resource=Resource.create({"service.name": name}))
        self.provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60000))
        self.memory = InMemorySpanExporter()
        self.provider.add_span_processor(SimpleSpanProcessor(self.memory))
        self.tracer = self.provider.get_tracer("test-agent")
        self.standin = standin
        self.name = name

    async def chat(self, http: httpx.AsyncClient, messages: list[dict[str, Any]]) -> str:
        with self.tracer.start_as_current_span("chat standin-model") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.provider.name", "openai")
            span.set_attribute("gen_ai.request.model", "standin-model")
            span.set_attribute("gen_ai.input.messages", json.dumps(messages))
            reply = (
                await http.post(
                    f"{self.standin.url}/v1/chat/completions",
                    json={"model": "standin-model", "messages": messages},
                )
            ).json()
            span.set_attribute("gen_ai.response.id", reply["id"])
            span.set_attribute("gen_ai.response.model", reply["model"])
            span.set_attribute("gen_ai.usage.input_tokens", reply["usage"]["prompt_tokens"])
            span.set_attribute("gen_ai.usage.output_tokens", reply["usage"]["completion_tokens"])
            span.set_attribute(
                "gen_ai.output.messages",
                json.dumps(
                    [{"role": "assistant", "content": reply["choices"][0]["message"]["content"]}]
                ),
            )
            return str(reply["id"])

    async def run(self, question: str) -> list[str]:
        """One call; the chat span before the tool is exported on its own (a split export)."""
        ids = []
        async with httpx.AsyncClient(timeout=10) as http:
            with self.tracer.start_as_current_span(f"invoke_agent {self.name}") as agent:
                agent.set_attribute("gen_ai.operation.name", "invoke_agent")
                agent.set_attribute("gen_ai.agent.name", self.name)
                agent.set_attribute("gen_ai.conversation.id", f"conv-{self.name}")
                messages = [{"role": "user", "content": question}]
                ids.append(await self.chat(http, messages))
                await asyncio.to_thread(self.provider.force_flush)  # export 1: the first chat
                with self.tracer.start_as_current_span("execute_tool lookup") as tool:
                    tool.set_attribute("gen_ai.operation.name", "execute_tool")
                    tool.set_attribute("gen_ai.tool.name", "lookup")
                    tool.set_attribute("gen_ai.tool.call.id", "call_1")
                    tool.set_attribute("gen_ai.tool.call.result", "shipped")
                messages.append({"role": "tool", "content": "shipped"})
                ids.append(await self.chat(http, messages))
            with self.tracer.start_as_current_span("GET /health") as plain:  # no GenAI attributes
                plain.set_attribute("http.route", "/health")
        await asyncio.to_thread(self.provider.force_flush)  # export 2: tool, chat, agent, plain
        return ids

    def finished(self) -> list[ReadableSpan]:
        return list(self.memory.get_finished_spans())


async def test_traced_agents_become_trajectories_and_one_feedback_each(
    kafka_bootstrap: str, prefix: str, standin: StandIn, workers: Any, otlp_url: str
) -> None:
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=600,
    )
    proto = Agent(
        OTLPSpanExporter(endpoint=otlp_url, compression=Compression.Gzip), standin, "pb-agent"
    )
    js = Agent(JsonSpanExporter(endpoint=otlp_url), standin, "json-agent")
    pb_ids = await proto.run("Where is my order?")
    js_ids = await js.run("Where is my parcel?")

    # an exporter's retry of the first export, then the whole trace again
    first_chat = [
        s for s in proto.finished() if s.attributes.get("gen_ai.response.id") == pb_ids[0]
    ]
    again = OTLPSpanExporter(endpoint=otlp_url)
    assert (await asyncio.to_thread(again.export, first_chat)).name == "SUCCESS"
    assert (await asyncio.to_thread(again.export, proto.finished())).name == "SUCCESS"
    again.shutdown()

    async with httpx.AsyncClient(timeout=10) as http:
        bad = await http.post(
            otlp_url,
            content=b"\x0a\xff\xff\xff\xff\x0f",
            headers={"Content-Type": "application/x-protobuf"},
        )
        assert bad.status_code == 400 and b"not a protobuf" in bad.content
        unsupported = await http.post(
            otlp_url, content=b"{}", headers={"Content-Type": "text/plain"}
        )
        assert unsupported.status_code == 415

    state = standin.state
    wanted = {tuple(pb_ids), tuple(js_ids)}

    def fed_back() -> set[tuple[str, ...]]:
        return {tuple(f.body["msg_ids"]) for f in state.feedback if f.status == 200}

    await wait_for(lambda: fed_back() >= wanted, timeout=60, what="a /feedback for each agent call")
    await asyncio.sleep(2)  # time for a second, wrong, feedback to show up
    bodies = [f.body for f in state.feedback]
    assert sorted(tuple(b["msg_ids"]) for b in bodies) == sorted(wanted)
    assert all(b["reward"] == 1.0 for b in bodies)

    topics = Topics(prefix, 4)
    trajectories = [
        r
        for r in await read_topic(kafka_bootstrap, topics.trajectories)
        if isinstance(r, Trajectory)
    ]
    assert sorted(t.agent_name or "" for t in trajectories) == ["json-agent", "pb-agent"]
    for t in trajectories:
        assert [s.kind.value for s in t.steps] == ["LLM", "TOOL", "LLM"]
        assert t.closed_reason == "ended" and t.conversation_id == f"conv-{t.agent_name}"
        assert t.steps[1].tool_name == "lookup"
    events = [
        r
        for r in await read_topic(kafka_bootstrap, topics.agent_events)
        if isinstance(r, AgentCall | Completion)
    ]
    assert {e.call_id for e in events} == {t.call_id for t in trajectories}  # GET /health: nothing
    late = [
        r
        for r in await read_topic(kafka_bootstrap, topics.late_events)
        if isinstance(r, DeadLetter)
    ]
    assert late  # the trace sent again after its call closed: recorded as late, not applied


async def test_the_gateway_takes_otlp_spans_too(
    kafka_bootstrap: str, prefix: str, standin: StandIn, tmp_path: Path
) -> None:
    """``POST /v1/traces`` on the gateway: the same mapping, through its durable buffer."""
    from streams.capture.gateway import build_gateway
    from streams.settings import load_settings

    settings = load_settings(
        kafka={"bootstrap_servers": kafka_bootstrap, "topic_prefix": prefix},
        trinity={"url": standin.url},
        gateway={"production_url": f"{standin.url}/v1", "spill_dir": str(tmp_path / "spill")},
    )
    gateway = build_gateway(settings)
    url = await gateway.start("127.0.0.1", 0)
    try:
        agent = Agent(OTLPSpanExporter(endpoint=f"{url}/v1/traces"), standin, "gw-agent")
        ids = await agent.run("Where is my order?")
        assert await gateway.publisher.flush(30)
    finally:
        await gateway.stop()
    events = [
        r
        for r in await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events)
        if isinstance(r, AgentCall | Completion)
    ]
    steps = sorted((e for e in events if isinstance(e, Completion)), key=lambda e: e.seq)
    assert [s.response_id for s in steps if s.response_id] == ids
    assert {e.call_id for e in events} == {steps[0].call_id}
