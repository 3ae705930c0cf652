"""The checkpoint (streams/runtime/live/checkpoint.py): the order of the live worker's effects.
Each test here is of an order a past fix restored, and fails when that order is broken:

- a batch's table writes are written only after the broker acknowledged its records, and the
  batch returns (its offsets released) only then;
- a commit is written ahead (the ledger's state saved, then the producer flushed) before
  ``/commit`` is sent;
- no ``/feedback`` of the worker runs between a commit's last read of the ready count and its
  ``/commit``;
- a final commit is made only by a worker that restored the ledger since the last rebalance.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from streams.core.commits import send_commit
from streams.core.effects import Out
from streams.core.ledger import LedgerConfig, apply_ack, due_commit
from streams.core.store import MemoryStore
from streams.models import LedgerState, Tick
from streams.observe.metrics import Metrics
from streams.runtime.live.checkpoint import Checkpoint, FeedbackGate
from streams.runtime.live.trinity import ObservedTrinity
from streams.runtime.live.stores import BatchedStore
from streams.settings import load_settings
from tests.unit.factories import ack, at

from .memory import CODEC, Event, Producer, Sent, sink, stages

CFG = LedgerConfig(interval=timedelta(seconds=60))


class Recording(MemoryStore):
    """A table whose writes are logged in ``log``."""

    def __init__(self, log: list[str], name: str) -> None:
        super().__init__()
        self.log, self.name = log, name

    def set(self, key: bytes, value: bytes) -> None:
        self.log.append(f"{self.name} written")
        super().set(key, value)


# -- 1. a batch: records acknowledged, then tables written, then offsets released -------------


def test_a_batch_writes_its_tables_only_once_the_broker_acknowledged_its_records() -> None:
    """A table that says "closed" before its trajectory is acknowledged turns the call's
    records, read again after a crash, into late events: the trajectory is never made."""
    log: list[str] = []
    sent: list[Sent] = []
    held: list[asyncio.Future[None]] = []
    table = Recording(log, "closed")
    store = BatchedStore(table)
    checkpoint = Checkpoint(sink(sent, held), (store,), Producer(log))
    out = Out()
    out.emit("decisions", b"c1", Tick(at=at(0)))  # any record: the sink does not look
    out.emit("trajectories", b"c1", Tick(at=at(0)))
    store.set(b"c1", b"closed")  # what the stage wrote in the batch

    async def main() -> None:
        batch = asyncio.create_task(checkpoint.settle([out], {id(out.emits[1])}))
        for _ in range(10):
            await asyncio.sleep(0)
        assert [s.topic for s in sent] == ["decisions", "trajectories"]
        assert [s.handled for s in sent] == [False, True]
        assert log == [] and not batch.done(), "the table written before the broker's ack"
        held[0].set_result(None)
        for _ in range(10):
            await asyncio.sleep(0)
        assert log == [] and not batch.done(), "the table written before every ack"
        held[1].set_result(None)
        await batch  # returns: the batch's offsets are released now, not before
        assert log == ["closed written"]

    asyncio.run(main())


def test_a_batch_whose_send_failed_writes_nothing() -> None:
    log: list[str] = []
    store = BatchedStore(Recording(log, "pending"))
    checkpoint = Checkpoint(sink([]), (store,), Producer(log))
    store.partition = 2
    store.set(b"c1", b"open")
    checkpoint.discard()
    asyncio.run(checkpoint.settle([], set()))
    assert log == [] and len(store) == 0


def test_each_write_is_made_for_the_partition_of_its_record() -> None:
    stores = (BatchedStore(MemoryStore()), BatchedStore(MemoryStore()))
    checkpoint = Checkpoint(sink([]), stores, Producer())
    checkpoint.at(3)
    assert [s.partition for s in stores] == [3, 3]


# -- 2. the ledger's commit: written ahead, then sent -------------------------------------------


class LedgerTrinity:
    """Trinity's metrics and /commit, each call logged in ``log``."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.step = 0

    async def metrics(self) -> dict[str, Any]:
        self.log.append("metrics")
        return {"explore_step_num": self.step, "rollout/ready_experience_count": 3}

    async def commit(self) -> dict[str, Any]:
        self.log.append("/commit")
        self.step += 1
        return {"status": "success"}


