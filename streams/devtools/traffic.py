"""Simulated agent traffic, for the demo, the tests and the benchmark.

Each simulated call is a real multi-step agent run: its LLM steps are served by a
Trinity-compatible chat endpoint (so their response ids are msg_ids Trinity knows), its tool
steps are invented, and it is published with the SDK exactly as an agent in production would.

May import: anything in the package; a dev tool, never imported by the product.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ..capture.sdk import TrajstreamProducer
from ..io.trinity import TrinityClient
from ..models import CallStatus, ChatMessage, TrainingMark, utcnow

__all__ = ["AGENTS", "SimulatedCall", "simulate_call"]

AGENTS = {
    "support-bot": ("qwen2.5-7b-instruct", ["lookup_order", "refund"]),
    "research-agent": ("qwen2.5-14b-instruct", ["web_search", "read_page"]),
    "code-helper": ("qwen2.5-coder-7b", ["run_tests", "read_file"]),
    "travel-planner": ("llama-3.1-8b-instruct", ["search_flights", "book_hotel"]),
}

QUESTIONS = [
    "Where is my order #{n}?",
    "Summarise the latest paper on topic {n}.",
    "Why does test {n} fail?",
    "Plan a weekend trip for {n} people.",
    "Can I get a refund for item {n}?",
]


class _Failed(Exception):
    """The simulated agent run failed (status ERROR)."""


@dataclass
class SimulatedCall:
    call_id: str
    agent: str
    model: str
    msg_ids: list[str] = field(default_factory=list)
    status: CallStatus = CallStatus.OK
    marked: bool = False
    task_id: str | None = None
    rating: float | None = None


async def simulate_call(
    producer: TrajstreamProducer,
    trinity: TrinityClient,
    rng: random.Random,
    *,
    agent: str,
    mark: bool = False,
    fail: bool = False,
    rating: float | None = None,
    llm_steps: int | None = None,
) -> SimulatedCall:
    """Run one agent call against ``trinity``'s chat endpoint and publish all its events."""
    model, tools = AGENTS.get(agent, ("standin-model", ["tool"]))
    question = rng.choice(QUESTIONS).format(n=rng.randint(1, 9999))
    steps = llm_steps if llm_steps is not None else rng.randint(1, 3)
    task_id = f"{agent}-task-{rng.randint(1, 20)}" if mark else None
    training_mark = (
        TrainingMark(
            labels=["demo", agent], metadata={"source": "demo"}, task_id=task_id, marked_at=utcnow()
        )
        if mark
        else None
    )
    sim = SimulatedCall(call_id="", agent=agent, model=model, marked=mark, task_id=task_id)
    messages = [
        {"role": "system", "content": f"You are {agent}."},
        {"role": "user", "content": question},
    ]
    try:
        async with producer.call(
            agent_name=agent,
            agent_id=f"{agent}-1",
            agent_version="1.0",
            conversation_id=f"conv-{rng.randint(1, 50)}",
            input_messages=[ChatMessage(role="user", content=question)],
            mark=training_mark,
        ) as call:
            sim.call_id = call.call_id
            for i in range(steps):
                reply = await trinity.chat({"model": model, "messages": messages})
                text = reply["choices"][0]["message"]["content"]
                tool = rng.choice(tools) if i < steps - 1 else None
                await call.completion(
                    response_id=reply["id"],
                    provider_name="trinity",
                    request_model=model,
                    response_model=reply.get("model", model),
                    finish_reasons=["tool_calls" if tool else "stop"],
                    input_tokens=reply.get("usage", {}).get("prompt_tokens"),
                    output_tokens=reply.get("usage", {}).get("completion_tokens"),
                    output_messages=[ChatMessage(role="assistant", content=text)],
                    tool_calls=[tool] if tool else [],
                    latency_ms=rng.uniform(50, 900),
                )
                sim.msg_ids.append(reply["id"])
                messages.append({"role": "assistant", "content": text})
                if tool:
                    result = f"{tool} result {rng.randint(1, 100)}"
                    await call.tool(tool, output=result, latency_ms=rng.uniform(5, 200))
                    messages.append({"role": "tool", "content": result})
            if fail:
                raise _Failed(agent)
            call.output = messages[-1]["content"]
    except _Failed:
        sim.status = CallStatus.ERROR
    if rating is not None:
        await producer.feedback(sim.call_id, rating=rating)
        sim.rating = rating
    return sim
