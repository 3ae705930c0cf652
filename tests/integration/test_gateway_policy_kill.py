"""The policy killed under load: a Trinity stand-in process (``trajstream standin --journal``,
as Trinity keeps its rows in a database) SIGKILLed and started again on its port while agents
run two-step calls through a ``trajstream gateway`` process with the official ``openai``
client, a real broker and a real worker.

Every call is answered 200 (production answers what the policy cannot: the requests cut by
the kill and refused while it is down, then the breaker's); the breaker opened and closed
(from the gateway's ``/metrics``); every call Trinity answered whole is trained exactly once;
no id production issued ever reaches ``/feedback``; each step says who answered, why production
did, and the policy's version (at most one sync behind the stand-in's, as the gateway reads it
every ``policy_version_poll_s``). The figures (fallbacks by reason, breaker transitions,
latencies by path) are printed.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from streams.broker import free_port
from streams.devtools.standin import fetch_state
from streams.models import Completion, StepKind
from streams.standin import StandIn
from streams.topics import Topics

from .conftest import REPO_ROOT, base_env, gateway_process, read_topic
from .test_gateway import TOOLS
from .test_gateway_apis import ends

pytestmark = [pytest.mark.integration, pytest.mark.long]

CALLS = 300
AGENTS = 16
PACE_S = 0.25
KILL_AFTER = 70  # calls answered before the kill


@dataclass
class TrinityProcess:
    """``trajstream standin`` as a process on a fixed port, with its journal."""

    port: int
    journal: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        self.starts += 1
        with self.log.open("ab") as fh:
            return subprocess.Popen(
                [sys.executable, "-m", "streams.cli", "standin", "--port", str(self.port),
                 "--journal", str(self.journal), "--sync-interval", "3"],
                env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                start_new_session=True,
            )  # fmt: skip

    async def start(self, env: dict[str, str]) -> None:
        self.proc = self.spawn(env)
        async with httpx.AsyncClient() as http:
            for _ in range(200):
                try:
                    if (await http.get(f"{self.url}/health")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                assert self.proc.poll() is None, self.log.read_text()
                await asyncio.sleep(0.1)
        raise AssertionError("the stand-in did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class Answer:
    call_id: str
    turn: int
    status: int
    upstream: str
    fallback: str | None
    response_id: str
    ms: float


@dataclass
class Agents:
    """``AGENTS`` agents running ``CALLS`` calls (ask -> tool call -> result -> answer), each
    answer noted; a call that is not answered 200 is noted as an error."""

    url: str
    answers: list[Answer] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    done: int = 0

    async def run(self) -> None:
        numbers = itertools.count()
        base = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key="k", max_retries=0)
        async with httpx.AsyncClient(timeout=30) as http:

            async def agent() -> None:
                while (n := next(numbers)) < CALLS:
                    call_id = f"k{n}"
                    try:
                        client = base.with_options(base_url=f"{self.url}/calls/{call_id}/v1")
                        await self.call(client, call_id)
                        r = await http.post(f"{self.url}/calls/{call_id}/end", json={})
                        assert r.status_code == 202, r.text
                    except Exception as exc:  # counted: the test fails on any
                        self.errors.append(f"{call_id}: {type(exc).__name__}: {exc}")
                    self.done += 1
                    await asyncio.sleep(PACE_S)

            await asyncio.gather(*(agent() for _ in range(AGENTS)))

    async def call(self, client: openai.AsyncOpenAI, call_id: str) -> None:
        messages: list[Any] = [{"role": "user", "content": f"Where is order {call_id}?"}]
        for turn in range(2):
            began = time.perf_counter()
            raw = await client.chat.completions.with_raw_response.create(
                model="agent-model", messages=messages, tools=TOOLS
            )
            completion = raw.parse()
            self.answers.append(
                Answer(
                    call_id, turn, raw.status_code, raw.headers["x-trajstream-upstream"],
                    raw.headers.get("x-trajstream-fallback"), completion.id,
                    (time.perf_counter() - began) * 1000,
                )
            )  # fmt: skip
            if turn == 0:
                (tool,) = completion.choices[0].message.tool_calls or []
                messages.append(completion.choices[0].message.model_dump(exclude_none=True))
                messages.append({"role": "tool", "tool_call_id": tool.id, "content": "shipped"})


async def policy_state(url: str) -> str:
    async with httpx.AsyncClient() as http:
        return str((await http.get(f"{url}/healthz")).json()["policy"]["state"])


async def until(predicate: Any, timeout: float, what: str) -> None:
    """Poll ``predicate`` (a function, async or not) until true; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


