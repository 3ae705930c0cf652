"""One decision: the route the gateway takes at a call's first request is the selection a real
worker makes, and shadow mode records what the client saw with Trinity's answer beside it.

Through the real gateway (route mode and shadow mode, on the same topics), the official
``openai`` client, stand-ins for Trinity and production, and a real worker process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest

from streams.models import AgentCall, CallPhase, Completion, SelectionDecision

from .conftest import read_topic, wait_for
from .test_gateway import call_events, complete, running_gateway

pytestmark = pytest.mark.integration

TTL_S = 2
MARK = {"X-Trajstream-Mark": '{"labels": ["gold"]}'}


async def turns(
    base: str, call_id: str, headers: dict[str, str], n: int, pause_s: float = 0
) -> list[tuple[str, str]]:
    """``n`` requests of one call; (response id, X-Trajstream-Upstream) of each."""
    client = openai.AsyncOpenAI(
        base_url=f"{base}/calls/{call_id}/v1", api_key="k", max_retries=0, default_headers=headers
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": f"question of {call_id}"}]
    out = []
    for i in range(n):
        if i and pause_s:
            await asyncio.sleep(pause_s)
        raw = await client.chat.completions.with_raw_response.create(model="m", messages=messages)
        answer = raw.parse()
        out.append((answer.id, raw.headers["x-trajstream-upstream"]))
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": f"and then? ({i})"},
        ]
    await client.close()
    return out


async def end(base: str, call_id: str, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{base}/calls/{call_id}/end", headers=headers, json={"output": "x"})
        assert r.status_code == 202


async def test_the_route_is_the_selection_and_shadow_keeps_both_answers(
    kafka_bootstrap, prefix, standin, production, workers, tmp_path
):
    workers(
        TRAJSTREAM_TRINITY__URL=standin.url,
        TRAJSTREAM_SELECTION__STRATEGY="marked",
        TRAJSTREAM_SELECTION__MARK_TTL_S=TTL_S,
        TRAJSTREAM_KAFKA__PARTITIONS=2,
        TRAJSTREAM_COMMIT__INTERVAL_S=1,
    )
    common = (kafka_bootstrap, prefix, standin.url, f"{production.url}/v1")
    stale = {"X-Trajstream-Mark": json.dumps({"marked_at": "2020-01-01T00:00:00Z"})}
    async with (
        running_gateway(*common, tmp_path / "r", strategy="marked", mark_ttl_s=TTL_S) as gw,
        running_gateway(
            *common, tmp_path / "s", strategy="marked", mark_ttl_s=TTL_S, mode="shadow"
        ) as shadow_gw,
    ):
        # the mark arrives only with END: production answered, so nothing is selected
        late = await turns(gw.url, "late", {}, 2)
        await end(gw.url, "late", MARK)
        # marked at the start, answered by Trinity, running past the mark's TTL: trained on
        long = await turns(gw.url, "long", MARK, 2, pause_s=TTL_S + 1.5)
        await end(gw.url, "long", MARK)
        # a mark already expired at the first request: production, not selected
        expired = await turns(gw.url, "expired", stale, 1)
        await end(gw.url, "expired", stale)
        # shadow: production answers (and is recorded), Trinity's answer travels with it
        shadowed = await turns(shadow_gw.url, "shadowed", MARK, 2)
        await end(shadow_gw.url, "shadowed", MARK)
        assert await gw.publisher.flush(20) and await shadow_gw.publisher.flush(20)

    assert {u for _, u in late + expired + shadowed} == {"production"}
    assert {u for _, u in long} == {"trinity"}
    calls = {"late", "long", "expired", "shadowed"}
    records = await read_topic(kafka_bootstrap, f"{prefix}.agent-events", until=complete(calls))
    starts = {
        r.call_id: r for r in records if isinstance(r, AgentCall) and r.phase is CallPhase.START
    }
    assert starts["expired"].attributes["trajstream.route.reason"] == "expired"
    steps = [r for r in call_events(records, "shadowed") if isinstance(r, Completion)]
    assert [s.response_id for s in steps] == [rid for rid, _ in shadowed]  # what the client saw
    assert {s.upstream for s in steps} == {"production"}
    trinity_ids = [s.shadow_response_id for s in steps]
    assert all(trinity_ids) and set(trinity_ids) <= set(standin.state.experiences)
    for s in steps:
        row = standin.state.experiences[s.shadow_response_id]
        assert s.shadow_output_messages[0].content == row.completion
        assert s.shadow_latency_ms is not None and s.shadow_latency_ms > 0
        assert s.output_messages[0].content != ""  # production's own answer

    decisions: dict[str, SelectionDecision] = {}

    def decided(got: list[Any]) -> bool:
        decisions.update({d.call_id: d for d in got if isinstance(d, SelectionDecision)})
        return calls <= set(decisions)

    await read_topic(kafka_bootstrap, f"{prefix}.decisions", until=decided, timeout=90)
    selected = {c for c, d in decisions.items() if d.selection.selected}
    assert selected == {"long", "shadowed"}
    assert decisions["late"].selection.reason == "unmarked"  # decided at the first request

    state = standin.state
    await wait_for(lambda: len(state.feedback) >= 2, timeout=90, what="two /feedback")
    await asyncio.sleep(2)
    got = sorted(f.body["msg_ids"] for f in state.feedback)
    assert got == sorted([[rid for rid, _ in long], trinity_ids])
    production_ids = {rid for rid, _ in late + expired + shadowed}
    assert not production_ids & {m for f in state.feedback for m in f.body["msg_ids"]}
    assert not production.state.feedback
