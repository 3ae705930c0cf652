"""The replay runner: a bounded range of history through the live worker's own core.

``trajstream replay`` reads a bounded range of ``<p>.agent-events`` and ``<p>.user-feedback``
(a time range, or explicit offsets) and runs it through the same stages as the live workers
(:class:`ReplayRunner`: :mod:`streams.core.assemble` and :mod:`streams.core.reward_join` over
in-memory stores), with a strategy and reward function of your choice. Only the clock differs
(:mod:`streams.core.clock`: record time instead of ticks). The result goes nowhere (a dry run),
to Trinity (feedback with the one retry policy of :func:`streams.io.trinity.retrying`, then
commits by the protocol of :mod:`streams.core.commits`: write-ahead, resolved after a crash,
never empty), or to dataset files (:mod:`streams.export.build`).

:func:`run_replay` is the driver: a plain consumer with manually assigned partitions and no
consumer group (:mod:`streams.io.kafka`; it can neither move the live workers' offsets nor touch
their tables), the Trinity client, the ``<p>.replayed`` ledger (:mod:`streams.core.backfill`)
and the files.

The LLM judge: a replay never asks again for a call with a verdict on ``<p>.verdicts`` (read
whole before the range, the last record of a call kept: the one compaction keeps, and the one
the live reward stage made last); a trajectory that needs a verdict and has none gets one as
``reward.judge.replay_missing`` says: ``ask`` (the default) asks the judge after the range is
read, with the live judge stage's retries, and records the verdicts on ``<p>.verdicts`` (so the
next replay and the workers reuse them; also on a dry run), ``dead_letter`` makes it a ``judge``
dead letter.

Idempotence: every feedback Trinity acknowledged is recorded on ``<p>.replayed``. A replay first
reads it and skips what was acknowledged under the same replay id, which is a hash of the
source prefix, the strategy and the reward function with its version: re-running a replay, or
replaying an overlapping range, rewards nothing twice.

May import: the core, :mod:`streams.io`, :mod:`streams.export`, the top-level modules, rich.
Not the devtools.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..codec import SchemaRegistry
from ..core.assemble import Assembler
from ..core.assembly import Limits
from ..core.backfill import (
    CommitPacer,
    FeedbackPlan,
    Outcome,
    ack_key,
    commit_key,
    plan_feedback,
    read_ledger,
    replay_id,
    replayed_topic,
)
from ..core.clock import RecordClock
from ..core.effects import Out, Reject, Source
from ..core.judge import JudgeSpec
from ..core.reward_join import NOTHING_TRAINABLE, RewardJoin
from ..core.rewards import Rewarder, build_rewarder
from ..core.select import Strategy, build_strategy
from ..core.store import MemoryStore
from ..errors import BrokerError, ConfigError, RecordError
from ..export.build import build_exports
from ..export.dataset import ExportFile, check_writable, write_export
from ..export.redact import Redactor
from ..io import kafka
from ..models import (
    JudgeRequest,
    JudgeVerdict,
    LedgerState,
    RewardedTrajectory,
    SelectionDecision,
    Trajectory,
    UserFeedback,
    utcnow,
)
from ..topics import Topics
from .config import judge_of, limits_of
from .replay_io import (
    SourceRecord,
    ask_judge,
    manifest,
    read_range,
    read_replayed,
    read_verdicts,
    resolve_range,
    send_to_trinity,
)
from .replay_options import OffsetRange, ReplayError, ReplayOptions, parse_offsets, parse_time
from .replay_report import Comparison, Distribution, compare, print_summary

if TYPE_CHECKING:
    from rich.console import Console

    from ..io.trinity import TrinityClient
    from ..settings import Settings

__all__ = [
    "CommitPacer",
    "Comparison",
    "Distribution",
    "OffsetRange",
    "Outcome",
    "ReplayCore",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
    "ReplayRunner",
    "SourceRecord",
    "ack_key",
    "build_exports",
    "commit_key",
    "compare",
    "parse_offsets",
    "parse_time",
    "plan_feedback",
    "read_ledger",
    "replay_id",
    "replayed_topic",
    "run_replay",
]

END_OF_TIME = datetime.max.replace(tzinfo=UTC)
"""The clock :meth:`ReplayRunner.finish` gives the reward stages: every grace period is over."""

VERDICTS_LOADED_AT = datetime(9000, 1, 1, tzinfo=UTC)
"""When replay's reward stages store the verdicts read before the range: after every record
time, so that none is forgotten while the range is read."""

log = logging.getLogger("trajstream.replay")


class ReplayRunner:
    """The replay runner of the core's assemble and reward stages: feed records, then finish.

    The same step functions as the live worker (:class:`~streams.core.assemble.Assembler`,
    :class:`~streams.core.reward_join.RewardJoin`), over in-memory stores, with record time as
    the clock (:class:`~streams.core.clock.RecordClock`: every record is also a tick of its
    partition). Records of one partition must be fed in the order the workers read them (by
    offset within a topic; the driver merges a partition's events and feedback by timestamp).
    :meth:`finish` moves every clock to the end of the range, then ends the grace periods still
    running (the workers would end them later) and reports the calls still open as incomplete.

    Several reward functions (an A/B comparison) each get their own reward stage over the same
    trajectories. What the stages reject is kept with the live dead letters' reasons
    (:attr:`rejects`, counted by reason in :attr:`invalid`; late events in ``events.late``).

    ``since``: calls that close before it are read (for their context) but left out of the
    results; the driver reads a look-back margin before the range so that calls that started
    before it are complete.
    """

    def __init__(
        self,
        strategy: Strategy,
        rewarders: Sequence[Rewarder],
        *,
        limits: Limits | None = None,
        feedback_grace: timedelta = timedelta(0),
        score_incomplete: bool = False,
        late_retention: timedelta = timedelta(seconds=900),
        since: datetime | None = None,
        codec: SchemaRegistry | None = None,
        topics: Topics | None = None,
        judge: JudgeSpec | None = None,
    ) -> None:
        if not rewarders:
            raise ConfigError("a replay needs a reward function")
        self.strategy = strategy
        self.rewarders = list(rewarders)
        self.limits = limits or Limits()
        self.since = since
        self.codec = codec or SchemaRegistry.default()
        self.topics = topics or Topics("trajstream", 1)
        self.assembler = Assembler(
            strategy,
            limits=self.limits,
            late_retention=late_retention,
            pending=MemoryStore(),
            closed=MemoryStore(),
            codec=self.codec,
            ticks_topic=self.topics.ticks,
        )
        self.joins = [
            RewardJoin(
                rewarder,
                awaiting=MemoryStore(),
                codec=self.codec,
                feedback_grace=feedback_grace,
                abandon_after=self.limits.abandon_after,
                score_incomplete=score_incomplete,
                max_future=self.limits.max_future,
                trajectories_topic=self.topics.trajectories,
                ticks_topic=self.topics.ticks,
                judge=judge,
                verdicts=MemoryStore() if judge is not None else None,
                verdicts_topic=self.topics.verdicts,
            )
            for rewarder in self.rewarders
        ]
        self.judge_requests: dict[str, JudgeRequest] = {}
        """Calls whose reward needs a verdict that no record on ``<p>.verdicts`` gave, by
        call_id: what :meth:`add_verdicts` expects after :meth:`finish`."""
        self.clock = RecordClock()
        self.stats: Counter[str] = Counter()
        self.outcomes: list[Outcome] = []
        self.incomplete: list[str] = []
        """Calls still open at the end of the range: neither closed nor scored."""
        self.rejects: list[Reject] = []
        """Every record the stages could not use, as the live dead letters carry them."""
        self.invalid: Counter[str] = Counter()
        """Why records were unusable (the live workers' dead letters), with counts."""
        self.reasons: Counter[str] = Counter()
        """Selection reasons of the calls closed in the range."""
        self.decisions: list[SelectionDecision] = []
        """The selection decision of every call closed in the range, in closing order."""
        self._feedback: dict[str, list[UserFeedback]] = {}
        self._by_call: dict[str, Outcome] = {}
        self._finished = False

    # -- feeding -------------------------------------------------------------------------------

    def feed(self, record: SourceRecord) -> None:
        """Apply one record of the range: first the time it brings, then the record."""
        if self._finished:
            raise RuntimeError("the replay has finished")
        self.stats[f"records.{record.kind}"] += 1
        partition = record.partition
        now = self.clock.advance(partition, record.timestamp)
        self._tick(partition, now)
        topic = self.topics.agent_events if record.kind == "event" else self.topics.user_feedback
        src = Source.read(topic, partition, record.offset, record.key, record.value)
        if record.kind == "event":
            self._assembled(self.assembler.on_record(src, now), now)
            return
        usable = True
        for index, join in enumerate(self.joins):
            out = join.on_record(src, now)
            usable = usable and not any(r.source is src and r.payload is None for r in out.rejects)
            self._joined(index, out, count=index == 0)
        if usable:
            self._remember_feedback(record.value)

    def feed_all(self, records: Iterable[SourceRecord]) -> None:
        for record in records:
            self.feed(record)

    def load_verdicts(self, records: Iterable[tuple[int, bytes | None, bytes]]) -> None:
        """The records of ``<p>.verdicts`` (partition, key, value) in offset order, before the
        range: the last of each call is stored (the one compaction keeps; none when the last is a
        tombstone)."""
        last: dict[bytes | None, tuple[int, bytes]] = {}
        for partition, key, value in records:
            last.pop(key, None)  # keep the order of the last records
            if value:  # a tombstone deletes the call's verdict: it is judged again
                last[key] = (partition, value)
        for offset, (key, (partition, value)) in enumerate(last.items()):
            src = Source(self.topics.verdicts, partition, offset, key, value)
            for index, join in enumerate(self.joins):
                out = join.on_record(src, VERDICTS_LOADED_AT)
                self._joined(index, out, count=index == 0)
            self.stats["judge.verdicts_stored"] += 1

    def partition_of(self, call_id: str) -> int | None:
        """The partition of a call closed in the range (None if unknown)."""
        outcome = self._by_call.get(call_id)
        return outcome.partition if outcome is not None and outcome.partition >= 0 else None

    def add_verdicts(self, verdicts: Iterable[JudgeVerdict]) -> None:
        """Verdicts for :attr:`judge_requests` (asked after :meth:`finish`, or made dead
        letters): the trajectories waiting for them are scored."""
        for verdict in verdicts:
            if self.judge_requests.pop(verdict.call_id, None) is None:
                continue
            outcome = self._by_call.get(verdict.call_id)
            partition = outcome.partition if outcome is not None else -1
            key = verdict.call_id.encode()
            src = Source(self.topics.verdicts, partition, -1, key, self.codec.encode(verdict))
            now = self.clock.at.get(partition, VERDICTS_LOADED_AT)
            for index, join in enumerate(self.joins):
                self._joined(index, join.on_record(src, now), count=index == 0)

    def finish(self, until: datetime | None = None) -> None:
        """End of the range: move the clocks to ``until`` (closing what the live workers would
        have abandoned by then), end the grace periods still running, and report the calls
        still open as incomplete."""
        if self._finished:
            return
        partitions = sorted(self.clock.at)
        if until is not None:
            for partition in partitions:
                self._tick(partition, self.clock.advance(partition, until))
        for partition in partitions:
            for index, join in enumerate(self.joins):
                self._joined(index, join.on_tick(partition, END_OF_TIME), count=index == 0)
        self.incomplete = self.assembler.open_calls()
        self.stats["calls.open_at_end"] = len(self.incomplete)
        self.stats["feedback.unmatched"] = sum(
            len(fbs) for call_id, fbs in self._feedback.items() if call_id not in self._by_call
        )
        self._finished = True

    # -- what the stages decided ---------------------------------------------------------------

    def _tick(self, partition: int, now: datetime) -> None:
        self._assembled(self.assembler.on_tick(partition, now), now)
        for index, join in enumerate(self.joins):
            self._joined(index, join.on_tick(partition, now), count=index == 0)

    def _assembled(self, out: Out, now: datetime) -> None:
        self.stats.update({k: v for k, v in out.stats.items() if k.startswith("events.")})
        self._rejected(out)
        before_range: set[str] = set()
        for decision in out.records("decisions"):
            assert isinstance(decision, SelectionDecision)
            if self.since is not None and decision.decided_at < self.since:
                self.stats["calls.before_range"] += 1
                before_range.add(decision.call_id)
                continue
            selected = decision.selection.selected
            self.decisions.append(decision)
            self.stats["calls.closed"] += 1
            self.stats[f"calls.{'selected' if selected else 'not_selected'}"] += 1
            self.stats[f"calls.closed_{decision.closed_reason.split(':')[0]}"] += 1
            self.reasons[decision.selection.reason] += 1
        for emit in out.emits:
            if emit.topic != "trajectories" or emit.record.call_id in before_range:  # type: ignore[attr-defined]
                continue
            trajectory = emit.record
            assert isinstance(trajectory, Trajectory)
            partition = emit.partition if emit.partition is not None else -1
            n = len(self.rewarders)
            outcome = Outcome(
                trajectory=trajectory,
                closed_at=now,
                partition=partition,
                rewards=[None] * n,
                errors=[None] * n,
                attached=[[] for _ in range(n)],
                feedback=list(self._feedback.get(trajectory.call_id, [])),
            )
            self.outcomes.append(outcome)
            self._by_call[trajectory.call_id] = outcome
            self.stats["trajectories"] += 1
            for index, join in enumerate(self.joins):
                out = join.on_trajectory(trajectory, partition, now)
                self._joined(index, out, count=index == 0)

    def _joined(self, index: int, out: Out, *, count: bool) -> None:
        if count:
            self.stats["trajectories.incomplete"] += out.stats["trajectories.incomplete"]
        for emit in out.emits:
            if emit.topic == "judge_requests":
                assert isinstance(emit.record, JudgeRequest)
                self.judge_requests.setdefault(emit.record.call_id, emit.record)
                continue
            if emit.topic != "rewarded":  # a verdict emitted again: the live topic's concern
                continue
            rewarded = emit.record
            assert isinstance(rewarded, RewardedTrajectory) and isinstance(emit.context, Trajectory)
            outcome = self._by_call.get(rewarded.call_id)
            if outcome is not None:
                outcome.rewards[index] = rewarded
                outcome.attached[index] = list(emit.context.feedback)
                self.stats[f"rewarded.{index}"] += 1
        if out.stats["trajectories.incomplete"]:
            for outcome in self.outcomes:
                if outcome.trajectory.closed_reason != "ended" and outcome.unscored is None:
                    outcome.unscored = outcome.trajectory.closed_reason
        for reject in out.rejects:
            if reject.payload is None:  # the record itself was unusable (only count it once)
                if count:
                    self._reject(reject)
                continue
            # scoring failed (the reward function, or nothing trainable): the trajectory's
            outcome = self._by_call.get((reject.key or b"").decode(errors="replace"))
            if outcome is not None:
                outcome.errors[index] = reject.reason
            kind = "nothing_trainable" if reject.reason == NOTHING_TRAINABLE else "reward_errors"
            self.stats[f"{kind}.{index}"] += 1
            if count:
                self.rejects.append(reject)

    def _rejected(self, out: Out) -> None:
        for reject in out.rejects:
            if reject.late:
                self.rejects.append(reject)
            else:
                self._reject(reject)

    def _reject(self, reject: Reject) -> None:
        self.rejects.append(reject)
        self.stats["records.invalid"] += 1
        self.invalid[reject.reason] += 1

    def _remember_feedback(self, value: bytes) -> None:
        """Every user feedback of a call, also after scoring, for the exports' preference pairs."""
        try:
            fb = self.codec.decode_as(value, UserFeedback)
        except RecordError:
            return
        known = self._feedback.setdefault(fb.call_id, [])
        if any(f.event_id == fb.event_id for f in known):
            self.stats["feedback.duplicate"] += 1
        else:
            self.stats["feedback.applied"] += 1
            known.append(fb)
            outcome = self._by_call.get(fb.call_id)
            if outcome is not None:
                outcome.feedback.append(fb)

    # -- results ---------------------------------------------------------------------------------

    def scored(self, index: int = 0) -> list[tuple[Outcome, RewardedTrajectory]]:
        """The outcomes reward function ``index`` scored, with its rewards, in closing order."""
        return [(o, r) for o in self.outcomes if (r := o.rewards[index]) is not None]


ReplayCore = ReplayRunner
"""The name replay's runner had before the core was shared with the live worker."""


@dataclass
class ReplayResult:
    """What a replay did, for the summary and for tests."""

    replay_id: str
    core: ReplayRunner
    source: dict[str, Any]
    dry_run: bool
    records: int = 0
    acknowledged_before: int = 0
    uncommitted_before: int = 0
    """Acknowledged by an interrupted run of this replay and not committed: committed now."""
    plan: FeedbackPlan | None = None
    sent: int = 0
    acked: int = 0
    rejected: list[tuple[str, str]] = field(default_factory=list)
    commits: int = 0
    exports: list[ExportFile] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    redactions: dict[str, Any] | None = None
    comparison: Comparison | None = None
    ledger: LedgerState | None = None
    """This replay's commit ledger as ``<p>.replayed`` had it (None: it never committed)."""


async def run_replay(
    settings: Settings,
    bootstrap: str,
    options: ReplayOptions,
    *,
    console: Console | None = None,
    progress_console: Console | None = None,
    trinity: Callable[[], TrinityClient] | None = None,
    codec: SchemaRegistry | None = None,
) -> ReplayResult:
    """Run one replay end to end and print its summary; see the module docstring."""
    from rich.console import Console

    options.validate()
    console = console or Console()
    progress_console = progress_console or Console(stderr=True)
    codec = codec or SchemaRegistry.default()
    prefix = settings.kafka.topic_prefix
    started = utcnow()

    strategy = build_strategy(
        options.strategy or settings.selection.strategy,
        rate=settings.selection.rate,
        mark_ttl=timedelta(seconds=settings.selection.mark_ttl_s),
    )
    weights, gamma = settings.reward.weights, settings.reward.step_discount
    rewarders = [build_rewarder(options.reward or settings.reward.function, weights, gamma)]
    if options.compare_reward:
        rewarders.append(build_rewarder(options.compare_reward, weights, gamma))
    judge = judge_of(settings, rewarders)  # a judge reward without its settings fails here
    redactor = Redactor(options.redact_patterns, enabled=options.redact)  # files
    task_redactor = Redactor(options.redact_patterns, enabled=options.redact)  # Trinity task_id
    pacer = CommitPacer(
        options.commit_every,
        options.commit_interval_s
        if options.commit_interval_s is not None
        else settings.commit.interval_s,
        time.monotonic(),
    )
    dry_run = options.dry_run or not options.to
    if options.out is not None and not dry_run:
        check_writable(options.out)  # before any work: a bad path costs nothing
    rid = replay_id(prefix, strategy.name, rewarders[0].name, rewarders[0].version)
    client_id = f"{settings.app_id}-replay-{rid}"
    lookback = timedelta(
        seconds=options.lookback_s
        if options.lookback_s is not None
        else settings.assembly.abandon_after_s
    )

    names = Topics(prefix, settings.kafka.partitions)
    try:
        topics = await kafka.topic_partitions(bootstrap, settings.kafka.security)
    except BrokerError as exc:
        raise ReplayError(str(exc)) from exc
    if names.agent_events not in topics:
        raise ConfigError(
            f"unknown topic {prefix}.agent-events: nothing to replay under "
            f"kafka.topic_prefix={prefix!r} [TRAJSTREAM_KAFKA__TOPIC_PREFIX]"
        )
    # no group: nothing is committed anywhere, and the live group never sees this consumer
    consumer = kafka.consumer(
        bootstrap, settings.kafka.security, group_id=None, client_id=client_id
    )
    await consumer.start()
    # let the consumer's background task start: stopping it before it ran raises
    # CancelledError out of aiokafka's stop() (no-group mode)
    await asyncio.sleep(0)
    try:
        ranges, source = await resolve_range(consumer, topics, prefix, options, started, lookback)
        core = ReplayRunner(
            strategy,
            rewarders,
            limits=limits_of(settings),
            topics=names,
            feedback_grace=timedelta(seconds=settings.reward.feedback_grace_s),
            score_incomplete=settings.reward.score_incomplete,
            late_retention=timedelta(seconds=settings.assembly.late_retention_s),
            since=options.since,
            codec=codec,
            judge=judge,
        )
        result = ReplayResult(rid, core, source, dry_run=dry_run)
        if judge is not None:  # the verdicts first: no judge request for a call that has one
            core.load_verdicts(await read_verdicts(consumer, topics, names.verdicts))
        result.records = await read_range(consumer, ranges, core, progress_console)
        end_of_range = options.until or (None if options.offsets else started)
        core.finish(end_of_range)
        if core.judge_requests:  # calls with no stored verdict: ask, or dead letters
            core.add_verdicts(await ask_judge(settings, bootstrap, core, progress_console, codec))
        if "trinity" in options.to:
            acknowledged, uncommitted, result.ledger = await read_replayed(
                consumer, topics, names.replayed, rid, codec
            )
            result.acknowledged_before = len(acknowledged)
            result.uncommitted_before = uncommitted
            result.plan = plan_feedback((r for _, r in core.scored()), acknowledged, task_redactor)
    finally:
        await consumer.stop()

    if options.compare_reward:
        result.comparison = compare(core.outcomes, options.min_reward)
    if (
        result.plan is not None
        and not result.dry_run
        and (
            result.plan.send
            or result.uncommitted_before
            or (result.ledger is not None and result.ledger.pending_commit is not None)
        )
    ):
        pacer.pending = result.uncommitted_before
        await send_to_trinity(
            settings, bootstrap, client_id, rid, result, pacer, progress_console, trinity, codec
        )
    if "files" in options.to:
        result.exports = build_exports(
            core.outcomes,
            min_reward=options.min_reward,
            dpo_margin=options.dpo_margin,
            redactor=redactor,
        )
        if not result.dry_run:
            assert options.out is not None
            result.manifest = write_export(
                options.out, result.exports, manifest(result, settings, options, redactor, codec)
            )
    if redactor.enabled:
        result.redactions = {
            "files": redactor.summary() if "files" in options.to else None,
            "trinity_task_ids": task_redactor.summary() if "trinity" in options.to else None,
        }
    print_summary(console, result, options)
    return result
