"""The gateway's Responses API and Messages API routes over real HTTP, driven by the official
``openai`` client (``responses.create``, streamed and not, with a function tool), the official
``anthropic`` client (``messages.create`` and ``messages.stream``, with a tool) and a real
OpenAI Agents SDK agent (``Agent``, a ``function_tool``, ``Runner.run``) whose only change is
its client's base URL; a real broker, the Trinity stand-in, and (route mode) a real worker.

- route mode, every call selected: each call is answered by Trinity through the translation
  to chat completions, becomes one trajectory with every model call and tool result, and
  Trinity's ``/feedback`` carries exactly the msg_ids Trinity served (the ids inside the
  ``resp_...`` / ``msg_...`` ids the clients got);
- record only (nothing selected) and shadow mode: production answers, in the API's own JSON and
  events (a small aiohttp server speaking both APIs, :class:`ApiProduction`) and its answer is
  the step; shadow mode adds Trinity's answer to the translated request beside it (its id the
  msg_id), record only nothing of Trinity; the
  ``anthropic-version`` header and the configured key reach Anthropic's side.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web

from streams.capture.apis import (
    ChatToMessagesStream,
    ChatToResponsesStream,
    chat_to_message,
    chat_to_response,
)
from streams.capture.apis import messages as messages_api
from streams.capture.apis import responses as responses_api
from streams.capture.gateway import Gateway, build_gateway
from streams.models import AgentCall, CallPhase, Completion, StepKind, Trajectory
from streams.settings import load_settings
from streams.standin import StandIn
from streams.topics import Topics

from .conftest import read_topic, wait_for

pytestmark = pytest.mark.integration

RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "lookup_order",
        "description": "Find an order",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    }
]
MESSAGES_TOOLS: list[Any] = [
    {
        "name": "lookup_order",
        "description": "Find an order",
        "input_schema": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    }
]


class ApiProduction:
    """A production upstream speaking the Responses and Messages APIs: each request translated
    to the production stand-in's chat completions and its answer told back (JSON or events).
    It keeps the headers it got."""

    def __init__(self, chat_url: str) -> None:
        self.chat_url = chat_url
        self.headers: list[dict[str, str]] = []
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        parsed = responses_api.parse_request(await request.json())
        if parsed.stream:
            return await self._stream(request, parsed.chat, ChatToResponsesStream(parsed))
        completion = await self._chat(parsed.chat)
        return web.json_response(chat_to_response(completion, parsed))

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        parsed = messages_api.parse_request(await request.json())
        if parsed.stream:
            return await self._stream(request, parsed.chat, ChatToMessagesStream(parsed))
        completion = await self._chat(parsed.chat)
        return web.json_response(chat_to_message(completion, parsed))

    async def _chat(self, body: Any) -> dict[str, Any]:
        async with aiohttp.ClientSession() as http, http.post(self.chat_url, json=body) as r:
            data: dict[str, Any] = await r.json()
            return data

    async def _stream(self, request: web.Request, body: Any, told: Any) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async with aiohttp.ClientSession() as http, http.post(self.chat_url, json=body) as r:
            async for chunk in r.content.iter_any():
                await response.write(told.feed(chunk))
        await response.write(told.finish())
        await response.write_eof()
        return response


@pytest.fixture
async def production() -> AsyncIterator[tuple[StandIn, ApiProduction]]:
    chat = StandIn(model="production-model")
    await chat.start("127.0.0.1", 0)
    api = ApiProduction(f"{chat.url}/v1/chat/completions")
    await api.start()
    try:
        yield chat, api
    finally:
        await api.stop()
        await chat.stop()


@contextlib.asynccontextmanager
async def running_gateway(
    bootstrap: str, prefix: str, trinity_url: str, production_url: str, spill: Path, **extra: Any
) -> AsyncIterator[Gateway]:
    strategy = extra.pop("strategy", "sampling:1")
    settings = load_settings(
        kafka={"bootstrap_servers": bootstrap, "topic_prefix": prefix},
        trinity={"url": trinity_url},
        selection={"strategy": strategy},
        gateway={
            "production_url": f"{production_url}/v1",
            "production_api_key": "sk-test-secret",
            "anthropic_url": production_url,
            "anthropic_api_key": "sk-ant-test-secret",
            "spill_dir": str(spill),
            "flush_timeout_s": 3,
            **extra,
        },
    )
    gw = build_gateway(settings)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(flush_timeout=5)


async def end(gw: Gateway, call_id: str, key: str | None = None) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(f"{gw.url}/calls/{call_id}/end", json={"status": "OK"}) as r:
            assert r.status == 202


# -- the clients ------------------------------------------------------------------------------


async def responses_turns(base_url: str, *, stream: bool) -> list[str]:
    """ask -> function_call -> its output (by previous_response_id, or the items resent) ->
    answer; the ids of the responses the client got."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="agent-key", max_retries=0)
    question = "Where is order 42?"
    if stream:
        async with client.responses.stream(
            model="agent-model",
            instructions="You help with orders.",
            input=question,
            tools=RESPONSES_TOOLS,
        ) as s:
            first = await s.get_final_response()
    else:
        first = await client.responses.create(
            model="agent-model",
            instructions="You help with orders.",
            input=question,
            tools=RESPONSES_TOOLS,
        )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "lookup_order" and json.loads(call.arguments) == {"query": question}
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "shipped"}
    if stream:  # the whole conversation sent again, as the Agents SDK does
        items: list[Any] = [
            {"role": "user", "content": question},
            *[i.model_dump(exclude_none=True) for i in first.output],
            output,
        ]
        async with client.responses.stream(
            model="agent-model",
            instructions="You help with orders.",
            input=items,
            tools=RESPONSES_TOOLS,
        ) as s:
            second = await s.get_final_response()
    else:
        second = await client.responses.create(
            model="agent-model",
            previous_response_id=first.id,
            input=[output],
            tools=RESPONSES_TOOLS,
        )
    assert second.output_text.startswith("stand-in reply to:")
    return [first.id, second.id]


