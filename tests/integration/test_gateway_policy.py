"""The policy as an upstream that fails, through the gateway over real HTTP with the official
clients (``openai`` chat completions streamed and not, the OpenAI Agents SDK on the Responses
API, ``anthropic`` messages streamed and not), a real broker, the Trinity stand-in with faults
on its chat route, a production model, and (end to end) a real worker:

- every fault of the policy before its first byte (port closed, 503, 429, 408, a first byte
  too late, no answer at all, a connection dropped) is answered by production, in the API the
  client used; each step says why (``fallback``), the call stays with production (``sticky``);
- a policy stream that breaks after its first bytes is the client's error and a failed step;
- the circuit breaker opens, honours Retry-After, probes and closes, logging each change once;
- shadow mode: production answers, a failing policy only loses the shadow answers;
- end to end: the version on each step is the one the stand-in served it with, commits go on,
  no production id reaches /feedback, and every call Trinity answered is trained once.

The fault test at load (a stand-in process SIGKILLed and restarted under agents) is
``test_gateway_policy_kill.py``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web

from streams.capture.gateway import Gateway, build_gateway
from streams.devtools.standin import ChatFault, Fault
from streams.models import AgentCall, CallPhase, Completion, StepKind
from streams.settings import load_settings
from streams.standin import StandIn
from streams.topics import Topics

from .conftest import read_topic, wait_for
from .test_gateway import TOOLS
from .test_gateway_apis import (
    MESSAGES_TOOLS,
    ApiProduction,
    agents_sdk_run,
    ends,
    messages_turns,
    msg_id,
)

pytestmark = pytest.mark.integration

QUESTION = "Where is order 42?"


class Production(ApiProduction):
    """Production for all three APIs: chat completions passed through to the production
    stand-in, the Responses and Messages APIs translated to it (:class:`ApiProduction`)."""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._passthrough)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self.url

    async def _passthrough(self, request: web.Request) -> web.StreamResponse:
        data = await request.read()
        response = web.StreamResponse()
        async with aiohttp.ClientSession() as http:
            headers = {"Content-Type": "application/json"}
            async with http.post(self.chat_url, data=data, headers=headers) as r:
                response.set_status(r.status)
                response.content_type = r.content_type
                await response.prepare(request)
                async for chunk in r.content.iter_any():
                    await response.write(chunk)
        await response.write_eof()
        return response


@pytest.fixture
async def prod(production: StandIn) -> AsyncIterator[Production]:
    api = Production(f"{production.url}/v1/chat/completions")
    await api.start()
    try:
        yield api
    finally:
        await api.stop()


@contextlib.asynccontextmanager
async def policy_gateway(
    bootstrap: str, prefix: str, trinity_url: str, prod: Production, spill: Path, **gateway: Any
) -> AsyncIterator[Gateway]:
    """Every call routed to the policy; a first-byte bound a loaded machine still meets; a short
    version poll; a breaker that does not open unless the test says so."""
    strategy = gateway.pop("strategy", "sampling:1")
    settings = load_settings(
        kafka={"bootstrap_servers": bootstrap, "topic_prefix": prefix},
        trinity={"url": trinity_url},
        selection={"strategy": strategy},
        gateway={
            "production_url": f"{prod.url}/v1",
            "anthropic_url": prod.url,
            "spill_dir": str(spill),
            "flush_timeout_s": 3,
            "policy_timeout_s": 5,
            "policy_version_poll_s": 0.2,
            "breaker": {"failures": 10_000, "min_requests": 10_000},
            **gateway,
        },
    )
    gw = build_gateway(settings)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(flush_timeout=5)


# -- the clients, with the headers of each answer --------------------------------------------


async def chat_call(base_url: str, *, stream: bool) -> list[tuple[Any, str]]:
    """ask -> tool call -> its result -> answer with the openai client; each answer's headers
    and id."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="agent-key", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
    out = []
    for turn in range(2):
        raw = await client.chat.completions.with_raw_response.create(
            model="agent-model", messages=messages, tools=TOOLS, stream=stream
        )
        if stream:
            rid, calls = "", {}
            async for chunk in raw.parse():
                rid = rid or chunk.id
                for choice in chunk.choices:
                    for t in choice.delta.tool_calls or []:
                        c = calls.setdefault(t.index, {"id": "", "name": "", "arguments": ""})
                        c["id"] = t.id or c["id"]
                        c["name"] += (t.function.name or "") if t.function else ""
                        c["arguments"] += (t.function.arguments or "") if t.function else ""
            tool_calls = [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls.values()
            ]  # fmt: skip
        else:
            completion = raw.parse()
            rid = completion.id
            message = completion.choices[0].message
            tool_calls = [t.model_dump() for t in message.tool_calls or []]
        out.append((raw.headers, rid))
        if turn == 0:
            assert tool_calls and tool_calls[0]["function"]["name"] == "lookup_order"
            messages.append({"role": "assistant", "content": None, "tool_calls": tool_calls})
            messages.append(
                {"role": "tool", "tool_call_id": tool_calls[0]["id"], "content": "shipped"}
            )
    return out


