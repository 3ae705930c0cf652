"""The gateway over real HTTP with the official ``openai`` client, a real broker, stand-ins as
both upstreams (Trinity and production) and, end to end, a real worker process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from streams.capture.gateway import Gateway, build_gateway
from streams.models import AgentCall, CallPhase, Completion, StepKind, ToolCall, UserFeedback
from streams.select import sample_point
from streams.settings import load_settings

from .chaos import read_all
from .conftest import read_topic, wait_for

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


@contextlib.asynccontextmanager
async def running_gateway(
    bootstrap: str,
    prefix: str,
    trinity_url: str,
    production_url: str,
    spill: Path,
    strategy: str = "sampling:1",
    mark_ttl_s: float = 60,
    **gateway: Any,
) -> AsyncIterator[Gateway]:
    settings = load_settings(
        kafka={"bootstrap_servers": bootstrap, "topic_prefix": prefix, "partitions": 2},
        trinity={"url": trinity_url},
        selection={"strategy": strategy, "mark_ttl_s": mark_ttl_s},
        gateway={
            "production_url": production_url,
            "production_api_key": "sk-test-secret",
            "spill_dir": str(spill),
            "flush_timeout_s": 3,
            **gateway,
        },
    )
    gw = build_gateway(settings)
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop(flush_timeout=5)


def call_events(records: list[Any], call_id: str) -> list[Any]:
    return [r for r in records if isinstance(r, AgentCall | Completion) and r.call_id == call_id]


def complete(call_ids: set[str]) -> Any:
    def until(records: list[Any]) -> bool:
        ended = {
            r.call_id for r in records if isinstance(r, AgentCall) and r.phase is CallPhase.END
        }
        return call_ids <= ended

    return until


def agent_turn_sync(base_url: str, question: str) -> dict[str, Any]:
    """An agent loop with the sync client: ask, run the tool it asks for, answer."""
    client = openai.OpenAI(base_url=base_url, api_key="agent-key", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You help with orders."},
        {"role": "user", "content": question},
    ]
    first = client.chat.completions.create(model="agent-model", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "order 42 shipped"})
    second = client.chat.completions.create(model="agent-model", messages=messages, tools=TOOLS)
    return {"first": first, "second": second, "call": call, "messages": messages}


async def agent_turn_stream(base_url: str, question: str) -> dict[str, Any]:
    """The same loop, streamed, with the async client; rebuilds what the client saw."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="agent-key", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    seen = []
    for _ in range(2):
        stream = await client.chat.completions.create(
            model="agent-model",
            messages=messages,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        rid, content, calls, finish = None, "", {}, None
        async for chunk in stream:
            rid = rid or chunk.id
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for t in choice.delta.tool_calls or []:
                    c = calls.setdefault(t.index, {"id": "", "name": "", "arguments": ""})
                    c["id"] = t.id or c["id"]
                    c["name"] += (t.function.name or "") if t.function else ""
                    c["arguments"] += (t.function.arguments or "") if t.function else ""
                finish = choice.finish_reason or finish
        seen.append(
            {"id": rid, "content": content, "calls": list(calls.values()), "finish": finish}
        )
        if calls:
            c = next(iter(calls.values()))
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": c["name"], "arguments": c["arguments"]},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "in stock"})
    await client.close()
    return {"seen": seen, "messages": messages}


async def test_a_tool_using_call_comes_out_as_the_client_saw_it_then_one_feedback(
    kafka_bootstrap, prefix, standin, production, workers, tmp_path
):
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
        TRAJSTREAM_KAFKA__PARTITIONS=2,
        TRAJSTREAM_COMMIT__INTERVAL_S=1,
    )
    sync_id, stream_id = f"sync-{uuid.uuid4().hex[:8]}", f"stream-{uuid.uuid4().hex[:8]}"
    async with running_gateway(
        kafka_bootstrap, prefix, standin.url, f"{production.url}/v1", tmp_path / "spill"
    ) as gw:
        headers = {
            "X-Trajstream-Agent-Name": "support",
            "X-Trajstream-Mark": '{"labels": ["gold"]}',
        }
        sync = await asyncio.to_thread(
            lambda: agent_turn_sync(f"{gw.url}/calls/{sync_id}/v1", "Where is order 42?")
        )
        streamed = await agent_turn_stream(f"{gw.url}/calls/{stream_id}/v1", "Is it in stock?")
        async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
            for cid, output in (
                (sync_id, sync["second"].choices[0].message.content),
                (stream_id, "ok"),
            ):
                r = await http.post(f"/calls/{cid}/end", json={"status": "OK", "output": output})
                assert r.status_code == 202 and r.json()["step_count"] == 3
            r = await http.post(
                f"/calls/{sync_id}/feedback", json={"rating": 5, "comment": "great"}
            )
            assert r.status_code == 202
        assert await gw.publisher.flush(20)

    records = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=complete({sync_id, stream_id})
    )
    # the sync call, exactly as the client saw it
    events = call_events(records, sync_id)
    start, *steps, end = events
    assert start.phase is CallPhase.START and end.phase is CallPhase.END and end.step_count == 3
    assert start.attributes["trajstream.route.upstream"] == "trinity"
    assert [s.seq for s in steps] == [2, 3, 4]
    assert [s.kind for s in steps] == [StepKind.LLM, StepKind.TOOL, StepKind.LLM]
    first, tool, second = steps
    call = sync["call"]
    assert first.response_id == sync["first"].id and second.response_id == sync["second"].id
    assert first.tool_call_details == [
        ToolCall(id=call.id, name="lookup_order", arguments=call.function.arguments)
    ]
    assert first.tool_calls == ["lookup_order"] and first.finish_reasons == ["tool_calls"]
    assert first.input_tokens == sync["first"].usage.prompt_tokens
    assert [m.content for m in first.input_messages] == [
        "You help with orders.",
        "Where is order 42?",
    ]
    assert tool.tool_call_id == call.id and tool.tool_name == "lookup_order"
    assert tool.output_messages[0].content == "order 42 shipped"
    assert second.input_messages[2].tool_calls == first.tool_call_details
    assert second.input_messages[3].tool_call_id == call.id
    assert second.output_messages[0].content == sync["second"].choices[0].message.content
    assert {s.upstream for s in (first, second)} == {"trinity"}
    assert second.latency_ms is not None and second.latency_ms > 0
    # the streamed call, rebuilt from the chunks, matches what the client assembled
    s_first, s_tool, s_second = call_events(records, stream_id)[1:-1]
    seen = streamed["seen"]
    assert s_first.response_id == seen[0]["id"] and s_second.response_id == seen[1]["id"]
    assert [c.model_dump() for c in s_first.tool_call_details] == seen[0]["calls"]
    assert s_second.output_messages[0].content == seen[1]["content"]
    assert s_first.input_tokens is not None  # the usage chunk was read
    assert s_tool.tool_call_id == seen[0]["calls"][0]["id"]

    fb = await read_topic(kafka_bootstrap, f"{prefix}.user-feedback", until=lambda r: len(r) >= 1)
    assert [(f.call_id, f.rating) for f in fb if isinstance(f, UserFeedback)] == [(sync_id, 5.0)]

    # one trajectory each, and one /feedback with exactly the msg_ids Trinity served
    expected = {
        sync_id: [sync["first"].id, sync["second"].id],
        stream_id: [seen[0]["id"], seen[1]["id"]],
    }
    state = standin.state
    await wait_for(lambda: len(state.feedback) >= 2, timeout=90, what="two /feedback")
    await asyncio.sleep(1)
    got = sorted(f.body["msg_ids"] for f in state.feedback)
    assert got == sorted(expected.values())
    assert set(state.experiences) >= {m for ids in expected.values() for m in ids}
    assert not production.state.experiences  # sampling:1 in route mode: production unused