async def messages_turns(base_url: str, *, stream: bool) -> list[str]:
    """ask -> tool_use -> tool_result -> answer; the ids of the messages the client got."""
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key="agent-key", max_retries=0)
    question = "Where is order 42?"
    history: list[Any] = [{"role": "user", "content": question}]
    ids = []
    for turn in range(2):
        kwargs: dict[str, Any] = {
            "model": "agent-model",
            "max_tokens": 256,
            "system": "You help with orders.",
            "messages": history,
            "tools": MESSAGES_TOOLS,
        }
        if stream:
            async with client.messages.stream(**kwargs) as s:
                message = await s.get_final_message()
        else:
            message = await client.messages.create(**kwargs)
        ids.append(message.id)
        if turn == 0:
            assert message.stop_reason == "tool_use"
            (use,) = [b for b in message.content if b.type == "tool_use"]
            assert use.name == "lookup_order" and use.input == {"query": question}
            history.append({"role": "assistant", "content": [use.model_dump()]})
            history.append(
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}],
                }
            )
        else:
            assert message.stop_reason == "end_turn"
            assert message.content[0].type == "text"
    return ids


async def agents_sdk_run(base_url: str, *, stream: bool = False) -> list[str]:
    """A real Agents SDK agent with one function tool (``Runner.run``, or ``run_streamed``
    with its events read); the ids of its model responses."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # its own tracing would export to OpenAI
    looked_up: list[str] = []

    @function_tool
    def lookup_order(query: str) -> str:
        """Find an order."""
        looked_up.append(query)
        return "order 42 shipped"

    client = openai.AsyncOpenAI(base_url=base_url, api_key="agent-key", max_retries=0)
    agent = Agent(
        name="orders",
        instructions="You help with orders.",
        tools=[lookup_order],
        model=OpenAIResponsesModel(model="agent-model", openai_client=client),
    )
    if stream:
        streamed = Runner.run_streamed(agent, "Where is order 42?")
        kinds = {event.type async for event in streamed.stream_events()}
        assert "raw_response_event" in kinds
        result: Any = streamed
    else:
        result = await Runner.run(agent, "Where is order 42?")
    assert looked_up == ["Where is order 42?"]
    assert str(result.final_output).startswith("stand-in reply to:")
    return [str(r.response_id) for r in result.raw_responses]


def ends(n: int) -> Any:
    """read_topic's ``until``: ``n`` calls ended (a fresh topic's first read may see nothing)."""

    def until(records: list[Any]) -> bool:
        ended = [r for r in records if isinstance(r, AgentCall) and r.phase is CallPhase.END]
        return len({r.call_id for r in ended}) >= n

    return until


def msg_id(client_id: str) -> str:
    """Trinity's chat completion id inside the id the client got (resp_... or msg_...)."""
    head, _, rest = client_id.partition("_")
    assert head in ("resp", "msg") and rest.startswith("chatcmpl-"), client_id
    return rest


