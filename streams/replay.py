"""Replay and backfill: re-score a range of history under a strategy and reward of your choice.

``trajstream replay`` reads a bounded range of ``<p>.agent-events`` and ``<p>.user-feedback``
(a time range, or explicit offsets) and runs it through the same pure stages as the live
workers: :func:`streams.join.add_event` / :func:`~streams.join.closed_reason` /
:func:`~streams.join.close` with a selection strategy, then a :class:`~streams.rewards.Rewarder`
with user feedback attached by call id as the live reward stage attaches it. The result goes
nowhere (a dry run), to Trinity (feedback, then paced commits), or to dataset files.

The module has two halves:

- :class:`ReplayCore` and the functions after it are pure: records in, trajectories and rewards
  out, no Kafka and no HTTP, so they are tested on in-memory records. Record timestamps stand
  in for the processing time the live workers read from their clock (calls abandoned after
  ``assembly.abandon_after_s``, the feedback grace period), so a replay decides like the
  workers did.
- :func:`run_replay` is the driver: a plain consumer with manually assigned partitions and no
  consumer group (it can neither move the live workers' offsets nor touch their tables), the
  Trinity client, the ``<p>.replayed`` ledger and the files.

Idempotence: every feedback Trinity acknowledged is recorded on ``<p>.replayed`` (a compacted
topic, key ``<replay_id>|<trajectory_id>``, value a :class:`~streams.models.FeedbackAck`). A
replay first reads it and skips what was acknowledged under the same replay id, which is a hash
of the source prefix, the strategy and the reward function with its version: re-running a
replay, or replaying an overlapping range, rewards nothing twice.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
import json
import logging
import math
import re
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .codec import SchemaRegistry
from .errors import (
    ConfigError,
    RecordError,
    RewardError,
    TrajstreamError,
    TrinityRejected,
    TrinityUnavailable,
)
from .export import (
    EXPORT_SCHEMA_VERSION,
    ExportFile,
    check_writable,
    dedupe,
    preference_pairs,
    ranking_pairs,
    sft_row,
    trajectory_row,
    write_export,
)
from .io.security import kafka_client_kwargs
from .join import Applied, Deadlines, Limits, add_event, close, closed_reason, new_pending
from .models import (
    AgentCall,
    CommitRecord,
    Completion,
    FeedbackAck,
    PendingCall,
    RewardedTrajectory,
    Trajectory,
    UserFeedback,
    utcnow,
)
from .redact import Redactor
from .rewards import Rewarder, build_rewarder
from .select import Strategy, build_strategy

if TYPE_CHECKING:
    from rich.console import Console

    from .settings import Settings
    from .trinity import TrinityClient

__all__ = [
    "CommitPacer",
    "Comparison",
    "Distribution",
    "Outcome",
    "ReplayCore",
    "ReplayError",
    "ReplayOptions",
    "ReplayResult",
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


log = logging.getLogger("trajstream.replay")


class ReplayError(TrajstreamError):
    """A replay cannot run or finish (an empty range, Trinity gone for too long)."""


# == the pure core =============================================================================


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One input record as read from Kafka: which input it came from, where, when, and bytes."""

    kind: Literal["event", "feedback"]
    partition: int
    offset: int
    timestamp: datetime
    key: bytes | None
    value: bytes


@dataclass
class Outcome:
    """A selected call of the range: its trajectory and what each reward function made of it."""

    trajectory: Trajectory
    """As the assemble stage closed it (no feedback): the record live workers put on
    ``<p>.trajectories``."""
    closed_at: datetime
    partition: int
    rewards: list[RewardedTrajectory | None]
    """One per reward function (the primary first); None when not scored."""
    errors: list[str | None]
    attached: list[list[UserFeedback]]
    """The user feedback each reward function was given (the live reward stage's rule)."""
    feedback: list[UserFeedback] = field(default_factory=list)
    """Every user feedback of the call in the range, also after scoring (for exports)."""
    unscored: str | None = None
    """Why it was not scored: closed abandoned or oversized (``reward.score_incomplete``)."""

    @property
    def call_id(self) -> str:
        return self.trajectory.call_id

    def scored_trajectory(self, index: int = 0) -> Trajectory:
        """The trajectory as reward function ``index`` saw it, with its feedback attached."""
        return self.trajectory.model_copy(update={"feedback": list(self.attached[index])})


@dataclass
class _Waiting:
    outcome: Outcome
    rewarders: list[int]