async def messages_call(base_url: str) -> list[tuple[Any, str]]:
    """The same loop with the anthropic client (not streamed); each answer's headers and id."""
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="agent-key", max_retries=0)
    history: list[Any] = [{"role": "user", "content": QUESTION}]
    out = []
    for turn in range(2):
        raw = await client.messages.with_raw_response.create(
            model="agent-model", max_tokens=256, messages=history, tools=MESSAGES_TOOLS
        )
        message = await raw.parse()
        out.append((raw.headers, message.id))
        if turn == 0:
            (use,) = [b for b in message.content if b.type == "tool_use"]
            history.append({"role": "assistant", "content": [use.model_dump()]})
            history.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}],
                }
            )
    return out


async def end(gw: Gateway, call_id: str) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{gw.url}/calls/{call_id}/end", json={"status": "OK"}) as r:
            assert r.status == 202


async def scrape(gw: Gateway) -> dict[str, float]:
    """The gateway's /metrics: ``name{labels}`` -> value, for the policy's families."""
    async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/metrics") as r:
        text = await r.text()
    out = {}
    for line in text.splitlines():
        if line.startswith("trajstream_gateway_policy") or line.startswith(
            "trajstream_gateway_shadow"
        ):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def total_fallbacks(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("trajstream_gateway_policy_fallb"))


def fallbacks(metrics: dict[str, float], reason: str, api: str) -> float:
    return metrics[f'trajstream_gateway_policy_fallbacks_total{{api="{api}",reason="{reason}"}}']


def llm_steps(records: list[Any], call_id: str) -> list[Completion]:
    steps = [
        r
        for r in records
        if isinstance(r, Completion) and r.call_id == call_id and r.kind is StepKind.LLM
    ]
    return sorted(steps, key=lambda s: s.seq)


def start_of(records: list[Any], call_id: str) -> AgentCall:
    (start,) = [
        r
        for r in records
        if isinstance(r, AgentCall) and r.call_id == call_id and r.phase is CallPhase.START
    ]
    return start


# -- every fault before the first byte: production answers -----------------------------------

FAULTS: list[tuple[str, Any]] = [
    ("connect", "down"),  # Trinity's port closed
    ("status_5xx", {"mode": "error", "status": 503}),
    ("status_429", {"mode": "error", "status": 429}),
    ("status_408", {"mode": "error", "status": 408}),
    ("timeout", {"mode": "slow", "delay": 5}),  # the first byte after policy_timeout_s
    ("timeout", {"mode": "hang"}),
    ("connect", {"mode": "cut", "after": 0}),  # dropped after its headers, before a byte
]


