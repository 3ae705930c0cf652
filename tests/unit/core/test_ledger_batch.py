"""The ledger's one sequence (streams.core.ledger_batch.run_batch) over a memory store and a
scripted Trinity: what a runner's port sees, in which order, and what is saved."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from streams.core.commits import CommitPort
from streams.core.effects import Envelope, Out
from streams.core.ledger import CommitPlan, LedgerConfig
from streams.core.ledger_batch import run_batch
from streams.core.ledger_stage import LedgerStage
from streams.core.store import MemoryStore
from streams.models import CommitRecord, LedgerState, Tick
from tests.unit.factories import T0, ack

from .harness import CODEC, DOWN, EDGE, ScriptedTrinity, m

CFG = LedgerConfig(interval=timedelta(seconds=60), window=timedelta(seconds=60))


class Port:
    def __init__(self, trinity: ScriptedTrinity) -> None:
        self._trinity = trinity
        self.calls: list[str] = []
        self.records: list[tuple[CommitRecord | None, CommitPlan | None]] = []
        self.decided: list[Out] = []

    @property
    def trinity(self) -> CommitPort:
        return self._trinity

    async def send_decided(self, out: Out) -> None:
        self.calls.append("decided")
        self.decided.append(out)

    async def write_ahead(self, state: LedgerState) -> None:
        assert state.pending_commit is not None
        self.calls.append("write_ahead")

    async def recorded(self, record: CommitRecord | None, plan: CommitPlan | None) -> None:
        self.calls.append("recorded")
        self.records.append((record, plan))


def _sources(*records: Any, first: int = 0) -> list[Envelope]:
    return [
        EDGE.open("p.ledger", 0, first + i, None, CODEC.encode(r)) for i, r in enumerate(records)
    ]


def _run(stage: LedgerStage, port: Port, sources: list[Envelope], seconds: float, **kw: Any):
    async def read(state: LedgerState) -> list[Envelope]:
        return [s for s in sources if s.offset > state.applied_offset]

    return asyncio.run(run_batch(stage, port, read, lambda: T0 + timedelta(seconds=seconds), **kw))


def test_a_batch_applies_decides_sends_then_commits_and_saves() -> None:
    stage = LedgerStage(CFG, store=MemoryStore(), codec=CODEC)
    port = Port(ScriptedTrinity([m(0, 2), m(0, 2)]))  # two ready: the commit is sent
    first = _run(stage, port, _sources(ack("a"), ack("b")), 1)
    assert first.plan is None and port.calls == ["decided"]
    assert stage.load().batch_count == 2  # saved
    later = _run(stage, port, _sources(Tick(at=T0 + timedelta(seconds=90)), first=2), 90)
    assert later.plan is not None and later.plan.count == 2
    # the decided records go out before the commit is written ahead and sent
    assert port.calls == ["decided", "decided", "write_ahead", "recorded"]
    [(record, plan)] = port.records
    assert record is not None and record.sent and plan == later.plan
    saved = stage.load()
    assert saved.pending_commit is None and saved.batch_count == 0 and saved.applied_offset == 2


def test_a_postponed_commit_stays_pending_and_the_next_batch_resolves_it() -> None:
    stage = LedgerStage(CFG, store=MemoryStore(), codec=CODEC)
    # /commit fails after it was written ahead; then /metrics says it was applied after all
    port = Port(ScriptedTrinity([m(0, 1), m(0, 1), m(1, 1)], commits=[DOWN]))
    _run(stage, port, _sources(ack("a")), 1)
    batch = _run(stage, port, _sources(Tick(at=T0 + timedelta(seconds=90)), first=1), 90)
    assert batch.plan is not None
    assert port.records == [(None, batch.plan)]  # postponed: the runner counts a failure
    assert stage.load().pending_commit is not None  # written ahead, saved
    _run(stage, port, [], 91)  # Trinity answers: the explore step moved, it was applied
    record, plan = port.records[-1]
    assert record is not None and plan is None and stage.load().pending_commit is None


def test_closing_decides_no_window_and_commits_what_was_acknowledged() -> None:
    stage = LedgerStage(CFG, store=MemoryStore(), codec=CODEC)
    port = Port(ScriptedTrinity([m(0, 2), m(0, 2)]))
    _run(stage, port, _sources(ack("a")), 1)
    port.calls.clear()
    batch = _run(stage, port, _sources(ack("b"), first=1), 61, closing=True)
    assert batch.plan is not None and batch.plan.final and batch.plan.count == 2
    assert port.calls == ["write_ahead", "recorded"]  # nothing decided at a stop