class ReplayCore:
    """The live assemble and reward stages as one pure object: feed records, then finish.

    Records of one partition must be fed in the order the workers read them (by offset within
    a topic; the driver merges a partition's events and feedback by timestamp). The clock of a
    partition is the latest record timestamp seen in it; :meth:`finish` moves every clock to
    the end of the range. Decisions follow the live stages rule for rule: duplicates (same
    ``event_id``) count once, steps are ordered by ``seq``, a call closes when its END and all
    its steps are in, or as abandoned when its clock passes ``first_seen + abandon_after``, or
    at once when oversized; events for a closed call are late and change nothing; a trajectory
    is scored with the user feedback seen so far, or, for a reward function that wants
    feedback, waits up to the grace period for the first one.

    ``since``: calls that close before it are read (for their context) but left out of the
    results; the driver reads a look-back margin before the range so that calls that started
    before it are complete.

    Known difference: the live reward stage forgets user feedback that waited for its
    trajectory longer than ``abandon_after + grace``; the replay keeps it until the trajectory
    comes (feedback normally follows its call, so this only matters for calls that took longer
    than ``assembly.abandon_after_s``).
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
    ) -> None:
        if not rewarders:
            raise ConfigError("a replay needs a reward function")
        self.strategy = strategy
        self.rewarders = list(rewarders)
        self.limits = limits or Limits()
        self.feedback_grace = feedback_grace
        self.score_incomplete = score_incomplete
        self.late_retention = late_retention
        self.since = since
        self.codec = codec or SchemaRegistry.default()
        self.stats: Counter[str] = Counter()
        self.outcomes: list[Outcome] = []
        self.incomplete: list[str] = []
        """Calls still open at the end of the range: neither closed nor scored."""
        self.invalid: Counter[str] = Counter()
        """Why records were unusable (the live workers' dead letters), with counts."""
        self.reasons: Counter[str] = Counter()
        """Selection reasons of the calls closed in the range."""
        self._pending: dict[str, PendingCall] = {}
        self._closed: dict[str, datetime] = {}
        self._feedback: dict[str, list[UserFeedback]] = {}
        self._by_call: dict[str, Outcome] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._clock: dict[int, datetime] = {}
        self._abandon: dict[int, Deadlines] = {}
        self._grace: dict[int, Deadlines] = {}
        self._forget: dict[int, Deadlines] = {}
        self._finished = False

    # -- feeding -------------------------------------------------------------------------------

    def feed(self, record: SourceRecord) -> None:
        """Apply one record of the range."""
        if self._finished:
            raise RuntimeError("the replay has finished")
        self.stats[f"records.{record.kind}"] += 1
        self._advance(record.partition, record.timestamp)
        try:
            value = self.codec.decode(record.value)
        except RecordError as exc:
            self._reject(str(exc))
            return
        if record.kind == "event":
            if not isinstance(value, AgentCall | Completion):
                self._reject(f"{value.avro_name} does not belong on the agent-events topic")
                return
            if self._key_ok(record, value.call_id):
                self._event(record, value)
        else:
            if not isinstance(value, UserFeedback):
                self._reject(f"{value.avro_name} does not belong on the user-feedback topic")
                return
            if self._key_ok(record, value.call_id):
                self._user_feedback(value)

    def feed_all(self, records: Iterable[SourceRecord]) -> None:
        for record in records:
            self.feed(record)

    def finish(self, until: datetime | None = None) -> None:
        """End of the range: move the clocks to ``until`` (closing what the live workers would
        have abandoned by then), score trajectories still waiting for feedback, and report the
        calls still open as incomplete."""
        if self._finished:
            return
        partitions = set(self._clock) | {s.partition for s in self._pending.values()}
        for partition in sorted(partitions):
            if until is not None:
                self._advance(partition, until)
        for waiting in self._waiting.values():
            for index in waiting.rewarders:
                self._score(waiting.outcome, index, self._feedback_of(waiting.outcome.call_id))
        self._waiting.clear()
        self.incomplete = sorted(self._pending)
        self.stats["calls.open_at_end"] = len(self.incomplete)
        self.stats["feedback.unmatched"] = sum(
            len(fbs) for call_id, fbs in self._feedback.items() if call_id not in self._by_call
        )
        self._finished = True

    # -- the assemble stage ----------------------------------------------------------------------

    def _event(self, record: SourceRecord, event: AgentCall | Completion) -> None:
        call_id = event.call_id
        if call_id in self._closed:
            self.stats["events.late"] += 1
            return
        partition = record.partition
        state = self._pending.get(call_id)
        fresh = state is None
        if state is None:  # first seen "now": the partition's clock, as the live stage does
            state = new_pending(call_id, self._clock[partition])
            state.partition = partition
        applied = add_event(state, event, len(record.value))
        if applied is Applied.DUPLICATE:
            self.stats["events.duplicate"] += 1
            return
        if applied is Applied.DUPLICATE_SEQ:
            self._reject(
                f"step seq {event.seq if isinstance(event, Completion) else '?'} "
                "arrived twice with different event ids; the first was kept"
            )
            return
        self.stats["events.applied"] += 1
        if fresh:
            self._pending[call_id] = state
            self._index(self._abandon, partition).set(
                call_id.encode(), state.first_seen + self.limits.abandon_after
            )
        reason = closed_reason(state, self._clock[partition], self.limits)
        if reason is not None:
            self._close(state, reason, self._clock[partition])

    def _close(self, state: PendingCall, reason: str, now: datetime) -> None:
        call_id, partition = state.call_id, state.partition
        key = call_id.encode()
        self._pending.pop(call_id, None)
        self._index(self._abandon, partition).discard(key)
        self._closed[call_id] = now
        self._index(self._forget, partition).set(key, now + self.late_retention)
        selection, trajectory = close(state, self.strategy, reason)
        if self.since is not None and now < self.since:
            self.stats["calls.before_range"] += 1
            return
        self.stats["calls.closed"] += 1
        self.stats[f"calls.{'selected' if selection.selected else 'not_selected'}"] += 1
        self.stats[f"calls.closed_{reason.split(':')[0]}"] += 1
        self.reasons[selection.reason] += 1
        if trajectory is None:
            return
        n = len(self.rewarders)
        outcome = Outcome(
            trajectory=trajectory,
            closed_at=now,
            partition=partition,
            rewards=[None] * n,
            errors=[None] * n,
            attached=[[] for _ in range(n)],
            feedback=list(self._feedback.get(call_id, [])),
        )
        self.outcomes.append(outcome)
        self._by_call[call_id] = outcome
        self.stats["trajectories"] += 1
        self._reward_stage(outcome, now)

    # -- the reward stage ----------------------------------------------------------------------

    def _reward_stage(self, outcome: Outcome, now: datetime) -> None:
        trajectory = outcome.trajectory
        if not self.score_incomplete and trajectory.closed_reason != "ended":
            outcome.unscored = trajectory.closed_reason
            self.stats["trajectories.incomplete"] += 1
            return
        attached = self._feedback_of(outcome.call_id)
        waiting = []
        for index, rewarder in enumerate(self.rewarders):
            if rewarder.wants_feedback and not attached and self.feedback_grace > timedelta(0):
                waiting.append(index)
            else:
                self._score(outcome, index, attached)
        if waiting:
            self._waiting[outcome.call_id] = _Waiting(outcome, waiting)
            self._index(self._grace, outcome.partition).set(
                outcome.call_id.encode(), now + self.feedback_grace
            )

    def _user_feedback(self, fb: UserFeedback) -> None:
        known = self._feedback.setdefault(fb.call_id, [])
        if any(f.event_id == fb.event_id for f in known):
            self.stats["feedback.duplicate"] += 1
            return
        known.append(fb)
        self.stats["feedback.applied"] += 1
        outcome = self._by_call.get(fb.call_id)
        if outcome is not None:
            outcome.feedback.append(fb)
        waiting = self._waiting.pop(fb.call_id, None)
        if waiting is not None:
            for index in waiting.rewarders:
                self._score(waiting.outcome, index, list(known))
            for deadlines in self._grace.values():
                deadlines.discard(fb.call_id.encode())

    def _score(self, outcome: Outcome, index: int, feedback: list[UserFeedback]) -> None:
        outcome.attached[index] = list(feedback)
        try:
            outcome.rewards[index] = self.rewarders[index](outcome.scored_trajectory(index))
        except RewardError as exc:
            outcome.errors[index] = str(exc)
            self.stats[f"reward_errors.{index}"] += 1
            return
        self.stats[f"rewarded.{index}"] += 1

    # -- clocks ----------------------------------------------------------------------------------

    def _advance(self, partition: int, at: datetime) -> None:
        now = self._clock.get(partition)
        if now is None or at > now:
            self._clock[partition] = now = at
        for key in self._index(self._abandon, partition).due(now):
            state = self._pending.get(key.decode())
            if state is None:
                continue
            reason = closed_reason(state, now, self.limits)
            if reason is None:  # due exactly now: closed_reason wants strictly later
                self._abandon[partition].set(key, now + timedelta(milliseconds=1))
            else:
                self._close(state, reason, now)
        for key in self._index(self._grace, partition).due(now):
            waiting = self._waiting.pop(key.decode(), None)
            if waiting is not None:
                for index in waiting.rewarders:
                    self._score(waiting.outcome, index, self._feedback_of(key.decode()))
        for key in self._index(self._forget, partition).due(now):
            self._closed.pop(key.decode(), None)

    @staticmethod
    def _index(indexes: dict[int, Deadlines], partition: int) -> Deadlines:
        if partition not in indexes:
            indexes[partition] = Deadlines()
        return indexes[partition]

    # -- helpers ---------------------------------------------------------------------------------

    def _feedback_of(self, call_id: str) -> list[UserFeedback]:
        return list(self._feedback.get(call_id, []))

    def _key_ok(self, record: SourceRecord, call_id: str) -> bool:
        if record.key is None or record.key != call_id.encode():
            self._reject("record key is not its call_id")
            return False
        return True

    def _reject(self, reason: str) -> None:
        self.stats["records.invalid"] += 1
        self.invalid[reason] += 1

    # -- results ---------------------------------------------------------------------------------

    def scored(self, index: int = 0) -> list[tuple[Outcome, RewardedTrajectory]]:
        """The outcomes reward function ``index`` scored, with its rewards, in closing order."""
        return [(o, r) for o in self.outcomes if (r := o.rewards[index]) is not None]


# -- statistics --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Distribution:
    """Count, mean, standard deviation and quantiles of a list of rewards."""

    count: int
    mean: float | None = None
    stdev: float | None = None
    min: float | None = None
    p10: float | None = None
    p50: float | None = None
    p90: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        if not values:
            return cls(0)
        ordered = sorted(values)
        if len(ordered) == 1:
            v = ordered[0]
            return cls(1, v, 0.0, v, v, v, v, v)
        deciles = statistics.quantiles(ordered, n=10, method="inclusive")
        return cls(
            count=len(ordered),
            mean=statistics.fmean(ordered),
            stdev=statistics.stdev(ordered),
            min=ordered[0],
            p10=deciles[0],
            p50=statistics.median(ordered),
            p90=deciles[-1],
            max=ordered[-1],
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k)
            for k in ("count", "mean", "stdev", "min", "p10", "p50", "p90", "max")
        }


