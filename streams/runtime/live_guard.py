"""The live worker's one guard: a record opened at the edge, a stage run on it, what it decided
sent; a mixin of :class:`streams.runtime.live.Pipeline`.

Every agent of the live worker reads raw bytes (:func:`raw_input`) and hands each record to
:meth:`Guard._guarded`, which opens it at the edge (:class:`streams.envelope.Edge`: decoded once,
its type checked against its topic), runs the stage on the envelope with the wall clock as
``now``, and sends what the stage returned (:meth:`Guard._send`): records to their topics,
rejects as dead letters (or late events) with their reason and source. Whatever a stage could
not handle becomes a dead letter of that stage, never a crash.

May import: the core, the top-level modules, :mod:`streams.observe`, faust.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import faust

from ..codec import SchemaRegistry
from ..core.clock import wall_clock
from ..core.effects import Emit, Out, Reject, dead_letter
from ..envelope import Edge, Envelope, Source
from ..models import (
    Comparison,
    DriftAlert,
    RoutingShare,
    SelectionDecision,
    WindowSummary,
    utcnow,
)
from ..observe.metrics import Metrics
from ..settings import RECORD_HEADROOM, Settings
from ..topics import Topics

__all__ = ["HANDLED", "Guard", "handled", "raw_input", "source_of"]

log = logging.getLogger("trajstream")

HANDLED = "trajstream-handled"
"""The header of a record on ``<p>.trajectories`` or ``<p>.rewarded`` that the stage which made
it already took through the next stage (rewarded, or fed back): an output for readers, not a hop
for the worker (:mod:`.live_close`)."""
HANDLED_HEADERS = [(HANDLED, b"1")]


def raw_input(app: faust.App, *topics: str) -> faust.TopicT:
    """An agent's input topics as raw bytes: the runner opens them at its edge
    (:class:`streams.envelope.Edge`; a record that cannot be read is a dead letter, not a crash
    in Faust's deserializer)."""
    return app.topic(
        *topics, key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
    )


def source_of(event: Any) -> Source:
    """The core's view of a Faust event."""
    msg = event.message
    return Source.read(msg.topic, msg.partition, msg.offset, msg.key, msg.value)


class Guard:
    """Mounting a stage as a guarded agent, and sending what a stage decided (see the module).
    The ``t_<name>`` attributes are the output topics, by the core's names."""

    settings: Settings
    codec: SchemaRegistry
    edge: Edge
    topics: Topics
    metrics: Metrics
    stats: Counter[str]
    worker_name: str
    t_dead: Any
    t_late: Any

    def guarded_agent(
        self,
        app: faust.App,
        stage: str,
        topics: tuple[str, ...],
        step: Callable[[Envelope, datetime], Out],
        passes_over: str | None = None,
    ) -> None:
        """Mount agent ``stage`` on ``app``: ``step`` on each record of ``topics`` (opened at
        the edge) under the one guard (:meth:`_guard`), record by record; the records of topic
        ``passes_over`` that carry the :data:`HANDLED` header are passed over."""

        async def agent(stream: faust.StreamT) -> None:
            async for event in stream.events():
                if passes_over is not None and event.message.topic == passes_over:
                    if handled(event):
                        self.stats[f"{stage}.handled_before"] += 1
                        continue
                await self._guard(stage, event, step)

        app.agent(raw_input(app, *topics), name=stage)(agent)

    async def _guard(
        self, stage: str, event: Any, step: Callable[[Envelope, datetime], Out]
    ) -> None:
        """Run one stage step on a record and send what it decided."""

        async def run(env: Envelope) -> Out:
            return step(env, wall_clock())

        await self._guarded(stage, source_of(event), run)

    async def _guarded(
        self,
        stage: str,
        src: Source,
        run: Callable[[Envelope], Awaitable[Out]],
        *,
        expected: tuple[type[Exception], ...] = (),
        count: bool = True,
    ) -> Out:
        """The one guard of every stage: open the record at the edge, run the stage on it and
        send what it decided; anything it could not handle becomes a dead letter of ``stage``,
        never a crash (logged with its traceback unless it is one of the ``expected`` errors,
        which say all in their reason)."""
        if count:
            self.metrics.event_in(src.topic)
        try:
            out = await run(self.edge.read(src))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            out = _failed(stage, src, exc, expected)
        await self._send(out)
        return out

    def _stepped(
        self, stage: str, src: Source, step: Callable[[Envelope, datetime], Out]
    ) -> Out:
        """The guard of :meth:`_guarded` for a stage step that does no I/O, without the sending:
        what it decided (a batch sends it later, :mod:`.live_close`)."""
        self.metrics.event_in(src.topic)
        try:
            return step(self.edge.read(src), wall_clock())
        except Exception as exc:
            return _failed(stage, src, exc, ())

    async def _send(
        self, out: Out, marked: Callable[[Emit], bool] | None = None
    ) -> list[Awaitable[Any]]:
        """Send what a stage decided; returns the sends' deliveries (awaited by a batch that
        writes its state after them). ``marked`` says which emitted records the stage that
        made them already handled for the next stage: those carry the :data:`HANDLED` header,
        and the next stage passes them over (see :mod:`.live_close`)."""
        self.stats.update(out.stats)
        sent = []
        for emit in out.emits:
            topic = getattr(self, f"t_{emit.topic}")
            partition = 0 if emit.topic == "ledger" else None
            value = self.codec.encode(emit.record)
            headers = HANDLED_HEADERS if marked is not None and marked(emit) else None
            sent.append(
                await topic.send(key=emit.key, value=value, partition=partition, headers=headers)
            )
            self._observe(emit.record)
        for reject in out.rejects:
            sent.append(await self._reject(reject))
        return sent

    def _observe(self, record: Any) -> None:
        if isinstance(record, SelectionDecision):
            self.metrics.decision(record.selection)
        elif isinstance(record, WindowSummary):
            self.metrics.window(record)
        elif isinstance(record, DriftAlert):
            self.metrics.drift_alert(record)
        elif isinstance(record, Comparison):
            self.metrics.comparison(record)
        elif isinstance(record, RoutingShare):
            self.metrics.routing(record)

    async def _reject(self, reject: Reject) -> Awaitable[Any]:
        record = dead_letter(
            reject,
            utcnow(),
            self.worker_name,
            self.topics.trajectories,
            max_payload=self.settings.kafka.max_record_bytes - RECORD_HEADROOM,
        )
        if reject.late:
            self.metrics.late_event()
            return await self.t_late.send(key=record.key, value=self.codec.encode(record))
        self.stats[f"dead_letters.{reject.stage}"] += 1
        self.metrics.dead_letter(reject.stage)
        where = reject.source.where() if reject.source else f"call {record.key!r}"
        log.warning("dead letter (%s) %s: %s", reject.stage, where, record.reason)
        return await self.t_dead.send(key=record.key, value=self.codec.encode(record))


def _failed(
    stage: str, src: Source, exc: Exception, expected: tuple[type[Exception], ...]
) -> Out:
    """What a stage that raised on ``src`` decided: the record is a dead letter of ``stage``
    (logged with its traceback unless the error is ``expected``: its reason says all)."""
    if not isinstance(exc, expected):
        log.exception("%s: unexpected error on %s", stage, src.where())
    out = Out()
    out.reject(Reject.of(stage, exc, src))
    return out


def handled(event: Any) -> bool:
    """Whether a record read carries the :data:`HANDLED` header: the stage that made it handled
    it for this one already."""
    headers = getattr(event.message, "headers", None) or ()
    if isinstance(headers, dict):
        headers = headers.items()
    return any(name == HANDLED for name, _ in headers)
