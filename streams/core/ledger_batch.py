"""The ledger stage's one sequence for a batch: load, resolve, apply, decide, commit, save.

Every runner that owns a ledger runs a batch the same way, whatever its records are and
wherever its state lives (the live ledger agent's batches and a worker's final commit at a
graceful stop alike):

1. **load** the state from the stage's store;
2. **resolve** a commit its predecessor left in flight
   (:func:`~streams.core.commits.resolve_commit`);
3. **apply** the batch's records (read only now: which records are new depends on the state);
4. **decide** the windows, alerts and the commit due (:meth:`LedgerStage.decide`; at a stop
   only the final commit, :func:`~streams.core.ledger.due_commit` with ``final``);
5. **commit** it by the protocol (:func:`~streams.core.commits.write_ahead_commit`), the
   decided records sent first;
6. **save** the state.

The runner gives what the sequence needs as a :class:`LedgerPort`: Trinity's commit routes,
how to send what was decided, how to make the written-ahead state durable, and what to do with
a commit record. What the batch applied (its rejects and counts) is returned for the runner to
send when it likes (after releasing its lock, say).

May import: the standard library, :mod:`streams.models` and the core.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from ..models import CommitRecord, LedgerState
from .commits import CommitPort, resolve_commit, write_ahead_commit
from .effects import Envelope, Out
from .ledger import CommitPlan, due_commit
from .ledger_stage import LedgerStage

__all__ = ["Batch", "LedgerPort", "run_batch"]


class LedgerPort(Protocol):
    """What a runner gives the ledger sequence."""

    @property
    def trinity(self) -> CommitPort: ...

    async def send_decided(self, out: Out) -> None:
        """Send the windows and alerts decided (before the commit)."""

    async def write_ahead(self, state: LedgerState) -> None:
        """Make ``state`` (with its pending commit) durable before ``/commit`` is sent."""

    async def recorded(self, record: CommitRecord | None, plan: CommitPlan | None) -> None:
        """A commit resolved or made (``plan`` None: resolved from a predecessor's), or, as
        None, one postponed (Trinity unreachable: it is retried by a later batch)."""


@dataclass(slots=True)
class Batch:
    """What one batch did: the state as saved, what applying the records rejected and counted
    (for the runner to send), and the commit planned, if any."""

    state: LedgerState
    applied: Out
    plan: CommitPlan | None


async def run_batch(
    stage: LedgerStage,
    port: LedgerPort,
    read: Callable[[LedgerState], Awaitable[Sequence[Envelope]]],
    now: Callable[[], datetime],
    *,
    closing: bool = False,
) -> Batch:
    """One batch of the ledger stage, see the module; ``read(state)`` gives its records (those
    after ``state.applied_offset``: the stage skips the others anyway). ``closing``: a graceful
    stop, which decides no window and commits what was acknowledged, if the interval allows."""
    state = stage.load()
    if state.pending_commit is not None:
        await port.recorded(await resolve_commit(state, port.trinity), None)
    applied = stage.apply(state, list(await read(state)), now())
    if closing:
        plan = due_commit(state, now(), stage.cfg, final=True)
    else:
        decided, plan = stage.decide(state, now(), final=applied.final)
        await port.send_decided(decided)
    if plan is not None:
        record = await write_ahead_commit(state, plan, port.trinity, port.write_ahead)
        await port.recorded(record, plan)
    stage.save(state)
    return Batch(state, applied.out, plan)
