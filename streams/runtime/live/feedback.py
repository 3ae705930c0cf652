"""The feedback port of the live worker: Trinity's ``/feedback`` under the commit gate, for the
feedback stage (3) and for the assemble stage's feedback at once.

The rule is the core's, shared with replay: :func:`~streams.core.feedback.deliver` (one request
per distinct step reward, then the :class:`~streams.models.FeedbackAck` for the ledger). This
module gives it its port:

- the feedback stage (:meth:`FeedbackPort.handle`, stage 3, on ``<p>.rewarded``): each request
  under the one retry policy (:func:`streams.io.trinity.retrying`), a rejection or giving up a
  dead letter; the acknowledgement emitted to ``<p>.ledger``;
- the assemble stage's feedback at once (:meth:`FeedbackPort.at_once`, :mod:`.assembling`):
  each request tried once; what Trinity could not take now is left to stage 3, and for
  :data:`DIRECT_PAUSE_S` after such a failure the assemble stage sends none itself, so that a
  Trinity that is down costs it nothing;
- every request at most ``trinity.max_connections`` at once, through
  :class:`~.trinity.ObservedTrinity`: failed requests counted, and every request kept out of a
  commit's last ready-count read and its ``/commit`` (:class:`~.checkpoint.FeedbackGate`).

May import: the core, :mod:`streams.io`, the top-level modules, :mod:`streams.observe`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Any

from ...codec import SchemaRegistry
from ...core.effects import Emit, Out, Reject, Source
from ...core.feedback import FeedbackRequest, deliver
from ...core.retry import RetryPolicy
from ...envelope import Envelope
from ...errors import RecordError, TrinityError
from ...io.trinity import TrinityGaveUp, retrying
from ...models import FeedbackAck, RewardedTrajectory
from ...observe.metrics import Metrics
from .channels import handled, source_of
from .guard import StageGuard
from .trinity import ObservedTrinity

__all__ = ["DIRECT_PAUSE_S", "FeedbackPort", "rejected_reason"]

DIRECT_PAUSE_S = 30.0  # after a feedback sent at once failed, the assemble stage sends none


def rejected_reason(exc: Exception) -> str:
    """The reason of the dead letter of a feedback Trinity rejected."""
    return f"Trinity rejected the feedback: {exc}"


class FeedbackPort:
    """Trinity's ``/feedback`` for the live worker's stages (see the module)."""

    def __init__(
        self,
        trinity: ObservedTrinity,
        guard: StageGuard,
        *,
        codec: SchemaRegistry,
        rewarded_topic: str,
        retry: RetryPolicy,
        max_connections: int,
        metrics: Metrics,
        stats: Counter[str],
        clock: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trinity = trinity
        self.guard = guard
        self.codec = codec
        self.rewarded_topic = rewarded_topic
        self.retry = retry
        self.metrics = metrics
        self.stats = stats
        self.clock = clock
        self.monotonic = monotonic
        self._slots = asyncio.Semaphore(max_connections)
        self._paused_until = 0.0

    # -- the feedback stage (3) ----------------------------------------------------------------

    async def handle(self, event: Any) -> None:
        """One record of ``<p>.rewarded``: fed back under the retry policy, its acknowledgement
        to the ledger; a record the assemble stage fed back already is passed over."""
        if handled(event):  # acknowledged by the stage that closed the call (.assembling)
            self.stats["feedback.handled_before"] += 1
            return
        await self.guard.run(
            "feedback", source_of(event), self.on_rewarded, expected=(RecordError,), count=False
        )

    async def on_rewarded(self, env: Envelope) -> Out:
        rewarded = env.open()
        assert isinstance(rewarded, RewardedTrajectory)  # the edge lets nothing else through
        started = self.monotonic()
        ack = await deliver(rewarded, self.send, self.clock)
        self.stats["feedback.acked"] += 1
        self.metrics.feedback_acked(self.monotonic() - started)
        out = Out()
        out.emit("ledger", rewarded.trajectory_id.encode(), ack)  # partition 0: see the sink
        return out

    async def send(self, request: FeedbackRequest, what: str) -> int:
        """The feedback stage's port (:class:`~streams.core.feedback.FeedbackPort`): one
        request under the one retry policy; a rejection or giving up is a :class:`RecordError`
        (a dead letter with the reason)."""

        def retried() -> None:
            self.stats["feedback.retries"] += 1
            self.metrics.feedback_retry()

        try:
            tries, _ = await retrying(
                lambda: self.post(request), self.retry, what, on_retry=retried
            )
        except TrinityGaveUp as exc:
            raise RecordError(str(exc)) from exc
        except TrinityError as exc:  # rejected (4xx) or an answer that makes no sense
            raise RecordError(rejected_reason(exc)) from exc
        return tries

    async def post(self, request: FeedbackRequest) -> None:
        """One ``POST /feedback``, at most ``trinity.max_connections`` at once; no retry."""
        async with self._slots:
            await self.trinity.feedback(
                request.msg_ids, request.reward, request.task_id, request.run_id
            )

    # -- the assemble stage's feedback at once ---------------------------------------------------

    def direct(self) -> bool:
        """Whether the assemble stage sends feedback itself now (not within
        :data:`DIRECT_PAUSE_S` of a failure)."""
        return self.monotonic() >= self._paused_until

    async def at_once(self, partition: int, emit: Emit) -> FeedbackAck | Reject | None:
        """The feedback of one rewarded trajectory (``emit``), each request tried once: its
        acknowledgement; or Trinity's rejection (a 4xx) as the feedback stage's dead letter
        (retrying cannot help); or None when Trinity could not take it now (stage 3 retries)."""
        rewarded = emit.record
        assert isinstance(rewarded, RewardedTrajectory)
        started = self.monotonic()
        try:
            ack = await deliver(rewarded, self.once, self.clock)
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
            src = Source(self.rewarded_topic, partition, -1, emit.key, value)
            return Reject("feedback", rejected_reason(exc), RecordError.__name__, src)
        except Exception:
            self._deferred()
            return None
        self.stats["feedback.acked"] += 1
        self.stats["feedback.direct"] += 1
        self.metrics.feedback_acked(self.monotonic() - started)
        return ack

    async def once(self, request: FeedbackRequest, what: str) -> int:
        """A :class:`~streams.core.feedback.FeedbackPort` that tries once (the feedback
        stage's retries are the fallback)."""
        await self.post(request)
        return 1

    def _deferred(self) -> None:
        self.stats["feedback.deferred"] += 1
        self._paused_until = self.monotonic() + DIRECT_PAUSE_S