@dataclass(frozen=True)
class Comparison:
    """Two reward functions over the same trajectories."""

    a: Distribution
    b: Distribution
    both: int
    """Trajectories both scored."""
    pearson: float | None
    agreement: float | None
    """Share of the trajectories both scored on which they agree about ``reward >= threshold``."""
    threshold: float
    only_a: list[str]
    """Calls rewarded (>= threshold) by A and not by B (B below it, or B failed)."""
    only_b: list[str]


def compare(outcomes: Sequence[Outcome], threshold: float, a: int = 0, b: int = 1) -> Comparison:
    """Compare reward functions ``a`` and ``b`` of the outcomes (see :class:`Comparison`)."""
    va = [r.reward for o in outcomes if (r := o.rewards[a]) is not None]
    vb = [r.reward for o in outcomes if (r := o.rewards[b]) is not None]
    pairs = [
        (ra.reward, rb.reward, o.call_id)
        for o in outcomes
        if (ra := o.rewards[a]) is not None and (rb := o.rewards[b]) is not None
    ]
    pearson = None
    if len(pairs) >= 2:
        try:
            pearson = statistics.correlation([p[0] for p in pairs], [p[1] for p in pairs])
        except statistics.StatisticsError:  # one side is constant: no correlation defined
            pearson = None
    agree = sum((x >= threshold) == (y >= threshold) for x, y, _ in pairs)

    def passes(o: Outcome, i: int) -> bool:
        r = o.rewards[i]
        return r is not None and r.reward >= threshold

    scored_any = [o for o in outcomes if o.rewards[a] is not None or o.rewards[b] is not None]
    return Comparison(
        a=Distribution.of(va),
        b=Distribution.of(vb),
        both=len(pairs),
        pearson=pearson,
        agreement=agree / len(pairs) if pairs else None,
        threshold=threshold,
        only_a=[o.call_id for o in scored_any if passes(o, a) and not passes(o, b)],
        only_b=[o.call_id for o in scored_any if passes(o, b) and not passes(o, a)],
    )


# -- replay identity, feedback plan, commit pacing ---------------------------------------------


def replay_id(prefix: str, strategy: str, reward: str, reward_version: str) -> str:
    """The replay's identity: what decides whether two replays would send the same feedback.

    The source prefix, the strategy's canonical name and the reward function with its version;
    not the range, so an overlapping or open-ended ("until now") replay skips what an earlier
    one already sent.
    """
    spec = json.dumps([prefix, strategy, reward, reward_version], separators=(",", ":"))
    return hashlib.sha256(spec.encode()).hexdigest()[:16]


def replayed_topic(prefix: str) -> str:
    """The topic recording every feedback a replay got acknowledged (compacted, 1 partition)."""
    return f"{prefix}.replayed"


def ack_key(rid: str, trajectory_id: str) -> bytes:
    """Key of an acknowledged feedback on ``<p>.replayed``."""
    return f"{rid}|{trajectory_id}".encode()


def commit_key(rid: str) -> bytes:
    """Key of the last commit a replay sent (compaction keeps only the latest)."""
    return f"{rid}#commit".encode()