def events_of(records: list[Any], call_id: str) -> list[AgentCall | Completion]:
    return [r for r in records if isinstance(r, AgentCall | Completion) and r.call_id == call_id]


def check_once(events: list[AgentCall | Completion], kinds: list[str]) -> list[Completion]:
    """One START, one END, each step once (by seq), in this order of kinds; the steps."""
    phases = [e.phase for e in events if isinstance(e, AgentCall)]
    assert phases.count(CallPhase.START) == 1 and phases.count(CallPhase.END) == 1, phases
    steps = sorted((e for e in events if isinstance(e, Completion)), key=lambda s: s.seq)
    assert len({s.seq for s in steps}) == len(steps), [s.seq for s in steps]
    assert [s.kind.value for s in steps] == kinds
    return steps


# -- route mode: Trinity answers, end to end --------------------------------------------------


async def test_route_mode_every_client_becomes_one_trajectory_and_trinity_gets_its_msg_ids(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: tuple[StandIn, ApiProduction],
    workers: Any,
    tmp_path: Path,
) -> None:
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_COMMIT__INTERVAL_S=600,
    )
    _, api = production
    served: dict[str, list[str]] = {}
    async with running_gateway(
        kafka_bootstrap, prefix, standin.url, api.url, tmp_path / "spill"
    ) as gw:
        for name, run in (
            ("responses-json", lambda b: responses_turns(f"{b}/v1", stream=False)),
            ("responses-stream", lambda b: responses_turns(f"{b}/v1", stream=True)),
            ("messages-json", lambda b: messages_turns(b, stream=False)),
            ("messages-stream", lambda b: messages_turns(b, stream=True)),
            ("agents-sdk", lambda b: agents_sdk_run(f"{b}/v1")),
            ("agents-sdk-stream", lambda b: agents_sdk_run(f"{b}/v1", stream=True)),
        ):
            served[name] = [msg_id(i) for i in await run(f"{gw.url}/calls/{name}")]
            await end(gw, name)
        assert await gw.publisher.flush(30)
    assert api.headers == []  # nothing went to production
    assert set(standin.state.experiences) == {i for ids in served.values() for i in ids}

    topics = Topics(prefix, 4)
    records = await read_topic(kafka_bootstrap, topics.agent_events, until=ends(len(served)))
    for name, ids in served.items():
        steps = check_once(events_of(records, name), ["LLM", "TOOL", "LLM"])
        assert [s.response_id for s in steps if s.kind is StepKind.LLM] == ids
        assert {s.upstream for s in steps if s.kind is StepKind.LLM} == {"trinity"}
        (call,) = steps[0].tool_call_details
        assert call.name == "lookup_order" and json.loads(call.arguments) == {
            "query": "Where is order 42?"
        }
        assert steps[1].tool_call_id == call.id and steps[1].tool_name == "lookup_order"
        assert steps[0].input_messages[0].role == "system"  # instructions / system kept
        assert steps[0].input_tokens and steps[0].output_tokens  # usage

    state = standin.state

    def fed_back() -> dict[tuple[str, ...], int]:
        got: dict[tuple[str, ...], int] = {}
        for f in state.feedback:
            if f.status == 200:
                key = tuple(f.body["msg_ids"])
                got[key] = got.get(key, 0) + 1
        return got

    wanted = {tuple(ids) for ids in served.values()}
    await wait_for(lambda: set(fed_back()) >= wanted, timeout=90, what="a /feedback per call")
    assert set(fed_back()) == wanted
    # each msg_id rewarded once, by a request naming its call's ids. A second request for a
    # call may come (delivery is at-least-once: a direct feedback whose answer came too late is
    # sent again by the feedback stage) and is Trinity's no-op: it applies nothing.
    applied: dict[str, list[tuple[str, ...]]] = {}
    for f in state.feedback:
        for m in f.applied:
            applied.setdefault(m, []).append(tuple(f.body["msg_ids"]))
    assert applied == {m: [ids] for ids in wanted for m in ids}
    trajectories = await read_topic(
        kafka_bootstrap, topics.trajectories, until=lambda rs: len(rs) >= len(served)
    )
    assert sorted(t.call_id for t in trajectories if isinstance(t, Trajectory)) == sorted(served)


