"""The rollout end to end on a real broker: two gateway replicas (real HTTP, the official openai
client), a worker process, the stand-in as Trinity and another stand-in as production.

The agent's outcome is scripted by the policy's model version (the stand-in's
``model_version``, as a new checkpoint would change it): version 0 answers well (every call
OK), version 1 badly (every call ERROR); production's calls alternate OK and ERROR. Scored by
``streams.rewards:success``, the policy first wins each window with confidence, so its share
rises in steps to the maximum; the ledger owner is SIGKILLed and restarted (the rollout state
survives: versions and shares go on); then version 1 loses with confidence and the share rolls
back. Both replicas decide every call the same way, by the share in force at its start; an
operator's ``trajstream routing resume`` is applied; ``trajstream compare --replay``
reproduces what was published.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from streams.capture.gateway import Gateway
from streams.capture.routing import ShareBook, decide_route
from streams.core.select import sample_point
from streams.devtools.standin import StandIn
from streams.models import AgentCall, CallPhase, Comparison, RoutingShare
from streams.observe.pages import application
from streams.settings import Settings

from .conftest import base_env, read_topic, wait_for
from .test_gateway import running_gateway

pytestmark = pytest.mark.integration

AGENT = "support"
ROLLOUT = {
    "enabled": True,
    "initial_share": 0.3,
    "step": 0.15,
    "max_share": 0.6,
    "promote_after": 2,
    "rollback_after": 1,
    "apply_delay_s": 1.0,
}
WORKER = {
    "TRAJSTREAM_KAFKA__PARTITIONS": 2,  # as the gateways' settings
    "TRAJSTREAM_SELECTION__STRATEGY": "sampling:0.3",
    "TRAJSTREAM_REWARD__FUNCTION": "streams.rewards:success",
    "TRAJSTREAM_WINDOWS__SIZE_S": 3,
    "TRAJSTREAM_WINDOWS__GRACE_S": 0.3,
    "TRAJSTREAM_COMPARE__MIN_COUNT": 3,
    "TRAJSTREAM_COMMIT__INTERVAL_S": 1,
    "TRAJSTREAM_COMMIT__TICK_S": 0.25,
    "BROKER_SESSION_TIMEOUT": 10,  # a killed worker's partitions move on in seconds
    **{f"TRAJSTREAM_GATEWAY__ROLLOUT__{k.upper()}": str(v).lower() for k, v in ROLLOUT.items()},
}


class Traffic:
    """Calls of one agent, alternating between the replicas, each call on one replica."""

    def __init__(self, replicas: list[Gateway], standin: StandIn) -> None:
        self.replicas = replicas
        self.standin = standin
        self.sent = 0
        self.routes: dict[str, str] = {}
        self.stopped = asyncio.Event()
        self.http: httpx.AsyncClient
        self.clients: dict[str, openai.AsyncOpenAI] = {}

    async def call(self, cid: str, gw: Gateway, ok: bool) -> None:
        headers = {"X-Trajstream-Agent-Name": AGENT}
        # one client per replica (its connections reused), pointed at the call's own path
        client = self.clients[gw.url].with_options(base_url=f"{gw.url}/calls/{cid}/v1")
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "help me"}]
        )
        upstream = raw.headers["x-trajstream-upstream"]
        self.routes[cid] = upstream
        if upstream == "trinity":  # the policy's answer is as good as its model version
            ok = self.standin.state.model_version == 0
        body = {"status": "OK" if ok else "ERROR", "output": "done"}
        r = await self.http.post(f"{gw.url}/calls/{cid}/end", json=body, headers=headers)
        assert r.status_code == 202

    async def run(self, concurrency: int = 6) -> None:
        async def caller() -> None:
            while not self.stopped.is_set():
                n = self.sent
                self.sent += 1
                await self.call(f"c-{n}", self.replicas[n % 2], ok=n % 2 == 0)

        self.clients = {
            gw.url: openai.AsyncOpenAI(
                base_url=f"{gw.url}/v1",
                api_key="k",
                max_retries=0,
                default_headers={"X-Trajstream-Agent-Name": AGENT},
            )
            for gw in self.replicas
        }
        try:
            async with httpx.AsyncClient() as self.http:
                await asyncio.gather(*(caller() for _ in range(concurrency)))
        finally:
            for client in self.clients.values():
                await client.close()


def changes(records: list[Any]) -> list[RoutingShare]:
    seen: dict[int, RoutingShare] = {}
    for r in records:
        if isinstance(r, RoutingShare) and r.agent_name == AGENT:
            seen.setdefault(r.version, r)  # a redelivery after the SIGKILL: the same version
    return [seen[v] for v in sorted(seen)]


async def routing_until(
    bootstrap: str, prefix: str, actions: set[str], timeout: float
) -> list[RoutingShare]:
    records = await read_topic(
        bootstrap,
        f"{prefix}.routing",
        until=lambda rs: any(c.action in actions for c in changes(rs)),
        timeout=timeout,
    )
    found = changes(records)
    assert any(c.action in actions for c in found), (actions, found)
    return found


def cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "streams.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_policy_is_promoted_then_rolled_back_and_replicas_agree(
    kafka_bootstrap, prefix, standin, production, workers, tmp_path
):
    settings = {"TRAJSTREAM_TRINITY__URL": standin.url, **WORKER}
    worker = workers(**settings)
    prod = f"{production.url}/v1"
    async with (
        running_gateway(
            kafka_bootstrap,
            prefix,
            standin.url,
            prod,
            tmp_path / "a",
            strategy="sampling:0.3",
            rollout=ROLLOUT,
        ) as a,
        running_gateway(
            kafka_bootstrap,
            prefix,
            standin.url,
            prod,
            tmp_path / "b",
            strategy="sampling:0.3",
            rollout=ROLLOUT,
        ) as b,
    ):
        traffic = Traffic([a, b], standin)
        task = asyncio.create_task(traffic.run())
        try:
            # the good checkpoint: the share rises in steps to the maximum
            promoted = await routing_until(kafka_bootstrap, prefix, {"promote"}, 90)
            await wait_for(
                lambda: any(c.share == 0.6 for c in (a.follower.book.latest().values())),  # type: ignore[union-attr]
                90,
                "the share at its maximum",
            )
            # the ledger owner dies and another takes over: the rollout state is kept (the
            # agents pause meanwhile, so that the new owner has no long backlog to go through)
            traffic.stopped.set()
            await task
            await asyncio.to_thread(worker.kill)
            worker = workers(**settings)
            standin.state.model_version = 1  # a worse checkpoint
            traffic.stopped.clear()
            task = asyncio.create_task(traffic.run())
            rolled = await routing_until(kafka_bootstrap, prefix, {"rollback", "drift"}, 120)
        finally:
            traffic.stopped.set()
            await task
        books: list[ShareBook] = [gw.follower.book for gw in (a, b)]  # type: ignore[union-attr]
        await wait_for(
            lambda: all(bk.latest()[AGENT].version == rolled[-1].version for bk in books),
            20,
            "both replicas read the rollback",
        )
        assert await a.publisher.flush(20) and await b.publisher.flush(20)

        steps = [(c.version, c.action, c.previous_share, c.share) for c in rolled]
        # the worse checkpoint rolls back: a confident loss, or the drift rule (the policy's
        # window mean under 0.8 x its trailing mean), whichever its first window shows first
        assert steps[:3] == [
            (1, "start", 0.0, 0.3),
            (2, "promote", 0.3, 0.45),
            (3, "promote", 0.45, 0.6),
        ], steps
        assert steps[3:] in ([(4, "rollback", 0.6, 0.0)], [(4, "drift", 0.6, 0.0)]), steps
        assert promoted[1].evidence and all(e.verdict == "better" for e in promoted[1].evidence)
        if rolled[3].action == "rollback":
            assert rolled[3].evidence[0].verdict == "worse"

        # every call: the route it got is the hash rule under the share in force at its start,
        # and both replicas' strategies decide it so
        events = await read_topic(
            kafka_bootstrap,
            f"{prefix}.agent-events",
            until=lambda rs: (
                sum(isinstance(r, AgentCall) and r.phase is CallPhase.START for r in rs)
                >= len(traffic.routes)
            ),
        )
        starts = [e for e in events if isinstance(e, AgentCall) and e.phase is CallPhase.START]
        assert {s.call_id for s in starts} == set(traffic.routes)
        by_share: dict[float | None, int] = {}
        for s in starts:
            ra, rb = decide_route(a.strategy, s, "route"), decide_route(b.strategy, s, "route")
            assert ra == rb, s.call_id
            assert (
                ra.upstream
                == traffic.routes[s.call_id]
                == s.attributes["trajstream.route.upstream"]
            )
            in_force = books[0].share_at(AGENT, s.event_time)
            share = in_force.share if in_force else None
            assert ra.selection.selected is (
                sample_point(s.call_id) < (share if share is not None else 0.3)
            )
            by_share[share] = by_share.get(share, 0) + 1
        assert by_share.get(0.6, 0) > 0  # calls were routed at the maximum share

    comparisons = await read_topic(kafka_bootstrap, f"{prefix}.comparisons")
    verdicts = [c.verdict for c in comparisons if isinstance(c, Comparison) and c.span == "window"]
    assert "better" in verdicts and "worse" in verdicts

    env = {
        **base_env(kafka_bootstrap, prefix, tmp_path),
        **{k: str(v) for k, v in settings.items()},
    }
    # an operator resumes: the rollback (and its commit hold) ends, recorded with who asked
    out = cli(env, "routing", "resume", "--agent", AGENT, "--by", "ops", "--reason", "checked")
    assert "resume" in out
    resumed = await routing_until(kafka_bootstrap, prefix, {"resume"}, 60)
    assert (resumed[-1].version, resumed[-1].share, resumed[-1].requested_by) == (5, 0.0, "ops")
    shown = json.loads(cli(env, "routing", "show", "--json"))
    assert shown[AGENT]["version"] == 5 and shown[AGENT]["action"] == "resume"

    # the status page shows it: both arms' trends, the difference with its band per window,
    # and every routing change with its action and share
    page = await status_page(kafka_bootstrap, prefix)
    chart = re.search(rf'<svg class="compare" data-agent="{AGENT}".*?</svg>', page, re.S)
    assert chart, "no comparison chart for the agent on the status page"
    assert {a for a in re.findall(r'class="arm" data-arm="(\w+)"', chart.group(0))} == {
        "policy",
        "production",
    }
    assert 'class="band"' in chart.group(0)
    shown_verdicts = set(re.findall(r'class="diff"[^>]*data-verdict="(\w+)"', chart.group(0)))
    assert {"better", "worse"} <= shown_verdicts, shown_verdicts
    changes = re.findall(r'<li class="routing" data-action="(\w+)" data-share="([\d.]+)"', page)
    assert [(a, float(s)) for a, s in changes] == [
        (r.action, r.share) for r in [*rolled, resumed[-1]]
    ], changes

    # a replay of the closed windows reproduces the published comparisons and decisions (the
    # worker stopped first: nothing closes between the two reads)
    await asyncio.to_thread(worker.stop)
    published = json.loads(cli(env, "compare", "--agent", AGENT, "--json"))
    replayed = json.loads(cli(env, "compare", "--agent", AGENT, "--replay", "--json"))

    def same(c: dict[str, Any]) -> str:  # a window re-emitted after the SIGKILL: a later time
        return json.dumps({k: v for k, v in c.items() if k != "emitted_at"}, sort_keys=True)

    def decided(rs: list[dict[str, Any]]) -> dict[int, Any]:
        return {r["version"]: r for r in sorted(rs, key=lambda r: r["decided_at"], reverse=True)}

    assert {same(c) for c in replayed["comparisons"]} == {same(c) for c in published["comparisons"]}
    automatic = [r for r in published["routing"] if r["action"] not in ("set", "resume")]
    assert decided(replayed["routing"]) == decided(automatic)


async def status_page(bootstrap: str, prefix: str) -> str:
    """The status page's index (``trajstream status --web``'s application), over real HTTP."""
    settings = Settings(
        app_id=prefix, kafka={"bootstrap_servers": bootstrap, "topic_prefix": prefix}
    )
    runner = web.AppRunner(application(settings, bootstrap))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        async with httpx.AsyncClient(timeout=30) as client:
            got = await client.get(f"http://{host}:{port}/")
        assert got.status_code == 200, got.text[:500]
        return got.text
    finally:
        await runner.cleanup()