def test_a_commit_is_written_ahead_before_it_is_sent() -> None:
    """The plan and the explore step before it are durable before /commit: a successor that
    finds it resolves an interrupted commit instead of sending it again."""
    log: list[str] = []
    settings = load_settings(commit={"interval_s": 60})
    ledger = Recording(log, "ledger")
    w = stages(settings, trinity=LedgerTrinity(log), stores={"ledger": ledger}, flushes=log)
    acks = [Event("trajstream.ledger", i, b"k", CODEC.encode(ack(f"t{i}"))) for i in range(3)]
    asyncio.run(w.stages.ledger.on_batch(acks))  # acknowledged in the first interval
    log.clear()
    w.clock.now = at(61)  # a tick in the next one: the commit is due
    tick = Event("trajstream.ledger", 3, None, CODEC.encode(Tick(at=at(61))))
    asyncio.run(w.stages.ledger.on_batch([tick]))
    assert log[:4] == ["metrics", "ledger written", "flush", "metrics"]
    assert log[4:] == ["/commit", "ledger written"]  # and the state after it, once recorded
    [record] = w.records("commits")
    assert record.sent and record.feedback_count == 3


# -- 3. no /feedback between the commit's last ready-count read and /commit ---------------------


class GatedTrinity:
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


def _commit_with_feedback_beside_it(port: Any, client: GatedTrinity) -> LedgerState:
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


def test_no_feedback_runs_between_the_commits_last_ready_read_and_the_commit() -> None:
    """A feedback applied between the two is drained by this commit but looks new to the next,
    which is then sent with nothing to drain (seen in CI after a worker's restart)."""
    client = GatedTrinity()
    checkpoint = Checkpoint(sink([]), (), Producer())
    port = ObservedTrinity(lambda: client, Metrics(), checkpoint.gate)  # type: ignore[arg-type,return-value]
    state = _commit_with_feedback_beside_it(port, client)
    assert client.calls == ["metrics", "commit", "feedback"]
    # the next commit's guard sees the feedback as new, and it is: not drained yet
    assert state.ready_at_last_commit == client.drained_up_to == 10


def test_without_the_gate_the_commit_drains_what_the_next_one_counts_as_new() -> None:
    """The check above is able to fail: the same timing on the bare client."""
    client = GatedTrinity()
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


# -- 4. the final commit: only by a worker that restored the ledger since the last rebalance ----


@pytest.mark.parametrize(
    ("signals", "in_recovery", "may"),
    [
        ([], False, False),  # never assigned the ledger, or not restored yet
        (["recovered with the ledger"], False, True),
        (["recovered without it"], False, False),
        (["recovered with the ledger", "revoked"], False, False),  # a rebalance under way
        (["recovered with the ledger", "revoked", "recovered with the ledger"], False, True),
        (["recovered with the ledger"], True, False),  # a recovery began since
    ],
)
def test_a_final_commit_only_by_a_worker_that_restored_the_ledger_since_the_last_rebalance(
    signals: list[str], in_recovery: bool, may: bool
) -> None:
    """A worker stopped during a rebalance or a recovery holds an in-memory table re-read from
    the changelog's start, maybe older than its last commit: a final commit from it counted
    again what that commit drained (CI: commits summed 50 feedbacks for 40 calls)."""
    checkpoint = Checkpoint(sink([]), (), Producer())
    for signal in signals:
        if signal == "revoked":
            checkpoint.revoked()
        else:
            checkpoint.recovered(holds_ledger=signal == "recovered with the ledger")
    assert checkpoint.may_commit_final(in_recovery) is may
