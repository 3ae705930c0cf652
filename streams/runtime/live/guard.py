"""The live worker's one guard: a record opened at the edge, a stage run on it, what it decided
sent; whatever a stage could not handle becomes a dead letter of that stage, never a crash.

:class:`StageGuard` opens each record once (:class:`streams.envelope.Edge`: decoded once, its
type checked against its topic), runs a stage of the core on the envelope with the clock's
``now``, and hands what the stage decided to the :class:`~.sink.Sink` (:meth:`StageGuard.run`;
:meth:`StageGuard.step` returns it unsent, for a batch that sends it later). An error is the
stage's dead letter with its reason and source topic/partition/offset (logged with its
traceback unless it is one the stage expects). :meth:`StageGuard.mount` makes a Faust agent
that runs a stage record by record under the guard.

May import: the core, the top-level modules, :mod:`streams.observe`, faust.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any, Protocol

import faust

from ...core.effects import Out, Reject
from ...envelope import Edge, Envelope, Source
from ...observe.metrics import Metrics
from .channels import handled, raw_input, source_of
from .sink import Sink

__all__ = ["Stage", "StageGuard"]

log = logging.getLogger("trajstream")


class Stage(Protocol):
    """A stage of the core that does no I/O: one record and ``now`` in, its decisions out
    (:class:`~streams.core.assemble.Assembler`, :class:`~streams.core.reward_join.RewardJoin`,
    :class:`~streams.core.spans.SpanResolver`)."""

    def on_record(self, env: Envelope, now: datetime) -> Out: ...


@dataclass(eq=False)
class StageGuard:
    """Opens records at ``edge``, runs stages on them with ``clock``'s now, and sends what they
    decided to ``sink`` (see the module)."""

    edge: Edge
    sink: Sink
    _: KW_ONLY
    metrics: Metrics
    stats: Counter[str]
    clock: Callable[[], datetime]

    def mount(
        self,
        app: faust.App,
        name: str,
        topics: tuple[str, ...],
        stage: Stage,
        passes_over: str | None = None,
    ) -> None:
        """Mount agent ``name`` on ``app``: ``stage`` on each record of ``topics`` under the
        guard (:meth:`handle`), record by record; the records of topic ``passes_over`` that
        carry the :data:`~.channels.HANDLED` header are passed over."""

        async def agent(stream: faust.StreamT) -> None:
            async for event in stream.events():
                if passes_over is not None and event.message.topic == passes_over:
                    if handled(event):
                        self.stats[f"{name}.handled_before"] += 1
                        continue
                await self.handle(name, event, stage)

        app.agent(raw_input(app, *topics), name=name)(agent)

    async def handle(self, name: str, event: Any, stage: Stage) -> None:
        """Run ``stage`` on one Faust event and send what it decided."""

        async def run(env: Envelope) -> Out:
            return stage.on_record(env, self.clock())

        await self.run(name, source_of(event), run)

    async def run(
        self,
        stage: str,
        src: Source,
        run: Callable[[Envelope], Awaitable[Out]],
        *,
        expected: tuple[type[Exception], ...] = (),
        count: bool = True,
    ) -> Out:
        """Open ``src`` at the edge, ``run`` the stage on it and send what it decided; anything
        it could not handle becomes a dead letter of ``stage``, never a crash (logged with its
        traceback unless it is one of the ``expected`` errors, which say all in their reason)."""
        if count:
            self.metrics.event_in(src.topic)
        try:
            out = await run(self.edge.read(src))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out = failed(stage, src, exc, expected)
        await self.sink.dispatch(out)
        return out

    def step(self, name: str, src: Source, stage: Stage) -> Out:
        """:meth:`run` for a stage that does no I/O, without the sending: what it decided (a
        batch sends it later, :mod:`.assembling`)."""
        self.metrics.event_in(src.topic)
        try:
            return stage.on_record(self.edge.read(src), self.clock())
        except Exception as exc:
            return failed(name, src, exc, ())


def failed(stage: str, src: Source, exc: Exception, expected: tuple[type[Exception], ...]) -> Out:
    """What a stage that raised on ``src`` decided: the record is a dead letter of ``stage``
    (logged with its traceback unless the error is ``expected``: its reason says all)."""
    if not isinstance(exc, expected):
        log.exception("%s: unexpected error on %s", stage, src.where())
    out = Out()
    out.reject(Reject.of(stage, exc, src))
    return out