async def test_routing_follows_the_documented_hash_over_1000_calls(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    rate = 0.3
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        f"{production.url}/v1",
        tmp_path / "spill",
        strategy=f"sampling:{rate}",
    ) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)
        limit = asyncio.Semaphore(32)

        async def one(i: int) -> tuple[str, str, str]:
            cid = f"route-{i}"
            async with limit:
                raw = await client.with_options(
                    base_url=f"{gw.url}/calls/{cid}/v1"
                ).chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": f"q{i}"}]
                )
            return cid, raw.headers["x-trajstream-upstream"], raw.parse().id

        results = await asyncio.gather(*(one(i) for i in range(1000)))
        await client.close()
    to_trinity = {cid for cid, up, _ in results if up == "trinity"}
    assert to_trinity == {cid for cid, _, _ in results if sample_point(cid) < rate}
    assert 200 < len(to_trinity) < 400
    served_by_trinity = {rid for cid, _, rid in results if cid in to_trinity}
    assert served_by_trinity == set(standin.state.experiences)
    assert {rid for cid, _, rid in results if cid not in to_trinity} == set(
        production.state.experiences
    )


async def test_shadow_mode_answers_from_production_and_records_both_answers(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        f"{production.url}/v1",
        tmp_path / "spill",
        strategy="marked",
        mode="shadow",
    ) as gw:
        answers = {}
        for cid, headers in (("marked-1", {"X-Trajstream-Mark": "{}"}), ("plain-1", {})):
            client = openai.AsyncOpenAI(
                base_url=f"{gw.url}/calls/{cid}/v1",
                api_key="k",
                max_retries=0,
                default_headers=headers,
            )
            answers[cid] = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}]
            )
            await client.close()
            async with httpx.AsyncClient() as http:
                assert (
                    await http.post(f"{gw.url}/calls/{cid}/end", headers=headers)
                ).status_code == 202
        assert await gw.publisher.flush(20)
    assert {a.id for a in answers.values()} <= set(production.state.experiences)
    records = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=complete({"marked-1", "plain-1"})
    )
    (marked_step,) = [r for r in call_events(records, "marked-1") if isinstance(r, Completion)]
    (plain_step,) = [r for r in call_events(records, "plain-1") if isinstance(r, Completion)]
    # the step is what the client saw; Trinity's answer to the same request travels with it
    assert marked_step.upstream == "production"
    assert marked_step.response_id == answers["marked-1"].id
    assert list(standin.state.experiences) == [marked_step.shadow_response_id]
    assert marked_step.msg_id == marked_step.shadow_response_id
    assert plain_step.shadow_response_id is None and plain_step.msg_id is None
    assert plain_step.upstream == "production" and plain_step.response_id == answers["plain-1"].id


