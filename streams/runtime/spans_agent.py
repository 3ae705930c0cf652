"""The span-resolution stage as a Faust agent (stage 0 of :mod:`.live`).

``spans``  <p>.spans + ticks -> agent-events (each call's START, steps, END)
           (:class:`~streams.core.spans.SpanResolver`; table ``traces``)

The OTLP ingest with ``otlp.resolve = trace`` publishes every span of an export, with its
parent link, as a :class:`~streams.models.TraceFragment` keyed by trace id; this agent joins a
trace's fragments (they meet on one partition) and emits the records of each call keyed by its
call_id on ``<p>.agent-events``, where the assemble stage takes them as any producer's. Ticks
drive the stage's clock (agent ENDs held ``otlp.settle_s``, orphans after
``otlp.orphan_after_s``, traces forgotten after ``otlp.retention_s``), as for the assemble stage.

Kept in its own module so that :mod:`.live` only mounts it (:func:`install`).

May import: what :mod:`.live` imports.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import faust

from ..core.spans import SpanLimits, SpanResolver
from ..settings import Settings

if TYPE_CHECKING:
    from ..codec import SchemaRegistry
    from ..core.effects import Envelope, Out
    from ..topics import Topics


class Pipeline(Protocol):
    """What the stage needs of the live worker (:class:`.live.Pipeline`, which imports this
    module: a protocol here, so that the two do not import each other)."""

    settings: Settings
    codec: SchemaRegistry
    topics: Topics

    def guarded_agent(
        self,
        app: faust.App,
        stage: str,
        topics: tuple[str, ...],
        step: Callable[[Envelope, datetime], Out],
    ) -> None: ...

__all__ = ["install", "span_limits_of"]


def span_limits_of(settings: Settings) -> SpanLimits:
    """The stage's bounds from the settings (``otlp.*`` and ``assembly.max_bytes``)."""
    o = settings.otlp
    return SpanLimits(
        settle=timedelta(seconds=o.settle_s),
        orphan_after=timedelta(seconds=o.orphan_after_s),
        retention=timedelta(seconds=o.retention_s),
        max_bytes=settings.assembly.max_bytes,
        max_future=timedelta(seconds=settings.assembly.max_future_s),
    )


def install(
    pipeline: Pipeline,
    app: faust.App,
    raw_table: Callable[..., Any],
) -> SpanResolver:
    """Mount the ``spans`` agent and its ``traces`` table on ``app``; the resolver it runs."""
    from .stores import TableStore

    t, n = pipeline.topics, pipeline.settings.kafka.partitions
    traces = raw_table("traces", n)
    resolver = SpanResolver(
        limits=span_limits_of(pipeline.settings),
        store=TableStore(traces),
        codec=pipeline.codec,
    )

    pipeline.guarded_agent(app, "spans", (t.spans, t.ticks), resolver.on_record)
    return resolver