async def test_every_fault_before_the_first_byte_is_answered_by_production_for_every_client(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: StandIn,
    prod: Production,
    tmp_path: Path,
) -> None:
    calls: dict[str, tuple[str, str]] = {}  # call id -> (reason, api)
    seen: dict[str, list[str]] = {}  # call id -> the ids its client got
    async with policy_gateway(
        kafka_bootstrap, prefix, standin.url, prod, tmp_path, policy_timeout_s=1
    ) as gw:
        for n, (reason, fault) in enumerate(FAULTS):
            if fault == "down":
                await standin.set_fault(Fault(mode="down", seconds=300))
            else:
                standin.set_chat_fault(ChatFault.from_json(fault))
            base = f"{gw.url}/calls/f{n}"
            for kind, stream in (("chat", False), ("chat-stream", True)):
                answers = await chat_call(f"{base}-{kind}/v1", stream=stream)
                calls[f"f{n}-{kind}"] = (reason, "chat")
                seen[f"f{n}-{kind}"] = [rid for _, rid in answers]
                # the client sees production and why, from its first request on
                assert [h.get("x-trajstream-upstream") for h, _ in answers] == ["production"] * 2
                assert [h.get("x-trajstream-fallback") for h, _ in answers] == [reason, "sticky"]
            answers = await messages_call(f"{base}-messages")
            assert [h.get("x-trajstream-fallback") for h, _ in answers] == [reason, "sticky"]
            calls[f"f{n}-messages"] = (reason, "messages")
            seen[f"f{n}-messages"] = [msg_id(i) for _, i in answers]
            got = await messages_turns(f"{base}-messages-stream", stream=True)
            calls[f"f{n}-messages-stream"] = (reason, "messages")
            seen[f"f{n}-messages-stream"] = [msg_id(i) for i in got]
            got = await agents_sdk_run(f"{base}-agents-sdk/v1")
            calls[f"f{n}-agents-sdk"] = (reason, "responses")
            seen[f"f{n}-agents-sdk"] = [msg_id(i) for i in got]
            for call_id in [c for c in calls if c.startswith(f"f{n}-")]:
                await end(gw, call_id)
            await standin.set_fault(Fault())
            standin.set_chat_fault(ChatFault())
        assert await gw.publisher.flush(30)
        metrics = await scrape(gw)
        health = gw.policy.health()

    production_ids = set(production.state.experiences)
    trinity_ids = set(standin.state.experiences)  # slow and cut: made, never answered
    for call_id, ids in seen.items():
        assert len(ids) == 2 and set(ids) <= production_ids, call_id
    records = await read_topic(
        kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(len(calls))
    )
    for call_id, (reason, _) in calls.items():
        assert start_of(records, call_id).attributes["trajstream.route.upstream"] == "trinity"
        steps = llm_steps(records, call_id)
        assert [s.fallback for s in steps] == [reason, "sticky"], call_id
        assert {s.upstream for s in steps} == {"production"}
        assert all(s.msg_id is None and s.policy_version is None for s in steps)
        assert all(s.error_type is None for s in steps)
        assert not {s.response_id for s in steps} & trinity_ids
    # counted by reason and API: one request of each call for its reason, one sticky
    for reason in {r for r, _ in calls.values()}:
        for api in ("chat", "responses", "messages"):
            n = sum(1 for r, a in calls.values() if (r, a) == (reason, api))
            assert fallbacks(metrics, reason, api) == n, (reason, api)
    for api in ("chat", "responses", "messages"):
        assert fallbacks(metrics, "sticky", api) == sum(1 for _, a in calls.values() if a == api)
    assert health["state"] == "closed" and health["last_error"]
    assert metrics['trajstream_gateway_policy_breaker_transitions_total{to="open"}'] == 0


# -- after the first byte: the client's error, a failed step ----------------------------------


