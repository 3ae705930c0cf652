"""The commit protocol, table-driven against a scripted Trinity: the empty-commit guard from
the ready count, the write-ahead before /commit, resolution after a crash from the explore
step, and the experiences count on every record."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from streams.core.commits import resolve_commit, write_ahead_commit
from streams.core.ledger import LedgerConfig, apply_ack, due_commit
from streams.models import LedgerState
from tests.unit.core.harness import DOWN, ScriptedTrinity, m
from tests.unit.factories import ack, at

CFG = LedgerConfig(interval=timedelta(seconds=60))


def batch(n: int = 2, *, ready_at_last_commit: int | None = None) -> LedgerState:
    state = LedgerState(ready_at_last_commit=ready_at_last_commit)
    for i in range(n):
        apply_ack(state, ack(f"t{i}", 0.5), at(i), CFG)
    return state


def commit(state: LedgerState, trinity: ScriptedTrinity) -> tuple:  # type: ignore[type-arg]
    plan = due_commit(state, at(120), CFG)
    assert plan is not None
    written: list[object] = []

    async def write_ahead(s: LedgerState) -> None:
        assert s.pending_commit is plan
        written.append(list(trinity.calls))  # what Trinity saw before the plan was durable

    record = asyncio.run(write_ahead_commit(state, plan, trinity, write_ahead))
    return record, written


@pytest.mark.parametrize(
    ("baseline", "metrics", "sent", "experiences", "calls"),
    [
        # first commit of a ledger on a Trinity that never committed: counts from 0
        (None, [m(0, 5), m(0, 5)], True, 5, ["metrics", "metrics", "commit"]),
        # a later commit: the growth since the last one
        (5, [m(1, 9), m(1, 9)], True, 4, ["metrics", "metrics", "commit"]),
        # feedback applied during the write-ahead is drained by this commit too
        (5, [m(1, 9), m(1, 11)], True, 6, ["metrics", "metrics", "commit"]),
        # nothing ready: an earlier commit drained it; recorded, not sent
        (9, [m(2, 9)], False, 0, ["metrics"]),
        # another client committed first: the count before is unknown, the commit still goes
        (None, [m(3, 9), m(3, 9)], True, None, ["metrics", "metrics", "commit"]),
    ],
)
def test_commit_guard_and_experiences(
    baseline: int | None, metrics: list, sent: bool, experiences: int | None, calls: list
) -> None:
    state = batch(ready_at_last_commit=baseline)
    trinity = ScriptedTrinity(metrics)
    record, written = commit(state, trinity)
    assert (record.sent, record.experiences, record.feedback_count) == (sent, experiences, 2)
    assert trinity.calls == calls
    assert written == ([["metrics"]] if sent else [])  # durable before /commit, only if sent
    assert state.pending_commit is None and state.batch_count == 0


@pytest.mark.parametrize(
    ("metrics", "commits", "pending_after"),
    [
        ([DOWN], [], False),  # the first read fails: postponed, nothing written ahead
        ([m(0, 2), DOWN], [], True),  # the second read fails: the plan stays pending
        ([m(0, 2), m(0, 2)], [DOWN], True),  # /commit fails: the plan stays pending
    ],
)
def test_a_failed_commit_is_postponed_or_left_pending(
    metrics: list, commits: list, pending_after: bool
) -> None:
    state = batch()
    record, _ = commit(state, ScriptedTrinity(metrics, commits))
    assert record is None
    assert (state.pending_commit is not None) == pending_after
    assert state.batch_count == 2  # nothing is lost: the batch is still there


@pytest.mark.parametrize(
    ("step_now", "sent_again", "response"),
    [
        (1, False, '{"recovered": true, "explore_step_num": 1}'),  # advanced: it was applied
        (0, True, '{"status": "success"}'),  # not advanced: send it now
    ],
)
def test_a_pending_commit_is_resolved_from_the_explore_step(
    step_now: int, sent_again: bool, response: str
) -> None:
    state = batch(ready_at_last_commit=0)
    plan = due_commit(state, at(120), CFG)
    assert plan is not None
    plan.step_before, plan.ready_before = 0, 2
    state.pending_commit = plan  # written ahead, then the worker was killed
    trinity = ScriptedTrinity([m(step_now, 2), m(step_now, 2)])
    record = asyncio.run(resolve_commit(state, trinity))
    assert record is not None
    assert ("commit" in trinity.calls) == sent_again
    assert record.trinity_response == response
    assert record.experiences == 2  # every record carries the count, a recovered one too
    assert state.pending_commit is None and state.next_seq == 1


def test_a_pending_commit_waits_while_trinity_cannot_say() -> None:
    state = batch()
    plan = due_commit(state, at(120), CFG)
    assert plan is not None
    state.pending_commit = plan
    assert asyncio.run(resolve_commit(state, ScriptedTrinity([DOWN]))) is None
    assert state.pending_commit is plan
