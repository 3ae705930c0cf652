"""Stage 2, reward: a trajectory joined with its user feedback, scored by the reward function.

:class:`RewardJoin` is the stage over one store, ``awaiting`` (keyed by call_id, an
:class:`~streams.models.AwaitingReward`: the trajectory, the user feedback seen so far, and
since when it waits). The rules, in one place for the live worker and replay:

- records come decoded at the edge (:mod:`streams.envelope`): only ``<p>.trajectories``
  carries trajectories and only ``<p>.ticks`` moves the clock (a trajectory or a tick on
  ``<p>.user-feedback`` is a dead letter there); the stage dispatches on the record's type;
- a trajectory closed as abandoned or oversized is not scored unless ``score_incomplete``;
- user feedback is attached by call_id, each ``event_id`` once, before or after the trajectory;
- a reward function that ``wants_feedback`` waits up to ``feedback_grace`` from the
  trajectory's arrival for the first feedback; others are scored at once;
- feedback without its trajectory (the call was not selected, or has not closed yet) waits
  ``abandon_after + feedback_grace``, then is forgotten as unmatched;
- a trajectory of a call a gateway routed to production is scored the same way and emitted
  with ``upstream: production``, whatever its msg_ids: the feedback stage sends it to no one,
  the ledger counts it in its upstream's windows only (:mod:`streams.core.arms`); so is a call
  routed to the policy that fell back (``trinity-fallback``) or was answered in part by
  production (``mixed``, unless ``reward.train_mixed`` names the steps Trinity answered);
- a reward function that raises (or returns NaN or infinity) is a reward-stage dead letter, and
  so is a trajectory with no msg_ids (no LLM step with a response id): nothing trainable, so
  nothing is sent to Trinity. A shadowed call whose shadow answers were all lost (Trinity down
  or slow while production answered) is no dead letter: it is counted
  (``trajectories.shadow_lost``) and not scored, its trajectory kept on its topic.

With a reward function that needs the LLM judge's verdict (``needs_verdict``, e.g.
``streams.rewards:judge`` alone or in a Composite), a second store, ``verdicts`` (keyed by
call_id, a :class:`~streams.models.StoredVerdict`), and two more rules:

- a trajectory without a stored verdict emits one :class:`~streams.models.JudgeRequest` (on
  ``judge_requests``; the entry remembers when) and waits; once the feedback rule above is met
  the attached feedback is final (``ready``), and the trajectory is scored when the verdict
  comes. A trajectory redelivered while its verdict is still missing emits the same request
  again (same ``requested_at``, prompt and hash): a redelivery means a crash or a hand-over,
  which may have lost the first request after the entry was stored; a second answer is then
  deduplicated by the verdict rule below;
- a verdict (only ``<p>.verdicts`` carries them) is stored unless one is stored already: **the first
  verdict of a call wins**. A different second one (a duplicate request after a crash, asked
  again) is counted and the stored one is emitted again, so that the last record of the call on
  the compacted topic, the one compaction keeps and replay reads, is the one that was used. A
  verdict without a score is a ``judge`` dead letter of the trajectory with the verdict's error.
  Stored verdicts are forgotten ``verdict_retention`` after they were stored (a trajectory
  redelivered later than that asks again), or when a tombstone (the call's key, no value) is
  written to ``<p>.verdicts``: the way to have a call judged again.

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..codec import SchemaRegistry
from ..envelope import Tombstone, misplaced
from ..errors import RecordError, RewardError
from ..models import (
    AwaitingReward,
    JudgeVerdict,
    RewardedTrajectory,
    StoredVerdict,
    Tick,
    Trajectory,
    UserFeedback,
)
from ..state_codec import StateCodec
from .arms import FALLBACK, MIXED, SHADOW, trains
from .assemble import check_key
from .assembly import Deadlines, check_not_future, tick_time
from .effects import Envelope, Out, Reject, Source
from .judge import JudgeSpec
from .rewards import Rewarder
from .store import Store

__all__ = ["NOTHING_TRAINABLE", "NO_JUDGE", "RewardJoin", "RewardOut", "Scored"]

NOTHING_TRAINABLE = (
    "nothing trainable: no LLM step with a response id, so no msg_ids to reward; "
    "not sent to Trinity"
)

NO_JUDGE = (
    "the reward function needs the LLM judge's verdict: set reward.judge.url, reward.judge.model "
    "and reward.judge.rubric_file [TRAJSTREAM_REWARD__JUDGE__URL, ...]"
)


@dataclass(frozen=True, slots=True)
class Scored:
    """One trajectory the reward function scored: the record emitted on ``rewarded`` and the
    user feedback the function was given (what replay reports per reward function; the
    rewarded record does not carry it). Never sent anywhere."""

    rewarded: RewardedTrajectory
    feedback: tuple[UserFeedback, ...]


@dataclass(slots=True)
class RewardOut(Out):
    """What one step of the reward stage decided: an :class:`Out`, and every scoring in it."""

    scored: list[Scored] = field(default_factory=list)


class RewardJoin:
    """The reward stage over an ``awaiting`` store; see the module docstring."""

    stage = "reward"

    def __init__(
        self,
        rewarder: Rewarder,
        *,
        awaiting: Store,
        codec: SchemaRegistry,
        feedback_grace: timedelta,
        abandon_after: timedelta,
        score_incomplete: bool,
        max_future: timedelta = timedelta(minutes=5),
        judge: JudgeSpec | None = None,
        verdicts: Store | None = None,
        verdict_retention: timedelta = timedelta(hours=1),
        state: StateCodec | None = None,
    ) -> None:
        from ..errors import ConfigError

        if rewarder.needs_verdict and (judge is None or verdicts is None):
            raise ConfigError(NO_JUDGE)
        self.judge = judge
        self.verdicts = verdicts
        self.verdict_retention = verdict_retention
        self._kept: dict[int, Deadlines] = {}
        self.rewarder = rewarder
        self.awaiting = awaiting
        self.codec = codec  # the dead letters' payloads, as on the wire
        self.stored = state or StateCodec(codec)
        self.feedback_grace = feedback_grace
        self.abandon_after = abandon_after
        self.score_incomplete = score_incomplete
        self.max_future = max_future
        self._grace: dict[int, Deadlines] = {}

    def reset(self) -> None:
        self._grace.clear()
        self._kept.clear()

    def on_record(self, env: Envelope, now: datetime) -> RewardOut:
        """One record, decoded at the edge: a Trajectory (of ``<p>.trajectories``, or handed
        over in memory by replay), a UserFeedback, a JudgeVerdict (or a verdict's
        :class:`~streams.envelope.Tombstone`), or a Tick (handed to :meth:`on_tick`)."""
        out = RewardOut()
        try:
            match env.open():
                case Tick() as tick:
                    return self.on_tick(env.partition, tick_time(tick, now, self.max_future))
                case Tombstone():
                    self._forget(env.key, out)  # judge the call again when asked
                case JudgeVerdict() as verdict:
                    self._verdict(env, verdict, now, out)
                case Trajectory() as trajectory:
                    self._join(env, trajectory, now, out)
                case UserFeedback() as feedback:
                    check_not_future("event_time", feedback.event_time, now, self.max_future)
                    self._join(env, feedback, now, out)
                case other:
                    raise misplaced(other, env.topic)
        except RecordError as exc:
            out.reject(Reject.of(self.stage, exc, env.source))
        return out

    def _join(
        self, env: Envelope, record: Trajectory | UserFeedback, now: datetime, out: RewardOut
    ) -> None:
        key = check_key(env, record.call_id)
        raw = self.awaiting.get(key)
        trajectory = record if isinstance(record, Trajectory) else None
        if not raw and trajectory is not None and self._at_once(key, trajectory, env.source, out):
            return
        if raw:
            entry = self.stored.load(raw, AwaitingReward)
        else:
            entry = AwaitingReward(call_id=record.call_id, partition=env.partition, since=now)
        if isinstance(record, UserFeedback):
            if all(f.event_id != record.event_id for f in entry.feedback):
                entry.feedback.append(record)
                out.stats["feedback.applied"] += 1
            else:
                out.stats["feedback.duplicate"] += 1
        elif entry.trajectory is None:
            entry.trajectory = record
            entry.since = now  # the grace period runs from the trajectory's arrival
        else:
            out.stats["trajectories.duplicate"] += 1
            if entry.judge_requested_at is not None:
                self._ask_again(key, entry, out)
        arrived = entry.trajectory is record  # the trajectory came with this record
        trajectory = entry.trajectory
        if trajectory is not None:
            if not self.score_incomplete and trajectory.closed_reason != "ended":
                out.stats["trajectories.incomplete"] += 1
                self.awaiting.delete(key)
                return
            if not entry.ready:  # once ready, the feedback attached is final
                known = {f.event_id for f in trajectory.feedback}
                extra = [f for f in entry.feedback if f.event_id not in known]
                if extra:  # on a copy: the record given may be shared (replay hands objects)
                    feedback = [*trajectory.feedback, *extra]
                    trajectory = trajectory.model_copy(update={"feedback": feedback})
                    entry.trajectory = trajectory
                entry.ready = self._ready(trajectory)
            if self._scored(key, entry, env.source, now, out):
                return
        if not entry.ready and (not raw or arrived):
            # new entry, or its deadline changes
            self._index(env.partition).set(key, entry.since + self._wait_limit(entry))
        self.awaiting.set(key, self.stored.dump(entry))

    def score_at_once(
        self, key: bytes, trajectory: Trajectory, src: Source | None = None
    ) -> RewardOut | None:
        """The reward stage's decision on a trajectory that waits for nothing, made in the stage
        that closed the call (the live worker, with no hop through ``<p>.trajectories``): what
        :meth:`on_record` would decide for it, or None when the trajectory has to wait (its
        reward needs a verdict, user feedback came for it before, or its reward function wants
        feedback it does not have within a grace period); then it goes through
        :meth:`on_record` as before. Reads the ``awaiting`` store, writes nothing."""
        out = RewardOut()
        if self.awaiting.get(key) or not self._at_once(key, trajectory, src, out):
            return None
        return out

    def _at_once(
        self, key: bytes, trajectory: Trajectory, src: Source | None, out: RewardOut
    ) -> bool:
        """Decide a trajectory with nothing stored for it, if it waits for nothing: the common
        case. Whether it was decided."""
        if self.rewarder.needs_verdict:
            return False
        if not self.score_incomplete and trajectory.closed_reason != "ended":
            out.stats["trajectories.incomplete"] += 1
            return True
        if not self._ready(trajectory):
            return False
        self._score(key, trajectory, src, out)
        return True

    def _ready(self, trajectory: Trajectory) -> bool:
        """Whether the feedback ``trajectory`` has attached is final: its reward wants none, it
        has some, or there is no grace period to wait for more."""
        return not (
            self.rewarder.wants_feedback
            and not trajectory.feedback
            and self.feedback_grace > timedelta(0)
        )

    def _scored(
        self, key: bytes, entry: AwaitingReward, src: Source | None, now: datetime, out: RewardOut
    ) -> bool:
        """Score a ready entry whose verdict (if needed) is there; else ask the judge once.
        Whether it was scored (and so deleted)."""
        assert entry.trajectory is not None
        if not self.rewarder.needs_verdict:
            if entry.ready:
                self._score(key, entry.trajectory, src, out)
            return entry.ready
        stored = self._stored(key)
        if stored is None:
            if entry.judge_requested_at is None:
                assert self.judge is not None
                entry.judge_requested_at = now
                out.stats["judge.requested"] += 1
                out.emit("judge_requests", key, self.judge.request(entry.trajectory, now))
            return False
        if not entry.ready:
            return False
        self._score(key, entry.trajectory, src, out, stored.verdict)
        return True

    def _ask_again(self, key: bytes, entry: AwaitingReward, out: RewardOut) -> None:
        """The request of a redelivered trajectory whose verdict is missing, made again."""
        if self.judge is None or entry.trajectory is None or self._stored(key) is not None:
            return
        assert entry.judge_requested_at is not None
        out.stats["judge.requested_again"] += 1
        request = self.judge.request(entry.trajectory, entry.judge_requested_at)
        out.emit("judge_requests", key, request)

    def _forget(self, key: bytes | None, out: RewardOut) -> None:
        if key and self.verdicts is not None and self.verdicts.get(key) is not None:
            self.verdicts.delete(key)
            out.stats["verdicts.deleted"] += 1

    def _stored(self, key: bytes) -> StoredVerdict | None:
        raw = self.verdicts.get(key) if self.verdicts is not None else None
        return None if raw is None else self.stored.load(raw, StoredVerdict)

    def _verdict(
        self, env: Envelope, verdict: JudgeVerdict, now: datetime, out: RewardOut
    ) -> None:
        """A verdict (from ``<p>.verdicts``, or handed over by replay): the first of a call is
        stored, and scores its trajectory if that is ready."""
        key = check_key(env, verdict.call_id)
        if self.verdicts is None:
            out.stats["verdicts.unused"] += 1  # this deployment's reward needs no judge
            return
        stored = self._stored(key)
        if stored is not None:
            if stored.verdict == verdict:
                out.stats["verdicts.duplicate"] += 1
            else:  # the first wins; make it the last on the topic again (compaction keeps it)
                out.stats["verdicts.conflict"] += 1
                out.emit("verdicts", key, stored.verdict)
            return
        kept = StoredVerdict(partition=env.partition, stored_at=now, verdict=verdict)
        self.verdicts.set(key, self.stored.dump(kept))
        self._kept_index(env.partition).set(key, now + self.verdict_retention)
        out.stats["verdicts.stored"] += 1
        raw = self.awaiting.get(key)
        if raw is None:
            return
        entry = self.stored.load(raw, AwaitingReward)
        if entry.trajectory is not None and entry.ready:
            self._score(key, entry.trajectory, None, out, verdict)

    def _wait_limit(self, entry: AwaitingReward) -> timedelta:
        if entry.trajectory is not None:
            return self.feedback_grace
        return self.abandon_after + self.feedback_grace

    def wakes(self, partition: int, at: datetime) -> bool:
        """Whether :meth:`on_tick` at ``at`` has anything to do on ``partition``."""
        return self._index(partition).any_due(at) or (
            self.verdicts is not None and self._kept_index(partition).any_due(at)
        )

    def on_tick(self, partition: int, at: datetime) -> RewardOut:
        """Time passed on ``partition``: score trajectories whose grace period ended, forget
        feedback that waited too long for its trajectory."""
        out = RewardOut()
        for key in self._index(partition).due(at):
            raw = self.awaiting.get(key)
            if raw is None:
                continue
            entry = self.stored.load(raw, AwaitingReward)
            if entry.trajectory is not None:
                entry.ready = True  # the grace period is over: the feedback attached is final
                if not self._scored(key, entry, None, at, out):
                    self.awaiting.set(key, self.stored.dump(entry))  # waits for its verdict
            else:
                out.stats["user_feedback.unmatched"] += len(entry.feedback)
                self.awaiting.delete(key)
        if self.verdicts is not None:
            for key in self._kept_index(partition).due(at):
                if self.awaiting.get(key) is not None:  # still in use: keep it longer
                    self._kept_index(partition).set(key, at + self.verdict_retention)
                    continue
                self.verdicts.delete(key)
                out.stats["verdicts.forgotten"] += 1
        return out

    def _score(
        self,
        key: bytes,
        trajectory: Trajectory,
        src: Source | None,
        out: RewardOut,
        verdict: JudgeVerdict | None = None,
    ) -> None:
        self.awaiting.delete(key)
        for index in self._grace.values():
            index.discard(key)
        if verdict is not None and verdict.score is None:
            out.stats["judge.failed"] += 1
            reason = f"judge verdict without a score: {verdict.error}"
            out.reject(self._reject(reason, "JudgeFailed", key, trajectory, src, stage="judge"))
            return
        try:
            rewarded = self.rewarder(trajectory, verdict)
        except RewardError as exc:
            out.stats["reward.errors"] += 1
            out.reject(self._reject(str(exc), type(exc).__name__, key, trajectory, src))
            return
        if trajectory.upstream is not None:
            rewarded = rewarded.model_copy(update={"upstream": trajectory.upstream})
        if not trains(rewarded):  # production's answer: scored for the comparison only
            kind = {FALLBACK: "fallback", MIXED: "mixed"}.get(rewarded.upstream or "")
            out.stats[f"trajectories.rewarded_{kind or 'production'}"] += 1
            self._emit(key, trajectory, rewarded, out)
            return
        if not rewarded.msg_ids and rewarded.upstream == SHADOW:
            # production answered every step and no shadow answer of Trinity's came back (it
            # was down or slow): what shadow mode loses to an outage, counted, no dead letter
            out.stats["trajectories.shadow_lost"] += 1
            return
        if not rewarded.msg_ids:
            out.stats["trajectories.nothing_trainable"] += 1
            out.reject(self._reject(NOTHING_TRAINABLE, "NothingTrainable", key, trajectory, src))
            return
        out.stats["trajectories.rewarded"] += 1
        self._emit(key, trajectory, rewarded, out)

    @staticmethod
    def _emit(
        key: bytes, trajectory: Trajectory, rewarded: RewardedTrajectory, out: RewardOut
    ) -> None:
        out.emit("rewarded", key, rewarded)
        out.scored.append(Scored(rewarded, tuple(trajectory.feedback)))

    def _reject(
        self,
        reason: str,
        error: str,
        key: bytes,
        trajectory: Trajectory,
        src: Source | None,
        stage: str | None = None,
    ) -> Reject:
        # the payload is the trajectory (with its feedback): what a replay of the dead
        # letter needs, whichever record triggered the scoring
        payload = self.codec.encode(trajectory)
        return Reject(stage or self.stage, reason, error, src, key=key, payload=payload)

    def _kept_index(self, partition: int) -> Deadlines:
        index = self._kept.get(partition)
        if index is None:
            index = self._kept[partition] = Deadlines()
            for key, raw in self.verdicts.items() if self.verdicts is not None else ():
                stored = self.stored.load(raw, StoredVerdict)
                if stored.partition == partition:
                    index.set(key, stored.stored_at + self.verdict_retention)
        return index

    def _index(self, partition: int) -> Deadlines:
        index = self._grace.get(partition)
        if index is None:
            index = self._grace[partition] = Deadlines()
            for key, raw in self.awaiting.items():
                entry = self.stored.load(raw, AwaitingReward)
                # a ready entry too: a worker whose reward needs no verdict (any more) scores
                # it on the next tick; one that needs it keeps it until the verdict comes
                if entry.partition == partition:
                    index.set(key, entry.since + self._wait_limit(entry))
        return index
