"""When may an input offset be committed? The order of the live worker's effects, in one object.

Delivery is at-least-once: an input offset is committed only once every effect of its record
is durable, so that a crash anywhere before reads the record again and every effect is made
again (each is idempotent or counted once). :class:`Checkpoint` owns that order:

1. **A batch of the assemble stage** (:meth:`Checkpoint.settle`, :mod:`.assembling`): the
   records the batch decided are sent (trajectories, decisions, rewarded records, the
   acknowledgements of the feedback it sent itself, dead letters); each send is awaited until
   the broker acknowledged it; only then are the batch's table writes written (they waited
   beside the tables, :class:`~.stores.BatchedStore`); and only when that returns are the
   batch's input offsets released. A table that said "closed" before its trajectory was
   acknowledged would, after a crash, turn the call's records into late events, its effects
   never made. A batch that fails writes nothing (:meth:`Checkpoint.discard`).
2. **The ledger's commit** (:mod:`.ledger`, over the core's protocol,
   :func:`streams.core.commits.write_ahead_commit`): the plan is written ahead (the ledger's
   state saved and the producer flushed, :meth:`Checkpoint.write_ahead`) before ``/commit`` is
   sent; and none of this worker's ``/feedback`` requests runs between the commit's last read
   of Trinity's ready count and its ``/commit`` (:attr:`Checkpoint.gate`, a
   :class:`FeedbackGate`), since a feedback applied in between is drained by that commit but
   looks new to the next, which is then sent empty.
3. **The final commit of a graceful stop** (:meth:`Checkpoint.may_commit_final`): only a worker
   that was assigned the ledger and finished restoring its tables since the last rebalance
   commits; one stopped during a rebalance or a recovery holds a table that may be older than
   its last commit (an in-memory table is re-read from the changelog's start), and a commit
   from it would count again what an earlier commit drained.

What "released" means: the agents take their records in stream batches (Faust's
``take_events``), which acknowledge a batch's offsets when the agent's body returns; the
consumer then commits, after flushing the producer, the contiguous run of acknowledged offsets
from the committed one (:func:`streams.runtime.faust_patches.offsets.committable`). The other
batch agents (feedback, judge, ledger) return once every record of their batch was handled and
its effect sent; the per-record agents (reward, spans) once the record's decisions were sent.

May import: the standard library, the core, :mod:`.sink`, :mod:`.stores`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection, Iterable, Sequence
from typing import Protocol

from ...core.effects import Out
from ...core.ledger_stage import LedgerStage
from ...models import LedgerState
from .sink import Sink
from .stores import BatchedStore

__all__ = ["Checkpoint", "FeedbackGate", "Producer"]


class Producer(Protocol):
    """What the checkpoint needs of the worker's producer."""

    async def flush(self) -> None:
        """Wait until the broker acknowledged everything sent so far."""


class FeedbackGate:
    """Keeps this worker's ``POST /feedback`` requests out of a commit's last read of the ready
    count and its ``POST /commit``: a feedback applied between the two is drained by the commit
    but counted as new by the next one, which is then sent with nothing to drain (seen in a CI
    run: a worker restarted after a kill committed its predecessor's batch while the feedback
    of new calls was being sent). Requests enter :meth:`shared` (any number at once); the
    commit enters :meth:`exclusive`, which waits for those in flight and holds new ones back."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._in_flight = 0
        self._closed = False

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._closed)
            self._in_flight += 1
        try:
            yield
        finally:
            async with self._changed:
                self._in_flight -= 1
                self._changed.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._closed)
            self._closed = True
            await self._changed.wait_for(lambda: self._in_flight == 0)
        try:
            yield
        finally:
            async with self._changed:
                self._closed = False
                self._changed.notify_all()


class Checkpoint:
    """The order of the live worker's effects (see the module): ``sink`` is where a batch's
    records go, ``stores`` the assemble stage's tables whose writes wait for the end of a batch,
    ``producer`` the worker's producer."""

    def __init__(self, sink: Sink, stores: Sequence[BatchedStore], producer: Producer) -> None:
        self.sink = sink
        self.stores = stores
        self.producer = producer
        self.gate = FeedbackGate()
        # this worker was assigned the ledger and its tables were restored since
        self._ledger_restored = False

    # -- 1. a batch of the assemble stage ---------------------------------------------------

    def at(self, partition: int) -> None:
        """The table writes that follow are made for a record of ``partition``."""
        for store in self.stores:
            store.partition = partition

    async def settle(self, outs: Iterable[Out], handled: Collection[int]) -> None:
        """Send what the batch decided (``outs``; the emits whose ``id`` is in ``handled`` with
        the :data:`~.channels.HANDLED` header), wait until the broker acknowledged every send,
        then write the batch's table writes. When this returns, the batch's input offsets may
        be committed."""
        sent = []
        for out in outs:
            sent.extend(await self.sink.dispatch(out, lambda emit: id(emit) in handled))
        for delivery in sent:
            await delivery
        for store in self.stores:
            store.flush()

    def discard(self) -> None:
        """A batch failed: its table writes are forgotten (it is read again)."""
        for store in self.stores:
            store.discard()

    # -- 2. the ledger's commit -------------------------------------------------------------

    async def write_ahead(self, stage: LedgerStage, state: LedgerState) -> None:
        """Make the ledger's ``state`` (with its pending commit) durable before ``/commit``."""
        stage.save(state)
        await self.producer.flush()

    async def flush(self) -> None:
        """Wait until the broker acknowledged everything this worker sent."""
        await self.producer.flush()

    # -- 3. the final commit of a graceful stop ---------------------------------------------

    def revoked(self) -> None:
        """A rebalance took this worker's partitions."""
        self._ledger_restored = False

    def recovered(self, holds_ledger: bool) -> None:
        """The tables' recovery completed; ``holds_ledger``: this worker was assigned the
        ledger."""
        self._ledger_restored = holds_ledger

    def may_commit_final(self, in_recovery: bool) -> bool:
        """Whether a graceful stop may commit what was acknowledged: only a worker that holds
        the ledger, restored since the last rebalance and not being restored again
        (``in_recovery``: a recovery began after the last one completed)."""
        return self._ledger_restored and not in_recovery
