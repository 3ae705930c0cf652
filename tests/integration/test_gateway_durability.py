"""Durability, by SIGKILL of a real ``trajstream gateway`` process, and a start without Kafka.

- ``gateway.durability = acked``: a request is answered once the broker acknowledged its
  records, so after a SIGKILL in the middle of traffic every answered step is on the topic.
- ``buffered`` (the default): what is in memory when the process dies is lost (up to
  ``gateway.buffer_records``), what went to the disk spill is published by the next start. The
  gateway here starts while the cluster is unreachable (connection refused): it serves, spills,
  warns once (a minute) and says so on ``/healthz`` and ``/metrics``.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.devtools.broker import free_port
from streams.models import AgentCall, CallPhase, Completion

from .cluster_chaos import GatewayProcess
from .conftest import base_env, gateway_process, read_topic, wait_for

pytestmark = pytest.mark.integration


def gateway_env(
    bootstrap: str, prefix: str, tmp_path: Path, trinity: str, production: str, **more: str
) -> dict[str, str]:
    env = base_env(bootstrap, prefix, tmp_path)
    env.update(
        TRAJSTREAM_KAFKA__PARTITIONS="2",
        TRAJSTREAM_TRINITY__URL=trinity,
        TRAJSTREAM_SELECTION__STRATEGY="sampling:0.5",
        TRAJSTREAM_GATEWAY__PRODUCTION_URL=f"{production}/v1",
        TRAJSTREAM_GATEWAY__SPILL_DIR=str(tmp_path / "spill"),
        **more,
    )
    return env


def kill(gw: GatewayProcess) -> None:
    assert gw.proc is not None
    os.killpg(gw.proc.pid, signal.SIGKILL)
    gw.proc.wait(10)


async def one_step(http: httpx.AsyncClient, base: str, call_id: str) -> str:
    r = await http.post(
        f"{base}/calls/{call_id}/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": f"q {call_id}"}]},
    )
    r.raise_for_status()
    return str(r.json()["id"])


def steps_by_call(records: list[object]) -> dict[str, Completion]:
    return {r.call_id: r for r in records if isinstance(r, Completion)}


async def test_acked_a_sigkill_loses_nothing_that_was_answered(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    env = gateway_env(
        kafka_bootstrap,
        prefix,
        tmp_path,
        standin.url,
        production.url,
        TRAJSTREAM_GATEWAY__DURABILITY="acked",
    )
    answered: dict[str, str] = {}
    async with gateway_process(env, tmp_path / "gateway.log") as gw:
        stop = asyncio.Event()

        async def agent(n: int) -> None:
            async with httpx.AsyncClient(timeout=10) as http:
                i = 0
                while not stop.is_set():
                    cid = f"acked-{n}-{i}"
                    i += 1
                    try:
                        answered[cid] = await one_step(http, gw.url, cid)
                    except httpx.HTTPError:
                        return  # the process is gone: this one was not answered

        agents = [asyncio.create_task(agent(n)) for n in range(6)]
        await wait_for(lambda: len(answered) >= 60, timeout=60, what="60 answered calls")
        kill(gw)  # in the middle of traffic
        stop.set()
        await asyncio.gather(*agents)
    records = await read_topic(
        kafka_bootstrap,
        f"{prefix}.agent-events",
        until=lambda got: set(answered) <= set(steps_by_call(got)),
        timeout=30,
    )
    steps = steps_by_call(records)
    missing = set(answered) - set(steps)
    assert not missing, f"answered but not on the topic: {sorted(missing)[:5]}"
    assert all(steps[c].response_id == rid for c, rid in answered.items())


async def test_buffered_starts_without_kafka_spills_and_a_sigkill_loses_only_memory(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    nowhere = f"127.0.0.1:{free_port()}"  # connection refused
    env = gateway_env(
        nowhere,
        prefix,
        tmp_path,
        standin.url,
        production.url,
        TRAJSTREAM_GATEWAY__BUFFER_RECORDS="4",
    )
    log = tmp_path / "gateway.log"
    calls = [f"buf-{i}" for i in range(10)]
    async with gateway_process(env, log) as gw:  # it starts, though no broker answers
        try:
            async with httpx.AsyncClient(timeout=10) as http:
                answered = {c: await one_step(http, gw.url, c) for c in calls}  # START + step
                health = (await http.get(f"{gw.url}/healthz")).json()
                metrics = (await http.get(f"{gw.url}/metrics")).text
        finally:
            kill(gw)  # what is in memory dies with it
    assert health["status"] == "degraded"
    assert health["publisher"]["kafka_connected"] is False
    assert health["publisher"]["unreachable_s"] is not None
    assert (health["publisher"]["buffered"], health["publisher"]["spill_records"]) == (4, 16)
    assert "trajstream_gateway_kafka_up 0.0" in metrics
    assert "trajstream_gateway_buffered_records 4.0" in metrics
    assert "trajstream_gateway_spill_records 16.0" in metrics
    text = log.read_text()
    assert "starting without Kafka" in text
    assert text.count("Kafka not reachable") == 1  # once a minute, not once a retry

    # the next start (the cluster back) publishes the spill; memory died with the process
    env["TRAJSTREAM_KAFKA__BOOTSTRAP_SERVERS"] = kafka_bootstrap
    async with gateway_process(env, tmp_path / "gateway-2.log") as again:
        async with httpx.AsyncClient() as http:

            async def drained() -> bool:
                p = (await http.get(f"{again.url}/healthz")).json()["publisher"]
                return p["spill_records"] == 0 and p["kafka_connected"]

            for _ in range(100):
                if await drained():
                    break
                await asyncio.sleep(0.3)
            assert await drained()
    records = await read_topic(
        kafka_bootstrap,
        f"{prefix}.agent-events",
        until=lambda got: len({r.call_id for r in got if isinstance(r, Completion)}) >= 8,
        timeout=30,
    )
    steps = steps_by_call(records)
    starts = {r.call_id for r in records if isinstance(r, AgentCall) and r.phase is CallPhase.START}
    # the first 4 records (START and step of buf-0 and buf-1) were in memory: lost
    assert set(steps) == set(calls[2:]) and starts == set(calls[2:])
    assert all(steps[c].response_id == answered[c] for c in calls[2:])


def recorder_pid(gw: GatewayProcess) -> int:
    """The gateway's recorder process (``gateway.recorder = process``, the default)."""
    assert gw.proc is not None
    children = [
        int(pid)
        for task in Path(f"/proc/{gw.proc.pid}/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    assert len(children) == 1, children
    return children[0]


async def recorder_stops(recorder: int, timeout: float) -> None:
    """The recorder, its serving process killed, publishes what it holds and exits."""
    await wait_for(
        lambda: (
            not Path(f"/proc/{recorder}").exists()
            or "zombie" in Path(f"/proc/{recorder}/status").read_text()
        ),
        timeout=timeout,
        what="the recorder to publish and stop by itself",
    )


async def answered_not_on_topic(bootstrap: str, prefix: str, answered: dict[str, str]) -> set[str]:
    records = await read_topic(
        bootstrap,
        f"{prefix}.agent-events",
        until=lambda got: set(answered) <= set(steps_by_call(got)),
        timeout=30,
    )
    return set(answered) - set(steps_by_call(records))


async def traffic_until_killed(
    gw: GatewayProcess, answered: dict[str, str], kill_after: int, kill: Any
) -> None:
    """Six agents of one-step calls; ``kill()`` once ``kill_after`` were answered."""
    stop = asyncio.Event()

    async def agent(n: int) -> None:
        async with httpx.AsyncClient(timeout=10) as http:
            i = 0
            while not stop.is_set():
                cid = f"{kill_after}-{n}-{i}"
                i += 1
                try:
                    answered[cid] = await one_step(http, gw.url, cid)
                except httpx.HTTPError:
                    return  # the process is gone: this one was not answered

    agents = [asyncio.create_task(agent(n)) for n in range(6)]
    await wait_for(lambda: len(answered) >= kill_after, timeout=60, what="answered calls")
    kill()  # in the middle of traffic
    stop.set()
    await asyncio.gather(*agents)


async def test_buffered_the_serving_process_killed_alone_its_recorder_publishes_all_it_held(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    """The records are in the recorder process, not in the one killed: it reads the end of
    its pipe, publishes what it holds and stops, so nothing answered is lost."""
    env = gateway_env(kafka_bootstrap, prefix, tmp_path, standin.url, production.url)
    answered: dict[str, str] = {}
    async with gateway_process(env, tmp_path / "gateway.log") as gw:
        recorder = recorder_pid(gw)
        assert gw.proc is not None
        await traffic_until_killed(gw, answered, 60, lambda: os.kill(gw.proc.pid, signal.SIGKILL))
        gw.proc.wait(10)
        await recorder_stops(recorder, timeout=30)
    missing = await answered_not_on_topic(kafka_bootstrap, prefix, answered)
    assert not missing, f"answered but not on the topic: {sorted(missing)[:5]}"
    assert "the gateway closed the recorder's pipe" in (tmp_path / "gateway.log").read_text()


async def test_buffered_answers_once_the_recorder_s_pipe_has_the_records(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    """The recorder stopped (SIGSTOP), its pipe fills: buffered requests wait for room in it
    instead of being answered with their records in the serving process's memory; the serving
    process killed, the recorder continued, every answered step is on the topic."""
    env = gateway_env(
        kafka_bootstrap,
        prefix,
        tmp_path,
        standin.url,
        production.url,
        TRAJSTREAM_GATEWAY__ACK_TIMEOUT_S="120",
    )
    answered: dict[str, str] = {}
    async with gateway_process(env, tmp_path / "gateway.log") as gw:
        recorder = recorder_pid(gw)
        assert gw.proc is not None
        os.kill(recorder, signal.SIGSTOP)
        try:
            stop = asyncio.Event()

            async def agent(n: int) -> None:
                async with httpx.AsyncClient(timeout=60) as http:
                    i = 0
                    while not stop.is_set():
                        cid = f"pipe-{n}-{i}"
                        i += 1
                        try:
                            r = await http.post(
                                f"{gw.url}/calls/{cid}/v1/chat/completions",
                                json={  # about 40 KB of request per job in the pipe
                                    "model": "m",
                                    "messages": [{"role": "user", "content": "q" * 40_000}],
                                },
                            )
                            r.raise_for_status()
                            answered[cid] = str(r.json()["id"])
                        except httpx.HTTPError:
                            return  # the process is gone: this one was not answered

            agents = [asyncio.create_task(agent(n)) for n in range(4)]
            # the pipe holds 1 MiB (recorder.PIPE_BYTES): the answers stop well before 200
            # requests (they would not, were the records kept in the serving process's memory)
            before = -1
            while len(answered) != before and len(answered) < 200:
                before = len(answered)
                await asyncio.sleep(1.5)
            assert 0 < len(answered) < 200, f"{len(answered)} answered with the recorder stopped"
            os.kill(gw.proc.pid, signal.SIGKILL)  # the serving process alone
            gw.proc.wait(10)
            stop.set()
            await asyncio.gather(*agents)
        finally:
            os.kill(recorder, signal.SIGCONT)
        await recorder_stops(recorder, timeout=60)
    missing = await answered_not_on_topic(kafka_bootstrap, prefix, answered)
    assert not missing, f"answered but not on the topic: {len(missing)} of {len(answered)}"


async def test_a_killed_recorder_process_is_started_again_and_recording_goes_on(
    kafka_bootstrap, prefix, standin, production, tmp_path
):
    env = gateway_env(
        kafka_bootstrap,
        prefix,
        tmp_path,
        standin.url,
        production.url,
        TRAJSTREAM_GATEWAY__DURABILITY="acked",
    )
    log = tmp_path / "gateway.log"
    async with gateway_process(env, log) as gw:
        first = recorder_pid(gw)
        os.kill(first, signal.SIGKILL)
        await wait_for(
            lambda: "starting it again" in log.read_text(), timeout=30, what="the restart"
        )
        await wait_for(
            lambda: recorder_pid(gw) != first, timeout=60, what="a new recorder process"
        )
        async with httpx.AsyncClient(timeout=30) as http:
            # acked: answered only once the new recorder's producer acknowledged them
            after = {c: await one_step(http, gw.url, c) for c in ("again-0", "again-1")}
            health = (await http.get(f"{gw.url}/healthz")).json()
    assert health["status"] == "ok" and health["publisher"]["recorder"] == "process"
    records = await read_topic(
        kafka_bootstrap,
        f"{prefix}.agent-events",
        until=lambda got: set(after) <= set(steps_by_call(got)),
        timeout=30,
    )
    steps = steps_by_call(records)
    assert {c: steps[c].response_id for c in after} == after
