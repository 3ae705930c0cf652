"""The live worker's feedback gate: none of its ``/feedback`` requests lands between a commit's
last read of Trinity's ready count and its ``/commit`` (one that did was drained by that commit
and looked new to the next, which was sent empty: seen in CI after a worker's restart)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from streams.core.commits import send_commit
from streams.core.ledger import LedgerConfig, apply_ack, due_commit
from streams.models import LedgerState
from streams.runtime.live_ports import FeedbackGate, ObservedTrinity
from tests.unit.factories import ack, at

CFG = LedgerConfig(interval=timedelta(seconds=60))


class Trinity:
    """Trinity's ready count and drain, with a feedback request sent by another task of the same
    worker as soon as the commit has read the ready count (the timing that made the empty one)."""

    def __init__(self) -> None:
        self.ready = 10  # cumulative, as Trinity's rollout/ready_experience_count
        self.drained_up_to = 0
        self.calls: list[str] = []
        self.read = asyncio.Event()

    async def metrics(self) -> dict[str, Any]:
        self.calls.append("metrics")
        ready = self.ready  # as the server counts it when the request arrives
        self.read.set()
        await asyncio.sleep(0.01)  # the answer on its way back: the next request goes out
        return {"explore_step_num": 1, "rollout/ready_experience_count": ready}

    async def commit(self) -> dict[str, Any]:
        self.calls.append("commit")
        self.drained_up_to = self.ready
        return {"status": "success"}

    async def feedback(self, *args: Any) -> dict[str, Any]:
        self.calls.append("feedback")
        self.ready += 2
        return {"status": "success"}


def _commit_with_feedback_beside_it(port: Any, client: Trinity) -> LedgerState:
    state = LedgerState(ready_at_last_commit=4)
    apply_ack(state, ack("t0", 0.5), at(0), CFG)
    plan = due_commit(state, at(120), CFG)
    assert plan is not None
    state.pending_commit = plan

    async def main() -> None:
        async def feedback_after_the_read() -> None:
            await client.read.wait()
            await port.feedback(["m"], 1.0, None, 0)

        other = asyncio.create_task(feedback_after_the_read())
        await send_commit(state, plan, port)
        await other

    asyncio.run(main())
    return state


def test_feedback_waits_for_the_commit_after_its_last_ready_read() -> None:
    client = Trinity()
    port = ObservedTrinity(client, SimpleNamespace())  # type: ignore[arg-type]
    state = _commit_with_feedback_beside_it(port, client)
    assert client.calls == ["metrics", "commit", "feedback"]
    # the next commit's guard sees the feedback as new, and it is: not drained yet
    assert state.ready_at_last_commit == client.drained_up_to == 10


def test_without_the_gate_the_commit_drains_what_the_next_one_counts_as_new() -> None:
    """The check above is able to fail: the same timing on the bare client."""
    client = Trinity()
    state = _commit_with_feedback_beside_it(client, client)
    assert client.calls == ["metrics", "feedback", "commit"]
    assert state.ready_at_last_commit == 10 and client.drained_up_to == 12  # 2 look new


def test_the_gate_lets_requests_run_together_and_waits_for_them() -> None:
    gate = FeedbackGate()
    order: list[str] = []

    async def request(name: str, hold: asyncio.Event) -> None:
        async with gate.shared():
            order.append(f"{name} in")
            await hold.wait()
            order.append(f"{name} out")

    async def main() -> None:
        a, b = asyncio.Event(), asyncio.Event()
        ta = asyncio.create_task(request("a", a))
        tb = asyncio.create_task(request("b", b))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert order == ["a in", "b in"]  # both in flight at once

        async def commit() -> None:
            async with gate.exclusive():
                order.append("commit")

        tc = asyncio.create_task(commit())
        await asyncio.sleep(0.01)
        tlate = asyncio.create_task(request("late", asyncio.Event()))
        await asyncio.sleep(0.01)
        assert "commit" not in order and "late in" not in order
        a.set()
        b.set()
        await tc
        await asyncio.sleep(0.01)
        assert order[:5] == ["a in", "b in", "a out", "b out", "commit"]
        assert order[5] == "late in"  # held back while the commit ran, then let in
        tlate.cancel()
        await asyncio.gather(ta, tb, return_exceptions=True)

    asyncio.run(main())
