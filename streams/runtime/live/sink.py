"""Where what the live worker's stages decided goes: records to their topics, rejects as dead
letters or late events.

A stage returns an :class:`~streams.core.effects.Out`; :meth:`Sink.dispatch` encodes each record it
emits and sends it to its topic (named as the core names it: ``"trajectories"``,
``"ledger"``, ...; the ledger's one partition is 0), with the :data:`~.channels.HANDLED` header
on the records a stage already took through the next one, and sends each reject as a dead
letter on ``dead_letters`` (or a late event on ``late_events``) with its reason and source. It
returns the deliveries, which the checkpoint (:mod:`.checkpoint`) awaits when an order depends
on them. The topics are Faust topics in the worker and in-memory ones in tests: anything with
Faust's ``send(key=, value=, partition=, headers=)`` returning an awaitable delivery.

May import: the core, the top-level modules, :mod:`streams.observe`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Any, Protocol

from ...codec import SchemaRegistry
from ...core.effects import Emit, Out, Reject, dead_letter
from ...models import (
    AvroModel,
    Comparison,
    DriftAlert,
    RoutingShare,
    SelectionDecision,
    WindowSummary,
)
from ...observe.metrics import Metrics
from .channels import HANDLED_HEADERS

__all__ = ["Sink", "Topic"]

log = logging.getLogger("trajstream")


class Topic(Protocol):
    """What the sink needs of a topic (a Faust topic has it): a send that returns its delivery."""

    async def send(
        self,
        *,
        key: bytes | None = None,
        value: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
    ) -> Awaitable[Any]: ...


@dataclass(eq=False)
class Sink:
    """The topics a stage's decisions go to, by the core's names (see the module).

    ``dead_letter_topic`` is the topic a dead letter without a source names (one decided on a
    clock tick); ``max_payload`` the bytes of a record a dead letter keeps; ``worker`` names
    this worker in them.
    """

    topics: Mapping[str, Topic]
    _: KW_ONLY
    codec: SchemaRegistry
    metrics: Metrics
    stats: Counter[str]
    worker: str
    dead_letter_topic: str
    max_payload: int
    clock: Callable[[], datetime]

    async def dispatch(
        self, out: Out, marked: Callable[[Emit], bool] | None = None
    ) -> list[Awaitable[Any]]:
        """Send what a stage decided; returns the sends' deliveries. ``marked`` says which
        emitted records the stage that made them already handled for the next stage: those
        carry the :data:`~.channels.HANDLED` header."""
        self.stats.update(out.stats)
        if lost := out.stats.get("trajectories.shadow_lost"):
            self.metrics.shadow_calls_lost(lost)
        sent = []
        for emit in out.emits:
            topic = self.topics[emit.topic]
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

    async def publish(self, topic: str, key: bytes | None, record: AvroModel) -> Awaitable[Any]:
        """Send one record to ``topic`` (none of a stage's): returns its delivery."""
        return await self.topics[topic].send(key=key, value=self.codec.encode(record))

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
            self.clock(),
            self.worker,
            self.dead_letter_topic,
            max_payload=self.max_payload,
        )
        if reject.late:
            self.metrics.late_event()
            return await self.publish("late_events", record.key, record)
        self.stats[f"dead_letters.{reject.stage}"] += 1
        self.metrics.dead_letter(reject.stage)
        where = reject.source.where() if reject.source else f"call {record.key!r}"
        log.warning("dead letter (%s) %s: %s", reject.stage, where, record.reason)
        return await self.publish("dead_letters", record.key, record)