# -- record only and shadow: production answers ------------------------------------------------


@pytest.mark.parametrize("mode", ["record-only", "shadow"])
async def test_production_answers_and_the_step_is_production_s_or_trinity_s_shadow(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: tuple[StandIn, ApiProduction],
    tmp_path: Path,
    mode: str,
) -> None:
    chat, api = production
    extra = {"strategy": "sampling:0"} if mode == "record-only" else {"mode": "shadow"}
    async with running_gateway(
        kafka_bootstrap, prefix, standin.url, api.url, tmp_path / "spill", **extra
    ) as gw:
        got = {
            "responses-json": await responses_turns(f"{gw.url}/calls/r1/v1", stream=False),
            "responses-stream": await responses_turns(f"{gw.url}/calls/r2/v1", stream=True),
            "messages-json": await messages_turns(f"{gw.url}/calls/m1", stream=False),
            "messages-stream": await messages_turns(f"{gw.url}/calls/m2", stream=True),
            "agents-sdk": await agents_sdk_run(f"{gw.url}/calls/a1/v1"),
        }
        for call_id in ("r1", "r2", "m1", "m2", "a1"):
            await end(gw, call_id)
        # a call of one step on each path without a call id
        one = await openai.AsyncOpenAI(
            base_url=f"{gw.url}/v1", api_key="k", max_retries=0
        ).responses.create(model="agent-model", input="hello")
        single = await anthropic.AsyncAnthropic(
            base_url=gw.url, api_key="k", max_retries=0
        ).messages.create(
            model="agent-model", max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        )
        assert one.output_text and single.content[0].type == "text"
        assert await gw.publisher.flush(30)

    # production's answers reached the clients: ids of the production stand-in's completions
    production_ids = set(chat.state.experiences)
    for ids in got.values():
        assert {msg_id(i) for i in ids} <= production_ids
    anthropic_side = [h for h in api.headers if "anthropic-version" in {k.lower() for k in h}]
    assert len(anthropic_side) == 5  # 4 in the two calls, 1 alone
    assert all(h.get("x-api-key") == "sk-ant-test-secret" for h in anthropic_side)
    version = anthropic.AsyncAnthropic(api_key="k").default_headers["anthropic-version"]
    assert all(h.get("anthropic-version") == version for h in anthropic_side)  # passed through
    openai_side = [h for h in api.headers if h not in anthropic_side]
    assert all(h.get("Authorization") == "Bearer sk-test-secret" for h in openai_side)

    records = await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(7))
    trinity_ids = set(standin.state.experiences)
    for call_id, name in (
        ("r1", "responses-json"),
        ("r2", "responses-stream"),
        ("m1", "messages-json"),
        ("m2", "messages-stream"),
        ("a1", "agents-sdk"),
    ):
        steps = check_once(events_of(records, call_id), ["LLM", "TOOL", "LLM"])
        llm = [s for s in steps if s.kind is StepKind.LLM]
        assert {s.upstream for s in llm} == {"production"}
        assert [s.response_id for s in llm] == got[name]  # what the client saw
        if mode == "record-only":
            assert not trinity_ids and all(s.msg_id is None for s in llm)
        else:  # Trinity's answer to the translated request beside it: its id is the msg_id
            shadows = [s.shadow_response_id for s in llm]
            assert all(shadows) and set(shadows) <= trinity_ids
            assert [s.msg_id for s in llm] == shadows
            assert all(s.shadow_output_messages for s in llm)
            assert llm[0].shadow_tool_call_details[0].name == "lookup_order"
    alone = [
        r for r in records if isinstance(r, AgentCall | Completion) and r.call_id.startswith("gw-")
    ]
    assert len({r.call_id for r in alone}) == 2
    for call_id in {r.call_id for r in alone}:
        check_once(events_of(records, call_id), ["LLM"])


# -- refusals ---------------------------------------------------------------------------------