@contextlib.asynccontextmanager
async def failing_upstream() -> AsyncIterator[str]:
    async def error(request: web.Request) -> web.Response:
        body = {"error": {"message": "model overloaded", "type": "server_error", "code": "x1"}}
        return web.json_response(body, status=500)

    async def hang(request: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/error/chat/completions", error)
    app.router.add_post("/hang/chat/completions", hang)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def test_upstream_errors_reach_the_client_in_openais_shape(
    kafka_bootstrap, prefix, standin, tmp_path
):
    async with failing_upstream() as base:
        for path, status, kind in (
            ("error", 500, "server_error"),
            ("hang", 504, "upstream_timeout"),
        ):
            async with running_gateway(
                kafka_bootstrap,
                prefix,
                standin.url,
                f"{base}/{path}",
                tmp_path / path,
                strategy="sampling:0",
                timeout_s=1,
            ) as gw:
                client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)
                with pytest.raises(openai.APIStatusError) as caught:
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}]
                    )
                await client.close()
                assert caught.value.status_code == status
                assert caught.value.body["type"] == kind
                if status == 500:  # unchanged: the upstream's own body
                    assert caught.value.response.json() == {
                        "error": {
                            "message": "model overloaded",
                            "type": "server_error",
                            "code": "x1",
                        }
                    }
    # nothing listens there any more: 502
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        f"{base}/error",
        tmp_path / "gone",
        strategy="sampling:0",
    ) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.APIStatusError) as caught:
            await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        await client.close()
        assert caught.value.status_code == 502 and caught.value.body["type"] == "upstream_error"


