"""The ``openai`` client wrapper: the official sync and async clients against stand-ins as both
upstreams, routed by the gateway's decision, recorded on a real broker as the gateway records."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from streams.capture.openai_wrapper import TrajstreamCapture
from streams.models import AgentCall, CallPhase, Completion, StepKind
from streams.select import sample_point

from .conftest import read_topic
from .test_gateway import TOOLS, complete

pytestmark = pytest.mark.integration


def ids(rate: float) -> tuple[str, str]:
    """A call id the rate selects and one it does not."""
    chosen = next(f"w{i}" for i in range(1000) if sample_point(f"w{i}") < rate)
    other = next(f"w{i}" for i in range(1000) if sample_point(f"w{i}") >= rate)
    return chosen, other


async def test_wrapped_clients_route_by_the_decision_and_record_the_steps(
    kafka_bootstrap,
    prefix,
    standin,
    production,
    tmp_path,
):
    selected, other = ids(0.5)
    capture = await asyncio.to_thread(
        TrajstreamCapture,
        kafka_bootstrap,
        strategy="sampling:0.5",
        topic_prefix=prefix,
        partitions=2,
        spill_dir=tmp_path / "spill",
    )

    def sync_agent() -> list[Any]:
        trinity = openai.OpenAI(base_url=f"{standin.url}/v1", api_key="x", max_retries=0)
        prod = openai.OpenAI(base_url=f"{production.url}/v1", api_key="x", max_retries=0)
        with capture.call(call_id=selected, agent_name="wrapped") as call:
            client = call.wrap(prod, trinity)
            messages: list[Any] = [{"role": "user", "content": "Where is order 42?"}]
            first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            tool_call = first.choices[0].message.tool_calls[0]
            messages += [
                first.choices[0].message,
                {"role": "tool", "tool_call_id": tool_call.id, "content": "shipped"},
            ]
            second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            call.output = second.choices[0].message.content
        return [first, second]

    sync_answers = await asyncio.to_thread(sync_agent)

    trinity = openai.AsyncOpenAI(base_url=f"{standin.url}/v1", api_key="x", max_retries=0)
    prod = openai.AsyncOpenAI(base_url=f"{production.url}/v1", api_key="x", max_retries=0)
    async with capture.call(call_id=other) as call:
        client = call.wrap(prod, trinity)
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text, rid = "", None
        async for chunk in stream:
            rid = rid or chunk.id
            text += "".join(c.delta.content or "" for c in chunk.choices)
    assert await asyncio.to_thread(capture.flush, 20)
    await asyncio.to_thread(capture.close)

    assert {a.id for a in sync_answers} == set(standin.state.experiences)  # selected: Trinity
    assert set(production.state.experiences) == {rid}
    records = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=complete({selected, other})
    )
    mine = [r for r in records if isinstance(r, AgentCall | Completion) and r.call_id == selected]
    start, *steps, end = mine
    assert (
        start.phase is CallPhase.START
        and start.attributes["trajstream.route.upstream"] == "trinity"
    )
    assert [(s.seq, s.kind) for s in steps] == [
        (1, StepKind.LLM),
        (2, StepKind.TOOL),
        (3, StepKind.LLM),
    ]
    assert [steps[0].response_id, steps[2].response_id] == [a.id for a in sync_answers]
    assert steps[0].tool_call_details[0].id == steps[1].tool_call_id
    assert end.step_count == 3 and end.output == sync_answers[1].choices[0].message.content
    streamed = [r for r in records if isinstance(r, Completion) and r.call_id == other]
    assert [(s.response_id, s.output_messages[0].content, s.upstream) for s in streamed] == [
        (rid, text, "production")
    ]
