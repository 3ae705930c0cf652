"""The commit protocol: when a commit is sent, how it is written ahead, how a crash is resolved.

One piece of logic for the live ledger stage and for replay's backfill commits. Trinity's
``/commit`` drains every ready experience and advances the explore step by one, even when
nothing is ready, so a commit must be sent once, and never empty:

1. **Empty-commit guard.** Before a commit, Trinity's cumulative
   ``rollout/ready_experience_count`` is read; when it has not grown since the last commit
   (``LedgerState.ready_at_last_commit``), nothing is ready (an earlier commit drained these
   feedbacks already) and the batch is recorded with ``sent: false`` instead.
2. **Write-ahead.** The plan, with Trinity's ``explore_step_num`` before it, is stored
   (``state.pending_commit``) and made durable by the runner's ``write_ahead`` callback before
   ``/commit`` is sent.
3. **Resolution.** A runner that finds a pending plan (its predecessor stopped between sending
   and recording) reads the explore step: advanced, the commit was applied and is recorded, not
   sent again; not advanced, it is sent.

Every :class:`~streams.models.CommitRecord` says how many experiences its commit drained
(``experiences``): the growth of the ready count since the last commit. A ledger that never
committed counts from 0 when Trinity never committed either (explore step 0); when another
client committed to this Trinity before, the count before is unknown and ``experiences`` is
left null for that first commit.

The functions are async only because they await a :class:`CommitPort` (Trinity's ``/metrics``
and ``/commit``); they do no I/O of their own.

May import: the standard library, :mod:`streams.models`, :mod:`streams.errors` and the core.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..errors import TrinityError
from ..models import CommitRecord, LedgerState
from .ledger import CommitPlan, commit_done, held_commit

__all__ = [
    "READY",
    "CommitPort",
    "explore_step",
    "metric",
    "resolve_commit",
    "send_commit",
    "write_ahead_commit",
]

log = logging.getLogger("trajstream.commits")

READY = "rollout/ready_experience_count"
NOT_SENT = json.dumps({"not_sent": "nothing ready at Trinity"})


class CommitPort(Protocol):
    """What the protocol needs of Trinity (:class:`streams.io.trinity.TrinityClient` has it)."""

    async def metrics(self) -> dict[str, Any]: ...

    async def commit(self) -> dict[str, Any]: ...


def metric(metrics: dict[str, Any], name: str) -> int | None:
    value = metrics.get(name)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def explore_step(metrics: dict[str, Any]) -> int | None:
    return metric(metrics, "explore_step_num")


def _experiences(state: LedgerState, plan: CommitPlan) -> int | None:
    if plan.ready_before is None or state.ready_at_last_commit is None:
        return None
    return max(0, plan.ready_before - state.ready_at_last_commit)


async def write_ahead_commit(
    state: LedgerState,
    plan: CommitPlan,
    trinity: CommitPort,
    write_ahead: Callable[[LedgerState], Awaitable[None]],
) -> CommitRecord | None:
    """Commit ``plan`` by the protocol; returns the record to publish, or None when the commit
    is postponed (Trinity unreachable: the plan is retried later, pending or not).

    While commits are held (:func:`streams.core.ledger.held_commit`), the plan is recorded as
    held and nothing is asked of Trinity."""
    held = held_commit(state, plan)
    if held is not None:
        return held
    try:
        metrics = await trinity.metrics()
    except TrinityError as exc:
        log.warning("commit %d postponed: %s", plan.seq, exc)
        return None
    plan.step_before = explore_step(metrics)
    plan.ready_before = metric(metrics, READY)
    if state.ready_at_last_commit is None and plan.step_before == 0:
        # Trinity never committed: everything it made ready is still there
        state.ready_at_last_commit = 0
    if (
        plan.ready_before is not None
        and state.ready_at_last_commit is not None
        and plan.ready_before <= state.ready_at_last_commit
    ):
        return commit_done(state, plan, NOT_SENT, sent=False, experiences=0)
    state.pending_commit = plan
    await write_ahead(state)
    return await send_commit(state, plan, trinity)


def _exclusive(trinity: CommitPort) -> contextlib.AbstractAsyncContextManager[Any]:
    """The port's own gate, if it has one (``exclusive()``): it keeps the port's ``/feedback``
    requests out from the last read of the ready count to the commit, since one applied in
    between is drained by this commit but looks new to the next, which is then sent empty. The
    live worker's port has one (:class:`streams.runtime.live.checkpoint.FeedbackGate`); feedback
    from another process can still land in between."""
    gate = getattr(trinity, "exclusive", None)
    return gate() if callable(gate) else contextlib.nullcontext()


async def send_commit(
    state: LedgerState, plan: CommitPlan, trinity: CommitPort
) -> CommitRecord | None:
    """Send a written-ahead plan; None when it failed (the plan stays pending)."""
    try:
        async with _exclusive(trinity):
            # the ready count again, right before the commit drains it: feedback Trinity
            # applied since the first read (the write-ahead takes a while) is drained by this
            # commit and must not look new to the next one
            ready = metric(await trinity.metrics(), READY)
            if ready is not None:
                plan.ready_before = max(ready, plan.ready_before or 0)
            answer = await trinity.commit()
    except TrinityError as exc:
        log.warning("commit %d failed: %s; will retry", plan.seq, exc)
        return None
    experiences = _experiences(state, plan)
    return commit_done(state, plan, json.dumps(answer, sort_keys=True), experiences=experiences)


async def resolve_commit(state: LedgerState, trinity: CommitPort) -> CommitRecord | None:
    """A commit was in flight when the ledger last stopped (or failed): was it applied?
    Returns its record once resolved, None while Trinity cannot say."""
    plan = state.pending_commit
    assert plan is not None
    try:
        metrics = await trinity.metrics()
    except TrinityError as exc:
        log.warning("cannot resolve commit %d yet: %s", plan.seq, exc)
        return None
    step = explore_step(metrics)
    if plan.step_before is not None and step is not None and step > plan.step_before:
        log.info(
            "commit %d was applied before the restart (explore step %d -> %d)",
            plan.seq,
            plan.step_before,
            step,
        )
        answer = json.dumps({"recovered": True, "explore_step_num": step})
        return commit_done(state, plan, answer, experiences=_experiences(state, plan))
    plan.step_before = step
    return await send_commit(state, plan, trinity)