def read_ledger(keys: Iterable[bytes | None], rid: str) -> tuple[set[str], int]:
    """From the keys of ``<p>.replayed`` in offset order: the trajectory ids acknowledged under
    replay ``rid``, and how many of them came after its last commit (an interrupted run:
    acknowledged, not committed yet)."""
    head, marker = f"{rid}|".encode(), commit_key(rid)
    acknowledged: set[str] = set()
    uncommitted = 0
    for key in keys:
        if key == marker:
            uncommitted = 0
        elif key is not None and key.startswith(head):
            acknowledged.add(key[len(head) :].decode())
            uncommitted += 1
    return acknowledged, uncommitted


@dataclass(frozen=True)
class FeedbackPlan:
    send: list[RewardedTrajectory]
    skipped: list[str]
    """Trajectory ids acknowledged before under the same replay id."""
    unsendable: list[tuple[str, str]]
    """(call_id, why): e.g. no LLM step with a response id, so no msg_ids to reward."""


def plan_feedback(
    scored: Iterable[RewardedTrajectory],
    acknowledged: set[str],
    redactor: Redactor | None = None,
) -> FeedbackPlan:
    """What a replay to Trinity sends: every rewarded trajectory not acknowledged before, with
    its task_id redacted when asked."""
    send: list[RewardedTrajectory] = []
    skipped: list[str] = []
    unsendable: list[tuple[str, str]] = []
    for rewarded in scored:
        if rewarded.trajectory_id in acknowledged:
            skipped.append(rewarded.trajectory_id)
        elif not rewarded.msg_ids:
            unsendable.append((rewarded.call_id, "no msg_ids (no LLM step with a response id)"))
        else:
            if redactor is not None and redactor.enabled:
                task_id = redactor.redact(rewarded.task_id)[:64] or rewarded.task_id
                rewarded = rewarded.model_copy(update={"task_id": task_id})
            send.append(rewarded)
    return FeedbackPlan(send, skipped, unsendable)


class CommitPacer:
    """When to commit: after every ``every`` acknowledged feedbacks, or when ``interval``
    seconds have passed since the last commit with at least one acknowledged, and at the end
    if anything is left; never an empty commit."""

    def __init__(self, every: int | None, interval: float | None, now: float = 0.0) -> None:
        if every is not None and every < 1:
            raise ConfigError(f"--commit-every must be at least 1, got {every}")
        if interval is not None and not interval > 0:
            raise ConfigError(f"--commit-interval must be positive, got {interval}")
        self.every = every
        self.interval = interval
        self.pending = 0
        self._since = now

    def acked(self, now: float) -> bool:
        """One more feedback acknowledged; True when a commit is due now."""
        self.pending += 1
        if self.every is not None and self.pending >= self.every:
            return True
        return self.interval is not None and now - self._since >= self.interval

    def committed(self, now: float) -> None:
        self.pending = 0
        self._since = now

    def final(self) -> bool:
        return self.pending > 0


# -- exports ----------------------------------------------------------------------------------


def build_exports(
    outcomes: Sequence[Outcome],
    *,
    min_reward: float,
    dpo_margin: float,
    redactor: Redactor,
) -> list[ExportFile]:
    """The three export files of a replay's outcomes (primary reward function), redacted and
    with exact duplicates removed."""
    scored = [(o, r) for o in outcomes if (r := o.rewards[0]) is not None]
    scored.sort(key=lambda orr: (orr[0].trajectory.ended_at, orr[0].call_id))

    traj_rows = [redactor.redact_obj(trajectory_row(o.scored_trajectory(), r)) for o, r in scored]
    traj_traces = [{"call_id": o.call_id, "reward": r.reward} for o, r in scored]

    sft_rows, sft_traces = [], []
    below = empty = 0
    for o, r in scored:
        if r.reward < min_reward:
            below += 1
            continue
        row = sft_row(o.trajectory)
        if row is None:
            empty += 1
            continue
        sft_rows.append(redactor.redact_obj(row))
        sft_traces.append({"call_id": o.call_id, "reward": r.reward})

    pairs = [p for o, _ in scored for p in preference_pairs(o.trajectory, o.feedback)]
    preference = len(pairs)
    pairs += ranking_pairs(((o.trajectory, r) for o, r in scored), dpo_margin)
    dpo_rows = [redactor.redact_obj(p.row) for p in pairs]
    dpo_traces = [p.trace for p in pairs]

    files = []
    for name, fmt, rows, traces, extra in (
        ("trajectories.jsonl", "trajstream-rewarded-trajectory", traj_rows, traj_traces, {}),
        (
            "sft.jsonl",
            "openai-chat-fine-tuning",
            sft_rows,
            sft_traces,
            {"min_reward": min_reward, "below_min_reward": below, "nothing_to_train_on": empty},
        ),
        (
            "dpo.jsonl",
            "openai-preference-fine-tuning",
            dpo_rows,
            dpo_traces,
            {
                "dpo_margin": dpo_margin,
                "from_preference_feedback": preference,
                "from_reward_ranking": len(pairs) - preference,
            },
        ),
    ):
        kept, kept_traces, removed = dedupe(rows, traces)
        files.append(ExportFile(name, fmt, kept, kept_traces, removed, extra))
    return files


# -- parsing the command line's range ------------------------------------------------------------


_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: datetime) -> datetime:
    """``2026-01-31T12:00:00Z`` (no zone: UTC), ``2026-01-31``, ``now``, or an age: ``90s``,
    ``30m``, ``2h``, ``7d``, ``1w`` before ``now``."""
    text = text.strip()
    if text == "now":
        return now
    age = _AGE.fullmatch(text)
    if age:
        return now - timedelta(seconds=float(age.group(1)) * _UNITS[age.group(2)])
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(
            f"bad time {text!r}: use ISO 8601 (2026-01-31T12:00Z), now, or an age like 90m, 2h, 7d"
        ) from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int
    end: int | None  # exclusive; None: the end of the partition when the replay starts


_OFFSETS = re.compile(r"(?P<topic>.+):(?P<partition>\d+):(?P<start>\d+)-(?P<end>\d*)")


