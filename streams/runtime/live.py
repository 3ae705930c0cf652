"""The live runner: the core's stages as Faust agents, read top to bottom in the order data flows.

Each agent is a short loop that hands a record to a stage of :mod:`streams.core` with the
wall clock as ``now`` and sends what the stage returns; the Faust tables are the stages' stores
(:class:`TableStore`). Records on every topic are raw bytes in Avro single-object encoding
(:mod:`streams.codec`), so a record that cannot be decoded or validated becomes a dead letter,
with its reason and source topic/partition/offset, instead of a crash or a silent skip inside
Faust's deserializer.

0. ``spans``      spans + ticks -> agent-events (OTLP trace fragments -> each call's records;
                  :mod:`.spans_agent`, :class:`~streams.core.spans.SpanResolver`; table ``traces``)
1. ``assemble``   agent-events + ticks  -> trajectories, decisions, late-events
                  (:class:`~streams.core.assemble.Assembler`; tables ``pending``, ``closed``)
2. ``reward``     trajectories + user-feedback + ticks (+ verdicts) -> rewarded (+ judge-requests)
                  (:class:`~streams.core.reward_join.RewardJoin`; tables ``awaiting`` and,
                  with a judge reward, ``verdicts``)
2b. ``judge``     judge-requests -> POST <reward.judge.url>/chat/completions -> verdicts
                  (only with a reward function that needs the LLM judge;
                  :class:`~streams.core.judge.JudgeStage` over the port
                  :func:`streams.io.judge.judge_port`, as in replay)
3. ``feedback``   rewarded -> POST /feedback, one per distinct step reward
                  (:func:`streams.core.feedback.deliver`, as in replay;
                  :func:`streams.io.trinity.retrying`) -> ledger
4. ``ledger``     ledger (acks + ticks) -> windows, alerts, POST /commit, commits
                  (:class:`~streams.core.ledger_stage.LedgerStage` and
                  :mod:`streams.core.commits`; table ``ledger``, one partition: one decision
                  maker for the deployment)

The clock (see :mod:`streams.core.clock`): timers on the leader worker publish ticks, so
processing time enters the stream as data and the agent that owns a partition's state is the
one that acts on time (abandoning calls, ending a feedback grace period, committing), with
table writes in their proper stream context.

Delivery is at-least-once everywhere; effects are idempotent: a trajectory is keyed by its
call_id, Trinity ignores repeated msg_ids, and the ledger counts a trajectory's acknowledgement
once.

May import: the core, :mod:`streams.io`, the top-level modules, faust. Not the devtools.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import faust
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from mode.utils.times import want_seconds

from ..codec import SchemaRegistry
from ..core.assemble import Assembler
from ..core.clock import wall_clock
from ..core.effects import Out, Reject, dead_letter
from ..core.feedback import FeedbackRequest, deliver
from ..core.judge import JudgeAnswerError, JudgeStage
from ..core.ledger import CommitPlan, is_held
from ..core.ledger_batch import run_batch
from ..core.ledger_stage import LedgerStage
from ..core.retry import RetryPolicy
from ..core.reward_join import RewardJoin
from ..core.rewards import Rewarder, build_rewarder
from ..core.select import Strategy, build_strategy
from ..envelope import Edge, Envelope, Source
from ..errors import BrokerError, RecordError, TrinityError
from ..io import kafka
from ..io.judge import JudgeClient, judge_port, policy_of
from ..io.security import faust_credentials
from ..io.trinity import TrinityClient, TrinityGaveUp, retrying
from ..models import (
    CommitRecord,
    Comparison,
    DriftAlert,
    LedgerState,
    RewardedTrajectory,
    RoutingShare,
    SelectionDecision,
    Tick,
    WindowSummary,
    utcnow,
)
from ..observe.metrics import Metrics, lag_of
from ..observe.pages import StatusPages
from ..observe.web import ObserveServer
from ..settings import RECORD_HEADROOM, Settings
from ..state_codec import is_head_key
from ..topics import Topics
from ..wire import TopicFraming
from . import handover, spans_agent
from .config import judge_of, ledger_config_of, limits_of
from .producing import install_idempotence, raw_schema
from .stores import TableStore

__all__ = ["Pipeline", "TableStore", "raw_input", "source_of"]

log = logging.getLogger("trajstream")

FEEDBACK_BATCH = 64
JUDGE_BATCH = 32
LEDGER_BATCH = 500
BATCH_WITHIN = 0.05  # seconds a batch waits to fill
UNREAD_LEDGER_S = 5.0  # how long a graceful stop reads the ledger records its consumer left
PRODUCER_LINGER = 0.005  # seconds the producer waits to fill a batch
PRODUCER_BATCH = 1 << 20  # bytes in one producer batch (per partition)


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


class Pipeline:
    """One Faust application running all four stages. Construct, then run ``pipeline.app``.

    The seams: ``trinity`` builds the HTTP client (tests pass one with a mock transport),
    ``strategy`` and ``rewarder`` override what the settings name.

    Why one class: it is the wiring, read top to bottom in the order data flows (topics,
    tables, the agents, the clocks, then one guard and how each stage's output is sent, and
    the ports the core's feedback step and ledger sequence run over); the decisions are all in
    :mod:`streams.core`.
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
        judge_client: Callable[[], JudgeClient] | None = None,
        framing: TopicFraming | None = None,
    ) -> None:
        self.settings = settings
        self.framing = framing  # a schema registry's wire format for what the worker writes
        self.bootstrap = bootstrap
        self.codec = codec or SchemaRegistry.default()
        self.edge = Edge(self.codec)  # every record read is opened here, once
        self.topics = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
        self.strategy = strategy or build_strategy(
            settings.selection.strategy,
            rate=settings.selection.rate,
            mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
        )
        self.rewarder = rewarder or build_rewarder(
            settings.reward.function, settings.reward.weights, settings.reward.step_discount
        )
        self.judge_spec = judge_of(settings, [self.rewarder])  # None: no judge reward
        self.judge_policy = policy_of(settings.reward.judge)
        self._judge_factory = judge_client or (
            lambda: JudgeClient.from_settings(settings.reward.judge)
        )
        self._judge: JudgeClient | None = None
        self.judge_stage = JudgeStage()
        # the judge stage's port: the one retry loop over this worker's client, with the
        # reward stage's clock (requested_at is in it)
        self.ask_judge = judge_port(
            lambda: self.judge_client,
            self.judge_policy,
            clock=lambda: wall_clock(),
            on_retry=self._judge_retried,
        )
        self.limits = limits_of(settings)
        self.ledger_cfg = ledger_config_of(settings)
        self.retry = RetryPolicy(max_age=settings.trinity.retry_max_age_s)
        self._ledger_lock = asyncio.Lock()
        # this worker was assigned the ledger and its table was restored since (see final_commit)
        self._ledger_restored = False
        self._http_slots = asyncio.Semaphore(settings.trinity.max_connections)
        self.worker_name = f"{socket.gethostname()}:{os.getpid()}"
        self._trinity_factory = trinity or (lambda: TrinityClient.from_settings(settings.trinity))
        self._trinity: TrinityClient | None = None
        self.stats: Counter[str] = Counter()
        t = self.topics
        self.metrics = Metrics(
            worker=self.worker_name,
            app_id=settings.app_id,
            inputs=(
                t.agent_events,
                t.spans,
                t.ticks,
                t.trajectories,
                t.user_feedback,
                t.rewarded,
                t.ledger,
                t.judge_requests,
                t.verdicts,
            ),
        )
        o = settings.observe
        pages = StatusPages(settings, bootstrap).routes if o.status_page else None
        self.server = ObserveServer(self.metrics, o.host, o.port, routes=pages) if o.port else None
        if self.server is not None:
            self.server.bind()  # a busy port fails here, at start, naming the setting
        self.app = self._build(bootstrap)
        self.assembler = Assembler(
            self.strategy,
            limits=self.limits,
            late_retention=timedelta(seconds=settings.assembly.late_retention_s),
            pending=TableStore(self.pending),
            closed=TableStore(self.closed),
            codec=self.codec,
        )
        self.reward_join = RewardJoin(
            self.rewarder,
            awaiting=TableStore(self.awaiting),
            codec=self.codec,
            feedback_grace=timedelta(seconds=settings.reward.feedback_grace_s),
            abandon_after=self.limits.abandon_after,
            score_incomplete=settings.reward.score_incomplete,
            max_future=self.limits.max_future,
            judge=self.judge_spec,
            verdicts=TableStore(self.verdicts) if self.verdicts is not None else None,
            verdict_retention=timedelta(seconds=settings.reward.judge.keep_verdicts_s),
        )
        self.ledger_stage = LedgerStage(
            self.ledger_cfg, store=TableStore(self.ledger), codec=self.codec
        )

    # -- the Faust application ---------------------------------------------------------------

    def _build(self, bootstrap: str) -> faust.App:
        s, t = self.settings, self.topics
        n = s.kafka.partitions
        handover.install()  # before the app: no committed offset passes an unhandled record
        install_idempotence()  # acks=all and idempotence for Faust's producer too
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
            broker_credentials=faust_credentials(s.kafka.security),
            producer_max_request_size=s.kafka.max_record_bytes,
            # batch what a worker produces (changelogs, trajectories, acks): a few ms of linger
            # and batches that hold more than one trajectory cut the producer's cost per record
            # (measured: about 15-20% of a worker's CPU per event); the group's offsets are
            # committed only after the producer is flushed, so nothing is acknowledged earlier
            producer_linger=PRODUCER_LINGER,
            producer_max_batch_size=min(PRODUCER_BATCH, s.kafka.max_record_bytes),
        )

        def raw_topic(name: str, partitions: int) -> faust.TopicT:
            return app.topic(name, partitions=partitions, schema=raw_schema(name, self.framing))

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
        self.t_judge_requests = raw_topic(t.judge_requests, n)
        self.t_verdicts = raw_topic(t.verdicts, n)
        self.t_comparisons = raw_topic(t.comparisons, 1)
        self.t_routing = raw_topic(t.routing, 1)
        self.pending = raw_table("pending", n)
        self.closed = raw_table("closed", n)
        self.awaiting = raw_table("awaiting", n)
        judging = self.judge_spec is not None
        # the first verdict of each call, while its trajectory may still be redelivered
        self.verdicts = raw_table("verdicts", n) if judging else None
        self.ledger = raw_table("ledger", 1)
        # One partition: every key lives in partition 0. Saying so lets the final commit write
        # outside a stream (Faust otherwise takes the partition from the current event, and
        # its use_partitioner option needs producer metadata it may not have yet).
        self.ledger.partition_for_key = lambda key: 0  # type: ignore[method-assign]
        # one entry per event of an open call, the first under the call's own key
        self.metrics.watch_open_calls(
            lambda: sum(1 for key in list(self.pending.keys()) if is_head_key(key))
        )

        # 1. assemble: a call's events -> one trajectory, if the call is selected
        # (the stages are made after the app: looked up when a record comes)
        self.guarded_agent(
            app,
            "assemble",
            (t.agent_events, t.ticks),
            lambda src, now: self.assembler.on_record(src, now),
        )

        # 0. spans: OTLP trace fragments -> each call's records on agent-events (spans_agent)
        self.t_agent_events = self.t_events  # the stage's output topic, by the core's name
        self.span_resolver = spans_agent.install(self, app, raw_table)

        # 2. reward: trajectory (+ user feedback, within the grace period, + the judge's
        # verdict) -> rewarded; a judge request once per call that needs a verdict
        reward_inputs = (t.trajectories, t.user_feedback, t.ticks, *([t.verdicts] * judging))
        self.guarded_agent(
            app, "reward", reward_inputs, lambda src, now: self.reward_join.on_record(src, now)
        )

        # 2b. judge: a judge request -> the judge's answer, retried while it is unavailable ->
        # a verdict (scored, or why not) on <p>.verdicts, which the reward stage reads. In
        # batches like the feedback stage: concurrent, at most reward.judge.max_connections
        # connections, the batch's offsets acknowledged after all of it was answered.
        if judging:

            @app.agent(self.t_judge_requests, name="judge")
            async def judge_stage(stream: faust.StreamT) -> None:
                async for batch in stream.take_events(JUDGE_BATCH, within=BATCH_WITHIN):
                    await asyncio.gather(*(self._judge_guarded(e) for e in batch))

        # 3. feedback: rewarded -> POST /feedback until acknowledged -> ledger. In batches: the
        # requests of a batch run concurrently (at most trinity.max_connections), and the
        # batch's offsets are acknowledged to Kafka only after all of it was handled.
        @app.agent(self.t_rewarded, name="feedback")
        async def feedback(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(FEEDBACK_BATCH, within=BATCH_WITHIN):
                await asyncio.gather(*(self._feedback_guarded(e) for e in batch))

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

        @app.timer(s.observe.lag_interval_s)
        async def lag_sampler() -> None:
            self.metrics.consumer_lag(_consumer_lag(app.consumer))

        @app.on_partitions_revoked.connect
        async def _revoked(app: faust.App, revoked: Any, **_: Any) -> None:
            self._ledger_restored = False
            self.metrics.partitions_revoked()

        @app.on_rebalance_complete.connect
        async def _recovered(app: faust.App, **_: Any) -> None:
            self._ledger_restored = self._holds_ledger(app.consumer)
            self.metrics.tables_recovered()

        @app.on_partitions_assigned.connect
        async def _assigned(app: faust.App, assigned: Any, **_: Any) -> None:
            self.metrics.partitions_assigned(assigned)
            # the deadline indexes are rebuilt from the tables: another worker may have
            # changed them meanwhile
            self.assembler.reset()
            self.reward_join.reset()
            self.span_resolver.reset()

        @app.on_before_shutdown.connect
        async def _final(app: faust.App, **_: Any) -> None:
            await self.final_commit()
            if self._trinity is not None:
                await self._trinity.aclose()
            if self._judge is not None:
                await self._judge.aclose()
            if self.server is not None:
                await self.server.stop()

        @app.on_after_configured.connect
        def _quiet(app: faust.App, **_: Any) -> None:  # pragma: no cover - logging only
            for noisy in ("aiokafka", "httpx"):
                logging.getLogger(noisy).setLevel(logging.WARNING)

        return app

    def changelog_topics(self) -> dict[str, tuple[int, dict[str, str]]]:
        """The tables' changelog topics, as faust would create them: name -> (partitions,
        topic configs). Created before the worker starts, so that its first assignment finds
        them in the cluster's metadata (faust creates them only moments before it subscribes)."""
        out: dict[str, tuple[int, dict[str, str]]] = {}
        for table in self.app.tables.values():
            topic = table.changelog_topic
            flags = [
                f for f, on in (("compact", topic.compacting), ("delete", topic.deleting)) if on
            ]
            config = {"cleanup.policy": ",".join(flags)} if flags else {}
            if topic.retention:
                config["retention.ms"] = str(int(want_seconds(topic.retention) * 1000))
            config.update({k: str(v) for k, v in (topic.config or {}).items()})
            partitions = topic.partitions or self.settings.kafka.partitions
            out[topic.get_topic_name()] = (partitions, config)
        # and the leader assignor's topic: missing from the first assignment's metadata, no
        # worker is leader (no ticks: the span stage's held ENDs, abandonment and commits wait)
        # until a later rebalance, which may never come
        out[f"{self.app.conf.id}-__assignor-__leader"] = (1, {})
        return out

    @property
    def trinity(self) -> TrinityClient:
        if self._trinity is None:
            observed = ObservedTrinity(self._trinity_factory(), self.metrics)
            self._trinity = observed  # type: ignore[assignment]
        return self._trinity

    # -- sending what the core decided ---------------------------------------------------------

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

    def _judge_retried(self) -> None:
        self.stats["judge.retries"] += 1
        self.metrics.judge_retry()

    # -- 3. feedback -------------------------------------------------------------------------

    async def _feedback_guarded(self, event: Any) -> None:
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

        async def send() -> None:
            async with self._http_slots:
                await self.trinity.feedback(
                    request.msg_ids, request.reward, request.task_id, request.run_id
                )

        try:
            tries, _ = await retrying(send, self.retry, what, on_retry=retried)
        except TrinityGaveUp as exc:
            raise RecordError(str(exc)) from exc
        except TrinityError as exc:  # rejected (4xx) or an answer that makes no sense
            raise RecordError(f"Trinity rejected the feedback: {exc}") from exc
        return tries

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

        It holds it when its ledger table has a state, and also when it was assigned the
        ledger and the table was restored with none yet: a stop that comes right after a
        rebalance, before the ledger agent took its first record, still commits the
        acknowledgements on ``<p>.ledger`` (read here from the start). A worker whose table
        was not restored (a stop during recovery) leaves the batch to the next owner."""
        if not (self.ledger_stage.exists() or self._ledger_restored):
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


class ObservedTrinity:
    """The Trinity client with every failed request counted (``trajstream_trinity_errors_total``
    by route and kind); it answers and raises exactly as the client does."""

    def __init__(self, client: TrinityClient, metrics: Metrics) -> None:
        self._client = client
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name not in ("feedback", "commit", "metrics"):
            return attr

        async def observed(*args: Any, **kwargs: Any) -> Any:
            try:
                return await attr(*args, **kwargs)
            except TrinityError as exc:
                self._metrics.trinity_error(name, exc)
                raise

        return observed


def _consumer_lag(consumer: Any) -> dict[tuple[str, int], int]:
    """Lag per assigned partition: the highwater the fetcher last saw minus the offset the
    group last committed (Faust's own record of it, read from Kafka at every assignment)."""
    try:
        assignment = consumer.assignment()
    except Exception:  # not started yet, or between assignments
        return {}
    committed = getattr(consumer, "_committed_offset", {})
    return lag_of(assignment, consumer.highwater, committed.get)
