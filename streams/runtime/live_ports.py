"""The ports of the live worker's stages with effects: judge (2b), feedback (3) and ledger (4);
a mixin of :class:`streams.runtime.live.Pipeline`.

The rules are the core's, shared with replay: the judge stage
(:class:`~streams.core.judge.JudgeStage`), the feedback step
(:func:`~streams.core.feedback.deliver`) and the ledger's one batch sequence
(:func:`~streams.core.ledger_batch.run_batch` with the commit protocol of
:mod:`streams.core.commits`). This module is what the live worker gives them: the judge over
HTTP with the one retry loop (:func:`streams.io.judge.judge_port`), Trinity's ``/feedback``
under the one retry policy and ``trinity.max_connections``, and for the ledger the Faust
table, the producer's flush as the write-ahead, the commit records and the final commit of a
graceful stop.

May import: the core, :mod:`streams.io`, the top-level modules, :mod:`streams.observe`, faust,
aiokafka.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import faust
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from ..codec import SchemaRegistry
from ..core.clock import wall_clock
from ..core.effects import Out
from ..core.feedback import FeedbackRequest, deliver
from ..core.judge import JudgeAnswerError, JudgePort, JudgeStage
from ..core.ledger import CommitPlan, is_held
from ..core.ledger_batch import run_batch
from ..core.ledger_stage import LedgerStage
from ..core.retry import RetryPolicy
from ..envelope import Edge, Envelope
from ..errors import BrokerError, RecordError, TrinityError
from ..io import kafka
from ..io.judge import JudgeClient, judge_port
from ..io.trinity import TrinityClient, TrinityGaveUp, retrying
from ..models import (
    CommitRecord,
    DriftAlert,
    LedgerState,
    RewardedTrajectory,
    utcnow,
)
from ..observe.metrics import Metrics
from ..settings import Settings
from ..topics import Topics
from .live_guard import Guard, handled, source_of

__all__ = ["FeedbackGate", "ObservedTrinity", "Ports", "rejected_reason"]

log = logging.getLogger("trajstream")

UNREAD_LEDGER_S = 5.0  # how long a graceful stop reads the ledger records its consumer left


def rejected_reason(exc: Exception) -> str:
    """The reason of the dead letter of a feedback Trinity rejected."""
    return f"Trinity rejected the feedback: {exc}"


class Ports(Guard):
    """The judge, feedback and ledger stages' ports of the live worker (see the module)."""

    settings: Settings
    bootstrap: str
    app: faust.App
    codec: SchemaRegistry
    edge: Edge
    topics: Topics
    metrics: Metrics
    stats: Counter[str]
    retry: RetryPolicy
    judge_stage: JudgeStage
    judge_policy: RetryPolicy
    ask_judge: JudgePort
    ledger_stage: LedgerStage
    t_commits: Any
    _judge: JudgeClient | None
    _judge_factory: Callable[[], JudgeClient]
    _http_slots: asyncio.Semaphore
    _ledger_lock: asyncio.Lock
    _ledger_restored: bool
    _trinity: TrinityClient | None
    _trinity_factory: Callable[[], TrinityClient]

    @property
    def trinity(self) -> TrinityClient:
        """Trinity's client (made when first used), every failed request counted."""
        if self._trinity is None:
            observed = ObservedTrinity(self._trinity_factory(), self.metrics)
            self._trinity = observed  # type: ignore[assignment]
        return self._trinity

    # -- 2b. judge ---------------------------------------------------------------------------

    @property
    def judge_client(self) -> JudgeClient:
        if self._judge is None:
            self._judge = self._judge_factory()
        return self._judge

    async def _judge_guarded(self, event: Any) -> None:
        """One judge request through the core's judge stage, the judge asked over this
        worker's port: its verdict (scored or not) on ``<p>.verdicts``; a request that cannot
        be read is a ``judge`` dead letter. Never raises for what the judge answered."""

        async def step(env: Envelope) -> Out:
            out = await self.judge_stage.on_record(env, self.ask_judge, wall_clock)
            for verdict in out.records("verdicts"):
                self.metrics.judge_verdict(scored=verdict.error is None)  # type: ignore[attr-defined]
            return out

        await self._guarded(
            "judge", source_of(event), step, expected=(RecordError, JudgeAnswerError)
        )

    def _judge_port(self) -> JudgePort:
        """The judge stage's port: the one retry loop over this worker's client, with the
        reward stage's clock (``requested_at`` is in it)."""
        return judge_port(
            lambda: self.judge_client,
            self.judge_policy,
            clock=lambda: wall_clock(),
            on_retry=self._judge_retried,
        )

    def _judge_retried(self) -> None:
        self.stats["judge.retries"] += 1
        self.metrics.judge_retry()

    # -- 3. feedback -------------------------------------------------------------------------

    async def _feedback_guarded(self, event: Any) -> None:
        if handled(event):  # acknowledged by the stage that closed the call (live_close)
            self.stats["feedback.handled_before"] += 1
            return
        await self._guarded(
            "feedback", source_of(event), self._feedback, expected=(RecordError,), count=False
        )

    async def send_feedback(self, request: FeedbackRequest, what: str) -> int:
        """The feedback stage's port (:class:`~streams.core.feedback.FeedbackPort`): one
        request under the one retry policy, at most ``trinity.max_connections`` at once; a
        rejection or giving up is a :class:`RecordError` (a dead letter with the reason)."""

        def retried() -> None:
            self.stats["feedback.retries"] += 1
            self.metrics.feedback_retry()

        try:
            tries, _ = await retrying(
                lambda: self.post_feedback(request), self.retry, what, on_retry=retried
            )
        except TrinityGaveUp as exc:
            raise RecordError(str(exc)) from exc
        except TrinityError as exc:  # rejected (4xx) or an answer that makes no sense
            raise RecordError(rejected_reason(exc)) from exc
        return tries

    async def post_feedback(self, request: FeedbackRequest) -> None:
        """One ``POST /feedback``, at most ``trinity.max_connections`` at once; no retry."""
        async with self._http_slots:
            await self.trinity.feedback(
                request.msg_ids, request.reward, request.task_id, request.run_id
            )

    async def _feedback(self, env: Envelope) -> Out:
        rewarded = env.open()
        assert isinstance(rewarded, RewardedTrajectory)  # the edge lets nothing else through
        started = time.monotonic()
        ack = await deliver(rewarded, self.send_feedback, utcnow)
        self.stats["feedback.acked"] += 1
        self.metrics.feedback_acked(time.monotonic() - started)
        out = Out()
        out.emit("ledger", rewarded.trajectory_id.encode(), ack)  # partition 0: see _send
        return out

    # -- 4. ledger ---------------------------------------------------------------------------

    async def _ledger(self, events: list[Any]) -> None:
        """Apply a batch of ledger records, then decide windows and commits once (the core's
        one sequence, :func:`~streams.core.ledger_batch.run_batch`)."""
        for e in events:
            self.metrics.event_in(e.message.topic)
        envelopes = [self.edge.read(source_of(e)) for e in events]

        async def read(state: LedgerState) -> list[Envelope]:
            return envelopes

        async with self._ledger_lock:
            batch = await run_batch(self.ledger_stage, self, read, utcnow)
            self.metrics.ledger(batch.state)
        await self._send(batch.applied)

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
        await self._send(out)

    async def write_ahead(self, state: LedgerState) -> None:
        self.ledger_stage.save(state)
        await self.app.producer.flush()

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
        await self.t_commits.send(
            key=str(record.commit_seq).encode(), value=self.codec.encode(record)
        )

    def _holds_ledger(self, consumer: Any) -> bool:
        try:
            return TopicPartition(self.topics.ledger, 0) in consumer.assignment()
        except Exception:  # not started yet, or between assignments
            return False

    async def final_commit(self) -> None:
        """On a graceful stop: commit what was acknowledged, if this worker holds the ledger.

        It holds it when the last rebalance assigned it the ledger and its tables' recovery
        completed since (``_ledger_restored``, cleared when a rebalance revokes), also when
        the table was restored with no state yet: a stop right after a rebalance, before the
        ledger agent took its first record, still commits the acknowledgements on
        ``<p>.ledger`` (read here from the start). A worker stopped during a rebalance or a
        recovery leaves the batch to the next owner: its table may hold a state it has not
        finished restoring (an in-memory table is re-read from the changelog's start, so
        mid-recovery it holds an older state), and a commit from it would count again what
        an earlier commit drained."""
        if not self._ledger_restored or getattr(self.app, "in_recovery", False):
            if self.ledger_stage.exists():
                log.info(
                    "final commit left to the next owner of the ledger: "
                    "stopped during a rebalance or a table recovery"
                )
            return

        async def read(state: LedgerState) -> list[Envelope]:
            # the consumer stopped before this signal: acknowledgements already on the
            # ledger that the ledger agent had not taken are applied here (each offset
            # once, so the next owner skips them), so that the final commit counts them
            unread = await self._unread_ledger(state.applied_offset)
            if unread:
                log.info(
                    "final commit: %d ledger records read after the consumer stopped",
                    len(unread),
                )
            return unread

        async with self._ledger_lock:
            try:
                batch = await run_batch(self.ledger_stage, self, read, utcnow, closing=True)
                if batch.plan is not None:
                    log.info("final commit of %d acknowledged feedbacks", batch.plan.count)
                await self._send(batch.applied)
                await self.app.producer.flush()
            except Exception:  # the stop goes on; the next owner commits the batch
                log.exception("final commit failed")

    async def _unread_ledger(self, applied_offset: int) -> list[Envelope]:
        """The records on ``<p>.ledger`` after ``applied_offset`` (once the producer has sent
        what this worker wrote); none when they cannot be read within UNREAD_LEDGER_S: the next
        owner of the ledger applies them then."""
        tp = TopicPartition(self.topics.ledger, 0)
        reader = kafka.consumer(self.bootstrap, self.settings.kafka.security)
        try:
            async with asyncio.timeout(UNREAD_LEDGER_S):
                await self.app.producer.flush()
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


class ObservedTrinity:
    """The Trinity client with every failed request counted (``trajstream_trinity_errors_total``
    by route and kind); it answers and raises exactly as the client does. Its ``/feedback``
    requests and the commit's last ready-count read and ``/commit`` pass :class:`FeedbackGate`."""

    def __init__(self, client: TrinityClient, metrics: Metrics) -> None:
        self._client = client
        self._metrics = metrics
        self.gate = FeedbackGate()

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        """For :func:`streams.core.commits.send_commit`: no feedback of this worker meanwhile."""
        return self.gate.exclusive()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name not in ("feedback", "commit", "metrics"):
            return attr

        async def observed(*args: Any, **kwargs: Any) -> Any:
            try:
                if name == "feedback":
                    async with self.gate.shared():
                        return await attr(*args, **kwargs)
                return await attr(*args, **kwargs)
            except TrinityError as exc:
                self._metrics.trinity_error(name, exc)
                raise

        return observed