async def test_bad_input_gets_an_openai_4xx_and_is_recorded_nowhere(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        f"{production.url}/v1",
        tmp_path / "spill",
        max_body_bytes=2000,
    ) as gw:
        await wait_for(lambda: gw.publisher.stats.connected, 30, "the publisher to connect")
        ok = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        cases = [
            ("/v1/chat/completions", b"{not json", {}, 400, None),
            ("/v1/chat/completions", json.dumps({"model": "m"}).encode(), {}, 400, "messages"),
            (
                "/v1/chat/completions",
                json.dumps({"model": "m", "messages": []}).encode(),
                {},
                400,
                "messages",
            ),
            ("/v1/chat/completions", json.dumps({**ok, "pad": "x" * 3000}).encode(), {}, 413, None),
            (
                "/calls/c1/v1/chat/completions",
                json.dumps(ok).encode(),
                {"X-Trajstream-Mark": "yes"},
                400,
                "X-Trajstream-Mark",
            ),
            (
                "/calls/c1/v1/chat/completions",
                json.dumps(ok).encode(),
                {"X-Trajstream-Mark": '{"run_id": -1}'},
                400,
                "X-Trajstream-Mark",
            ),
            (
                "/calls/c1/v1/chat/completions",
                json.dumps(ok).encode(),
                {"X-Trajstream-Agent-Name": "x" * 2000},
                400,
                "X-Trajstream-Agent-Name",
            ),
            ("/calls/bad%20id/v1/chat/completions", json.dumps(ok).encode(), {}, 400, "call_id"),
            ("/calls/c1/feedback", json.dumps({"rating": "high"}).encode(), {}, 400, "rating"),
            ("/calls/c1/end", json.dumps({"status": "FINE"}).encode(), {}, 400, "status"),
        ]
        async with httpx.AsyncClient(base_url=gw.url) as http:
            for path, body, headers, status, param in cases:
                r = await http.post(
                    path, content=body, headers={"Content-Type": "application/json", **headers}
                )
                assert r.status_code == status, (path, body[:40], r.text)
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error" and error["message"]
                assert error["param"] == param, (path, error)
            good = await http.post("/calls/good/v1/chat/completions", json=ok)
            assert good.status_code == 200
        assert await gw.publisher.flush(20)
    assert len(standin.state.experiences) == 1 and not production.state.experiences
    records = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=lambda r: len(r) >= 2
    )
    assert {r.call_id for r in records} == {"good"} and len(records) == 2
    assert not await read_topic(kafka_bootstrap, f"{prefix}.user-feedback")


async def test_broker_stopped_during_traffic_every_answer_arrives_and_every_event_later(
    prefix, standin, production, tmp_path
):
    from streams.broker import LocalBroker, free_port

    from .conftest import CACHE_DIR

    broker = LocalBroker(CACHE_DIR, data_dir=tmp_path / "kafka", port=free_port())
    bootstrap = await asyncio.to_thread(broker.start, 120)
    try:
        async with running_gateway(
            bootstrap,
            prefix,
            standin.url,
            f"{production.url}/v1",
            tmp_path / "spill",
            strategy="sampling:0.5",
            buffer_records=4,
        ) as gw:
            client = openai.AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="k", max_retries=0)

            async def call(cid: str) -> None:
                c = client.with_options(base_url=f"{gw.url}/calls/{cid}/v1")
                await c.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": cid}]
                )
                async with httpx.AsyncClient() as http:
                    assert (await http.post(f"{gw.url}/calls/{cid}/end")).status_code == 202

            before = [f"before-{i}" for i in range(3)]
            for cid in before:
                await call(cid)
            assert await gw.publisher.flush(20)
            await asyncio.to_thread(broker.stop)
            during = [f"during-{i}" for i in range(10)]
            for cid in during:  # every answer arrives while Kafka is down
                await asyncio.wait_for(call(cid), 10)
            assert gw.publisher.pending == 30  # 10 calls x START, step, END
            await gw.publisher.refresh()  # the recorder process's counts as of now
            assert gw.publisher.spill.records >= 26  # past the bound of 4: on disk
            assert list((tmp_path / "spill").glob("spill-*.bin"))
            await asyncio.to_thread(broker.start, 120)
            assert await gw.publisher.flush(60), gw.publisher.health()
            await client.close()
        assert not list((tmp_path / "spill").glob("spill-*.bin"))
        records = await read_topic(
            bootstrap, f"{prefix}.agent-events", until=complete(set(before + during))
        )
        for cid in before + during:
            events = call_events(records, cid)
            first_seen = list(dict.fromkeys(e.event_id for e in events))
            assert first_seen == [f"{cid}/start", f"{cid}/1", f"{cid}/end"], (cid, first_seen)
    finally:
        await asyncio.to_thread(broker.stop)