async def test_a_policy_stream_broken_after_its_first_bytes_is_the_clients_error_and_a_failed_step(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    prod: Production,
    tmp_path: Path,
) -> None:
    standin.set_chat_fault(ChatFault(mode="cut", after=2))
    messages = [{"role": "user", "content": QUESTION}]
    async with policy_gateway(kafka_bootstrap, prefix, standin.url, prod, tmp_path) as gw:
        await wait_for(lambda: gw.policy.versions.current == 0, 10, "the policy's version")
        chat = openai.AsyncOpenAI(
            base_url=f"{gw.url}/calls/cut-chat/v1", api_key="k", max_retries=0
        )
        with pytest.raises(openai.APIError, match="broke off"):
            async for _ in await chat.chat.completions.create(
                model="agent-model", messages=messages, stream=True
            ):
                pass
        responses = openai.AsyncOpenAI(
            base_url=f"{gw.url}/calls/cut-responses/v1", api_key="k", max_retries=0
        )
        async with responses.responses.stream(model="agent-model", input=QUESTION) as s:
            events = [event async for event in s]  # the Responses API's own failure event
        assert events[-1].type == "response.failed"
        assert "broke off" in events[-1].response.error.message  # type: ignore[union-attr]
        claude = anthropic.AsyncAnthropic(
            base_url=f"{gw.url}/calls/cut-messages", api_key="k", max_retries=0
        )
        with pytest.raises(anthropic.APIStatusError, match="broke off"):
            async with claude.messages.stream(
                model="agent-model", max_tokens=64, messages=messages
            ) as s:
                await s.get_final_message()
        # not a fallback: the call's next request goes to the policy again
        standin.set_chat_fault(ChatFault())
        raw = await chat.chat.completions.with_raw_response.create(
            model="agent-model",
            messages=[*messages, {"role": "assistant", "content": "?"}, *messages],
        )
        assert raw.headers["x-trajstream-upstream"] == "trinity"
        assert raw.parse().id in standin.state.experiences
        for call_id in ("cut-chat", "cut-responses", "cut-messages"):
            await end(gw, call_id)
        assert await gw.publisher.flush(30)
        metrics = await scrape(gw)
    assert metrics["trajstream_gateway_policy_stream_errors_total"] == 3
    assert total_fallbacks(metrics) == 0

    records = await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(3))
    for call_id in ("cut-chat", "cut-responses", "cut-messages"):
        broken = llm_steps(records, call_id)[0]
        assert broken.upstream == "trinity" and broken.error_type == "stream_broken"
        assert broken.response_id in standin.state.experiences  # as far as it got
        assert broken.policy_version == 0 and broken.fallback is None
    later = llm_steps(records, "cut-chat")[1]
    assert later.error_type is None and later.upstream == "trinity"


# -- the circuit breaker ----------------------------------------------------------------------


