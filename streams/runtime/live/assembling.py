"""Stage 1 in batches: a batch of ``<p>.agent-events`` and ``<p>.ticks`` records -> trajectories,
decisions, late events; and the common case's reward and feedback in the stage that closes the
call.

The assemble agent takes its records in stream batches (up to :data:`ASSEMBLE_BATCH`, waiting at
most :data:`ASSEMBLE_WITHIN` for one to fill). :meth:`AssembleLoop.run`, for each batch, in this
order:

1. each record is opened at the edge and handed to the assemble stage
   (:class:`~streams.core.assemble.Assembler`) under the guard (:meth:`~.guard.StageGuard.step`);
   the stage's table writes wait beside the tables (:class:`~.stores.BatchedStore`), so a call
   that opens and closes within the batch writes no changelog record;
2. each trajectory the batch closed is offered to the reward stage at once
   (:meth:`~streams.core.reward_join.RewardJoin.score_at_once`). When it waits for nothing (no
   judge verdict, no feedback grace period, no user feedback stored for it: the common case) it
   is scored here, and its ``/feedback`` requests are sent here, once, concurrently for the
   batch (:meth:`~.feedback.FeedbackPort.at_once`: the same step as the feedback stage's); an
   acknowledged one has its :class:`~streams.models.FeedbackAck` emitted to the ledger here.
   What has to wait goes on as before: the trajectory to the reward stage through
   ``<p>.trajectories``, a feedback Trinity did not acknowledge at once (down, slow, a 5xx) to
   the feedback stage through ``<p>.rewarded``, which retries it under the retry policy. A
   rejection (a 4xx) is the feedback stage's dead letter at once, as there;
3. the checkpoint (:meth:`~.checkpoint.Checkpoint.settle`) sends everything decided
   (trajectories and rewarded records handled here with the :data:`~.channels.HANDLED` header,
   which the reward and feedback stages pass over; they are the outputs users read), waits
   until the broker acknowledged every send, and only then writes the batch's table writes;
4. the batch's offsets are acknowledged once it returns.

A crash anywhere before 4 reads the whole batch again from the state it started from: the
calls close again, their trajectories and acknowledgements are sent again (each counted once by
the ledger, each msg_id rewarded once by Trinity). After 3 the records are late (their calls
closed), and what they decided was delivered before the state said so.

May import: the core, the top-level modules, :mod:`streams.observe`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from ...core.assemble import Assembler
from ...core.effects import Emit, Out, Reject
from ...core.reward_join import RewardJoin
from ...models import FeedbackAck, Trajectory
from .channels import source_of
from .checkpoint import Checkpoint
from .feedback import FeedbackPort
from .guard import StageGuard

__all__ = ["ASSEMBLE_BATCH", "ASSEMBLE_WITHIN", "AssembleLoop"]

ASSEMBLE_BATCH = 256  # records in one batch of the assemble stage
ASSEMBLE_WITHIN = 0.01  # seconds a batch waits to fill


@dataclass(eq=False)
class AssembleLoop:
    """The assemble agent's batch (see the module)."""

    guard: StageGuard
    assembler: Assembler
    reward_join: RewardJoin
    feedback: FeedbackPort
    checkpoint: Checkpoint

    async def run(self, events: list[Any]) -> None:
        """One batch of ``<p>.agent-events`` and ``<p>.ticks`` records (see the module)."""
        try:
            outs = self.decide_each(events)
            handled = await self.close_here(outs)
            await self.checkpoint.settle([out for _, out in outs], handled)
        except BaseException:
            self.checkpoint.discard()
            self.assembler.reset()  # its cache saw writes that were not made
            raise

    def decide_each(self, events: list[Any]) -> list[tuple[int, Out]]:
        """What the assemble stage decided on each record, with its partition (see the module,
        1); its table writes wait for the checkpoint."""
        outs = []
        for event in events:
            src = source_of(event)
            self.checkpoint.at(src.partition)
            outs.append((src.partition, self.guard.step("assemble", src, self.assembler)))
        return outs

    async def close_here(self, outs: list[tuple[int, Out]]) -> set[int]:
        """Reward (and feed back) the batch's trajectories that wait for nothing; the ids of the
        emits so handled (see the module, 2). ``outs``: what each record decided, with its
        partition."""
        handled: set[int] = set()
        delivering: list[tuple[int, Out, Emit]] = []
        for partition, out in outs:
            closed = [e for e in out.emits if e.topic == "trajectories"]
            for emit in closed:
                assert isinstance(emit.record, Trajectory)
                decided = self.reward_join.score_at_once(emit.key, emit.record)
                if decided is None:
                    continue  # it waits: the reward stage takes it from <p>.trajectories
                handled.add(id(emit))
                out.extend(decided)
                rewarded = [e for e in decided.emits if e.topic == "rewarded"]
                delivering.extend((partition, out, e) for e in rewarded)
        if delivering and self.feedback.direct():
            done = await asyncio.gather(*(self.feedback.at_once(p, e) for p, _, e in delivering))
            for (_, out, emit), result in zip(delivering, done, strict=True):
                if isinstance(result, FeedbackAck):
                    out.emit("ledger", result.rewarded.trajectory_id.encode(), result)
                elif isinstance(result, Reject):
                    out.reject(result)
                else:
                    continue  # not acknowledged: stage 3 takes it from <p>.rewarded
                handled.add(id(emit))
        return handled
