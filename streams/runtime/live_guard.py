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
from ..core.effects import Out, Reject, dead_letter
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

__all__ = ["Guard", "raw_input", "source_of"]

log = logging.getLogger("trajstream")


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
    ) -> None:
        """Mount agent ``stage`` on ``app``: ``step`` on each record of ``topics`` (opened at
        the edge) under the one guard (:meth:`_guard`), record by record."""

        async def agent(stream: faust.StreamT) -> None:
            async for event in stream.events():
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
            if not isinstance(exc, expected):
                log.exception("%s: unexpected error on %s", stage, src.where())
            out = Out()
            out.reject(Reject.of(stage, exc, src))
        await self._send(out)
        return out

    async def _send(self, out: Out) -> None:
        self.stats.update(out.stats)
        for emit in out.emits:
            topic = getattr(self, f"t_{emit.topic}")
            partition = 0 if emit.topic == "ledger" else None
            value = self.codec.encode(emit.record)
            await topic.send(key=emit.key, value=value, partition=partition)
            self._observe(emit.record)
        for reject in out.rejects:
            await self._reject(reject)

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

    async def _reject(self, reject: Reject) -> None:
        record = dead_letter(
            reject,
            utcnow(),
            self.worker_name,
            self.topics.trajectories,
            max_payload=self.settings.kafka.max_record_bytes - RECORD_HEADROOM,
        )
        if reject.late:
            self.metrics.late_event()
            await self.t_late.send(key=record.key, value=self.codec.encode(record))
            return
        self.stats[f"dead_letters.{reject.stage}"] += 1
        self.metrics.dead_letter(reject.stage)
        where = reject.source.where() if reject.source else f"call {record.key!r}"
        log.warning("dead letter (%s) %s: %s", reject.stage, where, record.reason)
        await self.t_dead.send(key=record.key, value=self.codec.encode(record))
