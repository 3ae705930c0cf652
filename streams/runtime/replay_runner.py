"""The in-memory runner of replay: the live worker's assemble and reward stages over memory
stores, record time as the clock (:class:`ReplayRunner`), fed :class:`SourceRecord`\\ s, each
opened once at the edge (:class:`streams.envelope.Edge`); what one stage makes for the next (a
trajectory, a verdict) is handed over as the object, not encoded again, and the stages' state is
kept as objects (:class:`streams.state_codec.ObjectState`).

May import: the core, the top-level modules. Not :mod:`streams.io` (the driver,
:mod:`streams.runtime.replay`, reads and sends).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from ..codec import SchemaRegistry
from ..core.assemble import Assembler
from ..core.assembly import Limits
from ..core.backfill import (
    Outcome,
)
from ..core.clock import RecordClock
from ..core.effects import Out, Reject
from ..core.judge import JudgePort, JudgeSpec, JudgeStage
from ..core.reward_join import NOTHING_TRAINABLE, RewardJoin, RewardOut
from ..core.rewards import Rewarder
from ..core.select import Strategy
from ..core.store import MemoryStore
from ..envelope import Edge, Envelope
from ..errors import ConfigError
from ..models import (
    JudgeRequest,
    JudgeVerdict,
    RewardedTrajectory,
    SelectionDecision,
    Trajectory,
    UserFeedback,
)
from ..state_codec import ObjectState
from ..topics import Topics

__all__ = ["END_OF_TIME", "VERDICTS_LOADED_AT", "ReplayRunner", "SourceRecord"]

END_OF_TIME = datetime.max.replace(tzinfo=UTC)
"""The clock :meth:`ReplayRunner.finish` gives the reward stages: every grace period is over."""

VERDICTS_LOADED_AT = datetime(9000, 1, 1, tzinfo=UTC)
"""When replay's reward stages store the verdicts read before the range: after every record
time, so that none is forgotten while the range is read."""

log = logging.getLogger("trajstream.replay")


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One input record as read from Kafka: which input it came from, where, when, and bytes."""

    kind: Literal["event", "feedback"]
    partition: int
    offset: int
    timestamp: datetime
    key: bytes | None
    value: bytes


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
        self.edge = Edge(self.codec)
        self.topics = topics or Topics("trajstream", 1)
        # the stores live and die with the replay: state kept as objects, not encoded
        state = ObjectState(self.codec)
        self.assembler = Assembler(
            strategy,
            limits=self.limits,
            late_retention=late_retention,
            pending=MemoryStore(),
            closed=MemoryStore(),
            codec=self.codec,
            state=state,
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
                judge=judge,
                verdicts=MemoryStore() if judge is not None else None,
                state=state,
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
        env = self.edge.open(topic, partition, record.offset, record.key, record.value)
        if record.kind == "event":
            self._assembled(self.assembler.on_record(env, now), now)
            return
        usable = env.problem is None
        for index, join in enumerate(self.joins):
            out = join.on_record(env, now)
            usable = usable and not any(
                r.source is env.source and r.payload is None for r in out.rejects
            )
            self._joined(index, out, count=index == 0)
        if usable and isinstance(env.record, UserFeedback):
            self._remember_feedback(env.record)

    def feed_all(self, records: Iterable[SourceRecord]) -> None:
        """:meth:`feed` each record, with Python's cyclic garbage collector told what a feed
        keeps (:func:`_collector_for_feeding`)."""
        feed = self.feed
        with _collector_for_feeding() as kept:
            for n, record in enumerate(records, 1):
                feed(record)
                if not n % FREEZE_EVERY:
                    kept()

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
            env = self.edge.open(self.topics.verdicts, partition, offset, key, value)
            for index, join in enumerate(self.joins):
                out = join.on_record(env, VERDICTS_LOADED_AT)
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
            now = self.clock.at.get(partition, VERDICTS_LOADED_AT)
            env = Envelope.handed(verdict, partition, verdict.call_id.encode())
            for index, join in enumerate(self.joins):  # in memory: not encoded again
                self._joined(index, join.on_record(env, now), count=index == 0)

    async def judge(
        self, stage: JudgeStage, ask: JudgePort, now: Callable[[], datetime]
    ) -> list[JudgeVerdict]:
        """The judge stage on every request of :attr:`judge_requests` (after :meth:`finish`),
        concurrently over ``ask``; the trajectories waiting are scored with the verdicts
        (:meth:`add_verdicts`), which are returned (for ``<p>.verdicts``), and counted
        (``judge.asked``, ``judge.not_asked``)."""
        envelopes = [
            Envelope.handed(request, self.partition_of(call_id) or 0, call_id.encode())
            for call_id, request in self.judge_requests.items()
        ]
        outs = await asyncio.gather(*(stage.on_record(env, ask, now) for env in envelopes))
        verdicts: list[JudgeVerdict] = []
        for out in outs:
            for name in ("judge.asked", "judge.not_asked"):
                self.stats[name] += out.stats[name]
            verdicts.extend(v for v in out.records("verdicts") if isinstance(v, JudgeVerdict))
        self.add_verdicts(verdicts)
        return verdicts

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
        # most records' time passes no deadline: a stage is ticked only when one is due
        if self.assembler.wakes(partition, now):
            self._assembled(self.assembler.on_tick(partition, now), now)
        for index, join in enumerate(self.joins):
            if join.wakes(partition, now):
                self._joined(index, join.on_tick(partition, now), count=index == 0)

    def _assembled(self, out: Out, now: datetime) -> None:
        if not (out.emits or out.rejects or out.stats):
            return  # most ticks decide nothing
        for name, count in out.stats.items():
            if name.startswith("events."):
                self.stats[name] += count
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
            # handed over as the object: the reward stage takes its own copy
            env = Envelope.handed(trajectory, partition, emit.key)
            for index, join in enumerate(self.joins):
                self._joined(index, join.on_record(env, now), count=index == 0)

    def _joined(self, index: int, out: RewardOut, *, count: bool) -> None:
        if not (out.emits or out.rejects or out.stats or out.scored):
            return  # most ticks decide nothing
        if count:
            self.stats["trajectories.incomplete"] += out.stats["trajectories.incomplete"]
        # the rewarded records come with their feedback in out.scored; of the emits only the
        # judge requests matter here (a verdict emitted again is the live topic's concern)
        for emit in out.emits:
            if emit.topic == "judge_requests":
                assert isinstance(emit.record, JudgeRequest)
                self.judge_requests.setdefault(emit.record.call_id, emit.record)
        for scored in out.scored:
            outcome = self._by_call.get(scored.rewarded.call_id)
            if outcome is not None:
                outcome.rewards[index] = scored.rewarded
                outcome.attached[index] = list(scored.feedback)
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

    def _remember_feedback(self, fb: UserFeedback) -> None:
        """Every user feedback of a call, also after scoring, for the exports' preference pairs."""
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


FREEZE_EVERY = 1000
"""Records fed between two :func:`gc.freeze` calls (each O(1)) while feeding."""


@contextmanager
def _collector_for_feeding() -> Iterator[Callable[[], None]]:
    """Python's cyclic garbage collector while records are fed, as it was after.

    A feed allocates many short-lived objects and keeps what it decided (every outcome, its
    trajectory and events) to the end. At the default thresholds (700, 10, 10) the collections
    took about 15 % of ``bench/replay.py``'s CPU, and on 50,000 records one collection of the
    middle generation alone took 346 ms of 3.8 s (timed with ``gc.callbacks``): traversing
    objects that are all still alive. So, meanwhile: young collections every 10,000 allocations
    (most young objects are freed by their reference counts before one runs), and every
    :data:`FREEZE_EVERY` records what survived is moved to the permanent generation
    (:func:`gc.freeze`), which no collection traverses; reference counting still frees any of it
    that is dropped. Only cyclic garbage made during the feed waits for its end (the stages make
    little: no object they keep refers back to its owner), when the frozen objects return to the
    oldest generation (:func:`gc.unfreeze`). A process that froze objects itself (a forking
    server) is left as it is: thresholds only."""
    old = gc.get_threshold()
    ours = gc.get_freeze_count() == 0
    gc.set_threshold(10_000, 100, old[2])
    try:
        yield gc.freeze if ours else _nothing
    finally:
        if ours:
            gc.unfreeze()
        gc.set_threshold(*old)


def _nothing() -> None:
    pass