async def test_bad_requests_get_each_api_s_error_shape_and_are_recorded_nowhere(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: tuple[StandIn, ApiProduction],
    tmp_path: Path,
) -> None:
    _, api = production
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        api.url,
        tmp_path / "spill",
        anthropic_url=None,
        strategy="sampling:0",
    ) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/calls/bad-1/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as unknown:
            await client.responses.create(
                model="m", input="hi", previous_response_id="resp_never_served"
            )
        assert unknown.value.code == "previous_response_not_found"
        with pytest.raises(openai.BadRequestError) as no_model:
            await client.responses.create(model="", input="hi")
        assert no_model.value.param == "model"
        claude = anthropic.AsyncAnthropic(
            base_url=f"{gw.url}/calls/bad-2", api_key="k", max_retries=0
        )
        with pytest.raises(anthropic.BadRequestError) as bad_messages:
            await claude.messages.create(
                model="m",
                max_tokens=8,
                messages=[{"content": "no role"}],  # type: ignore[typeddict-item]
            )
        assert bad_messages.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{gw.url}/v1/messages", data=b"{not json") as r:
                assert r.status == 400
                assert (await r.json())["type"] == "error"
            # not routed to Trinity and no Anthropic upstream configured: 503 naming the setting
            body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            async with http.post(f"{gw.url}/calls/bad-3/v1/messages", json=body) as r:
                assert r.status == 503
                assert "gateway.anthropic_url" in (await r.json())["error"]["message"]
        assert await gw.publisher.flush(30)
    records = await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events)
    assert [r for r in records if getattr(r, "call_id", "") in ("bad-1", "bad-2", "bad-3")] == []
    assert api.headers == []  # nothing refused reached production


async def test_client_keys_guard_the_responses_and_messages_routes_too(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: tuple[StandIn, ApiProduction],
    tmp_path: Path,
) -> None:
    """With ``gateway.api_keys``, the new routes are no open relay: the ``openai`` client's
    bearer key and the ``anthropic`` client's ``x-api-key`` are checked, a wrong one is 401
    and recorded nowhere, and a key naming its agent names the recorded call's agent. The
    Messages routes refuse in Anthropic's error shape (401 ``authentication_error``, 429
    ``rate_limit_error``), the Responses routes in OpenAI's."""
    _, api = production
    keys = [
        {"key": "sk-agent-key-1", "agent": "keyed-bot"},
        {"key": "sk-slow-key-2", "rate_per_s": 0.01},  # one request, then 429 for 100 s
    ]
    async with running_gateway(
        kafka_bootstrap, prefix, standin.url, api.url, tmp_path / "spill", api_keys=keys
    ) as gw:
        for key, ok in (("sk-wrong-key-9", False), ("sk-agent-key-1", True)):
            client = openai.AsyncOpenAI(
                base_url=f"{gw.url}/calls/k-{ok}/v1", api_key=key, max_retries=0
            )
            claude = anthropic.AsyncAnthropic(
                base_url=f"{gw.url}/calls/m-{ok}", api_key=key, max_retries=0
            )
            if ok:
                assert (await client.responses.create(model="m", input="hi")).output_text
                message = await claude.messages.create(
                    model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                )
                assert message.content[0].type == "text"
            else:
                with pytest.raises(openai.AuthenticationError) as openai_shape:
                    await client.responses.create(model="m", input="hi")
                assert openai_shape.value.code == "invalid_api_key"
                for path in ("/calls/m-False", ""):  # a call's step, and a call of one step
                    unknown = anthropic.AsyncAnthropic(
                        base_url=f"{gw.url}{path}", api_key=key, max_retries=0
                    )
                    with pytest.raises(anthropic.AuthenticationError) as refused:
                        await unknown.messages.create(
                            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                        )
                    body: Any = refused.value.body
                    assert body["type"] == "error", body
                    assert body["error"]["type"] == "authentication_error", body
                    assert body["error"]["message"] == "Incorrect API key provided."
        slow = anthropic.AsyncAnthropic(
            base_url=f"{gw.url}/calls/slow", api_key="sk-slow-key-2", max_retries=0
        )
        with pytest.raises(anthropic.BadRequestError):  # takes the key's one request
            await slow.messages.create(
                model="m", max_tokens=8, messages=[{"content": "no role"}]  # type: ignore[typeddict-item]
            )
        with pytest.raises(anthropic.RateLimitError) as limited:
            await slow.messages.create(
                model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
        assert int(limited.value.response.headers["Retry-After"]) >= 1
        for call_id in ("k-True", "m-True"):
            await end(gw, call_id, "sk-agent-key-1")
        assert await gw.publisher.flush(30)
    records = await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(2))
    assert {getattr(r, "call_id", "") for r in records} <= {"k-True", "m-True"}
    starts = [r for r in records if isinstance(r, AgentCall) and r.phase is CallPhase.START]
    assert sorted(s.call_id for s in starts) == ["k-True", "m-True"]
    assert {s.agent_name for s in starts} == {"keyed-bot"}


