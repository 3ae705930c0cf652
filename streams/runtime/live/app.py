"""The live worker's wiring: the core's stages as Faust agents, read top to bottom in the order
data flows.

Each agent is a short loop that hands its records to an object of this package; the objects are
made and joined in one place, :func:`compose`, and the Faust application around them in
:class:`Pipeline`. Agents read raw bytes and open each record at the edge (:mod:`.guard`), so a
record that cannot be decoded or validated, or that does not belong on its topic, becomes a
dead letter with its reason and source topic/partition/offset, instead of a crash or a silent
skip inside Faust's deserializer.

0. ``spans``      spans + ticks -> agent-events (OTLP trace fragments -> each call's records;
                  :class:`~streams.core.spans.SpanResolver`; table ``traces``)
1. ``assemble``   agent-events + ticks -> trajectories, decisions, late-events, and for the
                  common case rewarded, ``POST /feedback`` and the acknowledgement to the ledger
                  (:class:`~.assembling.AssembleLoop` over
                  :class:`~streams.core.assemble.Assembler`; tables ``pending``, ``closed``)
2. ``reward``     trajectories + user-feedback + ticks (+ verdicts) -> rewarded (+ judge-requests)
                  (:class:`~streams.core.reward_join.RewardJoin`; tables ``awaiting`` and,
                  with a judge reward, ``verdicts``)
2b. ``judge``     judge-requests -> POST <reward.judge.url>/chat/completions -> verdicts
                  (only with a reward function that needs the LLM judge; :class:`~.judge.JudgePort`)
3. ``feedback``   rewarded -> POST /feedback, one per distinct step reward, retried -> ledger
                  (:class:`~.feedback.FeedbackPort`)
4. ``ledger``     ledger (acks + ticks) -> windows, alerts, POST /commit, commits
                  (:class:`~.ledger.LedgerPort` over :class:`~streams.core.ledger_stage.LedgerStage`
                  and :mod:`streams.core.commits`; table ``ledger``, one partition: one decision
                  maker for the deployment)

When an input offset may be committed, relative to the records sent, the table writes,
``/feedback`` and ``/commit``, is decided in one place: :class:`~.checkpoint.Checkpoint`.

The clock (see :mod:`streams.core.clock`): timers on the leader worker publish ticks, so
processing time enters the stream as data and the agent that owns a partition's state is the
one that acts on time (abandoning calls, ending a feedback grace period, committing), with
table writes in their proper stream context.

Delivery is at-least-once everywhere; effects are idempotent: a trajectory is keyed by its
call_id, Trinity ignores repeated msg_ids, and the ledger counts a trajectory's acknowledgement
once.

May import: the core, :mod:`streams.io`, the top-level modules, :mod:`streams.observe`, faust.
Not the devtools.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import faust
from mode.utils.times import want_seconds

from ...codec import SchemaRegistry
from ...core.assemble import Assembler
from ...core.assembly import Limits
from ...core.clock import wall_clock
from ...core.judge import JudgeSpec
from ...core.ledger import LedgerConfig
from ...core.ledger_stage import LedgerStage
from ...core.retry import RetryPolicy
from ...core.reward_join import RewardJoin
from ...core.rewards import Rewarder, build_rewarder
from ...core.select import Strategy, build_strategy
from ...core.spans import SpanLimits, SpanResolver
from ...core.store import Store
from ...envelope import Edge
from ...io.judge import JudgeClient, policy_of
from ...io.security import faust_credentials
from ...io.trinity import TrinityClient
from ...models import Tick, utcnow
from ...observe.metrics import Metrics
from ...observe.pages import StatusPages
from ...observe.web import ObserveServer
from ...settings import RECORD_HEADROOM, Settings
from ...state_codec import is_head_key
from ...topics import Topics
from ...wire import TopicFraming
from .. import faust_patches
from ..config import judge_of, ledger_config_of, limits_of
from .assembling import ASSEMBLE_BATCH, ASSEMBLE_WITHIN, AssembleLoop
from .channels import raw_input, raw_schema
from .checkpoint import Checkpoint, Producer
from .feedback import FeedbackPort
from .guard import StageGuard
from .judge import JudgePort
from .ledger import LedgerPort, UnreadLedger, holds_ledger
from .progress import consumer_lag, recovery_position, sample_progress
from .sink import Sink, Topic
from .stores import BatchedStore, TableStore
from .trinity import ObservedTrinity

__all__ = ["Pipeline", "Rules", "Stages", "compose", "span_limits_of"]

log = logging.getLogger("trajstream")

FEEDBACK_BATCH = 64
JUDGE_BATCH = 32
LEDGER_BATCH = 500
BATCH_WITHIN = 0.05  # seconds a batch waits to fill
PRODUCER_LINGER = 0.005  # seconds the producer waits to fill a batch
PRODUCER_BATCH = 1 << 20  # bytes in one producer batch (per partition)

OUTPUTS = (
    "agent_events",
    "trajectories",
    "rewarded",
    "decisions",
    "late_events",
    "dead_letters",
    "judge_requests",
    "verdicts",
    "ledger",
    "windows",
    "alerts",
    "comparisons",
    "routing",
    "commits",
)
"""The topics the stages write, by the core's names (:class:`streams.topics.Topics` fields)."""


