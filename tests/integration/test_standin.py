"""The Trinity stand-in over real loopback HTTP, driven by TrinityClient and raw httpx.

No Kafka needed (hence not marked ``integration``); these live here because they open sockets.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.devtools.broker import free_port
from streams.devtools.standin import (
    ChatFault,
    Fault,
    StandIn,
    fetch_state,
    reset_state,
    set_fault,
)
from streams.errors import TrinityRejected, TrinityUnavailable
from streams.io.trinity import TrinityClient

CHATCMPL = re.compile(r"^chatcmpl-[0-9a-f]{32}$")
METRIC_KEYS = {
    "rollout/model_0/total_request_count",
    "rollout/model_0/model_version",
    "rollout/total_experience_count",
    "rollout/ready_experience_count",
    "explore_step_num",
}


@pytest.fixture
async def standin() -> AsyncIterator[StandIn]:
    server = StandIn()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def trinity(standin: StandIn) -> AsyncIterator[TrinityClient]:
    async with TrinityClient(standin.url, timeout=2.0) as client:
        yield client


@pytest.fixture
async def raw(standin: StandIn) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=standin.url, timeout=2.0) as client:
        yield client


def chat_body(text: str = "What is 2 + 2?", **extra: Any) -> dict[str, Any]:
    return {
        "model": "agent-model",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": text},
        ],
        **extra,
    }


async def serve(trinity: TrinityClient, n: int) -> list[str]:
    return [(await trinity.chat(chat_body(f"question {i}")))["id"] for i in range(n)]


# -- chat, models, health, metrics ---------------------------------------------------------------


async def test_chat_serves_fresh_ids_and_records_one_experience_each(
    standin: StandIn, trinity: TrinityClient
) -> None:
    first = await trinity.chat(chat_body())
    second = await trinity.chat(chat_body())
    assert CHATCMPL.match(first["id"]) and CHATCMPL.match(second["id"])
    assert first["id"] != second["id"]
    assert first["object"] == "chat.completion" and first["model"] == "agent-model"
    message = first["choices"][0]["message"]
    assert message["role"] == "assistant"
    assert "What is 2 + 2?" in message["content"]
    assert message["content"] == second["choices"][0]["message"]["content"]  # deterministic
    usage = first["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert list(standin.state.experiences) == [first["id"], second["id"]]
    row = standin.state.experiences[first["id"]]
    assert (row.rewarded, row.reward, row.prompt) == (False, None, "What is 2 + 2?")


async def test_the_process_stand_in_keeps_what_it_served_out_of_full_collections(
    standin: StandIn, trinity: TrinityClient
) -> None:
    """``trajstream standin`` freezes what it keeps (its full collections would otherwise scan
    every experience ever served); a reset lets the dropped state be collected again."""
    before = gc.get_freeze_count()
    freezer = asyncio.create_task(standin._keep_state_out_of_collections(0.05))
    try:
        await serve(trinity, 3)
        await asyncio.sleep(0.2)
        assert gc.get_freeze_count() > before
        tracked = {id(o) for o in gc.get_objects()}  # the permanent generation excluded
        assert not {id(e) for e in standin.state.experiences.values()} & tracked
        freezer.cancel()
        await standin.reset()
        assert gc.get_freeze_count() == 0
    finally:
        freezer.cancel()
        gc.unfreeze()


async def test_chat_reply_follows_the_last_user_message(trinity: TrinityClient) -> None:
    body = chat_body("first")
    body["messages"] += [
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "second question"}]},
    ]
    reply = await trinity.chat(body)
    assert "second question" in reply["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("content", "status", "key"),
    [
        (b"{not json", 400, "detail"),
        (json.dumps({"model": "m"}).encode(), 400, "error"),
        (json.dumps({"model": "m", "messages": []}).encode(), 400, "error"),
    ],
)
async def test_chat_bad_requests(
    standin: StandIn, raw: httpx.AsyncClient, content: bytes, status: int, key: str
) -> None:
    response = await raw.post("/v1/chat/completions", content=content)
    assert response.status_code == status
    assert key in response.json()
    assert standin.state.experiences == {}


async def test_chat_stream_is_sse_with_one_id_and_is_recorded(
    standin: StandIn, raw: httpx.AsyncClient, trinity: TrinityClient
) -> None:
    async with raw.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line async for line in response.aiter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    ids = {chunk["id"] for chunk in chunks}
    assert len(ids) == 1
    [msg_id] = ids
    assert CHATCMPL.match(msg_id)
    text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
    assert "What is 2 + 2?" in text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert msg_id in standin.state.experiences
    await trinity.feedback([msg_id], 1.0)
    assert standin.state.ready == [msg_id]


async def test_health_models_and_metrics(
    raw: httpx.AsyncClient, trinity: TrinityClient, standin: StandIn
) -> None:
    health = await raw.get("/health")
    assert (health.status_code, health.content) == (200, b"")
    assert await trinity.health() is True
    models = (await raw.get("/v1/models")).json()
    assert models["object"] == "list" and models["data"][0]["id"] == standin.model

    metrics = await trinity.metrics()
    assert set(metrics) == METRIC_KEYS
    assert set(metrics.values()) == {0}

    ids = await serve(trinity, 3)
    await trinity.feedback(ids[:2], 1.0)
    await trinity.commit()
    await trinity.feedback(ids[2:], 0.0)
    assert await trinity.metrics() == {
        "rollout/model_0/total_request_count": 3,
        "rollout/model_0/model_version": 0,
        "rollout/total_experience_count": 3,
        # As in Trinity: every experience ever made ready, not the ones waiting now.
        "rollout/ready_experience_count": 3,
        "explore_step_num": 1,
    }


# -- feedback and commit -------------------------------------------------------------------------


async def test_feedback_then_commit_drains_and_advances_the_step(
    standin: StandIn, trinity: TrinityClient
) -> None:
    ids = await serve(trinity, 3)
    assert await trinity.feedback(ids[:2], 0.75, task_id="task-7", run_id=2) == {
        "status": "success"
    }
    state = standin.state
    assert state.ready == ids[:2]
    for msg_id in ids[:2]:
        row = state.experiences[msg_id]
        assert (row.rewarded, row.reward, row.task_id, row.run_id) == (True, 0.75, "task-7", 2)
    assert not state.experiences[ids[2]].rewarded

    assert await trinity.commit() == {"status": "success"}
    assert state.explore_step == 1
    assert state.ready == []
    assert state.trained == ids[:2]
    [commit] = state.commits
    assert (commit.status, commit.drained, commit.step, commit.msg_ids) == (200, 2, 1, ids[:2])
    assert state.experiences[ids[0]].committed_at_step == 1


async def test_run_id_defaults_to_zero_and_task_id_to_null(
    standin: StandIn, trinity: TrinityClient
) -> None:
    [msg_id] = await serve(trinity, 1)
    await trinity.feedback([msg_id], 1.0)
    row = standin.state.experiences[msg_id]
    assert (row.task_id, row.run_id) == (None, 0)


async def test_repeat_feedback_is_a_silent_no_op(standin: StandIn, trinity: TrinityClient) -> None:
    [msg_id] = await serve(trinity, 1)
    await trinity.feedback([msg_id], 1.0, task_id="a", run_id=0)
    assert await trinity.feedback([msg_id], -1.0, task_id="b", run_id=1) == {"status": "success"}
    row = standin.state.experiences[msg_id]
    assert (row.reward, row.task_id, row.run_id) == (1.0, "a", 0)
    assert standin.state.ready == [msg_id]
    assert [r.applied for r in standin.state.feedback] == [[msg_id], []]
    # Committed rows stay rewarded: feedback after the commit is still a no-op.
    await trinity.commit()
    await trinity.feedback([msg_id], 0.5)
    assert standin.state.ready == [] and row.reward == 1.0


async def test_unknown_ids_are_accepted_and_change_nothing(
    standin: StandIn, trinity: TrinityClient
) -> None:
    [known] = await serve(trinity, 1)
    assert await trinity.feedback(["chatcmpl-never-served"], 1.0) == {"status": "success"}
    assert standin.state.ready == []
    await trinity.feedback(["chatcmpl-never-served", known, known], 1.0)
    assert standin.state.ready == [known]


async def test_empty_commit_still_advances_the_step(
    standin: StandIn, trinity: TrinityClient
) -> None:
    await trinity.commit()
    await trinity.commit()
    assert standin.state.explore_step == 2
    assert [(c.drained, c.step) for c in standin.state.commits] == [(0, 1), (0, 2)]
    assert (await trinity.metrics())["explore_step_num"] == 2


async def test_commit_ignores_its_body(standin: StandIn, raw: httpx.AsyncClient) -> None:
    for content in (b"", b"not json", b'{"anything": 1}'):
        response = await raw.post("/commit", content=content)
        assert (response.status_code, response.json()) == (200, {"status": "success"})
    assert standin.state.explore_step == 3


REQUIRED = {"error": "msg_ids and reward are required"}
TYPES = {"error": "msg_ids must be a list and reward must be a number"}


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({}, REQUIRED),
        ({"msg_ids": ["m"]}, REQUIRED),
        ({"reward": 1.0}, REQUIRED),
        ({"msg_ids": None, "reward": 1.0}, REQUIRED),
        ({"msg_ids": ["m"], "reward": None}, REQUIRED),
        ({"msg_ids": "m", "reward": 1.0}, TYPES),
        ({"msg_ids": {"m": 1}, "reward": 1.0}, TYPES),
        ({"msg_ids": ["m"], "reward": "1"}, TYPES),
        ({"msg_ids": ["m"], "reward": True}, TYPES),  # bool is not a number here
        ({"msg_ids": ["m"], "reward": [1]}, TYPES),
    ],
)
async def test_feedback_400_bodies_are_the_contract_ones(
    standin: StandIn, raw: httpx.AsyncClient, payload: dict[str, Any], expected: dict[str, str]
) -> None:
    response = await raw.post("/feedback", json=payload)
    assert response.status_code == 400
    assert response.json() == expected
    assert [(r.body, r.status) for r in standin.state.feedback] == [(payload, 400)]


@pytest.mark.parametrize("content", [b"", b"{", b"[1, 2]", b'"text"'])
async def test_feedback_that_is_not_a_json_object_is_400_detail(
    standin: StandIn, raw: httpx.AsyncClient, content: bytes
) -> None:
    response = await raw.post("/feedback", content=content)
    assert response.status_code == 400
    assert response.json()["detail"].startswith("Invalid JSON")
    assert standin.state.feedback[0].body == content.decode()


async def test_feedback_rejected_by_trinity_surfaces_as_trinity_rejected(
    trinity: TrinityClient, standin: StandIn
) -> None:
    await standin.set_fault(Fault(mode="error", status=400, count=1))
    with pytest.raises(TrinityRejected) as info:
        await trinity.feedback(["m"], 1.0)
    assert info.value.status == 400


async def test_contract_breaches_trinity_accepts_are_noted(
    standin: StandIn, raw: httpx.AsyncClient
) -> None:
    payload = {"msg_ids": ["m", 3], "reward": 1, "task_id": "t" * 65, "run_id": "zero"}
    response = await raw.post("/feedback", json=payload)
    assert response.status_code == 200
    assert len(standin.state.feedback[0].violations) == 3


# -- introspection ---------------------------------------------------------------------------------


async def test_state_lists_feedback_and_commits_in_order(
    standin: StandIn, trinity: TrinityClient
) -> None:
    ids = await serve(trinity, 3)
    for i, msg_id in enumerate(ids):
        await trinity.feedback([msg_id], float(i), task_id=f"task-{i}")
    await trinity.commit()
    await trinity.commit()

    state = await fetch_state(standin.url)
    assert [r["body"] for r in state["feedback"]] == [
        {"msg_ids": [msg_id], "reward": float(i), "task_id": f"task-{i}"}
        for i, msg_id in enumerate(ids)
    ]
    assert [r["applied"] for r in state["feedback"]] == [[m] for m in ids]
    times = [r["at"] for r in state["feedback"]] + [c["at"] for c in state["commits"]]
    assert times == sorted(times) and times[-1] <= time.monotonic()
    assert [(c["drained"], c["step"]) for c in state["commits"]] == [(3, 1), (0, 2)]
    assert state["explore_step"] == 2
    assert state["trained"] == ids and state["ready"] == []
    assert [(e["msg_id"], e["reward"], e["rewarded"]) for e in state["experiences"]] == [
        (m, float(i), True) for i, m in enumerate(ids)
    ]
    assert state["fault"] == {"mode": "ok"}
    assert set(state["metrics"]) == METRIC_KEYS


async def test_reset_forgets_everything(standin: StandIn, trinity: TrinityClient) -> None:
    ids = await serve(trinity, 2)
    await trinity.feedback(ids, 1.0)
    await trinity.commit()
    await set_fault(standin.url, {"mode": "error", "status": 503})
    await reset_state(standin.url)
    state = await fetch_state(standin.url)
    assert (state["explore_step"], state["feedback"], state["commits"]) == (0, [], [])
    assert (state["experiences"], state["fault"]) == ([], {"mode": "ok"})
    assert await trinity.commit() == {"status": "success"}


@pytest.mark.parametrize(
    "fault",
    [
        {"mode": "bogus"},
        {"mode": "error", "status": 200},
        {"mode": "error", "status": "503"},
        {"mode": "error", "count": 0},
        {"mode": "slow", "delay": -1},
        {"mode": "down", "seconds": "soon"},
        ["mode", "ok"],
    ],
)
async def test_bad_fault_requests_are_400(
    raw: httpx.AsyncClient, standin: StandIn, fault: Any
) -> None:
    response = await raw.post("/_standin/fault", json=fault)
    assert response.status_code == 400
    assert standin.state.fault == Fault()


# -- fault injection ----------------------------------------------------------------------------


async def test_error_fault_answers_the_next_n_feedback_and_commit_requests(
    standin: StandIn, trinity: TrinityClient
) -> None:
    [msg_id] = await serve(trinity, 1)
    await set_fault(standin.url, {"mode": "error", "status": 503, "count": 3})
    for call in (
        trinity.feedback([msg_id], 1.0),
        trinity.commit(),
        trinity.feedback([msg_id], 1.0),
    ):
        with pytest.raises(TrinityUnavailable) as info:
            await call
        assert info.value.status == 503
    # Chat, metrics and health are not affected and do not count.
    assert (await trinity.metrics())["explore_step_num"] == 0
    assert await trinity.feedback([msg_id], 1.0) == {"status": "success"}
    assert await trinity.commit() == {"status": "success"}
    state = standin.state
    assert [r.status for r in state.feedback] == [503, 503, 200]
    assert [r.applied for r in state.feedback] == [[], [], [msg_id]]
    assert [(c.status, c.drained) for c in state.commits] == [(503, 0), (200, 1)]
    assert state.explore_step == 1 and state.fault.mode == "ok"


async def test_error_fault_without_count_lasts_until_cleared(
    standin: StandIn, trinity: TrinityClient
) -> None:
    await set_fault(standin.url, {"mode": "error", "status": 500})
    for _ in range(3):
        with pytest.raises(TrinityUnavailable):
            await trinity.commit()
    await set_fault(standin.url, {"mode": "ok"})
    await trinity.commit()
    assert standin.state.explore_step == 1


async def test_slow_fault_delays_the_answer(standin: StandIn, trinity: TrinityClient) -> None:
    await set_fault(standin.url, {"mode": "slow", "delay": 0.3, "count": 1})
    started = time.monotonic()
    await trinity.commit()
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    await trinity.commit()  # the count is spent
    assert time.monotonic() - started < 0.3
    assert standin.state.explore_step == 2


async def test_slow_fault_past_the_client_timeout_is_unavailable_but_still_applied(
    standin: StandIn,
) -> None:
    async with TrinityClient(standin.url, timeout=0.2) as impatient:
        [msg_id] = await serve(impatient, 1)
        await set_fault(standin.url, {"mode": "slow", "delay": 0.6, "count": 1})
        with pytest.raises(TrinityUnavailable) as info:
            await impatient.feedback([msg_id], 1.0, task_id="t")
        assert isinstance(info.value.__cause__, httpx.TimeoutException)
        # The server applies it once the delay is over, like a real one that was only slow;
        # the pipeline's retry is then a harmless no-op.
        record = standin.state.feedback[0]
        assert record.status is None
        await wait_for(lambda: record.status == 200, within=2.0)
        assert standin.state.ready == [msg_id]
        await impatient.feedback([msg_id], 1.0, task_id="t")
        assert standin.state.feedback[1].applied == []


async def test_down_fault_refuses_connections_then_comes_back(
    standin: StandIn, trinity: TrinityClient
) -> None:
    [msg_id] = await serve(trinity, 1)  # leaves a pooled keep-alive connection open
    port = int(standin.url.rsplit(":", 1)[1])
    response = await set_fault_raw(standin.url, {"mode": "down", "seconds": 0.8})
    until = pytest.approx(time.monotonic() + 0.8, abs=0.5)
    assert response == {
        "status": "success",
        "fault": {"mode": "down", "seconds": 0.8, "until": until},
    }
    assert standin.is_down

    with pytest.raises(TrinityUnavailable) as info:
        await trinity.feedback([msg_id], 1.0)
    assert isinstance(info.value.__cause__, httpx.TransportError)
    assert await trinity.health() is False
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()

    await wait_for_health(trinity, within=3.0)
    assert not standin.is_down and standin.state.fault.mode == "ok"
    assert standin.url.endswith(f":{port}")  # same port as before
    await trinity.feedback([msg_id], 1.0)
    assert standin.state.ready == [msg_id]


async def test_down_fault_can_be_lifted_in_process(
    standin: StandIn, trinity: TrinityClient
) -> None:
    await standin.set_fault(Fault(mode="down", seconds=60))
    assert await trinity.health() is False
    await standin.set_fault(Fault())
    assert await trinity.health() is True


async def test_stop_while_down_leaves_nothing_behind() -> None:
    server = StandIn()
    url = await server.start()
    await server.set_fault(Fault(mode="down", seconds=60))
    await server.stop()
    async with TrinityClient(url, timeout=0.5) as client:
        assert await client.health() is False


# -- chat faults, the model version, the journal ----------------------------------------------


async def test_chat_faults_answer_the_chat_route_only(
    standin: StandIn, raw: httpx.AsyncClient, trinity: TrinityClient
) -> None:
    bad = await raw.post("/_standin/chat-fault", json={"mode": "error", "status": 200})
    assert bad.status_code == 400 and "status" in bad.json()["error"]
    fault = {"mode": "error", "status": 503, "retry_after": 5, "count": 2}
    assert (await raw.post("/_standin/chat-fault", json=fault)).status_code == 200
    for _ in range(2):
        refused = await raw.post("/v1/chat/completions", json=chat_body())
        assert refused.status_code == 503 and refused.headers["retry-after"] == "5"
        assert refused.json()["error"]["code"] == 503
    assert await trinity.health() and await trinity.metrics()  # other routes answer
    assert (await raw.post("/v1/chat/completions", json=chat_body())).status_code == 200
    assert standin.state.chat_faulted == 2 and len(standin.state.experiences) == 1

    await raw.post("/_standin/chat-fault", json={"mode": "slow", "delay": 0.3, "count": 1})
    began = time.monotonic()
    assert (await raw.post("/v1/chat/completions", json=chat_body())).status_code == 200
    assert time.monotonic() - began >= 0.3

    await raw.post("/_standin/chat-fault", json={"mode": "cut", "count": 1})
    with pytest.raises(httpx.TransportError):  # dropped before any byte
        await raw.post("/v1/chat/completions", json=chat_body())
    await raw.post("/_standin/chat-fault", json={"mode": "cut", "after": 2, "count": 1})
    got = b""
    with pytest.raises(httpx.TransportError):  # two chunks, then the connection dropped
        async with raw.stream("POST", "/v1/chat/completions", json=chat_body(stream=True)) as r:
            async for chunk in r.aiter_bytes():
                got += chunk
    assert got.count(b"data: ") == 2 and b"[DONE]" not in got

    await raw.post("/_standin/chat-fault", json={"mode": "hang"})
    hung = asyncio.create_task(raw.post("/v1/chat/completions", json=chat_body()))
    await asyncio.sleep(0.3)
    assert not hung.done()
    standin.set_chat_fault(ChatFault())  # the hang ends: its request is dropped
    with pytest.raises(httpx.TransportError):
        await hung
    assert (await raw.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_commits_advance_the_model_version_every_sync_interval(
    trinity: TrinityClient, standin: StandIn, raw: httpx.AsyncClient
) -> None:
    standin.sync_interval = 2
    first = await serve(trinity, 1)
    for _ in range(3):
        await trinity.commit()
    second = await serve(trinity, 1)
    assert (await trinity.metrics())["rollout/model_0/model_version"] == 1
    rows = standin.state.experiences
    assert [rows[i].model_version for i in first + second] == [0, 1]
    set_to = await raw.post("/_standin/version", json={"model_version": 7})
    assert set_to.json() == {"status": "success", "model_version": 7}
    assert (await raw.post("/_standin/version", json={"model_version": -1})).status_code == 400
    assert (await trinity.metrics())["rollout/model_0/model_version"] == 7


async def test_a_stand_in_on_its_journal_goes_on_where_the_last_one_was(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    first = StandIn(journal=journal, sync_interval=1)
    url = await first.start()
    async with TrinityClient(url, timeout=2.0) as client:
        ids = await serve(client, 4)
        await client.feedback(ids[:2], 1.0)
        await client.commit()
        await client.feedback(ids[2:3], 0.5)  # ready, not committed yet
    before = first.state.to_json()
    await first.stop()
    with journal.open("a") as fh:
        fh.write('{"t": "exp", "msg_id": "torn')  # a kill in the middle of a write
    second = StandIn(journal=journal, sync_interval=1)
    url = await second.start()
    try:
        after = second.state.to_json()
        for key in ("experiences", "ready", "trained", "explore_step", "model_version"):
            assert after[key] == before[key], key
        assert [f["body"] for f in after["feedback"]] == [f["body"] for f in before["feedback"]]
        async with TrinityClient(url, timeout=2.0) as client:
            await client.feedback(ids[2:], 1.0)  # ids[2] rewarded already: a no-op
            await client.commit()
        assert second.state.trained == [*ids[:2], *ids[2:]]
        assert second.state.experiences[ids[3]].reward == 1.0
        assert second.state.model_version == 2
    finally:
        await second.stop()


# -- the blocking entry point ------------------------------------------------------------------


def test_run_serves_until_sigterm() -> None:
    port = free_port()
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    code = f"from streams.devtools.standin import run; run('127.0.0.1', {port})"
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60  # a ceiling: it waits for the answer, not a clock
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "stand-in did not start"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    assert f"http://127.0.0.1:{port}" in stderr


# -- helpers ------------------------------------------------------------------------------------


async def set_fault_raw(url: str, fault: dict[str, Any]) -> Any:
    async with httpx.AsyncClient(base_url=url, timeout=2.0) as http:
        response = await http.post("/_standin/fault", json=fault)
        response.raise_for_status()
        return response.json()


async def wait_for(condition: Any, *, within: float) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def wait_for_health(client: TrinityClient, *, within: float) -> None:
    deadline = time.monotonic() + within
    while not await client.health():
        assert time.monotonic() < deadline, "stand-in did not come back"
        await asyncio.sleep(0.05)


async def test_the_judge_answers_the_official_openai_client(
    standin: StandIn, raw: httpx.AsyncClient
) -> None:
    """The judge route: a deterministic score of the last user message, as the JSON the judge
    format asks for; steered by POST /_standin/judge (garbage, 5xx), counted in /_standin/counts."""
    from openai import AsyncOpenAI, InternalServerError

    from streams.core.judge import parse_score
    from streams.devtools.standin import judge_score

    client = AsyncOpenAI(base_url=f"{standin.url}/judge/v1", api_key="not-checked", max_retries=0)
    messages: Any = [
        {"role": "system", "content": "Score it."},
        {"role": "user", "content": "## Prompt\nuser: hi"},
    ]
    try:
        first = await client.chat.completions.create(model="judge", messages=messages)
        again = await client.chat.completions.create(model="judge", messages=messages)
        content = first.choices[0].message.content or ""
        assert parse_score(content) == (judge_score("## Prompt\nuser: hi"), "stand-in judge")
        assert again.choices[0].message.content == content  # deterministic
        assert (await raw.post("/_standin/judge", json={"mode": "garbage", "count": 1})).is_success
        garbage = await client.chat.completions.create(model="judge", messages=messages)
        assert "{" not in (garbage.choices[0].message.content or "")
        await raw.post("/_standin/judge", json={"mode": "error", "status": 503, "count": 1})
        with pytest.raises(InternalServerError):
            await client.chat.completions.create(model="judge", messages=messages)
        await client.chat.completions.create(model="judge", messages=messages)  # ok again
    finally:
        await client.close()
    counts = (await raw.get("/_standin/counts")).json()
    assert (counts["judge_requests"], counts["judge_ok"]) == (5, 3)
    assert [j.status for j in standin.state.judge] == [200, 200, 200, 503, 200]
    assert standin.state.feedback == [] and standin.state.request_count == 0  # Trinity untouched
    bad = await raw.post("/_standin/judge", json={"mode": "sometimes"})
    assert bad.status_code == 400
