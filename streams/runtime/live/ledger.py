"""The ledger port of the live worker (stage 4): acknowledgements and ticks -> reward windows,
alerts, ``POST /commit``, commit records; and the final commit of a graceful stop.

The rules are the core's, shared with replay: the ledger's one batch sequence
(:func:`~streams.core.ledger_batch.run_batch`, with the commit protocol of
:mod:`streams.core.commits`). This module is what the live worker gives it
(:class:`~streams.core.ledger_batch.LedgerPort`): the Faust table as its store, Trinity through
the commit gate, the checkpoint's write-ahead (:meth:`~.checkpoint.Checkpoint.write_ahead`), the
commit records on ``<p>.commits``; and at a graceful stop, if the checkpoint allows it
(:meth:`~.checkpoint.Checkpoint.may_commit_final`), one last batch of the acknowledgements left
on ``<p>.ledger`` (:class:`UnreadLedger`), committed. The ledger has one partition: one worker
at a time decides commits for the deployment.

May import: the core, :mod:`streams.io`, the top-level modules, :mod:`streams.observe`,
aiokafka.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from ...core.effects import Out
from ...core.ledger import CommitPlan, is_held
from ...core.ledger_batch import run_batch
from ...core.ledger_stage import LedgerStage
from ...envelope import Edge, Envelope
from ...errors import BrokerError
from ...io import kafka
from ...models import CommitRecord, DriftAlert, LedgerState
from ...observe.metrics import Metrics
from ...settings import KafkaSecuritySettings
from .channels import source_of
from .checkpoint import Checkpoint, Producer
from .trinity import ObservedTrinity
from .sink import Sink

__all__ = ["UNREAD_LEDGER_S", "LedgerPort", "UnreadLedger", "holds_ledger"]

log = logging.getLogger("trajstream")

UNREAD_LEDGER_S = 5.0  # how long a graceful stop reads the ledger records its consumer left


@dataclass(eq=False)
class UnreadLedger:
    """The records on ``<p>.ledger`` after an offset, read with a consumer of its own: at a
    graceful stop the agent's consumer has stopped, and what it had not taken is read here."""

    bootstrap: str
    security: KafkaSecuritySettings
    topic: str
    edge: Edge
    producer: Producer

    async def after(self, applied_offset: int) -> list[Envelope]:
        """The records after ``applied_offset`` (once the producer has sent what this worker
        wrote); none when they cannot be read within UNREAD_LEDGER_S: the next owner of the
        ledger applies them then."""
        tp = TopicPartition(self.topic, 0)
        reader = kafka.consumer(self.bootstrap, self.security)
        try:
            async with asyncio.timeout(UNREAD_LEDGER_S):
                await self.producer.flush()
                await reader.start()
                end = (await reader.end_offsets([tp]))[tp]
                if end <= applied_offset + 1:
                    return []
                got = await kafka.fetch_ranges(
                    reader, {tp: (applied_offset + 1, end)}, lambda _: None
                )
        except (TimeoutError, KafkaError, BrokerError) as exc:
            log.warning("final commit: the unread ledger records were not read (%s)", exc)
            return []
        finally:
            await reader.stop()
        return [self.edge.open(m.topic, m.partition, m.offset, m.key, m.value) for m in got[tp]]


def holds_ledger(consumer: Any, topic: str) -> bool:
    """Whether ``consumer`` is assigned the ledger's one partition."""
    try:
        return TopicPartition(topic, 0) in consumer.assignment()
    except Exception:  # not started yet, or between assignments
        return False


@dataclass(eq=False)
class LedgerPort:
    """The ledger stage's batches and the final commit (see the module)."""

    stage: LedgerStage
    trinity: ObservedTrinity
    sink: Sink
    checkpoint: Checkpoint
    unread: UnreadLedger
    _: KW_ONLY
    edge: Edge
    metrics: Metrics
    stats: Counter[str]
    clock: Callable[[], datetime]
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    async def on_batch(self, events: list[Any]) -> None:
        """Apply a batch of ledger records, then decide windows and commits once (the core's
        one sequence, :func:`~streams.core.ledger_batch.run_batch`)."""
        for e in events:
            self.metrics.event_in(e.message.topic)
        envelopes = [self.edge.read(source_of(e)) for e in events]

        async def read(state: LedgerState) -> list[Envelope]:
            return envelopes

        async with self._lock:
            batch = await run_batch(self.stage, self, read, self.clock)
            self.metrics.ledger(batch.state)
        await self.sink.dispatch(batch.applied)

    # the ledger sequence's port (streams.core.ledger_batch.LedgerPort); `trinity` above

    async def send_decided(self, out: Out) -> None:
        for alert in out.records("alerts"):
            assert isinstance(alert, DriftAlert)
            log.warning(
                "reward drift: %s/%s window mean %.3f < %.2f x trailing %.3f",
                alert.agent_name,
                alert.model,
                alert.mean,
                alert.fraction,
                alert.trailing_mean,
            )
        await self.sink.dispatch(out)

    async def write_ahead(self, state: LedgerState) -> None:
        await self.checkpoint.write_ahead(self.stage, state)

    async def recorded(self, record: CommitRecord | None, plan: CommitPlan | None) -> None:
        if record is None:
            if plan is not None:
                self.stats["commit.failures"] += 1
            return
        held = is_held(record)
        self.stats[
            "commits" if record.sent else "commits.held" if held else "commits.not_sent"
        ] += 1
        self.metrics.commit(sent=record.sent, held=held)
        log.info(
            "commit %d%s: %d feedbacks",
            record.commit_seq,
            ""
            if record.sent
            else " (held: rewards dropped)"
            if held
            else " (not sent: nothing ready at Trinity)",
            record.feedback_count,
        )
        await self.sink.publish("commits", str(record.commit_seq).encode(), record)

    # -- a graceful stop -----------------------------------------------------------------------

    async def final_commit(self, *, in_recovery: bool) -> None:
        """On a graceful stop: commit what was acknowledged, if this worker holds the ledger.

        It holds it when the last rebalance assigned it the ledger and its tables' recovery
        completed since (:meth:`~.checkpoint.Checkpoint.may_commit_final`), also when the table
        was restored with no state yet: a stop right after a rebalance, before the ledger agent
        took its first record, still commits the acknowledgements on ``<p>.ledger`` (read here
        from the start). A worker stopped during a rebalance or a recovery (``in_recovery``)
        leaves the batch to the next owner."""
        if not self.checkpoint.may_commit_final(in_recovery):
            if self.stage.exists():
                log.info(
                    "final commit left to the next owner of the ledger: "
                    "stopped during a rebalance or a table recovery"
                )
            return

        async def read(state: LedgerState) -> list[Envelope]:
            # the consumer stopped before this signal: acknowledgements already on the
            # ledger that the ledger agent had not taken are applied here (each offset
            # once, so the next owner skips them), so that the final commit counts them
            unread = await self.unread.after(state.applied_offset)
            if unread:
                log.info(
                    "final commit: %d ledger records read after the consumer stopped",
                    len(unread),
                )
            return unread

        async with self._lock:
            try:
                batch = await run_batch(self.stage, self, read, self.clock, closing=True)
                if batch.plan is not None:
                    log.info("final commit of %d acknowledged feedbacks", batch.plan.count)
                await self.sink.dispatch(batch.applied)
                await self.checkpoint.flush()
            except Exception:  # the stop goes on; the next owner commits the batch
                log.exception("final commit failed")
