"""A graceful stop's final commit, without a broker: the worker that holds the ledger commits
what was acknowledged, also when its ledger table was restored with no state yet (a stop right
after a rebalance, before the ledger agent took its first record); a worker whose table was not
restored, or is being restored again (a stop during a rebalance or a recovery, when an in-memory
table may hold an older state), leaves the batch to the next owner."""

from __future__ import annotations

from typing import Any

import pytest

from streams.codec import SchemaRegistry
from streams.core.effects import Envelope
from streams.models import CommitRecord
from streams.runtime.live import Pipeline
from streams.settings import load_settings
from tests.unit.factories import ack


class Trinity:
    def __init__(self) -> None:
        self.commits = 0

    async def metrics(self) -> dict[str, Any]:
        return {"explore_step_num": 3, "ready_experiences": 7}

    async def commit(self) -> dict[str, Any]:
        self.commits += 1
        return {"status": "ok"}


class Assignment:
    def __init__(self, *tps: Any) -> None:
        self.tps = set(tps)

    def assignment(self) -> set[Any]:
        return self.tps


def stopping(monkeypatch: pytest.MonkeyPatch, acks: int) -> tuple[Pipeline, Trinity, list[Any]]:
    settings = load_settings(
        observe={"port": 0}, kafka={"topic_prefix": "p"}, commit={"interval_s": 3600}
    )
    p = Pipeline(settings, bootstrap="127.0.0.1:9")
    codec = SchemaRegistry.default()
    unread = [
        p.edge.open(p.topics.ledger, 0, i, f"t{i}".encode(), codec.encode(ack(f"t{i}")))
        for i in range(acks)
    ]
    trinity, recorded = Trinity(), []

    async def read_unread(applied_offset: int) -> list[Envelope]:
        return [s for s in unread if s.offset > applied_offset]

    async def nothing(*_: Any) -> None:
        return None

    async def record(record: CommitRecord | None, plan: Any) -> None:
        recorded.append(record)

    monkeypatch.setattr(p, "_unread_ledger", read_unread)
    monkeypatch.setattr(p, "_trinity", trinity)
    monkeypatch.setattr(p, "_send", nothing)
    monkeypatch.setattr(p, "write_ahead", lambda state: nothing(p.ledger_stage.save(state)))
    monkeypatch.setattr(p, "recorded", record)
    monkeypatch.setattr(type(p.app.producer), "flush", lambda self: nothing())
    return p, trinity, recorded


async def test_a_stop_right_after_the_ledger_was_restored_commits_its_acknowledgements(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, trinity, recorded = stopping(monkeypatch, acks=6)
    assert not p.ledger_stage.exists()  # the ledger agent took no record yet
    p._ledger_restored = p._holds_ledger(Assignment((p.topics.ledger, 0)))
    await p.final_commit()
    assert trinity.commits == 1
    [record] = recorded
    assert record is not None and record.final and record.feedback_count == 6
    assert p.ledger_stage.load().applied_offset == 5  # the next owner skips them


async def test_a_worker_that_does_not_hold_a_restored_ledger_leaves_the_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, trinity, recorded = stopping(monkeypatch, acks=6)
    p._ledger_restored = p._holds_ledger(Assignment((p.topics.ledger + "-other", 0)))
    assert not p._ledger_restored
    await p.final_commit()
    assert (trinity.commits, recorded, p.ledger_stage.exists()) == (0, [], False)


async def _commit_then_rebalance(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    """The CI failure of ``test_two_workers_one_stopped_mid_traffic`` (one worker joined late):
    the ledger's owner commits 6 acknowledgements; a rebalance revokes and gives it the ledger
    again, and its recovery re-reads the changelog from the start, so the table holds the state
    from before that commit when the stop comes."""
    p, trinity, recorded = stopping(monkeypatch, acks=6)
    p._ledger_restored = p._holds_ledger(Assignment((p.topics.ledger, 0)))
    before = p.ledger_stage.load()  # the state the changelog's first records hold
    await p.final_commit()  # stands for the interval's commit: the 6 acknowledgements drained
    assert trinity.commits == 1 and recorded[0].feedback_count == 6
    p._ledger_restored = False  # on_partitions_revoked
    p.ledger_stage.save(before)  # the recovery, part way through the changelog
    return p, trinity, recorded


async def test_a_stop_during_a_rebalance_leaves_the_batch_and_counts_nothing_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p, trinity, recorded = await _commit_then_rebalance(monkeypatch)
    assert p.ledger_stage.exists()
    await p.final_commit()
    assert trinity.commits == 1, "a commit from a state still being restored"
    assert len(recorded) == 1


async def test_a_stop_during_a_recovery_leaves_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    p, trinity, recorded = await _commit_then_rebalance(monkeypatch)
    # a recovery that began after the last rebalance completed (its signal came late)
    p._ledger_restored = True
    monkeypatch.setattr(p.app, "in_recovery", True, raising=False)
    await p.final_commit()
    assert (trinity.commits, len(recorded)) == (1, 1)