async def test_the_breaker_opens_honours_retry_after_probes_and_closes_logging_each_change_once(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    prod: Production,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cool-downs pass on the breaker's own clock (its injected clock, moved on by the
    test), so that a slow machine cannot end one in the middle of a step."""
    caplog.set_level(logging.WARNING, logger="streams.capture.gateway.policy")
    breaker = {"failures": 3, "cooldown_s": 30, "probes": 2, "min_requests": 1000}
    async with policy_gateway(
        kafka_bootstrap, prefix, standin.url, prod, tmp_path, breaker=breaker
    ) as gw:
        later = [0.0]
        gw.policy.breaker.clock = lambda: time.monotonic() + later[0]

        async def ask(n: int) -> tuple[str, str | None]:
            client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)
            raw = await client.chat.completions.with_raw_response.create(
                model="m", messages=[{"role": "user", "content": f"question {n}"}]
            )
            return raw.headers["x-trajstream-upstream"], raw.headers.get("x-trajstream-fallback")

        # failures open it; then no request reaches Trinity
        standin.set_chat_fault(ChatFault(mode="error", status=500))
        assert [await ask(n) for n in range(3)] == [("production", "status_5xx")] * 3
        assert gw.policy.breaker.state == "open"
        faulted = standin.state.chat_faulted
        assert [await ask(n) for n in range(5)] == [("production", "breaker_open")] * 5
        assert standin.state.chat_faulted == faulted
        async with aiohttp.ClientSession() as http, http.get(f"{gw.url}/healthz") as r:
            health = await r.json()
        assert health["status"] == "ok"  # production still serves
        assert health["policy"]["state"] == "open"
        assert "3 consecutive failures" in health["policy"]["why"]
        assert "Trinity answered 500" in health["policy"]["last_error"]
        assert health["policy"]["fallbacks"] == {"status_5xx": 3, "breaker_open": 5}

        # after the cool-down, probes; two answered close it
        standin.set_chat_fault(ChatFault())
        later[0] += 30
        assert gw.policy.available
        assert [await ask(n) for n in range(3)] == [("trinity", None)] * 3
        assert gw.policy.breaker.state == "closed"

        # Retry-After: open at the first such failure, for at least that long
        standin.set_chat_fault(ChatFault(mode="error", status=503, retry_after="60", count=1))
        assert await ask(0) == ("production", "status_5xx")
        b = gw.policy.breaker
        assert b.state == "open" and b.open_until - b.since == pytest.approx(60, abs=0.01)
        later[0] += 30  # the cool-down (30 s) is over, the Retry-After (60 s) not
        assert await ask(1) == ("production", "breaker_open")
        later[0] += 30
        assert [await ask(n) for n in range(2)] == [("trinity", None)] * 2
        assert gw.policy.breaker.state == "closed"
        metrics = await scrape(gw)

    moves = {
        to: metrics[f'trajstream_gateway_policy_breaker_transitions_total{{to="{to}"}}']
        for to in ("open", "half_open", "closed")
    }
    assert moves == {"open": 2, "half_open": 2, "closed": 2}
    assert metrics['trajstream_gateway_policy_breaker_state{state="closed"}'] == 1
    lines = [r.getMessage() for r in caplog.records if "circuit breaker" in r.getMessage()]
    assert len(lines) == 6, lines  # one per change, none per request
    assert [re.search(r"breaker (\w+)", line)[1] for line in lines] == [  # type: ignore[index]
        "open", "half", "closed", "open", "half", "closed"
    ]  # fmt: skip


# -- shadow mode ------------------------------------------------------------------------------


async def test_shadow_mode_answers_from_production_and_a_failing_policy_loses_only_its_answers(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: StandIn,
    prod: Production,
    tmp_path: Path,
) -> None:
    standin.set_chat_fault(ChatFault(mode="hang"))  # bounded by policy_timeout_s, not timeout_s
    async with policy_gateway(
        kafka_bootstrap, prefix, standin.url, prod, tmp_path, mode="shadow", policy_timeout_s=1.5
    ) as gw:
        for n, stream in enumerate((False, True)):
            answers = await chat_call(f"{gw.url}/calls/s{n}/v1", stream=stream)
            assert [h.get("x-trajstream-upstream") for h, _ in answers] == ["production"] * 2
            assert all("x-trajstream-fallback" not in h for h, _ in answers)
            await end(gw, f"s{n}")  # waits for the shadow answers: at most policy_timeout_s
        standin.set_chat_fault(ChatFault())
        answers = await chat_call(f"{gw.url}/calls/s-ok/v1", stream=False)
        await end(gw, "s-ok")
        assert await gw.publisher.flush(30)
        metrics = await scrape(gw)
    assert metrics["trajstream_gateway_shadow_failures_total"] == 4
    assert total_fallbacks(metrics) == 0
    records = await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(3))
    for call_id in ("s0", "s1"):
        steps = llm_steps(records, call_id)
        assert len(steps) == 2 and {s.upstream for s in steps} == {"production"}
        assert all(s.shadow_response_id is None and s.fallback is None for s in steps)
        assert {s.response_id for s in steps} <= set(production.state.experiences)
    healthy = llm_steps(records, "s-ok")
    assert all(s.shadow_response_id in standin.state.experiences for s in healthy)


# -- end to end: versions, commits, feedback --------------------------------------------------


async def test_steps_carry_the_version_that_served_them_and_only_trinitys_ids_are_trained(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: StandIn,
    prod: Production,
    workers: Any,
    tmp_path: Path,
) -> None:
    """Each phase's four calls are trained by one commit (min_batch 4) that advances the
    stand-in's version (every commit: sync_interval 1); the next phase starts once the gateway
    has read it, so every step's version is known: the stand-in's when it served it."""
    standin.sync_interval = 1
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=1,
        TRAJSTREAM_COMMIT__MIN_BATCH=4,
    )
    served: dict[str, list[str]] = {}  # call id -> the Trinity ids its client got
    state = standin.state
    async with policy_gateway(kafka_bootstrap, prefix, standin.url, prod, tmp_path) as gw:
        for phase in range(3):
            await wait_for(
                lambda v=phase: gw.policy.versions.current == v == state.model_version,
                30,
                f"the gateway to read version {phase}",
            )
            for kind in ("chat", "chat-stream", "messages", "agents-sdk"):
                call_id = f"v{phase}-{kind}"
                base = f"{gw.url}/calls/{call_id}"
                if kind.startswith("chat"):
                    answers = await chat_call(f"{base}/v1", stream="stream" in kind)
                    got = [rid for _, rid in answers]
                elif kind == "messages":
                    got = [msg_id(i) for _, i in await messages_call(base)]
                else:
                    got = [msg_id(i) for i in await agents_sdk_run(f"{base}/v1")]
                served[call_id] = got
                await end(gw, call_id)
            # its four calls trained by one commit, which moves the version
            wanted = {i for c, ids in served.items() if c.startswith(f"v{phase}-") for i in ids}
            await wait_for(lambda w=wanted: w <= set(state.trained), 90, "the phase trained")
        await wait_for(
            lambda: gw.policy.versions.current == 3 == state.model_version,
            30,
            "the gateway to read version 3",
        )
        # the policy fails: production answers whole calls, and a call Trinity began
        standin.set_chat_fault(ChatFault(mode="error", status=503))
        fell = [rid for _, rid in await chat_call(f"{gw.url}/calls/fb/v1", stream=False)]
        standin.set_chat_fault(ChatFault())
        client = openai.AsyncOpenAI(
            base_url=f"{gw.url}/calls/mixed/v1", api_key="k", max_retries=0
        )
        history: list[Any] = [{"role": "user", "content": QUESTION}]
        first = await client.chat.completions.create(model="m", messages=history)
        standin.set_chat_fault(ChatFault(mode="error", status=503))
        history += [{"role": "assistant", "content": first.choices[0].message.content}]
        history += [{"role": "user", "content": "and order 43?"}]
        second = await client.chat.completions.with_raw_response.create(
            model="m", messages=history
        )
        assert second.headers["x-trajstream-fallback"] == "status_5xx"
        standin.set_chat_fault(ChatFault())
        for call_id in ("fb", "mixed"):
            await end(gw, call_id)
        assert await gw.publisher.flush(30)

    records = await read_topic(
        kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(len(served) + 2)
    )
    for call_id, ids in served.items():
        steps = llm_steps(records, call_id)
        assert [s.response_id for s in steps] == ids and {s.upstream for s in steps} == {"trinity"}
        # the version each step carries is the one the stand-in served it with
        assert [s.policy_version for s in steps] == [
            state.experiences[i].model_version for i in ids
        ], call_id
        assert {s.policy_version for s in steps} == {int(call_id[1])}
        assert all(s.fallback is None and s.error_type is None for s in steps)
    assert [s.fallback for s in llm_steps(records, "fb")] == ["status_5xx", "sticky"]
    assert set(fell) <= set(production.state.experiences)
    mixed = llm_steps(records, "mixed")
    assert [(s.upstream, s.fallback, s.policy_version) for s in mixed] == [
        ("trinity", None, 3),
        ("production", "status_5xx", None),
    ]
    # commits went on; every call Trinity answered whole was trained once; no production id
    # was ever fed back
    trinity_ids = {i for ids in served.values() for i in ids}
    await wait_for(lambda: trinity_ids <= set(state.trained), 90, "every policy call trained")
    assert len(state.trained) == len(set(state.trained))
    assert state.explore_step == 3 and all(c.status == 200 for c in state.commits)
    fed = [i for f in state.feedback for i in f.body["msg_ids"]]
    assert not set(fed) & set(production.state.experiences)
    assert all(state.experiences[i].rewarded for i in trinity_ids)
