"""Simulated agent traffic, for the demo, the tests and the benchmark.

Each simulated call is a real multi-step agent run: its LLM steps are served by a
Trinity-compatible chat endpoint (so their response ids are msg_ids Trinity knows), its tool
steps are invented, and it is published with the SDK exactly as an agent in production would
(:func:`simulate_call`), or it is an agent behind the gateway (:func:`simulate_gateway_call`):
the official ``openai`` client with its base URL set to the gateway, tools offered to the model,
the tool's result sent back, ``/end`` and ``/feedback`` over HTTP; the gateway routes and records.

May import: anything in the package; a dev tool, never imported by the product.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..capture.sdk import TrajstreamProducer
from ..io.trinity import TrinityClient
from ..models import CallStatus, ChatMessage, TrainingMark, utcnow

__all__ = ["AGENTS", "SimulatedCall", "simulate_call", "simulate_gateway_call"]

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
    upstream: str = "trinity"
    """Who answered: trinity or production (behind the gateway)."""
    events: int | None = None
    """Events the call produced, when not the SDK's 2 + 2 x LLM steps - 1."""


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


async def simulate_gateway_call(
    gateway_url: str,
    http: httpx.AsyncClient,
    rng: random.Random,
    *,
    agent: str,
    mark: bool = False,
    fail: bool | Callable[[str], bool] = False,
    rating: float | None = None,
) -> SimulatedCall:
    """One agent run behind the gateway, with the official ``openai`` async client.

    ``fail`` may be decided by the upstream that answered (``trinity`` or ``production``: a
    callable), for a scripted difference between the policy and production.

    One to three LLM steps; with two or more, the model is offered the agent's tools, calls one,
    gets its result and answers (the stand-in answers a tool offer with a tool call).
    """
    import openai

    model, tools = AGENTS.get(agent, ("standin-model", ["tool"]))
    question = rng.choice(QUESTIONS).format(n=rng.randint(1, 9999))
    steps = rng.randint(1, 3)
    task_id = f"{agent}-task-{rng.randint(1, 20)}" if mark else None
    call_id = uuid.UUID(int=rng.getrandbits(128)).hex
    headers = {
        "X-Trajstream-Agent-Name": agent,
        "X-Trajstream-Agent-Id": f"{agent}-1",
        "X-Trajstream-Agent-Version": "1.0",
        "X-Trajstream-Conversation-Id": f"conv-{rng.randint(1, 50)}",
    }
    if mark:
        headers["X-Trajstream-Mark"] = json.dumps(
            {"labels": ["demo", agent], "metadata": {"source": "demo"}, "task_id": task_id}
        )
    sim = SimulatedCall(call_id=call_id, agent=agent, model=model, marked=mark, task_id=task_id)
    client = openai.AsyncOpenAI(
        base_url=f"{gateway_url}/calls/{call_id}/v1",
        api_key="unused",
        default_headers=headers,
        http_client=http,
        max_retries=0,
    )
    tool_specs: list[Any] = [
        {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
        for name in tools
    ]
    messages: list[Any] = [
        {"role": "system", "content": f"You are {agent}."},
        {"role": "user", "content": question},
    ]
    text = ""
    for i in range(steps):
        offer = steps >= 2 and i < 2
        kwargs: dict[str, Any] = {"tools": tool_specs} if offer else {}
        raw = await client.chat.completions.with_raw_response.create(
            model=model, messages=messages, **kwargs
        )
        reply = raw.parse()
        sim.upstream = raw.headers.get("x-trajstream-upstream", sim.upstream)
        sim.msg_ids.append(reply.id)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            result = f"{call.function.name} result {rng.randint(1, 100)}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        text = message.content or text
        if i == 1 and steps == 3:
            messages.append({"role": "user", "content": "Anything else I should know?"})
    tool_steps = sum(1 for m in messages if m["role"] == "tool")
    if callable(fail):
        fail = fail(sim.upstream)
    status = CallStatus.ERROR if fail else CallStatus.OK
    body: dict[str, Any] = {"status": status.value, "output": text}
    if fail:
        body["error_type"] = "_Failed"
    (
        await http.post(f"{gateway_url}/calls/{call_id}/end", json=body, headers=headers)
    ).raise_for_status()
    sim.status = status
    sim.events = 2 + steps + tool_steps
    if rating is not None:
        r = await http.post(f"{gateway_url}/calls/{call_id}/feedback", json={"rating": rating})
        r.raise_for_status()
        sim.rating = rating
        sim.events += 1
    return sim