# -- durability and usage on these routes, as on chat completions ------------------------------


@pytest.mark.parametrize("upstream", ["trinity", "production"])
async def test_acked_mode_answers_only_once_the_records_are_on_the_broker_with_usage(
    kafka_bootstrap: str,
    prefix: str,
    standin: StandIn,
    production: tuple[StandIn, ApiProduction],
    tmp_path: Path,
    upstream: str,
) -> None:
    """``gateway.durability = acked`` on ``/v1/responses`` and ``/v1/messages``, JSON and
    streamed, answered by Trinity (the translation) or production (the API's own events): when
    the client has the answer, the broker has acknowledged every record queued so far. The
    clients never ask for usage, and every recorded LLM step has its token counts."""
    _, api = production
    strategy = "sampling:1" if upstream == "trinity" else "sampling:0"
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        api.url,
        tmp_path / "spill",
        strategy=strategy,
        durability="acked",
    ) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/calls/d-r/v1", api_key="k", max_retries=0)
        claude = anthropic.AsyncAnthropic(
            base_url=f"{gw.url}/calls/d-m", api_key="k", max_retries=0
        )
        hi: list[Any] = [{"role": "user", "content": "hi"}]

        def on_broker() -> bool:
            return gw.publisher.acked(gw.publisher.position).done()

        told = await client.responses.create(model="m", input="hi")
        assert told.output_text and on_broker()
        async with client.responses.stream(
            model="m", input="again", previous_response_id=told.id
        ) as s:
            streamed = await s.get_final_response()
        assert streamed.output_text and on_broker()
        message = await claude.messages.create(model="m", max_tokens=64, messages=hi)
        assert message.content[0].type == "text" and on_broker()
        history = [
            *hi,
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "more"},
        ]
        async with claude.messages.stream(model="m", max_tokens=64, messages=history) as m:
            final = await m.get_final_message()
        assert final.content[0].type == "text" and on_broker()
        assert gw.stats.answered[upstream] == 4
        for call_id in ("d-r", "d-m"):
            await end(gw, call_id)
        assert on_broker()  # /end too answers once its END is on the broker
    records = await read_topic(kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(2))
    for call_id in ("d-r", "d-m"):
        steps = check_once(events_of(records, call_id), ["LLM", "LLM"])
        assert {s.upstream for s in steps} == {upstream}
        for step in steps:  # the second of each was streamed, its client asking no usage
            assert step.input_tokens and step.output_tokens, (call_id, step.seq)


async def test_acked_mode_without_a_broker_refuses_in_each_api_s_shape(
    standin: StandIn, tmp_path: Path
) -> None:
    """The broker never acknowledges (nothing listens there): after ``gateway.ack_timeout_s``
    a JSON answer is a 503 in the API's own error shape, and a stream ends with the API's
    ``error`` event in place of its terminal event (the client knows it was not recorded)."""
    async with running_gateway(
        "127.0.0.1:1", "noack", standin.url, standin.url, tmp_path / "spill",
        durability="acked", ack_timeout_s=0.5,
    ) as gw:  # fmt: skip
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/calls/n-r/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as responses_refused:
            await client.responses.create(model="m", input="hi")
        assert responses_refused.value.status_code == 503
        assert "gateway.durability" in responses_refused.value.message
        stream = await client.responses.create(model="m", input="hi", stream=True)
        events: list[str] = []
        with pytest.raises(openai.APIError) as stream_refused:  # raised, not yielded
            async for event in stream:
                events.append(event.type)
        assert "gateway.durability" in stream_refused.value.message
        assert events and "response.completed" not in events and "error" not in events
        claude = anthropic.AsyncAnthropic(
            base_url=f"{gw.url}/calls/n-m", api_key="k", max_retries=0
        )
        hi: list[Any] = [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.InternalServerError) as messages_refused:
            await claude.messages.create(model="m", max_tokens=8, messages=hi)
        body: Any = messages_refused.value.body
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
        with pytest.raises(anthropic.APIStatusError):
            async with claude.messages.stream(model="m", max_tokens=8, messages=hi) as m:
                await m.get_final_message()
        assert gw.stats.ack_timeouts == 4