def parse_offsets(spec: str, prefix: str) -> OffsetRange:
    """``TOPIC:PARTITION:START-END`` (END exclusive, may be left out: the end of the partition).
    TOPIC is ``agent-events`` or ``user-feedback``, with or without the prefix."""
    match = _OFFSETS.fullmatch(spec.strip())
    if not match:
        raise ConfigError(
            f"bad --offsets {spec!r}: use TOPIC:PARTITION:START-END, e.g. agent-events:0:100-200"
        )
    topic = match["topic"]
    inputs = {f"{prefix}.agent-events", f"{prefix}.user-feedback"}
    if f"{prefix}.{topic}" in inputs:
        topic = f"{prefix}.{topic}"
    if topic not in inputs:
        raise ConfigError(
            f"bad --offsets {spec!r}: {topic} is not an input topic ({', '.join(sorted(inputs))})"
        )
    start, end = int(match["start"]), int(match["end"]) if match["end"] else None
    if end is not None and end < start:
        raise ConfigError(f"bad --offsets {spec!r}: END is before START")
    return OffsetRange(topic, int(match["partition"]), start, end)


# == the driver: Kafka, Trinity, files ===========================================================


@dataclass
class ReplayOptions:
    """What ``trajstream replay`` was asked to do (the CLI's arguments, parsed)."""

    since: datetime | None = None
    until: datetime | None = None
    offsets: list[OffsetRange] = field(default_factory=list)
    strategy: str | None = None
    reward: str | None = None
    compare_reward: str | None = None
    dry_run: bool = False
    to: set[str] = field(default_factory=set)
    out: Path | None = None
    min_reward: float = 0.5
    dpo_margin: float = 0.2
    commit_every: int | None = None
    commit_interval_s: float | None = None
    redact: bool = False
    redact_patterns: list[str] = field(default_factory=list)
    lookback_s: float | None = None

    def validate(self) -> None:
        """Usage errors, before anything is read (ConfigError: exit 2)."""
        unknown = self.to - {"trinity", "files"}
        if unknown:
            raise ConfigError(f"--to {', '.join(sorted(unknown))}: use trinity or files")
        if self.offsets and (self.since or self.until):
            raise ConfigError("give a time range (--since/--until) or --offsets, not both")
        if self.since and self.until and self.until <= self.since:
            raise ConfigError(
                f"--until {self.until.isoformat()} is not after --since {self.since.isoformat()}"
            )
        if "files" in self.to and self.out is None:
            raise ConfigError("--to files needs --out DIR")
        if self.out is not None and "files" not in self.to:
            raise ConfigError("--out needs --to files")
        if self.compare_reward and self.to:
            raise ConfigError(
                "--compare-reward is a dry run that compares two reward functions; leave out --to"
            )
        if not math.isfinite(self.min_reward) or not math.isfinite(self.dpo_margin):
            raise ConfigError("--min-reward and --dpo-margin must be numbers")
        if self.lookback_s is not None and self.lookback_s < 0:
            raise ConfigError("--lookback must not be negative")


@dataclass
class ReplayResult:
    """What a replay did, for the summary and for tests."""

    replay_id: str
    core: ReplayCore
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
    weights = settings.reward.weights
    rewarders = [build_rewarder(options.reward or settings.reward.function, weights)]
    if options.compare_reward:
        rewarders.append(build_rewarder(options.compare_reward, weights))
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

    kafka = kafka_client_kwargs(settings.kafka.security)
    topics = await _topic_partitions(bootstrap, kafka)
    if f"{prefix}.agent-events" not in topics:
        raise ConfigError(
            f"unknown topic {prefix}.agent-events: nothing to replay under "
            f"kafka.topic_prefix={prefix!r} [TRAJSTREAM_KAFKA__TOPIC_PREFIX]"
        )
    consumer = _consumer(bootstrap, client_id, kafka)
    await consumer.start()
    # let the consumer's background task start: stopping it before it ran raises
    # CancelledError out of aiokafka's stop() (no-group mode)
    await asyncio.sleep(0)
    try:
        ranges, source = await _resolve(consumer, topics, prefix, options, started, lookback)
        core = ReplayCore(
            strategy,
            rewarders,
            limits=Limits(
                max_steps=settings.assembly.max_steps,
                max_bytes=settings.assembly.max_bytes,
                abandon_after=timedelta(seconds=settings.assembly.abandon_after_s),
            ),
            feedback_grace=timedelta(seconds=settings.reward.feedback_grace_s),
            score_incomplete=settings.reward.score_incomplete,
            late_retention=timedelta(seconds=settings.assembly.late_retention_s),
            since=options.since,
            codec=codec,
        )
        result = ReplayResult(rid, core, source, dry_run=dry_run)
        result.records = await _read(consumer, ranges, core, progress_console)
        end_of_range = options.until or (None if options.offsets else started)
        core.finish(end_of_range)
        if "trinity" in options.to:
            acknowledged, uncommitted = await _acknowledged(
                consumer, topics, replayed_topic(prefix), rid
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
        and (result.plan.send or result.uncommitted_before)
    ):
        pacer.pending = result.uncommitted_before
        await _send(
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
                options.out, result.exports, _manifest(result, settings, options, redactor, codec)
            )
    if redactor.enabled:
        result.redactions = {
            "files": redactor.summary() if "files" in options.to else None,
            "trinity_task_ids": task_redactor.summary() if "trinity" in options.to else None,
        }
    print_summary(console, result, options)
    return result


def _consumer(bootstrap: str, client_id: str, kafka: dict[str, Any]) -> Any:
    from aiokafka import AIOKafkaConsumer

    # no group: nothing is committed anywhere, and the live group never sees this consumer
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **kafka,
    )