@dataclass(frozen=True)
class Rules:
    """What the settings choose for the stages: the selection strategy, the reward function
    (both may be handed in instead), the judge (None: no reward needs it), the assembly limits,
    the ledger's configuration and the retry policies."""

    strategy: Strategy
    rewarder: Rewarder
    judge: JudgeSpec | None
    limits: Limits
    ledger: LedgerConfig
    retry: RetryPolicy
    judge_policy: RetryPolicy

    @classmethod
    def of(
        cls,
        settings: Settings,
        *,
        strategy: Strategy | None = None,
        rewarder: Rewarder | None = None,
    ) -> Rules:
        strategy = strategy or build_strategy(
            settings.selection.strategy,
            rate=settings.selection.rate,
            mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
        )
        rewarder = rewarder or build_rewarder(
            settings.reward.function,
            settings.reward.weights,
            settings.reward.step_discount,
            train_mixed=settings.reward.train_mixed,
        )
        return cls(
            strategy=strategy,
            rewarder=rewarder,
            judge=judge_of(settings, [rewarder]),
            limits=limits_of(settings),
            ledger=ledger_config_of(settings),
            retry=RetryPolicy(max_age=settings.trinity.retry_max_age_s),
            judge_policy=policy_of(settings.reward.judge),
        )


def span_limits_of(settings: Settings) -> SpanLimits:
    """The span stage's bounds from the settings (``otlp.*`` and ``assembly.max_bytes``)."""
    o = settings.otlp
    return SpanLimits(
        settle=timedelta(seconds=o.settle_s),
        orphan_after=timedelta(seconds=o.orphan_after_s),
        retention=timedelta(seconds=o.retention_s),
        max_bytes=settings.assembly.max_bytes,
        max_future=timedelta(seconds=settings.assembly.max_future_s),
    )


@dataclass(frozen=True)
class Stages:
    """The live worker's objects, composed (:func:`compose`): what its agents run."""

    sink: Sink
    guard: StageGuard
    checkpoint: Checkpoint
    trinity: ObservedTrinity
    spans: SpanResolver
    assembler: Assembler
    assemble: AssembleLoop
    reward: RewardJoin
    judge: JudgePort | None
    feedback: FeedbackPort
    ledger: LedgerPort


