"""The ledger port (streams/runtime/live/ledger.py) over memory: a graceful stop's final commit,
made by the worker that holds the ledger, also when its table was restored with no state yet (a
stop right after a rebalance, before the ledger agent took its first record); a worker whose
table was not restored, or is being restored again (a stop during a rebalance or a recovery,
when an in-memory table may hold an older state), leaves the batch to the next owner. And the
commit records of the ledger's batches."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from streams.envelope import Edge
from streams.models import CommitRecord, Tick
from streams.runtime.live.ledger import holds_ledger
from streams.settings import load_settings
from tests.unit.core.harness import ScriptedTrinity, m
from tests.unit.factories import ack, at

from .memory import CODEC, Event, Unread, Worker, stages

LEDGER = "p.ledger"


class Trinity:
    def __init__(self) -> None:
        self.commits = 0

    async def metrics(self) -> dict[str, Any]:
        return {"explore_step_num": 3, "ready_experiences": 7}

    async def commit(self) -> dict[str, Any]:
        self.commits += 1
        return {"status": "ok"}


def stopping(acks: int) -> tuple[Worker, Trinity]:
    settings = load_settings(kafka={"topic_prefix": "p"}, commit={"interval_s": 3600})
    edge = Edge(CODEC)
    unread = [
        edge.open(LEDGER, 0, i, f"t{i}".encode(), CODEC.encode(ack(f"t{i}"))) for i in range(acks)
    ]
    trinity = Trinity()
    return stages(settings, trinity=trinity, unread=Unread(unread)), trinity


def assigned(*tps: tuple[str, int]) -> Any:
    from aiokafka import TopicPartition

    return SimpleNamespace(assignment=lambda: {TopicPartition(*tp) for tp in tps})


def commits(w: Worker) -> list[CommitRecord]:
    return w.records("commits")


def test_a_stop_right_after_the_ledger_was_restored_commits_its_acknowledgements() -> None:
    w, trinity = stopping(acks=6)
    ledger = w.stages.ledger
    assert not ledger.stage.exists()  # the ledger agent took no record yet
    w.stages.checkpoint.recovered(holds_ledger(assigned((LEDGER, 0)), LEDGER))
    asyncio.run(ledger.final_commit(in_recovery=False))
    assert trinity.commits == 1
    [record] = commits(w)
    assert record.final and record.feedback_count == 6
    assert ledger.stage.load().applied_offset == 5  # the next owner skips them
    assert w.flushes[-1] == "flush"  # what it sent is acknowledged before the stop goes on


def test_a_worker_that_does_not_hold_a_restored_ledger_leaves_the_batch() -> None:
    w, trinity = stopping(acks=6)
    w.stages.checkpoint.recovered(holds_ledger(assigned((LEDGER + "-other", 0)), LEDGER))
    asyncio.run(w.stages.ledger.final_commit(in_recovery=False))
    assert (trinity.commits, commits(w), w.stages.ledger.stage.exists()) == (0, [], False)


def test_holds_ledger_is_false_between_assignments() -> None:
    def broken() -> Any:
        raise RuntimeError("not started")

    assert not holds_ledger(SimpleNamespace(assignment=broken), LEDGER)


def _commit_then_rebalance() -> tuple[Worker, Trinity]:
    """The CI failure of ``test_two_workers_one_stopped_mid_traffic`` (one worker joined late):
    the ledger's owner commits 6 acknowledgements; a rebalance revokes and gives it the ledger
    again, and its recovery re-reads the changelog from the start, so the table holds the state
    from before that commit when the stop comes."""
    w, trinity = stopping(acks=6)
    ledger, checkpoint = w.stages.ledger, w.stages.checkpoint
    checkpoint.recovered(holds_ledger(assigned((LEDGER, 0)), LEDGER))
    before = ledger.stage.load()  # the state the changelog's first records hold
    asyncio.run(ledger.final_commit(in_recovery=False))  # stands for the interval's commit
    assert trinity.commits == 1 and commits(w)[0].feedback_count == 6
    checkpoint.revoked()  # on_partitions_revoked
    ledger.stage.save(before)  # the recovery, part way through the changelog
    return w, trinity


def test_a_stop_during_a_rebalance_leaves_the_batch_and_counts_nothing_twice() -> None:
    w, trinity = _commit_then_rebalance()
    assert w.stages.ledger.stage.exists()
    asyncio.run(w.stages.ledger.final_commit(in_recovery=False))
    assert trinity.commits == 1, "a commit from a state still being restored"
    assert len(commits(w)) == 1


def test_a_stop_during_a_recovery_leaves_the_batch() -> None:
    w, trinity = _commit_then_rebalance()
    # a recovery that began after the last rebalance completed (its signal came late)
    w.stages.checkpoint.recovered(holds_ledger=True)
    asyncio.run(w.stages.ledger.final_commit(in_recovery=True))
    assert (trinity.commits, len(commits(w))) == (1, 1)


def test_the_live_ledger_records_experiences_on_its_first_commit() -> None:
    """Fixed: the first CommitRecord of a worker said ``experiences: null``."""
    settings = load_settings(commit={"interval_s": 60})
    w = stages(settings, trinity=ScriptedTrinity([m(0, 3), m(0, 3)]))
    acks = [Event("trajstream.ledger", i, b"k", CODEC.encode(ack(f"t{i}"))) for i in range(3)]
    asyncio.run(w.stages.ledger.on_batch(acks))  # acknowledged in the first interval
    w.clock.now = at(61)  # a tick in the next one: the commit is due
    tick = Event("trajstream.ledger", 3, None, CODEC.encode(Tick(at=at(61))))
    asyncio.run(w.stages.ledger.on_batch([tick]))
    [record] = commits(w)
    assert (record.sent, record.feedback_count, record.experiences) == (True, 3, 3)
    assert w.stats["commits"] == 1