async def _topic_partitions(bootstrap: str, kafka: dict[str, Any]) -> dict[str, list[int]]:
    """Every topic of the cluster with its partitions (without creating any)."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000, **kafka)
    try:
        await admin.start()
    except Exception as exc:
        raise ReplayError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        names = await admin.list_topics()
        described = await admin.describe_topics(list(names)) if names else []
        return {d["topic"]: sorted(p["partition"] for p in d["partitions"]) for d in described}
    finally:
        await admin.close()


async def _resolve(
    consumer: Any,
    existing: dict[str, list[int]],
    prefix: str,
    options: ReplayOptions,
    now: datetime,
    lookback: timedelta,
) -> tuple[dict[Any, tuple[int, int]], dict[str, Any]]:
    """The offsets to read, per topic partition, and the description of the source."""
    from aiokafka import TopicPartition

    events, feedback = f"{prefix}.agent-events", f"{prefix}.user-feedback"
    inputs = [t for t in (events, feedback) if t in existing]
    tps = [TopicPartition(t, p) for t in inputs for p in existing[t]]
    first = await consumer.beginning_offsets(tps)
    last = await consumer.end_offsets(tps)
    ranges: dict[Any, tuple[int, int]] = {}
    source: dict[str, Any] = {"prefix": prefix, "topics": {}}

    if options.offsets:
        for spec in options.offsets:
            if spec.topic not in existing:
                raise ConfigError(f"unknown topic {spec.topic}")
            tp = TopicPartition(spec.topic, spec.partition)
            if tp not in last:
                raise ConfigError(f"{spec.topic} has no partition {spec.partition}")
            start = max(spec.start, first[tp])
            end = min(spec.end if spec.end is not None else last[tp], last[tp])
            ranges[tp] = (start, max(start, end))
        if not any(e > s for s, e in ranges.values()):
            raise ReplayError("the --offsets select no records (the partitions hold none there)")
        source["mode"] = "offsets"
    else:
        since, until = options.since, options.until
        read_from = await _offsets_at(
            consumer, tps, since - lookback if since else None, first, last
        )
        in_range = await _offsets_at(consumer, tps, since, first, last)
        read_to = await _offsets_at(consumer, tps, until, last, last)
        for tp in tps:
            ranges[tp] = (read_from[tp], max(read_from[tp], read_to[tp]))
        in_range_events = sum(
            max(0, read_to[tp] - in_range[tp]) for tp in tps if tp.topic == events
        )
        if in_range_events == 0:
            raise ReplayError(
                f"no agent events in {events} from {since.isoformat() if since else 'the start'}"
                f" to {until.isoformat() if until else 'now'}"
            )
        source.update(
            mode="time",
            since=since.isoformat() if since else None,
            until=(until or now).isoformat(),
            lookback_s=lookback.total_seconds(),
            events_in_range=in_range_events,
        )
    for tp, (start, end) in sorted(ranges.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
        source["topics"].setdefault(tp.topic, {})[str(tp.partition)] = [start, end]
    return ranges, source


async def _offsets_at(
    consumer: Any,
    tps: list[Any],
    at: datetime | None,
    default: dict[Any, int],
    last: dict[Any, int],
) -> dict[Any, int]:
    """The first offset at or after ``at`` per partition (``default`` when ``at`` is None, the
    end when no record is that late)."""
    if at is None:
        return dict(default)
    millis = max(0, int(at.timestamp() * 1000))
    found = await consumer.offsets_for_times({tp: millis for tp in tps})
    return {tp: min(found[tp].offset, last[tp]) if found.get(tp) else last[tp] for tp in tps}


async def _read(
    consumer: Any, ranges: dict[Any, tuple[int, int]], core: ReplayCore, console: Console
) -> int:
    """Read the ranges partition by partition, each partition's events and feedback merged by
    timestamp (the order the live stages saw them in), into the core."""
    total = sum(end - start for start, end in ranges.values())
    by_partition: dict[int, list[Any]] = {}
    for tp in ranges:
        by_partition.setdefault(tp.partition, []).append(tp)
    done = 0
    with _progress(console) as progress:
        task = progress.add_task("reading", total=total)
        for partition in sorted(by_partition):
            tps = [tp for tp in by_partition[partition] if ranges[tp][1] > ranges[tp][0]]
            if not tps:
                continue
            fetched = await _fetch(
                consumer, {tp: ranges[tp] for tp in tps}, lambda n: progress.advance(task, n)
            )
            streams = [
                [
                    _source(m, "event" if tp.topic.endswith(".agent-events") else "feedback")
                    for m in fetched[tp]
                ]
                for tp in sorted(tps, key=lambda tp: not tp.topic.endswith(".agent-events"))
            ]
            for record in heapq.merge(*streams, key=lambda r: r.timestamp):
                core.feed(record)
            done += sum(ranges[tp][1] - ranges[tp][0] for tp in tps)
            progress.update(task, completed=done)
    return sum(core.stats[k] for k in ("records.event", "records.feedback"))


async def _fetch(
    consumer: Any,
    ranges: dict[Any, tuple[int, int]],
    advance: Callable[[int], None],
    stall_s: float = 30.0,
) -> dict[Any, list[Any]]:
    consumer.assign(list(ranges))
    for tp, (start, _) in ranges.items():
        consumer.seek(tp, start)
    out: dict[Any, list[Any]] = {tp: [] for tp in ranges}
    remaining = set(ranges)
    last_progress = time.monotonic()
    while remaining:
        batch = await consumer.getmany(*remaining, timeout_ms=500)
        for tp, messages in batch.items():
            end = ranges[tp][1]
            kept = [m for m in messages if m.offset < end]
            out[tp].extend(kept)
            advance(len(kept))
        for tp in list(remaining):
            if await consumer.position(tp) >= ranges[tp][1]:
                remaining.discard(tp)
        if batch:
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_s:
            missing = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(remaining))
            raise ReplayError(
                f"no records from {missing} for {stall_s:g}s before the end of "
                "the range (broker unavailable?)"
            )
    return out


def _source(message: Any, kind: Literal["event", "feedback"]) -> SourceRecord:
    return SourceRecord(
        kind=kind,
        partition=message.partition,
        offset=message.offset,
        timestamp=datetime.fromtimestamp(message.timestamp / 1000, UTC),
        key=message.key,
        value=message.value or b"",
    )


async def _acknowledged(
    consumer: Any, existing: dict[str, list[int]], topic: str, rid: str
) -> tuple[set[str], int]:
    """What ``<p>.replayed`` says of replay ``rid`` (see :func:`read_ledger`)."""
    from aiokafka import TopicPartition

    if topic not in existing:
        return set(), 0
    tps = [TopicPartition(topic, p) for p in existing[topic]]
    first = await consumer.beginning_offsets(tps)
    last = await consumer.end_offsets(tps)
    ranges = {tp: (first[tp], last[tp]) for tp in tps if last[tp] > first[tp]}
    if not ranges:
        return set(), 0
    fetched = await _fetch(consumer, ranges, lambda n: None)
    return read_ledger((m.key for tp in sorted(fetched) for m in fetched[tp]), rid)


async def _ensure_replayed(
    bootstrap: str, topic: str, replication: int, kafka: dict[str, Any]
) -> None:
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.errors import TopicAlreadyExistsError

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000, **kafka)
    await admin.start()
    try:
        if topic not in set(await admin.list_topics()):
            try:
                await admin.create_topics(
                    [NewTopic(topic, 1, replication, topic_configs={"cleanup.policy": "compact"})]
                )
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def _send(
    settings: Settings,
    bootstrap: str,
    client_id: str,
    rid: str,
    result: ReplayResult,
    pacer: CommitPacer,
    console: Console,
    trinity_factory: Callable[[], TrinityClient] | None,
    codec: SchemaRegistry,
) -> None:
    """Feedback for every planned trajectory, each acknowledgement recorded on
    ``<p>.replayed`` before the commit that carries it."""
    from aiokafka import AIOKafkaProducer

    from .trinity import TrinityClient

    assert result.plan is not None
    topic = replayed_topic(settings.kafka.topic_prefix)
    kafka = kafka_client_kwargs(settings.kafka.security)
    await _ensure_replayed(bootstrap, topic, settings.kafka.replication_factor, kafka)
    producer = AIOKafkaProducer(
        **kafka,
        bootstrap_servers=bootstrap,
        client_id=client_id,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
    )
    trinity = (trinity_factory or (lambda: TrinityClient.from_settings(settings.trinity)))()
    max_age = settings.trinity.retry_max_age_s
    await producer.start()
    try:
        recorded: list[Any] = []
        batch: list[float] = []
        opened = utcnow()

        async def commit() -> None:
            nonlocal opened
            await asyncio.gather(*recorded)  # the acks are durable before the commit
            recorded.clear()
            _, answer = await _retrying(trinity.commit, max_age, "commit")
            now = utcnow()
            record = CommitRecord(
                commit_seq=result.commits,
                interval_start=opened,
                interval_end=now,
                feedback_count=pacer.pending,
                reward_mean=statistics.fmean(batch) if batch else None,
                reward_min=min(batch, default=None),
                reward_max=max(batch, default=None),
                trinity_response=json.dumps(answer, sort_keys=True),
            )
            await producer.send_and_wait(topic, key=commit_key(rid), value=codec.encode(record))
            result.commits += 1
            pacer.committed(time.monotonic())
            batch.clear()
            opened = now

        with _progress(console) as progress:
            task = progress.add_task("feedback to Trinity", total=len(result.plan.send))
            for rewarded in result.plan.send:
                result.sent += 1
                send = functools.partial(
                    trinity.feedback,
                    rewarded.msg_ids,
                    rewarded.reward,
                    rewarded.task_id,
                    rewarded.run_id,
                )
                try:
                    attempts, _ = await _retrying(send, max_age, f"feedback for {rewarded.call_id}")
                except TrinityRejected as exc:
                    result.rejected.append((rewarded.call_id, str(exc)))
                    progress.advance(task)
                    continue
                result.acked += 1
                batch.append(rewarded.reward)
                ack = FeedbackAck(rewarded=rewarded, acked_at=utcnow(), attempts=attempts)
                recorded.append(
                    await producer.send(
                        topic, key=ack_key(rid, rewarded.trajectory_id), value=codec.encode(ack)
                    )
                )
                if pacer.acked(time.monotonic()):
                    await commit()
                progress.advance(task)
            if pacer.final():
                await commit()
        await asyncio.gather(*recorded)
    finally:
        await producer.stop()
        await trinity.aclose()


async def _retrying(call: Callable[[], Any], max_age: float, what: str) -> tuple[int, Any]:
    """Await ``call()`` until it succeeds, retrying TrinityUnavailable with backoff for up to
    ``max_age`` seconds (``trinity.retry_max_age_s``); returns the attempts and the answer."""
    from .trinity import backoff_delays

    started = time.monotonic()
    attempts = 0
    for delay in backoff_delays(base=0.2, cap=10.0):
        attempts += 1
        try:
            return attempts, await call()
        except TrinityUnavailable as exc:
            if attempts == 1 or attempts % 10 == 0:
                log.warning("%s: %s; retrying (attempt %d)", what, exc, attempts)
            if time.monotonic() - started + delay > max_age:
                raise ReplayError(
                    f"{what}: Trinity unavailable for {max_age:g}s; re-run the "
                    f"replay to resume (acknowledged feedback is skipped): {exc}"
                ) from exc
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def _manifest(
    result: ReplayResult,
    settings: Settings,
    options: ReplayOptions,
    redactor: Redactor,
    codec: SchemaRegistry,
) -> dict[str, Any]:
    from .models import RewardedTrajectory as RT
    from .models import Trajectory as T

    core = result.core
    scored = [r.reward for _, r in core.scored()]
    return {
        "export_schema_version": EXPORT_SCHEMA_VERSION,
        "created_at": utcnow().isoformat(),
        "replay_id": result.replay_id,
        "source": result.source,
        "strategy": core.strategy.name,
        "reward": {"function": core.rewarders[0].name, "version": core.rewarders[0].version},
        "settings": {
            "abandon_after_s": settings.assembly.abandon_after_s,
            "feedback_grace_s": settings.reward.feedback_grace_s,
            "score_incomplete": settings.reward.score_incomplete,
        },
        "avro_schemas": {m.avro_name: codec.fingerprint_of(m).hex() for m in (T, RT)},
        "counts": {
            "records": result.records,
            "calls_closed": core.stats["calls.closed"],
            "calls_selected": core.stats["calls.selected"],
            "trajectories": core.stats["trajectories"],
            "rewarded": core.stats["rewarded.0"],
            "reward_errors": core.stats["reward_errors.0"],
            "not_scored_incomplete": core.stats["trajectories.incomplete"],
            "open_at_end": len(core.incomplete),
            "invalid_records": core.stats["records.invalid"],
        },
        "reward_distribution": Distribution.of(scored).as_dict(),
        "redaction": redactor.summary(),
    }


# -- output -----------------------------------------------------------------------------------


def _progress(console: Console) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        ProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class Rate(ProgressColumn):
        def render(self, task: Any) -> Text:
            speed = task.finished_speed or task.speed
            return Text(f"{speed:,.0f}/s" if speed else "-/s", style="progress.data.speed")

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        Rate(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_summary(console: Console, result: ReplayResult, options: ReplayOptions) -> None:
    """The end-of-replay summary: what was read, decided, scored, sent and written."""
    from rich.table import Table

    core, s = result.core, result.core.stats
    src = result.source
    table = Table(
        title=f"replay {result.replay_id}"
        + (" (dry run: nothing sent or written)" if result.dry_run else ""),
        show_header=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()
    if src.get("mode") == "time":
        table.add_row(
            "range",
            f"{src['since'] or 'start'} .. {src['until']} "
            f"(read from {src['lookback_s']:g}s earlier for context)",
        )
    else:
        table.add_row("offsets", json.dumps(src.get("topics", {})))
    table.add_row("strategy", core.strategy.name)
    table.add_row("reward", f"{core.rewarders[0].name} (version {core.rewarders[0].version})")
    table.add_row(
        "records read",
        f"{result.records} ({s['records.event']} events, {s['records.feedback']} feedback)",
    )
    if s["records.invalid"]:
        table.add_row(
            "invalid records",
            f"{s['records.invalid']}: "
            + "; ".join(f"{n}x {why}" for why, n in core.invalid.most_common(3)),
        )
    table.add_row(
        "duplicates / late",
        f"{s['events.duplicate'] + s['feedback.duplicate']} / {s['events.late']}",
    )
    table.add_row(
        "calls closed in range",
        f"{s['calls.closed']} ({s['calls.closed_ended']} "
        f"ended, {s['calls.closed_abandoned']} abandoned, "
        f"{s['calls.closed_oversized']} oversized)"
        + (f"; {s['calls.before_range']} closed before it" if s["calls.before_range"] else ""),
    )
    table.add_row("selected", f"{s['calls.selected']} of {s['calls.closed']}")
    table.add_row(
        "trajectories complete",
        f"{s['calls.selected'] - s['trajectories.incomplete']}"
        + (
            f" ({s['trajectories.incomplete']} abandoned/oversized, not scored)"
            if s["trajectories.incomplete"]
            else ""
        ),
    )
    if core.incomplete:
        more = " ..." if len(core.incomplete) > 5 else ""
        table.add_row(
            "incomplete (open at end)",
            f"{len(core.incomplete)}: " + ", ".join(core.incomplete[:5]) + more,
        )
    table.add_row(
        "rewarded",
        f"{s['rewarded.0']}"
        + (f" ({s['reward_errors.0']} reward errors)" if s["reward_errors.0"] else ""),
    )
    dist = Distribution.of([r.reward for _, r in core.scored()])
    table.add_row(
        "rewards",
        f"mean {_fmt(dist.mean)}  stdev {_fmt(dist.stdev)}  "
        f"p10 {_fmt(dist.p10)}  p50 {_fmt(dist.p50)}  p90 {_fmt(dist.p90)}",
    )
    if s["feedback.unmatched"]:
        table.add_row(
            "user feedback unmatched",
            f"{s['feedback.unmatched']} (calls not selected or not closed in the range)",
        )
    plan = result.plan
    if plan is not None:
        verb = "would send" if result.dry_run else "sent"
        table.add_row(
            "Trinity",
            f"{verb} {len(plan.send) if result.dry_run else result.sent} "
            f"feedback(s)"
            + (
                ""
                if result.dry_run
                else f", {result.acked} acknowledged, {result.commits} commit(s)"
            ),
        )
        if result.uncommitted_before:
            table.add_row(
                "recovered",
                f"{result.uncommitted_before} feedback(s) an interrupted "
                "run got acknowledged but did not commit: committed now",
            )
        if plan.skipped:
            table.add_row(
                "skipped",
                f"{len(plan.skipped)} already acknowledged under replay "
                f"{result.replay_id}: "
                + ", ".join(plan.skipped[:5])
                + (" ..." if len(plan.skipped) > 5 else ""),
            )
        if plan.unsendable:
            table.add_row("not sendable", f"{len(plan.unsendable)}: {plan.unsendable[0][1]}")
        if result.rejected:
            table.add_row("rejected by Trinity", f"{len(result.rejected)}: {result.rejected[0][1]}")
    for f in result.exports:
        where = f" -> {options.out / f.name}" if options.out and not result.dry_run else ""
        table.add_row(
            f.name, f"{len(f.rows)} rows, {f.duplicates_removed} duplicates removed" + where
        )
    for where, summary in (result.redactions or {}).items():
        if summary is not None:
            table.add_row(
                f"redactions ({where.replace('_', ' ')})",
                ", ".join(f"{k} {v}" for k, v in summary["counts"].items()),
            )
    console.print(table)
    if plan is not None and plan.skipped:
        console.print(
            f"skipped {len(plan.skipped)} trajectories already acknowledged under "
            f"replay {result.replay_id}"
        )
    if result.comparison is not None:
        print_comparison(console, result.comparison, core.rewarders[0].name, core.rewarders[1].name)


def print_comparison(console: Console, c: Comparison, name_a: str, name_b: str) -> None:
    """A and B side by side: distributions, correlation, agreement and disagreements."""
    from rich.table import Table

    table = Table(
        title=f"A/B of reward functions (threshold {c.threshold:g})", title_justify="left"
    )
    table.add_column("")
    table.add_column(f"A: {name_a}")
    table.add_column(f"B: {name_b}")
    for key in ("count", "mean", "stdev", "min", "p10", "p50", "p90", "max"):
        va, vb = getattr(c.a, key), getattr(c.b, key)
        table.add_row(
            key, str(va) if key == "count" else _fmt(va), str(vb) if key == "count" else _fmt(vb)
        )
    table.add_row(f">= {c.threshold:g}, not by the other", str(len(c.only_a)), str(len(c.only_b)))
    console.print(table)
    console.print(
        f"scored by both: {c.both}; Pearson correlation: {_fmt(c.pearson)}; "
        f"agreement at {c.threshold:g}: " + ("-" if c.agreement is None else f"{c.agreement:.1%}")
    )
    for label, calls in (("A", c.only_a), ("B", c.only_b)):
        if calls:
            console.print(f"rewarded by {label} only (first 10): " + ", ".join(calls[:10]))
