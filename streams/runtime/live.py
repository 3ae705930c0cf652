"""The live runner: the core's stages as Faust agents, read top to bottom in the order data flows.

Each agent is a short loop that hands a record to a stage of :mod:`streams.core` with the
wall clock as ``now`` and sends what the stage returns; the Faust tables are the stages' stores
(:class:`TableStore`). Agents read raw bytes and open each record at the edge
(:mod:`streams.envelope`, in :mod:`.live_guard`), so a record that cannot be decoded or
validated, or that does not belong on its topic, becomes a dead letter with its reason and
source topic/partition/offset, instead of a crash or a silent skip inside Faust's deserializer.
The guard and the sending are in :mod:`.live_guard`, the ports of the stages with effects
(judge, feedback, ledger) in :mod:`.live_ports`; this module is the wiring.

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
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import faust
from mode.utils.times import want_seconds

from ..codec import SchemaRegistry
from ..core.assemble import Assembler
from ..core.judge import JudgeStage
from ..core.ledger_stage import LedgerStage
from ..core.retry import RetryPolicy
from ..core.reward_join import RewardJoin
from ..core.rewards import Rewarder, build_rewarder
from ..core.select import Strategy, build_strategy
from ..envelope import Edge
from ..io.judge import JudgeClient, policy_of
from ..io.security import faust_credentials
from ..io.trinity import TrinityClient
from ..models import (
    Tick,
    utcnow,
)
from ..observe.metrics import Metrics, lag_of
from ..observe.pages import StatusPages
from ..observe.web import ObserveServer
from ..settings import Settings
from ..state_codec import is_head_key
from ..topics import Topics
from ..wire import TopicFraming
from . import faust_patches, spans_agent
from .config import judge_of, ledger_config_of, limits_of
from .live_close import ASSEMBLE_BATCH, ASSEMBLE_WITHIN, Closing
from .live_guard import raw_input, source_of
from .live_ports import ObservedTrinity
from .producing import raw_schema
from .stores import BatchedStore, TableStore

__all__ = [
    "ObservedTrinity",
    "Pipeline",
    "TableStore",
    "raw_input",
    "recovery_position",
    "source_of",
]

log = logging.getLogger("trajstream")

FEEDBACK_BATCH = 64
JUDGE_BATCH = 32
LEDGER_BATCH = 500
BATCH_WITHIN = 0.05  # seconds a batch waits to fill
PRODUCER_LINGER = 0.005  # seconds the producer waits to fill a batch
PRODUCER_BATCH = 1 << 20  # bytes in one producer batch (per partition)


class Pipeline(Closing):
    """One Faust application running all four stages. Construct, then run ``pipeline.app``.

    The seams: ``trinity`` builds the HTTP client (tests pass one with a mock transport),
    ``strategy`` and ``rewarder`` override what the settings name.

    This class is the wiring, read top to bottom in the order data flows (the stages, topics,
    tables, the agents, the clocks); then, in the modules it builds on, the one guard and how
    each stage's output is sent (:mod:`.live_guard`), and the ports the core's judge stage,
    feedback step and ledger sequence run over (:mod:`.live_ports`). The decisions are all in
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
        self.ask_judge = self._judge_port()
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
        self.metrics.watch_recovery(lambda: recovery_position(self.app), o.recovery_stall_s)
        self.metrics.watch_progress(o.consumption_stall_s)
        pages = StatusPages(settings, bootstrap).routes if o.status_page else None
        self.server = ObserveServer(self.metrics, o.host, o.port, routes=pages) if o.port else None
        if self.server is not None:
            self.server.bind()  # a busy port fails here, at start, naming the setting
        self.app = self._build(bootstrap)
        # the assemble stage's writes wait for the end of its batch (live_close)
        self.batched = (
            BatchedStore(TableStore(self.pending, entries_follow_head=True)),
            BatchedStore(TableStore(self.closed)),
        )
        self.assembler = Assembler(
            self.strategy,
            limits=self.limits,
            late_retention=timedelta(seconds=settings.assembly.late_retention_s),
            pending=self.batched[0],
            closed=self.batched[1],
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
        faust_patches.install()  # before the app: every patch of Faust and aiokafka, once
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

        # 1. assemble: a call's events -> one trajectory, if the call is selected; in batches,
        # the common case rewarded and fed back here (live_close)
        @app.agent(raw_input(app, t.agent_events, t.ticks), name="assemble")
        async def assemble(stream: faust.StreamT) -> None:
            async for batch in stream.take_events(ASSEMBLE_BATCH, within=ASSEMBLE_WITHIN):
                await self._assemble(batch)

        # 0. spans: OTLP trace fragments -> each call's records on agent-events (spans_agent)
        self.t_agent_events = self.t_events  # the stage's output topic, by the core's name
        self.span_resolver = spans_agent.install(self, app, raw_table)

        # 2. reward: trajectory (+ user feedback, within the grace period, + the judge's
        # verdict) -> rewarded; a judge request once per call that needs a verdict
        reward_inputs = (t.trajectories, t.user_feedback, t.ticks, *([t.verdicts] * judging))
        self.guarded_agent(
            app,
            "reward",
            reward_inputs,
            lambda src, now: self.reward_join.on_record(src, now),
            passes_over=t.trajectories,  # those rewarded by the assemble stage already
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
            await sample_progress(app.consumer, self.metrics, self.topics.agent_events)

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


def recovery_position(app: faust.App) -> int:
    """How far the tables' recovery has read: the sum of its changelog offsets, active and
    standby (it changes whenever the recovery reads a record)."""
    recovery = app.tables.recovery
    offsets = (*recovery.active_offsets.values(), *recovery.standby_offsets.values())
    return sum(max(0, offset) for offset in offsets)


async def sample_progress(consumer: Any, metrics: Metrics, topic: str) -> None:
    """One sample of the assigned partitions of ``topic`` for the progress watch
    (:mod:`streams.observe.progress`): their end offsets, asked of the broker (the fetcher's
    own highwater is not known for a partition it never fetched), and the group's committed
    offsets; a stalled one is logged each time. While the tables recover, or when the broker
    cannot say, nothing is judged (the watch starts afresh)."""
    if not metrics.recovered:
        metrics.consumption({})  # nothing watched: judged afresh from the next sample
        return
    try:
        tps = [tp for tp in consumer.assignment() if tp.topic == topic]
        ends = await asyncio.wait_for(consumer.highwaters(*tps), 10.0) if tps else {}
    except Exception:  # mid-rebalance, or the broker unreachable: counts as moving
        metrics.consumption({})  # nothing watched: judged afresh from the next sample
        return
    committed = getattr(consumer, "_committed_offset", {})
    metrics.consumption({(tp.topic, tp.partition): (ends.get(tp), committed.get(tp)) for tp in tps})
    stuck = metrics.consumption_stalled()
    if stuck:
        log.warning(
            "input partitions make no progress: %s (observe.consumption_stall_s); /healthz "
            "answers 503 until they move, so that a liveness probe restarts this worker",
            stuck,
        )


def _consumer_lag(consumer: Any) -> dict[tuple[str, int], int]:
    """Lag per assigned partition: the highwater the fetcher last saw minus the offset the
    group last committed (Faust's own record of it, read from Kafka at every assignment)."""
    try:
        assignment = consumer.assignment()
    except Exception:  # not started yet, or between assignments
        return {}
    committed = getattr(consumer, "_committed_offset", {})
    return lag_of(assignment, consumer.highwater, committed.get)
