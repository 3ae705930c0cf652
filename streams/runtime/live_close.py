"""Stage 1 in batches, with the common case's reward and feedback in the stage that closes the
call; a mixin of :class:`streams.runtime.live.Pipeline`.

The assemble agent takes its records in stream batches (up to :data:`ASSEMBLE_BATCH`, waiting at
most :data:`ASSEMBLE_WITHIN` for one to fill). For each batch, in this order:

1. each record is opened at the edge and handed to the assemble stage
   (:class:`~streams.core.assemble.Assembler`) under the one guard; the stage's table writes wait
   beside the tables (:class:`~.stores.BatchedStore`), so an open call that opens and closes
   within the batch writes no changelog record;
2. each trajectory the batch closed is offered to the reward stage at once
   (:meth:`~streams.core.reward_join.RewardJoin.score_at_once`). When it waits for nothing (no
   judge verdict, no feedback grace period, no user feedback stored for it: the common case) it
   is scored here, and its ``/feedback`` requests are sent here, once, concurrently for the
   batch (:func:`~streams.core.feedback.deliver`, the same step as the feedback stage's); an
   acknowledged one has its :class:`~streams.models.FeedbackAck` emitted to the ledger here.
   What has to wait goes on as before: the trajectory to the reward stage through
   ``<p>.trajectories``, a feedback Trinity did not acknowledge at once (down, slow, a 5xx) to
   the feedback stage through ``<p>.rewarded``, which retries it under the retry policy. A
   rejection (a 4xx) is the feedback stage's dead letter at once, as there. After a failed
   request the stage sends none itself for :data:`DIRECT_PAUSE_S`, so that a Trinity that is
   down costs the stage nothing;
3. everything decided is sent. Trajectories and rewarded records are published as before (they
   are the outputs users read), those handled here with the :data:`~.live_guard.HANDLED`
   header, which the reward and feedback stages pass over;
4. the sends are awaited until the broker acknowledged them, and only then the batch's table
   writes are written;
5. Faust acknowledges the batch's offsets once the batch is done.

A crash anywhere before 5 reads the whole batch again from the state it started from: the
calls close again, their trajectories and acknowledgements are sent again (each counted once by
the ledger, each msg_id rewarded once by Trinity). After 4 the records are late (their calls
closed), and what they decided was delivered in 4 before the state said so.

May import: the core, the top-level modules, :mod:`streams.observe`, faust.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from ..core.assemble import Assembler
from ..core.effects import Emit, Out, Reject, Source
from ..core.feedback import FeedbackRequest, deliver
from ..core.reward_join import RewardJoin
from ..errors import RecordError, TrinityError
from ..models import FeedbackAck, RewardedTrajectory, Trajectory, utcnow
from ..observe.metrics import Metrics
from .live_guard import source_of
from .live_ports import Ports, rejected_reason
from .stores import BatchedStore

__all__ = ["ASSEMBLE_BATCH", "ASSEMBLE_WITHIN", "DIRECT_PAUSE_S", "Closing"]

ASSEMBLE_BATCH = 256  # records in one batch of the assemble stage
ASSEMBLE_WITHIN = 0.01  # seconds a batch waits to fill
DIRECT_PAUSE_S = 30.0  # after a feedback the stage could not deliver, it leaves them all to stage 3


class Closing(Ports):
    """The assemble agent's batch (see the module)."""

    assembler: Assembler
    reward_join: RewardJoin
    metrics: Metrics
    stats: Counter[str]
    batched: tuple[BatchedStore, ...]
    _direct_paused_until: float = 0.0

    async def _assemble(self, events: list[Any]) -> None:
        """One batch of ``<p>.agent-events`` and ``<p>.ticks`` records (see the module)."""
        batched, step = self.batched, self.assembler.on_record
        try:
            outs = []
            for event in events:
                src = source_of(event)
                for store in batched:
                    store.partition = src.partition
                outs.append((src.partition, self._stepped("assemble", src, step)))
            handled = await self._close_here(outs)
            sent = []
            for _, out in outs:
                sent.extend(await self._send(out, lambda emit: id(emit) in handled))
            for delivery in sent:
                await delivery
            for store in batched:
                store.flush()
        except BaseException:
            for store in batched:
                store.discard()
            self.assembler.reset()  # its cache saw writes that were not made
            raise

    async def _close_here(self, outs: list[tuple[int, Out]]) -> set[int]:
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
        if delivering and time.monotonic() >= self._direct_paused_until:
            done = await asyncio.gather(*(self._deliver_here(p, e) for p, _, e in delivering))
            for (_, out, emit), result in zip(delivering, done, strict=True):
                if isinstance(result, FeedbackAck):
                    out.emit("ledger", result.rewarded.trajectory_id.encode(), result)
                elif isinstance(result, Reject):
                    out.reject(result)
                else:
                    continue  # not acknowledged: stage 3 takes it from <p>.rewarded
                handled.add(id(emit))
        return handled

    async def _deliver_here(self, partition: int, emit: Emit) -> FeedbackAck | Reject | None:
        """The feedback of one rewarded trajectory, each request tried once: its
        acknowledgement; or Trinity's rejection (a 4xx) as the feedback stage's dead letter
        (retrying cannot help); or None when Trinity could not take it now (stage 3 retries)."""
        rewarded = emit.record
        assert isinstance(rewarded, RewardedTrajectory)
        started = time.monotonic()
        try:
            ack = await deliver(rewarded, self._feedback_once, utcnow)
        except asyncio.CancelledError:
            raise
        except TrinityError as exc:
            if exc.retriable:
                self._deferred()
                return None
            self.stats["feedback.rejected"] += 1
            # what the feedback stage's dead letter says; the record it names is the rewarded
            # one, which took no offset of <p>.rewarded as a hop (-1)
            value = self.codec.encode(rewarded)
            src = Source(self.topics.rewarded, partition, -1, emit.key, value)
            return Reject("feedback", rejected_reason(exc), RecordError.__name__, src)
        except Exception:
            self._deferred()
            return None
        self.stats["feedback.acked"] += 1
        self.stats["feedback.direct"] += 1
        self.metrics.feedback_acked(time.monotonic() - started)
        return ack

    def _deferred(self) -> None:
        self.stats["feedback.deferred"] += 1
        self._direct_paused_until = time.monotonic() + DIRECT_PAUSE_S

    async def _feedback_once(self, request: FeedbackRequest, what: str) -> int:
        """A :class:`~streams.core.feedback.FeedbackPort` that tries once (the feedback
        stage's retries are the fallback)."""
        await self.post_feedback(request)
        return 1