def compose(
    settings: Settings,
    rules: Rules,
    *,
    codec: SchemaRegistry,
    stores: Mapping[str, Store],
    topics: Mapping[str, Topic],
    producer: Producer,
    unread: UnreadLedger,
    trinity: Callable[[], TrinityClient],
    judge_client: Callable[[], JudgeClient],
    metrics: Metrics,
    stats: Counter[str],
    worker: str,
    clock: Callable[[], datetime] = wall_clock,
    monotonic: Callable[[], float] = time.monotonic,
) -> Stages:
    """The live worker's objects over its ``stores`` (by table name: ``pending``, ``closed``,
    ``awaiting``, ``verdicts`` with a judge reward, ``ledger``, ``traces``) and the ``topics``
    it writes (by the core's names, :data:`OUTPUTS`), in the order data flows. The worker
    passes Faust's tables and topics; a test, stores and topics in memory and a clock."""
    t = Topics(settings.kafka.topic_prefix, settings.kafka.partitions)
    sink = Sink(
        topics,
        codec=codec,
        metrics=metrics,
        stats=stats,
        worker=worker,
        dead_letter_topic=t.trajectories,
        max_payload=settings.kafka.max_record_bytes - RECORD_HEADROOM,
        clock=clock,
    )
    edge = Edge(codec)  # every record read is opened here, once
    guard = StageGuard(edge, sink, metrics=metrics, stats=stats, clock=clock)
    # the assemble stage's table writes wait for the end of its batch (the checkpoint's)
    pending, closed = BatchedStore(stores["pending"]), BatchedStore(stores["closed"])
    checkpoint = Checkpoint(sink, (pending, closed), producer)

    # 0. spans
    spans = SpanResolver(limits=span_limits_of(settings), store=stores["traces"], codec=codec)
    # 1. assemble
    assembler = Assembler(
        rules.strategy,
        limits=rules.limits,
        late_retention=timedelta(seconds=settings.assembly.late_retention_s),
        pending=pending,
        closed=closed,
        codec=codec,
    )
    # 2. reward (at once in the assemble stage, or in its own)
    reward = RewardJoin(
        rules.rewarder,
        awaiting=stores["awaiting"],
        codec=codec,
        feedback_grace=timedelta(seconds=settings.reward.feedback_grace_s),
        abandon_after=rules.limits.abandon_after,
        score_incomplete=settings.reward.score_incomplete,
        max_future=rules.limits.max_future,
        judge=rules.judge,
        verdicts=stores.get("verdicts") if rules.judge is not None else None,
        verdict_retention=timedelta(seconds=settings.reward.judge.keep_verdicts_s),
    )
    # 2b. judge
    judge = None
    if rules.judge is not None:
        judge = JudgePort(
            judge_client, rules.judge_policy, guard, metrics=metrics, stats=stats, clock=clock
        )
    # 3. feedback (at once in the assemble stage, or in its own), through the commit gate
    observed = ObservedTrinity(trinity, metrics, checkpoint.gate)
    feedback = FeedbackPort(
        observed,
        guard,
        codec=codec,
        rewarded_topic=t.rewarded,
        retry=rules.retry,
        max_connections=settings.trinity.max_connections,
        metrics=metrics,
        stats=stats,
        clock=clock,
        monotonic=monotonic,
    )
    assemble = AssembleLoop(guard, assembler, reward, feedback, checkpoint)
    # 4. ledger
    ledger = LedgerPort(
        LedgerStage(rules.ledger, store=stores["ledger"], codec=codec),
        observed,
        sink,
        checkpoint,
        unread,
        edge=edge,
        metrics=metrics,
        stats=stats,
        clock=clock,
    )
    return Stages(
        sink=sink,
        guard=guard,
        checkpoint=checkpoint,
        trinity=observed,
        spans=spans,
        assembler=assembler,
        assemble=assemble,
        reward=reward,
        judge=judge,
        feedback=feedback,
        ledger=ledger,
    )


class AppProducer:
    """The Faust application's producer (made by Faust when first used), as the checkpoint
    sees it."""

    def __init__(self, app: faust.App) -> None:
        self.app = app

    async def flush(self) -> None:
        await self.app.producer.flush()