@pytest.mark.timeout(180)
async def test_a_policy_killed_under_load_costs_no_call_and_trains_each_of_its_calls_once(
    kafka_bootstrap: str,
    prefix: str,
    production: StandIn,
    workers: Any,
    tmp_path: Path,
) -> None:
    env = base_env(kafka_bootstrap, prefix, tmp_path)
    trinity = TrinityProcess(free_port(), tmp_path / "journal.jsonl", tmp_path / "standin.log")
    await trinity.start(env)
    try:
        workers(
            TRAJSTREAM_TRINITY__URL=trinity.url,
            TRAJSTREAM_SELECTION__STRATEGY="sampling:1",
            TRAJSTREAM_COMMIT__INTERVAL_S=1,
        )
        gateway_env = {
            **env,
            "TRAJSTREAM_TRINITY__URL": trinity.url,
            "TRAJSTREAM_SELECTION__STRATEGY": "sampling:1",
            "TRAJSTREAM_GATEWAY__PRODUCTION_URL": f"{production.url}/v1",
            "TRAJSTREAM_GATEWAY__SPILL_DIR": str(tmp_path / "spill"),
            "TRAJSTREAM_GATEWAY__POLICY_TIMEOUT_S": "2",
            "TRAJSTREAM_GATEWAY__POLICY_VERSION_POLL_S": "0.5",
            "TRAJSTREAM_GATEWAY__BREAKER__FAILURES": "3",
            "TRAJSTREAM_GATEWAY__BREAKER__COOLDOWN_S": "1",
            "TRAJSTREAM_GATEWAY__BREAKER__PROBES": "2",
        }
        began = time.monotonic()
        async with gateway_process(gateway_env, tmp_path / "gateway.log") as gw:
            ready = time.monotonic() - began
            agents = Agents(gw.url)
            traffic = asyncio.create_task(agents.run())
            await until(lambda: agents.done >= KILL_AFTER, 60, f"{KILL_AFTER} calls answered")
            trinity.kill()  # in the middle of requests: their connections reset
            await until(lambda: _is(gw.url, "open"), 30, "the breaker to open")
            await asyncio.sleep(1.5)  # refused meanwhile: production answers at no cost
            await trinity.start(env)  # the same port, the same journal
            await until(lambda: _is(gw.url, "closed"), 30, "the breaker to close")
            await traffic
            ran = time.monotonic() - began - ready
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"{gw.url}/metrics")).text

        # every call answered 200, by whichever upstream could
        assert agents.errors == [] and agents.done == CALLS
        assert len(agents.answers) == 2 * CALLS and {a.status for a in agents.answers} == {200}
        by_call: dict[str, list[Answer]] = {}
        for a in agents.answers:
            by_call.setdefault(a.call_id, []).append(a)
        upstreams = {c: [a.upstream for a in ans] for c, ans in by_call.items()}
        whole = {c for c, u in upstreams.items() if u == ["trinity", "trinity"]}
        mixed = {c for c, u in upstreams.items() if u == ["trinity", "production"]}
        fallen = set(by_call) - whole - mixed
        reasons = [a.fallback for a in agents.answers if a.fallback]
        assert "connect" in reasons and "breaker_open" in reasons

        # the breaker opened and closed, and says so in its metrics
        def metric(name: str) -> float:
            (line,) = [ln for ln in metrics.splitlines() if ln.startswith(name + " ")]
            return float(line.rsplit(" ", 1)[1])

        moves = {
            to: metric(f'trajstream_gateway_policy_breaker_transitions_total{{to="{to}"}}')
            for to in ("open", "half_open", "closed")
        }
        assert moves["open"] >= 1 and moves["closed"] >= 1
        assert metric('trajstream_gateway_policy_breaker_state{state="closed"}') == 1
        counted = {
            r: metric(f'trajstream_gateway_policy_fallbacks_total{{api="chat",reason="{r}"}}')
            for r in ("connect", "timeout", "status_5xx", "breaker_open", "sticky")
        }
        assert counted == {r: float(reasons.count(r)) for r in counted}

        # every call Trinity answered whole trained once; nothing of production's fed back
        trinity_ids = {a.response_id for c in whole for a in by_call[c]}
        deadline = time.monotonic() + 60
        while True:
            state = await fetch_state(trinity.url, http_timeout=30)
            if trinity_ids <= set(state["trained"]) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        assert trinity_ids <= set(state["trained"])
        assert len(state["trained"]) == len(set(state["trained"]))
        settled = time.monotonic() - began - ready - ran
        production_ids = set(production.state.experiences)
        fed = {i for f in state["feedback"] for i in (f["body"] or {}).get("msg_ids", [])}
        assert not fed & production_ids
        assert {a.response_id for a in agents.answers if a.upstream == "production"} <= (
            production_ids
        )

        # each step says who answered, why production did, and the version that served it
        records = await read_topic(
            kafka_bootstrap, Topics(prefix, 4).agent_events, until=ends(CALLS), timeout=60
        )
        steps = {
            (r.call_id, r.response_id): r
            for r in records
            if isinstance(r, Completion) and r.kind is StepKind.LLM
        }
        served = {e["msg_id"]: e["model_version"] for e in state["experiences"]}
        behind = unknown = 0
        for a in agents.answers:
            step = steps[(a.call_id, a.response_id)]
            assert (step.upstream, step.fallback) == (a.upstream, a.fallback)
            if a.upstream == "trinity":
                if step.policy_version is None:
                    unknown += 1
                    continue
                assert 0 <= served[a.response_id] - step.policy_version <= 1, a
                behind += served[a.response_id] != step.policy_version
            else:
                assert step.policy_version is None and step.msg_id is None

        latency = {}
        for key in ("trinity", "production", *sorted(set(reasons))):
            ms = [
                a.ms for a in agents.answers
                if (a.fallback or a.upstream) == key and (key != "production" or not a.fallback)
            ]  # fmt: skip
            latency[key] = (len(ms), round(pct(ms, 50), 1), round(pct(ms, 99), 1))
        print(
            f"\n{CALLS} calls, {len(agents.answers)} requests answered 200, "
            f"{len(agents.errors)} client-visible errors; calls: {len(whole)} by Trinity, "
            f"{len(mixed)} mixed, {len(fallen)} by production; fallbacks by reason "
            f"{ {r: reasons.count(r) for r in sorted(set(reasons))} }; breaker transitions "
            f"{moves}; trained {len(state['trained'])} ids (every one of the "
            f"{len(trinity_ids)} of calls Trinity answered whole), 0 of production's; "
            f"versions: {behind} one sync behind, {unknown} not known; "
            f"latency ms (n, p50, p99) {latency}; gateway ready {ready:.1f}s, traffic "
            f"{ran:.1f}s, trained {settled:.1f}s after, load average {os.getloadavg()}"
        )
    finally:
        trinity.kill()


async def _is(url: str, state: str) -> bool:
    try:
        return await policy_state(url) == state
    except httpx.HTTPError:
        return False