async def test_two_replicas_agree_on_a_calls_route_and_its_steps(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    prod = f"{production.url}/v1"
    async with (
        running_gateway(
            kafka_bootstrap,
            prefix,
            standin.url,
            prod,
            tmp_path / "a",
            strategy="any(marked,sampling:0.5)",
            count_steps=False,
        ) as a,
        running_gateway(
            kafka_bootstrap,
            prefix,
            standin.url,
            prod,
            tmp_path / "b",
            strategy="any(marked,sampling:0.5)",
            count_steps=False,
        ) as b,
    ):
        calls = {f"rep-{i}": {} for i in range(6)}
        calls["rep-marked"] = {"X-Trajstream-Mark": '{"labels": ["x"]}'}
        for cid, headers in calls.items():
            messages: list[dict[str, Any]] = [{"role": "user", "content": "first"}]
            upstreams = []
            for gw in (a, b, a):  # each request to another replica
                client = openai.AsyncOpenAI(
                    base_url=f"{gw.url}/calls/{cid}/v1",
                    api_key="k",
                    max_retries=0,
                    default_headers=headers,
                )
                raw = await client.chat.completions.with_raw_response.create(
                    model="m", messages=messages
                )
                await client.close()
                upstreams.append(raw.headers["x-trajstream-upstream"])
                messages += [
                    raw.parse().choices[0].message.model_dump(exclude_none=True),
                    {"role": "user", "content": "more"},
                ]
            assert len(set(upstreams)) == 1, (cid, upstreams)
            expected = "trinity" if headers or sample_point(cid) < 0.5 else "production"
            assert upstreams[0] == expected
            async with httpx.AsyncClient() as http:
                r = await http.post(f"{b.url}/calls/{cid}/end", headers=headers)
                assert r.json()["step_count"] is None  # count_steps = false
        assert await a.publisher.flush(20) and await b.publisher.flush(20)
    records = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=complete(set(calls))
    )
    for cid in calls:
        events = call_events(records, cid)
        assert sorted(e.seq for e in events if isinstance(e, Completion)) == [1, 3, 5]
        starts = [e for e in events if isinstance(e, AgentCall) and e.phase is CallPhase.START]
        assert {s.event_id for s in starts} == {f"{cid}/start"}  # one START, by its id
        assert len({s.attributes["trajstream.route.upstream"] for s in starts}) == 1


