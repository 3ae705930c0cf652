"""Stage 2, reward: a trajectory joined with its user feedback, scored by the reward function.

:class:`RewardJoin` is the stage over one store, ``awaiting`` (keyed by call_id, an
:class:`~streams.models.AwaitingReward`: the trajectory, the user feedback seen so far, and
since when it waits). The rules, in one place for the live worker and replay:

- only ``<p>.trajectories`` carries trajectories and only ``<p>.ticks`` moves the clock: a
  trajectory or a tick on ``<p>.user-feedback`` is a dead letter;
- a trajectory closed as abandoned or oversized is not scored unless ``score_incomplete``;
- user feedback is attached by call_id, each ``event_id`` once, before or after the trajectory;
- a reward function that ``wants_feedback`` waits up to ``feedback_grace`` from the
  trajectory's arrival for the first feedback; others are scored at once;
- feedback without its trajectory (the call was not selected, or has not closed yet) waits
  ``abandon_after + feedback_grace``, then is forgotten as unmatched;
- a reward function that raises (or returns NaN or infinity) is a reward-stage dead letter, and
  so is a trajectory with no msg_ids (no LLM step with a response id): nothing trainable, so
  nothing is sent to Trinity.

May import: the standard library, the core, :mod:`streams.models`, :mod:`streams.codec`,
:mod:`streams.errors`.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..codec import SchemaRegistry
from ..errors import RecordError, RewardError
from ..models import AwaitingReward, Trajectory, UserFeedback
from .assemble import check_key
from .assembly import Deadlines, check_not_future, tick_time
from .effects import Out, Reject, Source
from .rewards import Rewarder
from .store import Store

__all__ = ["NOTHING_TRAINABLE", "RewardJoin"]

NOTHING_TRAINABLE = (
    "nothing trainable: no LLM step with a response id, so no msg_ids to reward; "
    "not sent to Trinity"
)


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
        trajectories_topic: str = "trajectories",
        ticks_topic: str = "ticks",
    ) -> None:
        self.trajectories_topic = trajectories_topic
        self.ticks_topic = ticks_topic
        self.rewarder = rewarder
        self.awaiting = awaiting
        self.codec = codec
        self.feedback_grace = feedback_grace
        self.abandon_after = abandon_after
        self.score_incomplete = score_incomplete
        self.max_future = max_future
        self._grace: dict[int, Deadlines] = {}

    def reset(self) -> None:
        self._grace.clear()

    def on_record(self, src: Source, now: datetime) -> Out:
        """One record of ``<p>.trajectories`` or ``<p>.user-feedback`` (or a Tick)."""
        out = Out()
        try:
            record = self.codec.decode(src.value)
            at = tick_time(record, src.topic, self.ticks_topic, now, self.max_future)
            if at is not None:
                return self.on_tick(src.partition, at)
            # a trajectory only from the assemble stage's topic: no input topic can inject one
            wanted = Trajectory if src.topic == self.trajectories_topic else UserFeedback
            if not isinstance(record, wanted):
                raise RecordError(f"{record.avro_name} does not belong on {src.topic}")
            if isinstance(record, UserFeedback):
                check_not_future("event_time", record.event_time, now, self.max_future)
            self._join(src, record, now, out)
        except RecordError as exc:
            out.reject(Reject(self.stage, str(exc) or type(exc).__name__, type(exc).__name__, src))
        return out

    def on_trajectory(self, trajectory: Trajectory, partition: int, now: datetime) -> Out:
        """A trajectory handed over in memory (replay), as if read from ``<p>.trajectories``:
        the object itself (a copy the stage may attach feedback to), not encoded and decoded
        again; it came from the assemble stage, so it needs no validation."""
        key = trajectory.call_id.encode()
        src = Source(self.trajectories_topic, partition, -1, key, b"")
        own = trajectory.model_copy(update={"feedback": list(trajectory.feedback)})
        out = Out()
        try:
            self._join(src, own, now, out)
        except RecordError as exc:
            out.reject(Reject(self.stage, str(exc) or type(exc).__name__, type(exc).__name__, src))
        return out

    def _join(
        self, src: Source, record: Trajectory | UserFeedback, now: datetime, out: Out
    ) -> None:
        key = check_key(src, record.call_id)
        raw = self.awaiting.get(key)
        if raw:
            entry = self.codec.decode_as(raw, AwaitingReward)
        else:
            entry = AwaitingReward(call_id=record.call_id, partition=src.partition, since=now)
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
        trajectory = entry.trajectory
        if trajectory is not None:
            if not self.score_incomplete and trajectory.closed_reason != "ended":
                out.stats["trajectories.incomplete"] += 1
                self.awaiting.delete(key)
                return
            known = {f.event_id for f in trajectory.feedback}
            trajectory.feedback.extend(f for f in entry.feedback if f.event_id not in known)
            waiting = (
                self.rewarder.wants_feedback
                and not trajectory.feedback
                and self.feedback_grace > timedelta(0)
            )
            if not waiting:
                self._score(key, trajectory, src, out)
                return
        if not raw or entry.trajectory is record:  # new entry, or its deadline changes
            self._index(src.partition).set(key, entry.since + self._wait_limit(entry))
        self.awaiting.set(key, self.codec.encode(entry))

    def _wait_limit(self, entry: AwaitingReward) -> timedelta:
        if entry.trajectory is not None:
            return self.feedback_grace
        return self.abandon_after + self.feedback_grace

    def on_tick(self, partition: int, at: datetime) -> Out:
        """Time passed on ``partition``: score trajectories whose grace period ended, forget
        feedback that waited too long for its trajectory."""
        out = Out()
        for key in self._index(partition).due(at):
            raw = self.awaiting.get(key)
            if raw is None:
                continue
            entry = self.codec.decode_as(raw, AwaitingReward)
            if entry.trajectory is not None:
                self._score(key, entry.trajectory, None, out)
            else:
                out.stats["user_feedback.unmatched"] += len(entry.feedback)
                self.awaiting.delete(key)
        return out

    def _score(self, key: bytes, trajectory: Trajectory, src: Source | None, out: Out) -> None:
        self.awaiting.delete(key)
        for index in self._grace.values():
            index.discard(key)
        try:
            rewarded = self.rewarder(trajectory)
        except RewardError as exc:
            out.stats["reward.errors"] += 1
            out.reject(self._reject(str(exc), type(exc).__name__, key, trajectory, src))
            return
        if not rewarded.msg_ids:
            out.stats["trajectories.nothing_trainable"] += 1
            out.reject(self._reject(NOTHING_TRAINABLE, "NothingTrainable", key, trajectory, src))
            return
        out.stats["trajectories.rewarded"] += 1
        out.emit("rewarded", key, rewarded, context=trajectory)

    def _reject(
        self, reason: str, error: str, key: bytes, trajectory: Trajectory, src: Source | None
    ) -> Reject:
        # the payload is the trajectory (with its feedback): what a replay of the dead
        # letter needs, whichever record triggered the scoring
        payload = self.codec.encode(trajectory)
        if src is not None and src.offset < 0:
            src = None  # handed over in memory: no source position
        return Reject(self.stage, reason, error, src, key=key, payload=payload)

    def _index(self, partition: int) -> Deadlines:
        index = self._grace.get(partition)
        if index is None:
            index = self._grace[partition] = Deadlines()
            for key, raw in self.awaiting.items():
                entry = self.codec.decode_as(raw, AwaitingReward)
                if entry.partition == partition:
                    index.set(key, entry.since + self._wait_limit(entry))
        return index