class Pipeline:
    """One Faust application running all the stages. Construct, then run ``pipeline.app``.

    The seams: ``trinity`` and ``judge_client`` build the HTTP clients (tests pass ones with a
    mock transport), ``strategy`` and ``rewarder`` override what the settings name, ``framing``
    is a schema registry's wire format for what the worker writes.
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
        self.settings = s = settings
        self.codec = codec or SchemaRegistry.default()
        self.topics = t = Topics(s.kafka.topic_prefix, s.kafka.partitions)
        self.rules = Rules.of(s, strategy=strategy, rewarder=rewarder)
        self.worker_name = f"{socket.gethostname()}:{os.getpid()}"
        self.stats: Counter[str] = Counter()
        self.metrics = Metrics(
            worker=self.worker_name,
            app_id=s.app_id,
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
        o = s.observe
        self.metrics.watch_recovery(lambda: recovery_position(self.app), o.recovery_stall_s)
        self.metrics.watch_progress(o.consumption_stall_s)
        pages = StatusPages(s, bootstrap).routes if o.status_page else None
        self.server = ObserveServer(self.metrics, o.host, o.port, routes=pages) if o.port else None
        if self.server is not None:
            self.server.bind()  # a busy port fails here, at start, naming the setting

        self.app = app = self._app(bootstrap)
        partitions = t.all()

        def raw_topic(name: str) -> faust.TopicT:
            return app.topic(name, partitions=partitions[name], schema=raw_schema(name, framing))

        outputs = {name: raw_topic(getattr(t, name)) for name in OUTPUTS}
        self.ticks = raw_topic(t.ticks)
        self.tables = tables = self._tables(app)
        producer = AppProducer(app)
        self.stages = compose(
            s,
            self.rules,
            codec=self.codec,
            stores={
                name: TableStore(table, entries_follow_head=name == "pending")
                for name, table in tables.items()
            },
            topics=outputs,
            producer=producer,
            unread=UnreadLedger(bootstrap, s.kafka.security, t.ledger, Edge(self.codec), producer),
            trinity=trinity or (lambda: TrinityClient.from_settings(s.trinity)),
            judge_client=judge_client or (lambda: JudgeClient.from_settings(s.reward.judge)),
            metrics=self.metrics,
            stats=self.stats,
            worker=self.worker_name,
        )
        self._mount(app, outputs)

    # -- the Faust application ---------------------------------------------------------------

    def _app(self, bootstrap: str) -> faust.App:
        s = self.settings
        faust_patches.install()  # before the app: every patch of Faust and aiokafka, once
        return faust.App(
            s.app_id,
            broker=",".join(f"kafka://{b.strip()}" for b in bootstrap.split(",")),
            store="memory://",
            datadir=str(s.data_dir / s.app_id),
            topic_partitions=s.kafka.partitions,
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

    def _tables(self, app: faust.App) -> dict[str, faust.Table]:
        """The stages' tables, raw bytes both ways: ``pending`` and ``closed`` (assemble),
        ``awaiting`` (reward), ``verdicts`` (only with a judge reward: the first verdict of each
        call, while its trajectory may still be redelivered), ``ledger`` (one partition) and
        ``traces`` (spans)."""
        n = self.settings.kafka.partitions

        def raw_table(name: str, partitions: int) -> faust.Table:
            table = app.Table(name, partitions=partitions, key_type=bytes, value_type=bytes)
            # Faust picks "json" for non-model types; the values are Avro bytes already, and
            # the changelog topic (created lazily) takes these serializers.
            table.key_serializer = "raw"
            table.value_serializer = "raw"
            return table

        tables = {name: raw_table(name, n) for name in ("pending", "closed", "awaiting")}
        if self.rules.judge is not None:
            tables["verdicts"] = raw_table("verdicts", n)
        tables["ledger"] = ledger = raw_table("ledger", 1)
        # One partition: every key lives in partition 0. Saying so lets the final commit write
        # outside a stream (Faust otherwise takes the partition from the current event, and
        # its use_partitioner option needs producer metadata it may not have yet).
        ledger.partition_for_key = lambda key: 0  # type: ignore[method-assign]
        tables["traces"] = raw_table("traces", n)
        pending = tables["pending"]
        # one entry per event of an open call, the first under the call's own key
        self.metrics.watch_open_calls(
            lambda: sum(1 for key in list(pending.keys()) if is_head_key(key))
        )
        return tables

    def _mount(self, app: faust.App, outputs: Mapping[str, Any]) -> None:
        """The agents, in the order data flows, then the clocks and the rebalance signals."""
        s, t, stages = self.settings, self.topics, self.stages

        # 1. assemble: a call's events -> one trajectory, if the call is selected; in batches,
        # the common case rewarded and fed back here (.assembling)
        @app.agent(raw_input(app, t.agent_events, t.ticks), name="assemble")
        async def assemble(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(ASSEMBLE_BATCH, within=ASSEMBLE_WITHIN):
                await stages.assemble.run(batch)

        # 0. spans: OTLP trace fragments -> each call's records on agent-events
        stages.guard.mount(app, "spans", (t.spans, t.ticks), stages.spans)

        # 2. reward: trajectory (+ user feedback, within the grace period, + the judge's
        # verdict) -> rewarded; a judge request once per call that needs a verdict
        judging = stages.judge is not None
        reward_inputs = (t.trajectories, t.user_feedback, t.ticks, *([t.verdicts] * judging))
        stages.guard.mount(
            app,
            "reward",
            reward_inputs,
            stages.reward,
            passes_over=t.trajectories,  # those rewarded by the assemble stage already
        )

        # 2b. judge: a judge request -> the judge's answer, retried while it is unavailable ->
        # a verdict (scored, or why not) on <p>.verdicts, which the reward stage reads. In
        # batches like the feedback stage: concurrent, at most reward.judge.max_connections
        # connections, the batch's offsets acknowledged after all of it was answered.
        if stages.judge is not None:
            judge = stages.judge

            @app.agent(outputs["judge_requests"], name="judge")
            async def judge_stage(stream: faust.StreamT) -> None:
                async for batch in stream.take_events(JUDGE_BATCH, within=BATCH_WITHIN):
                    await asyncio.gather(*(judge.handle(e) for e in batch))

        # 3. feedback: rewarded -> POST /feedback until acknowledged -> ledger. In batches: the
        # requests of a batch run concurrently (at most trinity.max_connections), and the
        # batch's offsets are acknowledged to Kafka only after all of it was handled.
        @app.agent(outputs["rewarded"], name="feedback")
        async def feedback(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(FEEDBACK_BATCH, within=BATCH_WITHIN):
                await asyncio.gather(*(stages.feedback.handle(e) for e in batch))

        # 4. ledger: acknowledgements and ticks -> commits and reward windows; one state
        # read and write per batch
        @app.agent(outputs["ledger"], name="ledger")
        async def ledger(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(LEDGER_BATCH, within=BATCH_WITHIN):
                await stages.ledger.on_batch(batch)

        @app.timer(s.assembly.tick_s, on_leader=True)
        async def assembly_clock() -> None:
            tick = self.codec.encode(Tick(at=utcnow(), source=self.worker_name))
            for partition in range(s.kafka.partitions):
                await self.ticks.send(value=tick, partition=partition)

        @app.timer(s.commit.tick_s, on_leader=True)
        async def ledger_clock() -> None:
            tick = self.codec.encode(Tick(at=utcnow(), source=self.worker_name))
            await outputs["ledger"].send(value=tick, partition=0)

        @app.timer(s.observe.lag_interval_s)
        async def lag_sampler() -> None:
            self.metrics.consumer_lag(consumer_lag(app.consumer))
            await sample_progress(app.consumer, self.metrics, t.agent_events)

        @app.on_partitions_revoked.connect
        async def _revoked(app: faust.App, revoked: Any, **_: Any) -> None:
            stages.checkpoint.revoked()
            self.metrics.partitions_revoked()

        @app.on_rebalance_complete.connect
        async def _recovered(app: faust.App, **_: Any) -> None:
            stages.checkpoint.recovered(holds_ledger(app.consumer, t.ledger))
            self.metrics.tables_recovered()

        @app.on_partitions_assigned.connect
        async def _assigned(app: faust.App, assigned: Any, **_: Any) -> None:
            self.metrics.partitions_assigned(assigned)
            # the deadline indexes are rebuilt from the tables: another worker may have
            # changed them meanwhile
            stages.assembler.reset()
            stages.reward.reset()
            stages.spans.reset()

        @app.on_before_shutdown.connect
        async def _final(app: faust.App, **_: Any) -> None:
            await stages.ledger.final_commit(in_recovery=getattr(app, "in_recovery", False))
            await stages.trinity.aclose()
            if stages.judge is not None:
                await stages.judge.aclose()
            if self.server is not None:
                await self.server.stop()

        @app.on_after_configured.connect
        def _quiet(app: faust.App, **_: Any) -> None:  # pragma: no cover - logging only
            for noisy in ("aiokafka", "httpx"):
                logging.getLogger(noisy).setLevel(logging.WARNING)

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