async def test_a_stream_without_include_usage_is_recorded_with_its_tokens_and_sent_without(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    async with running_gateway(
        kafka_bootstrap, prefix, standin.url, f"{production.url}/v1", tmp_path / "spill"
    ) as gw:
        client = openai.AsyncOpenAI(base_url=f"{gw.url}/calls/u-1/v1", api_key="k", max_retries=0)
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "count me"}], stream=True
            )
        ]
        asked = [
            c
            async for c in await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "count me"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        await client.close()
        async with httpx.AsyncClient() as http:
            assert (await http.post(f"{gw.url}/calls/u-1/end")).status_code == 202
        assert await gw.publisher.flush(20)
    assert chunks and all(c.choices and c.usage is None for c in chunks)
    assert asked[-1].usage is not None and not asked[-1].choices  # asked: passed through
    records = await read_topic(kafka_bootstrap, f"{prefix}.agent-events", until=complete({"u-1"}))
    (step,) = [r for r in call_events(records, "u-1") if isinstance(r, Completion)]
    assert step.input_tokens == asked[-1].usage.prompt_tokens
    assert step.output_tokens == asked[-1].usage.completion_tokens
    assert step.response_id == chunks[0].id


async def test_client_keys_on_every_route_in_openais_shape_and_never_on_the_topic(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    keys = [
        {"key": "sk-support-key-1", "agent": "support", "rate_per_s": 3},
        {"key": "sk-batch-key-22"},
    ]
    async with running_gateway(
        kafka_bootstrap,
        prefix,
        standin.url,
        f"{production.url}/v1",
        tmp_path / "spill",
        api_keys=keys,
    ) as gw:
        messages = [{"role": "user", "content": "hi"}]
        client = openai.AsyncOpenAI(
            base_url=f"{gw.url}/calls/k-0/v1", api_key="sk-wrong-key-99", max_retries=0
        )
        with pytest.raises(openai.AuthenticationError) as caught:
            await client.chat.completions.create(model="m", messages=messages)
        assert caught.value.code == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
        await client.close()
        async with httpx.AsyncClient(base_url=gw.url) as http:  # no key at all
            for path in (
                "/calls/k-0/end",
                "/calls/k-0/feedback",
                "/v1/chat/completions",
                "/calls/k-0/v1/chat/completions",
                "/v1/traces",
            ):
                r = await http.post(path, json={"rating": 1})
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert (await http.get("/healthz")).status_code == 200  # the probe stays open
        support = openai.AsyncOpenAI(
            base_url=f"{gw.url}/calls/k-1/v1",
            api_key="sk-support-key-1",
            max_retries=0,
            default_headers={"X-Trajstream-Agent-Name": "claimed-other"},
        )
        answered, limited = 0, []
        for _ in range(8):  # 3 a second, a bucket of 3: some of 8 quick ones are refused
            try:
                await support.chat.completions.create(model="m", messages=messages)
                answered += 1
            except openai.RateLimitError as exc:
                limited.append(exc)
        await support.close()
        assert answered >= 3 and limited
        assert limited[0].code == "rate_limit_exceeded"
        assert int(limited[0].response.headers["retry-after"]) >= 1
        batch = openai.AsyncOpenAI(
            base_url=f"{gw.url}/calls/k-2/v1", api_key="sk-batch-key-22", max_retries=0
        )
        for _ in range(5):  # no rate on this key
            await batch.chat.completions.create(model="m", messages=messages)
        await batch.close()
        async with httpx.AsyncClient(base_url=gw.url) as http:
            for cid, key in (("k-1", "sk-support-key-1"), ("k-2", "sk-batch-key-22")):
                await asyncio.sleep(1)
                r = await http.post(f"/calls/{cid}/end", headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 202
        assert gw.stats.unauthorized == 7 and gw.stats.rate_limited == len(limited)
        assert await gw.publisher.flush(20)
    records = await read_topic(
        kafka_bootstrap, f"{prefix}.agent-events", until=complete({"k-1", "k-2"})
    )
    starts = {
        r.call_id: r for r in records if isinstance(r, AgentCall) and r.phase is CallPhase.START
    }
    assert "k-0" not in starts  # refused: recorded nowhere
    assert starts["k-1"].agent_name == "support" and starts["k-2"].agent_name is None
    raw = await read_all(kafka_bootstrap, f"{prefix}.agent-events")
    secrets = (b"sk-support-key-1", b"sk-batch-key-22", b"sk-test-secret")
    assert raw and not any(s in v for v in raw for s in secrets)
