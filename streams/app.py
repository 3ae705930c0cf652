"""The Faust wiring: from agent events to Trinity commits, read top to bottom.

Each agent below is a short loop over one stage; the decisions are made by the pure modules
(:mod:`streams.join`, :mod:`streams.select`, :mod:`streams.rewards`, :mod:`streams.ledger`).
Records on every topic are raw bytes in Avro single-object encoding (:mod:`streams.codec`), so a
record that cannot be decoded or validated becomes a dead letter, with its reason and source
topic/partition/offset, instead of a crash or a silent skip inside Faust's deserializer.

1. ``assemble``   agent-events + ticks  -> trajectories, decisions, late-events
                  (tables ``pending`` and ``closed``, keyed by call_id)
2. ``reward``     trajectories + user-feedback + ticks -> rewarded (table ``awaiting``)
3. ``feedback``   rewarded -> POST /feedback (retried) -> ledger (FeedbackAck)
4. ``ledger``     ledger (acks + ticks) -> POST /commit, windows, alerts, commits
                  (table ``ledger``, one partition: one decision maker for the deployment)

Timers on the leader worker publish ticks: processing time enters the stream as data, so the
agent that owns a partition's state is the one that acts on time (abandoning calls, ending a
feedback grace period, committing), with table writes in their proper stream context.

Delivery is at-least-once everywhere; effects are idempotent: a trajectory is keyed by its
call_id, Trinity ignores repeated msg_ids, and the ledger counts a trajectory's acknowledgement
once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import faust

from .codec import SchemaRegistry
from .errors import (
    RecordError,
    RewardError,
    TrinityError,
    TrinityUnavailable,
    ValidationError,
)
from .join import Applied, Deadlines, Limits, Progress, close, closed_reason, view_of
from .ledger import (
    CommitPlan,
    LedgerConfig,
    apply_ack,
    commit_done,
    drift_alerts,
    due_commit,
    due_windows,
)
from .models import (
    AgentCall,
    AvroModel,
    AwaitingReward,
    ClosedCall,
    Completion,
    DeadLetter,
    FeedbackAck,
    LedgerState,
    PendingCall,
    RewardedTrajectory,
    SelectionDecision,
    Tick,
    Trajectory,
    UserFeedback,
    utcnow,
)
from .pending import PendingCodec
from .rewards import Rewarder, build_rewarder
from .runtime import handover
from .select import Strategy, build_strategy
from .settings import Settings
from .topics import Topics
from .trinity import TrinityClient, backoff_delays

__all__ = ["Pipeline"]

log = logging.getLogger("trajstream")

LEDGER_KEY = b"state"
FEEDBACK_BATCH = 64
LEDGER_BATCH = 500
BATCH_WITHIN = 0.05  # seconds a batch waits to fill


class Pipeline:
    """One Faust application running all four stages. Construct, then run ``pipeline.app``.

    The seams: ``trinity`` builds the HTTP client (tests pass one with a mock transport),
    ``strategy`` and ``rewarder`` override what the settings name.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        bootstrap: str,
        trinity: Callable[[], TrinityClient] | None = None,
        strategy: Strategy | None = None,
        rewarder: Rewarder | None = None,
        codec: SchemaRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec or SchemaRegistry.default()
        self.pending_codec = PendingCodec(self.codec)
        self.topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
        self.strategy = strategy or build_strategy(
            settings.selection.strategy,
            rate=settings.selection.rate,
            mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
        )
        self.rewarder = rewarder or build_rewarder(
            settings.reward.function, settings.reward.weights
        )
        self.limits = Limits(
            max_steps=settings.assembly.max_steps,
            max_bytes=settings.assembly.max_bytes,
            abandon_after=timedelta(seconds=settings.assembly.abandon_after_s),
        )
        self.ledger_cfg = LedgerConfig(
            interval=timedelta(seconds=settings.commit.interval_s),
            min_batch=settings.commit.min_batch,
            commit_empty=settings.commit.commit_empty,
            window=timedelta(seconds=settings.windows.size_s),
            grace=timedelta(seconds=settings.windows.grace_s),
            drift_fraction=settings.windows.drift_fraction,
            drift_history=settings.windows.drift_history,
        )
        self.late_retention = timedelta(seconds=settings.assembly.late_retention_s)
        # in-memory deadline indexes beside the tables, per partition; rebuilt from the table
        # after every assignment, since another worker may have changed it meanwhile
        self._abandon: dict[int, Deadlines] = {}
        self._forget: dict[int, Deadlines] = {}
        self._grace: dict[int, Deadlines] = {}
        self._ledger_lock = asyncio.Lock()
        self._http_slots = asyncio.Semaphore(settings.trinity.max_connections)
        self.feedback_grace = timedelta(seconds=settings.reward.feedback_grace_s)
        self.worker_name = f"{socket.gethostname()}:{os.getpid()}"
        self._trinity_factory = trinity or (
            lambda: TrinityClient(
                settings.trinity.url,
                timeout=settings.trinity.timeout_s,
                max_connections=settings.trinity.max_connections,
            )
        )
        self._trinity: TrinityClient | None = None
        self.stats: Counter[str] = Counter()
        self.app = self._build(bootstrap)

    # -- the Faust application ---------------------------------------------------------------

    def _build(self, bootstrap: str) -> faust.App:
        s, t = self.settings, self.topics
        n = s.kafka.partitions
        handover.install()  # before the app: no committed offset passes an unhandled record
        app = faust.App(
            s.app_id,
            broker=",".join(f"kafka://{b.strip()}" for b in bootstrap.split(",")),
            store="memory://",
            datadir=str(s.data_dir / s.app_id),
            topic_partitions=n,
            topic_replication_factor=s.kafka.replication_factor,
            table_standby_replicas=0,
            consumer_auto_offset_reset="earliest",
            web_enabled=False,
            producer_acks=-1,
            broker_commit_interval=1.0,
        )

        def raw_topic(name: str, partitions: int) -> faust.TopicT:
            return app.topic(
                name,
                partitions=partitions,
                key_type=bytes,
                value_type=bytes,
                key_serializer="raw",
                value_serializer="raw",
            )

        def raw_table(name: str, partitions: int, **kwargs: Any) -> faust.Table:
            table = app.Table(
                name, partitions=partitions, key_type=bytes, value_type=bytes, **kwargs
            )
            # Faust picks "json" for non-model types; the values are Avro bytes already, and
            # the changelog topic (created lazily) takes these serializers.
            table.key_serializer = "raw"
            table.value_serializer = "raw"
            return table

        self.t_events = raw_topic(t.agent_events, n)
        self.t_feedback_in = raw_topic(t.user_feedback, n)
        self.t_ticks = raw_topic(t.ticks, n)
        self.t_trajectories = raw_topic(t.trajectories, n)
        self.t_rewarded = raw_topic(t.rewarded, n)
        self.t_ledger = raw_topic(t.ledger, 1)
        self.t_windows = raw_topic(t.windows, 1)
        self.t_commits = raw_topic(t.commits, 1)
        self.t_dead = raw_topic(t.dead_letters, n)
        self.t_decisions = raw_topic(t.decisions, n)
        self.t_late = raw_topic(t.late_events, n)
        self.t_alerts = raw_topic(t.alerts, 1)
        self.pending = raw_table("pending", n)
        self.closed = raw_table("closed", n)
        self.awaiting = raw_table("awaiting", n)
        self.ledger = raw_table("ledger", 1)
        # One partition: every key lives in partition 0. Saying so lets the final commit write
        # outside a stream (Faust otherwise takes the partition from the current event, and
        # its use_partitioner option needs producer metadata it may not have yet).
        self.ledger.partition_for_key = lambda key: 0  # type: ignore[method-assign]

        # 1. assemble: a call's events -> one trajectory, if the call is selected
        @app.agent(
            app.topic(
                t.agent_events,
                t.ticks,
                key_type=bytes,
                value_type=bytes,
                key_serializer="raw",
                value_serializer="raw",
            ),
            name="assemble",
        )
        async def assemble(stream: faust.StreamT) -> None:
            async for event in stream.events():
                await self._guard("assemble", event, self._assemble)

        # 2. reward: trajectory (+ user feedback, within the grace period) -> rewarded
        @app.agent(
            app.topic(
                t.trajectories,
                t.user_feedback,
                t.ticks,
                key_type=bytes,
                value_type=bytes,
                key_serializer="raw",
                value_serializer="raw",
            ),
            name="reward",
        )
        async def reward(stream: faust.StreamT) -> None:
            async for event in stream.events():
                await self._guard("reward", event, self._reward)

        # 3. feedback: rewarded -> POST /feedback until acknowledged -> ledger. In batches: the
        # requests of a batch run concurrently (at most trinity.max_connections), and the
        # batch's offsets are acknowledged to Kafka only after all of it was handled.
        @app.agent(self.t_rewarded, name="feedback")
        async def feedback(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(FEEDBACK_BATCH, within=BATCH_WITHIN):
                await asyncio.gather(*(self._guard("feedback", e, self._feedback) for e in batch))

        # 4. ledger: acknowledgements and ticks -> commits and reward windows; one state
        # read and write per batch
        @app.agent(self.t_ledger, name="ledger")
        async def ledger(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(LEDGER_BATCH, within=BATCH_WITHIN):
                await self._ledger(batch)

        @app.timer(s.assembly.tick_s, on_leader=True)
        async def assembly_clock() -> None:
            tick = self.codec.encode(Tick(at=utcnow(), source=self.worker_name))
            for partition in range(n):
                await self.t_ticks.send(value=tick, partition=partition)

        @app.timer(s.commit.tick_s, on_leader=True)
        async def ledger_clock() -> None:
            tick = self.codec.encode(Tick(at=utcnow(), source=self.worker_name))
            await self.t_ledger.send(value=tick, partition=0)

        @app.on_partitions_assigned.connect
        async def _assigned(app: faust.App, assigned: Any, **_: Any) -> None:
            self._abandon.clear()
            self._forget.clear()
            self._grace.clear()

        @app.on_before_shutdown.connect
        async def _final(app: faust.App, **_: Any) -> None:
            await self.final_commit()
            if self._trinity is not None:
                await self._trinity.aclose()

        @app.on_after_configured.connect
        def _quiet(app: faust.App, **_: Any) -> None:  # pragma: no cover - logging only
            for noisy in ("aiokafka", "httpx"):
                logging.getLogger(noisy).setLevel(logging.WARNING)

        return app

    @property
    def trinity(self) -> TrinityClient:
        if self._trinity is None:
            self._trinity = self._trinity_factory()
        return self._trinity

    # -- shared plumbing ---------------------------------------------------------------------

    async def _guard(self, stage: str, event: Any, handler: Callable[[Any], Any]) -> None:
        """Run one handler; anything it cannot handle becomes a dead letter, never a crash."""
        try:
            await handler(event)
        except RecordError as exc:
            await self._dead_letter(stage, exc, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: unexpected error on %s", stage, _where(event))
            await self._dead_letter(stage, exc, event)

    def _letter(
        self,
        stage: str,
        reason: str,
        error_type: str,
        event: Any | None,
        *,
        key: bytes | None = None,
        payload: bytes | None = None,
    ) -> DeadLetter:
        """A dead letter for ``event``'s record (or, without one, for a trajectory that a
        clock tick was handling)."""
        msg = event.message if event is not None else None
        return DeadLetter(
            reason=reason,
            error_type=error_type,
            stage=stage,
            source_topic=msg.topic if msg else self.topics.trajectories,
            source_partition=msg.partition if msg else -1,
            source_offset=msg.offset if msg else -1,
            key=msg.key if msg else key,
            payload=payload if payload is not None else ((msg.value if msg else None) or b""),
            failed_at=utcnow(),
            worker=self.worker_name,
        )

    async def _dead_letter(
        self,
        stage: str,
        exc: BaseException,
        event: Any | None,
        *,
        key: bytes | None = None,
        payload: bytes | None = None,
    ) -> None:
        self.stats[f"dead_letters.{stage}"] += 1
        record = self._letter(
            stage,
            str(exc) or type(exc).__name__,
            type(exc).__name__,
            event,
            key=key,
            payload=payload,
        )
        where = _where(event) if event is not None else f"call {record.key!r}"
        log.warning("dead letter (%s) %s: %s", stage, where, record.reason)
        await self.t_dead.send(key=record.key, value=self.codec.encode(record))

    def _decode(self, event: Any) -> AvroModel:
        return self.codec.decode(event.message.value)

    @staticmethod
    def _check_key(event: Any, call_id: str) -> bytes:
        key = event.message.key
        if key is None or key != call_id.encode():
            raise ValidationError(
                f"record key {key!r} is not its call_id {call_id!r}: key every event by call_id "
                "so a call's events meet on one partition"
            )
        return bytes(key)

    # -- 1. assemble -------------------------------------------------------------------------

    async def _assemble(self, event: Any) -> None:
        record = self._decode(event)
        msg = event.message
        if isinstance(record, Tick):
            await self._assembly_clock(msg.partition, record)
            return
        if not isinstance(record, AgentCall | Completion):
            raise RecordError(f"{record.avro_name} does not belong on {msg.topic}")
        key = self._check_key(event, record.call_id)
        closed = self.closed.get(key)
        if closed is not None:
            await self._late(event, self.codec.decode_as(closed, ClosedCall))
            return
        now = utcnow()
        stored = self.pending.get(key)
        if stored is not None:
            progress = self.pending_codec.progress(stored)
        else:
            progress = Progress(record.call_id, now, msg.partition)
        applied = progress.apply(record, len(msg.value))
        if applied is Applied.DUPLICATE:
            self.stats["events.duplicate"] += 1
            return
        if applied is Applied.DUPLICATE_SEQ:
            assert isinstance(record, Completion)
            raise ValidationError(
                f"step seq {record.seq} of call {record.call_id} arrived twice with different "
                "event ids; the first was kept"
            )
        self.stats["events.applied"] += 1
        item = PendingCodec.item(record, msg.value)
        if stored is None:
            stored = self.pending_codec.new(record.call_id, msg.partition, now, item)
            self._index(self._abandon, msg.partition).set(key, now + self.limits.abandon_after)
        else:
            stored = self.pending_codec.append(stored, item)
        reason = closed_reason(progress, now, self.limits)
        if reason is None:
            self.pending[key] = stored
        else:
            await self._close(key, self.pending_codec.pending_call(stored), reason)

    async def _close(self, key: bytes, state: PendingCall, reason: str) -> None:
        now = utcnow()
        selection, trajectory = close(state, self.strategy, reason)
        if key in self.pending:
            del self.pending[key]
        self._index(self._abandon, state.partition).discard(key)
        self.closed[key] = self.codec.encode(
            ClosedCall(
                call_id=state.call_id, partition=state.partition, closed_at=now, reason=reason
            )
        )
        self._index(self._forget, state.partition).set(key, now + self.late_retention)
        self.stats[f"calls.{'selected' if selection.selected else 'rejected'}"] += 1
        if reason != "ended":
            log.info("call %s closed: %s (%s)", state.call_id, reason, selection.reason)
        view = view_of(state)
        decision = SelectionDecision(
            call_id=state.call_id,
            agent_name=view.agent_name,
            model=view.model,
            selection=selection,
            closed_reason=reason,
            steps=len(state.steps),
            marked=view.mark is not None,
            ended_at=state.end.event_time if state.end else None,
            decided_at=now,
        )
        await self.t_decisions.send(key=key, value=self.codec.encode(decision))
        if trajectory is not None:
            await self.t_trajectories.send(key=key, value=self.codec.encode(trajectory))

    async def _late(self, event: Any, closed: ClosedCall) -> None:
        """An event for a call that already closed: recorded, never applied, never dropped."""
        self.stats["events.late"] += 1
        reason = (
            f"arrived after call {closed.call_id} closed at {closed.closed_at.isoformat()} "
            f"({closed.reason}); late, or redelivered after a restart"
        )
        record = self._letter("late", reason, "Late", event)
        await self.t_late.send(key=record.key, value=self.codec.encode(record))

    def _index(self, indexes: dict[int, Deadlines], partition: int) -> Deadlines:
        index = indexes.get(partition)
        if index is None:
            index = indexes[partition] = Deadlines()
            self._rebuild(indexes, partition, index)
        return index

    def _rebuild(self, indexes: dict[int, Deadlines], partition: int, index: Deadlines) -> None:
        """Fill a partition's deadline index from its table (after an assignment)."""
        if indexes is self._abandon:
            for key, raw in list(self.pending.items()):
                progress = self.pending_codec.progress(raw)
                if progress.partition == partition:
                    index.set(key, progress.first_seen + self.limits.abandon_after)
        elif indexes is self._forget:
            for key, raw in list(self.closed.items()):
                closed = self.codec.decode_as(raw, ClosedCall)
                if closed.partition == partition:
                    index.set(key, closed.closed_at + self.late_retention)
        else:
            for key, raw in list(self.awaiting.items()):
                entry = self.codec.decode_as(raw, AwaitingReward)
                if entry.partition == partition:
                    index.set(key, entry.since + self._wait_limit(entry))

    async def _assembly_clock(self, partition: int, tick: Tick) -> None:
        for key in self._index(self._abandon, partition).due(tick.at):
            raw = self.pending.get(key)
            if raw is None:
                continue
            reason = closed_reason(self.pending_codec.progress(raw), tick.at, self.limits)
            if reason is not None:
                await self._close(key, self.pending_codec.pending_call(raw), reason)
        for key in self._index(self._forget, partition).due(tick.at):
            if key in self.closed:
                del self.closed[key]

    # -- 2. reward ---------------------------------------------------------------------------

    async def _reward(self, event: Any) -> None:
        record = self._decode(event)
        msg = event.message
        if isinstance(record, Tick):
            await self._reward_clock(msg.partition, record)
            return
        if not isinstance(record, Trajectory | UserFeedback):
            raise RecordError(f"{record.avro_name} does not belong on {msg.topic}")
        key = self._check_key(event, record.call_id)
        raw = self.awaiting.get(key)
        if raw:
            entry = self.codec.decode_as(raw, AwaitingReward)
        else:
            entry = AwaitingReward(call_id=record.call_id, partition=msg.partition, since=utcnow())
        if isinstance(record, UserFeedback):
            if all(f.event_id != record.event_id for f in entry.feedback):
                entry.feedback.append(record)
        elif entry.trajectory is None:
            entry.trajectory = record
            entry.since = utcnow()  # the grace period runs from the trajectory's arrival
        else:
            self.stats["trajectories.duplicate"] += 1
        trajectory = entry.trajectory
        if trajectory is not None:
            if not self.settings.reward.score_incomplete and trajectory.closed_reason != "ended":
                self.stats["trajectories.incomplete"] += 1
                if key in self.awaiting:
                    del self.awaiting[key]
                return
            known = {f.event_id for f in trajectory.feedback}
            trajectory.feedback.extend(f for f in entry.feedback if f.event_id not in known)
            waiting = (
                self.rewarder.wants_feedback
                and not trajectory.feedback
                and self.feedback_grace > timedelta(0)
            )
            if not waiting:
                await self._score(key, trajectory, event)
                return
        if not raw or entry.trajectory is record:  # new entry, or its deadline changes
            self._index(self._grace, msg.partition).set(key, entry.since + self._wait_limit(entry))
        self.awaiting[key] = self.codec.encode(entry)

    def _wait_limit(self, entry: AwaitingReward) -> timedelta:
        """A trajectory waits for feedback up to the grace period; feedback without a
        trajectory (its call was not selected, or has not closed yet) waits longer."""
        if entry.trajectory is not None:
            return self.feedback_grace
        return self.limits.abandon_after + self.feedback_grace

    async def _reward_clock(self, partition: int, tick: Tick) -> None:
        for key in self._index(self._grace, partition).due(tick.at):
            raw = self.awaiting.get(key)
            if raw is None:
                continue
            entry = self.codec.decode_as(raw, AwaitingReward)
            if entry.trajectory is not None:
                await self._score(key, entry.trajectory, None)
            else:
                # feedback for a call that was not selected (or never closed): not training data
                self.stats["user_feedback.unmatched"] += len(entry.feedback)
                del self.awaiting[key]

    async def _score(self, key: bytes, trajectory: Trajectory, event: Any | None) -> None:
        if key in self.awaiting:
            del self.awaiting[key]
        for index in self._grace.values():
            index.discard(key)
        try:
            rewarded = self.rewarder(trajectory)
        except RewardError as exc:
            payload = self.codec.encode(trajectory)
            await self._dead_letter("reward", exc, event, key=key, payload=payload)
            return
        self.stats["trajectories.rewarded"] += 1
        await self.t_rewarded.send(key=key, value=self.codec.encode(rewarded))

    # -- 3. feedback -------------------------------------------------------------------------

    async def _feedback(self, event: Any) -> None:
        rewarded = self.codec.decode_as(event.message.value, RewardedTrajectory)
        started = time.monotonic()
        max_age = self.settings.trinity.retry_max_age_s
        attempts = 0
        for delay in backoff_delays(base=0.2, cap=10.0):
            attempts += 1
            try:
                async with self._http_slots:
                    await self.trinity.feedback(
                        rewarded.msg_ids, rewarded.reward, rewarded.task_id, rewarded.run_id
                    )
                break
            except TrinityUnavailable as exc:
                if time.monotonic() - started + delay > max_age:
                    raise RecordError(
                        f"Trinity unavailable for {max_age:g}s ({attempts} attempts): {exc}"
                    ) from exc
                self.stats["feedback.retries"] += 1
                if attempts == 1 or attempts % 10 == 0:
                    log.warning("feedback for %s: %s; retrying", rewarded.call_id, exc)
                await asyncio.sleep(delay)
            except TrinityError as exc:  # rejected (4xx) or an answer that makes no sense
                raise RecordError(f"Trinity rejected the feedback: {exc}") from exc
        self.stats["feedback.acked"] += 1
        ack = FeedbackAck(rewarded=rewarded, acked_at=utcnow(), attempts=attempts)
        await self.t_ledger.send(
            key=rewarded.trajectory_id.encode(), value=self.codec.encode(ack), partition=0
        )

    # -- 4. ledger ---------------------------------------------------------------------------

    async def _ledger(self, events: list[Any]) -> None:
        """Apply a batch of ledger records, then decide windows and commits once."""
        bad: list[tuple[Any, BaseException]] = []
        async with self._ledger_lock:
            state = self._ledger_state()
            if state.pending_commit is not None:
                await self._resolve_commit(state)
            final = False
            now = utcnow()
            for event in events:
                offset = event.message.offset
                if offset <= state.applied_offset:
                    # applied before a restart: the table restored from the changelog has it
                    self.stats["ledger.reapplied"] += 1
                    continue
                state.applied_offset = offset
                try:
                    record = self._decode(event)
                    if isinstance(record, FeedbackAck):
                        if not apply_ack(state, record, now, self.ledger_cfg):
                            self.stats["ledger.duplicate_acks"] += 1
                    elif isinstance(record, Tick):
                        final = final or record.final
                    else:
                        raise RecordError(
                            f"{record.avro_name} does not belong on {event.message.topic}"
                        )
                except RecordError as exc:
                    bad.append((event, exc))
            await self._ledger_decisions(state, final=final)
        for event, error in bad:
            await self._dead_letter("ledger", error, event)

    def _ledger_state(self) -> LedgerState:
        raw = self.ledger.get(LEDGER_KEY)
        return self.codec.decode_as(raw, LedgerState) if raw else LedgerState()

    def _save_ledger(self, state: LedgerState) -> None:
        self.ledger[LEDGER_KEY] = self.codec.encode(state)

    async def _ledger_decisions(self, state: LedgerState, *, final: bool) -> None:
        now = utcnow()
        summaries = due_windows(state, now, self.ledger_cfg)
        for summary in summaries:
            key = f"{summary.agent_name}|{summary.model}|{summary.window_start.isoformat()}"
            await self.t_windows.send(key=key.encode(), value=self.codec.encode(summary))
        for alert in drift_alerts(state, summaries, now, self.ledger_cfg):
            log.warning(
                "reward drift: %s/%s window mean %.3f < %.2f x trailing %.3f",
                alert.agent_name,
                alert.model,
                alert.mean,
                alert.fraction,
                alert.trailing_mean,
            )
            await self.t_alerts.send(
                key=f"{alert.agent_name}|{alert.model}".encode(), value=self.codec.encode(alert)
            )
        plan = due_commit(state, now, self.ledger_cfg, final=final)
        if plan is not None:
            await self._commit(state, plan)
        self._save_ledger(state)

    async def _commit(self, state: LedgerState, plan: CommitPlan) -> None:
        """Send one commit, write-ahead: the plan and Trinity's explore step before it are
        stored (and flushed to the changelog) first, so a crash between sending and recording
        is resolved from the explore step instead of committing twice."""
        try:
            metrics = await self.trinity.metrics()
        except TrinityError as exc:
            log.warning("commit %d postponed: %s", plan.seq, exc)
            self.stats["commit.failures"] += 1
            return
        plan.step_before = _explore_step(metrics)
        plan.ready_before = _metric(metrics, READY)
        if (
            plan.ready_before is not None
            and state.ready_at_last_commit is not None
            and plan.ready_before <= state.ready_at_last_commit
        ):
            # Trinity has nothing ready: the previous commit already drained these feedbacks
            # (Trinity acknowledged them before their acknowledgements reached the ledger).
            # A commit now would drain nothing and still advance the explore step.
            await self._commit_recorded(
                state,
                plan,
                json.dumps({"not_sent": "nothing ready at Trinity"}),
                sent=False,
                experiences=0,
            )
            return
        state.pending_commit = plan
        self._save_ledger(state)
        await self.app.producer.flush()
        await self._send_commit(state, plan)

    async def _send_commit(self, state: LedgerState, plan: CommitPlan) -> None:
        try:
            # Trinity's ready count again, right before the commit drains it: feedback that
            # Trinity applied since the first read (the write-ahead flush takes a while) is
            # drained by this commit and must not look new to the next one
            ready = _metric(await self.trinity.metrics(), READY)
            if ready is not None:
                plan.ready_before = max(ready, plan.ready_before or 0)
            answer = await self.trinity.commit()
        except TrinityError as exc:
            # the plan stays pending: the next ledger record resolves it
            log.warning("commit %d failed: %s; will retry", plan.seq, exc)
            self.stats["commit.failures"] += 1
            return
        experiences = None
        if plan.ready_before is not None and state.ready_at_last_commit is not None:
            experiences = plan.ready_before - state.ready_at_last_commit
        await self._commit_recorded(
            state, plan, json.dumps(answer, sort_keys=True), experiences=experiences
        )

    async def _resolve_commit(self, state: LedgerState) -> None:
        """A commit was in flight when the ledger last stopped (or failed): was it applied?"""
        plan = state.pending_commit
        assert plan is not None
        try:
            step = _explore_step(await self.trinity.metrics())
        except TrinityError as exc:
            log.warning("cannot resolve commit %d yet: %s", plan.seq, exc)
            return
        if plan.step_before is not None and step is not None and step > plan.step_before:
            log.info(
                "commit %d was applied before the restart (explore step %d -> %d)",
                plan.seq,
                plan.step_before,
                step,
            )
            await self._commit_recorded(
                state, plan, json.dumps({"recovered": True, "explore_step_num": step})
            )
        else:
            plan.step_before = step
            await self._send_commit(state, plan)

    async def _commit_recorded(
        self,
        state: LedgerState,
        plan: CommitPlan,
        answer: str,
        *,
        sent: bool = True,
        experiences: int | None = None,
    ) -> None:
        record = commit_done(state, plan, answer, sent=sent, experiences=experiences)
        self.stats["commits" if sent else "commits.not_sent"] += 1
        log.info(
            "commit %d%s: %d feedbacks",
            record.commit_seq,
            "" if sent else " (not sent: nothing ready at Trinity)",
            record.feedback_count,
        )
        await self.t_commits.send(
            key=str(record.commit_seq).encode(), value=self.codec.encode(record)
        )

    async def final_commit(self) -> None:
        """On a graceful stop: commit what was acknowledged, if this worker holds the ledger."""
        if LEDGER_KEY not in self.ledger:
            return
        async with self._ledger_lock:
            state = self._ledger_state()
            try:
                if state.pending_commit is not None:
                    await self._resolve_commit(state)
                plan = due_commit(state, utcnow(), self.ledger_cfg, final=True)
                if plan is not None:
                    log.info("final commit of %d acknowledged feedbacks", plan.count)
                    await self._commit(state, plan)
                self._save_ledger(state)
                await self.app.producer.flush()
            except Exception:  # the stop goes on; the next owner commits the batch
                log.exception("final commit failed")


READY = "rollout/ready_experience_count"


def _explore_step(metrics: dict[str, Any]) -> int | None:
    return _metric(metrics, "explore_step_num")


def _metric(metrics: dict[str, Any], name: str) -> int | None:
    value = metrics.get(name)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _where(event: Any) -> str:
    msg = event.message
    return f"{msg.topic}[{msg.partition}]@{msg.offset}"
